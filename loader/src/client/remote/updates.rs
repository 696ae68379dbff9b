//! A session's updates to the coordinator (acknowledgements, credits, stats) and their answers:
//! on one long-lived stream per session (`UpdateSessionStream`), or one call each
//! (`UpdateSession`) when the coordinator has no such stream (a build from before it). An update
//! on the stream costs the coordinator no headers and no new HTTP/2 stream, which is most of
//! what a call costs it.
//!
//! Each update carries the version of the workers' list the client holds, so an answer lists
//! the workers only when they changed. On the stream most updates are *quiet*: the coordinator
//! answers them only when the workers changed, so an update costs it a read and no write. An
//! update whose answer the driver needs (once [`ANSWER_AFTER_ACKS`] acknowledgements are on
//! the way, the epoch's last acknowledgements, credits that start the stall clock, a flush
//! before a reopen) asks for one, and waits for it before
//! the next update; its answer, like any, says up to which update the stream is applied (the
//! updates are numbered). When one is due is [`Hold`]'s to say: fewer, fuller updates, since
//! the coordinator's cost per assignment is mostly the updates it takes. [`Hold`] is public as
//! `stoker_loader::session_updates` so `stoker bench coordinator-grpc` simulates clients that
//! hold their updates as the loader does. The session's last update and its close are
//! `close_session`'s.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use stoker_proto::v1::coordinator_client::CoordinatorClient;
use stoker_proto::v1::{
    CloseSessionRequest, SessionUpdateRequest, SessionUpdateResponse, WorkerInfo,
};
use stoker_rpc::transport::RpcChannel;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Code, Status, Streaming};

/// An update sent as a call of its own and not yet answered.
type PendingCall =
    Pin<Box<dyn Future<Output = Result<tonic::Response<SessionUpdateResponse>, Status>> + Send>>;

enum Way {
    /// The session's stream: requests go in `requests`, answers come in order on `answers`.
    Stream {
        requests: mpsc::UnboundedSender<SessionUpdateRequest>,
        answers: Streaming<SessionUpdateResponse>,
    },
    /// A call per update.
    Calls {
        client: CoordinatorClient<RpcChannel>,
        pending: Option<PendingCall>,
    },
}

/// What an answer says.
pub(super) struct Answer {
    /// The live workers when they changed since the list the client held (`None`: unchanged).
    pub(super) workers: Option<Vec<WorkerInfo>>,
}

/// The update channel of one session.
pub(super) struct Updates {
    way: Way,
    /// The version of the workers' list the client holds.
    workers_version: u64,
    /// The number of the last update sent (counted from 1).
    sent: u64,
    /// Updates up to this one are known applied.
    applied: u64,
    /// The update sent not quiet whose answer has not come yet.
    awaited: Option<u64>,
}

impl Updates {
    /// Opens the session's update stream; against a coordinator without one, updates go as
    /// calls. `workers_version` is the version of the list the session opened with.
    pub(super) async fn open(
        client: &CoordinatorClient<RpcChannel>,
        workers_version: u64,
    ) -> Result<Self, Status> {
        let (requests, receiver) = mpsc::unbounded_channel();
        let opened = client
            .clone()
            .update_session_stream(UnboundedReceiverStream::new(receiver))
            .await;
        let way = match opened {
            Ok(answers) => Way::Stream {
                requests,
                answers: answers.into_inner(),
            },
            Err(status) if status.code() == Code::Unimplemented => {
                tracing::debug!(%status, "the coordinator has no update stream; one call per update");
                Way::Calls {
                    client: client.clone(),
                    pending: None,
                }
            }
            Err(status) => return Err(status),
        };
        Ok(Self {
            way,
            workers_version,
            sent: 0,
            applied: 0,
            awaited: None,
        })
    }

    /// Whether answers come unasked (a quiet update's changed workers, an ended stream), so
    /// [`Updates::answer`] is worth waiting on while no update asked for one.
    pub(super) fn listens(&self) -> bool {
        matches!(self.way, Way::Stream { .. })
    }

    /// Sends `request` (its workers' version, number and quietness set here), quiet when
    /// `quiet` and the stream is used. An update not quiet is answered: wait for that
    /// ([`Updates::awaiting`]) before the next one.
    pub(super) fn send(
        &mut self,
        mut request: SessionUpdateRequest,
        quiet: bool,
    ) -> Result<(), Status> {
        self.sent += 1;
        request.workers_version = self.workers_version;
        request.sequence = self.sent;
        request.quiet = quiet && self.listens();
        if !request.quiet {
            // Known applied with its answer at the latest; until then it is the one awaited.
            self.awaited = Some(self.sent);
        }
        match &mut self.way {
            Way::Stream { requests, .. } => requests
                .send(request)
                .map_err(|_| Status::unavailable("the session's update stream is closed")),
            Way::Calls { client, pending } => {
                let mut client = client.clone();
                *pending = Some(Box::pin(
                    async move { client.update_session(request).await },
                ));
                Ok(())
            }
        }
    }

