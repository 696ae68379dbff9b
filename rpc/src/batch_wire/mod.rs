//! `WorkerData.Subscribe` on the wire, both ends, without tonic's message buffers.
//!
//! tonic's codec encodes each message into one buffer (a copy of every tensor byte on the
//! worker) and, on the client, gathers each message into one buffer before decoding it (another
//! copy, into memory that grows and is allocated afresh per message); the client then copied
//! the bytes once more into the slot the batch is handed out from. The messages here are the
//! same protobuf `Batch` in the same gRPC framing, so any gRPC peer reads them, but:
//!
//! - **sending** ([`WorkerDataService`], [`BatchStreamBody`]): a batch becomes a list of chunks,
//!   the framing and small fields in one and each tensor's bytes as the batch's own `Bytes`, which
//!   HTTP/2 writes to the socket from where they lie, in frames of at most [`SEND_SLICE`] (slices,
//!   no copy) that a [`FramesSent`] counts as the client reads;
//! - **receiving** ([`subscribe`], [`BatchReader`]): the body's frames are parsed as they arrive,
//!   and each tensor's bytes are copied once, from the HTTP/2 receive buffer straight into the
//!   place a [`Landing`] gives (the client's slot).
//!
//! Fields are written in a different order than prost writes them (tensor bytes last within a
//! tensor, tensors after the other fields of the batch); protobuf readers take fields in any
//! order, and the reader here does too.

/// The path of `WorkerData.Subscribe`.
pub const SUBSCRIBE_PATH: &str = "/stoker.v1.WorkerData/Subscribe";

/// `Batch.tensors` and `Tensor.data`, as numbered in `batch.proto`.
const TENSORS_FIELD: u32 = 4;
const DATA_FIELD: u32 = 4;

/// Tensor bytes shorter than this are copied into the framing chunk: a chunk of their own
/// would cost more than the copy.
const INLINE_BELOW: usize = 4096;

/// The gRPC message prefix: a compression flag and the length.
const PREFIX_BYTES: usize = 5;

/// A subscribe request larger than this is refused (it holds a session token and a job id).
const MAX_REQUEST_BYTES: usize = 64 << 10;

mod receive;
mod send;

