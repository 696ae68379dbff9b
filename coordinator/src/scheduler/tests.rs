//! Unit tests of the coordinator core: fairness, credits, dead workers, restarts, acks and
//! refusals, all on an explicit clock.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use stoker_proto::v1::JobSpec;

use super::*;
use crate::Durable;

fn spec(world_size: u32, seed: u64) -> JobSpec {
    JobSpec {
        batch_size: 4,
        seed,
        world_size,
        ..JobSpec::default()
    }
}

fn config() -> CoordinatorConfig {
    CoordinatorConfig {
        lease_timeout: Duration::from_secs(10),
        journal_every: 4,
        ..CoordinatorConfig::default()
    }
}

fn at(base: Instant, ms: u64) -> Instant {
    base + Duration::from_millis(ms)
}

/// The steps of up to `max` tasks `worker` leases at `now`.
fn lease_steps(c: &mut Coordinator, worker: WorkerId, max: usize, now: Instant) -> Vec<u64> {
    c.lease(worker, max, now)
        .unwrap()
        .iter()
        .map(|l| l.task.step.0)
        .collect()
}

/// An in-memory core with one job of `steps` steps, rank 0's session on it with `credits`
/// granted, and one worker registered at `t0`.
fn one_session(steps: u64, credits: u64, t0: Instant) -> (Coordinator, JobId, SessionId, WorkerId) {
    let mut c = Coordinator::in_memory(config());
    let job = c.register_job(spec(1, 0), steps).unwrap();
    let s = c.open_session(job, 0, 0, Step(0)).unwrap();
    c.grant_credits(s, credits).unwrap();
    let w = c.register_worker(t0);
    (c, job, s, w)
}

#[test]
fn jobs_alternate_at_equal_weights_and_sessions_go_most_starved_first() {
    let t0 = Instant::now();
    let mut c = Coordinator::in_memory(config());
    let job_a = c.register_job(spec(1, 1), 100).unwrap();
    let job_b = c.register_job(spec(2, 2), 100).unwrap();
    let a = c.open_session(job_a, 0, 0, Step(0)).unwrap();
    let b0 = c.open_session(job_b, 0, 0, Step(0)).unwrap();
    let b1 = c.open_session(job_b, 1, 0, Step(0)).unwrap();
    c.grant_credits(a, 2).unwrap();
    c.grant_credits(b0, 5).unwrap();
    c.grant_credits(b1, 1).unwrap();
    let w = c.register_worker(t0);
    // The jobs take turns while both wait (b first: its client waits for more); within b the
    // session waiting for most goes first, and at a tie the one served longest ago.
    let sessions: Vec<SessionId> = c
        .lease(w, 8, t0)
        .unwrap()
        .iter()
        .map(|l| l.session)
        .collect();
    assert_eq!(sessions, [b0, a, b0, a, b0, b0, b1, b0]);
    assert!(c.lease(w, 1, t0).unwrap().is_empty(), "credits exhausted");
    assert_eq!(c.job_share(job_a).leased, 2);
    assert_eq!(c.job_share(job_b).leased, 6);
}

#[test]
fn waiting_sessions_count_those_with_credits_and_a_step_to_lease() {
    let t0 = Instant::now();
    let (mut c, _, s, w) = one_session(3, 2, t0);
    assert_eq!(c.waiting_sessions(), 1);
    assert_eq!(lease_steps(&mut c, w, 1, t0), [0]);
    assert_eq!(c.waiting_sessions(), 1, "one credit left");
    assert_eq!(lease_steps(&mut c, w, 4, t0), [1]);
    assert_eq!(c.waiting_sessions(), 0, "credits spent");
    c.grant_credits(s, 5).unwrap();
    assert_eq!(c.waiting_sessions(), 1);
    assert_eq!(lease_steps(&mut c, w, 4, t0), [2]);
    assert_eq!(c.waiting_sessions(), 0, "credits left but no step");
}

/// Two jobs whose clients always wait (each consumes a batch and grants a credit again as
/// soon as one arrives) on `workers` workers, for `rounds` rounds of simulated time; returns
/// the leases each job got.
fn contend(weights: [u32; 2], max_job_weight: u32, rounds: u64) -> ([u64; 2], [u32; 2]) {
    let t0 = Instant::now();
    let mut c = Coordinator::in_memory(CoordinatorConfig {
        max_job_weight,
        ..config()
    });
    let mut sessions = Vec::new();
    let mut given = [0; 2];
    for (j, weight) in weights.into_iter().enumerate() {
        let job = c.register_job(spec(1, j as u64), 1_000_000).unwrap();
        given[j] = c.set_job_weight(job, weight).unwrap();
        let s = c.open_session(job, 0, 0, Step(0)).unwrap();
        c.grant_credits(s, 16).unwrap();
        sessions.push((job, s));
    }
    let workers: Vec<WorkerId> = (0..4).map(|_| c.register_worker(t0)).collect();
    let mut got = [0u64; 2];
    for round in 0..rounds {
        let now = at(t0, round * 100);
        for &w in &workers {
            // Each worker has room for one batch per round.
            for lease in c.lease(w, 1, now).unwrap() {
                c.complete(w, lease.lease_id).unwrap();
                c.acknowledge(lease.session, lease.task.step).unwrap();
                let j = sessions
                    .iter()
                    .position(|(_, s)| *s == lease.session)
                    .unwrap();
                got[j] += 1;
                c.grant_credits(lease.session, 1).unwrap();
            }
        }
    }
    (got, given)
}

#[test]
fn waiting_jobs_share_the_workers_by_weight_capped_by_the_coordinator() {
    let (got, given) = contend([1, 3], 8, 250);
    assert_eq!(given, [1, 3]);
    assert_eq!(got[0] + got[1], 1000, "every worker busy every round");
    assert_eq!(got, [250, 750]);
    // A job asking for 100 gets the coordinator's cap, 4: the pool splits 1:4, not 1:100.
    let (got, given) = contend([1, 100], 4, 250);
    assert_eq!(given, [1, 4]);
    assert_eq!(got, [200, 800]);
}

#[test]
fn a_cap_past_the_largest_weight_is_the_largest_weight() {
    // 2^20 / weight would be 0 past 2^20: the heavy job's pass would never move.
    let (got, given) = contend([u32::MAX, 1], u32::MAX, 20_000);
    assert_eq!(given, [MAX_JOB_WEIGHT, 1]);
    assert!(got[1] >= 1, "the light job got {got:?}");
}