    /// The version of the workers' list the client holds.
    pub(super) fn workers_version(&self) -> u64 {
        self.workers_version
    }

    /// Whether an update that asked for its answer has not had it yet.
    pub(super) fn awaiting(&self) -> bool {
        self.awaited.is_some()
    }

    /// Whether every update sent is known applied.
    pub(super) fn all_applied(&self) -> bool {
        self.applied >= self.sent
    }

    /// The next answer: to the update that asked for one, or to a quiet one that brings the
    /// workers' list. Cancel-safe: dropped before it is ready, the same answer is waited for at
    /// the next call.
    pub(super) async fn answer(&mut self) -> Result<Answer, Status> {
        let answer = match &mut self.way {
            Way::Stream { answers, .. } => answers.message().await?.ok_or_else(|| {
                Status::unavailable("the coordinator ended the session's update stream")
            })?,
            Way::Calls { pending, .. } => {
                let Some(call) = pending.as_mut() else {
                    return Err(Status::internal(
                        "no session update is waiting for its answer",
                    ));
                };
                let answered = call.await;
                *pending = None;
                answered?.into_inner()
            }
        };
        self.applied = applied_after(self.applied, self.sent, answer.sequence);
        if self.awaited.is_some_and(|awaited| self.applied >= awaited) {
            self.awaited = None;
        }
        // A coordinator from before the versions answers 0, with the list every time.
        if answer.workers_version != 0 && answer.workers_version == self.workers_version {
            return Ok(Answer { workers: None });
        }
        self.workers_version = answer.workers_version;
        Ok(Answer {
            workers: Some(answer.workers),
        })
    }
}

/// The updates known applied once an answer numbered `answered` comes, `applied` of the `sent`
/// ones known before. Updates are applied in turn, so those before the one answered are too. A
/// coordinator from before the numbers answers each update, numbered 0.
fn applied_after(applied: u64, sent: u64, answered: u64) -> u64 {
    match answered {
        0 => applied + 1,
        answered => answered.max(applied),
    }
    .min(sent)
}

/// Longest acknowledgements wait alone for credits to go with.
pub const ACKS_ALONE: Duration = Duration::from_millis(200);

/// Acknowledgements that make an update due at once.
pub const ACK_BATCH: usize = 64;

/// Acknowledgements on the way (sent on the stream, not yet known applied) at which an update
/// asks for its answer, so that what a Stop sends again stays at most about this many. Counted,
/// not timed: a job of many slow ranks (16,384 at a few batches a second each) would otherwise
/// have the coordinator answer an update for every other assignment.
pub const ANSWER_AFTER_ACKS: usize = 256;

/// What the session has to send now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending {
    /// Credits wanted (steps asked for, neither granted nor received).
    pub want: u64,
    /// Credits granted and not yet served.
    pub outstanding: u64,
    /// Acknowledgements not yet sent.
    pub acks: usize,
    /// Every step of the epoch has arrived.
    pub all_in: bool,
    /// The session's figures are due for the dashboard.
    pub report: bool,
    /// The workers the client cannot open a stream to changed since the last update.
    pub unreachable_changed: bool,
}

/// What to do with the update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Send it now.
    Now,
    /// Hold it until then (or until something changes).
    At(Instant),
    /// Nothing to send.
    Nothing,
}

/// When a session's update is due. Credits go once half the window is wanted back (the
/// workers still hold the other half), or once the first of them has waited `interval`;
/// acknowledgements ride with credits, or go alone after [`ACKS_ALONE`], when [`ACK_BATCH`]
/// wait, or when the epoch is all in; figures due for the dashboard, and a change of the workers
/// the client cannot reach, go at once.
#[derive(Debug)]
pub struct Hold {
    interval: Duration,
    wanted_since: Option<Instant>,
    acked_since: Option<Instant>,
}

impl Hold {
    /// Credits held up to `interval` while the workers hold more than half the window's.
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            wanted_since: None,
            acked_since: None,
        }
    }

    /// What to do at `now` with what is `pending`.
    pub fn due(&mut self, now: Instant, pending: Pending) -> Due {
        if pending.want == 0 {
            self.wanted_since = None;
        }
        if pending.acks == 0 {
            self.acked_since = None;
        }
        let wanted = (pending.want > 0).then(|| *self.wanted_since.get_or_insert(now));
        let acked = (pending.acks > 0).then(|| *self.acked_since.get_or_insert(now));
        let credits_at = wanted.map(|since| {
            if pending.outstanding <= pending.want {
                now
            } else {
                since + self.interval
            }
        });
        let acks_at = acked.map(|since| {
            if pending.acks >= ACK_BATCH || pending.all_in {
                now
            } else {
                since + ACKS_ALONE
            }
        });
        let at = match (credits_at, acks_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match at {
            _ if pending.report || pending.unreachable_changed => Due::Now,
            Some(at) if at <= now => Due::Now,
            Some(at) => Due::At(at),
            None => Due::Nothing,
        }
    }

    /// The update went: what it carried waits no more.
    pub fn sent(&mut self) {
        self.wanted_since = None;
        self.acked_since = None;
    }
}

