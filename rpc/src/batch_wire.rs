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
//!   HTTP/2 writes to the socket from where they lie;
//! - **receiving** ([`subscribe`], [`BatchReader`]): the body's frames are parsed as they arrive,
//!   and each tensor's bytes are copied once, from the HTTP/2 receive buffer straight into the
//!   place a [`Landing`] gives (the client's slot).
//!
//! Fields are written in a different order than prost writes them (tensor bytes last within a
//! tensor, tensors after the other fields of the batch); protobuf readers take fields in any
//! order, and the reader here does too.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::poll_fn;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use prost::Message;
use stoker_proto::v1::worker_data_server::{WorkerData, WorkerDataServer};
use stoker_proto::v1::{Batch, SubscribeRequest, Tensor};
use tokio_stream::Stream;
use tonic::body::Body as TonicBody;
use tonic::codegen::http::{self, header, HeaderMap, HeaderValue};
use tonic::codegen::{Body, BoxFuture, Service, StdError};
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;
use tonic::{Code, Status};

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

/// `batch` as one gRPC message: chunks whose concatenation is the 5-byte prefix and a protobuf
/// encoding of `batch`, each tensor's bytes of `INLINE_BELOW` (4 KiB) or more a chunk of their
/// own (the batch's buffer itself). Refused when the message would exceed `max_message` bytes.
pub fn encode_batch(mut batch: Batch, max_message: usize) -> Result<Vec<Bytes>, Status> {
    let tensors = std::mem::take(&mut batch.tensors);
    let heads: Vec<(Tensor, usize)> = tensors
        .iter()
        .map(|tensor| {
            let head = Tensor {
                name: tensor.name.clone(),
                dtype: tensor.dtype,
                shape: tensor.shape.clone(),
                data: Bytes::new(),
            };
            let data = tensor.data.len();
            let data_field = if data == 0 {
                0
            } else {
                key_len(DATA_FIELD) + encoded_len_varint(data as u64) + data
            };
            let len = head.encoded_len() + data_field;
            (head, len)
        })
        .collect();
    let message_len = batch.encoded_len()
        + heads
            .iter()
            .map(|(_, len)| key_len(TENSORS_FIELD) + encoded_len_varint(*len as u64) + len)
            .sum::<usize>();
    let Ok(prefix_len) = u32::try_from(message_len) else {
        return Err(too_large(message_len, max_message));
    };
    if message_len > max_message {
        return Err(too_large(message_len, max_message));
    }
    let framing_len = PREFIX_BYTES + batch.encoded_len() + heads.len() * 64;
    let mut framing = BytesMut::with_capacity(framing_len);
    framing.put_u8(0);
    framing.put_u32(prefix_len);
    batch.encode_raw(&mut framing);
    let mut chunks = Vec::with_capacity(1 + 2 * tensors.len());
    for ((head, len), tensor) in heads.into_iter().zip(tensors) {
        encode_key(TENSORS_FIELD, WireType::LengthDelimited, &mut framing);
        encode_varint(len as u64, &mut framing);
        head.encode_raw(&mut framing);
        if tensor.data.is_empty() {
            continue;
        }
        encode_key(DATA_FIELD, WireType::LengthDelimited, &mut framing);
        encode_varint(tensor.data.len() as u64, &mut framing);
        if tensor.data.len() < INLINE_BELOW {
            framing.put_slice(&tensor.data);
        } else {
            chunks.push(framing.split().freeze());
            chunks.push(tensor.data);
        }
    }
    if !framing.is_empty() {
        chunks.push(framing.freeze());
    }
    Ok(chunks)
}

fn too_large(len: usize, max: usize) -> Status {
    Status::resource_exhausted(format!(
        "a batch of {len} bytes exceeds the stream's message limit of {max} bytes"
    ))
}

/// `status` as gRPC trailers (`grpc-status`, `grpc-message`).
fn trailers_of(status: &Status) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    if status.add_header(&mut trailers).is_err() {
        // A message that cannot be a header: the code alone.
        trailers.insert("grpc-status", HeaderValue::from(status.code() as i32));
    }
    trailers
}

/// The response body of `Subscribe`: each batch `source` yields as [`encode_batch`]'s chunks,
/// then the stream's status as trailers (`OK` when `source` ends, its error otherwise).
pub struct BatchStreamBody<S> {
    source: S,
    chunks: VecDeque<Bytes>,
    max_message: usize,
    done: bool,
}

impl<S> BatchStreamBody<S> {
    /// The body that sends what `source` yields, refusing batches over `max_message` bytes.
    pub fn new(source: S, max_message: usize) -> Self {
        BatchStreamBody {
            source,
            chunks: VecDeque::new(),
            max_message,
            done: false,
        }
    }
}

impl<S> Body for BatchStreamBody<S>
where
    S: Stream<Item = Result<Batch, Status>> + Unpin,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        loop {
            if let Some(chunk) = this.chunks.pop_front() {
                return Poll::Ready(Some(Ok(http_body::Frame::data(chunk))));
            }
            if this.done {
                return Poll::Ready(None);
            }
            let status = match Pin::new(&mut this.source).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(batch))) => match encode_batch(batch, this.max_message) {
                    Ok(chunks) => {
                        this.chunks.extend(chunks);
                        continue;
                    }
                    Err(status) => status,
                },
                Poll::Ready(Some(Err(status))) => status,
                Poll::Ready(None) => Status::new(Code::Ok, ""),
            };
            this.done = true;
            return Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers_of(&status)))));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.chunks.is_empty()
    }
}