#[test]
fn a_light_job_is_never_starved_and_an_idle_one_takes_nothing() {
    // Weight 8 against 1 over 900 leases: the light job gets its ninth.
    let (got, _) = contend([1, 8], 8, 225);
    assert_eq!(got, [100, 800]);
    // A job whose client does not wait (no credits) gets no lease; the other gets them all.
    let t0 = Instant::now();
    let mut c = Coordinator::in_memory(config());
    let busy = c.register_job(spec(1, 1), 100).unwrap();
    let idle = c.register_job(spec(1, 2), 100).unwrap();
    let s = c.open_session(busy, 0, 0, Step(0)).unwrap();
    c.open_session(idle, 0, 0, Step(0)).unwrap();
    c.grant_credits(s, 10).unwrap();
    let w = c.register_worker(t0);
    assert_eq!(c.lease(w, 20, t0).unwrap().len(), 10);
    assert_eq!(c.job_share(idle).leased, 0);
    assert!(matches!(
        c.set_job_weight(JobId(99), 2),
        Err(CoordinatorError::UnknownJob(_))
    ));
}

#[test]
fn credits_bound_leasing() {
    let t0 = Instant::now();
    let mut c = Coordinator::in_memory(config());
    let job = c.register_job(spec(1, 0), 50).unwrap();
    let s = c.open_session(job, 0, 0, Step(0)).unwrap();
    let w = c.register_worker(t0);
    assert!(
        c.lease(w, 10, t0).unwrap().is_empty(),
        "no credits, no tasks"
    );
    c.grant_credits(s, 3).unwrap();
    let leases = c.lease(w, 10, t0).unwrap();
    let steps: Vec<u64> = leases.iter().map(|l| l.task.step.0).collect();
    assert_eq!(steps, [0, 1, 2]);
    // Completing does not free a credit: the batch still fills a client slot.
    for l in &leases {
        assert_eq!(c.complete(w, l.lease_id).unwrap(), LeaseOutcome::Applied);
    }
    assert!(c.lease(w, 10, t0).unwrap().is_empty());
    c.grant_credits(s, 1).unwrap();
    assert_eq!(c.lease(w, 10, t0).unwrap()[0].task.step, Step(3));
}

/// Runs every session to the end of the epoch with the given workers: lease, complete, ack,
/// re-grant. Returns (session, step) -> times received.
fn drain(
    c: &mut Coordinator,
    workers: &[WorkerId],
    now: Instant,
    received: &mut BTreeMap<(SessionId, u64), u32>,
) {
    loop {
        let mut any = false;
        for &w in workers {
            for lease in c.lease(w, 3, now).unwrap() {
                any = true;
                if c.complete(w, lease.lease_id).unwrap() == LeaseOutcome::Applied {
                    *received
                        .entry((lease.session, lease.task.step.0))
                        .or_default() += 1;
                    c.acknowledge(lease.session, lease.task.step).unwrap();
                    c.grant_credits(lease.session, 1).unwrap();
                }
            }
        }
        if !any {
            return;
        }
    }
}

#[test]
fn a_leaving_worker_returns_its_leases_at_once_and_gets_no_more() {
    let t0 = Instant::now();
    let steps = 12;
    let mut c = Coordinator::in_memory(config());
    let job = c.register_job(spec(1, 0), steps).unwrap();
    let session = c.open_session(job, 0, 0, Step(0)).unwrap();
    c.grant_credits(session, 4).unwrap();
    let staying = c.register_worker(t0);
    let leaving = c.register_worker(t0);
    let mut received = BTreeMap::new();
    // The leaving worker finishes one lease and still holds three when it is told to stop.
    let held = c.lease(leaving, 4, at(t0, 1)).unwrap();
    assert_eq!(held.len(), 4);
    c.complete(leaving, held[0].lease_id).unwrap();
    received.insert((session, held[0].task.step.0), 1);
    c.acknowledge(session, held[0].task.step).unwrap();
    c.grant_credits(session, 1).unwrap();
    assert_eq!(c.leave_worker(leaving).unwrap(), 3);
    // Long before any lease timeout, the other worker gets the three returned steps first.
    let now = at(t0, 2);
    let next = c.lease(staying, 3, now).unwrap();
    let next_steps: Vec<u64> = next.iter().map(|l| l.task.step.0).collect();
    let returned: Vec<u64> = held[1..].iter().map(|l| l.task.step.0).collect();
    assert_eq!(next_steps, returned);
    assert!(matches!(
        c.lease(leaving, 1, now),
        Err(CoordinatorError::WorkerExpired(_))
    ));
    assert!(c.leave_worker(leaving).is_err(), "a worker leaves once");
    // Its late report on a returned lease is dropped; the epoch completes exactly once.
    assert_eq!(
        c.complete(leaving, held[1].lease_id).unwrap(),
        LeaseOutcome::Stale
    );
    for lease in next {
        assert_eq!(
            c.complete(staying, lease.lease_id).unwrap(),
            LeaseOutcome::Applied
        );
        *received.entry((session, lease.task.step.0)).or_default() += 1;
        c.acknowledge(session, lease.task.step).unwrap();
        c.grant_credits(session, 1).unwrap();
    }
    drain(&mut c, &[staying], now, &mut received);
    for step in 0..steps {
        assert_eq!(received.get(&(session, step)), Some(&1), "step {step}");
    }
    let stats = c.stats();
    assert_eq!(stats.returned_leases, 3);
    assert_eq!(stats.expired_leases, 0);
    assert!(c
        .expire(at(t0, 60_000))
        .workers
        .iter()
        .all(|w| *w != leaving));
}

#[test]
fn dead_worker_tasks_are_redone_by_another_exactly_once() {
    let t0 = Instant::now();
    let steps = 40;
    let mut c = Coordinator::in_memory(config());
    let job = c.register_job(spec(2, 0), steps).unwrap();
    let sessions = [
        c.open_session(job, 0, 0, Step(0)).unwrap(),
        c.open_session(job, 1, 0, Step(0)).unwrap(),
    ];
    for &s in &sessions {
        c.grant_credits(s, 4).unwrap();
    }
    let alive = c.register_worker(t0);
    let doomed = c.register_worker(t0);
    let mut received = BTreeMap::new();
    // Half an epoch with both workers; the doomed one then takes tasks and goes silent.
    while c.stats().acknowledgements < steps {
        for w in [alive, doomed] {
            for lease in c.lease(w, 2, at(t0, 1)).unwrap() {
                c.complete(w, lease.lease_id).unwrap();
                *received
                    .entry((lease.session, lease.task.step.0))
                    .or_default() += 1;
                c.acknowledge(lease.session, lease.task.step).unwrap();
                c.grant_credits(lease.session, 1).unwrap();
            }
        }
    }
    let lost = c.lease(doomed, 4, at(t0, 2)).unwrap();
    assert_eq!(lost.len(), 4);
    c.heartbeat(alive, at(t0, 9_000)).unwrap();
    assert!(c.expire(at(t0, 9_000)).workers.is_empty());
    let report = c.expire(at(t0, 10_002));
    assert_eq!(report.workers, [doomed]);
    assert_eq!(report.requeued_tasks, 4);
    assert!(matches!(
        c.lease(doomed, 1, at(t0, 10_003)),
        Err(CoordinatorError::WorkerExpired(_))
    ));
    // The requeued steps come back first, in step order.
    let first = c.lease(alive, 1, at(t0, 10_003)).unwrap();
    let lost_steps: Vec<(SessionId, u64)> =
        lost.iter().map(|l| (l.session, l.task.step.0)).collect();
    assert!(lost_steps.contains(&(first[0].session, first[0].task.step.0)));
    c.fail(alive, first[0].lease_id, "simulated decode error")
        .unwrap();
    drain(&mut c, &[alive], at(t0, 10_004), &mut received);
    // The doomed worker's late report on an expired lease is dropped.
    assert_eq!(
        c.complete(doomed, lost[0].lease_id).unwrap(),
        LeaseOutcome::Stale
    );
    for &s in &sessions {
        assert_eq!(c.acknowledged_position(s).unwrap(), Step(steps));
        for step in 0..steps {
            assert_eq!(received.get(&(s, step)), Some(&1), "{s} step {step}");
        }
    }
    let stats = c.stats();
    assert_eq!(stats.expired_leases, 4);
    assert_eq!(stats.failed_leases, 1);
    assert_eq!(stats.leased_tasks, 0);
    assert_eq!(stats.queued_tasks, 0);
    assert_eq!(stats.duplicates_dropped, 1);
}

