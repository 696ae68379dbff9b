//! The client's end: the body's frames parsed as they come, each tensor's bytes copied once
//! into the place a [`Landing`] gives.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::ops::Range;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::encoding::{encode_varint, WireType};
use prost::Message;
use stoker_proto::v1::{Batch, SubscribeRequest, Tensor};
use tonic::body::Body as TonicBody;
use tonic::codegen::http::{self, header, HeaderMap, HeaderValue};
use tonic::codegen::{Body, Service, StdError};
use tonic::{Code, Status};

use super::send::trailers_of;
use super::{DATA_FIELD, PREFIX_BYTES, SUBSCRIBE_PATH, TENSORS_FIELD};

/// Where a message's tensor bytes go as they come off the socket.
pub trait Landing {
    /// Room for `len` more bytes: their offset in the landing and the place to fill, or `None`
    /// when it has no room (the bytes then get a buffer of their own).
    fn room(&mut self, len: usize) -> Option<(usize, &mut [u8])>;
}

/// A landing without room: every tensor gets a buffer of its own.
#[derive(Debug, Default, Clone, Copy)]
pub struct OwnBuffers;

impl Landing for OwnBuffers {
    fn room(&mut self, _len: usize) -> Option<(usize, &mut [u8])> {
        None
    }
}

/// A landing of one buffer, tensors packed one after another from its start: what a test or
/// a fuzz target lands batches in.
#[derive(Debug, Clone, Default)]
pub struct BufferLanding {
    /// The buffer; its length is the landing's room.
    pub buffer: Vec<u8>,
    /// Bytes given out so far, from the start.
    pub used: usize,
}

impl BufferLanding {
    /// A landing with room for `capacity` bytes.
    pub fn new(capacity: usize) -> Self {
        BufferLanding {
            buffer: vec![0; capacity],
            used: 0,
        }
    }
}

impl Landing for BufferLanding {
    fn room(&mut self, len: usize) -> Option<(usize, &mut [u8])> {
        let start = self.used;
        let end = start
            .checked_add(len)
            .filter(|end| *end <= self.buffer.len())?;
        self.used = end;
        Some((start, &mut self.buffer[start..end]))
    }
}

/// A body of the given chunks, then `trailers` (none: it just ends there): the one-message
/// request of [`subscribe`], and a response stream as the reader takes it, for tests and the
/// fuzz target.
#[derive(Debug, Default)]
pub struct ChunkBody {
    chunks: VecDeque<Bytes>,
    trailers: Option<HeaderMap>,
}

impl ChunkBody {
    /// The body of `chunks`, ending with `trailers`.
    pub fn new(chunks: impl IntoIterator<Item = Bytes>, trailers: Option<HeaderMap>) -> Self {
        ChunkBody {
            chunks: chunks.into_iter().collect(),
            trailers,
        }
    }

    /// The body of `chunks`, ending with an `OK` status.
    pub fn ok(chunks: impl IntoIterator<Item = Bytes>) -> Self {
        Self::new(chunks, Some(trailers_of(&Status::new(Code::Ok, ""))))
    }
}

impl Body for ChunkBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        Poll::Ready(match this.chunks.pop_front() {
            Some(chunk) => Some(Ok(http_body::Frame::data(chunk))),
            None => this
                .trailers
                .take()
                .map(|t| Ok(http_body::Frame::trailers(t))),
        })
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty() && self.trailers.is_none()
    }
}

/// A batch as [`BatchReader`] read it: the tensors whose bytes went to the landing have empty
/// `data`, and `landed` gives their range in it; the others hold their own buffer.
#[derive(Debug)]
pub struct WireBatch {
    /// The batch, tensor bytes apart.
    pub batch: Batch,
    /// Per tensor of `batch`, where its bytes are in the landing (`None`: in `data`).
    pub landed: Vec<Option<Range<usize>>>,
}

/// What a [`BatchReader`] copied so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CopyCounts {
    /// Tensor bytes copied into a landing (once each, straight from the receive buffer).
    pub landed: u64,
    /// Tensor bytes copied into buffers of their own (no room in the landing).
    pub own: u64,
    /// Bytes of the other fields, gathered to be decoded.
    pub fields: u64,
}

