//! A node that lost its disk must not come back under its old id.
//!
//! Raft counts on every voter keeping what it acknowledged. A voter restarted with an empty
//! data directory under its old id grants its vote to any candidate (every log is at least
//! as long as its own), so it can help elect a node that lacks committed entries: they are
//! lost (`scripts/cluster-check.sh --wipe-on-kill` lost 34 acknowledged messages that way).
//! Such a node looks exactly like one that never ran, so the evidence must come from the
//! others:
//!
//! - Each node draws a random **incarnation** the first time it starts on a data directory
//!   and keeps it there (kv `raft-peers`, always synced).
//! - At every start a node introduces itself to the peers (`Request::Introduce`); each peer
//!   records the first incarnation it hears for a node id (synced before it answers) and
//!   answers whether it is new, the one it knows, or a different one.
//! - A node on a new data directory (no Raft state, not yet confirmed) starts its Raft core
//!   only once a majority of the configured peers (itself counted) has answered and none
//!   answered "different"; on "different" it refuses to start ([`ConsensusError::DiskLost`]).
//!   A data directory with Raft state from before incarnations existed is taken as confirmed.
//!
//! Why a majority: a node whose start was confirmed was recorded by a majority; a later start
//! on an empty disk must hear from a majority too, and any two majorities share a node that
//! knows the old incarnation. Until then the node has no Raft core, so it votes for nobody.
//! A node that never ran is new to everyone and starts as before (the cluster's first
//! formation: every node is new; a majority must be up, as forming needs anyway).

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tern_store::{KvStream, Store, StreamConfig, SyncPolicy};

use crate::error::ConsensusError;
use crate::network::{Introduced, Introductions, Request, Response};
use crate::tls::ClusterTls;
use crate::types::NodeId;

/// The kv stream of incarnations: this node's own, and the first one heard for each peer.
pub const PEERS_KV: &str = "raft-peers";
const KEY_OWN: &[u8] = b"own";
/// Present once a majority confirmed this node new (or it had Raft state from before).
const KEY_CONFIRMED: &[u8] = b"confirmed";
/// Most node ids a node records an incarnation for (a hostile peer could invent ids).
pub const MAX_RECORDED_NODES: usize = 4096;
/// How often a new node asks the peers again while no majority has answered.
const RETRY_MS: u64 = 100;

/// This node's incarnation and the ones it has heard for its peers.
pub struct Incarnations {
    kv: KvStream,
    /// Serializes record-if-absent.
    lock: Mutex<()>,
    /// Gone once every holder let go, and with it the kv stream (see [`Incarnations::liveness`]).
    canary: Arc<()>,
}

fn peer_key(node: NodeId) -> Vec<u8> {
    format!("peer/{}", node.0).into_bytes()
}

fn decode_u64(v: &[u8]) -> Result<u64, ConsensusError> {
    let bytes: [u8; 8] = v.try_into().map_err(|_| {
        ConsensusError::Storage(format!("{PEERS_KV}: a value of {} bytes", v.len()))
    })?;
    Ok(u64::from_be_bytes(bytes))
}

impl Incarnations {
    pub fn open(store: &Store) -> Result<Incarnations, ConsensusError> {
        let kv = store.kv(
            PEERS_KV,
            StreamConfig {
                sync: SyncPolicy::Always,
                ..StreamConfig::default()
            },
        )?;
        Ok(Incarnations {
            kv,
            lock: Mutex::new(()),
            canary: Arc::new(()),
        })
    }

    /// Gone once every holder has dropped this, and so its kv stream and its hold on the
    /// store's lock: the cluster port's connection tasks hold it, and an aborted task is
    /// dropped some time after the abort (a node's shutdown waits for this, or a restart in
    /// the same process found the store still locked).
    pub(crate) fn liveness(&self) -> std::sync::Weak<()> {
        Arc::downgrade(&self.canary)
    }

    /// This node's incarnation, if it has started on this data directory before.
    pub fn own(&self) -> Result<Option<u64>, ConsensusError> {
        self.kv.get(KEY_OWN)?.map(|v| decode_u64(&v)).transpose()
    }

