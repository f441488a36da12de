//! The application under consensus: an applier whose state (the batches it has applied, by
//! index) outlives the node's restarts and power losses, as the broker's durable state would
//! with its applied index kept atomically with its data. It checks the apply contract as it
//! goes: indexes grow; an index at or below its own point is a replay after a restart, and
//! must carry the very batch it applied there.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tern_raft::{Applier, ApplyError, LogIndex, NodeId};

#[derive(Default)]
pub struct AppState {
    /// Index -> batch, as applied (a replay is skipped).
    pub applied: BTreeMap<LogIndex, Vec<Bytes>>,
    pub replays: u64,
    pub snapshots_installed: u64,
}

pub type Shared = Arc<Mutex<AppState>>;

pub struct App {
    pub node: NodeId,
    pub state: Shared,
    pub violations: Arc<Mutex<Vec<String>>>,
}

impl Applier for App {
    fn apply(&mut self, index: LogIndex, ops: &[Bytes]) -> Result<(), ApplyError> {
        let mut s = self.state.lock().unwrap();
        let last = s.applied.keys().next_back().copied();
        if last.is_some_and(|l| index <= l) {
            s.replays += 1;
            match s.applied.get(&index) {
                Some(had) if had.as_slice() == ops => {}
                had => self.violations.lock().unwrap().push(format!(
                    "apply contract: node {} was handed index {index} again (applied up to {last:?}) \
                     with {} instead of what it applied there, {}",
                    self.node,
                    show(ops),
                    had.map_or("nothing".to_string(), |h| show(h)),
                )),
            }
            return Ok(());
        }
        s.applied.insert(index, ops.to_vec());
        Ok(())
    }

    fn snapshot(&mut self) -> Result<Vec<u8>, ApplyError> {
        let s = self.state.lock().unwrap();
        let mut out = Vec::new();
        for (i, ops) in &s.applied {
            out.extend_from_slice(&i.to_be_bytes());
            out.extend_from_slice(&(ops.len() as u32).to_be_bytes());
            for op in ops {
                out.extend_from_slice(&(op.len() as u32).to_be_bytes());
                out.extend_from_slice(op);
            }
        }
        Ok(out)
    }

    fn install_snapshot(&mut self, _index: LogIndex, mut data: &[u8]) -> Result<(), ApplyError> {
        let bad = || ApplyError("truncated snapshot".into());
        let mut take = |n: usize| -> Result<Vec<u8>, ApplyError> {
            if data.len() < n {
                return Err(bad());
            }
            let (a, b) = data.split_at(n);
            data = b;
            Ok(a.to_vec())
        };
        let mut v = BTreeMap::new();
        while let Ok(i) = take(8) {
            let i = u64::from_be_bytes(i.try_into().map_err(|_| bad())?);
            let n = u32::from_be_bytes(take(4)?.try_into().map_err(|_| bad())?);
            let mut ops = Vec::new();
            for _ in 0..n {
                let len = u32::from_be_bytes(take(4)?.try_into().map_err(|_| bad())?);
                ops.push(Bytes::from(take(len as usize)?));
            }
            v.insert(i, ops);
        }
        let mut s = self.state.lock().unwrap();
        s.applied = v;
        s.snapshots_installed += 1;
        Ok(())
    }

    /// This state outlives restarts by itself (it stands for state kept with its own
    /// applied point): nothing to make durable.
    fn persist(&mut self) -> Result<(), ApplyError> {
        Ok(())
    }
}

pub fn show(ops: &[Bytes]) -> String {
    let parts: Vec<String> = ops
        .iter()
        .map(|o| String::from_utf8_lossy(o).into_owned())
        .collect();
    format!("[{}]", parts.join(","))
}
