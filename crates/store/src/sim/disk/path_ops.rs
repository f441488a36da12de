//! The simulated disk's calls by path (through [`super::SimVfs`]): opening, whole-file reads
//! and writes, removal, rename, directories and their sync, each with its latency and fault
//! decision.

use super::*;

impl SimDisk {
    pub(super) fn open_rw(
        &self,
        boot: u64,
        path: &Path,
        create_new: bool,
    ) -> io::Result<Arc<dyn VFile>> {
        self.latency();
        let mut st = self.lock();
        st.check_boot(boot)?;
        st.under_root(path)?;
        let ino = match st.node(path) {
            Some(Node::File(_)) if create_new => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists", path.display()),
                ));
            }
            Some(Node::File(i)) => i,
            Some(Node::Dir) => return Err(io::Error::other("is a directory")),
            None if !create_new || !st.parent_is_dir(path) => return Err(not_found(path)),
            None => {
                let d = st.decide(OpKind::Create, path);
                if !matches!(d, Decision::Ok) {
                    return Err(self.fault(&mut st, &d, OpKind::Create, path));
                }
                st.trace_at(OpKind::Create as u64, path, &[]);
                st.create_file(path)
            }
        };
        Ok(Arc::new(SimFile {
            disk: self.clone(),
            ino,
            path: path.to_path_buf(),
            boot,
        }))
    }

    pub(super) fn read_file(&self, boot: u64, path: &Path) -> io::Result<Vec<u8>> {
        let st = self.lock();
        st.check_boot(boot)?;
        match st.node(path) {
            Some(Node::File(i)) => Ok(st.inodes.get(&i).ok_or_else(dead)?.cache.clone()),
            Some(Node::Dir) => Err(io::Error::other("is a directory")),
            None => Err(not_found(path)),
        }
    }

    pub(super) fn write_file(&self, boot: u64, path: &Path, data: &[u8]) -> io::Result<()> {
        self.latency();
        let mut st = self.lock();
        st.check_boot(boot)?;
        st.under_root(path)?;
        let ino = match st.node(path) {
            Some(Node::File(i)) => {
                let ps = st.cfg.page_size;
                if let Some(f) = st.inodes.get_mut(&i) {
                    f.set_len(0, ps);
                }
                i
            }
            Some(Node::Dir) => return Err(io::Error::other("is a directory")),
            None if !st.parent_is_dir(path) => return Err(not_found(path)),
            None => st.create_file(path),
        };
        let d = st.decide(OpKind::Write, path);
        if !matches!(d, Decision::Ok) {
            st.partial_write(ino, 0, data, path);
            return Err(self.fault(&mut st, &d, OpKind::Write, path));
        }
        st.stats.writes += 1;
        st.write(ino, 0, data);
        st.trace_at(0xf11e, path, &[data.len() as u64]);
        Ok(())
    }

    pub(super) fn remove_file(&self, boot: u64, path: &Path) -> io::Result<()> {
        self.latency();
        let mut st = self.lock();
        st.check_boot(boot)?;
        match st.node(path) {
            Some(Node::File(_)) => {}
            Some(Node::Dir) => return Err(io::Error::other("is a directory")),
            None => return Err(not_found(path)),
        }
        let d = st.decide(OpKind::Remove, path);
        if !matches!(d, Decision::Ok) {
            return Err(self.fault(&mut st, &d, OpKind::Remove, path));
        }
        st.cache_ns.remove(path);
        let dir = path.parent().unwrap_or(path).to_path_buf();
        st.push_ns(&dir, vec![(path.to_path_buf(), None)]);
        if !st.untraced(path) {
            st.trace_at(OpKind::Remove as u64, path, &[]);
        }
        Ok(())
    }

    pub(super) fn rename(&self, boot: u64, from: &Path, to: &Path) -> io::Result<()> {
        self.latency();
        let mut st = self.lock();
        st.check_boot(boot)?;
        st.under_root(to)?;
        let node = match st.node(from) {
            Some(Node::File(i)) => Node::File(i),
            Some(Node::Dir) => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "the simulated disk does not rename directories",
                ));
            }
            None => return Err(not_found(from)),
        };
        if st.node(to) == Some(Node::Dir) {
            return Err(io::Error::other("target is a directory"));
        }
        if !st.parent_is_dir(to) {
            return Err(not_found(to));
        }
        let d = st.decide(OpKind::Rename, from);
        if !matches!(d, Decision::Ok) {
            return Err(self.fault(&mut st, &d, OpKind::Rename, from));
        }
        st.cache_ns.remove(from);
        st.cache_ns.insert(to.to_path_buf(), node);
        let (fd, td) = (
            from.parent().unwrap_or(from).to_path_buf(),
            to.parent().unwrap_or(to).to_path_buf(),
        );
        if fd == td {
            st.push_ns(
                &fd,
                vec![(from.to_path_buf(), None), (to.to_path_buf(), Some(node))],
            );
        } else {
            st.push_ns(&fd, vec![(from.to_path_buf(), None)]);
            st.push_ns(&td, vec![(to.to_path_buf(), Some(node))]);
        }
        let to_key = st.key(to);
        st.trace_at(OpKind::Rename as u64, from, &[to_key]);
        Ok(())
    }

    pub(super) fn create_dir_all(&self, boot: u64, dir: &Path) -> io::Result<()> {
        self.latency();
        let mut st = self.lock();
        st.check_boot(boot)?;
        st.under_root(dir)?;
        let rel = dir.strip_prefix(&st.root).unwrap_or(dir).to_path_buf();
        let mut cur = st.root.clone();
        for c in rel.components() {
            let parent = cur.clone();
            cur.push(c);
            match st.node(&cur) {
                Some(Node::Dir) => continue,
                Some(Node::File(_)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("{} is a file", cur.display()),
                    ));
                }
                None => {}
            }
            let d = st.decide(OpKind::CreateDir, &cur);
            if !matches!(d, Decision::Ok) {
                return Err(self.fault(&mut st, &d, OpKind::CreateDir, &cur));
            }
            st.cache_ns.insert(cur.clone(), Node::Dir);
            st.push_ns(&parent, vec![(cur.clone(), Some(Node::Dir))]);
            st.trace_at(OpKind::CreateDir as u64, &cur, &[]);
        }
        Ok(())
    }

    pub(super) fn sync_dir(&self, boot: u64, dir: &Path) -> io::Result<()> {
        self.latency();
        let mut st = self.lock();
        st.check_boot(boot)?;
        if st.root.starts_with(dir) && st.root != dir {
            // Above the mount point: durable by definition.
            return Ok(());
        }
        if st.node(dir) != Some(Node::Dir) {
            return Err(not_found(dir));
        }
        let d = st.decide(OpKind::SyncDir, dir);
        if !matches!(d, Decision::Ok) {
            return Err(self.fault(&mut st, &d, OpKind::SyncDir, dir));
        }
        st.stats.dir_syncs += 1;
        st.sync_dir(dir);
        st.trace_at(OpKind::SyncDir as u64, dir, &[]);
        Ok(())
    }

    pub(super) fn list_dir(&self, boot: u64, dir: &Path) -> io::Result<Vec<String>> {
        let st = self.lock();
        st.check_boot(boot)?;
        if st.node(dir) != Some(Node::Dir) {
            return Err(not_found(dir));
        }
        Ok(st
            .cache_ns
            .range(dir.to_path_buf()..)
            .skip(1)
            .take_while(|(p, _)| p.starts_with(dir))
            .filter(|(p, _)| p.parent() == Some(dir))
            .filter_map(|(p, _)| p.file_name()?.to_str().map(str::to_string))
            .collect())
    }
}
