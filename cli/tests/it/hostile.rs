//! Hostile requests to real daemons (issue 14): while a well-behaved client reads its epoch
//! through a real coordinator and worker, a hostile client on the raw gRPC stubs sends
//! malformed, oversized and out-of-order requests, escapes `--data-root`, opens a stream it never
//! reads, vanishes mid-stream and floods the coordinator with sessions. Each hostile call gets a
//! status naming the problem or is cleaned up after its deadline, the daemons' memory stays
//! bounded, and the well-behaved client's bytes equal the embedded mode's.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stoker_loader::BatchDigest;
use stoker_proto::v1::coordinator_client::CoordinatorClient;
use stoker_proto::v1::worker_data_client::WorkerDataClient;
use stoker_proto::v1::{
    self as proto, op::Op as OpKind, CloseSessionRequest, HeartbeatRequest, JobSpec, LeaseRequest,
    OpenSessionRequest, RegisterJobRequest, RegisterWorkerRequest, ReportRequest, SessionToken,
    SessionUpdateRequest, SubscribeRequest,
};
use stoker_rpc::transport::MAX_MESSAGE_BYTES;
use tonic::transport::{Channel, Endpoint};
use tonic::Code;

use crate::common::{self, Daemon};
use crate::distributed::{embedded, remote, spec};

/// The coordinator closes a session silent for this long.
const SESSION_TIMEOUT: Duration = Duration::from_millis(1500);
/// Most sessions open at once.
const MAX_SESSIONS: usize = 48;

/// Asserts `result` failed with `code` and a message containing `words`.
fn refused<T: std::fmt::Debug>(result: Result<T, tonic::Status>, code: Code, words: &str) {
    let status = result.expect_err("the request is refused");
    assert_eq!(status.code(), code, "{status:?}");
    assert!(status.message().contains(words), "{words:?}: {status:?}");
}

/// The registration of `spec`, no weight asked.
fn register(spec: JobSpec) -> RegisterJobRequest {
    RegisterJobRequest {
        spec: Some(spec),
        ..Default::default()
    }
}

/// `spec` with `op` before its last op (ToTensor), where the image orders allow Normalize.
fn with_op(mut spec: JobSpec, op: OpKind) -> RegisterJobRequest {
    let last = spec.pipeline.len() - 1;
    spec.pipeline.insert(last, proto::Op { op: Some(op) });
    register(spec)
}

fn at_uri(mut spec: JobSpec, uri: &Path) -> RegisterJobRequest {
    spec.dataset.as_mut().unwrap().uri = uri.display().to_string();
    register(spec)
}

