//! How the workers are shared between jobs: stride scheduling by weight over the jobs whose
//! clients wait, and the most-starved session first within a job.
//!
//! A job is in the order when at least one of its sessions is ready (its client granted credits
//! that no task covers yet, and steps are left). The next lease goes to the job with the lowest
//! *pass*; ties go to the job whose top session waits for the most batches, then to the lower
//! job id. Serving a job advances its pass by [`STRIDE`] / weight. So while several jobs wait,
//! each gets leases in proportion to its weight, and none waits forever: a waiting job's pass
//! stays where it is while the others' grow past it. A job that becomes ready again starts no
//! lower than the pass of the job served last, so time spent without demand is not banked.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use super::session::ReadyKey;

/// Pass added per lease to a job of weight 1.
pub(crate) const STRIDE: u64 = 1 << 20;

/// A job's place in the order: pass, then how many batches its top session waits for, then id.
type JobKey = (u64, Reverse<u32>, u64);

/// One job's ready sessions and its share bookkeeping.
#[derive(Debug)]
struct JobShare {
    sessions: BTreeSet<ReadyKey>,
    pass: u64,
    weight: u32,
    /// Leases handed to this job since the coordinator started.
    leased: u64,
}

impl JobShare {
    fn key(&self, job: u64) -> Option<JobKey> {
        let top = self.sessions.first()?;
        Some((self.pass, top.0, job))
    }
}

/// The ready sessions of every job, and the order in which jobs are served.
#[derive(Debug, Default)]
pub(crate) struct ReadySet {
    jobs: super::FastMap<u64, JobShare>,
    order: BTreeSet<JobKey>,
    /// Pass of the job served last.
    now: u64,
    len: usize,
}

/// A job's share as the dashboard and metrics show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobShareStats {
    /// Its weight (capped by the coordinator's configuration).
    pub weight: u32,
    /// Leases handed to it since the coordinator started.
    pub leased: u64,
    /// Its sessions waiting for a lease now (credits uncovered and steps left).
    pub ready_sessions: u64,
}

impl ReadySet {
    fn share(&mut self, job: u64) -> &mut JobShare {
        self.jobs.entry(job).or_insert_with(|| JobShare {
            sessions: BTreeSet::new(),
            pass: 0,
            weight: 1,
            leased: 0,
        })
    }

    /// Forgets `job`: its share, weight and ready sessions.
    pub fn forget(&mut self, job: u64) {
        if let Some(share) = self.jobs.remove(&job) {
            if let Some(key) = share.key(job) {
                self.order.remove(&key);
            }
            self.len -= share.sessions.len();
        }
    }

    /// Sets `job`'s weight (at least 1).
    pub fn set_weight(&mut self, job: u64, weight: u32) {
        self.share(job).weight = weight.max(1);
    }

    /// Adds a ready session of `job`.
    pub fn insert(&mut self, job: u64, key: ReadyKey) {
        let now = self.now;
        let share = self.share(job);
        let old = share.key(job);
        if old.is_none() {
            // Ready again: what it did not use while idle is not kept.
            share.pass = share.pass.max(now);
        }
        let added = share.sessions.insert(key);
        let new = share.key(job);
        if added {
            self.len += 1;
        }
        self.rekey(old, new);
    }

    /// Removes a session of `job` that is no longer ready (or whose key changes).
    pub fn remove(&mut self, job: u64, key: &ReadyKey) {
        let Some(share) = self.jobs.get_mut(&job) else {
            return;
        };
        let old = share.key(job);
        if share.sessions.remove(key) {
            self.len -= 1;
        }
        let new = share.key(job);
        self.rekey(old, new);
    }

    /// Puts back a session [`pop`](Self::pop) took and that was not served (its client cannot
    /// reach the worker asking): unlike [`insert`](Self::insert), its job keeps its pass.
    pub fn put_back(&mut self, job: u64, key: ReadyKey) {
        let share = self.share(job);
        let old = share.key(job);
        let added = share.sessions.insert(key);
        let new = share.key(job);
        if added {
            self.len += 1;
        }
        self.rekey(old, new);
    }

    /// Takes the top session of the job served next; [`charge`](Self::charge) that job when a
    /// task of the session is leased.
    pub fn pop(&mut self) -> Option<(u64, ReadyKey)> {
        let &(_, _, job) = self.order.first()?;
        let share = self.jobs.get_mut(&job)?;
        let old = share.key(job);
        let key = share.sessions.pop_first()?;
        self.len -= 1;
        let new = share.key(job);
        self.rekey(old, new);
        Some((job, key))
    }