    /// Keeps `incarnation` as this node's (durable when it returns). Kept before the peers
    /// are asked: a node stopped while it waits asks again with the same one (a new draw
    /// would read as a lost disk to the peers that recorded the first).
    pub fn set_own(&self, incarnation: u64) -> Result<(), ConsensusError> {
        self.kv.put(KEY_OWN, &incarnation.to_be_bytes())?.wait()?;
        Ok(())
    }

    /// Whether this node's start was confirmed (see [`Incarnations::set_confirmed`]).
    pub fn confirmed(&self) -> Result<bool, ConsensusError> {
        Ok(self.kv.get(KEY_CONFIRMED)?.is_some())
    }

    /// Records that a majority confirmed this node new, or that it already had Raft state
    /// (a data directory from before incarnations existed): it need not ask again.
    pub fn set_confirmed(&self) -> Result<(), ConsensusError> {
        self.kv.put(KEY_CONFIRMED, b"1")?.wait()?;
        Ok(())
    }
}

impl Introductions for Incarnations {
    /// A peer introduced itself: records its incarnation if none is known (durable before
    /// the answer), and says how it compares.
    fn introduce(&self, node: NodeId, incarnation: u64) -> Result<Introduced, ConsensusError> {
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let key = peer_key(node);
        match self.kv.get(&key)? {
            Some(v) => {
                let known = decode_u64(&v)?;
                Ok(if known == incarnation {
                    Introduced::Known
                } else {
                    Introduced::Different { known }
                })
            }
            None if self.kv.len() > MAX_RECORDED_NODES => Ok(Introduced::Unsupported),
            None => {
                self.kv.put(&key, &incarnation.to_be_bytes())?.wait()?;
                Ok(Introduced::New)
            }
        }
    }
}

/// A new random incarnation (std's per-process random hash keys, mixed with the time: no
/// two starts draw the same one in practice, and 0 is never drawn).
pub fn draw() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish().max(1)
}

/// Introduces this node (`id`, `incarnation`) to every peer in `peers` at once; the answers
/// by peer (a peer that did not answer is absent).
pub async fn introduce_to(
    id: NodeId,
    incarnation: u64,
    peers: &[(NodeId, SocketAddr)],
    tls: Option<&ClusterTls>,
) -> BTreeMap<NodeId, Introduced> {
    let mut calls = tokio::task::JoinSet::new();
    for (peer, addr) in peers.iter().filter(|(p, _)| *p != id) {
        let (peer, addr) = (*peer, *addr);
        let tls = tls.cloned();
        calls.spawn(async move {
            let req = Request::Introduce {
                node: id,
                incarnation,
            };
            (peer, crate::network::call(addr, &req, tls.as_ref()).await)
        });
    }
    let mut answers = BTreeMap::new();
    while let Some(done) = calls.join_next().await {
        if let Ok((peer, Ok(Response::Introduced(a)))) = done {
            answers.insert(peer, a);
        }
    }
    answers
}

/// For a node without an incarnation: waits until a majority of `peers` (this node counted
/// when it is one of them) has answered with none saying "different", asking again every
/// [`RETRY_MS`]. Fails at the first "different".
pub async fn confirm_new(
    id: NodeId,
    incarnation: u64,
    peers: &[(NodeId, SocketAddr)],
    tls: Option<&ClusterTls>,
) -> Result<(), ConsensusError> {
    let voters = peers.len();
    let me = usize::from(peers.iter().any(|(p, _)| *p == id));
    let majority = voters / 2 + 1;
    let mut tries = 0u64;
    loop {
        let answers = introduce_to(id, incarnation, peers, tls).await;
        if let Some((peer, known)) = answers.iter().find_map(|(p, a)| match a {
            Introduced::Different { known } => Some((*p, *known)),
            _ => None,
        }) {
            return Err(ConsensusError::DiskLost(format!(
                "node {id} starts on a new data directory, but node {peer} knew it with another \
                 disk (incarnation {known:#x}): what it acknowledged there is gone. Remove it \
                 (DELETE /api/v1/cluster/members/{id}) and add it back under a new node_id"
            )));
        }
        let counted = me
            + answers
                .values()
                .filter(|a| !matches!(a, Introduced::Unsupported))
                .count();
        if counted >= majority {
            return Ok(());
        }
        if tries % 20 == 0 {
            tracing::info!(node = %id, answered = counted, needed = majority,
                "raft: a new data directory: waiting for a majority of the peers to confirm this node is new");
        }
        tries += 1;
        tokio::time::sleep(Duration::from_millis(RETRY_MS)).await;
    }
}

