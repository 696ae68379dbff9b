//! Remote batches landing in slots as they come off the socket: the worker streams' reader
//! (`stoker_rpc::batch_wire`) copies each tensor's bytes from the HTTP/2 receive buffer
//! straight into the oldest free slot the loader gave, at aligned offsets, so a remote batch
//! costs one copy in user space. Used by the remote source and by `stoker bench transport`,
//! which measures this path (hence public, as `stoker_loader::landing`).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Instant;

use bytes::Bytes;
use stoker_pipeline::Batch;
use stoker_rpc::batch_wire::{BatchReader, Landing, WireBatch};
use tonic::codegen::{Body, StdError};
use tonic::Status;

use super::slots::Slot;

/// Where each tensor of a batch starts in its slot: a multiple of this.
pub const SLOT_ALIGN: usize = 64;

/// Slots for batches not yet arrived, oldest request first, with when each was asked for.
pub type SlotQueue = Mutex<VecDeque<(Slot, Instant)>>;

/// The queue, locked.
pub fn lock(queue: &SlotQueue) -> std::sync::MutexGuard<'_, VecDeque<(Slot, Instant)>> {
    // A panic while the lock was held left the queue whole (push and pop only).
    queue
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Where a worker stream lands a batch's tensors: the oldest free slot, taken when the first
/// tensor's bytes come, each tensor at an aligned offset. A tensor that does not fit keeps a
/// buffer of its own. A slot not handed on (the stream ended inside a message, or nothing
/// landed) goes back to the front of the queue.
struct SlotLanding<'a> {
    queue: &'a SlotQueue,
    slot: Option<(Slot, Instant)>,
    tried: bool,
    used: usize,
}

impl<'a> SlotLanding<'a> {
    fn new(queue: &'a SlotQueue) -> Self {
        SlotLanding {
            queue,
            slot: None,
            tried: false,
            used: 0,
        }
    }

    /// The slot the batch landed in, if any tensor did.
    fn take_slot(&mut self) -> Option<(Slot, Instant)> {
        if self.used == 0 {
            return None;
        }
        self.slot.take()
    }
}

impl Landing for SlotLanding<'_> {
    fn room(&mut self, len: usize) -> Option<(usize, &mut [u8])> {
        if !self.tried {
            self.tried = true;
            self.slot = lock(self.queue).pop_front();
        }
        let (slot, _) = self.slot.as_mut()?;
        let offset = self.used.div_ceil(SLOT_ALIGN) * SLOT_ALIGN;
        let end = offset
            .checked_add(len)
            .filter(|end| *end <= slot.capacity())?;
        self.used = end;
        slot.set_len(end);
        Some((offset, &mut slot.as_mut_slice()[offset..end]))
    }
}

impl Drop for SlotLanding<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            lock(self.queue).push_front(slot);
        }
    }
}

/// The next batch of `reader`, its tensors landed in the oldest free slot of `queue` as their
/// bytes come; a slot not handed on (nothing landed, or the stream failed inside the message)
/// goes back to the queue. `None` once the stream ended with `OK`.
pub async fn next_landed<B>(
    reader: &mut BatchReader<B>,
    queue: &SlotQueue,
) -> Result<Option<Landed>, Status>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<StdError>,
{
    let mut landing = SlotLanding::new(queue);
    let wire = reader.next_batch(&mut landing).await?;
    Ok(wire.map(|wire| Landed {
        wire,
        slot: landing.take_slot(),
    }))
}

/// A batch off a worker stream, and the slot its tensors landed in.
pub struct Landed {
    pub(crate) wire: WireBatch,
    pub(crate) slot: Option<(Slot, Instant)>,
}

