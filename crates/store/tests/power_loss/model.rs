//! The model: what the store promised about each record of a stream.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Removal {
    None,
    /// Requested (by an op that failed, a limit, or a policy that does not sync removals):
    /// the record may be there or not.
    Pending,
    /// Acknowledged under a syncing policy: must never be served again.
    Acked,
}

#[derive(Debug, Clone)]
pub(crate) struct Rec {
    pub(crate) topic: usize,
    pub(crate) payload: Vec<u8>,
    pub(crate) time: u64,
    /// Promised to survive a power loss.
    pub(crate) durable: bool,
    pub(crate) removal: Removal,
    /// The batch it was appended in (first..=last).
    pub(crate) batch: (u64, u64),
    /// A `Discard::New` limit may have rejected it and its ticket has not said (under
    /// `interval` a rejection is reported at the next sync, or as a failure if none comes).
    pub(crate) maybe_rejected: bool,
}

pub(crate) struct Model {
    pub(crate) name: String,
    pub(crate) cfg: StreamConfig,
    pub(crate) recs: BTreeMap<u64, Rec>,
    /// Every sequence at or below it was durable or served once: never to be reused.
    pub(crate) floor: u64,
    pub(crate) time: u64,
    /// Tickets not yet complete (interval).
    pub(crate) pending: Vec<Ticket>,
}

impl Model {
    pub(crate) fn syncs(&self) -> bool {
        self.cfg.sync != SyncPolicy::Never
    }

    pub(crate) fn mark_durable_upto(&mut self, seq: u64) {
        for r in self.recs.range_mut(..=seq).map(|(_, r)| r) {
            r.durable = true;
        }
    }

    pub(crate) fn settle(&mut self, t: &Ticket, res: &Result<u64, StoreError>) {
        match res {
            Ok(_) => {
                for s in t.first_seq()..=t.seq() {
                    if let Some(r) = self.recs.get_mut(&s) {
                        r.durable |= self.cfg.sync != SyncPolicy::Never;
                        r.maybe_rejected = false;
                    }
                }
            }
            Err(StoreError::LimitReached { .. }) => {
                for s in t.first_seq()..=t.seq() {
                    self.recs.remove(&s);
                }
            }
            Err(_) => {}
        }
    }

    /// Settles the tickets that completed.
    pub(crate) fn poll_pending(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        for t in pending {
            match t.try_result() {
                Some(res) => self.settle(&t, &res),
                None => self.pending.push(t),
            }
        }
    }

    pub(crate) fn remove(&mut self, pred: impl Fn(u64, &Rec) -> bool, acked: bool) {
        let to = if acked && self.syncs() {
            Removal::Acked
        } else {
            Removal::Pending
        };
        for (&s, r) in self.recs.iter_mut() {
            if pred(s, r) && r.removal != Removal::Acked {
                r.removal = to;
            }
        }
    }
}
