//! Tern's own consensus trait, what the broker sees, so the engine underneath (openraft 0.9
//! today) can be changed without touching the broker; and its implementation by [`RaftNode`].

use std::collections::BTreeSet;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, ServerState};

use crate::error::ConsensusError;
#[cfg(feature = "inject")]
use crate::inject::{self, Bug};
use crate::node::RaftNode;
use crate::types::{Batch, LogIndex, MAX_BATCH_OPS, MAX_PROPOSAL_BYTES, NodeId};

/// A learner may be promoted once it is at most this many entries behind the leader.
pub const PROMOTE_MAX_LAG_ENTRIES: u64 = 64;

/// A node's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Leader,
    Follower,
    Candidate,
    Learner,
    Stopped,
}

/// How far one peer's log is behind the leader's (reported by the leader only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerReplication {
    pub id: NodeId,
    /// The last index known to be on the peer's disk.
    pub matched_index: Option<LogIndex>,
    /// Entries the peer lacks.
    pub lag_entries: u64,
}

/// What `/metrics` and `/readyz` need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterStatus {
    pub node_id: NodeId,
    pub role: Role,
    pub term: u64,
    pub leader: Option<NodeId>,
    pub last_log_index: Option<LogIndex>,
    /// Applied on this node (on the leader, every applied entry is committed; openraft 0.9's
    /// metrics do not carry the commit index itself).
    pub applied_index: Option<LogIndex>,
    /// The last index the current snapshot covers.
    pub snapshot_index: Option<LogIndex>,
    /// The last index removed from the log (covered by a snapshot).
    pub purged_index: Option<LogIndex>,
    pub voters: Vec<NodeId>,
    pub learners: Vec<NodeId>,
    /// Leader only: per peer.
    pub replication: Vec<PeerReplication>,
    /// Leader only: how long ago a majority last acknowledged it.
    pub quorum_ack_age_ms: Option<u64>,
    /// Elections this node started since it started.
    pub elections_started: u64,
    /// A leader's quorum acknowledgement older than this is a lost quorum (the election
    /// timeout: followers would be electing by then).
    pub quorum_ack_max_age_ms: u64,
}

impl ClusterStatus {
    /// A leader is known (`/readyz` answers 503 otherwise).
    pub fn has_leader(&self) -> bool {
        self.leader.is_some()
    }

    /// A leader heard from a majority recently; a follower or learner that knows a leader
    /// assumes the leader has its quorum (it cannot know better).
    pub fn quorum_reachable(&self) -> bool {
        match self.role {
            Role::Leader => self
                .quorum_ack_age_ms
                .is_some_and(|ms| ms <= self.quorum_ack_max_age_ms),
            Role::Follower | Role::Learner => self.has_leader(),
            Role::Candidate | Role::Stopped => false,
        }
    }

    /// A leader that has not heard from a majority for twice the election timeout: on the
    /// minority side of a partition, not merely slow (a loaded machine's fsync stalls exceed
    /// one election timeout at times; [`ClusterStatus::quorum_reachable`], for `/readyz`,
    /// says "not ready" already then). False for any other role.
    pub fn leader_cut_off(&self) -> bool {
        self.role == Role::Leader
            && self
                .quorum_ack_age_ms
                .is_none_or(|ms| ms > 2 * self.quorum_ack_max_age_ms)
    }

    /// This node can serve no client now: it knows no leader, or it leads cut off from its
    /// majority. (A follower that knows a leader may not reach it either, but learns of a
    /// new one within an election timeout.)
    pub fn serving_nobody(&self) -> bool {
        !self.has_leader() || self.leader_cut_off()
    }
}

/// The outcome of a proposal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Committed {
    /// The batch's Raft log index.
    pub index: LogIndex,
}

/// A submitted batch ([`Consensus::submit`]): completes once committed and applied here.
pub struct Proposal(Pin<Box<dyn Future<Output = Result<Committed, ConsensusError>> + Send>>);

impl Proposal {
    /// A proposal from any future (a test's consensus).
    pub fn new(
        f: impl Future<Output = Result<Committed, ConsensusError>> + Send + 'static,
    ) -> Self {
        Proposal(Box::pin(f))
    }
}

impl Future for Proposal {
    type Output = Result<Committed, ConsensusError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.as_mut().poll(cx)
    }
}