impl Landed {
    /// The batch, its landed tensors pointing into the slot, and when its slot was asked for
    /// (none: it landed in no slot).
    pub fn finish(self) -> (Batch, Option<Instant>) {
        let WireBatch { batch, landed } = self.wire;
        let mut batch = Batch::from(batch);
        let Some((slot, asked)) = self.slot else {
            return (batch, None);
        };
        let bytes = slot.into_bytes();
        for (tensor, place) in batch.tensors.iter_mut().zip(landed) {
            if let Some(range) = place {
                tensor.data = bytes.slice(range);
            }
        }
        (batch, Some(asked))
    }

    /// Gives the slot back to `queue` (a batch dropped as a duplicate or another session's).
    pub(crate) fn give_back(self, queue: &SlotQueue) {
        if let Some(slot) = self.slot {
            lock(queue).push_front(slot);
        }
    }
}

/// Copies a batch's tensors into `slot`, each at an aligned offset, and points the tensors
/// there; keeps the batch as it came when it does not fit. The remote client's path before
/// `batch_wire` (a second copy after tonic's), kept as `stoker bench transport`'s baseline.
pub fn land_in_slot(mut batch: Batch, mut slot: Slot) -> Batch {
    let align = |n: usize| n.div_ceil(SLOT_ALIGN) * SLOT_ALIGN;
    let needed: usize = batch.tensors.iter().map(|t| align(t.data.len())).sum();
    if needed > slot.capacity() {
        tracing::debug!(
            needed,
            slot = slot.capacity(),
            "batch larger than its slot; kept in the receive buffer"
        );
        return batch;
    }
    slot.set_len(needed);
    let mut offsets = Vec::with_capacity(batch.tensors.len());
    let buffer = slot.as_mut_slice();
    let mut offset = 0;
    for tensor in &batch.tensors {
        let len = tensor.data.len();
        buffer[offset..offset + len].copy_from_slice(&tensor.data);
        offsets.push((offset, len));
        offset += align(len);
    }
    let bytes = slot.into_bytes();
    for (tensor, (offset, len)) in batch.tensors.iter_mut().zip(offsets) {
        tensor.data = bytes.slice(offset..offset + len);
    }
    batch
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SlotPool;
    use stoker_proto::v1 as proto;
    use stoker_proto::v1::worker_data_client::WorkerDataClient;
    use stoker_proto::v1::worker_data_server::WorkerData;
    use stoker_proto::v1::{
        DescribeJobRequest, DescribeJobResponse, SessionToken, SubscribeRequest, Tensor,
    };
    use stoker_rpc::batch_wire::{self, WorkerDataService};
    use stoker_rpc::security::{ClientSecurity, ServerSecurity};
    use stoker_rpc::transport::{self, MAX_MESSAGE_BYTES};
    use tonic::{Request, Response, Status};

    /// A data server that streams the same batches to every subscriber.
    struct Fixed(Vec<proto::Batch>);

    #[tonic::async_trait]
    impl WorkerData for Fixed {
        async fn describe_job(
            &self,
            _request: Request<DescribeJobRequest>,
        ) -> Result<Response<DescribeJobResponse>, Status> {
            Err(Status::unimplemented("test server"))
        }

        type SubscribeStream = tokio_stream::Iter<std::vec::IntoIter<Result<proto::Batch, Status>>>;

        async fn subscribe(
            &self,
            _request: Request<SubscribeRequest>,
        ) -> Result<Response<Self::SubscribeStream>, Status> {
            let batches: Vec<_> = self.0.iter().cloned().map(Ok).collect();
            Ok(Response::new(tokio_stream::iter(batches)))
        }
    }

    fn batch(step: u64) -> proto::Batch {
        let tensor = |name: &str, len: usize| Tensor {
            name: name.into(),
            dtype: 1,
            shape: vec![len as u64],
            data: (0..len)
                .map(|i| (i as u64 * 31 + step) as u8)
                .collect::<Vec<u8>>()
                .into(),
        };
        proto::Batch {
            step,
            tensors: vec![tensor("image", 300_000), tensor("label", 64)],
            sample_indices: vec![step, step + 1],
            timings: Some(proto::StageTimings::default()),
            ..proto::Batch::default()
        }
    }

    /// The client's path over a real loopback stream: each tensor's bytes end in the slot
    /// (its data pointer inside the slot's memory), copied there once, and tonic's generated
    /// client reads the same stream into the same batches.
    #[test]
    fn remote_batches_land_in_their_slot_with_one_copy() {
        let sent: Vec<proto::Batch> = (0..4).map(batch).collect();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let address = listener.local_addr().expect("address").to_string();
            let server = ServerSecurity::default();
            let incoming = server.incoming(listener);
            tokio::spawn(
                transport::server()
                    .add_service(WorkerDataService::new(
                        Fixed(sent.clone()),
                        MAX_MESSAGE_BYTES,
                    ))
                    .serve_with_incoming(incoming),
            );
            let channel =
                transport::channel(&address, &ClientSecurity::default()).expect("channel");
            let request = SubscribeRequest {
                session: Some(SessionToken::default()),
                job_id: 0,
            };
            let mut reader =
                batch_wire::subscribe(&mut channel.clone(), request, MAX_MESSAGE_BYTES)
                    .await
                    .expect("subscribed");
            // A slot per batch kept, and one for the look past the last.
            let pool = SlotPool::new(400_000, sent.len() + 1);
            let queue = SlotQueue::default();
            let mut received = Vec::new();
            loop {
                let slot = pool.try_take(400_000).expect("a free slot");
                let base = slot.as_ref().as_ptr() as usize;
                lock(&queue).push_back((slot, Instant::now()));
                let Some(landed) = next_landed(&mut reader, &queue).await.expect("a batch") else {
                    break;
                };
                assert!(lock(&queue).is_empty(), "the slot was taken");
                let (batch, asked) = landed.finish();
                assert!(asked.is_some(), "landed in a slot");
                for tensor in &batch.tensors {
                    let at = tensor.data.as_ptr() as usize;
                    assert!(
                        at >= base && at + tensor.data.len() <= base + 400_000,
                        "{} lies outside its slot",
                        tensor.name
                    );
                    assert_eq!((at - base) % SLOT_ALIGN, 0, "aligned");
                }
                received.push(batch);
            }
            let received: Vec<proto::Batch> = received.into_iter().map(Into::into).collect();
            assert_eq!(received, sent);
            let copies = reader.copies();
            let tensor_bytes: usize = sent
                .iter()
                .flat_map(|b| &b.tensors)
                .map(|t| t.data.len())
                .sum();
            assert_eq!(copies.landed, tensor_bytes as u64, "each byte copied once");
            assert_eq!(copies.own, 0);
            drop(received);
            lock(&queue).clear();
            assert_eq!(pool.in_use(), 0, "the slots came back");

            // A plain gRPC client reads what the data server sends.
            let mut client =
                WorkerDataClient::new(channel.clone()).max_decoding_message_size(MAX_MESSAGE_BYTES);
            let mut stream = client
                .subscribe(request)
                .await
                .expect("subscribed")
                .into_inner();
            let mut plain = Vec::new();
            while let Some(batch) = stream.message().await.expect("a batch") {
                plain.push(batch);
            }
            assert_eq!(plain, sent);
        });
    }

    #[test]
    fn a_slot_not_handed_on_goes_back_to_the_queue() {
        let pool = SlotPool::new(1000, 1);
        let queue = SlotQueue::default();
        lock(&queue).push_back((pool.try_take(1000).expect("slot"), Instant::now()));
        let mut landing = SlotLanding::new(&queue);
        assert!(landing.room(600).is_some());
        assert!(landing.room(600).is_none(), "no room left after alignment");
        drop(landing);
        assert_eq!(lock(&queue).len(), 1, "back in the queue");
        // Nothing landed: no slot to hand on, and it stays in the queue.
        let mut landing = SlotLanding::new(&queue);
        assert!(landing.take_slot().is_none());
        drop(landing);
        assert_eq!(lock(&queue).len(), 1);
    }
}
