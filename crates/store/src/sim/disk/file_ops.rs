//! The simulated disk's calls on an open file (`SimFile`, through [`super::SimVfs`]): write,
//! read, sync, length, truncate, reserve, each with its latency, hold and fault decision.

use super::*;

impl SimDisk {
    pub(super) fn file_write(&self, f: &SimFile, buf: &[u8], off: u64) -> io::Result<()> {
        self.latency();
        let st = self.lock();
        st.check_boot(f.boot)?;
        let mut st = self.hold(st, &f.path, buf, f.boot)?;
        let off = usize::try_from(off).map_err(|_| eio("offset"))?;
        let d = st.decide(OpKind::Write, &f.path);
        if !matches!(d, Decision::Ok) {
            st.partial_write(f.ino, off, buf, &f.path);
            return Err(self.fault(&mut st, &d, OpKind::Write, &f.path));
        }
        st.stats.writes += 1;
        st.write(f.ino, off, buf);
        st.trace_at(
            OpKind::Write as u64,
            &f.path,
            &[off as u64, buf.len() as u64],
        );
        Ok(())
    }

    pub(super) fn file_read(&self, f: &SimFile, buf: &mut [u8], off: u64) -> io::Result<()> {
        let st = self.lock();
        st.check_boot(f.boot)?;
        let data = &st.inodes.get(&f.ino).ok_or_else(dead)?.cache;
        let off = usize::try_from(off).map_err(|_| eio("offset"))?;
        match data.get(off..off + buf.len()) {
            Some(s) => {
                buf.copy_from_slice(s);
                Ok(())
            }
            None => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end of the file",
            )),
        }
    }

    pub(super) fn file_sync(&self, f: &SimFile) -> io::Result<()> {
        self.latency();
        let mut st = self.lock();
        st.check_boot(f.boot)?;
        let d = st.decide(OpKind::Sync, &f.path);
        if !matches!(d, Decision::Ok) {
            st.sync_inode(f.ino, &f.path, false);
            return Err(self.fault(&mut st, &d, OpKind::Sync, &f.path));
        }
        st.stats.syncs += 1;
        st.sync_inode(f.ino, &f.path, true);
        st.trace_at(OpKind::Sync as u64, &f.path, &[]);
        Ok(())
    }

    pub(super) fn file_len(&self, f: &SimFile) -> io::Result<u64> {
        let st = self.lock();
        st.check_boot(f.boot)?;
        Ok(st.inodes.get(&f.ino).ok_or_else(dead)?.cache.len() as u64)
    }

    pub(super) fn file_set_len(&self, f: &SimFile, len: u64) -> io::Result<()> {
        self.resize(f, len, OpKind::SetLen, Inode::set_len)
    }

    pub(super) fn file_allocate(&self, f: &SimFile, len: u64) -> io::Result<()> {
        self.resize(f, len, OpKind::Allocate, Inode::allocate)
    }

    /// A length change of an open file (`set_len`, `allocate`): faults decided and traced as
    /// `kind`, applied to the inode by `apply(inode, len, page size)`.
    fn resize(
        &self,
        f: &SimFile,
        len: u64,
        kind: OpKind,
        apply: fn(&mut Inode, usize, usize),
    ) -> io::Result<()> {
        self.latency();
        let mut st = self.lock();
        st.check_boot(f.boot)?;
        let d = st.decide(kind, &f.path);
        if !matches!(d, Decision::Ok) {
            return Err(self.fault(&mut st, &d, kind, &f.path));
        }
        let ps = st.cfg.page_size;
        let len = usize::try_from(len).map_err(|_| eio("length"))?;
        if let Some(i) = st.inodes.get_mut(&f.ino) {
            apply(i, len, ps);
        }
        st.trace_at(kind as u64, &f.path, &[len as u64]);
        Ok(())
    }
}
