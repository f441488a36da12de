//! Order of effect across connections (ARCHITECTURE §2.1): packets read from different
//! connections take effect in the order in which the I/O driver reported their connections
//! readable, as in a single-threaded broker that acts on packets in the order it reads them.
//!
//! Why the runtime does not give this: each connection is a task, and tokio's multi-thread
//! scheduler runs the task woken *last* in an I/O driver pass first (the LIFO slot), and another
//! worker may steal earlier ones and run them in parallel. So when client B sends SUBSCRIBE and
//! client A publishes on B's topic a few microseconds later, A's PUBLISH was usually routed
//! before B's SUBSCRIBE was in the trie (measured: 53–75% of 1,000 rounds missed B). Disabling
//! the LIFO slot (`Builder::disable_lifo_slot`, only with `--cfg tokio_unstable`) left 8–27
//! misses per 1,000: stealing still runs B and A at the same time. So the order is kept here,
//! independently of the scheduler.
//!
//! The mechanism: a [`ReadOrder`] hands out *tickets*, consecutive numbers. The reader of each
//! connection polls its socket's readiness through its [`ReadSlot`], whose waker takes a ticket
//! when the driver wakes it. The driver wakes in the order of the events of its pass (one thread
//! at a time runs it), so tickets number the connections in the order their data was reported.
//! A read takes the ticket of the wake that preceded it; a read that did not wait (the socket
//! still had data) takes a fresh ticket. Before the reader acts on what it read, it waits until
//! every smaller ticket is complete ([`ReadOrder::turn`]); it completes its own once the packets
//! are handled, and a ticket whose wake found nothing to read is completed when the reader is
//! registered with the driver again. Right after a read, before handling it, the reader reads on
//! until the socket is empty and registers (`connection::settle`): what arrives while it handles
//! the batch then comes with a wake, and so with a ticket in driver order.
//!
//! # Invariants
//! - Tickets are issued in increasing order and each one is completed exactly once: by the
//!   reader when its packets are handled, by the slot when the reader registers again without
//!   having read, when reading stops (backpressure), or when the connection ends
//!   ([`ReadSlot::close`]).
//! - `floor` = the smallest ticket not complete (or the next one to be issued): a reader with
//!   ticket `t` acts only once `floor >= t`.
//! - A reader holds at most one ticket between a read and the end of handling it, and waits
//!   only for smaller tickets; it awaits nothing else while it holds it. The holder of the
//!   smallest ticket therefore never waits, and every wait ends (no deadlock).
//! - A slot issues a ticket only while its reader is registered for readiness (`armed`), and
//!   holds at most one unread ticket (the oldest wake's): a connection is never ordered later
//!   than the first report of its data.
//! - Once registered, a reader does not read data whose readiness it sees before the driver's
//!   wake for it (`awaiting_wake`, for sockets: the driver sets readiness, then wakes): it
//!   waits for that wake, which takes the ticket in driver order. The connection's task polls
//!   its socket whenever it runs, also to write; read in that window with a fresh ticket, B's
//!   SUBSCRIBE was ordered after A's PUBLISH whose wake came later in the same driver pass.
//!
//! What is not ordered by arrival:
//! - Bytes that arrive while their reader is not registered are ordered when it reads them: a
//!   connection that always has more than `SETTLE_MAX_BYTES` waiting, or one stopped by
//!   backpressure. Packets the handshake read with the CONNECT take the connection's first
//!   ticket, issued when the CONNECT is accepted (before the CONNACK is queued).
//! - The driver reports what epoll lists, and epoll lists a connection at the place of its
//!   first event since the driver last polled. A connection that read data before the driver
//!   polled (its task ran late) keeps that early place for data arriving later, until the
//!   driver polls. Only a saturated machine leaves that gap (seen at load average 10 on the
//!   2-core VM, in a test where A published again right after); a one-thread epoll broker such
//!   as mosquitto acts in the same listing order.
//! - Deliveries the ack pipeline holds back (QoS 2 until durable, and what follows it from the
//!   same publisher) are routed when released, not when read.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use parking_lot::Mutex;

/// No ticket (tickets start at 1).
const NONE: u64 = 0;

/// The broker-wide sequence of read tickets.
pub(crate) struct ReadOrder {
    /// Every ticket below it is complete (mirrors `state.base`; read without the lock).
    floor: AtomicU64,
    state: Mutex<OrderState>,
}

struct OrderState {
    /// The next ticket to issue.
    next: u64,
    /// The smallest ticket not complete (== `next` when none is outstanding).
    base: u64,
    /// `done[i]`: ticket `base + i` is complete. `done.len() == next - base`.
    done: VecDeque<bool>,
    /// Readers waiting for their turn: (their ticket, their waker).
    waiters: Vec<(u64, Waker)>,
}