/// The `WorkerData` service of `T`: `Subscribe` answered with a [`BatchStreamBody`], every
/// other method by tonic's generated server. Wrap it in the daemon's token check as any
/// service (`InterceptedService`).
pub struct WorkerDataService<T> {
    service: Arc<T>,
    generated: WorkerDataServer<T>,
    max_message: usize,
}

impl<T> Clone for WorkerDataService<T> {
    fn clone(&self) -> Self {
        WorkerDataService {
            service: Arc::clone(&self.service),
            generated: self.generated.clone(),
            max_message: self.max_message,
        }
    }
}

impl<T: WorkerData> WorkerDataService<T> {
    /// `service` behind the data server's routes, messages up to `max_message` bytes each way.
    pub fn new(service: T, max_message: usize) -> Self {
        let service = Arc::new(service);
        let generated = WorkerDataServer::from_arc(Arc::clone(&service))
            .max_decoding_message_size(max_message)
            .max_encoding_message_size(max_message);
        WorkerDataService {
            service,
            generated,
            max_message,
        }
    }
}

impl<T> NamedService for WorkerDataService<T> {
    const NAME: &'static str = <WorkerDataServer<T> as NamedService>::NAME;
}

impl<T, B> Service<http::Request<B>> for WorkerDataService<T>
where
    T: WorkerData,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<TonicBody>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != SUBSCRIBE_PATH {
            return Box::pin(self.generated.call(request));
        }
        let service = Arc::clone(&self.service);
        let max_message = self.max_message;
        Box::pin(async move {
            Ok(serve_subscribe(service, request, max_message)
                .await
                .unwrap_or_else(Status::into_http))
        })
    }
}

/// Answers one `Subscribe` call: the request read and decoded, the service's stream sent as a
/// [`BatchStreamBody`].
async fn serve_subscribe<T, B>(
    service: Arc<T>,
    request: http::Request<B>,
    max_message: usize,
) -> Result<http::Response<TonicBody>, Status>
where
    T: WorkerData,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<StdError>,
{
    let (parts, body) = request.into_parts();
    let message = read_request(body).await?;
    let subscribe = SubscribeRequest::decode(message)
        .map_err(|e| Status::invalid_argument(format!("bad SubscribeRequest: {e}")))?;
    let request = tonic::Request::from_parts(
        MetadataMap::from_headers(parts.headers),
        parts.extensions,
        subscribe,
    );
    let (metadata, stream, extensions) = service.subscribe(request).await?.into_parts();
    let body = BatchStreamBody::new(Box::pin(stream), max_message);
    let mut response = http::Response::new(TonicBody::new(body));
    *response.headers_mut() = metadata.into_headers();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    *response.extensions_mut() = extensions;
    Ok(response)
}

/// The one message of a unary request body, without its prefix.
async fn read_request<B>(mut body: B) -> Result<Bytes, Status>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<StdError>,
{
    let mut gathered = BytesMut::new();
    while let Some(frame) = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame.map_err(|e| Status::from_error(e.into()))?;
        if let Ok(data) = frame.into_data() {
            if gathered.len() + data.len() > PREFIX_BYTES + MAX_REQUEST_BYTES {
                return Err(Status::resource_exhausted(
                    "the subscribe request is too large",
                ));
            }
            gathered.extend_from_slice(&data);
        }
    }
    let mut message = gathered.freeze();
    if message.len() < PREFIX_BYTES {
        return Err(Status::invalid_argument("the subscribe request is empty"));
    }
    let compressed = message.get_u8();
    let len = message.get_u32() as usize;
    if compressed != 0 {
        return Err(Status::unimplemented(
            "compressed requests are not accepted on this stream",
        ));
    }
    if len != message.len() {
        return Err(Status::invalid_argument(
            "the subscribe request's length does not match its body",
        ));
    }
    Ok(message)
}

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

/// A response body of the given chunks, then `trailers` (none: it just ends there): a stream as
/// the reader takes it, for tests and the fuzz target.
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
                Some(Err(error)) => return Err(Status::from_error(error.into())),
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

    /// Appends `len` bytes of the stream to `out`.
    async fn read_into(&mut self, len: usize, out: &mut Vec<u8>) -> Result<(), Status> {
        let start = out.len();
        out.resize(start + len, 0);
        self.read_exact(&mut out[start..]).await
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
        let mut fields = Vec::new();
        let mut tensors = Vec::new();
        let mut landed = Vec::new();
        while remaining > 0 {
            let key = self.varint(&mut remaining).await?;
            if key == tensors_key {
                let len = self.length(&mut remaining).await?;
                let (tensor, place) = self.tensor(len, landing).await?;
                tensors.push(tensor);
                landed.push(place);
            } else {
                self.raw_field(key, &mut remaining, &mut fields).await?;
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
    let mut call = http::Request::new(TonicBody::new(OneChunk(Some(message.freeze()))));
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

/// A request body of one chunk.
struct OneChunk(Option<Bytes>);

impl Body for OneChunk {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        Poll::Ready(
            self.get_mut()
                .0
                .take()
                .map(|chunk| Ok(http_body::Frame::data(chunk))),
        )
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use stoker_proto::v1::{BadSample, StageTimings};

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
