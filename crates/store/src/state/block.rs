//! One block of a stream in memory: its file, per-record entries (dropped while a sealed block
//! is clean), per-topic live counts, delete markers it holds, and cached first/last
//! sequence and time.

use super::*;

pub(crate) struct Block {
    pub base_seq: u64,
    pub path: PathBuf,
    pub file: Arc<dyn VFile>,
    /// Bytes readers may read: the end of the records, not the file's length.
    pub len: u64,
    /// The length the file was reserved to (the active block's preallocated zeros past
    /// `len`); 0 for sealed blocks, cut to their records, and where reserving failed.
    pub reserved_bytes: u64,
    pub sealed: bool,
    pub topics: Vec<Bytes>,
    pub topic_ids: HashMap<Bytes, u32>,
    pub topic_live: Vec<u64>,
    /// Per-record entries; empty while `loaded` is false.
    pub entries: Vec<Entry>,
    /// False when the entries of a clean sealed block were dropped to bound memory;
    /// `State::load` brings them back from the index file (or the block itself).
    pub loaded: bool,
    pub n_entries: usize,
    /// Entries flagged as keyed-state tombstones (deleted or not).
    pub tombstones: usize,
    pub(super) first_seq_c: Option<u64>,
    pub(super) last_seq_c: Option<u64>,
    pub(super) last_time_c: Option<u64>,
    pub(super) last_use: u64,
    /// Delete ranges whose markers are stored in this block.
    pub markers: Vec<(u64, u64)>,
    pub live: u64,
    pub live_bytes: u64,
    /// Every entry before this index is deleted.
    pub(super) first_live_hint: usize,
}

impl Block {
    pub fn new(base_seq: u64, path: PathBuf, file: Arc<dyn VFile>, len: u64) -> Self {
        Block {
            base_seq,
            path,
            file,
            len,
            reserved_bytes: 0,
            sealed: false,
            topics: Vec::new(),
            topic_ids: HashMap::new(),
            topic_live: Vec::new(),
            entries: Vec::new(),
            loaded: true,
            n_entries: 0,
            tombstones: 0,
            first_seq_c: None,
            last_seq_c: None,
            last_time_c: None,
            last_use: 0,
            markers: Vec::new(),
            live: 0,
            live_bytes: 0,
            first_live_hint: 0,
        }
    }

    pub fn from_index(base_seq: u64, path: PathBuf, file: Arc<dyn VFile>, ix: IndexData) -> Self {
        let mut b = Block::new(base_seq, path, file, ix.block_len);
        b.topic_live = vec![0; ix.topics.len()];
        for (i, t) in ix.topics.iter().enumerate() {
            b.topic_ids.insert(t.clone(), i as u32);
        }
        b.topics = ix.topics;
        for e in &ix.entries {
            b.topic_live[e.topic as usize] += 1;
            b.live_bytes += e.len as u64;
        }
        b.live = ix.entries.len() as u64;
        b.n_entries = ix.entries.len();
        b.tombstones = ix
            .entries
            .iter()
            .filter(|e| e.flags & u32::from(FLAG_TOMBSTONE) != 0)
            .count();
        b.first_seq_c = ix.entries.first().map(|e| e.seq);
        b.last_seq_c = ix.entries.last().map(|e| e.seq);
        b.last_time_c = ix.entries.last().map(|e| e.time_ns);
        b.entries = ix.entries;
        b.markers = ix.deletes;
        b
    }

    pub fn index_path(&self) -> PathBuf {
        self.path.with_extension("idx")
    }

    pub fn topic_id(&mut self, topic: &[u8]) -> u32 {
        if let Some(&id) = self.topic_ids.get(topic) {
            return id;
        }
        let id = self.topics.len() as u32;
        let t = Bytes::copy_from_slice(topic);
        self.topics.push(t.clone());
        self.topic_ids.insert(t, id);
        self.topic_live.push(0);
        id
    }

    /// Adds a live entry (its topic id must come from `topic_id`).
    pub fn push(&mut self, e: Entry) {
        self.topic_live[e.topic as usize] += 1;
        self.live += 1;
        self.live_bytes += e.len as u64;
        self.n_entries += 1;
        if e.flags & u32::from(FLAG_TOMBSTONE) != 0 {
            self.tombstones += 1;
        }
        self.first_seq_c.get_or_insert(e.seq);
        self.last_seq_c = Some(e.seq);
        self.last_time_c = Some(e.time_ns);
        self.entries.push(e);
    }

    pub fn find(&self, seq: u64) -> Option<usize> {
        self.entries.binary_search_by_key(&seq, |e| e.seq).ok()
    }

    pub fn first_live(&mut self) -> Option<usize> {
        while self.first_live_hint < self.entries.len() {
            if self.entries[self.first_live_hint].flags & ENTRY_DELETED == 0 {
                return Some(self.first_live_hint);
            }
            self.first_live_hint += 1;
        }
        None
    }

    pub fn first_live_from(&self) -> usize {
        self.first_live_hint
    }

    pub fn last_seq(&self) -> Option<u64> {
        self.last_seq_c
    }

    pub fn first_seq(&self) -> Option<u64> {
        self.first_seq_c
    }

    /// Sequence and time of the block's newest record (deleted or not), as an entry.
    pub fn last_entry_summary(&self) -> Option<Entry> {
        Some(Entry {
            seq: self.last_seq_c?,
            time_ns: self.last_time_c?,
            offset: 0,
            len: 0,
            topic: 0,
            flags: 0,
        })
    }

    /// A clean sealed block can drop its entries: they are exactly its index file's.
    pub(super) fn evictable(&self) -> bool {
        self.sealed && self.loaded && self.live == self.n_entries as u64
    }

    /// Index content for this block as written (deletion flags are not part of it).
    pub fn index_data(&self) -> IndexData {
        IndexData {
            block_len: self.len,
            topics: self.topics.clone(),
            entries: self
                .entries
                .iter()
                .map(|e| Entry {
                    flags: e.flags & !ENTRY_DELETED,
                    ..*e
                })
                .collect(),
            deletes: self.markers.clone(),
        }
    }

    /// Per topic id: does the topic match and still have live records here?
    pub fn matching_topics(&self, filters: &FilterSet) -> Vec<bool> {
        self.topics
            .iter()
            .zip(&self.topic_live)
            .map(|(t, &n)| n > 0 && filters.matches(t))
            .collect()
    }
}
