//! Crashes, power losses, reopens and recovery; the steps of a run and its report.

use super::*;

impl Sim {
    /// Drops every handle (writers stop; on a dead boot their I/O fails) and settles tickets.
    pub(crate) fn shutdown(&mut self) {
        for i in 0..self.handles.len() {
            // The writer's own removals of the last turns (in memory: works on a dead disk).
            let _ = self.drain(i);
            drop(self.handles[i].take());
        }
        for m in &mut self.models {
            m.poll_pending();
            m.pending.clear();
        }
        self.store = None;
    }

    pub(crate) fn open_stream(&mut self, i: usize) -> R {
        let store = self.store.as_ref().ok_or("no store")?;
        let m = &self.models[i];
        let h = store
            .stream(&m.name, m.cfg.clone())
            .map_err(|e| format!("open {}: {e}", m.name))?;
        // Wait for the writer's first turn, so what follows finds it idle.
        h.flush()
            .map_err(|e| format!("first flush of {}: {e}", m.name))?;
        self.handles[i] = Some(h);
        Ok(())
    }

    pub(crate) fn try_open_all(&mut self) -> R {
        let store = Store::open_with_vfs(&self.root, self.disk.vfs())
            .map_err(|e| format!("open store: {e}"))?;
        self.store = Some(store);
        for i in 0..self.models.len() {
            self.open_stream(i)?;
        }
        Ok(())
    }

    /// Opens everything again, retrying while I/O errors or power losses strike the
    /// recovery itself, then checks what every stream serves.
    pub(crate) fn recover(&mut self, mut after: After) -> R {
        self.sum.recoveries += 1;
        let mut attempt = 0;
        let saved = self.disk.config();
        let observed = loop {
            attempt += 1;
            let pl = self.disk.power_losses();
            let res = self.try_open_all().and_then(|()| {
                (0..self.models.len())
                    .map(|i| self.read_all(i))
                    .collect::<R<Vec<_>>>()
            });
            if self.disk.power_losses() != pl {
                after = After::PowerLoss;
            }
            match res {
                Ok(obs) if self.disk.power_losses() == pl => break obs,
                Ok(_) => self.note("    recovery: power lost while reading".into()),
                // Only an injected fault may stop a recovery.
                Err(e) if self.disk.power_losses() == pl && !e.contains("EIO (simulated)") => {
                    fail!("recovery failed without an injected fault: {e}")
                }
                Err(e) => self.note(format!("    recovery attempt {attempt}: {e}")),
            }
            self.shutdown();
            if attempt == 8 {
                // Give the store a disk that lets it recover.
                self.note("    recovery: faults off".into());
                self.disk.update_config(|c| {
                    c.write_error = 0.0;
                    c.sync_error = 0.0;
                    c.dir_sync_error = 0.0;
                    c.power_loss = 0.0;
                });
            }
            if attempt > 12 {
                fail!("recovery keeps failing");
            }
        };
        self.disk.update_config(|c| *c = saved);
        self.pl_seen = self.disk.power_losses();
        for (i, served) in observed.iter().enumerate() {
            let r = self.h(i)?.recovery_report().clone();
            self.note(format!(
                "    {}: recovered {} records, next {}, cut {} bytes, lost {:?}, quarantined {}",
                self.models[i].name,
                served.len(),
                self.h(i)?.next_seq(),
                r.truncated_bytes,
                r.lost,
                r.quarantined.len()
            ));
            self.check(i, served, Some(after))?;
        }
        Ok(())
    }

    pub(crate) fn power_loss(&mut self) -> R {
        self.disk.power_loss();
        self.shutdown();
        self.recover(After::PowerLoss)
    }

    pub(crate) fn process_crash(&mut self) -> R {
        self.disk.crash();
        self.shutdown();
        self.recover(After::Reopen)
    }

    /// Closes and reopens one stream (its writer syncs on the way out).
    pub(crate) fn reopen(&mut self, i: usize) -> R {
        self.drain(i)?;
        drop(self.handles[i].take());
        self.models[i].poll_pending();
        self.models[i].pending.clear();
        let pl = self.disk.power_losses();
        let res = self.open_stream(i);
        if self.disk.power_losses() != pl {
            return Ok(()); // The caller notices the power loss.
        }
        match res {
            Ok(()) => {
                let served = self.read_all(i)?;
                self.check(i, &served, Some(After::Reopen))
            }
            Err(e) => {
                // An injected error during recovery: start over with everything.
                self.note(format!("    reopen failed: {e}"));
                self.shutdown();
                self.recover(After::Reopen)
            }
        }
    }

