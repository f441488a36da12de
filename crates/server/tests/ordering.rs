//! Order of effect across connections (ARCHITECTURE §2.1): packets that arrive on different
//! connections take effect in the order the broker reads them, as in a single-threaded broker.
//! Test suites everywhere subscribe without waiting for SUBACK and publish from another client
//! right after; the message must reach the new subscription.

mod common;

use common::Broker;
use common::raw::*;

/// Rounds of SUBSCRIBE-then-PUBLISH in one broker process.
const ROUNDS: usize = 1000;

/// Pins the calling thread to the CPU it runs on, so that all clients write from one CPU: the
/// test's premise is that B's SUBSCRIBE reaches the broker's socket before A's PUBLISH. On
/// loopback a segment is processed (and its socket made readable) through the sending CPU's
/// backlog, first in first out; written from two CPUs, a segment parked in one backlog (its
/// softirq deferred to ksoftirqd on a busy machine) could reach its socket after a later one from
/// the other CPU. (Not seen to matter so far: 15 runs without the pin under load average 10 had
/// no miss either.) Call it after the broker started (a child inherits the mask).
fn pin_to_current_cpu() {
    // SAFETY: plain syscalls on the calling thread with a zeroed, locally owned cpu_set_t.
    unsafe {
        let cpu = libc::sched_getcpu();
        if cpu < 0 {
            return;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// The broker's file descriptor for the connection whose client end has local port
/// `client_port`: the socket inode from `/proc/net/tcp` (local = the broker's port, remote =
/// the client's), then the fd of the broker process that links to it.
fn broker_fd(pid: i32, broker_port: u16, client_port: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let local = format!(":{broker_port:04X}");
    let remote = format!(":{client_port:04X}");
    let inode = table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.len() > 9 && fields[1].ends_with(&local) && fields[2].ends_with(&remote))
            .then(|| fields[9].to_string())
    })?;
    let target = format!("socket:[{inode}]");
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .flatten()
        .find(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy() == target))
        .and_then(|e| e.file_name().to_str()?.parse().ok())
}

/// Whether some thread of the broker is inside a system call on file descriptor `fd` (the
/// first argument in `/proc/PID/task/TID/syscall`: a write, read or send on that socket).
fn in_syscall_on(pid: i32, fd: u64) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|task| {
        let Ok(line) = std::fs::read_to_string(task.path().join("syscall")) else {
            return false;
        };
        let mut fields = line.split_whitespace();
        let number = fields.next().unwrap_or("running");
        let first = fields
            .next()
            .and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok());
        number != "running" && number != "-1" && first == Some(fd)
    })
}

/// Waits until no broker thread is inside a system call on `fd`, so that what the client sends
/// next is readable at once (see the test's comment). Nothing is queued for that connection
/// when this is called, so the broker does not start a new write on it before the send.
async fn until_socket_free(pid: i32, fd: u64) {
    for _ in 0..SOCKET_FREE_POLLS {
        if !in_syscall_on(pid, fd) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_micros(100)).await;
    }
    panic!("a broker thread stayed inside a system call on fd {fd} for 10 s");
}

/// [`until_socket_free`] polls at most this often (every 100 µs: 10 s).
const SOCKET_FREE_POLLS: usize = 100_000;

/// Subscriber and publisher connections used in turn: a connection sends again only
/// `ROTATION` rounds after the broker last wrote to it ([`subscribe_takes_effect_before_a_later_publish_from_another_client`]).
const ROTATION: usize = 4;