impl Default for ReadOrder {
    fn default() -> Self {
        ReadOrder {
            floor: AtomicU64::new(1),
            state: Mutex::new(OrderState {
                next: 1,
                base: 1,
                done: VecDeque::new(),
                waiters: Vec::new(),
            }),
        }
    }
}

impl ReadOrder {
    fn issue(&self) -> u64 {
        let mut state = self.state.lock();
        let ticket = state.next;
        state.next += 1;
        state.done.push_back(false);
        ticket
    }

    fn complete(&self, ticket: u64) {
        let woken = {
            let mut state = self.state.lock();
            debug_assert!(
                ticket >= state.base && ticket < state.next,
                "ticket {ticket}"
            );
            let Some(index) = ticket.checked_sub(state.base) else {
                return;
            };
            if let Some(done) = state.done.get_mut(index as usize) {
                *done = true;
            }
            if index != 0 {
                return; // a smaller ticket is still outstanding: the floor stays
            }
            while state.done.front() == Some(&true) {
                state.done.pop_front();
                state.base += 1;
            }
            let base = state.base;
            self.floor.store(base, Ordering::Release);
            if state.waiters.iter().all(|(t, _)| *t > base) {
                return;
            }
            let (due, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut state.waiters)
                .into_iter()
                .partition(|(t, _)| *t <= base);
            state.waiters = waiting;
            due
        };
        for (_, waker) in woken {
            waker.wake();
        }
    }

    /// Resolves once every ticket below `ticket` is complete.
    #[cfg(test)]
    pub(crate) async fn turn(&self, ticket: u64) {
        std::future::poll_fn(|cx| self.poll_turn(ticket, cx)).await
    }

    /// [`ReadOrder::turn`] as a poll: the connection's loop waits in a closure of two words
    /// instead of a future of six (every idle connection's task holds its largest wait).
    pub(crate) fn poll_turn(&self, ticket: u64, cx: &mut Context<'_>) -> Poll<()> {
        if self.floor.load(Ordering::Acquire) >= ticket {
            return Poll::Ready(());
        }
        let mut state = self.state.lock();
        if state.base >= ticket {
            return Poll::Ready(());
        }
        match state.waiters.iter_mut().find(|(t, _)| *t == ticket) {
            Some((_, waker)) => waker.clone_from(cx.waker()),
            None => state.waiters.push((ticket, cx.waker().clone())),
        }
        Poll::Pending
    }

    #[cfg(test)]
    fn floor(&self) -> u64 {
        self.floor.load(Ordering::Acquire)
    }
}

/// One connection's tickets. Its reader polls the socket's readiness with this slot as the
/// waker ([`ReadSlot::readable`]), so that the driver's wake takes a ticket in driver order.
pub(crate) struct ReadSlot {
    order: Arc<ReadOrder>,
    state: Mutex<SlotState>,
}

struct SlotState {
    /// Ticket for data not read yet ([`NONE`] if none): taken by the driver's wake (or at
    /// creation), moved to `reading` by a read, completed when the reader waits again.
    pending: u64,
    /// Ticket of data read and not handled yet.
    reading: u64,
    /// Wakes so far (tells a wake that raced with a registration from an older one).
    wakes: u32,
    /// The reader is polling readiness through this slot.
    armed: bool,
    /// The reader registered and no wake came since: readiness seen now was set by the
    /// driver, whose wake (and ticket) follows.
    awaiting_wake: bool,
    closed: bool,
    /// The reader task's own waker.
    task: Option<Waker>,
}

/// What the slot held before a readiness poll.
#[derive(Clone, Copy)]
struct Snapshot {
    pending: u64,
    wakes: u32,
}

impl ReadSlot {
    /// A slot holding a first ticket: it orders what arrives before the reader first waits
    /// for data (e.g. a SUBSCRIBE sent right after CONNACK). Create it before the CONNACK is
    /// queued.
    pub(crate) fn new(order: Arc<ReadOrder>) -> Arc<ReadSlot> {
        let first = order.issue();
        Arc::new(ReadSlot {
            order,
            state: Mutex::new(SlotState {
                pending: first,
                reading: NONE,
                wakes: 0,
                armed: false,
                awaiting_wake: false,
                closed: false,
                task: None,
            }),
        })
    }

