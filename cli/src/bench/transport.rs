//! `stoker bench transport`: batch streaming throughput over loopback with the distributed
//! mode's transport (the `WorkerData.Subscribe` stream, its message limits, windows and frame
//! size), each batch landed in a slot as the remote client does, printed beside a memcpy
//! bandwidth measured in the same run, and their ratio.
//!
//! The server streams one pre-built batch again and again (cloning `Bytes` costs no copy), so the
//! figure is what the transport and the landing cost. Two paths run side by side: the batch
//! stream of `stoker_rpc::batch_wire` (what the daemons use: tensor bytes written to the
//! socket from the batch's own buffer, and read from the HTTP/2 receive buffer straight into the
//! slot), and, as the baseline, tonic's generated server and client with the copy into the slot
//! after (the path before `batch_wire`). Server and client each run a single-threaded runtime on
//! their own thread, as a worker's stream and a client's stream do, and allocate as the daemons
//! and the Python extension do (this binary's Rust allocator is theirs, jemalloc).
//!
//! Two rows of plain TCP with no protocol give the socket's own ceiling on the machine: the same
//! batches written and read in pieces of 1 MiB (the HTTP/2 frame size of the transport), and
//! of 64 KiB, each read copied into a slot as the streams land them.
//!
//! With `--tls` the same stream runs a second time over TLS (a throwaway CA and certificate for
//! 127.0.0.1, and a token on the call), and the report gives both rates and their ratio.

use std::hint::black_box;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use serde::Serialize;
use stoker_proto::v1::worker_data_client::WorkerDataClient;
use stoker_proto::v1::worker_data_server::{WorkerData, WorkerDataServer};
use stoker_proto::v1::{
    Batch, DescribeJobRequest, DescribeJobResponse, Dtype, SessionToken, SubscribeRequest, Tensor,
};
use stoker_rpc::batch_wire::{self, WorkerDataService};
use stoker_rpc::security::{ClientSecurity, ServerSecurity, Token};
use stoker_rpc::transport::{self, MAX_MESSAGE_BYTES};
use tokio::sync::mpsc;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use super::Error;
use stoker_loader::landing::{land_in_slot, lock, next_landed, SlotQueue, SLOT_ALIGN};
use stoker_loader::SlotPool;

/// Settings of `stoker bench transport`.
#[derive(Debug, Clone, Args)]
pub struct TransportBench {
    /// Bytes of image tensor per batch, in MiB (64 images of 224x224x3 are 9.2 MiB).
    #[arg(long, default_value_t = 8)]
    pub batch_mib: usize,
    /// Total bytes to stream, in MiB.
    #[arg(long, default_value_t = 4096)]
    pub total_mib: usize,
    /// Also stream over TLS with a token, and report it beside plaintext.
    #[arg(long)]
    pub tls: bool,
    /// Print one JSON object as the last line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct TransportReport {
    batch_bytes: u64,
    batches: u64,
    wall_s: f64,
    /// The daemons' path (`batch_wire`), into slots.
    stream_gb_per_s: f64,
    memcpy_gb_per_s: f64,
    /// `stream_gb_per_s` over `memcpy_gb_per_s`.
    ratio: f64,
    /// The baseline: tonic's generated server and client, then a copy into the slot.
    tonic_gb_per_s: f64,
    /// `stream_gb_per_s` over `tonic_gb_per_s`.
    speedup_over_tonic: f64,
    /// Plain TCP, no protocol, writes and reads of 1 MiB copied into slots.
    socket_gb_per_s: f64,
    /// The same in writes and reads of 64 KiB.
    socket_64k_gb_per_s: f64,
    /// `stream_gb_per_s` over `socket_gb_per_s`.
    of_socket: f64,
    /// With `--tls`: the same stream over TLS with a token.
    tls_wall_s: Option<f64>,
    tls_stream_gb_per_s: Option<f64>,
    /// TLS rate over plaintext rate.
    tls_over_plaintext: Option<f64>,
}

/// A data server that streams the same batch `count` times.
struct Repeater {
    batch: Batch,
    count: u64,
}

#[tonic::async_trait]
impl WorkerData for Repeater {
    async fn describe_job(
        &self,
        _request: Request<DescribeJobRequest>,
    ) -> Result<Response<DescribeJobResponse>, Status> {
        Err(Status::unimplemented("bench server"))
    }

