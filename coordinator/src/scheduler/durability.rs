//! What the core makes durable: acknowledged positions taken out as a [`PositionWrite`],
//! written off the core's lock and handed back, or flushed in place; and a session's position
//! as the journal has it.

use super::*;

/// Acknowledged positions taken from the core by [`Coordinator::take_positions`], written to
/// the journal by [`PositionWrite::write`] without the core (a service runs it off its lock, so
/// a slow disk stalls no call), then handed back with [`Coordinator::positions_written`].
pub struct PositionWrite {
    pub(super) journal: Arc<Mutex<Journal>>,
    /// Rises with each write taken: a write that lands after a later one is skipped.
    pub(super) seq: u64,
    pub(super) positions: Vec<(PositionKey, u64)>,
    pub(super) pruned: Vec<PositionKey>,
    /// The core's count of prunes when it was taken (those before it are in `pruned` or done).
    pub(super) pruned_upto: u64,
    /// Retired jobs whose rows it deletes.
    pub(super) retired: Vec<u64>,
}

impl PositionWrite {
    /// Writes the positions durably, in one transaction; `Ok(false)` when a later write landed
    /// first (it held these or newer). Waits for a job registration or another write in
    /// flight to finish with the journal first.
    pub fn write(&self) -> CoordinatorResult<bool> {
        lock_journal(&self.journal).write_positions_numbered(
            self.seq,
            self.positions.iter().copied(),
            &self.pruned,
            &self.retired,
        )
    }
}

impl Coordinator {
    /// Writes the acknowledged positions changed since the last write, durably, here and now
    /// (see [`take_positions`](Self::take_positions) for a write outside the core).
    pub fn flush(&mut self) -> CoordinatorResult<()> {
        self.acks_since_flush = 0;
        let Some(journal) = &self.journal else {
            return Ok(());
        };
        if self.nothing_to_write() {
            return Ok(());
        }
        // Nothing moves while this write runs, so no copy is taken: what it wrote is forgotten
        // once it lands, and kept for the next write if it fails. It carries the latest number,
        // so a write taken before it and still on its way is skipped when it lands.
        self.position_writes += 1;
        let positions = self.dirty_positions.iter().map(|(key, at)| (*key, *at));
        lock_journal(journal).write_positions_numbered(
            self.position_writes,
            positions,
            &self.pruned_positions,
            &self.retired_jobs,
        )?;
        self.stats.journal_commits += 1;
        tracing::debug!(
            positions = self.dirty_positions.len(),
            pruned = self.pruned_positions.len(),
            "acknowledged positions journaled"
        );
        self.dirty_positions.clear();
        self.pruned_written += self.pruned_positions.len() as u64;
        self.pruned_positions.clear();
        self.retired_jobs.clear();
        Ok(())
    }

    /// Whether no position, prune or retired job waits to be written.
    pub(super) fn nothing_to_write(&self) -> bool {
        self.dirty_positions.is_empty()
            && self.pruned_positions.is_empty()
            && self.retired_jobs.is_empty()
    }

    /// The acknowledged positions changed (and dropped) since the last write that landed, to be
    /// written outside the core, so the core's other calls go on while the disk takes them; `None`
    /// without a journal or with nothing to write. The core keeps them until
    /// [`positions_written`](Self::positions_written) says a write of theirs landed: a write
    /// that fails, or is never made, loses nothing.
    pub fn take_positions(&mut self) -> Option<PositionWrite> {
        self.acks_since_flush = 0;
        let journal = self.journal.as_ref()?;
        if self.nothing_to_write() {
            return None;
        }
        self.position_writes += 1;
        Some(PositionWrite {
            journal: Arc::clone(journal),
            seq: self.position_writes,
            positions: self
                .dirty_positions
                .iter()
                .map(|(k, at)| (*k, *at))
                .collect(),
            pruned: self.pruned_positions.clone(),
            pruned_upto: self.pruned_written + self.pruned_positions.len() as u64,
            retired: self.retired_jobs.clone(),
        })
    }

    /// Takes back `write` after [`PositionWrite::write`] gave `outcome`: once landed, its
    /// positions that have not changed since are written, and its prunes done; otherwise
    /// everything stays for the next write. Returns the write's error.
    pub fn positions_written(
        &mut self,
        write: &PositionWrite,
        outcome: CoordinatorResult<bool>,
    ) -> CoordinatorResult<()> {
        if !outcome? {
            // A later write landed first, with these positions or newer ones.
            return Ok(());
        }
        self.stats.journal_commits += 1;
        let done = write.pruned_upto.saturating_sub(self.pruned_written);
        let done = usize::try_from(done).map_or(self.pruned_positions.len(), |done| {
            done.min(self.pruned_positions.len())
        });
        self.pruned_positions.drain(..done);
        self.pruned_written += done as u64;
        if !write.retired.is_empty() {
            let deleted: HashSet<u64> = write.retired.iter().copied().collect();
            self.retired_jobs.retain(|job| !deleted.contains(job));
        }
        // A key dropped after this write was taken, then opened again, is deleted by the next
        // write before its position is written again: that position stays to be written.
        let pruned_since: HashSet<PositionKey> = self.pruned_positions.iter().copied().collect();
        for (key, at) in &write.positions {
            // A position that moved since is written by a later write.
            if self.dirty_positions.get(key) == Some(at) && !pruned_since.contains(key) {
                self.dirty_positions.remove(key);
            }
        }
        tracing::debug!(
            positions = write.positions.len(),
            pruned = write.pruned.len(),
            "acknowledged positions journaled"
        );
        Ok(())
    }

    /// The acknowledged position of a session: every step below it was received.
    pub fn acknowledged_position(&self, session: SessionId) -> CoordinatorResult<Step> {
        let index = open_key(&self.sessions, self.next_session, session)?;
        self.sessions
            .get(&index)
            .map(|entry| Step(entry.acked_position))
            .ok_or(CoordinatorError::UnknownSession(session))
    }
}