/// Sends `last`, the steps received since the last update, when it holds any (the consumer
/// went away with them), then closes its session.
pub(super) async fn close_session(
    client: &mut CoordinatorClient<RpcChannel>,
    last: SessionUpdateRequest,
) {
    let session = last.session;
    if !last.acknowledged.is_empty() {
        let _ = client.update_session(last).await;
    }
    let _ = client.close_session(CloseSessionRequest { session }).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Duration = Duration::from_millis(50);

    fn pending(want: u64, outstanding: u64, acks: usize) -> Pending {
        Pending {
            want,
            outstanding,
            acks,
            all_in: false,
            report: false,
            unreachable_changed: false,
        }
    }

    #[test]
    fn an_answer_says_the_updates_up_to_its_number_are_applied() {
        // Quiet 1 and 2 unanswered, 3 answered: all three applied.
        assert_eq!(applied_after(0, 3, 3), 3);
        // A list brought by quiet update 2 while 3 and 4 are on their way.
        assert_eq!(applied_after(0, 4, 2), 2);
        // Never backwards, never past what was sent.
        assert_eq!(applied_after(3, 4, 2), 3);
        assert_eq!(applied_after(3, 4, 9), 4);
        // A coordinator without the numbers answers each update in turn.
        assert_eq!(applied_after(1, 3, 0), 2);
        assert_eq!(applied_after(3, 3, 0), 3);
    }

    #[test]
    fn credits_wait_while_the_workers_hold_more_than_half_the_window() {
        let start = Instant::now();
        let mut hold = Hold::new(INTERVAL);
        // A window of 8: one wanted back, seven with the workers.
        assert_eq!(hold.due(start, pending(1, 7, 1)), Due::At(start + INTERVAL));
        // More wanted meanwhile: still held from the first one's time.
        let later = start + Duration::from_millis(30);
        assert_eq!(hold.due(later, pending(3, 5, 3)), Due::At(start + INTERVAL));
        // Half the window wanted back: at once.
        assert_eq!(hold.due(later, pending(4, 4, 4)), Due::Now);
        // Or the first one waited out the interval.
        assert_eq!(hold.due(start + INTERVAL, pending(1, 7, 1)), Due::Now);
        // Nothing with the workers: at once.
        let mut hold = Hold::new(INTERVAL);
        assert_eq!(hold.due(start, pending(1, 0, 0)), Due::Now);
    }

    #[test]
    fn acknowledgements_ride_with_credits_or_go_alone_later() {
        let start = Instant::now();
        let mut hold = Hold::new(INTERVAL);
        assert_eq!(
            hold.due(start, pending(0, 8, 1)),
            Due::At(start + ACKS_ALONE)
        );
        assert_eq!(hold.due(start + ACKS_ALONE, pending(0, 8, 5)), Due::Now);
        // Many, or the epoch all in: at once.
        let mut hold = Hold::new(INTERVAL);
        assert_eq!(hold.due(start, pending(0, 8, ACK_BATCH)), Due::Now);
        let all_in = Pending {
            all_in: true,
            ..pending(0, 0, 1)
        };
        assert_eq!(Hold::new(INTERVAL).due(start, all_in), Due::Now);
        // Credits wanted meanwhile take them along at the credits' time.
        let mut hold = Hold::new(INTERVAL);
        assert_eq!(
            hold.due(start, pending(0, 8, 1)),
            Due::At(start + ACKS_ALONE)
        );
        let later = start + Duration::from_millis(10);
        assert_eq!(hold.due(later, pending(1, 7, 2)), Due::At(later + INTERVAL));
    }

    #[test]
    fn what_was_sent_waits_no_more() {
        let start = Instant::now();
        let mut hold = Hold::new(INTERVAL);
        assert_eq!(hold.due(start, pending(1, 7, 1)), Due::At(start + INTERVAL));
        hold.sent();
        let later = start + Duration::from_millis(40);
        assert_eq!(hold.due(later, pending(1, 7, 0)), Due::At(later + INTERVAL));
        assert_eq!(hold.due(later, pending(0, 8, 0)), Due::Nothing);
        // Figures for the dashboard go at once, with whatever waits.
        let report = Pending {
            report: true,
            ..pending(0, 8, 0)
        };
        assert_eq!(hold.due(later, report), Due::Now);
        // So does a change of the workers the client cannot reach.
        let unreachable = Pending {
            unreachable_changed: true,
            ..pending(0, 8, 0)
        };
        assert_eq!(hold.due(later, unreachable), Due::Now);
    }
}
