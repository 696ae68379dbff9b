//! Where a worker puts what it has for a task: room in its client's stream, reserved before
//! the batch is built (at once when the stream has some, else waited for on a task of its own,
//! bounded by the worker's delivery timeout to wait for the stream to open, and for room in its
//! queue while the stream makes no progress); the outcome the coordinator is told (completed, or
//! unclaimed when the client had no stream or took nothing), and the drain's deadline such work
//! is held to.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stoker_proto::v1::TaskLease;

use crate::client_stream::{room, try_room, Item, NoRoom, Room};

use super::subscriptions::{Found, Key};
use super::{Outcome, Shared};

/// The drain's deadline once it has started (`None` before): by then the worker has finished,
/// reported and left.
pub(super) type Draining = tokio::sync::watch::Receiver<Option<tokio::time::Instant>>;

/// What a task's stream has for it now.
pub(super) enum RoomNow {
    /// Room, reserved: the batch may be built.
    Here(Room),
    /// None yet: the stream is not open, or its queue is full.
    Later,
    /// None ever: the task's outcome (no session, or its client's stream closed).
    Never(Outcome),
}

/// A loop's tasks waiting aside for room in their client's stream, by session id: a session
/// with as many as the loop has deliveries is full on this worker, and the loop's lease calls
/// say so (`LeaseRequest.full_sessions`): its coordinator leases the worker none of its steps
/// meanwhile, so they go to other workers, or wait at the coordinator, rather than here.
#[derive(Default)]
pub(super) struct WaitingForRoom(Mutex<HashMap<u64, u32>>);

impl WaitingForRoom {
    /// `task` waits for room until the guard is dropped.
    pub(super) fn enter(self: &Arc<Self>, task: &TaskLease) -> Option<Waiting> {
        let session = task.session.as_ref()?.session_id;
        *super::lock(&self.0).entry(session).or_insert(0) += 1;
        Some(Waiting(Arc::clone(self), session))
    }

    /// The sessions with `most` tasks or more waiting.
    pub(super) fn full(&self, most: u32) -> Vec<u64> {
        let waiting = super::lock(&self.0);
        let full = waiting.iter().filter(|(_, count)| **count >= most);
        full.map(|(session, _)| *session).collect()
    }
}

/// One task waiting for room, counted in its [`WaitingForRoom`] until dropped.
pub(super) struct Waiting(Arc<WaitingForRoom>, u64);

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut waiting = super::lock(&(self.0).0);
        if let Some(count) = waiting.get_mut(&self.1) {
            *count -= 1;
            if *count == 0 {
                waiting.remove(&self.1);
            }
        }
    }
}

/// The session `task` is for, and why its item was not taken (`what` for the task).
struct Target<'a> {
    task: &'a TaskLease,
    key: Key,
    what: &'a str,
}

impl<'a> Target<'a> {
    fn of(task: &'a TaskLease, what: &'a str) -> Result<Self, Outcome> {
        let Some(token) = &task.session else {
            return Err(Outcome::Failed(
                task.lease_id,
                "lease without a session".into(),
            ));
        };
        let key = super::subscriptions::key_of(token);
        Ok(Self { task, key, what })
    }

    fn session(&self) -> u64 {
        self.key.1
    }

    fn unclaimed(&self, why: String) -> Outcome {
        let what = self.what;
        Outcome::Unclaimed(self.task.lease_id, format!("{what} was not taken: {why}"))
    }

    /// The stream of this opening closed: the client opened its session again (this lease is
    /// stale) or ended.
    fn gone(&self) -> Outcome {
        self.unclaimed(format!(
            "the stream of this opening of session {} closed (its client opened the session \
             again, or ended)",
            self.session()
        ))
    }

    fn closed(&self) -> Outcome {
        let session = self.session();
        self.unclaimed(format!("the client of session {session} closed its stream"))
    }
}

/// Room for `task`'s batch in its session's stream now, if there is some.
pub(super) fn room_now(shared: &Shared, task: &TaskLease) -> RoomNow {
    let target = match Target::of(task, "its batch") {
        Ok(target) => target,
        Err(outcome) => return RoomNow::Never(outcome),
    };
    match shared.find_subscription(&target.key) {
        Found::Open(sender, progress) => match try_room(sender, &progress) {
            Ok(room) => RoomNow::Here(room),
            Err(NoRoom::Closed) => RoomNow::Never(target.closed()),
            Err(_) => RoomNow::Later,
        },
        Found::Gone => RoomNow::Never(target.gone()),
        Found::NotYet => RoomNow::Later,
    }
}

/// Room for `task`'s item (`what`) in its session's stream, waiting for the stream to open and
/// for room in it as [`room`] does; or the task's outcome when there is none: unclaimed when
/// the client had no stream (or a stale opening's), closed it or took nothing, and then the
/// stream is ended.
pub(super) async fn room_for(
    shared: &Shared,
    task: &TaskLease,
    what: &str,
) -> Result<Room, Outcome> {
    let target = Target::of(task, what)?;
    let wait = shared.delivery_timeout;
    let session = target.session();
    let (sender, progress) = match shared.subscription(target.key, wait).await {
        Found::Open(sender, progress) => (sender, progress),
        Found::Gone => return Err(target.gone()),
        Found::NotYet => {
            return Err(target.unclaimed(format!(
                "no stream from the client of session {session} within {wait:?}"
            )))
        }
    };
    match room(&sender, &progress, wait).await {
        Ok(room) => Ok(room),
        Err(NoRoom::Stalled) => {
            // Said once per stream: the tasks waiting beside this one end it too.
            if shared.end_subscription(target.key, &sender) {
                tracing::warn!(
                    session,
                    waited = ?wait,
                    "client stream sent nothing within the delivery timeout; ending it"
                );
            }
            Err(target.unclaimed(format!(
                "the client of session {session} read nothing of its stream within {wait:?}; \
                 its stream is ended"
            )))
        }
        Err(_) => Err(target.closed()),
    }
}

/// Puts `item` (a built batch in the wire's form, or its error) in the `room` reserved for
/// `task`: complete, or unclaimed when the client closed the stream while the batch was built.
pub(super) fn put(room: Room, task: &TaskLease, item: Item) -> Outcome {
    if room.send(item) {
        return Outcome::Completed(task.lease_id);
    }
    match Target::of(task, "its batch") {
        Ok(target) => target.closed(),
        Err(outcome) => outcome,
    }
}

/// When deliveries must be done once the drain has started: its deadline less `reserve`.
fn deliveries_due(draining: &Draining, reserve: Duration) -> Option<tokio::time::Instant> {
    draining.borrow().map(|deadline| {
        deadline
            .checked_sub(reserve)
            .unwrap_or_else(tokio::time::Instant::now)
    })
}

/// What `work` gives; `None` once the drain has started and its time for deliveries is up
/// (`work` then not started, or dropped: a wait that began before the drain is bounded too).
pub(super) async fn before_drain_due<T>(
    work: impl std::future::Future<Output = T>,
    mut draining: Draining,
    reserve: Duration,
) -> Option<T> {
    tokio::pin!(work);
    loop {
        if let Some(due) = deliveries_due(&draining, reserve) {
            if tokio::time::Instant::now() >= due {
                return None;
            }
            return tokio::time::timeout_at(due, work).await.ok();
        }
        tokio::select! {
            done = &mut work => return Some(done),
            changed = draining.changed() => {
                if changed.is_err() {
                    // No drain can start any more.
                    return Some(work.await);
                }
            }
        }
    }
}