    /// After every step: a power loss inside a call means recovery; a stream that failed
    /// must refuse writes, and is reopened.
    pub(crate) fn after_step(&mut self) -> R {
        if self.crashed() {
            self.note("    power lost inside a call".into());
            self.shutdown();
            return self.recover(After::PowerLoss);
        }
        for i in 0..self.models.len() {
            self.models[i].poll_pending();
            let h = self.h(i)?.clone();
            if !h.info().failed {
                self.drain(i)?;
                continue;
            }
            self.sum.failures_seen += 1;
            self.note(format!(
                "    {} failed: {:?}",
                self.models[i].name,
                h.append(b"x", b"", b"y").err()
            ));
            match h.append(b"x", b"", b"y") {
                Err(StoreError::Failed { .. }) => {}
                other => fail!(
                    "{}: a failed stream accepted a write: {other:?}",
                    self.models[i].name
                ),
            }
            match h.remove_below(1) {
                Err(StoreError::Failed { .. }) => {}
                other => fail!(
                    "{}: a failed stream accepted a removal: {other:?}",
                    self.models[i].name
                ),
            }
            drop(h);
            self.reopen(i)?;
            if self.crashed() {
                return self.after_step();
            }
        }
        Ok(())
    }

    pub(crate) fn step(&mut self, n: usize) -> R {
        let i = self.rng.below(self.models.len() as u64) as usize;
        let k = self.rng.below(100);
        let name = self.models[i].name.clone();
        let what = match k {
            0..30 => "append",
            30..40 => "batch",
            40..52 => "burst",
            52..58 => "flush",
            58..68 => "check",
            68..76 => "removal",
            76..82 => "compact/seal",
            82..85 => "reopen",
            85..88 => "process crash",
            88..92 => "power loss",
            _ => "append",
        };
        self.note(format!("{n}: {what} {name}"));
        match what {
            "append" => self.append(i, false)?,
            "batch" => self.append(i, true)?,
            "burst" => self.burst(i)?,
            "flush" => self.flush(i)?,
            "check" => self.check_live(i)?,
            "removal" => self.removal(i)?,
            "compact/seal" => self.housekeeping(i)?,
            "reopen" => self.reopen(i)?,
            "process crash" if self.opts.crashes == Crashes::PowerLoss => self.process_crash()?,
            "process crash" | "power loss" if self.opts.crashes == Crashes::ProcessOnly => {
                self.process_crash()?
            }
            _ => self.power_loss()?,
        }
        self.after_step()
    }

    pub(crate) fn run(&mut self) -> R {
        self.recover(After::PowerLoss)?;
        for n in 0..self.opts.steps {
            self.step(n)?;
            self.sum.steps = n + 1;
        }
        // The end: one more crash, then the disk behaves, and every stream takes an append.
        match self.opts.crashes {
            Crashes::PowerLoss => self.power_loss()?,
            Crashes::ProcessOnly => self.process_crash()?,
        }
        self.disk.update_config(|c| {
            c.write_error = 0.0;
            c.sync_error = 0.0;
            c.dir_sync_error = 0.0;
            c.power_loss = 0.0;
        });
        for i in 0..self.models.len() {
            self.append(i, false)?;
            self.flush(i)?;
            self.check_live(i)?;
        }
        self.shutdown();
        self.sum.power_losses = self.disk.stats().power_losses;
        self.sum.digest = self.disk.trace_digest();
        Ok(())
    }

    pub(crate) fn report(&self, err: &str) -> String {
        let mut s = format!(
            "seed {} FAILED: {err}\nreplay: TERN_SIM_SEED={} cargo test -p tern-store --test power_loss -- --nocapture\n",
            self.seed, self.seed
        );
        s.push_str("--- setup and last steps ---\n");
        s.push_str(&self.log[0]);
        s.push('\n');
        for l in self
            .log
            .iter()
            .skip(1)
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            s.push_str(l);
            s.push('\n');
        }
        s.push_str("--- last disk events ---\n");
        for e in self.disk.events().iter().rev().take(25).rev() {
            s.push_str(e);
            s.push('\n');
        }
        s
    }
}