/// What the broker needs from consensus.
///
/// Contract: the future of [`Consensus::propose`] completes with `Ok` only after the batch is
/// committed (on disk on a majority of voters, under their log sync policy) and applied on
/// this node; every node's [`crate::Applier`] sees committed batches in log order. A proposal
/// made on a node that is not the leader fails with `NotLeader` (naming the leader if known,
/// so the broker can forward). Methods are to be called on the leader except `status`.
pub trait Consensus: Send + Sync {
    /// Proposes one batch of operations as one Raft entry.
    fn propose(
        &self,
        ops: Vec<Bytes>,
    ) -> impl Future<Output = Result<Committed, ConsensusError>> + Send;
    /// Sends one batch as one Raft entry and returns once it is handed to the Raft core,
    /// without waiting for the commit: the returned [`Proposal`] completes as `propose`
    /// would. Batches submitted one after another (each call awaited before the next) enter
    /// the log in that order, so a caller can keep several in flight and still know that
    /// the log holds them in its order; a batch that fails means none after it commits in
    /// this term either (the leader lost its leadership).
    fn submit(
        &self,
        ops: Vec<Bytes>,
    ) -> impl Future<Output = Result<Proposal, ConsensusError>> + Send;
    /// This node's view of the cluster (no I/O).
    fn status(&self) -> ClusterStatus;
    /// Adds a node that receives the log but does not vote.
    fn add_learner(
        &self,
        id: NodeId,
        addr: SocketAddr,
    ) -> impl Future<Output = Result<(), ConsensusError>> + Send;
    /// Makes a caught-up learner a voter (refused while it lags).
    fn promote(&self, id: NodeId) -> impl Future<Output = Result<(), ConsensusError>> + Send;
    /// Removes a voter or learner from the cluster.
    fn remove(&self, id: NodeId) -> impl Future<Output = Result<(), ConsensusError>> + Send;
    /// Hands leadership to `to`.
    fn transfer_leader(
        &self,
        to: NodeId,
    ) -> impl Future<Output = Result<(), ConsensusError>> + Send;
}

fn write_error(e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> ConsensusError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => ConsensusError::NotLeader {
            leader: f.leader_id.map(|id| {
                let addr = f.leader_node.and_then(|n| n.addr.parse().ok());
                (id, addr)
            }),
        },
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            ConsensusError::Membership(e.to_string())
        }
        RaftError::Fatal(f) => ConsensusError::Shutdown(f.to_string()),
    }
}

/// Resolves once this node has moved past `term` (or stopped), with the error its proposals
/// of that term get. The term, not the role: a leader that removes itself from the
/// membership steps down within its term, and its change is still answered.
///
/// openraft 0.9 answers a proposal when its entry is applied here or truncated from this
/// node's log, and at no other time. A leader cut off with an uncommitted entry that later
/// catches up by a snapshot install past its whole log sees no conflict: the entry is purged
/// with the log and its proposal would wait forever (and with it whoever waits for it: the
/// cluster's engine stop, hence its next start; cluster broker seed 3036). The outcome of
/// such a proposal is unknown, as `ConsensusError::NotLeader` says.
async fn deposed(
    mut metrics: tokio::sync::watch::Receiver<openraft::RaftMetrics<NodeId, BasicNode>>,
    term: u64,
) -> ConsensusError {
    let gone = |m: &openraft::RaftMetrics<NodeId, BasicNode>| {
        m.current_term != term || m.state == ServerState::Shutdown
    };
    let Ok(m) = metrics.wait_for(gone).await else {
        return ConsensusError::Shutdown("the Raft core stopped".into());
    };
    if m.state == ServerState::Shutdown {
        return ConsensusError::Shutdown("the Raft core stopped".into());
    }
    let membership = m.membership_config.membership();
    ConsensusError::NotLeader {
        leader: m.current_leader.map(|id| {
            let addr = membership.get_node(&id).and_then(|n| n.addr.parse().ok());
            (id, addr)
        }),
    }
}