    /// Polls `poll_ready` (the socket's readiness, polled with the waker it is given) with this
    /// slot as waker. The slot is armed (its wakes take tickets) from this poll until the
    /// readiness is ready or [`ReadSlot::not_reading`].
    ///
    /// `ready_with_wake`: the readiness turns ready only by the I/O driver, which sets it and
    /// then wakes the waker registered (tokio). A task polling in between (one task per
    /// connection also polls when it writes) sees the data before the wake has taken its
    /// ticket; read then, with a fresh ticket, it would be ordered after connections the same
    /// driver pass woke later. So a ready readiness after a registration waits for its wake.
    pub(crate) fn poll_readable(
        self: &Arc<Self>,
        cx: &mut Context<'_>,
        ready_with_wake: bool,
        poll_ready: impl FnOnce(&mut Context<'_>) -> Poll<io::Result<()>>,
    ) -> Poll<io::Result<()>> {
        let before = self.before_poll(cx.waker());
        let waker = Waker::from(self.clone());
        match poll_ready(&mut Context::from_waker(&waker)) {
            Poll::Ready(result) => {
                let mut state = self.state.lock();
                if ready_with_wake && state.awaiting_wake && result.is_ok() {
                    // Still armed, and `task` is the caller's: the wake wakes it.
                    return Poll::Pending;
                }
                state.armed = false;
                state.awaiting_wake = false;
                Poll::Ready(result)
            }
            Poll::Pending => {
                self.registered(before);
                Poll::Pending
            }
        }
    }

    fn before_poll(&self, task: &Waker) -> Snapshot {
        let mut state = self.state.lock();
        state.armed = true;
        match &mut state.task {
            Some(waker) => waker.clone_from(task),
            None => state.task = Some(task.clone()),
        }
        Snapshot {
            pending: state.pending,
            wakes: state.wakes,
        }
    }

    /// The reader is registered with the driver and nothing was readable: data from now on
    /// comes with a wake, so the ticket held before the poll orders nothing and is completed.
    /// Unless a wake came meanwhile: then the ticket orders that data. Without one, readiness
    /// seen from now on awaits its wake.
    fn registered(&self, before: Snapshot) {
        {
            let mut state = self.state.lock();
            let raced = state.wakes != before.wakes;
            state.awaiting_wake = !raced;
            if before.pending == NONE || state.pending != before.pending || raced {
                return;
            }
            state.pending = NONE;
        }
        self.order.complete(before.pending);
    }

    /// A read returned data: it takes the pending ticket, or a fresh one if the reader did not
    /// wait for it (the socket still had data).
    pub(crate) fn read_done(&self) -> u64 {
        let mut state = self.state.lock();
        debug_assert_eq!(state.reading, NONE);
        let ticket = match std::mem::replace(&mut state.pending, NONE) {
            NONE => self.order.issue(),
            ticket => ticket,
        };
        state.reading = ticket;
        ticket
    }

    /// The handshake left bytes in the buffer: they take the pending (first) ticket.
    pub(crate) fn leftovers(&self) -> Option<u64> {
        let mut state = self.state.lock();
        if state.reading == NONE && state.pending != NONE {
            state.reading = std::mem::replace(&mut state.pending, NONE);
        }
        (state.reading != NONE).then_some(state.reading)
    }

    /// The packets of the last read are handled: its ticket is complete.
    pub(crate) fn handled(&self) {
        let ticket = std::mem::replace(&mut self.state.lock().reading, NONE);
        if ticket != NONE {
            self.order.complete(ticket);
        }
    }

    /// The reader does not read for now (backpressure): the slot is disarmed and the pending
    /// ticket orders nothing.
    pub(crate) fn not_reading(&self) {
        let ticket = {
            let mut state = self.state.lock();
            state.armed = false;
            state.awaiting_wake = false;
            std::mem::replace(&mut state.pending, NONE)
        };
        if ticket != NONE {
            self.order.complete(ticket);
        }
    }

    /// The connection's reader ended: completes its tickets; issues none any more.
    pub(crate) fn close(&self) {
        let (pending, reading) = {
            let mut state = self.state.lock();
            state.closed = true;
            state.task = None;
            (
                std::mem::replace(&mut state.pending, NONE),
                std::mem::replace(&mut state.reading, NONE),
            )
        };
        for ticket in [pending, reading] {
            if ticket != NONE {
                self.order.complete(ticket);
            }
        }
    }

    pub(crate) fn order(&self) -> &ReadOrder {
        &self.order
    }
}

impl Wake for ReadSlot {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    /// Called by the I/O driver, in the order of its events.
    fn wake_by_ref(self: &Arc<Self>) {
        let task = {
            let mut state = self.state.lock();
            state.wakes = state.wakes.wrapping_add(1);
            state.awaiting_wake = false;
            if state.armed && !state.closed && state.pending == NONE {
                state.pending = self.order.issue();
            }
            state.task.take()
        };
        if let Some(task) = task {
            task.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn floor_passes_a_ticket_only_when_every_smaller_one_is_complete() {
        let order = ReadOrder::default();
        let (a, b, c) = (order.issue(), order.issue(), order.issue());
        assert_eq!(order.floor(), a);
        order.complete(c);
        order.complete(b);
        assert_eq!(order.floor(), a);
        order.complete(a);
        assert_eq!(order.floor(), c + 1);
    }

    #[tokio::test]
    async fn turn_waits_for_smaller_tickets() {
        let order = Arc::new(ReadOrder::default());
        let first = order.issue();
        let second = order.issue();
        let passed = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (order, passed) = (order.clone(), passed.clone());
            tokio::spawn(async move {
                order.turn(second).await;
                passed.store(true, Ordering::SeqCst);
                order.complete(second);
            })
        };
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!passed.load(Ordering::SeqCst));
        order.turn(first).await; // the smallest ticket never waits
        order.complete(first);
        waiter.await.unwrap();
        assert!(passed.load(Ordering::SeqCst));
        assert_eq!(order.floor(), second + 1);
    }