    /// Counts one lease to `job`: its pass advances by its stride.
    pub fn charge(&mut self, job: u64) {
        let Some(share) = self.jobs.get_mut(&job) else {
            return;
        };
        let old = share.key(job);
        self.now = self.now.max(share.pass);
        share.pass += (STRIDE / u64::from(share.weight)).max(1);
        share.leased += 1;
        let new = share.key(job);
        self.rekey(old, new);
    }

    fn rekey(&mut self, old: Option<JobKey>, new: Option<JobKey>) {
        if old == new {
            return;
        }
        if let Some(old) = old {
            self.order.remove(&old);
        }
        if let Some(new) = new {
            self.order.insert(new);
        }
    }

    /// Ready sessions of all jobs.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Jobs known here (registered or with a session).
    pub fn jobs(&self) -> usize {
        self.jobs.len()
    }

    /// `job`'s share, when it has one.
    pub fn stats(&self, job: u64) -> Option<JobShareStats> {
        self.jobs.get(&job).map(|share| JobShareStats {
            weight: share.weight,
            leased: share.leased,
            ready_sessions: share.sessions.len() as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn key(credits: u32, session: u32) -> ReadyKey {
        (Reverse(credits), 0, session)
    }

    /// Leases `n` tasks, each session staying ready (its client always waits); returns leases
    /// per job.
    fn serve(ready: &mut ReadySet, n: usize) -> HashMap<u64, u64> {
        let mut got = HashMap::new();
        for _ in 0..n {
            let (job, session) = ready.pop().expect("someone waits");
            ready.charge(job);
            *got.entry(job).or_default() += 1;
            ready.insert(job, session);
        }
        got
    }

    #[test]
    fn waiting_jobs_share_by_weight() {
        let mut ready = ReadySet::default();
        ready.set_weight(1, 1);
        ready.set_weight(2, 3);
        ready.insert(1, key(4, 10));
        ready.insert(2, key(4, 20));
        let got = serve(&mut ready, 400);
        assert_eq!(got[&1], 100);
        assert_eq!(got[&2], 300);
    }

    #[test]
    fn a_job_without_demand_banks_nothing() {
        let mut ready = ReadySet::default();
        ready.insert(1, key(4, 10));
        // Job 1 alone for a long time.
        serve(&mut ready, 1000);
        // Job 2 arrives: it does not get 1000 leases in a row to catch up, it alternates.
        ready.insert(2, key(4, 20));
        let got = serve(&mut ready, 10);
        assert_eq!((got[&1], got[&2]), (5, 5));
    }

    #[test]
    fn no_job_starves_however_heavy_the_other() {
        let mut ready = ReadySet::default();
        ready.set_weight(1, 1000);
        ready.set_weight(2, 1);
        ready.insert(1, key(64, 10));
        ready.insert(2, key(1, 20));
        let got = serve(&mut ready, 2002);
        assert_eq!(got[&2], 2, "{got:?}");
    }

    #[test]
    fn ties_go_to_the_job_whose_client_waits_most_then_sessions_by_starvation() {
        let mut ready = ReadySet::default();
        ready.insert(1, key(2, 10));
        ready.insert(2, key(7, 20));
        ready.insert(2, key(3, 21));
        assert_eq!(ready.len(), 3);
        assert_eq!(ready.pop(), Some((2, key(7, 20))));
        // Not charged (no task was leased): job 2 is still first, with its next session.
        assert_eq!(ready.pop(), Some((2, key(3, 21))));
        assert_eq!(ready.pop(), Some((1, key(2, 10))));
        assert_eq!(ready.pop(), None);
        assert_eq!(ready.len(), 0);
    }

    #[test]
    fn removed_sessions_leave_the_order() {
        let mut ready = ReadySet::default();
        ready.insert(1, key(2, 10));
        ready.insert(2, key(2, 20));
        ready.remove(1, &key(2, 10));
        ready.remove(9, &key(2, 90));
        assert_eq!(ready.pop(), Some((2, key(2, 20))));
        assert_eq!(ready.pop(), None);
        assert_eq!(ready.stats(1).map(|s| s.ready_sessions), Some(0));
    }
}