#[test]
fn restart_resumes_from_the_journal_and_redoes_the_rest_once() {
    let dir = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    let steps = 30;
    let (job, acked_before) = {
        let mut c = Durable::open(dir.path(), config()).unwrap();
        let job = c.register_job(spec(2, 9), steps).unwrap();
        let s0 = c.core.open_session(job, 0, 3, Step(0)).unwrap();
        let s1 = c.core.open_session(job, 1, 3, Step(0)).unwrap();
        c.core.grant_credits(s0, 8).unwrap();
        c.core.grant_credits(s1, 8).unwrap();
        let w = c.core.register_worker(t0);
        let leases = c.core.lease(w, 16, t0).unwrap();
        // Rank 0 acks 0..6, rank 1 acks 0..3 and 5; the rest stays in flight at the "crash".
        for l in &leases {
            c.core.complete(w, l.lease_id).unwrap();
            let s = l.task.step.0;
            if (l.session == s0 && s < 6) || (l.session == s1 && (s < 3 || s == 5)) {
                c.acknowledge(l.session, l.task.step).unwrap();
            }
        }
        c.flush().unwrap();
        (job, [6, 3])
    };
    let mut c = Durable::open(dir.path(), config()).unwrap();
    assert_eq!(c.core.job_spec(job).unwrap().seed, 9);
    assert_eq!(c.core.steps_per_epoch(job).unwrap(), steps);
    let s0 = c.core.open_session(job, 0, 3, Step(0)).unwrap();
    let s1 = c.core.open_session(job, 1, 3, Step(0)).unwrap();
    assert_eq!(
        c.core.acknowledged_position(s0).unwrap(),
        Step(acked_before[0])
    );
    assert_eq!(
        c.core.acknowledged_position(s1).unwrap(),
        Step(acked_before[1])
    );
    c.core.grant_credits(s0, 4).unwrap();
    c.core.grant_credits(s1, 4).unwrap();
    let w = c.core.register_worker(t0);
    let mut received = BTreeMap::new();
    drain(&mut c.core, &[w], t0, &mut received);
    for (s, from) in [(s0, 6), (s1, 3)] {
        let got: Vec<u64> = received.keys().filter(|k| k.0 == s).map(|k| k.1).collect();
        assert_eq!(got, (from..steps).collect::<Vec<_>>());
        assert!(received.iter().all(|(_, &n)| n == 1));
        assert_eq!(c.core.acknowledged_position(s).unwrap(), Step(steps));
    }
    // A job registered after the restart gets a fresh id (of this run's range), and the
    // journaled job keeps its own.
    let fresh = c.register_job(spec(1, 0), 1).unwrap();
    assert!(
        fresh != job && fresh.0 >> 32 != job.0 >> 32,
        "{fresh:?} beside {job:?}"
    );
    assert_eq!(c.core.job_spec(job).unwrap().seed, 9);
}

#[test]
fn journal_writes_are_batched_until_flush() {
    let dir = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    let job = {
        let mut c = Durable::open(
            dir.path(),
            CoordinatorConfig {
                journal_every: 1000,
                ..config()
            },
        )
        .unwrap();
        let job = c.register_job(spec(1, 0), 10).unwrap();
        let s = c.core.open_session(job, 0, 0, Step(0)).unwrap();
        c.core.grant_credits(s, 5).unwrap();
        let w = c.core.register_worker(t0);
        for l in c.core.lease(w, 5, t0).unwrap() {
            c.acknowledge(l.session, l.task.step).unwrap();
        }
        assert_eq!(c.core.stats().journal_commits, 1, "only the job so far");
        job
    };
    let mut c = Durable::open(dir.path(), config()).unwrap();
    let s = c.core.open_session(job, 0, 0, Step(2)).unwrap();
    // Unflushed acks are lost; the client's own start step still counts.
    assert_eq!(c.core.acknowledged_position(s).unwrap(), Step(2));
}

#[test]
fn worker_joining_mid_epoch_gets_tasks() {
    let t0 = Instant::now();
    let (mut c, _, _, first) = one_session(20, 6, t0);
    assert_eq!(c.lease(first, 3, t0).unwrap().len(), 3);
    let late = c.register_worker(at(t0, 500));
    let leases = c.lease(late, 3, at(t0, 500)).unwrap();
    let steps: Vec<u64> = leases.iter().map(|l| l.task.step.0).collect();
    assert_eq!(steps, [3, 4, 5]);
    assert_eq!(c.stats().workers, 2);
}

#[test]
fn out_of_order_acks_move_the_position_when_the_gap_fills() {
    let mut c = Coordinator::in_memory(config());
    let job = c.register_job(spec(1, 0), 8).unwrap();
    let s = c.open_session(job, 0, 0, Step(0)).unwrap();
    let position = |o: AckOutcome| match o {
        AckOutcome::Recorded { position } => position.0,
        AckOutcome::Duplicate => u64::MAX,
    };
    assert_eq!(position(c.acknowledge(s, Step(2)).unwrap()), 0);
    assert_eq!(position(c.acknowledge(s, Step(1)).unwrap()), 0);
    assert_eq!(c.acknowledge(s, Step(2)).unwrap(), AckOutcome::Duplicate);
    assert_eq!(position(c.acknowledge(s, Step(0)).unwrap()), 3);
    assert_eq!(c.acknowledge(s, Step(0)).unwrap(), AckOutcome::Duplicate);
    assert_eq!(c.stats().duplicates_dropped, 2);
    // Acknowledged steps are never leased.
    c.acknowledge(s, Step(4)).unwrap();
    c.grant_credits(s, 8).unwrap();
    let t0 = Instant::now();
    let w = c.register_worker(t0);
    let steps: Vec<u64> = lease_steps(&mut c, w, 8, t0);
    assert_eq!(steps, [3, 5, 6, 7]);
}