/// Job specs the worker or the coordinator must refuse, each with the words naming why.
async fn malformed_jobs(client: &mut CoordinatorClient<Channel>, root: &Path, outside: &Path) {
    let good = spec(&root.join("data"), 0);
    let mut huge = good.clone();
    huge.batch_size = u32::MAX;
    let mut zero = good.clone();
    zero.batch_size = 0;
    for bad in [huge, zero] {
        refused(
            client.register_job(register(bad)).await,
            Code::InvalidArgument,
            "batch_size",
        );
    }
    // An op of a kind this build does not know decodes as an empty one.
    let mut unknown_op = good.clone();
    unknown_op.pipeline.insert(1, proto::Op { op: None });
    refused(
        client.register_job(register(unknown_op)).await,
        Code::InvalidArgument,
        "op 1 is empty",
    );
    let mut zero_side = good.clone();
    zero_side.pipeline = stoker_pipeline::presets::imagenet_eval(32);
    for op in &mut zero_side.pipeline {
        if let Some(OpKind::Resize(resize)) = &mut op.op {
            resize.shorter_side = 0;
        }
    }
    refused(
        client.register_job(register(zero_side)).await,
        Code::InvalidArgument,
        "Resize size (shorter_side)",
    );
    let zero_std = OpKind::Normalize(proto::Normalize {
        mean: vec![0.5; 3],
        std: vec![0.0; 3],
    });
    refused(
        client.register_job(with_op(good.clone(), zero_std)).await,
        Code::InvalidArgument,
        "std must be finite and non-zero",
    );
    let mut unknown_dtype = good.clone();
    for op in &mut unknown_dtype.pipeline {
        if let Some(OpKind::ToTensor(tensor)) = &mut op.op {
            tensor.dtype = -7;
        }
    }
    refused(
        client.register_job(register(unknown_dtype)).await,
        Code::InvalidArgument,
        "ToTensor dtype -7 is not a known dtype",
    );
    let mut huge_world = good.clone();
    huge_world.world_size = u32::MAX;
    refused(
        client.register_job(register(huge_world)).await,
        Code::InvalidArgument,
        "world_size",
    );

    // Out of --data-root by `..`, by a symlink inside it, and by a tokenizer path.
    let escape = "outside this worker's --data-root";
    let dotdot = root.join("data").join("..").join("..").join("outside");
    let request = at_uri(good.clone(), &dotdot);
    refused(
        client.register_job(request).await,
        Code::PermissionDenied,
        escape,
    );
    let request = at_uri(good.clone(), &root.join("link"));
    refused(
        client.register_job(request).await,
        Code::PermissionDenied,
        escape,
    );
    assert!(outside.exists());
    // Links among the dataset's own files, the named path inside the root: a class folder, a
    // folder a pattern enters.
    for linked in [root.join("linked_class"), root.join("globs/l*/*.jsonl")] {
        refused(
            client.register_job(at_uri(good.clone(), &linked)).await,
            Code::PermissionDenied,
            escape,
        );
    }
    let tokenizer = OpKind::Tokenize(proto::Tokenize {
        tokenizer_path: "/dev/zero".into(),
    });
    refused(
        client.register_job(with_op(good.clone(), tokenizer)).await,
        Code::PermissionDenied,
        "tokenizer /dev/zero is outside",
    );

    // A mix: its second source out of --data-root; a window no worker should lay out; a mix
    // without datasets.
    let source = |uri: &Path| proto::MixSource {
        dataset: Some(proto::DatasetSource {
            uri: uri.display().to_string(),
            ..Default::default()
        }),
        pipeline: good.pipeline.clone(),
        weight: 1.0,
    };
    let mixed = |sources: Vec<proto::MixSource>, window: u32| RegisterJobRequest {
        spec: Some(JobSpec {
            dataset: None,
            pipeline: Vec::new(),
            mix: Some(proto::Mix {
                sources,
                window,
                ..Default::default()
            }),
            ..good.clone()
        }),
        ..Default::default()
    };
    let inside = root.join("data");
    refused(
        client
            .register_job(mixed(vec![source(&inside), source(&dotdot)], 10))
            .await,
        Code::PermissionDenied,
        escape,
    );
    refused(
        client
            .register_job(mixed(vec![source(&inside)], u32::MAX))
            .await,
        Code::InvalidArgument,
        "window must be in",
    );
    refused(
        client.register_job(mixed(Vec::new(), 10)).await,
        Code::InvalidArgument,
        "no dataset",
    );
}

