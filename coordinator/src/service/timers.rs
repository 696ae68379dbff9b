//! The service's timers: the look for silent workers and sessions (the coordinator's own
//! stalls excused, idle jobs retired), the dashboard's refresh, and the journal's writes of
//! acknowledged positions, taken under the state's lock and written outside it.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::{lock, CoordinatorService};
use crate::client_reports::job_name;
use crate::dashboard_feed::{fleet, job_shares, serving_workers, worker_loads};
use crate::{CoordinatorError, SessionId};

/// Runs a journal write on a blocking thread, so a slow disk holds up no call; the write comes
/// back with its outcome, or the error of a write that did not finish (it panicked).
pub(super) async fn write_off_the_lock<W: Send + 'static, T: Send + 'static>(
    write: W,
    run: impl FnOnce(&W) -> Result<T, CoordinatorError> + Send + 'static,
) -> Result<(W, Result<T, CoordinatorError>), CoordinatorError> {
    tokio::task::spawn_blocking(move || {
        let outcome = run(&write);
        (write, outcome)
    })
    .await
    .map_err(|error| {
        CoordinatorError::Journal(Box::new(redb::Error::Io(std::io::Error::other(format!(
            "the journal write did not finish: {error}"
        )))))
    })
}

impl CoordinatorService {
    pub(super) async fn run_timers(self) {
        // The first look counts from the start of serving, not from the service's making.
        lock(&self.state).last_expire = Instant::now();
        let mut expire = tokio::time::interval(EXPIRE_EVERY);
        let mut refresh = tokio::time::interval(DASHBOARD_REFRESH);
        // After a stall, one refresh over the time that passed, not a burst of them.
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = refresh.tick() => self.refresh_dashboard(),
                _ = expire.tick() => self.expire(),
            }
        }
    }

    /// Writes the acknowledged positions every `flush_every`, each write waited for before the
    /// next is taken, until `stop` fires (a write in flight is finished first). After writes
    /// that failed in a row (a full disk) the next waits twice as long each time, up to
    /// [`FLUSH_BACKOFF_MOST`], so the log says it a few times, not ten times a second.
    pub(super) async fn run_flushes(self, mut stop: tokio::sync::oneshot::Receiver<()>) {
        let mut flush = tokio::time::interval(self.config.flush_every);
        // After a write that took long (a slow disk), the next one a period later, not a burst.
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failed_in_a_row = 0u32;
        loop {
            tokio::select! {
                _ = &mut stop => return,
                _ = flush.tick() => {}
            }
            match self.flush_journal().await {
                Ok(()) if failed_in_a_row > 0 => {
                    tracing::info!(
                        failed = failed_in_a_row,
                        "coordinator journal writes go through again"
                    );
                    failed_in_a_row = 0;
                }
                Ok(()) => {}
                Err(error) => {
                    failed_in_a_row += 1;
                    let pause = flush_backoff(self.config.flush_every, failed_in_a_row);
                    tracing::error!(%error, failed_in_a_row, next_try_in = ?pause, "coordinator journal flush failed; the positions stay for the next write");
                    tokio::select! {
                        _ = &mut stop => return,
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
    }

    /// Writes the acknowledged positions changed since the last write: taken under the lock,
    /// written outside it on a blocking thread, handed back under it.
    pub(super) async fn flush_journal(&self) -> Result<(), CoordinatorError> {
        let Some(write) = lock(&self.state).core.take_positions() else {
            return Ok(());
        };
        // A write that did not finish leaves the core holding every position it carried.
        let journal = self.journal.clone();
        let (write, outcome) =
            write_off_the_lock(write, move |write| journal.write_positions(write)).await?;
        lock(&self.state).core.positions_written(&write, outcome)
    }

    pub(super) fn refresh_dashboard(&self) {
        // Figured under the state's lock, handed over after it: the dashboard's lock is held
        // while a page's figures are written out, and every call waits on the state's.
        let (workers, shares, (live, wanted)) = {
            let mut state = lock(&self.state);
            let state = &mut *state;
            // Ranks silent this long (their sessions ended, their processes gone) are let go,
            // with or without a dashboard (a rank's report is held until then), and leave the
            // dashboard: their job's other ranks and its share stay until it is retired.
            let gone: Vec<(u64, u32)> = state
                .clients
                .iter()
                .filter(|(_, client)| client.at.elapsed() >= self.config.rank_forgotten_after)
                .map(|(key, _)| *key)
                .collect();
            for key in &gone {
                state.clients.remove(key);
                state.monitors.remove(key);
            }
            let Some(dashboard) = &self.dashboard else {
                return;
            };
            let gone: Vec<(String, u32)> = gone
                .into_iter()
                .map(|(job, rank)| (job_name(&state.core, job), rank))
                .collect();
            // Under the state's lock (rare: a rank silent for minutes), so a report that comes
            // meanwhile registers the rank after this, not before (and is then not forgotten).
            if !gone.is_empty() {
                dashboard.forget_ranks(&gone);
            }
            let jobs: HashSet<u64> = state.core.jobs().map(|(id, _, _)| id.0).collect();
            let last = &mut state.last_refresh;
            last.forget_gone(&state.workers, &jobs, &state.clients);
            // The rates are over the time since the last refresh, however late this one is.
            let interval = last.since_last(Instant::now()).unwrap_or(DASHBOARD_REFRESH);
            let workers = worker_loads(&state.workers, last, interval);
            let serving = serving_workers(&mut state.serving, &state.workers, Instant::now());
            let shares = job_shares(&state.core, last, interval, serving);
            let fleet = fleet(&state.workers, &state.clients, last);
            (workers, shares, fleet)
        };
        if let Some(dashboard) = &self.dashboard {
            dashboard.set_workers(workers);
            dashboard.set_shares(shares);
            dashboard.set_fleet(live, wanted);
        }
    }

    /// Drops the workers and sessions silent too long, once the coordinator's own stalls are
    /// excused: when the last look was long ago (a paused machine, a starved process), the time
    /// since was no time for heartbeats to be taken, so it is not counted against anyone.
    pub(super) fn expire(&self) {
        let mut state = lock(&self.state);
        // Read under the lock: a look that waited for it was not looking meanwhile.
        let now = Instant::now();
        let since = now.saturating_duration_since(std::mem::replace(&mut state.last_expire, now));
        if let Some(stalled) = excused(since, self.config.core.lease_timeout) {
            tracing::warn!(
                ?stalled,
                "the coordinator could not look for silent workers and clients for a while (a paused machine, no CPU); that time is not counted against them"
            );
            state.core.excuse_stall(stalled, now);
            for session in state.sessions.values_mut() {
                session.last_seen = session
                    .last_seen
                    .checked_add(stalled)
                    .map_or(now, |later| later.min(now))
                    .max(session.last_seen);
            }
        }
        let report = state.core.expire(now);
        for worker in &report.workers {
            if let Some(entry) = state.worker_gone(worker.0) {
                tracing::warn!(
                    worker = worker.0,
                    address = %entry.data_address,
                    requeued = report.requeued_tasks,
                    "worker lost (no heartbeat within the lease timeout); its tasks go back to the queue"
                );
            }
        }
        let stale: Vec<u64> = state
            .sessions
            .iter()
            .filter(|(_, s)| {
                now.saturating_duration_since(s.last_seen) >= self.config.session_timeout
            })
            .map(|(id, _)| *id)
            .collect();
        for id in stale {
            state.sessions.remove(&id);
            if let Err(error) = state.core.close_session(SessionId(id)) {
                tracing::debug!(%error, session = id, "closing a silent session");
            } else {
                tracing::warn!(session = id, "client silent too long; session closed");
            }
        }
        if now.saturating_duration_since(state.last_retire_look) >= self.retire_look_every() {
            state.last_retire_look = now;
            // Not while a job is being registered (it may be the one found idle).
            if let Ok(_no_registration) = self.registrations.try_lock() {
                self.retire_idle_jobs(&mut state, now);
            }
        }
        drop(state);
        if report.requeued_tasks > 0 {
            self.work.notify_waiters();
        }
    }
}

/// The longest pause after journal writes that failed in a row.
const FLUSH_BACKOFF_MOST: Duration = Duration::from_secs(10);

/// The pause before the next journal write after `failed` failed in a row: `every` doubling,
/// up to [`FLUSH_BACKOFF_MOST`].
fn flush_backoff(every: Duration, failed: u32) -> Duration {
    every
        .saturating_mul(1 << failed.min(16))
        .min(FLUSH_BACKOFF_MOST)
}

/// How often silent workers and sessions are looked for.
const EXPIRE_EVERY: Duration = Duration::from_millis(250);

/// A look for silent workers this long after the last one found the coordinator stalled.
const STALL_EXCUSED_AFTER: Duration = Duration::from_millis(500);

/// The part of `since` (the time since the last look for silent workers) excused as the
/// coordinator's own stall: none below [`STALL_EXCUSED_AFTER`]; above it, all but the look's
/// own interval (or a quarter of `lease_timeout`, if less: a live worker's heartbeat may be
/// that old already), so looks that keep coming late (a contended lock, a starved process)
/// still count that much of each gap against a worker or client gone silent, which is dropped.
fn excused(since: Duration, lease_timeout: Duration) -> Option<Duration> {
    let counted = EXPIRE_EVERY.min(lease_timeout / 4);
    (since >= STALL_EXCUSED_AFTER).then(|| since.saturating_sub(counted))
}

/// How often the dashboard's worker table is refreshed.
const DASHBOARD_REFRESH: Duration = Duration::from_millis(500);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looks_that_keep_coming_late_still_drop_a_dead_worker() {
        use crate::scheduler::Coordinator;
        use crate::CoordinatorConfig;
        let config = CoordinatorConfig {
            lease_timeout: Duration::from_secs(3),
            ..CoordinatorConfig::default()
        };
        let mut core = Coordinator::in_memory(config);
        let t0 = Instant::now();
        let dead = core.register_worker(t0);
        let (mut now, late) = (t0, Duration::from_millis(600));
        let mut dropped_at = None;
        for look in 1..=100 {
            now += late;
            if let Some(stalled) = excused(late, Duration::from_secs(3)) {
                core.excuse_stall(stalled, now);
            }
            if core.expire(now).workers.contains(&dead) {
                dropped_at = Some(look);
                break;
            }
        }
        // 250 ms of each 600 ms gap counts: the 3 s timeout at the twelfth look. Before, the
        // whole gap was excused at every look, and the worker never dropped.
        assert_eq!(dropped_at, Some(12));
        // A real stall (a paused machine) is excused but for one look's interval, or a quarter
        // of a lease timeout shorter than four of them (a live worker's last heartbeat may be
        // that old at the look before the stall).
        let (paused, lease) = (Duration::from_secs(30), Duration::from_secs(3));
        assert_eq!(excused(paused, lease), Some(paused - EXPIRE_EVERY));
        let short = Duration::from_millis(300);
        assert_eq!(excused(paused, short), Some(paused - short / 4));
        assert_eq!(excused(Duration::from_millis(300), lease), None);
    }

    #[test]
    fn failed_journal_writes_are_tried_again_ever_later_up_to_ten_seconds() {
        let every = Duration::from_millis(100);
        assert_eq!(flush_backoff(every, 1), Duration::from_millis(200));
        assert_eq!(flush_backoff(every, 3), Duration::from_millis(800));
        assert_eq!(flush_backoff(every, 7), FLUSH_BACKOFF_MOST);
        assert_eq!(flush_backoff(every, u32::MAX), FLUSH_BACKOFF_MOST);
    }
}