#[test]
fn reopened_session_redoes_unacknowledged_steps() {
    let t0 = Instant::now();
    let (mut c, job, s, w) = one_session(10, 4, t0);
    let old = c.lease(w, 4, t0).unwrap();
    assert!(old.iter().all(|lease| lease.opening == 0));
    assert_eq!(c.session_opening(s).unwrap(), 0);
    c.acknowledge(s, Step(0)).unwrap();
    assert_eq!(c.open_session(job, 0, 0, Step(0)).unwrap(), s);
    // The same session, in its next opening: its leases say so (their batches go on the
    // reopened session's streams, not on one opened before).
    assert_eq!(c.session_opening(s).unwrap(), 1);
    assert_eq!(c.complete(w, old[1].lease_id).unwrap(), LeaseOutcome::Stale);
    c.grant_credits(s, 2).unwrap();
    let new = c.lease(w, 4, t0).unwrap();
    assert!(new.iter().all(|lease| lease.opening == 1));
    let steps: Vec<u64> = new.iter().map(|lease| lease.task.step.0).collect();
    assert_eq!(steps, [1, 2]);
}

/// A session whose client cannot reach a worker is leased to it no more, and what that worker
/// held for it comes back with its credits, for the others; the next opening starts clean.
#[test]
fn a_worker_the_sessions_client_cannot_reach_leases_none_of_its_steps() {
    let t0 = Instant::now();
    let (mut c, job, s, unreachable) = one_session(10, 4, t0);
    let reachable = c.register_worker(t0);
    let held = c.lease(unreachable, 2, t0).unwrap();
    assert_eq!(held.len(), 2);
    assert_eq!(
        c.set_unreachable(s, &[unreachable, WorkerId(99)]).unwrap(),
        2
    );
    // Its reports on what it held are stale; it is leased nothing more of this session.
    assert_eq!(
        c.complete(unreachable, held[0].lease_id).unwrap(),
        LeaseOutcome::Stale
    );
    assert!(c.lease(unreachable, 4, t0).unwrap().is_empty());
    // The other worker takes every step, the two taken back first, with their credits.
    assert_eq!(lease_steps(&mut c, reachable, 8, t0), [0, 1, 2, 3]);
    // Reachable again: leased again.
    c.set_unreachable(s, &[]).unwrap();
    c.grant_credits(s, 1).unwrap();
    assert_eq!(lease_steps(&mut c, unreachable, 4, t0), [4]);
    // A reopened session's client says again what it cannot reach.
    c.set_unreachable(s, &[unreachable]).unwrap();
    assert_eq!(c.open_session(job, 0, 0, Step(0)).unwrap(), s);
    c.grant_credits(s, 1).unwrap();
    assert_eq!(c.lease(unreachable, 4, t0).unwrap().len(), 1);
}

#[test]
fn absurd_inputs_are_refused_by_name() {
    let t0 = Instant::now();
    let mut c = Coordinator::in_memory(config());
    let job = c.register_job(spec(2, 0), 10).unwrap();
    let s = c.open_session(job, 0, 0, Step(0)).unwrap();
    let w = c.register_worker(t0);
    let message = |e: CoordinatorError| e.to_string();

    assert_eq!(
        message(c.open_session(JobId(7), 0, 0, Step(0)).unwrap_err()),
        "unknown job 7"
    );
    assert!(message(c.open_session(job, 2, 0, Step(0)).unwrap_err()).contains("rank 2"));
    assert!(message(c.open_session(job, 1, 0, Step(11)).unwrap_err()).contains("step 11"));
    assert!(c.register_job(spec(1, 0), 0).is_err());
    assert_eq!(
        message(c.grant_credits(SessionId(99), 1).unwrap_err()),
        "unknown session 99"
    );
    assert!(message(c.grant_credits(s, 0).unwrap_err()).contains("cannot grant 0"));
    assert!(matches!(
        c.grant_credits(s, u64::MAX),
        Err(CoordinatorError::InvalidCredits { .. })
    ));
    assert!(matches!(
        c.grant_credits(s, 65_537),
        Err(CoordinatorError::InvalidCredits { .. })
    ));
    assert!(message(c.acknowledge(s, Step(10)).unwrap_err()).contains("past the end"));
    assert_eq!(
        message(c.lease(WorkerId(5), 1, t0).unwrap_err()),
        "unknown worker 5"
    );
    assert!(c.lease(w, 0, t0).is_err());
    assert!(c.heartbeat(WorkerId(5), t0).is_err());
    assert!(matches!(
        c.complete(w, LeaseId(12345)),
        Err(CoordinatorError::UnknownLease(_))
    ));
    c.grant_credits(s, 1).unwrap();
    let lease = c.lease(w, 1, t0).unwrap()[0];
    let other = c.register_worker(t0);
    assert!(matches!(
        c.complete(other, lease.lease_id),
        Err(CoordinatorError::LeaseNotHeld { .. })
    ));
    assert_eq!(
        c.complete(w, lease.lease_id).unwrap(),
        LeaseOutcome::Applied
    );
    assert_eq!(c.complete(w, lease.lease_id).unwrap(), LeaseOutcome::Stale);
    c.close_session(s).unwrap();
    assert!(matches!(
        c.acknowledge(s, Step(1)),
        Err(CoordinatorError::SessionClosed(_))
    ));
}

#[test]
fn an_exact_reopen_redelivers_steps_acknowledged_before() {
    let t0 = Instant::now();
    let mut c = Coordinator::in_memory(config());
    let job = c.register_job(spec(1, 0), 6).unwrap();
    let s = c.open_session(job, 0, 0, Step(0)).unwrap();
    for step in 0..6 {
        c.acknowledge(s, Step(step)).unwrap();
    }
    c.close_session(s).unwrap();
    // A plain reopen keeps the acknowledged position: nothing left to do.
    let s = c.open_session(job, 0, 0, Step(2)).unwrap();
    assert_eq!(c.acknowledged_position(s).unwrap(), Step(6));
    // A client resuming from an older checkpoint gets steps 2.. again.
    let s = c.open_session_at(job, 0, 0, Step(2), true).unwrap();
    assert_eq!(c.acknowledged_position(s).unwrap(), Step(2));
    c.grant_credits(s, 10).unwrap();
    let w = c.register_worker(t0);
    let steps: Vec<u64> = lease_steps(&mut c, w, 10, t0);
    assert_eq!(steps, [2, 3, 4, 5]);
}

#[test]
fn new_sessions_past_the_cap_are_refused_until_one_closes() {
    let mut c = Coordinator::in_memory(CoordinatorConfig {
        max_sessions: 2,
        ..config()
    });
    let job = c.register_job(spec(1, 1), 10).unwrap();
    let first = c.open_session(job, 0, 0, Step(0)).unwrap();
    c.open_session(job, 0, 1, Step(0)).unwrap();
    // Reopening an open session takes no new place.
    assert_eq!(c.open_session(job, 0, 0, Step(0)).unwrap(), first);
    let refused = c.open_session(job, 0, 2, Step(0)).unwrap_err();
    assert!(
        matches!(refused, CoordinatorError::TooManySessions { limit: 2 }),
        "{refused}"
    );
    assert!(refused.to_string().contains("--max-sessions"), "{refused}");
    c.close_session(first).unwrap();
    c.open_session(job, 0, 2, Step(0)).unwrap();
}