/// Calls made out of order: before an open, after a close, for leases never issued.
async fn out_of_order(
    client: &mut CoordinatorClient<Channel>,
    worker: &mut WorkerDataClient<Channel>,
    job_id: u64,
) {
    let opened = client
        .open_session(OpenSessionRequest {
            job_id,
            epoch: 7,
            ..OpenSessionRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    let token = opened.session.unwrap();
    let update = |session: SessionToken| SessionUpdateRequest {
        session: Some(session),
        ..SessionUpdateRequest::default()
    };
    let never_opened = SessionToken {
        session_id: 1_000_000,
        ..token
    };
    refused(
        client.update_session(update(never_opened)).await,
        Code::NotFound,
        "unknown session 1000000",
    );
    let other_run = SessionToken {
        incarnation: token.incarnation ^ 1,
        ..token
    };
    refused(
        client.update_session(update(other_run)).await,
        Code::FailedPrecondition,
        "earlier run of the coordinator",
    );
    let past_the_end = SessionUpdateRequest {
        acknowledged: vec![u64::MAX],
        ..update(token)
    };
    refused(
        client.update_session(past_the_end).await,
        Code::InvalidArgument,
        "past the end of the epoch",
    );
    let too_many_credits = SessionUpdateRequest {
        grant_credits: u64::MAX,
        ..update(token)
    };
    refused(
        client.update_session(too_many_credits).await,
        Code::InvalidArgument,
        "cannot grant",
    );
    let close = || CloseSessionRequest {
        session: Some(token),
    };
    client.close_session(close()).await.unwrap();
    refused(
        client.close_session(close()).await,
        Code::FailedPrecondition,
        "is closed",
    );
    refused(
        client.update_session(update(token)).await,
        Code::FailedPrecondition,
        "is closed",
    );

    // A stream asked for before any session: no token, nothing to name.
    refused(
        worker.subscribe(SubscribeRequest::default()).await,
        Code::InvalidArgument,
        "session token is missing",
    );

    // A worker reporting on a lease it was never given, and other calls no worker would make.
    refused(
        client.heartbeat(HeartbeatRequest { worker_id: 999 }).await,
        Code::NotFound,
        "unknown worker 999",
    );
    refused(
        client
            .register_worker(RegisterWorkerRequest {
                data_address: "not an address".into(),
                ..RegisterWorkerRequest::default()
            })
            .await,
        Code::InvalidArgument,
        "is not host:port",
    );
    let fake = client
        .register_worker(RegisterWorkerRequest {
            data_address: "127.0.0.1:9".into(),
            ..RegisterWorkerRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    let unknown_lease = || ReportRequest {
        worker_id: fake.worker_id,
        completed: vec![0xdead_0000_0000],
        ..ReportRequest::default()
    };
    let lease = |max_tasks, report| LeaseRequest {
        worker_id: fake.worker_id,
        max_tasks,
        wait_ms: 0,
        report,
        full_sessions: Vec::new(),
    };
    refused(
        client.report(unknown_lease()).await,
        Code::NotFound,
        "unknown lease 0xdead00000000",
    );
    // The same report carried by a lease call is refused the same way.
    refused(
        client.lease(lease(1, Some(unknown_lease()))).await,
        Code::NotFound,
        "unknown lease 0xdead00000000",
    );
    refused(
        client.lease(lease(0, None)).await,
        Code::InvalidArgument,
        "max_tasks",
    );
}

/// Opens a session of `job_id` at `epoch` and asks the worker for its stream.
async fn session_with_stream(
    client: &mut CoordinatorClient<Channel>,
    worker: &mut WorkerDataClient<Channel>,
    job_id: u64,
    epoch: u64,
    credits: u64,
) -> (SessionToken, tonic::Streaming<proto::Batch>) {
    let token = client
        .open_session(OpenSessionRequest {
            job_id,
            epoch,
            ..OpenSessionRequest::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    let stream = worker
        .subscribe(SubscribeRequest {
            session: Some(token),
            job_id,
        })
        .await
        .unwrap()
        .into_inner();
    if credits > 0 {
        let grant = SessionUpdateRequest {
            session: Some(token),
            grant_credits: credits,
            ..SessionUpdateRequest::default()
        };
        client.update_session(grant).await.unwrap();
    }
    (token, stream)
}

/// A data-server client whose HTTP/2 windows are 64 KiB: once they are full, the worker can
/// send nothing more until it reads.
async fn small_window_client(address: &str) -> WorkerDataClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .initial_stream_window_size(64 << 10)
        .initial_connection_window_size(64 << 10)
        .connect()
        .await
        .unwrap();
    WorkerDataClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES)
}

/// Waits past the session timeout (and the coordinator's 250 ms expiry tick), then checks the
/// coordinator closed each session.
async fn assert_closed_after_timeout(
    client: &mut CoordinatorClient<Channel>,
    sessions: &[SessionToken],
) {
    tokio::time::sleep(SESSION_TIMEOUT + Duration::from_millis(750)).await;
    for token in sessions {
        let update = SessionUpdateRequest {
            session: Some(*token),
            ..SessionUpdateRequest::default()
        };
        refused(
            client.update_session(update).await,
            Code::FailedPrecondition,
            "is closed",
        );
    }
}

#[test]
fn hostile_requests_get_clear_errors_while_a_good_client_reads_on() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let data = root.join("data");
    common::make_images(&data, 200);
    let outside = dir.path().join("outside");
    common::make_images(&outside, 4);
    std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
    // An image folder whose second class is a link out of the root, and a folder of JSONL
    // files reached through a link that only a pattern enters.
    common::make_images(&root.join("linked_class"), 4);
    let class = std::fs::read_dir(&outside)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::os::unix::fs::symlink(&class, root.join("linked_class/zz_outside")).unwrap();
    std::fs::create_dir_all(dir.path().join("outside_text")).unwrap();
    std::fs::write(
        dir.path().join("outside_text/secret.jsonl"),
        "{\"text\": \"x\"}\n",
    )
    .unwrap();
    std::fs::create_dir_all(root.join("globs")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("outside_text"), root.join("globs/lnk")).unwrap();
    let max_sessions = MAX_SESSIONS.to_string();
    let session_timeout = SESSION_TIMEOUT.as_millis().to_string();
    let coordinator = Daemon::coordinator_with(
        &dir.path().join("state"),
        "127.0.0.1:0",
        &[
            "--session-timeout-ms",
            &session_timeout,
            "--max-sessions",
            &max_sessions,
        ],
    );
    let worker = Daemon::worker_with(
        &coordinator.address,
        &root,
        &["--delivery-timeout-ms", "1000"],
    );

    // The well-behaved client: rank 0 of a two-rank job, at a trainer's pace, its last step
    // taken only once the hostile client is done.
    let hostile_done = Arc::new(AtomicBool::new(false));
    let good = {
        let address = coordinator.address.clone();
        let spec = spec(&data, 0);
        let hostile_done = hostile_done.clone();
        std::thread::spawn(move || {
            let loader = remote(&address, spec).unwrap();
            let steps = loader.steps_per_epoch();
            let mut stream = loader.epoch(0, 0).unwrap();
            let mut digest = BatchDigest::new();
            for step in 0..steps {
                if step + 1 == steps {
                    while !hostile_done.load(Ordering::Acquire) {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
                let batch = stream.next_batch().unwrap().expect("a batch per step");
                assert_eq!(batch.step, step);
                digest.update(&batch);
                std::thread::sleep(Duration::from_millis(200));
            }
            assert!(stream.next_batch().unwrap().is_none(), "the epoch ends");
            digest.hex()
        })
    };

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut client = common::coordinator_client(&coordinator.address).await;
        let mut data_client = WorkerDataClient::connect(format!("http://{}", worker.address))
            .await
            .unwrap()
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        malformed_jobs(&mut client, &root, &outside).await;

        // A job of large batches (8 x 224 x 224 x 3 bytes, 25 steps) for the streams below.
        let mut big = common::train_spec(&data, 8);
        big.pipeline = stoker_pipeline::presets::imagenet_train(224);
        let big = client
            .register_job(register(big))
            .await
            .unwrap()
            .into_inner();
        out_of_order(&mut client, &mut data_client, big.job_id).await;

        // A stream that never takes a batch, credits granted once: the worker holds at most
        // the stream's queue, gives up on it after its delivery timeout and ends it.
        let worker_rss = worker.rss_kib();
        let mut stalled_client = small_window_client(&worker.address).await;
        let steps = big.steps_per_epoch;
        let (stalled, mut stalled_stream) =
            session_with_stream(&mut client, &mut stalled_client, big.job_id, 0, steps).await;
        // Never granting: a session and a stream, and nothing else.
        let (silent, _silent_stream) =
            session_with_stream(&mut client, &mut data_client, big.job_id, 1, 0).await;
        // Vanishing mid-stream: one batch read, then the connection dropped.
        let mut vanishing_client = small_window_client(&worker.address).await;
        let (vanished, mut stream) =
            session_with_stream(&mut client, &mut vanishing_client, big.job_id, 2, steps).await;
        stream.message().await.unwrap().expect("a first batch");
        drop(stream);
        drop(vanishing_client);

        tokio::time::sleep(Duration::from_secs(3)).await;
        let grown = worker.rss_kib().saturating_sub(worker_rss);
        assert!(
            grown < 128 << 10,
            "the worker grew by {grown} KiB with a stream that takes nothing"
        );
        assert_closed_after_timeout(&mut client, &[stalled, silent, vanished]).await;
        // Reading now yields what the stream had queued, then its end: not the whole epoch.
        let drained = tokio::time::timeout(Duration::from_secs(15), async {
            let mut batches = 0;
            while let Ok(Some(_)) = stalled_stream.message().await {
                batches += 1;
            }
            batches
        })
        .await
        .expect("the worker ended the stream that took nothing");
        assert!(drained < steps, "{drained} of {steps} batches were queued");

        // A flood of sessions: refused past --max-sessions, and room again once they time out.
        let coordinator_rss = coordinator.rss_kib();
        let mut opened = 0;
        for epoch in 100..600 {
            let request = OpenSessionRequest {
                job_id: big.job_id,
                epoch,
                ..OpenSessionRequest::default()
            };
            match client.open_session(request).await {
                Ok(_) => opened += 1,
                Err(status) => {
                    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                    assert!(status.message().contains("--max-sessions"), "{status:?}");
                }
            }
        }
        assert!(
            opened > 0 && opened < MAX_SESSIONS,
            "{opened} sessions opened"
        );
        let grown = coordinator.rss_kib().saturating_sub(coordinator_rss);
        assert!(grown < 32 << 10, "the coordinator grew by {grown} KiB");
        tokio::time::sleep(SESSION_TIMEOUT + Duration::from_millis(750)).await;
        let request = OpenSessionRequest {
            job_id: big.job_id,
            epoch: 600,
            ..OpenSessionRequest::default()
        };
        client.open_session(request).await.unwrap();
    });
    hostile_done.store(true, Ordering::Release);

    let digest = good.join().expect("the well-behaved client read its epoch");
    assert_eq!(digest, embedded(spec(&data, 0)).0);
    assert!(
        started.elapsed() < Duration::from_secs(90),
        "took {:?}",
        started.elapsed()
    );
}