    #[test]
    fn a_wake_takes_a_ticket_only_while_armed_and_keeps_the_oldest() {
        let order = Arc::new(ReadOrder::default());
        let slot = ReadSlot::new(order.clone());
        let first = slot.state.lock().pending;
        slot.not_reading();
        assert_eq!(order.floor(), first + 1);
        slot.wake_by_ref(); // not armed: a stale wake orders nothing
        assert_eq!(slot.state.lock().pending, NONE);
        slot.state.lock().armed = true;
        slot.wake_by_ref();
        let woken = slot.state.lock().pending;
        assert_ne!(woken, NONE);
        slot.wake_by_ref();
        assert_eq!(
            slot.state.lock().pending,
            woken,
            "the oldest wake orders the data"
        );
        assert_eq!(slot.read_done(), woken);
        slot.handled();
        assert_eq!(order.floor(), woken + 1);
        // A read without a wake takes a fresh ticket.
        let fresh = slot.read_done();
        assert!(fresh > woken);
        slot.close();
        assert_eq!(order.floor(), fresh + 1);
        slot.wake_by_ref();
        assert_eq!(slot.state.lock().pending, NONE, "closed: no more tickets");
    }

    /// The driver sets a socket's readiness, then wakes its waker: a connection's task that
    /// polls in between (one task per connection polls its socket after every write) sees the
    /// data before the wake. Read then, with a fresh ticket, B's SUBSCRIBE was ordered after
    /// A's PUBLISH whose wake came later in the same driver pass (traced in session 5: every
    /// one of 16 `ordering.rs` misses with one task per connection).
    #[test]
    fn readiness_seen_before_its_wake_waits_for_the_wake() {
        let order = Arc::new(ReadOrder::default());
        let (a, b) = (ReadSlot::new(order.clone()), ReadSlot::new(order.clone()));
        let mut cx = Context::from_waker(Waker::noop());
        for slot in [&a, &b] {
            assert!(
                slot.poll_readable(&mut cx, true, |_| Poll::Pending)
                    .is_pending()
            );
        }
        // The driver's pass: B's readiness is set; B's task polls before B's wake has run.
        let early = b.poll_readable(&mut cx, true, |_| Poll::Ready(Ok(())));
        b.wake_by_ref();
        a.wake_by_ref();
        if early.is_pending() {
            assert!(
                b.poll_readable(&mut cx, true, |_| Poll::Ready(Ok(())))
                    .is_ready()
            );
        }
        let a_ticket = a.state.lock().pending;
        assert!(
            b.read_done() < a_ticket,
            "B, reported first, must be ordered first"
        );
    }

    #[test]
    fn registration_completes_the_ticket_unless_a_wake_raced_it() {
        let order = Arc::new(ReadOrder::default());
        let slot = ReadSlot::new(order.clone());
        slot.state.lock().armed = true;
        let waker = Waker::noop();
        let first = slot.state.lock().pending;
        let before = slot.before_poll(waker);
        slot.wake_by_ref(); // data reported between the poll and the registration
        slot.registered(before);
        assert_eq!(
            slot.state.lock().pending,
            first,
            "kept for the data just reported"
        );
        let before = slot.before_poll(waker);
        slot.registered(before);
        assert_eq!(slot.state.lock().pending, NONE);
        assert_eq!(order.floor(), first + 1);
    }
}