    type SubscribeStream = tokio_stream::wrappers::ReceiverStream<Result<Batch, Status>>;

    async fn subscribe(
        &self,
        _request: Request<SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let (sender, receiver) = mpsc::channel(4);
        let batch = self.batch.clone();
        let count = self.count;
        tokio::spawn(async move {
            for step in 0..count {
                let mut next = batch.clone();
                next.step = step;
                if sender.send(Ok(next)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            receiver,
        )))
    }
}

/// memcpy bandwidth of one thread over 64 MiB buffers (read + write counted once, as a copy).
fn memcpy_gb_per_s() -> f64 {
    let size = 64 << 20;
    let source: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
    let mut target = vec![0u8; size];
    target.copy_from_slice(&source); // fault the pages in
    let rounds = 24;
    let started = Instant::now();
    for _ in 0..rounds {
        target.copy_from_slice(black_box(&source));
        black_box(&mut target);
    }
    (size * rounds) as f64 / started.elapsed().as_secs_f64() / 1e9
}

/// Plain TCP over loopback with no protocol: a thread writes `batches` copies of `data` in
/// writes of `piece` bytes; this one reads them in reads of up to `piece` bytes into one buffer and
/// copies each read into the next of four batch-sized slots, as the streams land batches. Returns
/// the bytes received after the first batch and the time they took.
fn socket_batches(data: &Bytes, batches: u64, piece: usize) -> super::Result<(u64, Duration)> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    let sent = data.clone();
    let writer = std::thread::Builder::new()
        .name("bench-transport-socket".into())
        .spawn(move || -> std::io::Result<()> {
            let (mut socket, _) = listener.accept()?;
            socket.set_nodelay(true)?;
            for _ in 0..batches {
                for chunk in sent.chunks(piece) {
                    socket.write_all(chunk)?;
                }
            }
            Ok(())
        })?;
    let mut socket = std::net::TcpStream::connect(address)?;
    socket.set_nodelay(true)?;
    let batch = data.len();
    let mut slots = vec![vec![0u8; batch]; 4];
    let mut buffer = vec![0u8; piece];
    let (mut slot, mut filled, mut landed) = (0, 0, 0u64);
    let mut received = 0u64;
    let mut started = Instant::now();
    loop {
        let read = socket.read(&mut buffer)?;
        if read == 0 {
            break;
        }
        let mut from = 0;
        while from < read {
            let take = (read - from).min(batch - filled);
            slots[slot][filled..filled + take].copy_from_slice(&buffer[from..from + take]);
            from += take;
            filled += take;
            if filled == batch {
                black_box(&slots[slot]);
                (slot, filled) = ((slot + 1) % slots.len(), 0);
                landed += 1;
                if landed == 1 {
                    started = Instant::now();
                } else {
                    received += batch as u64;
                }
            }
        }
    }
    writer
        .join()
        .map_err(|_| Error::Failed("the bench socket writer panicked".into()))??;
    if landed != batches {
        return Err(Error::Failed(format!(
            "the plain socket delivered {landed} of {batches} batches"
        )));
    }
    Ok((received, started.elapsed()))
}

fn single_thread_runtime() -> super::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Which server and client stream the batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// `batch_wire` on both ends, landing in slots as the bytes come.
    Wire,
    /// tonic's generated server and client, then a copy into the slot.
    Tonic,
}

