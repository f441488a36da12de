//! What the store serves, checked against the model.

use super::*;

impl Sim {
    pub(crate) fn read_all(&self, i: usize) -> R<Vec<Record>> {
        let h = self.h(i)?;
        let mut out = Vec::new();
        let mut from = 0;
        loop {
            let b = h
                .read_from(from, &FilterSet::all(), 256, 1 << 20)
                .map_err(|e| format!("{}: read_from({from}): {e}", self.models[i].name))?;
            out.extend(b.records);
            if b.next_seq <= from {
                break;
            }
            from = b.next_seq;
        }
        Ok(out)
    }

    /// Checks what stream `i` serves against the model. `recovered`: right after an open,
    /// when records that are gone for good are dropped from the model.
    pub(crate) fn check(&mut self, i: usize, served: &[Record], recovered: Option<After>) -> R {
        let name = self.models[i].name.clone();
        let h = self.h(i)?.clone();
        let m = &self.models[i];
        let mut prev = 0;
        let mut by_seq = BTreeMap::new();
        for r in served {
            if r.seq <= prev {
                fail!("{name}: served {} after {prev}: out of order", r.seq);
            }
            prev = r.seq;
            let Some(want) = m.recs.get(&r.seq) else {
                fail!(
                    "{name}: served seq {} which was never appended (or was rejected)",
                    r.seq
                );
            };
            if r.topic != TOPICS[want.topic].as_bytes()
                || r.payload != want.payload
                || r.time_ns != want.time
                || !r.properties.is_empty()
            {
                fail!(
                    "{name}: seq {} served with different content (topic {:?}, {} bytes, time {}; want {:?}, {} bytes, time {})",
                    r.seq,
                    String::from_utf8_lossy(&r.topic),
                    r.payload.len(),
                    r.time_ns,
                    TOPICS[want.topic],
                    want.payload.len(),
                    want.time
                );
            }
            if want.removal == Removal::Acked {
                fail!(
                    "{name}: seq {} served after its removal was acknowledged",
                    r.seq
                );
            }
            by_seq.insert(r.seq, r);
        }
        // The disk never rots: a damaged block could only come from the store's own writes.
        let quarantined = &h.info().quarantined;
        if !quarantined.is_empty() {
            fail!(
                "{name}: blocks quarantined under sync {}: {quarantined:?}",
                policy_name(m.cfg.sync)
            );
        }
        for (&s, r) in &m.recs {
            let present = by_seq.contains_key(&s);
            if r.durable && r.removal == Removal::None && !present {
                fail!(
                    "{name}: seq {s} lost: it was durable (acknowledged, flushed or served) and never removed"
                );
            }
            if !present && r.removal == Removal::None && !r.maybe_rejected && s < prev {
                fail!("{name}: seq {s} missing while the later {prev} is served (a hole)");
            }
            if present && r.batch.0 != r.batch.1 {
                for b in r.batch.0..=r.batch.1 {
                    let whole = by_seq.contains_key(&b)
                        || m.recs.get(&b).is_none_or(|x| x.removal != Removal::None);
                    if !whole {
                        fail!(
                            "{name}: batch {}..={} served in part ({s} without {b})",
                            r.batch.0,
                            r.batch.1
                        );
                    }
                }
            }
        }
        for &s in by_seq.keys().take(3).chain(by_seq.keys().rev().take(3)) {
            let got = h.get(s).map_err(|e| format!("{name}: get({s}): {e}"))?;
            if got.as_ref().map(|r| &r.payload) != by_seq.get(&s).map(|r| &r.payload) {
                fail!("{name}: get({s}) disagrees with read_from");
            }
        }
        let next = h.next_seq();
        if let Some(after) = recovered {
            if next <= m.floor || next <= prev {
                fail!(
                    "{name}: next sequence {next} after recovery reuses one (floor {}, newest served {prev})",
                    m.floor
                );
            }
            self.sum.durable_checked += m.recs.values().filter(|r| r.durable).count() as u64;
            let durable_now = after == After::PowerLoss || m.syncs();
            let m = &mut self.models[i];
            let old = std::mem::take(&mut m.recs);
            for (s, mut r) in old {
                if by_seq.contains_key(&s) {
                    r.durable |= durable_now;
                    r.removal = Removal::None;
                    r.maybe_rejected = false;
                    m.floor = m.floor.max(if durable_now { s } else { 0 });
                    m.recs.insert(s, r);
                } else if r.removal != Removal::None && s < next {
                    // Its removal may not be durable yet: it may come back.
                    m.recs.insert(s, r);
                }
            }
            if let Some(t) = served.last() {
                m.time = m.time.max(t.time_ns);
            }
        } else if m.syncs() {
            // Readers see only durable records.
            let m = &mut self.models[i];
            for s in by_seq.keys() {
                if let Some(r) = m.recs.get_mut(s) {
                    r.durable = true;
                }
                m.floor = m.floor.max(*s);
            }
        }
        Ok(())
    }

    pub(crate) fn check_live(&mut self, i: usize) -> R {
        self.drain(i)?;
        let served = self.read_all(i)?;
        self.check(i, &served, None)?;
        // A filtered read is the full read, filtered.
        let f = *self.rng.pick(&FILTERS);
        let h = self.h(i)?.clone();
        let got: Vec<u64> = h
            .read_from(0, &FilterSet::new([f]), 100_000, usize::MAX)
            .map_err(|e| format!("read_from filter {f}: {e}"))?
            .records
            .iter()
            .map(|r| r.seq)
            .collect();
        let want: Vec<u64> = served
            .iter()
            .filter(|r| topic_matches(f.as_bytes(), &r.topic))
            .map(|r| r.seq)
            .collect();
        if got != want {
            fail!(
                "{}: filter {f}: served {got:?}, want {want:?}",
                self.models[i].name
            );
        }
        Ok(())
    }

    // ---- crashes, failures, recovery ----
}
