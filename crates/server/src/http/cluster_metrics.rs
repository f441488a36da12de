//! The `tern_cluster_*` families of `/metrics` (Prometheus text format 0.0.4), appended to the
//! broker's exposition when the node is in a cluster, or alone on a follower (no broker).
//!
//! # Invariants
//! - Every family is written as `# HELP`, `# TYPE`, then its samples, once per page.
//! - Label values are role names, node ids and limit names, which need no escaping (checked
//!   in debug).
//! - An index the node does not know (no log yet, no snapshot, nothing purged) has no sample,
//!   rather than a 0 that would read as index 0; the family's HELP and TYPE are still there.

use std::fmt::Write;

use tern_raft::{ClusterStatus, Role};

use super::cluster::{ClusterControl, ROLES, role_name};

/// A page of families being written.
#[derive(Default)]
struct Page {
    out: String,
}

impl Page {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        debug_assert!(name.starts_with("tern_cluster_") && !help.contains('\n'));
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, label: Option<(&str, &str)>, value: u64) {
        match label {
            Some((key, value_text)) => {
                debug_assert!(
                    value_text
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_')
                );
                let _ = writeln!(self.out, "{name}{{{key}=\"{value_text}\"}} {value}");
            }
            None => {
                let _ = writeln!(self.out, "{name} {value}");
            }
        }
    }

    /// A family with one unlabelled sample, or none when the value is unknown.
    fn single(&mut self, name: &str, kind: &str, help: &str, value: Option<u64>) {
        self.family(name, kind, help);
        if let Some(value) = value {
            self.sample(name, None, value);
        }
    }
}

/// The `tern_cluster_*` families of this node.
pub(super) fn render(cluster: &dyn ClusterControl) -> String {
    let status = cluster.status();
    let mut page = Page::default();
    role(&mut page, status.role);
    state(&mut page, &status);
    indexes(&mut page, &status);
    replication(&mut page, &status);
    page.single(
        "tern_cluster_elections_started_total",
        "counter",
        "Elections this node started since it started.",
        Some(status.elections_started),
    );
    page.single(
        "tern_cluster_forwarded_connections_total",
        "counter",
        "Client connections this node forwarded to the leader since it started.",
        Some(cluster.forwarded_connections()),
    );
    refused(&mut page, cluster.refused_connections());
    page.out
}

fn refused(page: &mut Page, refused: tern_cluster::RefusedConnections) {
    let name = "tern_cluster_refused_connections_total";
    page.family(
        name,
        "counter",
        "Client connections this node closed at a limit since it started, by limit.",
    );
    for (limit, value) in [
        ("forwarded_connections", refused.forwarded_connections),
        ("forward_queue", refused.forward_queue),
        ("accept_queue", refused.accept_queue),
    ] {
        page.sample(name, Some(("limit", limit)), value);
    }
}

fn role(page: &mut Page, current: Role) {
    let name = "tern_cluster_role";
    page.family(
        name,
        "gauge",
        "This node's Raft role: 1 for the current one, 0 for the others.",
    );
    for role in ROLES {
        page.sample(
            name,
            Some(("role", role_name(role))),
            u64::from(role == current),
        );
    }
}

fn state(page: &mut Page, status: &ClusterStatus) {
    let gauge = "gauge";
    page.single(
        "tern_cluster_term",
        gauge,
        "The current Raft term.",
        Some(status.term),
    );
    page.single(
        "tern_cluster_leader_id",
        gauge,
        "The leader's node id as this node knows it; 0 while there is no leader (ids start at 1).",
        Some(status.leader.map_or(0, |l| l.0)),
    );
    page.single(
        "tern_cluster_quorum_reachable",
        gauge,
        "1 when a leader is known and reaches a quorum (what /readyz requires), else 0.",
        Some(u64::from(status.has_leader() && status.quorum_reachable())),
    );
    page.single(
        "tern_cluster_voters",
        gauge,
        "Voters in the membership.",
        Some(status.voters.len() as u64),
    );
    page.single(
        "tern_cluster_learners",
        gauge,
        "Learners (non-voting members catching up) in the membership.",
        Some(status.learners.len() as u64),
    );
}

fn indexes(page: &mut Page, status: &ClusterStatus) {
    let gauge = "gauge";
    page.single(
        "tern_cluster_commit_index",
        gauge,
        "Lower bound of the commit index: the applied index (openraft 0.9 reports no commit index; only committed entries are applied).",
        status.applied_index,
    );
    page.single(
        "tern_cluster_applied_index",
        gauge,
        "The last log index applied to this node's state.",
        status.applied_index,
    );
    page.single(
        "tern_cluster_last_log_index",
        gauge,
        "The last index in this node's Raft log.",
        status.last_log_index,
    );
    page.single(
        "tern_cluster_snapshot_index",
        gauge,
        "The last log index the current snapshot covers.",
        status.snapshot_index,
    );
    page.single(
        "tern_cluster_purged_index",
        gauge,
        "The last log index removed from the log (covered by a snapshot).",
        status.purged_index,
    );
}

fn replication(page: &mut Page, status: &ClusterStatus) {
    let name = "tern_cluster_replication_lag_entries";
    page.family(name, "gauge", "Leader only: log entries each peer lacks.");
    let mut peers: Vec<_> = status.replication.iter().collect();
    peers.sort_unstable_by_key(|p| p.id);
    for peer in peers {
        page.sample(name, Some(("peer", &peer.id.to_string())), peer.lag_entries);
    }
    let name = "tern_cluster_quorum_ack_age_seconds";
    page.family(
        name,
        "gauge",
        "Leader only: time since a quorum last acknowledged this leader.",
    );
    if let Some(ms) = status.quorum_ack_age_ms {
        // Milliseconds shown in seconds (Prometheus' base unit), exactly: ms / 1000.
        let _ = writeln!(page.out, "{name} {}.{:03}", ms / 1000, ms % 1000);
    }
}