/// `call`'s answer, or [`deposed`]'s error once this node has moved past `term`: how every
/// proposal and membership change of a term waits. An answer that is there wins over a
/// deposition seen at the same time.
async fn guarded<T>(
    metrics: tokio::sync::watch::Receiver<openraft::RaftMetrics<NodeId, BasicNode>>,
    term: u64,
    call: impl Future<Output = Result<T, ConsensusError>>,
) -> Result<T, ConsensusError> {
    tokio::select! {
        biased;
        answer = call => answer,
        deposed = deposed(metrics, term) => Err(deposed),
    }
}

fn role(s: ServerState) -> Role {
    match s {
        ServerState::Leader => Role::Leader,
        ServerState::Follower => Role::Follower,
        ServerState::Candidate => Role::Candidate,
        ServerState::Learner => Role::Learner,
        ServerState::Shutdown => Role::Stopped,
    }
}

/// Longest a leader transfer waits for the chosen voter to have the leader's whole log (a
/// node just restarted replays and catches up first; the leader's engine is stopped
/// meanwhile, so this also bounds that pause).
pub const TRANSFER_CATCH_UP_MS: u64 = 10_000;

impl RaftNode {
    /// Leader only: waits until peer `to` is known to hold the log up to `index` on its disk
    /// (`None`: the leader's last index at each look), at most `timeout_ms`. `false` on a
    /// timeout, or once this node stops leading or stops.
    pub async fn wait_replicated(
        &self,
        to: NodeId,
        index: Option<LogIndex>,
        timeout_ms: u64,
    ) -> bool {
        let mut changes = self.status_changes();
        let wait = async {
            loop {
                let st = self.status();
                if st.role != Role::Leader {
                    return false;
                }
                let target = index.or(st.last_log_index);
                if st
                    .replication
                    .iter()
                    .any(|p| p.id == to && p.matched_index >= target)
                {
                    return true;
                }
                if !changes.changed().await {
                    return false;
                }
            }
        };
        tokio::time::timeout(Duration::from_millis(timeout_ms), wait)
            .await
            .unwrap_or(false)
    }

    async fn change(
        &self,
        changes: ChangeMembers<NodeId, BasicNode>,
    ) -> Result<(), ConsensusError> {
        let change = self.raft.change_membership(changes, false);
        self.while_leading(async { change.await.map(|_| ()).map_err(write_error) })
            .await
    }

    /// `call` (an openraft call answered once its entry is applied here), or the error of
    /// [`deposed`] once this node no longer leads the term it led when the call began: the
    /// same guard as a proposal's.
    async fn while_leading<T>(
        &self,
        call: impl Future<Output = Result<T, ConsensusError>>,
    ) -> Result<T, ConsensusError> {
        let metrics = self.raft.metrics();
        let term = metrics.borrow().current_term;
        guarded(metrics, term, call).await
    }
}

#[cfg(feature = "inject")]
impl RaftNode {
    /// The injected bug `AckBeforeCommit`: answers once this node's log holds the entry (its
    /// last log index moved past where it was), not once a majority does. Proposals are
    /// serialized so that the index it answers is the entry's.
    async fn propose_local_only(&self, ops: Vec<Bytes>) -> Result<Committed, ConsensusError> {
        let _one_at_a_time = self.inject_serial.lock().await;
        let mut rx = self.raft.metrics();
        let before = rx.borrow().last_log_index;
        let raft = self.raft.clone();
        let mut write = tokio::spawn(async move { raft.client_write(Batch(ops)).await });
        loop {
            let last = rx.borrow().last_log_index;
            if last > before && rx.borrow().state == ServerState::Leader {
                return Ok(Committed {
                    index: last.unwrap_or(0),
                });
            }
            tokio::select! {
                r = &mut write => {
                    let r = r.map_err(|e| ConsensusError::Shutdown(e.to_string()))?;
                    return r.map(|resp| Committed { index: resp.log_id.index }).map_err(write_error);
                }
                c = rx.changed() => {
                    if c.is_err() {
                        return Err(ConsensusError::Shutdown("metrics closed".into()));
                    }
                }
            }
        }
    }
}