#[test]
fn closed_sessions_and_old_epochs_positions_are_not_kept() {
    let dir = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    let steps = 4;
    let epochs = 40;
    let job = {
        let mut c = Durable::open(dir.path(), config()).unwrap();
        let job = c.register_job(spec(2, 5), steps).unwrap();
        let w = c.core.register_worker(t0);
        for epoch in 0..epochs {
            for rank in 0..2 {
                let s = c.core.open_session(job, rank, epoch, Step(0)).unwrap();
                c.core.grant_credits(s, 4).unwrap();
                // The last epoch stops half-way, the way a run is cut.
                let take = if epoch + 1 == epochs { 2 } else { 4 };
                for lease in c.core.lease(w, take, t0).unwrap() {
                    c.core.complete(w, lease.lease_id).unwrap();
                    c.acknowledge(s, lease.task.step).unwrap();
                }
                c.core.close_session(s).unwrap();
                // A closed session is dropped, yet a late call on it is told it closed.
                assert!(matches!(
                    c.core.grant_credits(s, 1),
                    Err(CoordinatorError::SessionClosed(_))
                ));
            }
        }
        c.flush().unwrap();
        assert_eq!(c.core.sessions.len(), 0);
        // Per rank, the positions of the last two epochs it opened.
        let mut kept: Vec<PositionKey> = c.core.resume_positions.keys().copied().collect();
        kept.sort_unstable();
        let last = epochs - 1;
        assert_eq!(
            kept,
            [
                (job.0, 0, last - 1),
                (job.0, 0, last),
                (job.0, 1, last - 1),
                (job.0, 1, last)
            ]
        );
        assert!(matches!(
            c.core.grant_credits(SessionId(10_000), 1),
            Err(CoordinatorError::UnknownSession(_))
        ));
        job
    };
    // The journal holds the same, and the cut epoch resumes where it stopped.
    let mut c = Durable::open(dir.path(), config()).unwrap();
    assert_eq!(c.core.resume_positions.len(), 4);
    let s = c.core.open_session(job, 1, epochs - 1, Step(0)).unwrap();
    assert_eq!(c.core.acknowledged_position(s).unwrap(), Step(2));
    // An epoch whose position was dropped starts where the client asks.
    let old = c.core.open_session(job, 1, 3, Step(1)).unwrap();
    assert_eq!(c.core.acknowledged_position(old).unwrap(), Step(1));
}

/// Acknowledges steps `from..to` of session `s`.
fn ack(c: &mut Coordinator, s: SessionId, steps: std::ops::Range<u64>) {
    for step in steps {
        c.acknowledge(s, Step(step)).unwrap();
    }
}

/// A core journaling in `dir` that writes acknowledged positions on `flush` (or every 1000).
fn journaled(dir: &std::path::Path) -> Durable {
    let config = CoordinatorConfig {
        journal_every: 1000,
        ..config()
    };
    Durable::open(dir, config).unwrap()
}

/// The position rank 0's session of `job` in `epoch` opens at on a core restarted over `dir`.
fn position_after_restart(dir: &std::path::Path, job: JobId, epoch: u64) -> Step {
    let mut c = journaled(dir);
    let s = c.core.open_session(job, 0, epoch, Step(0)).unwrap();
    c.core.acknowledged_position(s).unwrap()
}

#[test]
fn positions_a_failed_journal_write_carried_are_written_by_the_next_flush() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = journaled(dir.path());
    let job = c.register_job(spec(1, 0), 10).unwrap();
    let s = c.core.open_session(job, 0, 0, Step(0)).unwrap();
    ack(&mut c.core, s, 0..6);
    c.journal().fail_next_write();
    assert!(matches!(c.flush(), Err(CoordinatorError::Journal(_))));
    c.core.close_session(s).unwrap();
    c.flush().unwrap();
    drop(c);
    assert_eq!(position_after_restart(dir.path(), job, 0), Step(6));
}

#[test]
fn the_position_a_session_is_opened_at_is_journaled() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = journaled(dir.path());
    let job = c.register_job(spec(1, 0), 10).unwrap();
    let s = c.core.open_session(job, 0, 0, Step(0)).unwrap();
    ack(&mut c.core, s, 0..6);
    c.flush().unwrap();
    c.core.close_session(s).unwrap();
    // A client resuming from an older checkpoint: the position goes back to 2 and stays there
    // (step 4 acknowledged, 2 and 3 not).
    let s = c.core.open_session_at(job, 0, 0, Step(2), true).unwrap();
    c.acknowledge(s, Step(4)).unwrap();
    c.core.close_session(s).unwrap();
    // A new epoch opened at step 3 holds position 3 with nothing acknowledged.
    c.core.open_session(job, 0, 1, Step(3)).unwrap();
    c.flush().unwrap();
    drop(c);
    assert_eq!(position_after_restart(dir.path(), job, 0), Step(2));
    assert_eq!(position_after_restart(dir.path(), job, 1), Step(3));
}

#[test]
fn a_position_pruned_then_opened_again_before_a_flush_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = journaled(dir.path());
    let job = c.register_job(spec(1, 0), 10).unwrap();
    let s = c.core.open_session(job, 0, 1, Step(0)).unwrap();
    ack(&mut c.core, s, 0..2);
    c.flush().unwrap();
    c.core.close_session(s).unwrap();
    // Opening epoch 3 prunes epoch 1's position; epoch 1 is opened again and goes on.
    let later = c.core.open_session(job, 0, 3, Step(0)).unwrap();
    c.core.close_session(later).unwrap();
    let s = c.core.open_session(job, 0, 1, Step(0)).unwrap();
    ack(&mut c.core, s, 0..3);
    c.core.close_session(s).unwrap();
    c.flush().unwrap();
    drop(c);
    assert_eq!(position_after_restart(dir.path(), job, 1), Step(3));
}

#[test]
fn a_task_its_client_could_not_take_is_requeued_without_its_credit() {
    let t0 = Instant::now();
    let (mut c, _, s, w) = one_session(10, 2, t0);
    let leases = c.lease(w, 2, t0).unwrap();
    assert_eq!(leases.len(), 2);
    // Unclaimed: back in the queue, but the credit is spent; a plain failure gives it back.
    c.fail_unclaimed(w, leases[0].lease_id, "no stream")
        .unwrap();
    assert!(c.lease(w, 2, t0).unwrap().is_empty());
    c.fail(w, leases[1].lease_id, "decode error").unwrap();
    let again = c.lease(w, 2, t0).unwrap();
    assert_eq!(again.len(), 1);
    // The client's new grant (after its reopen) leases the unclaimed step again.
    c.grant_credits(s, 1).unwrap();
    let steps: Vec<u64> = lease_steps(&mut c, w, 2, t0);
    assert_eq!(steps.len(), 1);
    let mut all: Vec<u64> = vec![again[0].task.step.0, steps[0]];
    all.sort_unstable();
    assert_eq!(all, [0, 1]);
}

