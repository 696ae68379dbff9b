//! The worker's end: a batch as chunks written from where its bytes lie, the stream body that
//! carries them, and the data service that serves `Subscribe` with it.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
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

use super::{
    DATA_FIELD, INLINE_BELOW, MAX_REQUEST_BYTES, PREFIX_BYTES, SUBSCRIBE_PATH, TENSORS_FIELD,
};

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
pub(super) fn trailers_of(status: &Status) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    if status.add_header(&mut trailers).is_err() {
        // A message that cannot be a header: the code alone.
        trailers.insert("grpc-status", HeaderValue::from(status.code() as i32));
    }
    trailers
}

/// The most bytes one data frame of a [`BatchStreamBody`] carries (the transport's HTTP/2 frame
/// size): a larger chunk, a tensor's bytes, goes as slices of it, without a copy.
pub const SEND_SLICE: usize = 1 << 20;

/// The data frames a [`BatchStreamBody`] has handed to HTTP/2. It asks for the next one only
/// once the client's flow-control window has room, so the count moves while the client reads,
/// within a large batch too, and stops when it stops reading. A `Subscribe` service that puts
/// one in its response's extensions ([`tonic::Response::extensions_mut`]) gets it counted.
#[derive(Debug, Clone, Default)]
pub struct FramesSent(pub Arc<AtomicU64>);

/// The response body of `Subscribe`: each batch `source` yields as [`encode_batch`]'s chunks
/// (in frames of at most [`SEND_SLICE`] bytes), then the stream's status as trailers (`OK` when
/// `source` ends, its error otherwise).
pub struct BatchStreamBody<S> {
    source: S,
    chunks: VecDeque<Bytes>,
    max_message: usize,
    done: bool,
    sent: Option<FramesSent>,
}

impl<S> BatchStreamBody<S> {
    /// The body that sends what `source` yields, refusing batches over `max_message` bytes.
    pub fn new(source: S, max_message: usize) -> Self {
        BatchStreamBody {
            source,
            chunks: VecDeque::new(),
            max_message,
            done: false,
            sent: None,
        }
    }

    /// Counts each data frame it hands on in `sent`.
    pub fn counting(self, sent: FramesSent) -> Self {
        BatchStreamBody {
            sent: Some(sent),
            ..self
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
            if let Some(mut chunk) = this.chunks.pop_front() {
                if chunk.len() > SEND_SLICE {
                    this.chunks.push_front(chunk.split_off(SEND_SLICE));
                }
                if let Some(sent) = &this.sent {
                    sent.0.fetch_add(1, Ordering::Relaxed);
                }
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
    let mut body = BatchStreamBody::new(Box::pin(stream), max_message);
    if let Some(sent) = extensions.get::<FramesSent>() {
        body = body.counting(sent.clone());
    }
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