/// A batch within [`MAX_BATCH_OPS`] and [`MAX_PROPOSAL_BYTES`].
fn check_batch(ops: &[Bytes]) -> Result<(), ConsensusError> {
    if ops.is_empty() || ops.len() > MAX_BATCH_OPS {
        return Err(ConsensusError::Invalid(format!(
            "a batch of {} operations (1..={MAX_BATCH_OPS})",
            ops.len()
        )));
    }
    let bytes: usize = ops.iter().map(Bytes::len).sum();
    if bytes > MAX_PROPOSAL_BYTES {
        return Err(ConsensusError::Invalid(format!(
            "a batch of {bytes} bytes (at most {MAX_PROPOSAL_BYTES})"
        )));
    }
    Ok(())
}

impl Consensus for RaftNode {
    async fn submit(&self, ops: Vec<Bytes>) -> Result<Proposal, ConsensusError> {
        check_batch(&ops)?;
        let metrics = self.raft.metrics();
        let term = metrics.borrow().current_term;
        let rx = self
            .raft
            .client_write_ff(Batch(ops))
            .await
            .map_err(|f| ConsensusError::Shutdown(f.to_string()))?;
        let answer = async move {
            match rx.await {
                Ok(Ok(resp)) => Ok(Committed {
                    index: resp.log_id.index,
                }),
                Ok(Err(e)) => Err(write_error(RaftError::APIError(e))),
                Err(_) => Err(ConsensusError::Shutdown(
                    "the Raft core dropped the proposal".into(),
                )),
            }
        };
        Ok(Proposal::new(guarded(metrics, term, answer)))
    }

    async fn propose(&self, ops: Vec<Bytes>) -> Result<Committed, ConsensusError> {
        check_batch(&ops)?;
        #[cfg(feature = "inject")]
        if inject::on(Bug::AckBeforeCommit) {
            return self.propose_local_only(ops).await;
        }
        self.submit(ops).await?.await
    }

    fn status(&self) -> ClusterStatus {
        let m = self.raft.metrics().borrow().clone();
        let last = m.last_log_index.unwrap_or(0);
        let replication = m
            .replication
            .iter()
            .flatten()
            .filter(|(id, _)| **id != self.id)
            .map(|(id, matched)| {
                let matched_index = matched.map(|l| l.index);
                PeerReplication {
                    id: *id,
                    matched_index,
                    lag_entries: matched_index.map_or(last + 1, |i| last.saturating_sub(i)),
                }
            })
            .collect();
        let membership = m.membership_config.membership();
        ClusterStatus {
            node_id: self.id,
            role: role(m.state),
            term: m.current_term,
            leader: m.current_leader,
            last_log_index: m.last_log_index,
            applied_index: m.last_applied.map(|l| l.index),
            snapshot_index: m.snapshot.map(|l| l.index),
            purged_index: m.purged.map(|l| l.index),
            voters: membership.voter_ids().collect(),
            learners: membership.learner_ids().collect(),
            replication,
            quorum_ack_age_ms: m.millis_since_quorum_ack,
            elections_started: self.elections.load(Ordering::Relaxed),
            quorum_ack_max_age_ms: self.config.election_timeout_max_ms,
        }
    }

    async fn add_learner(&self, id: NodeId, addr: SocketAddr) -> Result<(), ConsensusError> {
        let add = self
            .raft
            .add_learner(id, BasicNode::new(addr.to_string()), false);
        self.while_leading(async { add.await.map(|_| ()).map_err(write_error) })
            .await
    }

    async fn promote(&self, id: NodeId) -> Result<(), ConsensusError> {
        let st = self.status();
        if st.role != Role::Leader {
            return Err(ConsensusError::NotLeader {
                leader: st.leader.map(|l| (l, None)),
            });
        }
        // A learner the leader has never heard from is not caught up, however young the
        // log: its lag would read as `last + 1`, and promoting an unreachable node can leave
        // a two-voter cluster unable to commit.
        let lag = st
            .replication
            .iter()
            .find(|p| p.id == id)
            .map(|p| p.matched_index.map_or(u64::MAX, |_| p.lag_entries));
        match lag {
            Some(u64::MAX) => {
                return Err(ConsensusError::Membership(format!(
                    "learner {id} has not answered the leader yet"
                )));
            }
            Some(l) if l <= PROMOTE_MAX_LAG_ENTRIES => {}
            Some(l) => {
                return Err(ConsensusError::Membership(format!(
                    "learner {id} is {l} entries behind (at most {PROMOTE_MAX_LAG_ENTRIES})"
                )));
            }
            None => {
                return Err(ConsensusError::Membership(format!("{id} is not a learner")));
            }
        }
        self.change(ChangeMembers::AddVoterIds(BTreeSet::from([id])))
            .await
    }

