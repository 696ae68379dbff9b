//! What a worker puts on a client's stream for a task (its batch, or the batch's error), each
//! bounded by the worker's delivery timeout (to wait for the stream to open, and for room in its
//! queue while the stream makes no progress): the outcome the coordinator is told (completed, or
//! unclaimed when the client had no stream or took nothing), and the drain's deadline such work
//! is held to.

use std::time::Duration;

use stoker_proto::v1::TaskLease;
use tonic::Status;

use crate::client_stream::{queue, Item, Queued};

use super::subscriptions::Found;
use super::{Outcome, Shared};

/// The drain's deadline once it has started (`None` before): by then the worker has finished,
/// reported and left.
pub(super) type Draining = tokio::sync::watch::Receiver<Option<tokio::time::Instant>>;

/// Sends a batch's error to its client's stream: complete once it is in the stream, unclaimed
/// when the client had no stream or took nothing (the step is tried again for it).
pub(super) async fn send_error(shared: &Shared, task: &TaskLease, status: Status) -> Outcome {
    put_on_stream(shared, task, Err(status), "its error").await
}

/// Delivers a built batch to its client's stream, as [`send_error`] does an error; the wire's
/// form only as it goes onto the stream.
pub(super) async fn deliver(
    shared: &Shared,
    task: &TaskLease,
    batch: stoker_pipeline::Batch,
) -> Outcome {
    put_on_stream(shared, task, Ok(batch.into()), "its batch").await
}

/// Puts `item` (`what` for the task) on the stream of `task`'s session, waiting for it to open
/// and for room in it as [`queue`] does: complete once in the stream, unclaimed when the
/// client had none (or a stale opening's), closed it or took nothing, and then the stream is
/// ended.
async fn put_on_stream(shared: &Shared, task: &TaskLease, item: Item, what: &str) -> Outcome {
    let Some(token) = &task.session else {
        return Outcome::Failed(task.lease_id, "lease without a session".into());
    };
    let key = super::subscriptions::key_of(token);
    let wait = shared.delivery_timeout;
    let session = token.session_id;
    let unclaimed =
        |why: String| Outcome::Unclaimed(task.lease_id, format!("{what} was not taken: {why}"));
    let (sender, progress) = match shared.subscription(key, wait).await {
        Found::Open(sender, progress) => (sender, progress),
        // The client opened its session again (this lease is stale) or ended.
        Found::Gone => {
            return unclaimed(format!(
                "the stream of this opening of session {session} closed (its client opened \
                 the session again, or ended)"
            ))
        }
        Found::NotYet => {
            return unclaimed(format!(
                "no stream from the client of session {session} within {wait:?}"
            ))
        }
    };
    match queue(&sender, &progress, item, wait).await {
        Queued::Done => Outcome::Completed(task.lease_id),
        Queued::Closed => unclaimed(format!("the client of session {session} closed its stream")),
        Queued::Stalled => {
            // Said once per stream: the deliveries waiting beside this one end it too.
            if shared.end_subscription(key, &sender) {
                tracing::warn!(
                    session,
                    waited = ?wait,
                    "client stream sent nothing within the delivery timeout; ending it"
                );
            }
            unclaimed(format!(
                "the client of session {session} read nothing of its stream within {wait:?}; \
                 its stream is ended"
            ))
        }
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
