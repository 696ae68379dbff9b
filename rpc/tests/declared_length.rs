//! A batch message whose tensor declares bytes its peer never sends costs the reader no memory
//! for them: the reader grows a tensor's own buffer as its bytes come. It used to allocate and
//! zero the declared length at once (up to the message limit, 512 MiB), so a stalled or
//! broken peer held that much of the client's memory per stream. A binary of its own: the
//! process's resident memory is what it measures.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use prost::encoding::encode_varint;
use stoker_rpc::batch_wire::{BatchReader, OwnBuffers};
use tonic::codegen::Body;
use tonic::Status;

/// A body that sends its one chunk, then nothing, without ending.
struct Stalled(Option<Bytes>);

impl Body for Stalled {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        match self.0.take() {
            Some(chunk) => Poll::Ready(Some(Ok(http_body::Frame::data(chunk)))),
            None => Poll::Pending,
        }
    }
}

/// This process's resident memory, from `/proc/self/status`.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find(|line| line.starts_with("VmRSS:"))
        .expect("VmRSS");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("a size in kB");
    kib * 1024
}

#[test]
fn bytes_declared_and_never_sent_take_no_memory() {
    const DECLARED: usize = 384 << 20;
    // One batch message: its tensors field (4) holding a tensor whose data field (4) declares
    // DECLARED bytes, of which 16 come.
    let mut tensor = Vec::new();
    encode_varint(u64::from(4u32 << 3 | 2), &mut tensor);
    encode_varint(DECLARED as u64, &mut tensor);
    let tensor_len = tensor.len() + DECLARED;
    let mut body = Vec::new();
    encode_varint(u64::from(4u32 << 3 | 2), &mut body);
    encode_varint(tensor_len as u64, &mut body);
    let message_len = body.len() + tensor_len;
    let mut chunk = BytesMut::new();
    chunk.put_u8(0);
    chunk.put_u32(u32::try_from(message_len).expect("under 4 GiB"));
    chunk.put_slice(&body);
    chunk.put_slice(&tensor);
    chunk.put_slice(&[7u8; 16]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let before = resident_bytes();
    let during = runtime.block_on(async {
        let mut reader = BatchReader::new(Stalled(Some(chunk.freeze())), 512 << 20);
        let mut landing = OwnBuffers;
        let read = reader.next_batch(&mut landing);
        tokio::pin!(read);
        // The reader waits for the rest of the tensor, holding what it made for it.
        let waited = tokio::time::timeout(Duration::from_millis(300), &mut read).await;
        assert!(waited.is_err(), "the message cannot be complete");
        resident_bytes()
    });
    let grew = during.saturating_sub(before);
    assert!(
        grew < 64 << 20,
        "{grew} bytes resident for a tensor of which 16 bytes came"
    );
}
