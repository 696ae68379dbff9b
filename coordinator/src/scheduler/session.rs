//! One session's window of steps: what is queued, what is acknowledged, and the credits its
//! client granted.
//!
//! Steps below `acked_position` are all acknowledged; `acked_ahead` holds acknowledgements that
//! arrived out of order above it. Steps to hand out come first from `requeued` (steps whose
//! lease died, in step order) and then from `next_fresh` upwards, skipping any already
//! acknowledged.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use super::ids::{JobId, SessionId};

/// Key of a session in the coordinator's ready set: most uncovered credits first, then the
/// session served longest ago, then the lowest session index.
pub(crate) type ReadyKey = (Reverse<u32>, u64, u32);

/// What an acknowledgement did to a session's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AckEffect {
    /// The step was already acknowledged.
    Duplicate,
    /// Recorded; the acknowledged position may have moved. `was_queued` says the step had not
    /// been handed out (or had been requeued), so its credit is now used.
    Recorded { was_queued: bool },
}

/// One client consuming one (job, rank, epoch).
#[derive(Debug)]
pub(crate) struct Session {
    pub id: SessionId,
    pub job: JobId,
    pub rank: u32,
    pub epoch: u64,
    pub steps_per_epoch: u64,
    /// Bumped when the session is reopened: leases of an older incarnation are stale.
    pub incarnation: u32,
    /// Credits granted by the client and not yet covered by a leased or delivered task.
    pub credits: u32,
    /// Value of the coordinator's serve clock when a task of this session was last leased.
    pub last_served: u64,
    pub next_fresh: u64,
    pub requeued: BTreeSet<u64>,
    pub acked_position: u64,
    pub acked_ahead: BTreeSet<u64>,
    /// The workers (by index) this opening's client cannot open a stream to: its steps are
    /// leased to none of them.
    pub unreachable: Vec<u32>,
}

impl Session {
    /// A fresh window starting at `position`.
    pub fn new(
        id: SessionId,
        job: JobId,
        rank: u32,
        epoch: u64,
        steps_per_epoch: u64,
        position: u64,
    ) -> Self {
        Self {
            id,
            job,
            rank,
            epoch,
            steps_per_epoch,
            incarnation: 0,
            credits: 0,
            last_served: 0,
            next_fresh: position,
            requeued: BTreeSet::new(),
            acked_position: position,
            acked_ahead: BTreeSet::new(),
            unreachable: Vec::new(),
        }
    }

    /// Forgets everything not acknowledged (leases, queue, credits) and restarts the window at
    /// `max(position, acked_position)`: what a reconnecting client asks for.
    pub fn reset(&mut self, position: u64) {
        self.incarnation = self.incarnation.wrapping_add(1);
        self.credits = 0;
        self.requeued.clear();
        // The new opening's client says again which workers it cannot reach.
        self.unreachable.clear();
        if position > self.acked_position {
            self.acked_position = position;
            self.acked_ahead = self.acked_ahead.split_off(&position);
            self.advance_position();
        }
        self.next_fresh = self.acked_position;
    }

    /// Restarts the window at exactly `position`, forgetting acknowledgements at or above it:
    /// what a client resuming from an older checkpoint asks for.
    pub fn reset_exact(&mut self, position: u64) {
        self.reset(0);
        self.acked_position = position;
        self.acked_ahead.clear();
        self.next_fresh = position;
    }

    /// Whether any step may still need a lease (a cheap upper bound: acknowledged fresh steps
    /// are skipped when taken).
    pub fn has_work(&self) -> bool {
        !self.requeued.is_empty() || self.next_fresh < self.steps_per_epoch
    }

    /// Whether the session belongs in the ready set.
    pub fn is_ready(&self) -> bool {
        self.credits > 0 && self.has_work()
    }

    /// The session's key in the ready set.
    pub fn ready_key(&self) -> ReadyKey {
        (Reverse(self.credits), self.last_served, self.id.0 as u32)
    }

    /// Whether `step` was acknowledged.
    pub fn is_acked(&self, step: u64) -> bool {
        step < self.acked_position || self.acked_ahead.contains(&step)
    }

    /// Takes the next step to lease, requeued steps first; `None` when nothing is left.
    pub fn take_step(&mut self) -> Option<u64> {
        while let Some(step) = self.requeued.pop_first() {
            if !self.is_acked(step) {
                return Some(step);
            }
        }
        while self.next_fresh < self.steps_per_epoch {
            let step = self.next_fresh;
            self.next_fresh += 1;
            if !self.is_acked(step) {
                return Some(step);
            }
        }
        None
    }

    /// Puts a step whose lease died back in front of the queue.
    pub fn requeue(&mut self, step: u64) -> bool {
        !self.is_acked(step) && self.requeued.insert(step)
    }

    /// Records an acknowledgement of `step` (which the caller checked is inside the epoch).
    pub fn acknowledge(&mut self, step: u64) -> AckEffect {
        if self.is_acked(step) {
            return AckEffect::Duplicate;
        }
        let was_queued = self.requeued.remove(&step) || step >= self.next_fresh;
        if step == self.acked_position {
            self.acked_position += 1;
            self.advance_position();
        } else {
            self.acked_ahead.insert(step);
        }
        AckEffect::Recorded { was_queued }
    }

    fn advance_position(&mut self) {
        while self.acked_ahead.first() == Some(&self.acked_position) {
            self.acked_ahead.pop_first();
            self.acked_position += 1;
        }
    }

    /// Steps not yet handed out (requeued plus fresh), an upper bound when acks ran ahead.
    pub fn queued(&self) -> u64 {
        self.requeued.len() as u64 + self.steps_per_epoch.saturating_sub(self.next_fresh)
    }

    /// Bytes held on the heap by the step sets (estimated from B-tree node sizes).
    pub fn heap_bytes(&self) -> usize {
        // A std B-tree leaf holds up to 11 keys; count a node per 11 keys, rounded up, and
        // about 16 bytes of node overhead per key slot (8 for the key, the rest amortised).
        let keys = self.requeued.len() + self.acked_ahead.len();
        keys.div_ceil(11) * 11 * 16
    }
}
