//! The worker daemon, the coordinator service and the remote client in one process, on an
//! in-memory network (`stoker_rpc::network`): the code the daemons run, with tonic's stack and
//! the token checks, and connections a test can cut. Each epoch is compared bit for bit with the
//! embedded loader's. The same paths with real processes and sockets are `cli/tests/it/`'s.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stoker_coordinator::{CoordinatorConfig, CoordinatorService, CoordinatorServiceConfig};
use stoker_datasets::{generate_imagenet_like, SyntheticImageNetSpec};
use stoker_loader::session_updates::ANSWER_AFTER_ACKS;
use stoker_loader::{BatchDigest, ErrorKind, Loader, LoaderOptions, RemoteOptions};
use stoker_proto::v1::{self as proto, JobSpec};
use stoker_rpc::health::Health;
use stoker_rpc::network::{MemoryNetwork, Network};
use stoker_rpc::security::{ClientSecurity, ServerSecurity, Token};
use stoker_worker_daemon::{run_worker_incoming, WorkerConfig, DRAIN_TIMEOUT, JOB_IDLE};
use tokio::sync::oneshot;

type TestResult = Result<(), Box<dyn std::error::Error>>;

use super::proxy_coordinator as proxy;

const COORDINATOR: &str = "coordinator:7070";

/// The worker of [`one_worker`].
const WORKER: &str = "worker-a:7001";

/// A coordinator and `workers` worker daemons on `network`, accepting `token` if given, on a
/// runtime of their own; they stop when it is dropped.
struct Cluster {
    coordinator: CoordinatorService,
    _runtime: tokio::runtime::Runtime,
    _stops: Vec<oneshot::Sender<()>>,
}

fn start_cluster(
    network: &MemoryNetwork,
    data: &Path,
    state: &Path,
    workers: &[&str],
    token: Option<&Token>,
) -> Result<Cluster, Box<dyn std::error::Error>> {
    start_cluster_with(network, data, state, workers, token, |_| {})
}

/// [`start_cluster`] with each worker's configuration changed by `tune`.
fn start_cluster_with(
    network: &MemoryNetwork,
    data: &Path,
    state: &Path,
    workers: &[&str],
    token: Option<&Token>,
    tune: impl Fn(&mut WorkerConfig),
) -> Result<Cluster, Box<dyn std::error::Error>> {
    start_cluster_of(network, (data, state), workers, token, tune, None)
}

/// [`start_cluster_with`], the coordinator served behind `proxy` when one is given.
fn start_cluster_of(
    network: &MemoryNetwork,
    (data, state): (&Path, &Path),
    workers: &[&str],
    token: Option<&Token>,
    tune: impl Fn(&mut WorkerConfig),
    proxy: Option<proxy::Proxy>,
) -> Result<Cluster, Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let tokens: Vec<Token> = token.into_iter().cloned().collect();
    let mut stops = Vec::new();
    let config = CoordinatorServiceConfig {
        core: CoordinatorConfig {
            lease_timeout: Duration::from_secs(2),
            journal_every: u64::MAX,
            ..CoordinatorConfig::default()
        },
        server_security: ServerSecurity::new(tokens.clone(), None)?,
        client_security: ClientSecurity::new(token.cloned(), None, None)?,
        network: Network::Memory(network.clone()),
        ..CoordinatorServiceConfig::default()
    };
    let coordinator = CoordinatorService::open(state, config)?;
    let (stop, stopped) = oneshot::channel::<()>();
    stops.push(stop);
    let incoming = network.listen(COORDINATOR);
    let stopped = async {
        let _ = stopped.await;
    };
    match proxy {
        None => {
            runtime.spawn(coordinator.clone().serve_incoming(incoming, stopped));
        }
        Some(proxy) => {
            let proxied = proxy::Coordinator::new(coordinator.clone(), proxy);
            runtime.spawn(proxy::serve(proxied, incoming, stopped));
        }
    }
    let mut cluster = Cluster {
        coordinator,
        _runtime: runtime,
        _stops: stops,
    };
    for address in workers {
        let mut config = worker_config(network, address, data, token)?;
        tune(&mut config);
        cluster.add_worker(network, config);
    }
    Ok(cluster)
}

/// The configuration of the worker at `address` serving `data` with `token`.
fn worker_config(
    network: &MemoryNetwork,
    address: &str,
    data: &Path,
    token: Option<&Token>,
) -> Result<WorkerConfig, Box<dyn std::error::Error>> {
    let tokens: Vec<Token> = token.into_iter().cloned().collect();
    Ok(WorkerConfig {
        coordinator: COORDINATOR.into(),
        advertise: address.into(),
        threads: 1,
        data_roots: vec![data.to_path_buf()],
        lease_ahead: 2,
        report_interval: Duration::from_millis(5),
        server_security: ServerSecurity::new(tokens, None)?,
        client_security: ClientSecurity::new(token.cloned(), None, None)?,
        network: Network::Memory(network.clone()),
        delivery_timeout: Duration::from_secs(2),
        drain_timeout: DRAIN_TIMEOUT,
        health: Health::starting("registering"),
        job_idle: JOB_IDLE,
    })
}

impl Cluster {
    /// Starts a worker daemon with `config` on `network`; it stops with the cluster.
    fn add_worker(&mut self, network: &MemoryNetwork, config: WorkerConfig) {
        let (stop, stopped) = oneshot::channel::<()>();
        self._stops.push(stop);
        let incoming = network.listen(&config.advertise);
        self._runtime
            .spawn(run_worker_incoming(config, incoming, async {
                let _ = stopped.await;
            }));
    }