pub use receive::{
    subscribe, BatchReader, BufferLanding, ChunkBody, CopyCounts, Landing, OwnBuffers, WireBatch,
};
pub use send::{encode_batch, BatchStreamBody, FramesSent, WorkerDataService, SEND_SLICE};

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::send::trailers_of;
    use super::*;
    use bytes::{Bytes, BytesMut};
    use proptest::prelude::*;
    use prost::Message;
    use stoker_proto::v1::{BadSample, StageTimings};
    use stoker_proto::v1::{Batch, Tensor};
    use tonic::codegen::http::HeaderMap;
    use tonic::{Code, Status};

    fn ok_trailers() -> HeaderMap {
        trailers_of(&Status::new(Code::Ok, ""))
    }

    fn sample_batch(sizes: &[usize], step: u64) -> Batch {
        Batch {
            epoch: 3,
            rank: 1,
            step,
            tensors: sizes
                .iter()
                .enumerate()
                .map(|(i, &size)| Tensor {
                    name: format!("t{i}"),
                    dtype: i as i32 % 3,
                    shape: vec![size as u64],
                    data: (0..size)
                        .map(|b| (b * 7 + i) as u8)
                        .collect::<Vec<u8>>()
                        .into(),
                })
                .collect(),
            sample_indices: (0..5).map(|i| i * 1000 + step).collect(),
            timings: Some(StageTimings {
                read_ns: 1,
                decode_ns: 2,
                augment_ns: 3,
                assemble_ns: 4,
                transfer_ns: 5,
            }),
            bad_samples: vec![BadSample {
                sample_index: 9,
                path: "a/b.jpg".into(),
                reason: "truncated".into(),
                substitute_index: 10,
            }],
            dropped_tokens: 17,
        }
    }

    /// The bytes of `chunks` cut again at `cuts` (fractions of the whole), as frames might come.
    fn recut(chunks: &[Bytes], cuts: &[f64]) -> VecDeque<Bytes> {
        let whole: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        let whole = Bytes::from(whole);
        let mut points: Vec<usize> = cuts
            .iter()
            .map(|f| (f * whole.len() as f64) as usize)
            .collect();
        points.extend([0, whole.len()]);
        points.sort_unstable();
        points.dedup();
        points.windows(2).map(|w| whole.slice(w[0]..w[1])).collect()
    }

    fn read_all(
        chunks: VecDeque<Bytes>,
        trailers: Option<HeaderMap>,
        capacity: usize,
    ) -> (Vec<Result<Batch, Status>>, CopyCounts) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let mut reader = BatchReader::new(ChunkBody::new(chunks, trailers), 64 << 20);
            let mut out = Vec::new();
            loop {
                let mut landing = BufferLanding::new(capacity);
                match reader.next_batch(&mut landing).await {
                    Ok(Some(WireBatch { mut batch, landed })) => {
                        for (tensor, place) in batch.tensors.iter_mut().zip(landed) {
                            if let Some(range) = place {
                                tensor.data = Bytes::copy_from_slice(&landing.buffer[range]);
                            }
                        }
                        out.push(Ok(batch));
                    }
                    Ok(None) => break,
                    Err(status) => {
                        out.push(Err(status));
                        break;
                    }
                }
            }
            (out, reader.copies())
        })
    }

    #[test]
    fn encoded_chunks_are_protobuf_and_send_tensor_bytes_from_their_buffer() {
        let batch = sample_batch(&[100_000, 10, 0, 5000], 7);
        let big = batch.tensors[0].data.clone();
        let chunks = encode_batch(batch.clone(), 1 << 20).expect("fits");
        // The big tensors' bytes are chunks of their own, the batch's buffers themselves.
        assert!(chunks
            .iter()
            .any(|c| c.as_ptr() == big.as_ptr() && c.len() == big.len()));
        assert!(chunks.iter().any(|c| c.len() == 5000));
        let whole: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        assert_eq!(whole[0], 0, "uncompressed");
        let len = u32::from_be_bytes([whole[1], whole[2], whole[3], whole[4]]) as usize;
        assert_eq!(len, whole.len() - PREFIX_BYTES);
        assert_eq!(len, batch.encoded_len(), "the length prost would give");
        assert_eq!(
            Batch::decode(&whole[PREFIX_BYTES..]).expect("protobuf"),
            batch
        );
        // Over the limit: refused by name.
        let refused = encode_batch(batch, 1000).expect_err("too large");
        assert_eq!(refused.code(), Code::ResourceExhausted);
    }

    #[test]
    fn the_reader_lands_tensors_once_and_reads_prost_framing_too() {
        let batches: Vec<Batch> = (0..3).map(|s| sample_batch(&[70_000, 3, 0], s)).collect();
        let ours: Vec<Bytes> = batches
            .iter()
            .flat_map(|b| encode_batch(b.clone(), 1 << 20).expect("fits"))
            .collect();
        let (read, copies) = read_all(
            recut(&ours, &[0.1, 0.5, 0.51]),
            Some(ok_trailers()),
            1 << 20,
        );
        let read: Vec<Batch> = read.into_iter().map(|r| r.expect("ok")).collect();
        assert_eq!(read, batches);
        assert_eq!(copies.landed, 3 * 70_003, "every tensor byte landed once");
        assert_eq!(copies.own, 0);
        assert!(copies.fields < 3 * 200, "{copies:?}");
        // prost's own encoding (fields in number order) reads the same.
        let prost: Vec<Bytes> = batches
            .iter()
            .map(|b| {
                let mut framed = vec![0u8];
                framed.extend((b.encoded_len() as u32).to_be_bytes());
                framed.extend(b.encode_to_vec());
                Bytes::from(framed)
            })
            .collect();
        let (again, _) = read_all(recut(&prost, &[0.3]), Some(ok_trailers()), 1 << 20);
        assert_eq!(
            again
                .into_iter()
                .map(|r| r.expect("ok"))
                .collect::<Vec<_>>(),
            batches
        );
        // No room in the landing: buffers of their own, same batches.
        let (own, copies) = read_all(recut(&ours, &[]), Some(ok_trailers()), 0);
        assert_eq!(
            own.into_iter().map(|r| r.expect("ok")).collect::<Vec<_>>(),
            batches
        );
        assert_eq!((copies.landed, copies.own), (0, 3 * 70_003));
    }

    #[test]
    fn a_stream_that_fails_or_breaks_says_so() {
        let chunks = encode_batch(sample_batch(&[10_000], 0), 1 << 20).expect("fits");
        let code_of = |chunks: VecDeque<Bytes>, trailers: Option<HeaderMap>| {
            let (read, _) = read_all(chunks, trailers, 1 << 20);
            read.last().and_then(|r| r.as_ref().err()).map(Status::code)
        };
        // The worker's error in the trailers, after a whole batch.
        let failed = trailers_of(&Status::failed_precondition("bad sample"));
        assert_eq!(
            code_of(chunks.iter().cloned().collect(), Some(failed)),
            Some(Code::FailedPrecondition)
        );
        // Cut inside a message: its status, or a malformed-message error without one.
        let cut: VecDeque<Bytes> = recut(&chunks, &[0.5]).into_iter().take(1).collect();
        let reset = trailers_of(&Status::unavailable("gone"));
        assert_eq!(code_of(cut.clone(), Some(reset)), Some(Code::Unavailable));
        assert_eq!(code_of(cut, None), Some(Code::Unknown));
        // No trailers after whole messages: the status is unknown, as tonic says.
        assert_eq!(
            code_of(chunks.iter().cloned().collect(), None),
            Some(Code::Unknown)
        );
        // A compressed message, and one over the limit.
        let mut compressed = chunks.clone();
        let mut first = BytesMut::from(&compressed[0][..]);
        first[0] = 1;
        compressed[0] = first.freeze();
        assert_eq!(
            code_of(compressed.into_iter().collect(), Some(ok_trailers())),
            Some(Code::Unimplemented)
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let limited = runtime.block_on(async {
            let body = ChunkBody::ok(chunks.iter().cloned());
            BatchReader::new(body, 100)
                .next_batch(&mut OwnBuffers)
                .await
        });
        assert_eq!(
            limited.map(|_| ()).map_err(|s| s.code()),
            Err(Code::ResourceExhausted)
        );
    }

    /// A message within the size limit whose tensor entries or indices would take many times
    /// its size once read (a million empty tensors, millions of one-byte indices) is refused.
    #[test]
    fn a_message_of_countless_small_entries_is_refused() {
        let frame = |body: Vec<u8>| {
            let mut framed = vec![0u8];
            framed.extend((body.len() as u32).to_be_bytes());
            framed.extend(body);
            VecDeque::from([Bytes::from(framed)])
        };
        let tensors_key = (TENSORS_FIELD << 3 | 2) as u8;
        let empty_tensors: Vec<u8> = [tensors_key, 0].repeat(1_000_000);
        let (read, _) = read_all(frame(empty_tensors), Some(ok_trailers()), 1 << 20);
        let error = read.last().and_then(|r| r.as_ref().err()).expect("refused");
        assert!(error.message().contains("tensors"), "{error:?}");
        // 40 million one-byte indices, packed (field 5).
        let count: usize = 40_000_000;
        let mut indices = vec![5 << 3 | 2];
        let mut length = count;
        while length >= 0x80 {
            indices.push((length as u8 & 0x7f) | 0x80);
            length >>= 7;
        }
        indices.push(length as u8);
        indices.resize(indices.len() + count, 1);
        let (read, _) = read_all(frame(indices), Some(ok_trailers()), 1 << 20);
        let error = read.last().and_then(|r| r.as_ref().err()).expect("refused");
        assert!(error.message().contains("fields besides"), "{error:?}");
    }

    /// Chunks, then an error from below gRPC (a reset stream, a dropped connection).
    struct Breaking(VecDeque<Bytes>, Option<Status>);

    impl http_body::Body for Breaking {
        type Data = Bytes;
        type Error = Status;

        fn poll_frame(
            self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
            let this = self.get_mut();
            std::task::Poll::Ready(match this.0.pop_front() {
                Some(chunk) => Some(Ok(http_body::Frame::data(chunk))),
                None => this.1.take().map(Err),
            })
        }
    }

    #[test]
    fn a_body_that_breaks_below_grpc_is_unavailable_whatever_its_reason() {
        let chunks = encode_batch(sample_batch(&[10_000], 0), 1 << 20).expect("fits");
        let half: VecDeque<Bytes> = recut(&chunks, &[0.5]).into_iter().take(1).collect();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        // As tonic reads an HTTP/2 reset with INTERNAL_ERROR (or PROTOCOL_ERROR, ...).
        for reason in [
            Status::internal("h2 protocol error"),
            Status::unknown("reset"),
        ] {
            let read = runtime.block_on(async {
                BatchReader::new(Breaking(half.clone(), Some(reason)), 64 << 20)
                    .next_batch(&mut OwnBuffers)
                    .await
            });
            let status = read.map(|_| ()).expect_err("broken");
            assert_eq!(status.code(), Code::Unavailable, "{status}");
            assert!(status.message().starts_with("the stream broke"), "{status}");
        }
    }

    #[test]
    fn a_large_tensor_goes_in_frames_of_a_mib_each_counted_and_reads_back() {
        use http_body::Body;
        let batch = sample_batch(&[SEND_SLICE * 3 + 12_345, 100], 7);
        let sent = FramesSent::default();
        let source = tokio_stream::iter(vec![Ok(batch.clone()), Err(Status::data_loss("x"))]);
        let mut body = BatchStreamBody::new(source, 64 << 20).counting(sent.clone());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let mut frames = VecDeque::new();
        let mut trailers = None;
        runtime.block_on(async {
            while let Some(frame) =
                std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await
            {
                match frame.expect("a frame").into_data() {
                    Ok(data) => frames.push_back(data),
                    Err(frame) => trailers = frame.into_trailers().ok(),
                }
            }
        });
        assert!(frames.iter().all(|f| f.len() <= SEND_SLICE));
        assert!(frames.len() >= 4, "{} frames", frames.len());
        assert_eq!(
            sent.0.load(std::sync::atomic::Ordering::Relaxed),
            frames.len() as u64
        );
        let (read, _) = read_all(frames, trailers, 8 << 20);
        assert_eq!(read.len(), 2);
        assert_eq!(read[0].as_ref().expect("the batch"), &batch);
        assert_eq!(
            read[1].as_ref().expect_err("its error").code(),
            Code::DataLoss
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn any_batch_split_anywhere_reads_back(
            sizes in proptest::collection::vec(0usize..20_000, 0..4),
            cuts in proptest::collection::vec(0.0f64..1.0, 0..12),
            step in 0u64..1000,
        ) {
            let batch = sample_batch(&sizes, step);
            let chunks = encode_batch(batch.clone(), 1 << 20).expect("fits");
            let (read, copies) = read_all(recut(&chunks, &cuts), Some(ok_trailers()), 1 << 20);
            prop_assert_eq!(read.len(), 1);
            prop_assert_eq!(read[0].as_ref().expect("ok"), &batch);
            prop_assert_eq!(copies.landed, sizes.iter().sum::<usize>() as u64);
        }
    }
}