/// §2.1: client B sends SUBSCRIBE and does not wait for SUBACK; client A publishes on B's topic
/// immediately after (QoS 0 and QoS 1 alternately). B must receive the message, every time:
/// B's SUBSCRIBE reached the broker first, so it takes effect first. A fresh topic per round.
/// After B's SUBACK, client C publishes a marker on the same topic and B reads up to it: A's
/// message, read by the broker before C's, reaches B before the marker if it reaches B at all,
/// so a miss is seen without waiting. The marker comes from a third client so that A sends
/// nothing after its PUBLISH within a round (data that A's reader read before the I/O driver
/// reported it would leave A an early place in the driver's next report, see
/// `tern_broker::read_order`). All clients write from one thread pinned to one CPU
/// ([`pin_to_current_cpu`]), so that B's SUBSCRIBE does reach the broker's socket first.
///
/// B and A are each one of [`ROTATION`] connections, used in turn. A segment that arrives while
/// the broker is inside a write on the same socket is not readable until that write returns
/// (the kernel queues it in the socket's backlog, `tcp_add_backlog`, and processes it in
/// `release_sock`): that is where this test's premise failed, not the broker's order. The
/// broker writes to B (the previous round's marker) and to A (a PUBACK), and the client, woken
/// by the delivery of those bytes, can preempt the broker's writer on the test's CPU *inside*
/// its `writev` and send the next round's packet before the write returns. Traced in session 5
/// (debug build, tracing on): 4 misses in 1,000 rounds, and every one was a round whose
/// SUBSCRIBE met a broker write to B still in progress (1.5 and 3 ms `writev`s); the driver
/// then reported A's PUBLISH before B's SUBSCRIBE, and the broker acted in that order, as a
/// single-threaded broker (which writes and polls on one thread) would. Any broker has this
/// exposure; the test must not depend on it. The rotation alone left the premise to chance
/// on a loaded machine (a broker thread preempted inside its `writev` for longer than four
/// rounds: one miss in a `.ci/run` while another build ran, session 5), so before B and A
/// send, the test also waits until no broker thread is inside a system call on their sockets
/// ([`until_socket_free`], from `/proc`).
#[tokio::test]
async fn subscribe_takes_effect_before_a_later_publish_from_another_client() {
    let b = Broker::start();
    pin_to_current_cpu();
    let mut subs = Vec::new();
    let mut pubs = Vec::new();
    for i in 0..ROTATION {
        subs.push(RawClient::v5(b.addr, &format!("order-b{i}")).await);
        pubs.push(RawClient::v5(b.addr, &format!("order-a{i}")).await);
    }
    let mut marker = RawClient::v5(b.addr, "order-c").await;
    // Every connection is idle and waiting for data before the first round.
    for c in subs.iter_mut().chain(pubs.iter_mut()) {
        assert!(c.ping().await.is_empty());
    }
    assert!(marker.ping().await.is_empty());
    let pid = b.pid();
    let fd_of = |c: &RawClient| {
        broker_fd(pid, b.addr.port(), c.local_port()).expect("the broker's fd of a connection")
    };
    let sub_fds: Vec<u64> = subs.iter().map(fd_of).collect();
    let pub_fds: Vec<u64> = pubs.iter().map(fd_of).collect();
    let mut missed = Vec::new();
    let mut late = Vec::new();
    for round in 0..ROUNDS {
        let sub = &mut subs[round % ROTATION];
        let publ = &mut pubs[round % ROTATION];
        until_socket_free(pid, sub_fds[round % ROTATION]).await;
        until_socket_free(pid, pub_fds[round % ROTATION]).await;
        let topic = format!("order/{round}");
        let packet_id = (round % 60_000) as u16 + 1;
        let level = (round % 2) as u8;
        sub.send(&Packet::Subscribe(subscribe(
            packet_id,
            &[(&topic, opts(0))],
        )))
        .await;
        publ.send(&Packet::Publish(publish(
            &topic, b"first", level, packet_id,
        )))
        .await;
        let mut got_first = false;
        loop {
            match sub.expect_packet().await {
                Packet::SubAck(a) => {
                    assert_eq!(a.packet_id, packet_id);
                    assert_eq!(a.reasons, vec![ReasonCode::GRANTED_QOS_0]);
                    break;
                }
                Packet::Publish(p) if p.topic.as_str() == topic && &p.payload[..] == b"first" => {
                    got_first = true;
                }
                // An earlier round's message after that round's marker: out of order.
                Packet::Publish(p) if &p.payload[..] == b"first" => late.push(p.topic.to_string()),
                other => panic!("round {round}: unexpected {}", brief(&other)),
            }
        }
        // The subscription is in place now: the marker reaches B whatever happened before.
        marker
            .send(&Packet::Publish(publish(&topic, b"marker", 0, 0)))
            .await;
        loop {
            let p = sub.expect_publish().await;
            if p.topic.as_str() != topic {
                late.push(p.topic.to_string());
                continue;
            }
            match &p.payload[..] {
                b"first" => got_first = true,
                b"marker" => break,
                other => panic!("round {round}: unexpected payload {other:?}"),
            }
        }
        if level == 1 {
            match publ.expect_packet().await {
                Packet::PubAck(a) if a.packet_id == packet_id => {}
                other => panic!("round {round}: expected PUBACK, got {}", brief(&other)),
            }
        }
        if !got_first {
            missed.push(round);
        }
    }
    eprintln!(
        "missed {} of {ROUNDS}: {missed:?}; after the marker: {late:?}",
        missed.len()
    );
    assert!(
        missed.is_empty(),
        "the PUBLISH read after B's SUBSCRIBE missed B in {} of {ROUNDS} rounds: {missed:?} \
         (of those, delivered after the marker read after them: {late:?})",
        missed.len()
    );
}

/// The premise guard sees what it must: a thread blocked in `read` on a socket is inside a
/// system call on that socket's fd, and not once the read returned.
#[test]
fn in_syscall_on_sees_a_thread_blocked_on_a_socket() {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    let (mut a, mut b) = std::os::unix::net::UnixStream::pair().expect("socket pair");
    let fd = b.as_raw_fd() as u64;
    let pid = std::process::id() as i32;
    // The reader hands its socket back: closed, its fd number could be reused at once by
    // the other test's sockets, with a thread of theirs blocked on it (a false "seen").
    let reader = std::thread::spawn(move || {
        let mut byte = [0u8; 1];
        b.read_exact(&mut byte).expect("read");
        b
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !in_syscall_on(pid, fd) {
        assert!(
            std::time::Instant::now() < deadline,
            "the blocked read was never seen"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    a.write_all(b"x").expect("write");
    let _still_open = reader.join().expect("reader");
    assert!(!in_syscall_on(pid, fd), "seen after the read returned");
}