/// Reads `Subscribe`'s messages from a response body as its frames arrive.
pub struct BatchReader<B> {
    body: B,
    chunks: VecDeque<Bytes>,
    /// The stream's status once its trailers (or its end) came.
    end: Option<Result<(), Status>>,
    max_message: usize,
    copies: CopyCounts,
}

/// The error of a body that failed below gRPC (the connection, or its HTTP/2 stream reset):
/// `Unavailable`, whatever code tonic would give the reset's reason (with its `server` feature
/// it reads `INTERNAL_ERROR` as `Internal`), so the client takes the stream as lost and has
/// its batches redone rather than as a batch the worker could not build.
fn broken(error: StdError) -> Status {
    let status = Status::from_error(error);
    Status::unavailable(format!("the stream broke: {}", status.message()))
}

/// Tensors one batch message holds at most: a handful (images or token ids, labels,
/// positions, documents, sources), or one per column a `SelectColumns` names, far below this.
pub(crate) const MAX_TENSORS: usize = 65_536;

/// Bytes of a batch message's fields besides its tensors at most (its sample indices, bad
/// samples with their paths and reasons, timings: a few hundred bytes a sample at most, for
/// 65,536 samples), which decode into up to eight times as much.
pub(crate) const MAX_FIELD_BYTES: usize = 32 << 20;

fn malformed(what: &str) -> Status {
    Status::internal(format!("malformed batch message: {what}"))
}

impl<B> BatchReader<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<StdError>,
{
    /// Reads `body`, refusing messages over `max_message` bytes.
    pub fn new(body: B, max_message: usize) -> Self {
        BatchReader {
            body,
            chunks: VecDeque::new(),
            end: None,
            max_message,
            copies: CopyCounts::default(),
        }
    }

    /// What was copied so far.
    pub fn copies(&self) -> CopyCounts {
        self.copies
    }