/// Runs draw their tags at random: two share one with a chance of one in a million, the
/// chance this test fails.
#[test]
fn a_job_id_is_not_given_again_across_restarts_and_lost_journals() {
    let (dir, lost) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = {
        let mut c = Durable::open(dir.path(), config()).unwrap();
        let first = c.register_job(spec(2, 1), 10).unwrap();
        assert_eq!(c.register_job(spec(2, 2), 10).unwrap().0, first.0 + 1);
        first
    };
    // Restarted: the job is there under its id; a new one gets an id of this run's range.
    let mut c = Durable::open(dir.path(), config()).unwrap();
    assert_eq!(c.core.steps_per_epoch(first).unwrap(), 10);
    let later = c.register_job(spec(2, 3), 10).unwrap();
    assert!(
        later.0 >> 32 != first.0 >> 32,
        "{later:?} in the range of {first:?}"
    );
    // A coordinator whose journal was lost gives its first job another id than the lost
    // one's first (a client holding that id is told it is unknown, not served this job).
    let mut fresh = Durable::open(lost.path(), config()).unwrap();
    let other = fresh.register_job(spec(2, 4), 10).unwrap();
    assert_ne!(other, first);
    assert!(matches!(
        fresh.core.steps_per_epoch(first),
        Err(CoordinatorError::UnknownJob(_))
    ));
    // Ids stay exact as JSON numbers (the dashboard's JavaScript).
    for id in [first, later, other] {
        assert!(id.0 < 1 << 52 && id.0 >> 32 != 0, "{id:?}");
    }
    for seed in [0, 1, u64::MAX] {
        let base = run_job_id_base(seed);
        assert!(base >> 32 >= 1 && base < 1 << 52, "{base:#x}");
    }
}

#[test]
fn a_position_write_outside_the_core_keeps_what_moved_meanwhile_and_a_late_one_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = journaled(dir.path());
    let job = c.register_job(spec(1, 0), 10).unwrap();
    let s = c.core.open_session(job, 0, 0, Step(0)).unwrap();
    ack(&mut c.core, s, 0..3);
    let first = c.core.take_positions().expect("position 3 to write");
    // The position moves while the first write is on its way; a second write is taken.
    ack(&mut c.core, s, 3..5);
    let second = c.core.take_positions().expect("position 5 to write");
    ack(&mut c.core, s, 5..6);
    // The second lands first; the first, older, is then skipped rather than written over it.
    let outcome = c.journal().write_positions(&second);
    assert!(matches!(outcome, Ok(true)), "{outcome:?}");
    c.core.positions_written(&second, outcome).unwrap();
    let late = c.journal().write_positions(&first);
    assert!(matches!(late, Ok(false)), "{late:?}");
    c.core.positions_written(&first, late).unwrap();
    assert_eq!(
        c.core.stats().journal_commits,
        2,
        "the job and the second write"
    );
    // Position 6 came after both were taken: the only one left to write.
    let third = c.core.take_positions().expect("position 6 still to write");
    assert_eq!(third.positions, [((job.0, 0, 0), 6)]);
    // A crash now: the journal holds the second write's position.
    drop((c, first, second, third));
    assert_eq!(position_after_restart(dir.path(), job, 0), Step(5));
}

#[test]
fn a_failed_or_abandoned_position_write_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = journaled(dir.path());
    let job = c.register_job(spec(1, 0), 10).unwrap();
    let s = c.core.open_session(job, 0, 0, Step(0)).unwrap();
    ack(&mut c.core, s, 0..4);
    // Taken and never written (a write whose thread went away): the core still has it.
    drop(c.core.take_positions().expect("position 4 to write"));
    let failing = c.core.take_positions().expect("position 4 again");
    c.journal().fail_next_write();
    let outcome = c.journal().write_positions(&failing);
    assert!(matches!(
        c.core.positions_written(&failing, outcome),
        Err(CoordinatorError::Journal(_))
    ));
    assert_eq!(c.core.stats().journal_commits, 1, "the job only");
    drop(failing);
    c.flush().unwrap();
    assert!(
        c.core.take_positions().is_none(),
        "nothing left once landed"
    );
    drop(c);
    assert_eq!(position_after_restart(dir.path(), job, 0), Step(4));
}

#[test]
fn prunes_taken_by_a_write_are_done_once_it_lands_and_later_ones_wait_for_theirs() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = journaled(dir.path());
    let job = c.register_job(spec(2, 0), 10).unwrap();
    for rank in 0..2 {
        let s = c.core.open_session(job, rank, 0, Step(0)).unwrap();
        ack(&mut c.core, s, 0..2);
        c.core.close_session(s).unwrap();
    }
    c.flush().unwrap();
    // Rank 0 opens epoch 2: its epoch 0 position is dropped, and a write takes that drop.
    let s = c.core.open_session(job, 0, 2, Step(0)).unwrap();
    c.core.close_session(s).unwrap();
    let first = c.core.take_positions().expect("a prune to write");
    assert_eq!(first.pruned, [(job.0, 0, 0)]);
    // Rank 1 does the same while the write is on its way.
    let s = c.core.open_session(job, 1, 2, Step(0)).unwrap();
    c.core.close_session(s).unwrap();
    let outcome = c.journal().write_positions(&first);
    c.core.positions_written(&first, outcome).unwrap();
    assert_eq!(
        c.core.pruned_positions,
        [(job.0, 1, 0)],
        "rank 1's drop waits"
    );
    let second = c.core.take_positions().expect("rank 1's prune to write");
    assert_eq!(second.pruned, [(job.0, 1, 0)]);
    let outcome = c.journal().write_positions(&second);
    c.core.positions_written(&second, outcome).unwrap();
    assert!(c.core.pruned_positions.is_empty());
    drop((c, first, second));
    for rank in 0..2 {
        let mut c = journaled(dir.path());
        let s = c.core.open_session(job, rank, 0, Step(0)).unwrap();
        assert_eq!(
            c.core.acknowledged_position(s).unwrap(),
            Step(0),
            "rank {rank}"
        );
    }
}

#[test]
fn a_stall_of_the_coordinators_own_is_not_counted_against_its_workers() {
    let t0 = Instant::now();
    let (mut c, _, _, w) = one_session(10, 1, t0);
    assert_eq!(c.lease(w, 1, t0).unwrap().len(), 1);
    // Eleven seconds (past the 10 s lease timeout) of which the caller was stalled for ten.
    c.excuse_stall(Duration::from_secs(10), at(t0, 11_000));
    assert!(c.expire(at(t0, 11_000)).workers.is_empty());
    assert_eq!(c.stats().leased_tasks, 1, "the lease stands");
    // Never beyond now: a worker silent since is dropped a lease timeout after the excuse.
    c.excuse_stall(Duration::from_secs(60), at(t0, 12_000));
    assert!(c.expire(at(t0, 21_000)).workers.is_empty());
    assert_eq!(c.expire(at(t0, 22_000)).workers, [w]);
}

