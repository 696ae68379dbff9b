//! One client's batch stream on the worker (`WorkerData.Subscribe`): the queue deliveries go
//! into, the stream the data server sends from (counting the batches it takes), and the watch
//! that tells when the client stopped taking them.
//!
//! A stream's [`Progress`] counts the batches the data server took from its queue and the data
//! frames it sent of them (at most 1 MiB each: HTTP/2 asks for the next only as the client's
//! window has room), so a client reading a large batch slowly over a slow link is seen reading
//! all along. A task's batch is built once [`Room`] for it is reserved in the queue: a task
//! waits for room in a full queue for as long as the stream makes progress, and ends the stream
//! once it made none for the delivery timeout with a batch waiting in it ([`room`]; rooms whose
//! batches are still being built are not the client's to take). That alone misses a stream
//! whose queue is not full: a client that granted fewer credits than the queue holds, or whose
//! session closed before the worker filled it, never has a task waiting on it, and would keep
//! its queued batches for as long as its connection lives. The [`StallWatch`] closes that gap: a
//! stream that holds a batch and makes no progress for the delivery timeout is stalled, whether
//! or not a task is waiting.
//!
//! A stream ended for a stall ([`StallMark::set`]) does not end cleanly: after the batches
//! already queued it says `UNAVAILABLE`, so its client opens its session again. Deliveries it
//! did not take went back to the coordinator with their credits spent (a client gone is leased
//! no more), and only a new session grants them again; a client that just opened a new stream
//! would wait for them until its stall watch. A stream the drain ends ends cleanly.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use stoker_proto::v1::Batch;
use stoker_rpc::batch_wire::FramesSent;
use tokio::sync::mpsc;
use tonic::Status;

/// What travels on a client stream.
pub(super) type Item = std::result::Result<Batch, Status>;

/// How far a client stream got (the batches the data server took from its queue and the data
/// frames it sent of them, one count), and the rooms reserved in its queue for batches still
/// being built.
#[derive(Debug, Clone, Default)]
pub(super) struct Progress {
    moved: Arc<AtomicU64>,
    reserved: Arc<AtomicUsize>,
}

impl Progress {
    fn now(&self) -> u64 {
        self.moved.load(Ordering::Relaxed)
    }

    /// The count the data server's body adds its frames to.
    pub(super) fn frames_sent(&self) -> FramesSent {
        FramesSent(Arc::clone(&self.moved))
    }

    /// What waits in the queue of `sender`'s stream for its client: the rooms reserved for
    /// batches still being built are not counted.
    fn queued(&self, sender: &mpsc::Sender<Item>) -> usize {
        let taken = sender.max_capacity() - sender.capacity();
        taken.saturating_sub(self.reserved.load(Ordering::Acquire))
    }
}

/// Room for one item in a stream's queue, reserved before its batch is built: a worker builds a
/// batch once its stream can take it, so the batches it holds for a client are those in the
/// client's queue and those being built. Dropped unsent, the room is free again.
pub(super) struct Room {
    permit: Option<mpsc::OwnedPermit<Item>>,
    reserved: Arc<AtomicUsize>,
}

impl Room {
    fn new(permit: mpsc::OwnedPermit<Item>, progress: &Progress) -> Self {
        progress.reserved.fetch_add(1, Ordering::AcqRel);
        Self {
            permit: Some(permit),
            reserved: Arc::clone(&progress.reserved),
        }
    }

    /// Puts `item` in the room: it waits in the queue for the data server. Whether the stream
    /// was still open (its client may have closed it while the batch was built: the item is
    /// then dropped).
    pub(super) fn send(mut self, item: Item) -> bool {
        self.permit
            .take()
            .is_some_and(|permit| !permit.send(item).is_closed())
    }
}