    /// Takes one more data frame; `false` once the body has ended.
    async fn pull(&mut self) -> Result<bool, Status> {
        while self.end.is_none() {
            match poll_fn(|cx| Pin::new(&mut self.body).poll_frame(cx)).await {
                None => {
                    self.end = Some(Err(Status::unknown(
                        "the stream ended without a gRPC status",
                    )));
                }
                Some(Err(error)) => return Err(broken(error.into())),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if data.is_empty() => {}
                    Ok(data) => {
                        self.chunks.push_back(data);
                        return Ok(true);
                    }
                    Err(frame) => {
                        if let Ok(trailers) = frame.into_trailers() {
                            self.end = Some(match Status::from_header_map(&trailers) {
                                Some(status) if status.code() == Code::Ok => Ok(()),
                                Some(status) => Err(status),
                                None => Err(Status::unknown(
                                    "the stream's trailers carry no gRPC status",
                                )),
                            });
                        }
                    }
                },
            }
        }
        Ok(false)
    }

    /// The error of a body that ended inside a message.
    fn cut_short(&self) -> Status {
        match &self.end {
            Some(Err(status)) => status.clone(),
            _ => malformed("the stream ended inside a message"),
        }
    }

    /// Fills `target` from the stream, chunk by chunk.
    async fn read_exact(&mut self, target: &mut [u8]) -> Result<(), Status> {
        let mut filled = 0;
        while filled < target.len() {
            if self.chunks.is_empty() && !self.pull().await? {
                return Err(self.cut_short());
            }
            let Some(chunk) = self.chunks.front_mut() else {
                continue;
            };
            let n = chunk.len().min(target.len() - filled);
            target[filled..filled + n].copy_from_slice(&chunk[..n]);
            chunk.advance(n);
            if chunk.is_empty() {
                self.chunks.pop_front();
            }
            filled += n;
        }
        Ok(())
    }

    /// Appends `len` bytes of the stream to `out`, growing it as they come: a length a peer
    /// declares and never sends costs nothing (it was allocated and zeroed whole at once, up
    /// to the message limit).
    async fn read_into(&mut self, len: usize, out: &mut Vec<u8>) -> Result<(), Status> {
        let mut left = len;
        while left > 0 {
            if self.chunks.is_empty() && !self.pull().await? {
                return Err(self.cut_short());
            }
            let Some(chunk) = self.chunks.front_mut() else {
                continue;
            };
            let n = chunk.len().min(left);
            // Room for what came and as much again (at most what is left): a few growths, and
            // never more than the declared length in all.
            if out.capacity() - out.len() < n {
                out.reserve_exact(left.min(n.max(out.len())));
            }
            out.extend_from_slice(&chunk[..n]);
            chunk.advance(n);
            if chunk.is_empty() {
                self.chunks.pop_front();
            }
            left -= n;
        }
        Ok(())
    }

    /// One varint, counted against `remaining` bytes of the enclosing message.
    async fn varint(&mut self, remaining: &mut usize) -> Result<u64, Status> {
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            if *remaining == 0 {
                return Err(malformed("a varint runs past its message"));
            }
            let mut byte = [0u8];
            self.read_exact(&mut byte).await?;
            *remaining -= 1;
            value |= u64::from(byte[0] & 0x7f) << shift;
            if byte[0] & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(malformed("a varint longer than ten bytes"))
    }

    /// A length that must fit in `remaining`, taken from it.
    async fn length(&mut self, remaining: &mut usize) -> Result<usize, Status> {
        let len = self.varint(remaining).await?;
        match usize::try_from(len) {
            Ok(len) if len <= *remaining => {
                *remaining -= len;
                Ok(len)
            }
            _ => Err(malformed("a field longer than its message")),
        }
    }

    /// Copies a field whose key was `key` (the key too) into `out`, to be decoded later.
    async fn raw_field(
        &mut self,
        key: u64,
        remaining: &mut usize,
        out: &mut Vec<u8>,
    ) -> Result<(), Status> {
        let before = out.len();
        encode_varint(key, out);
        match key & 7 {
            0 => {
                let value = self.varint(remaining).await?;
                encode_varint(value, out);
            }
            1 | 5 => {
                let len = if key & 7 == 1 { 8 } else { 4 };
                if len > *remaining {
                    return Err(malformed("a fixed field longer than its message"));
                }
                *remaining -= len;
                self.read_into(len, out).await?;
            }
            2 => {
                let len = self.length(remaining).await?;
                encode_varint(len as u64, out);
                self.read_into(len, out).await?;
            }
            _ => return Err(malformed("a group or unknown wire type")),
        }
        self.copies.fields += (out.len() - before) as u64;
        Ok(())
    }

    /// One tensor of `len` bytes: its data to `landing` (or a buffer of its own), its other
    /// fields decoded.
    async fn tensor<L: Landing + ?Sized>(
        &mut self,
        mut remaining: usize,
        landing: &mut L,
    ) -> Result<(Tensor, Option<Range<usize>>), Status> {
        let mut fields = Vec::new();
        let mut data: Option<Bytes> = None;
        let mut landed = None;
        let data_key = u64::from(DATA_FIELD << 3 | WireType::LengthDelimited as u32);
        while remaining > 0 {
            let key = self.varint(&mut remaining).await?;
            if key != data_key {
                self.raw_field(key, &mut remaining, &mut fields).await?;
                continue;
            }
            // A repeated field of a message: the last one counts, as in protobuf.
            let len = self.length(&mut remaining).await?;
            match landing.room(len) {
                Some((offset, place)) => {
                    self.read_exact(place).await?;
                    self.copies.landed += len as u64;
                    landed = Some(offset..offset + len);
                    data = None;
                }
                None => {
                    let mut own = Vec::new();
                    self.read_into(len, &mut own).await?;
                    self.copies.own += len as u64;
                    data = Some(own.into());
                    landed = None;
                }
            }
        }
        let mut tensor =
            Tensor::decode(fields.as_slice()).map_err(|e| malformed(&format!("a tensor: {e}")))?;
        tensor.data = data.unwrap_or_default();
        Ok((tensor, landed))
    }

    /// The next batch, its tensor bytes in `landing` where it has room; `None` once the
    /// stream ended with `OK`, its status when it ended otherwise.
    pub async fn next_batch<L: Landing + ?Sized>(
        &mut self,
        landing: &mut L,
    ) -> Result<Option<WireBatch>, Status> {
        if self.chunks.is_empty() && !self.pull().await? {
            return match self.end.take() {
                Some(Err(status)) => Err(status),
                _ => Ok(None),
            };
        }
        let mut prefix = [0u8; PREFIX_BYTES];
        self.read_exact(&mut prefix).await?;
        if prefix[0] != 0 {
            return Err(Status::unimplemented(
                "a compressed batch message (this client reads uncompressed ones)",
            ));
        }
        let mut remaining =
            u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        if remaining > self.max_message {
            return Err(Status::resource_exhausted(format!(
                "a batch message of {remaining} bytes exceeds the limit of {} bytes",
                self.max_message
            )));
        }
        let tensors_key = u64::from(TENSORS_FIELD << 3 | WireType::LengthDelimited as u32);
        // What a message's size alone does not bound: an empty tensor entry takes two bytes and
        // an index one, each a struct or a u64 once read (512 MiB of them were gigabytes).
        let mut fields = Vec::new();
        let mut tensors = Vec::new();
        let mut landed = Vec::new();
        while remaining > 0 {
            let key = self.varint(&mut remaining).await?;
            if key == tensors_key {
                if tensors.len() >= MAX_TENSORS {
                    return Err(malformed(&format!(
                        "a batch of more than {MAX_TENSORS} tensors"
                    )));
                }
                let len = self.length(&mut remaining).await?;
                let (tensor, place) = self.tensor(len, landing).await?;
                tensors.push(tensor);
                landed.push(place);
            } else {
                self.raw_field(key, &mut remaining, &mut fields).await?;
                if fields.len() > MAX_FIELD_BYTES {
                    return Err(malformed(&format!(
                        "a batch whose fields besides its tensors pass {MAX_FIELD_BYTES} bytes"
                    )));
                }
            }
        }
        let mut batch =
            Batch::decode(fields.as_slice()).map_err(|e| malformed(&format!("a batch: {e}")))?;
        batch.tensors = tensors;
        Ok(Some(WireBatch { batch, landed }))
    }
}