#[test]
fn a_position_dropped_and_opened_again_while_a_write_was_on_its_way_is_written_after_the_drop() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = journaled(dir.path());
    let job = c.register_job(spec(1, 0), 10).unwrap();
    let s = c.core.open_session(job, 0, 0, Step(0)).unwrap();
    ack(&mut c.core, s, 0..5);
    c.core.close_session(s).unwrap();
    let write = c.core.take_positions().expect("position 5 to write");
    // While it is on its way: epoch 2 drops epoch 0's position, then a resume from an older
    // checkpoint opens epoch 0 again at exactly 5.
    let later = c.core.open_session(job, 0, 2, Step(0)).unwrap();
    c.core.close_session(later).unwrap();
    c.core.open_session_at(job, 0, 0, Step(5), true).unwrap();
    // The write lands with the same value; the drop after it must not be the last word.
    let outcome = c.journal().write_positions(&write);
    c.core.positions_written(&write, outcome).unwrap();
    c.flush().unwrap();
    drop((c, write));
    assert_eq!(position_after_restart(dir.path(), job, 0), Step(5));
}

#[test]
fn a_job_being_written_is_seen_by_nobody_and_its_id_given_to_no_other_registration() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = journaled(dir.path());
    let first = c.core.job_write(spec(1, 1), 10, 0).unwrap();
    let second = c.core.job_write(spec(1, 2), 10, 3).unwrap();
    assert_ne!(first.id(), second.id(), "each write has an id of its own");
    assert!(matches!(
        c.core.job_spec(first.id()),
        Err(CoordinatorError::UnknownJob(_))
    ));
    assert_eq!(
        c.core.jobs().count(),
        0,
        "nothing registered before its write lands"
    );
    // The second lands first; the first fails, and its id is let go with nothing registered.
    let outcome = c.journal().write_job(&second);
    let second_id = c.core.job_written(second, outcome).unwrap();
    c.journal().fail_next_write();
    let (first_id, outcome) = (first.id(), c.journal().write_job(&first));
    assert!(matches!(
        c.core.job_written(first, outcome),
        Err(CoordinatorError::Journal(_))
    ));
    assert!(
        c.core.job_spec(first_id).is_err(),
        "the failed job is not registered"
    );
    assert_eq!(c.core.steps_per_epoch(second_id).unwrap(), 10);
    assert_eq!(
        c.core.job_share(second_id).weight,
        3,
        "the weight it was written with"
    );
    assert_eq!(
        c.core.stats().journal_commits,
        1,
        "the job that landed only"
    );
    drop(c);
    let c = journaled(dir.path());
    let ids: Vec<JobId> = c.core.jobs().map(|(id, _, _)| id).collect();
    assert_eq!(ids, [second_id], "the journal holds the job that landed");
    assert_eq!(c.core.job_share(second_id).weight, 3, "with its weight");
}

#[test]
fn a_weight_is_given_once_its_write_lands_and_kept_when_it_fails() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = journaled(dir.path());
    let job = c.register_job(spec(1, 0), 10).unwrap();
    let write = c.core.weight_write(job, 3).unwrap();
    assert!(write.changes());
    assert_eq!(
        c.core.job_share(job).weight,
        1,
        "not before the write lands"
    );
    c.journal().fail_next_write();
    let outcome = c.journal().write_weight(&write);
    assert!(c.core.weight_written(&write, outcome).is_err());
    assert_eq!(
        c.core.job_share(job).weight,
        1,
        "a failed write gives nothing"
    );
    let write = c.core.weight_write(job, 3).unwrap();
    let outcome = c.journal().write_weight(&write);
    assert_eq!(c.core.weight_written(&write, outcome).unwrap(), 3);
    assert_eq!(c.core.job_share(job).weight, 3);
    assert!(
        !c.core.weight_write(job, 3).unwrap().changes(),
        "nothing to write"
    );
    drop((write, c));
    assert_eq!(
        journaled(dir.path()).core.job_share(job).weight,
        3,
        "journaled"
    );
}

#[test]
fn a_job_with_no_session_open_for_its_retention_is_forgotten_and_its_id_not_given_again() {
    let dir = tempfile::tempdir().unwrap();
    let config = CoordinatorConfig {
        journal_every: 1000,
        job_retention: Some(Duration::from_secs(60)),
        ..config()
    };
    let t0 = Instant::now();
    let mut c = Durable::open(dir.path(), config.clone()).unwrap();
    let busy = c.register_job(spec(1, 1), 10).unwrap();
    let idle = c.register_job(spec(1, 2), 10).unwrap();
    c.set_job_weight(idle, 4).unwrap();
    let open = c.core.open_session(busy, 0, 0, Step(0)).unwrap();
    for epoch in 0..3 {
        let s = c.core.open_session(idle, 0, epoch, Step(0)).unwrap();
        ack(&mut c.core, s, 0..4);
        c.core.close_session(s).unwrap();
    }
    c.flush().unwrap();
    assert!(
        c.core.idle_jobs(t0).is_empty(),
        "sessions opened since the last look"
    );
    assert!(c.core.idle_jobs(t0).is_empty(), "first seen idle now");
    assert!(c.core.idle_jobs(at(t0, 59_999)).is_empty());
    assert_eq!(c.core.idle_jobs(at(t0, 60_000)), [idle]);
    assert_eq!(
        c.core.retire_jobs(&[busy, idle, JobId(u64::MAX)]),
        [idle],
        "a job with a session open stays, an unknown one is passed over"
    );
    assert!(matches!(
        c.core.open_session(idle, 0, 3, Step(0)),
        Err(CoordinatorError::UnknownJob(_))
    ));
    assert_eq!(c.core.stats().jobs_retired, 1);
    assert!(c.core.resume_positions.keys().all(|key| key.0 != idle.0));
    // Its id is not given again, though it was the last one given.
    let next = c.register_job(spec(1, 3), 10).unwrap();
    assert!(next.0 > idle.0, "{next:?} after {idle:?}");
    // The journal forgets it with the next position write (taken outside the core here).
    let write = c.core.take_positions().expect("the retirement to write");
    let outcome = c.journal().write_positions(&write);
    c.core.positions_written(&write, outcome).unwrap();
    assert!(c.core.take_positions().is_none(), "nothing left to write");
    c.core.close_session(open).unwrap();
    c.flush().unwrap();
    drop((write, c));
    let c = Durable::open(dir.path(), config).unwrap();
    let ids: Vec<JobId> = c.core.jobs().map(|(id, _, _)| id).collect();
    assert_eq!(ids, [busy, next]);
    assert!(c.core.resume_positions.keys().all(|key| key.0 != idle.0));
    assert_eq!(c.core.job_share(idle).weight, 1, "its weight is gone");
    assert!(
        c.core.ready.stats(idle.0).is_none(),
        "no share is kept for it"
    );
}