impl Drop for Room {
    fn drop(&mut self) {
        drop(self.permit.take());
        self.reserved.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The stream the data server answers `Subscribe` with: the receiving end of the stream's
/// queue, counting what the server takes from it; once the queue is done, the stall's status
/// if the stream was ended for one.
pub struct ClientStream {
    receiver: mpsc::Receiver<Item>,
    progress: Progress,
    stalled: StallMark,
    /// The queue is done (and the stall's status, if any, said).
    done: bool,
}

impl tokio_stream::Stream for ClientStream {
    type Item = Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match this.receiver.poll_recv(cx) {
            Poll::Ready(Some(item)) => {
                this.progress.moved.fetch_add(1, Ordering::Relaxed);
                Poll::Ready(Some(item))
            }
            Poll::Ready(None) => {
                this.done = true;
                Poll::Ready(this.stalled.0.load(Ordering::Acquire).then(|| {
                    Err(Status::unavailable(
                        "this worker ended the stream: it sent nothing within the worker's \
                         delivery timeout, and the batches it did not take went back to the \
                         coordinator; open the session again",
                    ))
                }))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl ClientStream {
    /// The stream's progress, which deliveries and the watch read.
    pub(super) fn progress(&self) -> Progress {
        self.progress.clone()
    }
}

/// Why a stream has no room for a task's item.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum NoRoom {
    /// Its queue is full now ([`try_room`]).
    Full,
    /// The client closed the stream.
    Closed,
    /// The queue stayed full and the stream made no progress for the whole wait, with an item
    /// waiting in it for the client ([`room`]).
    Stalled,
}

/// Room in the queue of `sender`'s stream now, if it has any.
pub(super) fn try_room(sender: mpsc::Sender<Item>, progress: &Progress) -> Result<Room, NoRoom> {
    match sender.try_reserve_owned() {
        Ok(permit) => Ok(Room::new(permit, progress)),
        Err(mpsc::error::TrySendError::Full(_)) => Err(NoRoom::Full),
        Err(mpsc::error::TrySendError::Closed(_)) => Err(NoRoom::Closed),
    }
}

/// Room in the queue of `sender`'s stream, waiting while it is full for as long as the stream's
/// `progress` moves within each `wait`, or while only rooms whose batches are being built fill
/// it: a client reading a large batch slowly is waited for, one that stopped reading is not.
pub(super) async fn room(
    sender: &mpsc::Sender<Item>,
    progress: &Progress,
    wait: Duration,
) -> Result<Room, NoRoom> {
    // One wait for room throughout, so it keeps its place in line behind the waits that came
    // first.
    let reserve = sender.clone().reserve_owned();
    tokio::pin!(reserve);
    loop {
        let before = progress.now();
        match tokio::time::timeout(wait, &mut reserve).await {
            Ok(Ok(permit)) => return Ok(Room::new(permit, progress)),
            Ok(Err(_)) => return Err(NoRoom::Closed),
            Err(_) if progress.now() != before || progress.queued(sender) == 0 => {}
            Err(_) => return Err(NoRoom::Stalled),
        }
    }
}

/// Set on a stream ended for a stall, before its last sender goes: its end then says so.
#[derive(Clone, Default)]
pub(super) struct StallMark(Arc<AtomicBool>);

impl StallMark {
    pub(super) fn set(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Watches one stream for a client that stopped taking batches. It holds no sender, so it
/// never keeps an ended stream open.
pub(super) struct StallWatch {
    sender: mpsc::WeakSender<Item>,
    progress: Progress,
}

/// A stream of `capacity` queued batches: the sender deliveries use, the stream the server
/// sends from, its watch, and the mark that says it was ended for a stall.
pub(super) fn client_stream(
    capacity: usize,
) -> (mpsc::Sender<Item>, ClientStream, StallWatch, StallMark) {
    let (sender, receiver) = mpsc::channel(capacity);
    let progress = Progress::default();
    let watch = StallWatch {
        sender: sender.downgrade(),
        progress: progress.clone(),
    };
    let stalled = StallMark::default();
    let stream = ClientStream {
        receiver,
        progress,
        stalled: stalled.clone(),
        done: false,
    };
    (sender, stream, watch, stalled)
}

impl StallWatch {
    /// Resolves with a sender of the stream once it has held at least one batch and made no
    /// progress for `timeout` (checked every quarter of it, so within 1.5 x `timeout`), or with
    /// `None` once the stream is gone: every sender dropped (it ended) or the client closed it.
    pub(super) async fn stalled(self, timeout: Duration) -> Option<mpsc::Sender<Item>> {
        let tick = (timeout / 4).max(Duration::from_millis(1));
        let mut last = self.progress.now();
        let mut stalled_since = None;
        loop {
            tokio::time::sleep(tick).await;
            let sender = self.sender.upgrade()?;
            if sender.is_closed() {
                return None;
            }
            let now = self.progress.now();
            let queued = self.progress.queued(&sender);
            if queued == 0 || now != last {
                last = now;
                stalled_since = None;
                continue;
            }
            // Seen now with a batch queued and no progress since the last look: the stall
            // began no later than this.
            let since = *stalled_since.get_or_insert_with(tokio::time::Instant::now);
            if since.elapsed() >= timeout {
                return Some(sender);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt;

    use super::*;

    const TIMEOUT: Duration = Duration::from_millis(200);

    fn batch(step: u64) -> Item {
        Ok(Batch {
            step,
            ..Batch::default()
        })
    }

    /// Puts `item` in the queue of `sender`'s stream once it has room for it, as a task does.
    async fn queue(
        sender: &mpsc::Sender<Item>,
        progress: &Progress,
        item: Item,
        wait: Duration,
    ) -> Result<(), NoRoom> {
        room(sender, progress, wait)
            .await
            .map(|room| assert!(room.send(item), "the stream is open"))
    }

    #[tokio::test]
    async fn a_stream_holding_a_batch_it_never_takes_is_stalled() {
        let (sender, _stream, watch, _) = client_stream(8);
        // One batch, far fewer than the queue holds: no delivery ever waits on this stream.
        sender.send(batch(0)).await.unwrap();
        let started = std::time::Instant::now();
        // 1.5 x the timeout at most, with room for a loaded machine.
        let stalled = tokio::time::timeout(TIMEOUT * 10, watch.stalled(TIMEOUT)).await;
        let stalled = stalled.expect("the watch fires");
        assert!(stalled.is_some_and(|s| s.same_channel(&sender)));
        assert!(started.elapsed() >= TIMEOUT, "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn a_stream_that_keeps_taking_or_holds_nothing_is_not_stalled() {
        let (sender, mut stream, watch, _) = client_stream(8);
        let watch = tokio::spawn(watch.stalled(TIMEOUT));
        // Nothing queued for a while, then batches taken as they come.
        tokio::time::sleep(TIMEOUT * 2).await;
        for step in 0..8 {
            sender.send(batch(step)).await.unwrap();
            tokio::time::sleep(TIMEOUT / 4).await;
            assert_eq!(stream.next().await.unwrap().unwrap().step, step);
        }
        assert!(
            !watch.is_finished(),
            "a stream that takes its batches stalled"
        );
        // Ended: the watch lets go, and the stream still yields nothing more.
        drop(sender);
        assert!(watch.await.unwrap().is_none());
        assert!(stream.next().await.is_none());
    }

    #[tokio::test]
    async fn a_stream_sending_a_large_batch_slowly_is_not_stalled_and_waited_for() {
        let (sender, mut stream, watch, _) = client_stream(1);
        let progress = stream.progress();
        let frames = progress.frames_sent();
        let watch = tokio::spawn(watch.stalled(TIMEOUT));
        sender.send(batch(0)).await.unwrap();
        // The server takes batch 0 and sends it in frames, one every half timeout, for four
        // timeouts, while batch 1 waits in the queue and batch 2 for room in it.
        assert_eq!(stream.next().await.unwrap().unwrap().step, 0);
        sender.send(batch(1)).await.unwrap();
        let waiting = tokio::spawn({
            let (sender, progress) = (sender.clone(), progress.clone());
            async move { queue(&sender, &progress, batch(2), TIMEOUT).await }
        });
        for _ in 0..8 {
            tokio::time::sleep(TIMEOUT / 2).await;
            frames.0.fetch_add(1, Ordering::Relaxed);
        }
        assert!(!watch.is_finished(), "a stream sending frames stalled");
        assert!(
            !waiting.is_finished(),
            "a delivery gave up on a stream sending frames"
        );
        assert_eq!(stream.next().await.unwrap().unwrap().step, 1);
        assert_eq!(waiting.await.unwrap(), Ok(()));
        assert_eq!(stream.next().await.unwrap().unwrap().step, 2);
        // Then no frame, with a batch waiting for room: the delivery gives up, and the watch
        // fires.
        sender.send(batch(3)).await.unwrap();
        let started = tokio::time::Instant::now();
        let stuck = queue(&sender, &progress, batch(4), TIMEOUT).await;
        assert_eq!(stuck, Err(NoRoom::Stalled));
        assert!(started.elapsed() >= TIMEOUT);
        let stalled = tokio::time::timeout(TIMEOUT * 10, watch).await;
        assert!(stalled.expect("the watch fires").unwrap().is_some());
        drop(stream);
        let closed = queue(&sender, &progress, batch(5), TIMEOUT).await;
        assert_eq!(closed, Err(NoRoom::Closed));
    }

    #[tokio::test]
    async fn rooms_whose_batches_are_being_built_are_no_stall() {
        let (sender, mut stream, watch, _) = client_stream(2);
        let progress = stream.progress();
        let watch = tokio::spawn(watch.stalled(TIMEOUT));
        // Both rooms reserved, their batches built for longer than the timeout: the queue is
        // full, but nothing in it waits for the client.
        let first = try_room(sender.clone(), &progress).expect("room");
        let second = room(&sender, &progress, TIMEOUT).await.expect("room");
        assert_eq!(
            try_room(sender.clone(), &progress).err(),
            Some(NoRoom::Full)
        );
        let third = tokio::spawn({
            let (sender, progress) = (sender.clone(), progress.clone());
            async move { room(&sender, &progress, TIMEOUT).await }
        });
        tokio::time::sleep(TIMEOUT * 3).await;
        assert!(!watch.is_finished(), "rooms being built stalled the stream");
        assert!(
            !third.is_finished(),
            "a wait behind rooms being built gave up"
        );
        // A batch is built and waits for the client, which takes nothing: the wait for room
        // gives up, and the watch fires.
        assert!(first.send(batch(0)));
        let third = tokio::time::timeout(TIMEOUT * 10, third).await;
        let third = third.expect("the wait gives up").unwrap();
        assert_eq!(third.err(), Some(NoRoom::Stalled));
        let stalled = tokio::time::timeout(TIMEOUT * 10, watch).await;
        assert!(stalled.expect("the watch fires").unwrap().is_some());
        // A room let go unsent is free again; the batch sent is there to take.
        assert_eq!(
            try_room(sender.clone(), &progress).err(),
            Some(NoRoom::Full)
        );
        drop(second);
        let fourth = try_room(sender.clone(), &progress).expect("room again");
        assert_eq!(stream.next().await.unwrap().unwrap().step, 0);
        // The client closes the stream while a batch is built: its room says it was not taken.
        drop(stream);
        assert!(!fourth.send(batch(1)));
    }

    #[tokio::test]
    async fn the_watch_ends_with_the_stream() {
        let (sender, stream, watch, _) = client_stream(8);
        sender.send(batch(0)).await.unwrap();
        drop(stream);
        let ended = tokio::time::timeout(TIMEOUT * 10, watch.stalled(TIMEOUT)).await;
        assert!(ended
            .expect("the watch ends when the client closes")
            .is_none());
    }

    #[tokio::test]
    async fn a_stream_ended_for_a_stall_says_so_after_its_queue_and_a_drained_one_ends_cleanly() {
        for stall in [true, false] {
            let (sender, mut stream, _watch, mark) = client_stream(8);
            sender.send(batch(0)).await.unwrap();
            sender.send(batch(1)).await.unwrap();
            if stall {
                mark.set();
            }
            drop(sender);
            for step in 0..2 {
                assert_eq!(stream.next().await.unwrap().unwrap().step, step);
            }
            if stall {
                let status = stream.next().await.unwrap().unwrap_err();
                assert_eq!(status.code(), tonic::Code::Unavailable);
                assert!(
                    status.message().contains("open the session again"),
                    "{status}"
                );
            }
            assert!(stream.next().await.is_none(), "stall: {stall}");
            assert!(stream.next().await.is_none(), "stall: {stall}");
        }
    }
}