/// Streams `batches` copies of `batch` from a server with `server` security to a client with
/// `client` security over `path`, each landed in a slot of a small pool; returns the bytes
/// received after the first batch and the time they took.
fn stream_batches(
    batch: &Batch,
    batches: u64,
    server: ServerSecurity,
    client: ClientSecurity,
    path: Path,
) -> super::Result<(u64, Duration)> {
    let (address_tx, address_rx) = std::sync::mpsc::channel::<SocketAddr>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    // A few slots, as the loader keeps in flight; each returns when its batch is dropped.
    let slot_bytes = batch.tensors.iter().map(|t| t.data.len()).sum::<usize>()
        + batch.tensors.len() * SLOT_ALIGN;
    let batch = batch.clone();
    let server = std::thread::Builder::new()
        .name("bench-transport-server".into())
        .spawn(move || -> super::Result<()> {
            single_thread_runtime()?.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                address_tx
                    .send(listener.local_addr()?)
                    .map_err(|_| Error::Failed("the bench client went away".into()))?;
                let repeater = Repeater {
                    batch,
                    count: batches,
                };
                let stop = async {
                    let _ = stop_rx.await;
                };
                let check = server.check();
                let incoming = server.incoming(listener);
                let router = match path {
                    Path::Wire => transport::server().add_service(InterceptedService::new(
                        WorkerDataService::new(repeater, MAX_MESSAGE_BYTES),
                        check,
                    )),
                    Path::Tonic => transport::server().add_service(InterceptedService::new(
                        WorkerDataServer::new(repeater)
                            .max_encoding_message_size(MAX_MESSAGE_BYTES)
                            .max_decoding_message_size(MAX_MESSAGE_BYTES),
                        check,
                    )),
                };
                router.serve_with_incoming_shutdown(incoming, stop).await?;
                Ok(())
            })
        })?;
    let address = address_rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| Error::Failed("the bench server did not start".into()))?;
    let pool = SlotPool::new(slot_bytes, 4);
    // The client's stream runs on a thread of its own, as the remote client's streams run on
    // its runtime's threads. (Before this binary allocated through jemalloc, the process's main
    // thread took its buffers from glibc's main heap, whose top glibc gave back to the kernel
    // and faulted in again: a third of the rate; benches/README.md, 2026-11-29.)
    let streamed = std::thread::Builder::new()
        .name("transport-client".into())
        .spawn(move || receive(address, &client, &pool, slot_bytes, path))
        .map_err(Error::from)
        .and_then(|client| {
            client
                .join()
                .map_err(|_| Error::Failed("the bench client thread panicked".into()))?
        });
    // Stopped and joined whatever became of the client, so a server error is not lost.
    let _ = stop_tx.send(());
    let served = server
        .join()
        .map_err(|_| Error::Failed("the bench server thread panicked".into()))
        .and_then(|served| served);
    let streamed = streamed?;
    served?;
    Ok(streamed)
}

/// The client's end of [`stream_batches`]: subscribes to the server at `address` and lands
/// every batch in a slot of `pool` until the stream ends; returns the bytes received after the
/// first batch and the time they took.
fn receive(
    address: SocketAddr,
    client: &ClientSecurity,
    pool: &Arc<SlotPool>,
    slot_bytes: usize,
    path: Path,
) -> super::Result<(u64, Duration)> {
    single_thread_runtime()?.block_on(async move {
        let mut channel = transport::channel(&address.to_string(), client)?;
        let request = SubscribeRequest {
            session: Some(SessionToken::default()),
            job_id: 0,
        };
        let slot = || {
            pool.take_timeout(slot_bytes, Duration::from_secs(10))
                .ok_or_else(|| Error::Failed("no slot came back".into()))
        };
        // The first batch warms the connection and windows up; time the rest.
        let mut received = 0u64;
        let mut started = Instant::now();
        let mut first = true;
        let mut count = |batch: &stoker_loader::Batch| {
            if std::mem::take(&mut first) {
                started = Instant::now();
            } else {
                received += batch
                    .tensors
                    .iter()
                    .map(|t| t.data.len() as u64)
                    .sum::<u64>();
            }
        };
        match path {
            Path::Wire => {
                let mut reader =
                    batch_wire::subscribe(&mut channel, request, MAX_MESSAGE_BYTES).await?;
                let queue = SlotQueue::default();
                loop {
                    lock(&queue).push_back((slot()?, Instant::now()));
                    let Some(landed) = next_landed(&mut reader, &queue).await? else {
                        break;
                    };
                    let (batch, _) = landed.finish();
                    count(black_box(&batch));
                }
            }
            Path::Tonic => {
                let mut client = WorkerDataClient::new(channel)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES);
                let mut stream = client.subscribe(request).await?.into_inner();
                while let Some(batch) = stream.message().await? {
                    let batch = land_in_slot(batch.into(), slot()?);
                    count(black_box(&batch));
                }
            }
        }
        Ok::<_, Error>((received, started.elapsed()))
    })
}

