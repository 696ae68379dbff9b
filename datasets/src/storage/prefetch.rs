//! Reading ahead: a source read from an object store is told which samples come next (the
//! epoch plan's next batches) and a thread of its own brings their byte ranges into the cache
//! while the decode threads work on the current ones. Hints queue up to [`AHEAD`] deep; a hint
//! that finds the queue full is dropped (the samples are then fetched when read), so the reads
//! ahead stay within a bounded distance of the reader. A read of a range the thread is fetching
//! waits for that fetch (the entry's lock) instead of sending a second GET.

use std::ops::Range;
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;

use object_store::ObjectMeta;
use tracing::debug;

use super::cache::ObjectCache;
use super::s3_client::Store;
use super::uri::RemoteLocation;

/// Hints queued at most: two batches ahead of the one being read.
pub(crate) const AHEAD: usize = 2;

/// The ranges of one hint: each object with the ranges wanted from it.
pub(crate) type Hint = Vec<(ObjectMeta, Vec<Range<u64>>)>;

/// The read-ahead thread of one source; it ends when this is dropped.
pub(crate) struct Prefetcher {
    hints: SyncSender<Hint>,
}

impl Prefetcher {
    /// Starts the thread reading through `cache` from `location`.
    pub(crate) fn start(
        cache: Arc<ObjectCache>,
        store: Arc<Store>,
        location: RemoteLocation,
    ) -> std::io::Result<Prefetcher> {
        let (hints, wanted) = sync_channel::<Hint>(AHEAD);
        std::thread::Builder::new()
            .name("stoker-read-ahead".into())
            .spawn(move || {
                for hint in wanted {
                    if let Err(error) = cache.prefetch_ranges(&store, &location, &hint) {
                        // The read itself fetches again and reports the error.
                        debug!(%error, "read-ahead failed");
                    }
                }
            })?;
        Ok(Prefetcher { hints })
    }

    /// Queues `hint` unless [`AHEAD`] hints are already waiting.
    pub(crate) fn hint(&self, hint: Hint) {
        match self.hints.try_send(hint) {
            Ok(()) | Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {}
        }
    }
}