/// Opens `Subscribe` on `channel` (any HTTP/2 client service, such as the daemons' gRPC
/// channel, which adds the token) and returns the reader of its batches; a refusal or an
/// error before the first message is the call's status.
pub async fn subscribe<S, R>(
    channel: &mut S,
    request: SubscribeRequest,
    max_message: usize,
) -> Result<BatchReader<R>, Status>
where
    S: Service<http::Request<TonicBody>, Response = http::Response<R>>,
    S::Error: Into<StdError>,
    R: Body<Data = Bytes> + Unpin,
    R::Error: Into<StdError>,
{
    let mut message = BytesMut::with_capacity(PREFIX_BYTES + request.encoded_len());
    message.put_u8(0);
    message.put_u32(request.encoded_len() as u32);
    request.encode_raw(&mut message);
    let mut call = http::Request::new(TonicBody::new(ChunkBody::new([message.freeze()], None)));
    *call.method_mut() = http::Method::POST;
    *call.uri_mut() = http::Uri::from_static(SUBSCRIBE_PATH);
    let headers = call.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(header::TE, HeaderValue::from_static("trailers"));
    poll_fn(|cx| channel.poll_ready(cx))
        .await
        .map_err(|e| Status::from_error(e.into()))?;
    let response = channel
        .call(call)
        .await
        .map_err(|e| Status::from_error(e.into()))?;
    // A refusal comes as headers only (a "trailers-only" answer).
    if let Some(status) = Status::from_header_map(response.headers()) {
        if status.code() != Code::Ok {
            return Err(status);
        }
    }
    if response.status() != http::StatusCode::OK {
        return Err(Status::unknown(format!(
            "the worker answered HTTP {} to the stream",
            response.status()
        )));
    }
    Ok(BatchReader::new(response.into_body(), max_message))
}