/// Runs the benchmark and prints the report.
pub fn run(args: &TransportBench) -> super::Result<()> {
    if !(args.batch_mib >= 1 && args.batch_mib << 20 <= MAX_MESSAGE_BYTES / 2) {
        return Err(Error::InvalidArgument(format!(
            "--batch-mib must be in 1..={}",
            (MAX_MESSAGE_BYTES / 2) >> 20
        )));
    }
    let batch_bytes = args.batch_mib << 20;
    let batches = (args.total_mib / args.batch_mib).max(4) as u64;
    let data: Bytes = (0..batch_bytes)
        .map(|i| (i % 253) as u8)
        .collect::<Vec<u8>>()
        .into();
    let batch = Batch {
        tensors: vec![Tensor {
            name: "image".into(),
            dtype: Dtype::Uint8 as i32,
            shape: vec![batch_bytes as u64],
            data: data.clone(),
        }],
        ..Batch::default()
    };

    let memcpy_before = memcpy_gb_per_s();
    let (received, wall) = stream_batches(
        &batch,
        batches,
        ServerSecurity::default(),
        ClientSecurity::default(),
        Path::Wire,
    )?;
    let (tonic_received, tonic_wall) = stream_batches(
        &batch,
        batches,
        ServerSecurity::default(),
        ClientSecurity::default(),
        Path::Tonic,
    )?;
    let socket = socket_batches(&data, batches, 1 << 20)?;
    let socket_64k = socket_batches(&data, batches, 64 << 10)?;
    let tls = if args.tls {
        let dir = tempfile::tempdir()?;
        let pki = super::certificates::write_test_certificates(dir.path(), &["127.0.0.1"])?;
        let token = Token::new("bench-transport-token")?;
        let server = ServerSecurity::new(vec![token.clone()], Some((&pki.cert, &pki.key)))?;
        let client = ClientSecurity::new(Some(token), Some(&pki.ca), None)?;
        Some(stream_batches(&batch, batches, server, client, Path::Wire)?)
    } else {
        None
    };
    let memcpy = (memcpy_before + memcpy_gb_per_s()) / 2.0;

    let stream = received as f64 / wall.as_secs_f64() / 1e9;
    let tonic = tonic_received as f64 / tonic_wall.as_secs_f64() / 1e9;
    let rate = |(bytes, wall): (u64, Duration)| bytes as f64 / wall.as_secs_f64() / 1e9;
    let socket = rate(socket);
    let report = TransportReport {
        batch_bytes: batch_bytes as u64,
        batches,
        wall_s: wall.as_secs_f64(),
        stream_gb_per_s: stream,
        memcpy_gb_per_s: memcpy,
        ratio: stream / memcpy,
        tonic_gb_per_s: tonic,
        speedup_over_tonic: stream / tonic,
        socket_gb_per_s: socket,
        socket_64k_gb_per_s: rate(socket_64k),
        of_socket: stream / socket,
        tls_wall_s: tls.map(|(_, wall)| wall.as_secs_f64()),
        tls_stream_gb_per_s: tls.map(rate),
        tls_over_plaintext: tls.map(|tls| rate(tls) / stream),
    };
    println!(
        "transport: {} batches of {} MiB over loopback in {:.2} s",
        batches - 1,
        args.batch_mib,
        report.wall_s
    );
    println!(
        "  stream   {:>6.2} GB/s (plaintext, into slots)",
        report.stream_gb_per_s
    );
    println!(
        "  tonic    {:>6.2} GB/s (baseline: tonic's codec, then a copy into the slot; {:.2}x)",
        report.tonic_gb_per_s, report.speedup_over_tonic
    );
    println!(
        "  socket   {:>6.2} GB/s (plain TCP, no protocol: writes and reads of 1 MiB, the HTTP/2 frame size, into slots)",
        report.socket_gb_per_s
    );
    println!(
        "  socket   {:>6.2} GB/s (plain TCP, writes and reads of 64 KiB)",
        report.socket_64k_gb_per_s
    );
    if let (Some(rate), Some(ratio)) = (report.tls_stream_gb_per_s, report.tls_over_plaintext) {
        println!(
            "  tls      {rate:>6.2} GB/s (TLS 1.3 + token, same run: {:.1} % of plaintext)",
            ratio * 100.0
        );
    }
    println!(
        "  memcpy   {:>6.2} GB/s (one thread, same run)",
        report.memcpy_gb_per_s
    );
    println!(
        "  ratio    {:>6.1} % of memcpy (a loopback socket costs two copies: ~50% is the ceiling)",
        report.ratio * 100.0
    );
    println!(
        "  ratio    {:>6.1} % of the plain socket's 1 MiB row",
        report.of_socket * 100.0
    );
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(())
}