    async fn remove(&self, id: NodeId) -> Result<(), ConsensusError> {
        let st = self.status();
        // A voter removed with `retain = false` leaves the membership altogether.
        let ids = BTreeSet::from([id]);
        if st.voters.contains(&id) {
            self.change(ChangeMembers::RemoveVoters(ids)).await
        } else {
            self.change(ChangeMembers::RemoveNodes(ids)).await
        }
    }

    /// openraft 0.9 has no leader transfer (0.10 has); this one is made of its runtime
    /// switches: the other voters hold their elections, this leader stops its heartbeats,
    /// and once the leases run out `to` is the only node that campaigns; it wins, having the
    /// whole log. The caller stops proposing first (writes renew the leases as heartbeats
    /// do). Fails, leaving this node the leader, if `to` did not take over in time.
    async fn transfer_leader(&self, to: NodeId) -> Result<(), ConsensusError> {
        let st = self.status();
        if st.role != Role::Leader {
            return Err(ConsensusError::NotLeader {
                leader: st.leader.map(|l| (l, self.member_addr(l))),
            });
        }
        if to == self.id {
            return Ok(());
        }
        if !st.voters.contains(&to) {
            return Err(ConsensusError::Membership(format!("{to} is not a voter")));
        }
        // The longest a voter waits on its own timer before it campaigns: the leader lease
        // (election_timeout_max) + its election timeout (<= max) + openraft's smaller-log
        // delay (2 x max) after a lost campaign = 4 x max; and a margin for the vote itself.
        let hold_ms = 6 * self.config.election_timeout_max_ms;
        // Only a node with the whole log can win (the voters compare logs): wait for `to` to
        // have it (the caller has stopped writing; a restarted node may still catch up).
        let started = tokio::time::Instant::now();
        if !self.wait_replicated(to, None, TRANSFER_CATCH_UP_MS).await {
            return Err(ConsensusError::TransferTimedOut(format!(
                "{to} did not catch up with the log within {TRANSFER_CATCH_UP_MS} ms"
            )));
        }
        tracing::info!(to = %to, after_ms = started.elapsed().as_millis() as u64, "raft: transfer: the chosen voter has the whole log");
        let mut changes = self.status_changes();
        // The chosen node may still be held by an earlier transfer: lifted (0).
        for v in st.voters.iter().filter(|v| **v != self.id) {
            let for_ms = if *v == to { 0 } else { hold_ms };
            if let Some(addr) = self.member_addr(*v) {
                let req = crate::network::Request::HoldElections { for_ms };
                if let Err(e) = crate::network::call(addr, &req, self.config.tls.as_ref()).await {
                    tracing::warn!(peer = %v, error = %e, "raft: could not hold a voter's elections");
                }
            }
        }
        crate::network::hold_elections(&self.raft, hold_ms);
        self.raft.runtime_config().heartbeat(false);
        // The voters' leases (openraft: the largest election timeout) run out that long after
        // the last heartbeat; `to` campaigns a heartbeat interval later.
        let after_ms = self.config.election_timeout_max_ms + self.config.heartbeat_interval_ms;
        if let Some(addr) = self.member_addr(to) {
            let req = crate::network::Request::Campaign { after_ms };
            if let Err(e) = crate::network::call(addr, &req, self.config.tls.as_ref()).await {
                tracing::warn!(peer = %to, error = %e, "raft: could not ask the chosen voter to campaign (its own timer will)");
            }
        }
        let moved = tokio::time::timeout(Duration::from_millis(hold_ms), async {
            while self.status().leader != Some(to) {
                if !changes.changed().await {
                    return false;
                }
            }
            true
        })
        .await;
        self.raft.runtime_config().heartbeat(true);
        match moved {
            Ok(true) => {
                tracing::info!(to = %to, after_ms = started.elapsed().as_millis() as u64, "raft: transfer: the chosen voter leads");
                Ok(())
            }
            _ => Err(ConsensusError::TransferTimedOut(format!(
                "{to} did not take the leadership within {hold_ms} ms"
            ))),
        }
    }
}