#[test]
fn a_job_whose_session_opens_again_is_idle_afresh_and_no_retention_keeps_every_job() {
    let t0 = Instant::now();
    let mut c = Coordinator::in_memory(CoordinatorConfig {
        job_retention: Some(Duration::from_secs(60)),
        ..config()
    });
    let job = c.register_job(spec(1, 1), 10).unwrap();
    assert!(c.idle_jobs(t0).is_empty());
    let s = c.open_session(job, 0, 0, Step(0)).unwrap();
    assert!(c.idle_jobs(at(t0, 50_000)).is_empty());
    c.close_session(s).unwrap();
    assert!(c.idle_jobs(at(t0, 61_000)).is_empty(), "idle since 61 s");
    // A session opened and closed between two looks counts: idle again from the next look.
    let s = c.open_session(job, 0, 1, Step(0)).unwrap();
    c.close_session(s).unwrap();
    assert!(c.idle_jobs(at(t0, 100_000)).is_empty(), "opened since");
    assert!(c.idle_jobs(at(t0, 101_000)).is_empty(), "idle since 101 s");
    assert!(c.idle_jobs(at(t0, 160_999)).is_empty());
    // A registration handing the job to a client counts too.
    c.job_in_use(job);
    assert!(c.idle_jobs(at(t0, 161_000)).is_empty(), "registered since");
    assert!(c.idle_jobs(at(t0, 162_000)).is_empty(), "idle since 162 s");
    assert_eq!(c.idle_jobs(at(t0, 222_000)), [job]);
    assert_eq!(
        c.retire_jobs(&[job, job]),
        [job],
        "once, though listed twice"
    );
    assert_eq!(c.stats().jobs_retired, 1);
    let mut keeping = Coordinator::in_memory(CoordinatorConfig {
        job_retention: None,
        ..config()
    });
    let job = keeping.register_job(spec(1, 1), 10).unwrap();
    assert!(keeping.idle_jobs(t0).is_empty());
    assert!(keeping.idle_jobs(at(t0, u64::from(u32::MAX))).is_empty());
    assert!(keeping.job_spec(job).is_ok());
}

#[test]
fn a_journaled_core_refuses_the_changes_it_would_not_write_and_writes_what_is_due() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Durable::open(dir.path(), config()).unwrap();
    // The core alone does no I/O: a registration or weight in place would not be durable.
    for refused in [
        c.core.register_job(spec(1, 0), 10).map(|_| ()),
        c.core.set_job_weight(JobId(0), 2).map(|_| ()),
    ] {
        assert!(
            matches!(&refused, Err(CoordinatorError::InvalidArgument(m)) if m.contains("journal")),
            "{refused:?}"
        );
    }
    assert_eq!(c.core.jobs().count(), 0);
    let job = c.register_job(spec(1, 0), 10).unwrap();
    let s = c.core.open_session(job, 0, 0, Step(0)).unwrap();
    // Three acknowledgements: not yet due (every 4); the fourth writes them.
    for step in 0..3 {
        c.acknowledge(s, Step(step)).unwrap();
    }
    assert!(!c.core.write_due());
    assert_eq!(c.core.stats().journal_commits, 1, "the job");
    c.acknowledge(s, Step(3)).unwrap();
    assert_eq!(
        c.core.stats().journal_commits,
        2,
        "the job and the positions"
    );
    assert!(c.core.take_positions().is_none(), "written");
    drop(c);
    assert_eq!(position_after_restart(dir.path(), job, 0), Step(4));
    // A core without a journal has nothing to write, whatever it is asked.
    let mut plain = Coordinator::in_memory(config());
    let job = plain.register_job(spec(1, 0), 10).unwrap();
    let s = plain.open_session(job, 0, 0, Step(0)).unwrap();
    ack(&mut plain, s, 0..8);
    assert!(!plain.write_due() && plain.take_positions().is_none());
}

#[test]
fn jobs_are_found_by_spec_across_restarts_and_retirement() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = journaled(dir.path());
    let a = c.register_job(spec(2, 1), 10).unwrap();
    let b = c.register_job(spec(2, 2), 10).unwrap();
    // The same spec over a dataset that changed: a second job of it.
    let a2 = c.register_job(spec(2, 1), 12).unwrap();
    assert_eq!(c.core.jobs_of_spec(&spec(2, 1)), [(a, 10), (a2, 12)]);
    assert_eq!(c.core.jobs_of_spec(&spec(2, 2)), [(b, 10)]);
    assert!(c.core.jobs_of_spec(&spec(2, 3)).is_empty());
    drop(c);
    let mut c = journaled(dir.path());
    assert_eq!(c.core.jobs_of_spec(&spec(2, 1)), [(a, 10), (a2, 12)]);
    assert_eq!(c.core.retire_jobs(&[a]), [a]);
    assert_eq!(c.core.jobs_of_spec(&spec(2, 1)), [(a2, 12)]);
    assert_eq!(c.core.retire_jobs(&[a2]), [a2]);
    assert!(c.core.jobs_of_spec(&spec(2, 1)).is_empty());
    assert!(!c
        .core
        .jobs_by_spec
        .contains_key(&spec(2, 1).encode_to_vec()));
}

/// A session a worker says is full (its client's stream there has no room for more) is leased
/// none of its steps in that worker's call; the others are, and another worker takes its steps.
#[test]
fn a_session_full_on_one_worker_is_leased_to_the_others() {
    let t0 = Instant::now();
    let mut c = Coordinator::in_memory(config());
    let slow_job = c.register_job(spec(1, 1), 100).unwrap();
    let other_job = c.register_job(spec(1, 2), 100).unwrap();
    let slow = c.open_session(slow_job, 0, 0, Step(0)).unwrap();
    let other = c.open_session(other_job, 0, 0, Step(0)).unwrap();
    c.grant_credits(slow, 4).unwrap();
    c.grant_credits(other, 4).unwrap();
    let (a, b) = (c.register_worker(t0), c.register_worker(t0));
    let mut leases = Vec::new();
    c.lease_into(a, 8, &[slow.0], t0, &mut leases).unwrap();
    let sessions: Vec<SessionId> = leases.iter().map(|l| l.session).collect();
    assert_eq!(sessions, [other; 4]);
    // The one waiting is no work for that worker (its share of a fleet worker counts none).
    assert_eq!(c.waiting_sessions(), 1);
    assert_eq!(c.waiting_sessions_besides(&[slow.0, slow.0]), 0);
    let sessions: Vec<SessionId> = c
        .lease(b, 8, t0)
        .unwrap()
        .iter()
        .map(|l| l.session)
        .collect();
    assert_eq!(sessions, [slow; 4]);
}
