//! The clients' streams a worker delivers into, by session and opening: the open ones, and the
//! sessions whose stream of an opening has closed (their client died, or lost the stream and
//! opens the session again), so deliveries to those come back unclaimed at once.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use stoker_proto::v1::SessionToken;
use tokio::sync::mpsc;

use crate::client_stream::{self, Progress, StallMark};

/// A client stream's session: the coordinator's incarnation, the session's id and its opening
/// (a reopened session's streams are new ones).
pub(super) type Key = (u64, u64, u32);

/// The stream key of the session `token` names.
pub(super) fn key_of(token: &SessionToken) -> Key {
    (token.incarnation, token.session_id, token.opening)
}

/// One open stream: what deliveries send into, how far its client got, and the mark its end
/// reads.
pub(super) struct Subscription {
    pub(super) sender: mpsc::Sender<client_stream::Item>,
    pub(super) progress: Progress,
    pub(super) stalled: StallMark,
}

/// How long a session whose stream closed is remembered as gone, so its deliveries come back
/// unclaimed at once instead of waiting for a stream. Past the coordinator's session timeout
/// its tasks are leased no more; forgotten earlier, a delivery only waits as for a stream not
/// yet opened.
const GONE_KEPT: Duration = Duration::from_secs(600);

/// What a delivery finds for its session.
pub(super) enum Found {
    /// Its open stream, and how far its client got.
    Open(mpsc::Sender<client_stream::Item>, Progress),
    /// Its stream of this opening closed: nothing will take the batch.
    Gone,
    /// No stream yet: its client may be opening one.
    NotYet,
}

/// The clients' streams: open ones by session, and when the sessions whose stream closed were
/// first seen so.
#[derive(Default)]
pub(super) struct Subscriptions {
    pub(super) open: HashMap<Key, Subscription>,
    gone: HashMap<Key, Instant>,
}

impl Subscriptions {
    /// The stream `key`'s client opened, in place of any before it; closed streams are moved
    /// to the gone, and those gone for [`GONE_KEPT`] forgotten.
    pub(super) fn opened(&mut self, key: Key, subscription: Subscription) {
        let now = Instant::now();
        let gone = &mut self.gone;
        self.open.retain(|key, sub| {
            let closed = sub.sender.is_closed();
            if closed {
                gone.insert(*key, now);
            }
            !closed
        });
        gone.retain(|_, since| now.duration_since(*since) < GONE_KEPT);
        gone.remove(&key);
        self.open.insert(key, subscription);
    }

    /// What a delivery to `key` finds.
    pub(super) fn find(&self, key: &Key) -> Found {
        match self.open.get(key) {
            Some(sub) if !sub.sender.is_closed() => {
                Found::Open(sub.sender.clone(), sub.progress.clone())
            }
            Some(_) => Found::Gone,
            None if self.gone.contains_key(key) => Found::Gone,
            None => Found::NotYet,
        }
    }

    /// Ends `key`'s stream, which stalled, if it is still `sender`'s (the client may have
    /// opened a new one meanwhile), marking it so; its client opens the session again (a new
    /// opening, a new stream), so what is still to be delivered on this one is gone. Whether it
    /// did.
    pub(super) fn end_stalled(
        &mut self,
        key: Key,
        sender: &mpsc::Sender<client_stream::Item>,
    ) -> bool {
        let ours = self
            .open
            .get(&key)
            .is_some_and(|sub| sub.sender.same_channel(sender));
        if ours {
            if let Some(sub) = self.open.remove(&key) {
                sub.stalled.set();
            }
            self.gone.insert(key, Instant::now());
        }
        ours
    }
}
