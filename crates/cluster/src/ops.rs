//! The operations a replicated disk records: every change the leader's broker makes to its
//! store's files, relative to the store's root, in the order it made them. A Raft entry
//! carries a batch of them; every node applies them to its replica in the same order.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// A file path relative to a store root: `/`-separated components, none empty, `.` or `..`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub(crate) struct RelPath(String);

impl RelPath {
    /// `path` under `root`, or `None` if it is not strictly below it or not plain UTF-8.
    pub(crate) fn under(root: &std::path::Path, path: &std::path::Path) -> Option<RelPath> {
        let rel = path.strip_prefix(root).ok()?;
        let mut parts = Vec::new();
        for c in rel.components() {
            match c {
                std::path::Component::Normal(s) => parts.push(s.to_str()?),
                _ => return None,
            }
        }
        if parts.is_empty() {
            return None;
        }
        Some(RelPath(parts.join("/")))
    }

    /// The path under `root`, checked again: a peer's entry naming `..` or an absolute path
    /// is refused rather than followed outside the replica.
    pub(crate) fn join(&self, root: &std::path::Path) -> Option<std::path::PathBuf> {
        let mut out = root.to_path_buf();
        for part in self.0.split('/') {
            if part.is_empty() || part == "." || part == ".." || part.contains('\0') {
                return None;
            }
            out.push(part);
        }
        Some(out)
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

/// One change to the files of a store.
///
/// Every operation, applied again over files that already hold its effect and whatever
/// followed it, converges once the operations after it are applied again too (a crash
/// between applying a batch and recording the applied point replays it). So there is no
/// rename or hard link here: their result depends on the source, which a later operation
/// may have changed; the disk records them as a copy (a create, the writes, the length) and
/// a remove of the source (see `disk::Inner::copy_ops`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Op {
    /// A file opened with `create_new`: exists and is empty.
    Create(RelPath),
    /// `data` written at `offset` (consecutive writes to one file are merged).
    Write {
        path: RelPath,
        offset: u64,
        data: Bytes,
    },
    /// A whole file written (the store's rebuildable index files).
    WriteFile {
        path: RelPath,
        data: Bytes,
    },
    SetLen {
        path: RelPath,
        len: u64,
    },
    /// Made at least `len` long (`fallocate`).
    Allocate {
        path: RelPath,
        len: u64,
    },
    Remove(RelPath),
    CreateDir(RelPath),
    /// Changes nothing. A node that starts leading proposes one and waits for it to be
    /// applied: every entry before it in the log (a dead engine's tail included) is then in
    /// the replica it copies.
    Barrier,
}

impl Op {
    /// Bytes the operation holds in memory, for the pending limit.
    pub(crate) fn size_bytes(&self) -> usize {
        const FIXED: usize = 64;
        FIXED
            + match self {
                Op::Write { data, .. } | Op::WriteFile { data, .. } => data.len(),
                _ => 0,
            }
    }

    pub(crate) fn encode(&self) -> Result<Bytes, postcard::Error> {
        postcard::to_allocvec(self).map(Bytes::from)
    }

    /// Decodes what [`Op::encode`] wrote; trailing bytes are an error.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Op, postcard::Error> {
        let (op, rest) = postcard::take_from_bytes(bytes)?;
        if !rest.is_empty() {
            return Err(postcard::Error::DeserializeBadEncoding);
        }
        Ok(op)
    }
}

/// Reads a file of `len` bytes in chunks of `chunk_bytes` with `read` (buffer, offset) and
/// hands `each` (offset, bytes) every chunk that is not all zeros: the one rule by which
/// preallocated block space is left out of snapshots, working copies and replicated copies
/// (a file's length, set apart, brings the zeros back as holes).
pub(crate) fn for_each_nonzero_chunk(
    len: u64,
    chunk_bytes: usize,
    mut read: impl FnMut(&mut [u8], u64) -> std::io::Result<()>,
    mut each: impl FnMut(u64, &[u8]) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; chunk_bytes];
    let mut at = 0u64;
    while at < len {
        let n = usize::try_from((len - at).min(chunk_bytes as u64)).unwrap_or(chunk_bytes);
        read(&mut buf[..n], at)?;
        if buf[..n].iter().any(|&b| b != 0) {
            each(at, &buf[..n])?;
        }
        at += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn paths_stay_under_their_root() {
        let root = Path::new("/data/live");
        let p = RelPath::under(root, Path::new("/data/live/streams/s1/0001.blk")).unwrap();
        assert_eq!(p.as_str(), "streams/s1/0001.blk");
        assert_eq!(
            p.join(Path::new("/r")).unwrap(),
            Path::new("/r/streams/s1/0001.blk")
        );
        assert!(RelPath::under(root, Path::new("/data/other/x")).is_none());
        assert!(RelPath::under(root, root).is_none());
        // A hostile entry cannot climb out of the replica.
        for bad in ["../x", "a/../../x", "", "a//b", "/etc/passwd"] {
            assert!(RelPath(bad.into()).join(Path::new("/r")).is_none(), "{bad}");
        }
    }

    #[test]
    fn operations_round_trip_and_refuse_trailing_bytes() {
        let op = Op::Write {
            path: RelPath("a/b".into()),
            offset: 7,
            data: Bytes::from_static(b"xyz"),
        };
        let mut bytes = op.encode().unwrap().to_vec();
        assert_eq!(Op::decode(&bytes).unwrap(), op);
        bytes.push(0);
        assert!(Op::decode(&bytes).is_err());
    }
}
