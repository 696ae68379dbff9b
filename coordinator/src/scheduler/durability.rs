//! What the core makes durable: acknowledged positions taken out as a [`PositionWrite`], an
//! intent the caller writes to the journal (off the core's lock) and hands back; and a
//! session's position as the journal has it.

use super::*;

/// Acknowledged positions taken from the core by [`Coordinator::take_positions`], to be
/// written to the journal in one transaction without the core (a service writes it off its
/// lock, so a slow disk stalls no call), then handed back with
/// [`Coordinator::positions_written`].
pub struct PositionWrite {
    /// Rises with each write taken: a write that lands after a later one is skipped.
    pub(crate) seq: u64,
    pub(crate) positions: Vec<(PositionKey, u64)>,
    pub(crate) pruned: Vec<PositionKey>,
    /// The core's count of prunes when it was taken (those before it are in `pruned` or done).
    pub(super) pruned_upto: u64,
    /// Retired jobs whose rows it deletes.
    pub(crate) retired: Vec<u64>,
}

impl Coordinator {
    /// Whether [`CoordinatorConfig::journal_every`] acknowledgements came since positions were
    /// last taken: a caller that writes by count takes them now.
    pub fn write_due(&self) -> bool {
        self.journaled && self.acks_since_flush >= self.config.journal_every
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
    /// that fails, or is never made, loses nothing. Each write taken carries a higher number
    /// than the ones before, so one that lands after a later one is skipped.
    pub fn take_positions(&mut self) -> Option<PositionWrite> {
        self.acks_since_flush = 0;
        if !self.journaled || self.nothing_to_write() {
            return None;
        }
        self.position_writes += 1;
        Some(PositionWrite {
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

    /// Takes back `write` after the journal gave `outcome` for it (`Ok(false)`: skipped, a
    /// later write landed first): once landed, its
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

    /// The opening `session` is in: 0 when first opened, one more at each reopen (the
    /// session's leases before it are stale).
    pub fn session_opening(&self, session: SessionId) -> CoordinatorResult<u32> {
        let index = open_key(&self.sessions, self.next_session, session)?;
        self.sessions
            .get(&index)
            .map(|entry| entry.incarnation)
            .ok_or(CoordinatorError::UnknownSession(session))
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