    /// Waits (at most 10 s) until `count` workers are registered.
    fn wait_for_workers(&self, count: usize) -> TestResult {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while self.coordinator.workers().len() < count {
            if std::time::Instant::now() > until {
                return Err(format!("{count} workers did not register within 10 s").into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

/// A 60-image folder, a journal folder, a network and a cluster of one worker on it.
fn one_worker() -> Result<
    (tempfile::TempDir, tempfile::TempDir, MemoryNetwork, Cluster),
    Box<dyn std::error::Error>,
> {
    one_worker_with(|_| {})
}

/// [`one_worker`] with the worker's configuration changed by `tune`.
fn one_worker_with(
    tune: impl Fn(&mut WorkerConfig),
) -> Result<
    (tempfile::TempDir, tempfile::TempDir, MemoryNetwork, Cluster),
    Box<dyn std::error::Error>,
> {
    let data = tempfile::tempdir()?;
    images(data.path())?;
    let state = tempfile::tempdir()?;
    let network = MemoryNetwork::new();
    let cluster = start_cluster_with(&network, data.path(), state.path(), &[WORKER], None, tune)?;
    Ok((data, state, network, cluster))
}

/// [`one_worker`] with the coordinator served behind `proxy`.
fn one_worker_behind(
    proxy: proxy::Proxy,
) -> Result<
    (tempfile::TempDir, tempfile::TempDir, MemoryNetwork, Cluster),
    Box<dyn std::error::Error>,
> {
    let data = tempfile::tempdir()?;
    images(data.path())?;
    let state = tempfile::tempdir()?;
    let network = MemoryNetwork::new();
    let paths = (data.path(), state.path());
    let cluster = start_cluster_of(
        &network,
        paths,
        &["worker-a:7001"],
        None,
        |_| {},
        Some(proxy),
    )?;
    Ok((data, state, network, cluster))
}

/// A shuffled imagenet-train job (32 px) over `data`, batches of 6.
fn spec(data: &Path) -> JobSpec {
    JobSpec {
        dataset: Some(proto::DatasetSource {
            uri: data.to_string_lossy().into_owned(),
            ..proto::DatasetSource::default()
        }),
        pipeline: stoker_pipeline::presets::imagenet_train(32),
        batch_size: 6,
        seed: 3,
        shuffle: true,
        world_size: 1,
        ..JobSpec::default()
    }
}

fn remote(
    network: &MemoryNetwork,
    data: &Path,
    token: Option<Token>,
) -> stoker_loader::Result<Loader> {
    remote_with(network, data, token, Duration::from_secs(2))
}

fn remote_with(
    network: &MemoryNetwork,
    data: &Path,
    token: Option<Token>,
    stall_reopen: Duration,
) -> stoker_loader::Result<Loader> {
    Loader::remote(
        COORDINATOR,
        spec(data),
        LoaderOptions {
            prefetch: 3,
            deadline: Duration::from_secs(60),
            ..LoaderOptions::default()
        },
        RemoteOptions {
            connect_timeout: Duration::from_secs(20),
            stall_reopen,
            worker_grace: Duration::from_secs(30),
            token,
            network: Network::Memory(network.clone()),
            ..RemoteOptions::default()
        },
    )
}

/// The embedded loader's epoch 0 of [`spec`]: its digest and steps.
fn embedded(data: &Path) -> Result<(String, u64), Box<dyn std::error::Error>> {
    embedded_of(spec(data))
}

/// The embedded loader's epoch 0 of `job`: its digest and steps.
fn embedded_of(job: JobSpec) -> Result<(String, u64), Box<dyn std::error::Error>> {
    let loader = Loader::new(job, LoaderOptions::default())?;
    let mut digest = BatchDigest::new();
    for batch in loader.epoch(0, 0)? {
        digest.update(&batch?);
    }
    Ok((digest.hex(), loader.steps_per_epoch()))
}

fn images(dir: &Path) -> TestResult {
    let spec = SyntheticImageNetSpec {
        count: 60,
        seed: 11,
        classes: 4,
    };
    generate_imagenet_like(dir, &spec, &|_| {})?;
    Ok(())
}

#[test]
fn an_epoch_over_the_network_equals_the_embedded_one_through_cut_worker_streams() -> TestResult {
    let data = tempfile::tempdir()?;
    images(data.path())?;
    let state = tempfile::tempdir()?;
    let (expected, steps) = embedded(data.path())?;
    let network = MemoryNetwork::new();
    let workers = ["worker-a:7001", "worker-b:7001"];
    let _cluster = start_cluster(&network, data.path(), state.path(), &workers, None)?;
    let loader = remote(&network, data.path(), None)?;
    assert_eq!(loader.steps_per_epoch(), steps);
    let mut digest = BatchDigest::new();
    let mut seen = Vec::new();
    for batch in loader.epoch(0, 0)? {
        let batch = batch?;
        // Twice in the epoch, every worker's streams break mid-flight: batches the workers
        // reported sent may be lost, and the steps the client reopens its session for may
        // arrive twice; it must hand each step out once, in order. (Which workers the client
        // has streams to by then is the leases' race: one worker may have served every step
        // so far.)
        if batch.step == steps / 3 || batch.step == 2 * steps / 3 {
            let cut: usize = workers.iter().map(|worker| network.cut(worker)).sum();
            assert!(cut >= 1, "the client's worker streams were not open");
        }
        seen.push(batch.step);
        digest.update(&batch);
    }
    assert_eq!(seen, (0..steps).collect::<Vec<_>>());
    assert_eq!(digest.hex(), expected);
    Ok(())
}

#[test]
fn an_epoch_through_a_coordinator_without_the_update_and_lease_streams_equals_the_embedded_one(
) -> TestResult {
    let refusals = proxy::Refusals::default();
    let (data, _state, network, _cluster) =
        one_worker_behind(proxy::Proxy::Older(refusals.clone()))?;
    let (expected, steps) = embedded(data.path())?;
    let loader = remote(&network, data.path(), None)?;
    let mut digest = BatchDigest::new();
    let mut seen = Vec::new();
    for batch in loader.epoch(0, 0)? {
        let batch = batch?;
        seen.push(batch.step);
        digest.update(&batch);
    }
    assert_eq!(seen, (0..steps).collect::<Vec<_>>());
    assert_eq!(digest.hex(), expected);
    // Both tried the stream first, and went on with a call each.
    let (updates, leases) = refusals.counts();
    assert!(
        updates >= 1 && leases >= 1,
        "refused: {updates} update streams, {leases} lease streams"
    );
    Ok(())
}

/// An `OpenSession` answer without its session token (a coordinator of another version, a
/// proxy that changed it) stopped the epoch naming no cause ("the session driver stopped").
#[test]
fn a_session_answer_without_its_token_is_named_as_the_cause() -> TestResult {
    let (data, _state, network, _cluster) = one_worker_behind(proxy::Proxy::NoSessionToken)?;
    let loader = remote(&network, data.path(), None)?;
    let error = loader
        .epoch(0, 0)
        .and_then(|stream| stream.collect::<stoker_loader::Result<Vec<_>>>())
        .expect_err("no session was opened");
    let message = error.to_string();
    assert!(
        message.contains("no session token") && message.contains(COORDINATOR),
        "{message}"
    );
    Ok(())
}

#[test]
fn the_loader_asks_for_an_answer_only_for_many_acks_on_the_way_at_the_epochs_end_and_for_credits_that_start_its_clock(
) -> TestResult {
    // A slow worker (each of its lease requests held 200 ms before the coordinator takes it):
    // the epoch lasts past the figures' 500 ms with credits outstanding, so an update carries
    // figures while nothing else asks.
    let recorded = proxy::Recorded::with_lease_delay(Duration::from_millis(200));
    let (data, _state, network, _cluster) =
        one_worker_behind(proxy::Proxy::Recording(recorded.clone()))?;
    let (expected, steps) = embedded(data.path())?;
    let loader = remote(&network, data.path(), None)?;
    let mut digest = BatchDigest::new();
    for (k, batch) in loader.epoch(0, 0)?.enumerate() {
        digest.update(&batch?);
        // As fast as the batches come (credits granted with some outstanding go quiet), but
        // for one pause long enough for every batch asked for to arrive (two of the worker's
        // lease round trips, whatever their phase): the credit after it is granted with
        // nothing outstanding, starts the stall clock and asks.
        if k == 4 {
            std::thread::sleep(Duration::from_millis(600));
        }
    }
    assert_eq!(digest.hex(), expected);
    drop(loader);
    let updates = recorded.updates();
    // Epoch 0's session is the first one updated (epoch 1's opens as epoch 0 ends).
    let first = updates
        .first()
        .map(|u| u.session)
        .ok_or("no session update")?;
    let session: Vec<&proxy::Update> = updates.iter().filter(|u| u.session == first).collect();
    // Every update goes on the stream, but for one: a loader stopped before its last answer
    // came sends the acks not known applied again, by a call of their own (granting nothing;
    // the coordinator may take it before the stream's last).
    let (epoch, calls): (Vec<&proxy::Update>, Vec<&proxy::Update>) =
        session.iter().partition(|u| u.streamed);
    assert!(
        calls.len() <= 1 && calls.iter().all(|u| u.credits == 0),
        "{session:?}"
    );
    // Replay the client's count: an update's acks are the arrivals since the one before, and
    // its credits are asked for from then on; the acks on the way are those sent since the
    // last answer (one worker: its list changes once, answered at the first update).
    let (mut granted, mut received, mut on_the_way) = (0u64, 0u64, 0usize);
    let (mut asked, mut quiet) = (0, 0);
    for (k, update) in epoch.iter().enumerate() {
        received += update.acks as u64;
        on_the_way += update.acks;
        let outstanding = granted
            .checked_sub(received)
            .ok_or_else(|| format!("update {k} acknowledges more than was granted: {epoch:?}"))?;
        let all_in = received >= steps;
        let starts_clock = outstanding == 0 && update.credits > 0;
        let asks = on_the_way >= ANSWER_AFTER_ACKS || all_in || starts_clock;
        assert_eq!(
            update.quiet, !asks,
            "update {k} of {}: {update:?}, {outstanding} outstanding, {received} of {steps} received",
            epoch.len()
        );
        if asks || k == 0 {
            on_the_way = 0;
        }
        if asks {
            asked += 1;
        } else {
            quiet += 1;
        }
        granted += update.credits;
    }
    assert_eq!(received, steps, "{epoch:?}");
    // The first update carries the figures (and, like every other carrying them, asks only
    // by the rule above); the first credits start the clock, the last update ends the epoch,
    // one more starts the clock after the pause; the rest go quiet.
    assert!(epoch[0].stats, "{session:?}");
    // Figures sent later, mid-epoch with credits outstanding, went quiet.
    assert!(
        epoch.iter().skip(1).any(|u| u.stats && u.quiet),
        "no quiet update carried figures: {epoch:?}"
    );
    let first_credits = epoch.iter().find(|u| u.credits > 0);
    assert!(first_credits.is_some_and(|u| !u.quiet), "{session:?}");
    assert!(epoch.last().is_some_and(|u| !u.quiet));
    assert!(
        quiet >= 1 && asked >= 3,
        "{quiet} quiet and {asked} asking updates: {epoch:?}"
    );
    Ok(())
}

#[test]
fn a_consumer_pausing_longer_than_stall_reopen_reopens_nothing() -> TestResult {
    let (data, _state, network, cluster) = one_worker()?;
    let loader = remote_with(&network, data.path(), None, Duration::from_millis(800))?;
    let steps = loader.steps_per_epoch();
    let mut seen = Vec::new();
    for batch in loader.epoch(0, 0)? {
        seen.push(batch?.step);
        // A training step (or an evaluation) longer than stall_reopen: the batches asked for
        // meanwhile arrive, and the next is asked for only after it. Nothing stalled.
        std::thread::sleep(Duration::from_millis(1200));
    }
    assert_eq!(seen, (0..steps).collect::<Vec<_>>());
    // One session for epoch 0, one for epoch 1 (started early, at the end of epoch 0): no
    // reopen.
    assert_eq!(cluster.coordinator.core_stats().session_opens, 2);
    Ok(())
}

/// A batch slower to build than `stall_reopen` (large images, a slow store) was leased again
/// at every reopen, its build thrown away each time: the epoch never advanced. The wait
/// doubles at each reopen for nothing, so the batches arrive and equal the embedded ones.
#[test]
fn batches_slower_to_build_than_the_stall_wait_still_arrive() -> TestResult {
    let (data, _state, network, cluster) = one_worker_with(|config| config.threads = 1)?;
    // Batches of 60 images on one thread, each longer to build than the 50 ms wait (and than
    // the driver's 50 ms look at it).
    let job = JobSpec {
        batch_size: 60,
        ..spec(data.path())
    };
    let (expected, steps) = embedded_of(job.clone())?;
    let (taken, reader) = read_remote_epoch(
        &network,
        job,
        1,
        (Duration::from_secs(30), Duration::from_millis(50)),
    )?;
    let digest = reader.join().map_err(|_| "the reader panicked")??;
    assert_eq!(digest, expected);
    assert_eq!(taken.try_iter().count() as u64, steps);
    // Some reopens while the wait grew (50 ms to 3.2 s at most), not one per batch.
    let opens = cluster.coordinator.core_stats().session_opens;
    assert!(opens <= 1 + 7, "{opens} session opens");
    Ok(())
}

/// A client of another job (seed 4) over `data`, its job registered and its session open, as
/// the coordinator's client of a trainer that will take nothing: the client, the job and the
/// session.
async fn other_jobs_session(
    network: &MemoryNetwork,
    data: &Path,
) -> Result<Session, Box<dyn std::error::Error>> {
    let job = JobSpec {
        seed: 4,
        ..spec(data)
    };
    session_of(network, job).await
}

/// A coordinator client, a job's id and a session of it.
type Session = (
    proto::coordinator_client::CoordinatorClient<stoker_rpc::transport::RpcChannel>,
    u64,
    Option<proto::SessionToken>,
);

/// A client of `job`, its job registered and its session open, as the coordinator's client of
/// a trainer that will take nothing: the client, the job and the session.
async fn session_of(
    network: &MemoryNetwork,
    job: JobSpec,
) -> Result<Session, Box<dyn std::error::Error>> {
    let security = ClientSecurity::new(None, None, None)?;
    let mut client = proto::coordinator_client::CoordinatorClient::new(
        Network::Memory(network.clone()).channel(COORDINATOR, &security)?,
    );
    let job_id = client
        .register_job(proto::RegisterJobRequest {
            spec: Some(job),
            weight: 0,
        })
        .await?
        .into_inner()
        .job_id;
    let session = client
        .open_session(proto::OpenSessionRequest {
            job_id,
            ..proto::OpenSessionRequest::default()
        })
        .await?
        .into_inner()
        .session;
    Ok((client, job_id, session))
}

/// Grants `session` `credits` more.
async fn grant(
    client: &mut proto::coordinator_client::CoordinatorClient<stoker_rpc::transport::RpcChannel>,
    session: Option<proto::SessionToken>,
    credits: u64,
) -> TestResult {
    client
        .update_session(proto::SessionUpdateRequest {
            session,
            grant_credits: credits,
            ..proto::SessionUpdateRequest::default()
        })
        .await?;
    Ok(())
}

#[test]
fn a_client_that_never_takes_its_batches_is_leased_no_more_once_its_credits_are_spent() -> TestResult
{
    let (data, _state, network, cluster) = one_worker()?;
    // A client that registers its job, opens its session and grants credits, then never opens
    // a stream (killed, say): the worker's deliveries to it find nobody.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // One credit first, until its task came back unclaimed: the job is open on the worker
    // then, so none of the seven after it goes back while the job opens (and is leased again).
    let (silent, mut client, session) = runtime.block_on(async {
        let (mut client, job, session) = other_jobs_session(&network, data.path()).await?;
        grant(&mut client, session, 1).await?;
        Ok::<_, Box<dyn std::error::Error>>((job, client, session))
    })?;
    let granted = std::time::Instant::now();
    while cluster.coordinator.core_stats().failed_leases == 0 {
        assert!(
            granted.elapsed() < Duration::from_secs(10),
            "never came back"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    runtime.block_on(grant(&mut client, session, 7))?;
    // A live client's epoch beside it. Each task of the silent session holds a delivery slot
    // for the delivery timeout (2 s) and comes back unclaimed, its credit spent: once its 8
    // credits are, it is leased no more (before, the credit came back and it was leased again
    // and again, the most starved session, for as long as the live epoch ran).
    let loader = remote(&network, data.path(), None)?;
    let steps = loader.steps_per_epoch();
    let mut seen = Vec::new();
    for batch in loader.epoch(0, 0)? {
        seen.push(batch?.step);
    }
    assert_eq!(seen, (0..steps).collect::<Vec<_>>());
    // Past two more delivery timeouts nothing of it is left in flight or leased again.
    std::thread::sleep(Duration::from_secs(5));
    // Eight leases, each failed unclaimed (the live client's own, when a slow machine makes it
    // reopen, may fail too: they are not counted against the silent job).
    let stats = cluster.coordinator.core_stats();
    assert_eq!(cluster.coordinator.job_share(silent).leased, 8, "{stats:?}");
    assert!(stats.failed_leases >= 8, "{stats:?}");
    assert_eq!(stats.leased_tasks, 0, "{stats:?}");
    Ok(())
}

/// A client's stream of `session`'s batches from the worker of [`one_worker`]: the worker's
/// client and the stream.
async fn worker_stream(
    network: &MemoryNetwork,
    session: Option<proto::SessionToken>,
    job_id: u64,
) -> Result<(WorkerClient, tonic::Streaming<proto::Batch>), Box<dyn std::error::Error>> {
    let security = ClientSecurity::new(None, None, None)?;
    let mut worker = proto::worker_data_client::WorkerDataClient::new(
        Network::Memory(network.clone()).channel(WORKER, &security)?,
    )
    .max_decoding_message_size(stoker_rpc::transport::MAX_MESSAGE_BYTES);
    let stream = worker
        .subscribe(proto::SubscribeRequest { session, job_id })
        .await?
        .into_inner();
    Ok((worker, stream))
}

/// A client of a worker's data service.
type WorkerClient = proto::worker_data_client::WorkerDataClient<stoker_rpc::transport::RpcChannel>;

/// A live client's epoch over `data`, checked whole and done within 8 s beside `beside` (another
/// client's tasks on the same worker).
fn live_epoch_in_time(network: &MemoryNetwork, data: &Path, beside: &str) -> TestResult {
    let started = std::time::Instant::now();
    let loader = remote(network, data, None)?;
    let steps = loader.steps_per_epoch();
    let mut seen = Vec::new();
    for batch in loader.epoch(0, 0)? {
        seen.push(batch?.step);
    }
    assert_eq!(seen, (0..steps).collect::<Vec<_>>());
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(8),
        "the live epoch took {took:?} beside {beside}"
    );
    Ok(())
}

/// A client that dies after opening its stream (the stream closes; its session stays open
/// until the coordinator's session timeout, and its credits keep its tasks leased) holds none of
/// the worker's deliveries: each of its tasks comes back unclaimed at once, unbuilt, so
/// another job's epoch on the same worker goes on. Before, each waited the whole delivery
/// timeout (10 s here) for a stream that would never come, on one of the worker's four delivery
/// permits: 16 such tasks held the worker for 40 s.
#[test]
fn a_dead_clients_closed_stream_holds_up_no_other_jobs_epoch() -> TestResult {
    let (data, _state, network, cluster) =
        one_worker_with(|config| config.delivery_timeout = Duration::from_secs(10))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let (mut client, job_id, session) = other_jobs_session(&network, data.path()).await?;
        let (worker, stream) = worker_stream(&network, session, job_id).await?;
        // The client dies: its stream goes, its session and credits stay.
        drop(stream);
        drop(worker);
        tokio::time::sleep(Duration::from_millis(200)).await;
        grant(&mut client, session, 16).await
    })?;
    live_epoch_in_time(&network, data.path(), "the dead client's tasks")?;
    let stats = cluster.coordinator.core_stats();
    assert!(stats.failed_leases >= 1, "{stats:?}");
    Ok(())
}

/// A client that reads its stream slowly but steadily (one 6 MiB batch every 2 s: never
/// stalled) holds up no other job's epoch on the worker: a batch is built once its stream has
/// room for it, and the tasks waiting for room wait aside, holding none of the worker's
/// delivery permits. Before, each of the four permits held a built batch waiting for room in
/// the slow stream's full queue, and every other job went at that client's pace (one batch a
/// permit freed, every 2 s).
#[test]
fn a_slow_reader_holds_up_no_other_jobs_epoch() -> TestResult {
    let (data, _state, network, cluster) =
        one_worker_with(|config| config.delivery_timeout = Duration::from_secs(10))?;
    // The slow client's reader runs beside the live epoch, on a runtime of its own.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let (read, read_rx) = std::sync::mpsc::channel();
    runtime.block_on(async {
        let slow = JobSpec {
            pipeline: stoker_pipeline::presets::imagenet_train(1024),
            batch_size: 2,
            ..spec(data.path())
        };
        let (mut client, job_id, session) = session_of(&network, slow).await?;
        let (worker, mut stream) = worker_stream(&network, session, job_id).await?;
        grant(&mut client, session, 30).await?;
        tokio::spawn(async move {
            let _keep = (client, worker);
            loop {
                let message = stream.message().await;
                let done = !matches!(message, Ok(Some(_)));
                let read_one = message
                    .map(|m| m.is_some())
                    .map_err(|status| status.to_string());
                if read.send(read_one).is_err() || done {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        });
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    // Its queue fills first, and its other tasks wait for room.
    let first = read_rx.recv_timeout(Duration::from_secs(20))?;
    assert_eq!(first, Ok(true));
    std::thread::sleep(Duration::from_secs(3));
    live_epoch_in_time(&network, data.path(), "a slow reader")?;
    // The worker holds few of the slow client's tasks waiting for room: once four wait (its
    // deliveries), its lease calls ask for none of that session's, and the rest of the 30
    // credits wait at the coordinator.
    let stats = cluster.coordinator.core_stats();
    assert!(stats.leased_tasks <= 8, "{stats:?}");
    // The slow client is served all along: its stream never ended for a stall.
    let mut read: Vec<_> = read_rx.try_iter().collect();
    for _ in 0..2 {
        read.push(read_rx.recv_timeout(Duration::from_secs(10))?);
    }
    assert!(read.iter().all(|r| r == &Ok(true)), "{read:?}");
    Ok(())
}

/// A client whose batches all fail (every sample corrupt, the fail policy) and who opens its
/// stream but reads nothing holds up no other job's epoch on the worker: each error goes into
/// the room reserved for it in that client's stream (eight fill its queue), and the tasks
/// after them wait for room aside. Before, the worker's lease loop waited for each error (up
/// to the delivery timeout, 10 s here), and every job the worker served with it.
#[test]
fn a_batch_error_no_client_takes_holds_up_no_other_jobs_epoch() -> TestResult {
    let root = tempfile::tempdir()?;
    let (good, bad) = (root.path().join("good"), root.path().join("bad"));
    images(&good)?;
    std::fs::create_dir_all(bad.join("cls"))?;
    for n in 0..16 {
        std::fs::write(
            bad.join("cls").join(format!("{n}.jpg")),
            b"\xff\xd8 not a jpeg",
        )?;
    }
    let state = tempfile::tempdir()?;
    let network = MemoryNetwork::new();
    let _cluster = start_cluster_with(
        &network,
        root.path(),
        state.path(),
        &[WORKER],
        None,
        |config| config.delivery_timeout = Duration::from_secs(10),
    )?;
    let failing = JobSpec {
        batch_size: 1,
        on_error: proto::BadSamplePolicy::Fail as i32,
        ..spec(&bad)
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let _unread = runtime.block_on(async {
        let (mut client, job_id, session) = session_of(&network, failing).await?;
        let (worker, stream) = worker_stream(&network, session, job_id).await?;
        grant(&mut client, session, 16).await?;
        Ok::<_, Box<dyn std::error::Error>>((client, worker, stream))
    })?;
    live_epoch_in_time(&network, &good, "the failing job's errors")
}

/// One outcome per step of an epoch: the batch's samples, or its error's kind (the failing
/// file named in it); and the digest of the batches that came.
type Outcomes = (Vec<Result<Vec<u64>, ErrorKind>>, String);

/// The outcomes of `batches`, each error checked to name `file`.
fn outcomes_of(
    batches: impl Iterator<Item = stoker_loader::Result<stoker_loader::Batch>>,
    file: &str,
) -> Outcomes {
    let mut digest = BatchDigest::new();
    let mut outcomes = Vec::new();
    for batch in batches {
        outcomes.push(match batch {
            Ok(batch) => {
                digest.update(&batch);
                Ok(batch.sample_indices.clone())
            }
            Err(error) => {
                assert!(error.to_string().contains(file), "{error}");
                Err(error.kind())
            }
        });
    }
    (outcomes, digest.hex())
}

/// A batch that fails on a worker (a corrupt sample under the fail policy) fails that step
/// alone, as in process: the client raises its error for that step and reads on, every other
/// batch bit-identical to the embedded loader's, and the epoch ends. Before, the first such
/// error stopped the client's session: every later `next()` raised "the session driver
/// stopped", and the epoch never ended.
#[test]
fn a_batch_that_fails_on_a_worker_fails_that_step_alone_as_in_process() -> TestResult {
    let data = tempfile::tempdir()?;
    images(data.path())?;
    let class = std::fs::read_dir(data.path())?
        .flatten()
        .map(|entry| entry.path())
        .find(|path| path.is_dir())
        .ok_or("no class folder")?;
    // More failed steps than the loader's six slots.
    for n in 0..16 {
        let corrupt = class.join(format!("zz_corrupt_{n}.jpg"));
        std::fs::write(corrupt, b"\xff\xd8\xff\xe0 not really a jpeg")?;
    }
    let state = tempfile::tempdir()?;
    let network = MemoryNetwork::new();
    let workers = ["worker-a:7001", "worker-b:7002"];
    let cluster = start_cluster(&network, data.path(), state.path(), &workers, None)?;
    cluster.wait_for_workers(2)?;
    let job = JobSpec {
        on_error: proto::BadSamplePolicy::Fail as i32,
        ..spec(data.path())
    };
    let embedded = Loader::new(job.clone(), LoaderOptions::default())?;
    let want = outcomes_of(embedded.epoch(0, 0)?, "zz_corrupt_");
    let failed = want.0.iter().filter(|o| o.is_err()).count();
    assert!((7..want.0.len()).contains(&failed), "{want:?}");
    let loader = remote_epoch_by_epoch(&network, job)?;
    let got = outcomes_of(loader.epoch(0, 0)?, "zz_corrupt_");
    assert_eq!(got, want);
    Ok(())
}

/// A job slow to open on a worker (a large folder listed, a slow store; here its spec held at
/// the coordinator) holds up no other job's epoch on that worker: the worker opens it beside
/// the tasks it serves, and builds its waiting tasks once it has opened. Before, the worker's
/// task loop waited on the opening, and every other job it served with it. The opening holds
/// as many tasks as the worker leases ahead (2): the others go back for workers that may
/// serve them, and come back here once the job is open.
#[test]
fn a_job_slow_to_open_holds_up_no_other_jobs_epoch_on_the_worker() -> TestResult {
    let recorded = proxy::Recorded::default();
    let (data, _state, network, cluster) =
        one_worker_behind(proxy::Proxy::Recording(recorded.clone()))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // The slow job: its client's stream open, eight credits granted, its spec held.
    let (slow, mut stream) = runtime.block_on(async {
        let (mut client, job_id, session) = other_jobs_session(&network, data.path()).await?;
        recorded.hold_job(job_id);
        let (_worker, stream) = worker_stream(&network, session, job_id).await?;
        grant(&mut client, session, 8).await?;
        Ok::<_, Box<dyn std::error::Error>>((job_id, stream))
    })?;
    let leased = std::time::Instant::now();
    while cluster.coordinator.core_stats().failed_leases == 0 {
        assert!(
            leased.elapsed() < Duration::from_secs(10),
            "no task went back: {:?}",
            cluster.coordinator.job_share(slow)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Another job's whole epoch while the slow one opens, as the embedded loader reads it.
    let (expected, steps) = embedded(data.path())?;
    let (done, read) = std::sync::mpsc::channel();
    let reader = {
        let (network, data) = (network.clone(), data.path().to_path_buf());
        std::thread::spawn(move || {
            let epoch = || -> stoker_loader::Result<(String, u64)> {
                let loader = remote(&network, &data, None)?;
                let mut digest = BatchDigest::new();
                let mut read = 0;
                for batch in loader.epoch(0, 0)? {
                    digest.update(&batch?);
                    read += 1;
                }
                Ok((digest.hex(), read))
            };
            let _ = done.send(epoch());
        })
    };
    let epoch = read.recv_timeout(Duration::from_secs(30));
    recorded.release_job(slow);
    let _ = reader.join();
    let (digest, read) = epoch.map_err(|_| "the epoch waited on the other job's opening")??;
    assert_eq!((digest, read), (expected, steps));
    // The slow job's tasks are built once it opens, and reach its client.
    runtime.block_on(async {
        for _ in 0..8 {
            let batch = tokio::time::timeout(Duration::from_secs(20), stream.message()).await;
            assert!(matches!(batch, Ok(Ok(Some(_)))), "{batch:?}");
        }
        Ok(())
    })
}

#[test]
fn a_client_without_the_clusters_token_is_refused_by_name() -> TestResult {
    let data = tempfile::tempdir()?;
    images(data.path())?;
    let state = tempfile::tempdir()?;
    let network = MemoryNetwork::new();
    let token = Token::new("cluster-token")?;
    let _cluster = start_cluster(
        &network,
        data.path(),
        state.path(),
        &["worker-a:7001"],
        Some(&token),
    )?;
    for presented in [None, Some(Token::new("not-the-token")?)] {
        let error = remote(&network, data.path(), presented)
            .err()
            .ok_or("a client with no or a wrong token was served")?;
        assert_eq!(error.kind(), ErrorKind::Unauthenticated, "{error}");
    }
    let (expected, _) = embedded(data.path())?;
    let loader = remote(&network, data.path(), Some(token))?;
    let mut digest = BatchDigest::new();
    for batch in loader.epoch(0, 0)? {
        digest.update(&batch?);
    }
    assert_eq!(digest.hex(), expected);
    Ok(())
}

/// A client of `job` that asks for nothing of an epoch before it starts it (so a job is idle
/// between epochs).
fn remote_epoch_by_epoch(network: &MemoryNetwork, job: JobSpec) -> stoker_loader::Result<Loader> {
    Loader::remote(
        COORDINATOR,
        job,
        LoaderOptions {
            prefetch: 2,
            deadline: Duration::from_secs(60),
            prefetch_next_epoch: false,
            ..LoaderOptions::default()
        },
        RemoteOptions {
            connect_timeout: Duration::from_secs(20),
            network: Network::Memory(network.clone()),
            ..RemoteOptions::default()
        },
    )
}

/// Whether this process maps `path` (the worker of these tests runs in it).
fn mapped(path: &Path) -> Result<bool, Box<dyn std::error::Error>> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let path = path.canonicalize()?;
    Ok(maps
        .lines()
        .any(|line| line.ends_with(&*path.to_string_lossy())))
}

#[test]
fn a_worker_lets_go_of_a_job_no_task_used_for_its_idle_time_and_opens_it_again() -> TestResult {
    let idle = Duration::from_secs(2);
    let (data, _state, network, _cluster) = one_worker_with(|config| config.job_idle = idle)?;
    let tokens = data.path().join("train.bin");
    let bytes: Vec<u8> = (0..4_000u16).flat_map(u16::to_le_bytes).collect();
    std::fs::write(&tokens, bytes)?;
    let windows = proto::Op {
        op: Some(proto::op::Op::TokenWindows(proto::TokenWindows {
            seq_len: 16,
            ..Default::default()
        })),
    };
    let job = JobSpec {
        dataset: Some(proto::DatasetSource {
            uri: format!("file://{}", tokens.display()),
            ..proto::DatasetSource::default()
        }),
        pipeline: vec![windows],
        batch_size: 8,
        seed: 3,
        shuffle: true,
        world_size: 1,
        ..JobSpec::default()
    };
    let loader = remote_epoch_by_epoch(&network, job)?;
    // Each epoch's digest, and whether the worker mapped the file while it was read (looked at
    // after the first batch, with the job in use).
    let epoch = |epoch| -> Result<(String, bool), Box<dyn std::error::Error>> {
        let mut digest = BatchDigest::new();
        let mut mapped_then = false;
        for (i, batch) in loader.epoch(epoch, 0)?.enumerate() {
            digest.update(&batch?);
            if i == 0 {
                mapped_then = mapped(&tokens)?;
            }
        }
        Ok((digest.hex(), mapped_then))
    };
    let let_go = || -> Result<(), Box<dyn std::error::Error>> {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while mapped(&tokens)? && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(!mapped(&tokens)?, "the idle job's file is still mapped");
        Ok(())
    };
    let (first, mapped_then) = epoch(0)?;
    assert!(mapped_then, "the worker reads the token file through a map");
    // No task for longer than the idle time: the worker closes the job's file.
    let_go()?;
    // The next task opens it again; the batches are the same.
    assert_eq!(epoch(0)?, (first, true));
    // Let go again, and the file grows meanwhile: the reopened job is refused, by name,
    // rather than read in another order.
    let_go()?;
    let bytes: Vec<u8> = (0..8_000u16).flat_map(u16::to_le_bytes).collect();
    std::fs::write(&tokens, bytes)?;
    let refused = epoch(1).expect_err("a job whose dataset changed is refused");
    assert!(refused.to_string().contains("dataset changed"), "{refused}");
    Ok(())
}

#[test]
fn a_reopened_job_over_renamed_files_of_the_same_count_is_refused() -> TestResult {
    let idle = Duration::from_secs(1);
    let (data, _state, network, _cluster) = one_worker_with(|config| config.job_idle = idle)?;
    let loader = remote_epoch_by_epoch(&network, spec(data.path()))?;
    let fingerprint = loader.info().dataset_fingerprint.clone();
    assert!(
        fingerprint.as_deref().is_some_and(|f| f.starts_with("v3:")),
        "{fingerprint:?}: the workers' fingerprint reaches the client"
    );
    for batch in loader.epoch(0, 0)? {
        batch?;
    }
    // Idle past the worker's idle time (swept every quarter of it): the job is let go. A file
    // renamed meanwhile leaves the count as it was, not the dataset.
    std::thread::sleep(idle * 3);
    let class = std::fs::read_dir(data.path())?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .find(|path| path.is_dir())
        .ok_or("no class folder")?;
    let mut files: Vec<_> = std::fs::read_dir(&class)?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .collect();
    files.sort();
    let first = files.first().ok_or("an empty class")?;
    let name = first.file_name().ok_or("no file name")?.to_string_lossy();
    std::fs::rename(first, class.join(format!("zz-{name}")))?;
    let refused = loader
        .epoch(1, 0)
        .and_then(|mut stream| stream.next_batch())
        .expect_err("a job whose dataset changed is refused");
    let message = refused.to_string();
    assert!(
        message.contains("dataset changed") && message.contains("other names"),
        "{message}"
    );
    Ok(())
}

/// Stops worker-a (its stop is the one after the coordinator's) and waits until the
/// coordinator has only the other worker.
fn let_worker_a_go(cluster: &mut Cluster) {
    let _ = cluster._stops.remove(1).send(());
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while cluster.coordinator.workers().len() > 1 {
        assert!(std::time::Instant::now() < until, "worker-a did not leave");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A worker that sees the job's dataset otherwise than the worker that described it at
/// registration (it joined after the files changed; another node's copy) refuses the job rather
/// than serving batches of another sample order silently: alone, the client hears why.
#[test]
fn a_worker_that_sees_another_dataset_than_the_registered_one_refuses_the_job() -> TestResult {
    let (data, _state, network, mut cluster) = one_worker()?;
    let (expected, _) = embedded(data.path())?;
    let loader = remote(&network, data.path(), None)?;
    let mut digest = BatchDigest::new();
    for batch in loader.epoch(0, 0)? {
        digest.update(&batch?);
    }
    assert_eq!(digest.hex(), expected);
    // An image renamed on disk (as many samples, in another order); worker-b joins over the
    // same folder, and worker-a leaves.
    let class = std::fs::read_dir(data.path())?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .find(|path| path.is_dir())
        .ok_or("no class folder")?;
    let first = std::fs::read_dir(&class)?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .min()
        .ok_or("an empty class")?;
    let name = first.file_name().ok_or("no file name")?.to_string_lossy();
    std::fs::rename(&first, class.join(format!("zz-{name}")))?;
    let config = worker_config(&network, "worker-b:7001", data.path(), None)?;
    cluster.add_worker(&network, config);
    cluster.wait_for_workers(2)?;
    let_worker_a_go(&mut cluster);
    let error = loader
        .epoch(1, 0)
        .and_then(|stream| stream.collect::<stoker_loader::Result<Vec<_>>>())
        .expect_err("worker-b's dataset is not the registered one");
    let message = error.to_string();
    assert!(
        message.contains("not the one the job was registered with")
            && message.contains("fingerprint"),
        "{message}"
    );
    // The file put back (the node's copy whole again): worker-b serves the job. The view it
    // refused was recorded as its first, and every later opening was refused against it, as
    // "the dataset changed since this worker first opened the job".
    std::fs::rename(class.join(format!("zz-{name}")), &first)?;
    drop(loader);
    let loader = remote(&network, data.path(), None)?;
    let mut digest = BatchDigest::new();
    for batch in loader.epoch(0, 0)? {
        digest.update(&batch?);
    }
    assert_eq!(digest.hex(), expected);
    Ok(())
}

/// The same for a text job's tokenizer: a worker whose `tokenizer.json` is another file than
/// the describing worker's (a stale copy on its node) would give other ids for the same
/// documents; it refuses the job, naming the tokenizer.
#[test]
fn a_worker_with_another_tokenizer_file_than_the_registered_one_refuses_the_job() -> TestResult {
    let (data, _state, network, mut cluster) = one_worker()?;
    let texts: Vec<String> = (0..40)
        .map(|i| format!("document {i} says the cat sat on mat number {}", i * 7))
        .collect();
    let jsonl = data.path().join("text.jsonl");
    let lines: Vec<String> = texts
        .iter()
        .map(|text| format!("{{\"text\": \"{text}\"}}"))
        .collect();
    std::fs::write(&jsonl, lines.join("\n"))?;
    let tokenizer = data.path().join("tokenizer.json");
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    stoker_pipeline::train_bpe_tokenizer(&refs, 300, "<|endoftext|>", &tokenizer)?;
    let op = |op| proto::Op { op: Some(op) };
    let job = JobSpec {
        dataset: Some(proto::DatasetSource {
            uri: format!("file://{}", jsonl.display()),
            ..proto::DatasetSource::default()
        }),
        pipeline: vec![
            op(proto::op::Op::Tokenize(proto::Tokenize {
                tokenizer_path: tokenizer.to_string_lossy().into_owned(),
            })),
            op(proto::op::Op::PackSequences(proto::PackSequences {
                seq_len: 32,
                eos_id: -1,
                pad_id: 0,
            })),
        ],
        batch_size: 4,
        seed: 3,
        world_size: 1,
        ..JobSpec::default()
    };
    let loader = remote_epoch_by_epoch(&network, job)?;
    for batch in loader.epoch(0, 0)? {
        batch?;
    }
    // Another tokenizer at the same path (fewer merges: other ids); worker-b joins, worker-a
    // leaves.
    stoker_pipeline::train_bpe_tokenizer(&refs, 270, "<|endoftext|>", &tokenizer)?;
    let config = worker_config(&network, "worker-b:7001", data.path(), None)?;
    cluster.add_worker(&network, config);
    cluster.wait_for_workers(2)?;
    let_worker_a_go(&mut cluster);
    let error = loader
        .epoch(1, 0)
        .and_then(|stream| stream.collect::<stoker_loader::Result<Vec<_>>>())
        .expect_err("worker-b's tokenizer is not the registered one");
    let message = error.to_string();
    assert!(
        message.contains("tokenizer file is not the one the job was registered with"),
        "{message}"
    );
    Ok(())
}

/// Registration too: a job the first worker asked cannot open (its folder outside that
/// worker's --data-root) is described by the next, and read; it was refused outright.
#[test]
fn a_job_the_first_worker_refuses_is_registered_through_another() -> TestResult {
    let (_data, _state, network, mut cluster) = one_worker()?;
    let elsewhere = tempfile::tempdir()?;
    images(elsewhere.path())?;
    let (expected, _) = embedded(elsewhere.path())?;
    let config = worker_config(&network, "worker-b:7001", elsewhere.path(), None)?;
    cluster.add_worker(&network, config);
    cluster.wait_for_workers(2)?;
    let loader = remote(&network, elsewhere.path(), None)?;
    let mut digest = BatchDigest::new();
    for batch in loader.epoch(0, 0)? {
        digest.update(&batch?);
    }
    assert_eq!(digest.hex(), expected);
    Ok(())
}

/// A worker that cannot open a job (its folder outside the worker's --data-root: a node whose
/// mount failed) tells the client so, which takes that worker's share from the others: the
/// epoch is the embedded one. Before, the worker's error ended the run though another worker
/// served the job. Alone, it fails the run by name.
#[test]
fn a_worker_that_cannot_open_the_job_leaves_it_to_the_others_and_fails_it_only_alone() -> TestResult
{
    let (data, _state, network, mut cluster) = one_worker()?;
    let (expected, steps) = embedded(data.path())?;
    // Registered through worker-a, which checks the job.
    let loader = remote(&network, data.path(), None)?;
    let elsewhere = tempfile::tempdir()?;
    let config = worker_config(&network, "worker-b:7001", elsewhere.path(), None)?;
    cluster.add_worker(&network, config);
    cluster.wait_for_workers(2)?;
    for epoch in 0..2 {
        let mut digest = BatchDigest::new();
        let mut seen = Vec::new();
        for batch in loader.epoch(epoch, 0)? {
            let batch = batch?;
            seen.push(batch.step);
            digest.update(&batch);
        }
        assert_eq!(seen, (0..steps).collect::<Vec<_>>());
        if epoch == 0 {
            assert_eq!(digest.hex(), expected);
        }
    }
    // worker-b was leased tasks, and gave them back.
    let stats = cluster.coordinator.core_stats();
    assert!(stats.failed_leases >= 1, "{stats:?}");

    // worker-a leaves (its stop is the one after the coordinator's): worker-b alone cannot
    // open the job, and the client hears so, naming it, instead of waiting.
    let_worker_a_go(&mut cluster);
    let error = loader
        .epoch(2, 0)
        .and_then(|stream| stream.collect::<stoker_loader::Result<Vec<_>>>())
        .expect_err("no worker can open the job");
    let message = error.to_string();
    assert!(
        message.contains("no worker can open the job's datasets (workers worker-b:7001)")
            && message.contains("outside this worker's --data-root"),
        "{message}"
    );
    assert_eq!(error.kind(), ErrorKind::PermissionDenied, "{error:?}");
    Ok(())
}

/// The error of a remote loader of [`spec`] over `data` on `network` that does not start
/// within `connect_timeout`.
fn remote_refusal(
    network: &MemoryNetwork,
    data: &Path,
    connect_timeout: Duration,
) -> Result<stoker_loader::Error, Box<dyn std::error::Error>> {
    let options = RemoteOptions {
        connect_timeout,
        network: Network::Memory(network.clone()),
        ..RemoteOptions::default()
    };
    Loader::remote(COORDINATOR, spec(data), LoaderOptions::default(), options)
        .err()
        .ok_or_else(|| "the loader started".into())
}

/// A coordinator nobody answers for is said to be unreachable once the connect timeout ran
/// out, not to have refused the job.
#[test]
fn a_coordinator_that_never_answers_is_unreachable_not_refusing() -> TestResult {
    let data = tempfile::tempdir()?;
    let network = MemoryNetwork::new();
    let error = remote_refusal(&network, data.path(), Duration::from_secs(1))?;
    let message = error.to_string();
    assert!(
        message.contains("could not reach coordinator coordinator:7070 after "),
        "{message}"
    );
    // Stopped as a client mid-run is when its coordinator stops answering.
    assert_eq!(error.kind(), ErrorKind::WorkerUnavailable);
    Ok(())
}

/// A coordinator with no worker registered answers: the loader says so once the connect
/// timeout ran out, not that the coordinator is unreachable.
#[test]
fn a_coordinator_without_a_worker_is_named_answering() -> TestResult {
    let data = tempfile::tempdir()?;
    let state = tempfile::tempdir()?;
    let network = MemoryNetwork::new();
    let _cluster = start_cluster(&network, data.path(), state.path(), &[], None)?;
    let error = remote_refusal(&network, data.path(), Duration::from_secs(1))?;
    let message = error.to_string();
    assert!(
        message.contains("coordinator coordinator:7070 answers, but had no worker for the job")
            && message.contains("no worker is registered"),
        "{message}"
    );
    assert_eq!(error.kind(), ErrorKind::WorkerUnavailable);
    Ok(())
}

/// A worker the coordinator cannot reach (the address it advertised leads nowhere: a name the
/// cluster's DNS does not answer) is named as such: the client hears that the coordinator
/// answers and which worker it could not reach, not that the coordinator is unreachable.
#[test]
fn a_worker_the_coordinator_cannot_reach_is_named_not_the_coordinator() -> TestResult {
    let data = tempfile::tempdir()?;
    images(data.path())?;
    let state = tempfile::tempdir()?;
    let network = MemoryNetwork::new();
    let mut cluster = start_cluster_with(&network, data.path(), state.path(), &[], None, |_| {})?;
    // Listening on one address, advertising another.
    let config = worker_config(&network, "worker-gone:7001", data.path(), None)?;
    let (stop, stopped) = oneshot::channel::<()>();
    cluster._stops.push(stop);
    let incoming = network.listen("worker-real:7001");
    cluster
        ._runtime
        .spawn(run_worker_incoming(config, incoming, async {
            let _ = stopped.await;
        }));
    cluster.wait_for_workers(1)?;
    let error = remote_refusal(&network, data.path(), Duration::from_secs(2))?;
    let message = error.to_string();
    assert!(
        message.contains("coordinator coordinator:7070 answers, but could not reach a worker")
            && message.contains("worker-gone:7001"),
        "{message}"
    );
    Ok(())
}

/// The step of each batch as a reader thread takes it, and the thread (its epoch's digest).
type EpochReader = (
    std::sync::mpsc::Receiver<u64>,
    std::thread::JoinHandle<stoker_loader::Result<String>>,
);

/// A thread reading epoch 0 of `job` from a remote loader on `network` (`prefetch` batches
/// ahead, `deadline` for each, the session reopened after `stall_reopen` without a batch).
fn read_remote_epoch(
    network: &MemoryNetwork,
    job: JobSpec,
    prefetch: usize,
    (deadline, stall_reopen): (Duration, Duration),
) -> Result<EpochReader, Box<dyn std::error::Error>> {
    let loader = Loader::remote(
        COORDINATOR,
        job,
        LoaderOptions {
            prefetch,
            deadline,
            prefetch_next_epoch: false,
            ..LoaderOptions::default()
        },
        RemoteOptions {
            connect_timeout: Duration::from_secs(20),
            stall_reopen,
            network: Network::Memory(network.clone()),
            ..RemoteOptions::default()
        },
    )?;
    let (taken_tx, taken) = std::sync::mpsc::channel::<u64>();
    let reader = std::thread::spawn(move || -> stoker_loader::Result<String> {
        let mut digest = BatchDigest::new();
        for batch in loader.epoch(0, 0)? {
            let batch = batch?;
            digest.update(&batch);
            let _ = taken_tx.send(batch.step);
        }
        Ok(digest.hex())
    });
    Ok((taken, reader))
}

#[test]
fn batches_leased_before_the_coordinator_stops_answering_still_reach_the_consumer() -> TestResult {
    // One decode thread leasing 8 steps at a time; a task waits for its client's stream as
    // long as the test needs.
    let (data, _state, network, cluster) = one_worker_with(|config| {
        config.lease_ahead = 8;
        config.delivery_timeout = Duration::from_secs(60);
    })?;
    let job = JobSpec {
        batch_size: 4,
        ..spec(data.path())
    };
    let (expected, _) = embedded_of(job.clone())?;
    let timeouts = (Duration::from_secs(60), Duration::from_secs(30));
    let (taken, reader) = read_remote_epoch(&network, job, 16, timeouts)?;
    assert_eq!(taken.recv_timeout(Duration::from_secs(30))?, 0);
    // The worker's batches stop reaching the client, which takes what it already has; the
    // worker goes on leasing from the coordinator, building and queueing.
    network.hold(WORKER);
    let mut consumed: u64 = 1;
    while taken.recv_timeout(Duration::from_millis(300)).is_ok() {
        consumed += 1;
    }
    // Leased past what the consumer has: at least 4 steps the worker holds or is building.
    // A lease answer leaves the coordinator as the step is counted; a second is the margin for
    // it to reach the worker before the coordinator stops answering.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let leased = loop {
        let leased = cluster.coordinator.core_stats().assignments;
        if leased >= consumed + 4 || std::time::Instant::now() >= deadline {
            break leased;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        leased >= consumed + 4,
        "{leased} steps leased with {consumed} consumed"
    );
    std::thread::sleep(Duration::from_secs(1));
    // The coordinator stops answering (a stopped process): no lease, grant or ack goes
    // through; the worker's stream to the client carries again. What arrives from now on was
    // leased before, and reaches the consumer only through the worker's stream.
    network.hold(COORDINATOR);
    network.release(WORKER);
    let until = std::time::Instant::now() + Duration::from_secs(3);
    let mut arrived_during = 0;
    while taken
        .recv_timeout(until.saturating_duration_since(std::time::Instant::now()))
        .is_ok()
    {
        arrived_during += 1;
    }
    network.release(COORDINATOR);
    assert!(
        arrived_during >= 3,
        "{arrived_during} batches reached the consumer while the coordinator was held \
         ({consumed} before, {leased} leased)"
    );
    // Nothing lost or repeated once it answers again.
    let digest = reader.join().map_err(|_| "the reader panicked")??;
    assert_eq!(digest, expected);
    Ok(())
}

#[test]
fn a_stream_the_worker_ends_for_taking_nothing_makes_the_client_open_its_session_again_at_once(
) -> TestResult {
    // The worker ends a client's stream that takes nothing for half a second.
    let (data, _state, network, cluster) =
        one_worker_with(|config| config.delivery_timeout = Duration::from_millis(500))?;
    // Batches of about 1.2 MB: a couple fill what the connection buffers (h2's send buffer
    // and the in-memory pipe), so a held connection stops the stream's queue.
    let job = JobSpec {
        batch_size: 8,
        pipeline: stoker_pipeline::presets::imagenet_train(224),
        ..spec(data.path())
    };
    let (expected, _) = embedded_of(job.clone())?;
    // The client's own stall watch (120 s) is past its deadline (30 s): the epoch ends in
    // time only if the worker's end of the stream opens the session again.
    let timeouts = (Duration::from_secs(30), Duration::from_secs(120));
    let (taken, reader) = read_remote_epoch(&network, job, 3, timeouts)?;
    assert_eq!(taken.recv_timeout(Duration::from_secs(30))?, 0);
    // The client's connection to the worker carries nothing (a network stalled) for several
    // times the worker's wait while the client asks for more: the stream takes nothing and the
    // worker ends it; deliveries that then find no stream go back to the coordinator with their
    // credits spent.
    network.hold(WORKER);
    std::thread::sleep(Duration::from_secs(2));
    network.release(WORKER);
    let digest = reader.join().map_err(|_| "the reader panicked")??;
    assert_eq!(digest, expected);
    // Opened again: a stream opened again in the same session would have waited for the
    // requeued steps until the client's stall watch, past the deadline.
    let stats = cluster.coordinator.core_stats();
    assert!(stats.session_opens >= 2, "{stats:?}");
    Ok(())
}

/// A worker whose leases are refused right after it registers (registration and leases
/// answered by different coordinator replicas, a proxy in between) registered again every
/// 50 ms, a new worker each time for the coordinator to keep: the pause between tries grows
/// as for a failed registration until a lease is answered.
#[test]
fn a_worker_whose_leases_are_refused_registers_again_less_and_less_often() -> TestResult {
    let registrations = Arc::new(AtomicUsize::new(0));
    let (_data, _state, _network, _cluster) =
        one_worker_behind(proxy::Proxy::LeasesRefused(Arc::clone(&registrations)))?;
    std::thread::sleep(Duration::from_secs(3));
    let registered = registrations.load(Ordering::Relaxed);
    // 50, 100, 200, 400, 800 and 1,600 ms apart: seven at most in three seconds.
    assert!(
        (2..=8).contains(&registered),
        "{registered} registrations in 3 s"
    );
    Ok(())
}