/// At a node's start, before its Raft core exists (so a node that waits votes for nobody):
/// a node on a new data directory waits until a majority of `peers` confirms it new,
/// answering their introductions on `listener` meanwhile, and fails with
/// [`ConsensusError::DiskLost`] if one knew it with another incarnation. A confirmed node,
/// or one whose `store` has Raft state from before incarnations existed, introduces itself
/// in the background (its peers record it) and starts at once.
pub(crate) async fn check_start(
    (id, peers, tls): (NodeId, &[(NodeId, SocketAddr)], Option<&ClusterTls>),
    listener: &tokio::net::TcpListener,
    store: &Store,
    incarnations: &Arc<Incarnations>,
) -> Result<(), ConsensusError> {
    let own = match incarnations.own()? {
        Some(own) => own,
        None => {
            let own = draw();
            incarnations.set_own(own)?;
            own
        }
    };
    let had_raft_state = store
        .stream_names()?
        .iter()
        .any(|n| n == crate::log_store::META_KV);
    let confirmed = incarnations.confirmed()?;
    if confirmed || had_raft_state {
        if !confirmed {
            incarnations.set_confirmed()?;
        }
        let (peers, tls) = (peers.to_vec(), tls.cloned());
        tokio::spawn(async move {
            for (peer, a) in introduce_to(id, own, &peers, tls.as_ref()).await {
                if let Introduced::Different { known } = a {
                    tracing::error!(node = %id, %peer, known = format!("{known:#x}"), own = format!("{own:#x}"),
                        "raft: a peer knows this node with another incarnation: two processes with one node_id?");
                }
            }
        });
        return Ok(());
    }
    tokio::select! {
        r = confirm_new(id, own, peers, tls) => r?,
        () = crate::network::answer_introductions(listener, incarnations.clone(), tls.cloned()) => {}
    }
    incarnations.set_confirmed()?;
    tracing::info!(node = %id, incarnation = format!("{own:#x}"), "raft: a new data directory, confirmed new by a majority of the peers");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_incarnation_heard_is_kept_and_another_is_different() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let inc = Incarnations::open(&store).unwrap();
        assert_eq!(inc.own().unwrap(), None);
        inc.set_own(7).unwrap();
        assert_eq!(inc.own().unwrap(), Some(7));
        assert_eq!(inc.introduce(NodeId(2), 11).unwrap(), Introduced::New);
        assert_eq!(inc.introduce(NodeId(2), 11).unwrap(), Introduced::Known);
        assert_eq!(
            inc.introduce(NodeId(2), 12).unwrap(),
            Introduced::Different { known: 11 }
        );
        drop(inc);
        drop(store);
        // Kept across a restart.
        let store = Store::open(dir.path()).unwrap();
        let inc = Incarnations::open(&store).unwrap();
        assert_eq!(inc.own().unwrap(), Some(7));
        assert_eq!(
            inc.introduce(NodeId(2), 12).unwrap(),
            Introduced::Different { known: 11 }
        );
    }

    #[test]
    fn confirmation_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let inc = Incarnations::open(&store).unwrap();
        assert!(!inc.confirmed().unwrap());
        inc.set_confirmed().unwrap();
        drop(inc);
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        assert!(Incarnations::open(&store).unwrap().confirmed().unwrap());
    }

    #[test]
    fn a_peer_inventing_node_ids_fills_the_table_only_up_to_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let inc = Incarnations::open(&store).unwrap();
        let mut recorded = 0;
        for id in 1..=(MAX_RECORDED_NODES as u64 + 10) {
            if inc.introduce(NodeId(id), id).unwrap() == Introduced::New {
                recorded += 1;
            }
        }
        assert!(recorded <= MAX_RECORDED_NODES + 1, "{recorded} recorded");
        assert_eq!(
            inc.introduce(NodeId(1_000_000), 1).unwrap(),
            Introduced::Unsupported
        );
        // Those recorded are still answered.
        assert_eq!(inc.introduce(NodeId(1), 1).unwrap(), Introduced::Known);
    }

    #[test]
    fn two_draws_differ() {
        assert_ne!(draw(), draw());
    }
}
