//! The coordinator service's unit tests over an in-memory network (`stoker_rpc::network`): the
//! real service with its token check and tonic's HTTP/2 stack, a data server that describes
//! jobs, and workers and clients calling as the daemons do; no sockets, no processes. The
//! process tests (`cli/tests/it/`) run the same paths with real daemons.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stoker_pipeline::ErrorKind;
use stoker_proto::v1::coordinator_client::CoordinatorClient;
use stoker_proto::v1::worker_data_server::WorkerDataServer;
use stoker_proto::v1::{
    CloseSessionRequest, DatasetSource, DescribeJobResponse, GetJobRequest, HeartbeatRequest,
    JobSpec, LeaseRequest, LeaveRequest, OpenSessionRequest, RegisterJobRequest,
    RegisterWorkerRequest, ReportRequest, SessionToken, SessionUpdateRequest, TaskLease, WorkerSet,
};
use stoker_rpc::describe_only::DescribeOnly;
use stoker_rpc::error_kinds::kind_of_status;
use stoker_rpc::network::{MemoryNetwork, Network};
use stoker_rpc::security::{ClientSecurity, ServerSecurity, Token};
use stoker_rpc::transport::RpcChannel;
use tokio::sync::oneshot;
use tonic::{Code, Status};

use crate::{CoordinatorConfig, CoordinatorService, CoordinatorServiceConfig};

const COORDINATOR: &str = "coordinator:7070";
const DATA_SERVER: &str = "worker-a:7001";
const STEPS: u64 = 8;
const LEASE_TIMEOUT: Duration = Duration::from_millis(400);
/// The fingerprint and tokenizer digests the describing data server gives its dataset.
const FINGERPRINT: &str = "v3:a1b2c3";
const TOKENIZERS: &str = "tokenizer.json=d4e5";

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A coordinator serving on [`COORDINATOR`] of `network` over the journal in `state`, accepting
/// `tokens`; stops (flushing its journal) when the returned sender is dropped or sent to.
fn start(
    network: &MemoryNetwork,
    state: &Path,
    tokens: Vec<Token>,
) -> Result<(CoordinatorService, oneshot::Sender<()>), Box<dyn std::error::Error>> {
    let service = CoordinatorService::open(state, service_config(network, tokens)?)?;
    Ok(serve(network, service))
}

fn service_config(
    network: &MemoryNetwork,
    tokens: Vec<Token>,
) -> Result<CoordinatorServiceConfig, Box<dyn std::error::Error>> {
    Ok(CoordinatorServiceConfig {
        core: CoordinatorConfig {
            lease_timeout: LEASE_TIMEOUT,
            journal_every: u64::MAX,
            ..CoordinatorConfig::default()
        },
        server_security: ServerSecurity::new(tokens.clone(), None)?,
        client_security: ClientSecurity::new(tokens.first().cloned(), None, None)?,
        network: Network::Memory(network.clone()),
        ..CoordinatorServiceConfig::default()
    })
}

/// Serves `service` on [`COORDINATOR`] of `network` until the returned sender is dropped or
/// sent to.
fn serve(
    network: &MemoryNetwork,
    service: CoordinatorService,
) -> (CoordinatorService, oneshot::Sender<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let incoming = network.listen(COORDINATOR);
    tokio::spawn(service.clone().serve_incoming(incoming, async {
        let _ = stopped.await;
    }));
    (service, stop)
}

/// Serves a data server describing every job as [`STEPS`] steps on [`DATA_SERVER`].
fn start_data_server(network: &MemoryNetwork, tokens: Vec<Token>) -> TestResult {
    let check = ServerSecurity::new(tokens, None)?.check();
    let describer = DescribeOnly(DescribeJobResponse {
        num_samples: STEPS * 4,
        steps_per_epoch: STEPS,
        batch_bytes: 1,
        class_names: Vec::new(),
        dataset_fingerprint: FINGERPRINT.into(),
        tokenizer_digests: TOKENIZERS.into(),
    });
    let service = tonic::service::interceptor::InterceptedService::new(
        WorkerDataServer::new(describer),
        check,
    );
    tokio::spawn(
        stoker_rpc::transport::server()
            .add_service(service)
            .serve_with_incoming(network.listen(DATA_SERVER)),
    );
    Ok(())
}

/// A coordinator and a describing data server on a new network, over a new journal.
struct Fixture {
    network: MemoryNetwork,
    service: CoordinatorService,
    /// The journal's folder, removed when dropped.
    state: tempfile::TempDir,
    /// Stops the coordinator when sent to or dropped.
    stop: oneshot::Sender<()>,
}

impl Fixture {
    /// The coordinator stopped and started again on its journal, on the same network (the
    /// first run's service let go first, so the journal is free for the second).
    async fn restarted(self) -> Result<Fixture, Box<dyn std::error::Error>> {
        let Fixture {
            network,
            service,
            state,
            stop,
        } = self;
        drop(service);
        let (service, stop) = restart(&network, state.path(), stop).await?;
        Ok(Fixture {
            network,
            service,
            state,
            stop,
        })
    }
}

fn fixture(tokens: Vec<Token>) -> Result<Fixture, Box<dyn std::error::Error>> {
    let network = MemoryNetwork::new();
    let state = tempfile::tempdir()?;
    let (service, stop) = start(&network, state.path(), tokens.clone())?;
    start_data_server(&network, tokens)?;
    Ok(Fixture {
        network,
        service,
        state,
        stop,
    })
}

/// A fixture whose coordinator a test restarts: its network, journal folder and stop; the
/// service is not kept, so the journal is free for the second run.
fn restartable(
) -> Result<(MemoryNetwork, tempfile::TempDir, oneshot::Sender<()>), Box<dyn std::error::Error>> {
    let Fixture {
        network,
        state,
        stop,
        service: _,
    } = fixture(Vec::new())?;
    Ok((network, state, stop))
}

fn coordinator(network: &MemoryNetwork, token: Option<&Token>) -> CoordinatorClient<RpcChannel> {
    let security = ClientSecurity::new(token.cloned(), None, None).expect("plain security");
    CoordinatorClient::new(network.channel(COORDINATOR, &security))
}

fn spec() -> JobSpec {
    JobSpec {
        dataset: Some(DatasetSource {
            uri: "/data/train".into(),
            ..DatasetSource::default()
        }),
        batch_size: 4,
        seed: 1,
        world_size: 1,
        ..JobSpec::default()
    }
}

async fn register_worker(client: &mut CoordinatorClient<RpcChannel>) -> Result<u64, Status> {
    register_worker_at(client, DATA_SERVER).await
}

/// Registers a worker whose data server is at `address`.
async fn register_worker_at(
    client: &mut CoordinatorClient<RpcChannel>,
    address: &str,
) -> Result<u64, Status> {
    let request = RegisterWorkerRequest {
        data_address: address.into(),
        threads: 1,
        data_roots: Vec::new(),
        instance: 0,
    };
    let registered = client.register_worker(request).await?.into_inner();
    Ok(registered.worker_id)
}

/// Registers the job of [`spec`] (weight 0); its id.
async fn register_job(client: &mut CoordinatorClient<RpcChannel>) -> Result<u64, Status> {
    Ok(registration(client).await?.job_id)
}

/// Registers the job of [`spec`] (weight 0); the coordinator's answer.
async fn registration(
    client: &mut CoordinatorClient<RpcChannel>,
) -> Result<stoker_proto::v1::RegisterJobResponse, Status> {
    let request = RegisterJobRequest {
        spec: Some(spec()),
        weight: 0,
    };
    Ok(client.register_job(request).await?.into_inner())
}

/// A job of [`spec`] and rank 0's session on it, with `credits` granted.
async fn open(
    client: &mut CoordinatorClient<RpcChannel>,
    credits: u64,
) -> Result<(u64, SessionToken), Box<dyn std::error::Error>> {
    let job = register_job(client).await?;
    let session = open_again(client, job).await?;
    update(client, session, credits, Vec::new()).await?;
    Ok((job, session))
}

/// Rank 0's session of `job`, epoch 0, opened (again) from its start.
async fn open_again(
    client: &mut CoordinatorClient<RpcChannel>,
    job: u64,
) -> Result<SessionToken, Box<dyn std::error::Error>> {
    let session = client
        .open_session(OpenSessionRequest {
            job_id: job,
            rank: 0,
            epoch: 0,
            start_step: 0,
            resume_from_journal: false,
        })
        .await?
        .into_inner()
        .session
        .ok_or("a session without a token")?;
    Ok(session)
}

async fn update(
    client: &mut CoordinatorClient<RpcChannel>,
    session: SessionToken,
    credits: u64,
    acknowledged: Vec<u64>,
) -> Result<u64, Status> {
    let request = SessionUpdateRequest {
        session: Some(session),
        grant_credits: credits,
        acknowledged,
        ..SessionUpdateRequest::default()
    };
    let updated = client.update_session(request).await?.into_inner();
    Ok(updated.acknowledged_position)
}

async fn lease(
    client: &mut CoordinatorClient<RpcChannel>,
    worker: u64,
    max: u32,
) -> Result<Vec<TaskLease>, Status> {
    Ok(client
        .lease(LeaseRequest {
            worker_id: worker,
            max_tasks: max,
            // Shorter than the lease timeout: a lease call is the worker's heartbeat too.
            wait_ms: 200,
            report: None,
            full_sessions: Vec::new(),
        })
        .await?
        .into_inner()
        .tasks)
}

async fn report(
    client: &mut CoordinatorClient<RpcChannel>,
    worker: u64,
    tasks: &[TaskLease],
) -> Result<(), Status> {
    client
        .report(ReportRequest {
            worker_id: worker,
            completed: tasks.iter().map(|t| t.lease_id).collect(),
            ..ReportRequest::default()
        })
        .await
        .map(drop)
}

/// Checks the core's count of completed tasks and of reports it dropped as duplicates.
fn completed(service: &CoordinatorService, completions: u64, duplicates: u64) {
    let stats = service.core_stats();
    assert_eq!(
        (stats.completions, stats.duplicates_dropped),
        (completions, duplicates),
        "{stats:?}"
    );
}

/// Stops the coordinator `stop` stops (its journal is flushed as it stops) and starts a new run
/// on the same address over the journal in `state`.
async fn restart(
    network: &MemoryNetwork,
    state: &Path,
    stop: oneshot::Sender<()>,
) -> Result<(CoordinatorService, oneshot::Sender<()>), Box<dyn std::error::Error>> {
    stop.send(())
        .map_err(|()| "the coordinator already stopped")?;
    let mut stopped = false;
    for _ in 0..100 {
        network.cut(COORDINATOR);
        if register_worker(&mut coordinator(network, None))
            .await
            .is_err()
        {
            stopped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(stopped, "the first coordinator kept serving");
    // The first run lets its journal go once its last task is dropped, a moment after it stops.
    let mut second = Err("not started".into());
    for _ in 0..100 {
        second = start(network, state, Vec::new());
        match &second {
            Err(error) if format!("{error:?}").contains("AlreadyOpen") => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            _ => break,
        }
    }
    second
}

/// Rank 0's session of `job` in epoch 0, opened where the journal says it was acknowledged.
async fn reopen_from_journal(
    client: &mut CoordinatorClient<RpcChannel>,
    job: u64,
) -> Result<stoker_proto::v1::OpenSessionResponse, Status> {
    let request = OpenSessionRequest {
        job_id: job,
        rank: 0,
        epoch: 0,
        start_step: 0,
        resume_from_journal: true,
    };
    Ok(client.open_session(request).await?.into_inner())
}

fn steps(tasks: &[TaskLease]) -> Vec<u64> {
    tasks.iter().map(|t| t.step).collect()
}

/// Grants `credits` on `session`, then the steps `worker`'s next lease (of up to 4) takes.
async fn granted(
    client: &mut CoordinatorClient<RpcChannel>,
    session: SessionToken,
    credits: u64,
    worker: u64,
) -> Result<Vec<u64>, Status> {
    update(client, session, credits, Vec::new()).await?;
    Ok(steps(&lease(client, worker, 4).await?))
}

#[tokio::test]
async fn calls_without_the_token_or_with_another_are_refused_before_any_handler() -> TestResult {
    let token = Token::new("the-shared-token")?;
    let fixture = fixture(vec![token.clone()])?;
    let (network, service) = (&fixture.network, &fixture.service);
    let other = Token::new("another-token")?;
    for presented in [None, Some(&other)] {
        let refused = register_worker(&mut coordinator(network, presented))
            .await
            .expect_err("refused");
        assert_eq!(
            kind_of_status(&refused),
            ErrorKind::Unauthenticated,
            "{refused}"
        );
    }
    assert!(
        service.workers().is_empty(),
        "a refused call registered a worker"
    );
    let mut client = coordinator(network, Some(&token));
    register_worker(&mut client).await?;
    let (_, session) = open(&mut client, 1).await?;
    assert_eq!(update(&mut client, session, 0, Vec::new()).await?, 0);
    Ok(())
}

/// What [`steps_leased`] sets up: a client, a worker id, the job, the session and its tasks.
type Leased = (
    CoordinatorClient<RpcChannel>,
    u64,
    u64,
    SessionToken,
    Vec<TaskLease>,
);

/// A worker and a client of the coordinator on `network`, the client's session granted
/// `credits` credits, and the steps they cover leased to the worker.
async fn steps_leased(
    network: &MemoryNetwork,
    credits: u64,
) -> Result<Leased, Box<dyn std::error::Error>> {
    let mut client = coordinator(network, None);
    let worker = register_worker(&mut client).await?;
    let (job, session) = open(&mut client, credits).await?;
    let tasks = lease(&mut client, worker, 4).await?;
    assert_eq!(
        steps(&tasks),
        (0..credits).collect::<Vec<_>>(),
        "each credit leases a step"
    );
    Ok((client, worker, job, session, tasks))
}

#[tokio::test]
async fn a_task_reported_twice_and_a_step_acknowledged_twice_count_once() -> TestResult {
    let fixture = fixture(Vec::new())?;
    let (network, service) = (&fixture.network, &fixture.service);
    let (mut client, worker, _, session, tasks) = steps_leased(network, 2).await?;
    report(&mut client, worker, &tasks).await?;
    // A report sent again (a retry after a lost answer) is taken and counted as a duplicate.
    report(&mut client, worker, &tasks).await?;
    completed(service, 2, 2);
    assert_eq!(update(&mut client, session, 0, vec![0, 1]).await?, 2);
    // The same batch arriving twice (from a requeued task) is acknowledged again: no step moves.
    assert_eq!(update(&mut client, session, 0, vec![1]).await?, 2);
    // And no credit was returned by the duplicate: nothing more is leased until one is granted.
    assert!(
        lease(&mut client, worker, 4).await?.is_empty(),
        "a lease without credits"
    );
    assert_eq!(granted(&mut client, session, 1, worker).await?, [2]);
    Ok(())
}

/// An update or a close of an earlier opening of a session (a late one, or an old feed's as a
/// new feed reopens the same session) is refused: its credits, acknowledgements and close are
/// not the current opening's client's.
/// An update acknowledging more steps than one may is refused by name before it takes the
/// coordinator's lock, and applies nothing; the session goes on.
#[tokio::test]
async fn an_update_acknowledging_too_many_steps_at_once_is_refused() -> TestResult {
    use crate::service::calls::MAX_ACKS_PER_UPDATE;
    let fixture = fixture(Vec::new())?;
    let mut client = coordinator(&fixture.network, None);
    let worker = register_worker(&mut client).await?;
    let (_, session) = open(&mut client, 0).await?;
    let flood = vec![1; MAX_ACKS_PER_UPDATE + 1];
    let refused = update(&mut client, session, 4, flood).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("at most 65536"), "{refused:?}");
    // Nothing of it applied: no credit granted, step 1 not acknowledged.
    assert!(lease(&mut client, worker, 4).await?.is_empty());
    assert_eq!(granted(&mut client, session, 2, worker).await?, [0, 1]);
    let most = vec![1; MAX_ACKS_PER_UPDATE];
    assert_eq!(update(&mut client, session, 0, most).await?, 0);
    Ok(())
}

#[tokio::test]
async fn an_update_or_close_of_an_earlier_opening_is_refused() -> TestResult {
    let fixture = fixture(Vec::new())?;
    let mut client = coordinator(&fixture.network, None);
    let worker = register_worker(&mut client).await?;
    let (job, first) = open(&mut client, 0).await?;
    let again = open_again(&mut client, job).await?;
    assert_eq!(again.session_id, first.session_id);
    assert_ne!(again.opening, first.opening);
    let stale = update(&mut client, first, 4, vec![0, 1]).await.unwrap_err();
    assert_eq!(stale.code(), tonic::Code::FailedPrecondition, "{stale:?}");
    assert!(stale.message().contains("opened again"), "{stale:?}");
    // Its credits were not granted: nothing is leased.
    assert!(lease(&mut client, worker, 4).await?.is_empty());
    let close = client
        .close_session(CloseSessionRequest {
            session: Some(first),
        })
        .await
        .unwrap_err();
    assert_eq!(close.code(), tonic::Code::FailedPrecondition, "{close:?}");
    // The current opening is open and served.
    assert_eq!(granted(&mut client, again, 2, worker).await?, [0, 1]);
    Ok(())
}

#[tokio::test]
async fn a_worker_lost_with_its_leases_gives_them_to_another_and_its_late_report_counts_for_nothing(
) -> TestResult {
    let fixture = fixture(Vec::new())?;
    let (network, service) = (&fixture.network, &fixture.service);
    let mut lost = coordinator(network, None);
    let lost_id = register_worker(&mut lost).await?;
    let mut client = coordinator(network, None);
    let (_, session) = open(&mut client, 2).await?;
    let taken = lease(&mut lost, lost_id, 4).await?;
    assert_eq!(steps(&taken), [0, 1]);
    // The worker's connection breaks and it never reports; another worker comes.
    network.cut(COORDINATOR);
    let mut survivor = coordinator(network, None);
    let survivor_id = register_worker(&mut survivor).await?;
    let mut again = Vec::new();
    let deadline = tokio::time::Instant::now() + LEASE_TIMEOUT * 10;
    while again.len() < 2 && tokio::time::Instant::now() < deadline {
        again.extend(lease(&mut survivor, survivor_id, 4).await?);
    }
    assert_eq!(steps(&again), [0, 1], "the lost leases go to the survivor");
    // The lost worker's late report counts for nothing: its leases are no longer its own.
    report(&mut lost, lost_id, &taken).await?;
    report(&mut survivor, survivor_id, &again).await?;
    completed(service, 2, 2);
    assert_eq!(update(&mut client, session, 0, vec![0, 1]).await?, 2);
    Ok(())
}

/// A worker restarted at its address before the coordinator found the old process silent
/// replaces it at once: the old one's leases go back, and the list names the address once (two
/// entries had clients open two streams to the one process, each ending the other's).
#[tokio::test]
async fn a_worker_registered_at_a_listed_address_replaces_the_one_listed_there() -> TestResult {
    let fixture = fixture(Vec::new())?;
    let mut client = coordinator(&fixture.network, None);
    let mut stream = session_stream(&mut client).await?;
    let session = stream.opened.session.ok_or("a session without a token")?;
    let old = stream.worker;
    stream.requests.send(SessionUpdateRequest {
        session: Some(session),
        grant_credits: 2,
        workers_version: stream.opened.workers_version,
        ..SessionUpdateRequest::default()
    })?;
    stream.answers.message().await?.ok_or("an answer")?;
    assert_eq!(steps(&lease(&mut client, old, 4).await?), [0, 1]);
    let new = register_worker(&mut client).await?;
    assert_ne!(new, old);
    // Gone at once, not once silent for its lease timeout.
    let refused = client
        .heartbeat(HeartbeatRequest { worker_id: old })
        .await
        .expect_err("the old worker is gone");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");
    // Its leases are the new one's to take.
    assert_eq!(steps(&lease(&mut client, new, 4).await?), [0, 1]);
    stream.requests.send(SessionUpdateRequest {
        session: Some(session),
        workers_version: stream.opened.workers_version,
        ..SessionUpdateRequest::default()
    })?;
    let listed = stream.answers.message().await?.ok_or("an answer")?;
    let addresses: Vec<_> = listed
        .workers
        .iter()
        .map(|w| w.data_address.as_str())
        .collect();
    assert_eq!(addresses, [DATA_SERVER], "{listed:?}");
    Ok(())
}

/// Two running workers advertising one address: the second replaces the first, and the first,
/// registering again, is refused naming the setting, where the two took turns replacing each
/// other (each time putting the other's leases back). A process that restarts there replaces
/// whoever is listed; one registering again as itself replaces its own entry.
#[tokio::test]
async fn a_worker_replaced_at_its_address_is_refused_there_while_another_holds_it() -> TestResult {
    let fixture = fixture(Vec::new())?;
    let mut client = coordinator(&fixture.network, None);
    let register = |instance: u64| RegisterWorkerRequest {
        data_address: "worker-b:7001".into(),
        threads: 1,
        data_roots: Vec::new(),
        instance,
    };
    client.register_worker(register(1)).await?;
    client.register_worker(register(2)).await?;
    let refused = client
        .register_worker(register(1))
        .await
        .expect_err("the first process came back while the second holds the address");
    assert_eq!(refused.code(), Code::AlreadyExists, "{refused}");
    assert!(refused.message().contains("--advertise"), "{refused}");
    // The second registering again as itself, then a restart there (a new process).
    client.register_worker(register(2)).await?;
    client.register_worker(register(3)).await?;
    let at: Vec<u64> = fixture
        .service
        .workers()
        .iter()
        .filter(|w| w.data_address == "worker-b:7001")
        .map(|w| w.instance)
        .collect();
    assert_eq!(at, [3]);
    Ok(())
}

#[tokio::test]
async fn a_session_reopened_on_a_restarted_coordinator_resumes_where_it_was_acknowledged(
) -> TestResult {
    let (network, state, stop) = restartable()?;
    let (mut client, worker, job, session, tasks) = steps_leased(&network, 3).await?;
    report(&mut client, worker, &tasks).await?;
    assert_eq!(update(&mut client, session, 0, vec![0, 1, 2]).await?, 3);
    let (_, _stop) = restart(&network, state.path(), stop).await?;
    let mut client = coordinator(&network, None);
    let stale = update(&mut client, session, 1, Vec::new())
        .await
        .expect_err("a token of the earlier run");
    assert_eq!(stale.code(), Code::FailedPrecondition, "{stale}");
    assert!(
        stale.message().contains("open the session again"),
        "{stale}"
    );
    let reopened = reopen_from_journal(&mut client, job).await?;
    assert_eq!(reopened.acknowledged_position, 3);
    let session = reopened.session.ok_or("a session without a token")?;
    let worker = register_worker(&mut client).await?;
    assert_eq!(granted(&mut client, session, 1, worker).await?, [3]);
    Ok(())
}

/// A restarted coordinator gives workers what its job was registered over, as the first run
/// did: a worker that opens the job only after the restart (autoscaled, restarted) checks its
/// own view of the dataset against it, and refuses a copy of the same size with other files or
/// another tokenizer. Before, the description was kept in memory only: after a restart a job
/// whose clients reopened their sessions (none registers again) was given out with no sample
/// count, fingerprint or digests, and a worker with another copy served it unchecked.
#[tokio::test]
async fn a_restarted_coordinator_gives_workers_the_dataset_its_job_was_registered_over(
) -> TestResult {
    let (network, state, stop) = restartable()?;
    let mut client = coordinator(&network, None);
    register_worker(&mut client).await?;
    let job = register_job(&mut client).await?;
    let described = |answer: stoker_proto::v1::GetJobResponse| {
        let (samples, fingerprint) = (answer.num_samples, answer.dataset_fingerprint);
        (samples, fingerprint, answer.tokenizer_digests)
    };
    let want = (STEPS * 4, FINGERPRINT.to_string(), TOKENIZERS.to_string());
    let first = client.get_job(GetJobRequest { job_id: job }).await?;
    assert_eq!(described(first.into_inner()), want);
    let (_, _stop) = restart(&network, state.path(), stop).await?;
    let mut client = coordinator(&network, None);
    let second = client.get_job(GetJobRequest { job_id: job }).await?;
    assert_eq!(described(second.into_inner()), want);
    Ok(())
}

/// After a restart, a job registered again is the journaled one (its acknowledged positions
/// resume) when the workers describe its dataset with a fingerprint of another version (a
/// release rolled out meanwhile computes them otherwise), and a new one when a fingerprint of
/// the same version differs (the dataset changed). Before its description was journaled, the
/// step count alone decided.
#[tokio::test]
async fn a_job_registered_after_a_restart_is_the_journaled_one_unless_its_dataset_changed(
) -> TestResult {
    let (network, state, stop) = restartable()?;
    let mut client = coordinator(&network, None);
    register_worker(&mut client).await?;
    let job = register_job(&mut client).await?;
    let (_, stop) = restart(&network, state.path(), stop).await?;
    start_describer_of(
        &network,
        "worker-b:7001",
        STEPS,
        STEPS * 4,
        "v4:computed-otherwise",
    );
    let mut client = coordinator(&network, None);
    register_worker_at(&mut client, "worker-b:7001").await?;
    assert_eq!(register_job(&mut client).await?, job);
    let (_, _stop) = restart(&network, state.path(), stop).await?;
    start_describer_of(
        &network,
        "worker-c:7001",
        STEPS,
        STEPS * 4,
        "v3:another-dataset",
    );
    let mut client = coordinator(&network, None);
    register_worker_at(&mut client, "worker-c:7001").await?;
    assert_ne!(register_job(&mut client).await?, job);
    Ok(())
}

/// A worker, a job and a session of it, with the session's update stream.
struct SessionStream {
    worker: u64,
    opened: stoker_proto::v1::OpenSessionResponse,
    requests: tokio::sync::mpsc::UnboundedSender<SessionUpdateRequest>,
    answers: tonic::Streaming<stoker_proto::v1::SessionUpdateResponse>,
}

async fn session_stream(
    client: &mut CoordinatorClient<RpcChannel>,
) -> Result<SessionStream, Box<dyn std::error::Error>> {
    let worker = register_worker(client).await?;
    let job = register_job(client).await?;
    let opened = client
        .open_session(OpenSessionRequest {
            job_id: job,
            ..OpenSessionRequest::default()
        })
        .await?
        .into_inner();
    let (requests, receiver) = tokio::sync::mpsc::unbounded_channel();
    let answers = client
        .update_session_stream(tokio_stream::wrappers::UnboundedReceiverStream::new(
            receiver,
        ))
        .await?
        .into_inner();
    Ok(SessionStream {
        worker,
        opened,
        requests,
        answers,
    })
}

/// A stop ends the service within its grace though a client keeps its session's update stream
/// (and so its connection) open, as every live client does: the connections left are closed
/// and the journal flushed. Before, the server waited for them to end, which they never did.
#[tokio::test]
async fn a_stop_ends_the_service_within_its_grace_though_a_client_keeps_its_stream_open(
) -> TestResult {
    let network = MemoryNetwork::new();
    let state = tempfile::tempdir()?;
    let service = CoordinatorService::open(state.path(), service_config(&network, Vec::new())?)?;
    start_data_server(&network, Vec::new())?;
    let (stop, stopped) = oneshot::channel::<()>();
    let serving = tokio::spawn(service.serve_incoming(network.listen(COORDINATOR), async {
        let _ = stopped.await;
    }));
    let mut client = coordinator(&network, None);
    let mut stream = session_stream(&mut client).await?;
    let session = stream.opened.session.ok_or("a session without a token")?;
    stream.requests.send(SessionUpdateRequest {
        session: Some(session),
        grant_credits: 1,
        ..SessionUpdateRequest::default()
    })?;
    stream.answers.message().await?.ok_or("the stream ended")?;
    stop.send(())
        .map_err(|()| "the coordinator already stopped")?;
    let started = tokio::time::Instant::now();
    let ended = tokio::time::timeout(crate::service::SHUTDOWN_GRACE * 3, serving)
        .await
        .map_err(|_| "the coordinator still serves its client's open stream")?;
    ended??;
    assert!(started.elapsed() >= crate::service::SHUTDOWN_GRACE / 2);
    drop(stream);
    Ok(())
}

/// A data server whose `DescribeJob` takes 200 ms and counts its calls; it refuses every job
/// when `.1` says so.
#[derive(Clone, Default)]
struct SlowDescriber(
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    bool,
    std::sync::Arc<std::sync::atomic::AtomicBool>,
);

#[tonic::async_trait]
impl stoker_proto::v1::worker_data_server::WorkerData for SlowDescriber {
    async fn describe_job(
        &self,
        _request: tonic::Request<stoker_proto::v1::DescribeJobRequest>,
    ) -> Result<tonic::Response<DescribeJobResponse>, Status> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(200)).await;
        if self.1 || self.2.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Status::invalid_argument("no such dataset here"));
        }
        Ok(tonic::Response::new(DescribeJobResponse {
            num_samples: STEPS * 4,
            steps_per_epoch: STEPS,
            batch_bytes: 1,
            ..DescribeJobResponse::default()
        }))
    }

    type SubscribeStream = tokio_stream::Pending<Result<stoker_proto::v1::Batch, Status>>;

    async fn subscribe(
        &self,
        _request: tonic::Request<stoker_proto::v1::SubscribeRequest>,
    ) -> Result<tonic::Response<Self::SubscribeStream>, Status> {
        Ok(tonic::Response::new(tokio_stream::pending()))
    }
}

/// The ranks of a job registering at once have one worker describe it once: each used to ask
/// on its own, and the worker opened the dataset once per rank at the same time (its index
/// in memory as many times over).
#[tokio::test]
async fn ranks_registering_one_job_at_once_have_it_described_once() -> TestResult {
    for refused in [false, true] {
        ranks_registering_at_once(refused).await?;
    }
    Ok(())
}

/// Eight ranks registering one job at once against a describer that refuses it or not: one
/// description, and every rank the same answer (a refusal was tried again by each waiting
/// rank in turn, the eighth answered after eight descriptions).
async fn ranks_registering_at_once(refused: bool) -> TestResult {
    let network = MemoryNetwork::new();
    let state = tempfile::tempdir()?;
    let (_service, _stop) = start(&network, state.path(), Vec::new())?;
    let describer = SlowDescriber(std::sync::Arc::default(), refused, Default::default());
    tokio::spawn(
        stoker_rpc::transport::server()
            .add_service(WorkerDataServer::new(describer.clone()))
            .serve_with_incoming(network.listen(DATA_SERVER)),
    );
    register_worker(&mut coordinator(&network, None)).await?;
    let ranks: Vec<_> = (0..8)
        .map(|rank| {
            let mut client = coordinator(&network, None);
            tokio::spawn(async move {
                let request = RegisterJobRequest {
                    spec: Some(JobSpec {
                        rank,
                        world_size: 8,
                        ..spec()
                    }),
                    weight: 0,
                };
                client
                    .register_job(request)
                    .await
                    .map(|r| r.into_inner().job_id)
            })
        })
        .collect();
    let mut answers = Vec::new();
    for rank in ranks {
        answers.push(rank.await?.map_err(|status| status.code()));
    }
    assert!(answers.iter().all(|a| *a == answers[0]), "{answers:?}");
    assert_eq!(answers[0].is_err(), refused, "{answers:?}");
    let described = describer.0.load(std::sync::atomic::Ordering::SeqCst);
    if refused {
        // A rank whose call came after the refusal was answered (a loaded machine) tries
        // anew: at most one more; each of the eight tried in turn before.
        assert!(described <= 2, "{described} descriptions");
    } else {
        // A late rank finds the job registered.
        assert_eq!(described, 1);
    }
    Ok(())
}

/// A refusal that waiting registrations, since gone, were to take answers no registration
/// that comes after it: the spec is described anew. It answered every later registration of
/// the spec, however long after its cause was fixed.
#[tokio::test]
async fn a_refusal_whose_waiters_left_is_not_the_answer_to_later_registrations() -> TestResult {
    let network = MemoryNetwork::new();
    let state = tempfile::tempdir()?;
    let (service, _stop) = start(&network, state.path(), Vec::new())?;
    let refusing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let describer = SlowDescriber(std::sync::Arc::default(), false, refusing.clone());
    tokio::spawn(
        stoker_rpc::transport::server()
            .add_service(WorkerDataServer::new(describer.clone()))
            .serve_with_incoming(network.listen(DATA_SERVER)),
    );
    register_worker(&mut coordinator(&network, None)).await?;
    let first = tokio::spawn({
        let service = service.clone();
        async move { service.register(spec(), 0).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A registration waits for the first's description, and leaves once it failed, before it
    // took its turn (its client gone).
    let mut waiting = Box::pin(service.register(spec(), 0));
    let still = tokio::time::timeout(Duration::from_millis(20), &mut waiting).await;
    assert!(still.is_err(), "the second registration waits");
    assert!(first.await?.is_err(), "the description was refused");
    drop(waiting);
    // The cause gone: the next registration describes the spec and is answered.
    refusing.store(false, std::sync::atomic::Ordering::SeqCst);
    let later = service.register(spec(), 0).await;
    assert!(later.is_ok(), "{:?}", later.err());
    assert_eq!(describer.0.load(std::sync::atomic::Ordering::SeqCst), 2);
    Ok(())
}

/// A stop whose last journal write fails ends the service with that error (the process exits
/// non-zero), where it ended as if all were written: a supervisor could not tell.
#[tokio::test]
async fn a_stop_whose_last_journal_write_fails_ends_the_service_with_an_error() -> TestResult {
    let network = MemoryNetwork::new();
    let state = tempfile::tempdir()?;
    let config = CoordinatorServiceConfig {
        // No timed write takes the positions first: the stop's is the one that fails.
        flush_every: Duration::from_secs(3600),
        ..service_config(&network, Vec::new())?
    };
    let service = CoordinatorService::open(state.path(), config)?;
    start_data_server(&network, Vec::new())?;
    let (stop, stopped) = oneshot::channel::<()>();
    let serving = tokio::spawn(service.clone().serve_incoming(
        network.listen(COORDINATOR),
        async {
            let _ = stopped.await;
        },
    ));
    let (mut client, worker, _, session, tasks) = steps_leased(&network, 2).await?;
    report(&mut client, worker, &tasks).await?;
    assert_eq!(update(&mut client, session, 0, vec![0, 1]).await?, 2);
    drop(client);
    service.fail_next_journal_write();
    stop.send(())
        .map_err(|()| "the coordinator already stopped")?;
    let ended = tokio::time::timeout(crate::service::SHUTDOWN_GRACE * 3, serving).await??;
    match ended {
        Err(error @ crate::ServeError::LastFlush(_)) => {
            assert!(error.to_string().contains("injected"), "{error}");
        }
        other => panic!("the stop ended with {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn updates_on_the_session_stream_are_answered_in_turn_listing_workers_only_when_changed(
) -> TestResult {
    let fixture = fixture(Vec::new())?;
    let mut client = coordinator(&fixture.network, None);
    let mut stream = session_stream(&mut client).await?;
    assert_eq!(stream.opened.workers.len(), 1);
    let session = stream.opened.session.ok_or("a session without a token")?;
    let update = |credits: u64, acknowledged: Vec<u64>, version: u64| SessionUpdateRequest {
        session: Some(session),
        grant_credits: credits,
        acknowledged,
        workers_version: version,
        ..SessionUpdateRequest::default()
    };
    // The list the session opened with is current: the answer does not repeat it.
    stream
        .requests
        .send(update(2, Vec::new(), stream.opened.workers_version))?;
    let first = stream.answers.message().await?.ok_or("an answer")?;
    assert!(first.workers.is_empty(), "{first:?}");
    assert_eq!(first.workers_version, stream.opened.workers_version);
    assert_eq!(steps(&lease(&mut client, stream.worker, 4).await?), [0, 1]);
    // A worker joins: the next answer lists both, under a new version.
    register_worker_at(&mut client, "worker-b:7001").await?;
    stream
        .requests
        .send(update(0, vec![0, 1], first.workers_version))?;
    let second = stream.answers.message().await?.ok_or("an answer")?;
    assert_eq!(second.acknowledged_position, 2);
    assert_eq!(second.workers.len(), 2, "{second:?}");
    assert_ne!(second.workers_version, first.workers_version);
    // An update the coordinator refuses ends the stream with its status.
    let stale = SessionToken {
        incarnation: session.incarnation ^ 1,
        ..session
    };
    stream.requests.send(SessionUpdateRequest {
        session: Some(stale),
        ..update(1, Vec::new(), 0)
    })?;
    let refused = stream.answers.message().await.expect_err("a stale token");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");
    Ok(())
}

#[tokio::test]
async fn quiet_updates_are_answered_only_when_they_bring_workers_the_stream_has_not_listed(
) -> TestResult {
    let fixture = fixture(Vec::new())?;
    let mut client = coordinator(&fixture.network, None);
    let mut stream = session_stream(&mut client).await?;
    let session = stream.opened.session.ok_or("a session without a token")?;
    let update =
        |sequence: u64, credits: u64, acknowledged: Vec<u64>, quiet: bool| SessionUpdateRequest {
            session: Some(session),
            grant_credits: credits,
            acknowledged,
            workers_version: stream.opened.workers_version,
            quiet,
            sequence,
            ..SessionUpdateRequest::default()
        };
    // Quiet updates are applied unanswered: their credits lease.
    stream.requests.send(update(1, 2, Vec::new(), true))?;
    stream.requests.send(update(2, 2, Vec::new(), true))?;
    let answer = tokio::time::timeout(Duration::from_millis(300), stream.answers.message()).await;
    assert!(answer.is_err(), "a quiet update answered: {answer:?}");
    assert_eq!(
        steps(&lease(&mut client, stream.worker, 8).await?),
        [0, 1, 2, 3]
    );
    // A worker joins: the next quiet update is answered with the list, under its number.
    let second = register_worker_at(&mut client, "worker-b:7001").await?;
    stream.requests.send(update(3, 0, vec![0, 1], true))?;
    let listed = stream.answers.message().await?.ok_or("an answer")?;
    assert_eq!(
        (
            listed.sequence,
            listed.workers.len(),
            listed.acknowledged_position
        ),
        (3, 2, 2),
        "{listed:?}"
    );
    // One sent before its client read that answer still names the older list: not listed
    // again, so not answered. One that asks is answered with its number, after the quiet
    // ones before it.
    stream.requests.send(update(4, 0, vec![2], true))?;
    stream.requests.send(update(5, 0, vec![3], false))?;
    let asked = stream.answers.message().await?.ok_or("an answer")?;
    assert_eq!(
        (asked.sequence, asked.acknowledged_position),
        (5, 4),
        "{asked:?}"
    );
    assert!(asked.workers.is_empty(), "listed twice: {asked:?}");
    // Every worker gone: a quiet update is answered with the empty list, under a new version.
    for worker_id in [stream.worker, second] {
        client.leave(LeaveRequest { worker_id }).await?;
    }
    stream.requests.send(update(6, 0, Vec::new(), true))?;
    let emptied = stream.answers.message().await?.ok_or("an answer")?;
    assert_eq!(emptied.sequence, 6, "{emptied:?}");
    assert!(emptied.workers.is_empty(), "{emptied:?}");
    assert_ne!(emptied.workers_version, listed.workers_version);
    Ok(())
}

#[tokio::test]
async fn a_report_carried_by_a_lease_call_counts_as_a_report() -> TestResult {
    let fixture = fixture(Vec::new())?;
    let (network, service) = (&fixture.network, &fixture.service);
    let (mut client, worker, _, session, tasks) = steps_leased(network, 2).await?;
    update(&mut client, session, 2, vec![0, 1]).await?;
    let carried = |tasks: &[TaskLease]| LeaseRequest {
        worker_id: worker,
        max_tasks: 4,
        wait_ms: 200,
        report: Some(ReportRequest {
            completed: tasks.iter().map(|t| t.lease_id).collect(),
            ..ReportRequest::default()
        }),
        full_sessions: Vec::new(),
    };
    let next = client.lease(carried(&tasks)).await?.into_inner().tasks;
    assert_eq!(steps(&next), [2, 3], "reported, then leased in one call");
    completed(service, 2, 0);
    // Carried again (a retry after a lost answer): a duplicate, as a report sent twice.
    client.lease(carried(&tasks)).await?;
    completed(service, 2, 2);
    Ok(())
}

#[tokio::test]
async fn a_coordinator_restarted_between_a_lease_batch_and_its_report_leases_the_steps_again(
) -> TestResult {
    let (network, state, stop) = restartable()?;
    let (mut client, worker, job, session, tasks) = steps_leased(&network, 3).await?;
    // All three delivered; the client acknowledged step 0 and held the rest (its interval),
    // and the worker held its report for its next lease call. Then the coordinator restarts.
    assert_eq!(update(&mut client, session, 0, vec![0]).await?, 1);
    let (_, _stop) = restart(&network, state.path(), stop).await?;
    let mut client = coordinator(&network, None);
    let carried = LeaseRequest {
        worker_id: worker,
        max_tasks: 4,
        wait_ms: 0,
        report: Some(ReportRequest {
            completed: tasks.iter().map(|t| t.lease_id).collect(),
            ..ReportRequest::default()
        }),
        full_sessions: Vec::new(),
    };
    let lost = client
        .lease(carried)
        .await
        .expect_err("a worker of the earlier run");
    assert!(lost.message().contains("worker"), "{lost}");
    let worker = register_worker(&mut client).await?;
    // A client that kept no position resumes at the journal's: the held acknowledgements are
    // lost, so steps 1 and 2 come again (it drops them by step if it had them).
    let reopened = reopen_from_journal(&mut client, job).await?;
    assert_eq!(reopened.acknowledged_position, 1);
    let session = reopened.session.ok_or("a session without a token")?;
    assert_eq!(granted(&mut client, session, 2, worker).await?, [1, 2]);
    // The loader keeps its own position (all three arrived) and opens there: nothing again.
    let own = client
        .open_session(OpenSessionRequest {
            job_id: job,
            start_step: 3,
            ..OpenSessionRequest::default()
        })
        .await?
        .into_inner();
    let session = own.session.ok_or("a session without a token")?;
    assert_eq!(granted(&mut client, session, 1, worker).await?, [3]);
    Ok(())
}

#[tokio::test]
async fn a_job_whose_dataset_changed_across_a_restart_is_registered_anew() -> TestResult {
    let (network, state, stop) = restartable()?;
    let mut client = coordinator(&network, None);
    register_worker(&mut client).await?;
    let (before, _) = open(&mut client, 1).await?;
    let (second, _stop) = restart(&network, state.path(), stop).await?;
    // The workers now see a dataset of 12 steps under the same spec.
    let grown = "worker-b:7001";
    start_describer(&network, grown, 12, 48);
    let mut client = coordinator(&network, None);
    register_worker_at(&mut client, grown).await?;
    let registered = registration(&mut client).await?;
    // The client's step count is the one the core serves (before: 12 here, 8 in the core).
    assert_eq!(registered.steps_per_epoch, 12);
    assert_ne!(registered.job_id, before);
    assert_eq!(second.core_stats().jobs, 2);
    let job = client
        .get_job(stoker_proto::v1::GetJobRequest {
            job_id: registered.job_id,
        })
        .await?
        .into_inner();
    assert_eq!(job.steps_per_epoch, 12);
    Ok(())
}

/// Serves on `address` of `network` a data server describing every job as `steps` steps of
/// `samples` samples.
fn start_describer(network: &MemoryNetwork, address: &'static str, steps: u64, samples: u64) {
    start_describer_of(network, address, steps, samples, "");
}

/// [`start_describer`] of datasets of the `fingerprint`.
fn start_describer_of(
    network: &MemoryNetwork,
    address: &'static str,
    steps: u64,
    samples: u64,
    fingerprint: &str,
) {
    tokio::spawn(
        stoker_rpc::transport::server()
            .add_service(WorkerDataServer::new(DescribeOnly(DescribeJobResponse {
                num_samples: samples,
                steps_per_epoch: steps,
                batch_bytes: 1,
                class_names: Vec::new(),
                dataset_fingerprint: fingerprint.to_string(),
                tokenizer_digests: String::new(),
            })))
            .serve_with_incoming(network.listen(address)),
    );
}

/// The same as across a restart, within one coordinator run: a job's description answered
/// every later registration of its spec for the whole run (the new run's clients got the old
/// step count, and workers opening the grown dataset refused the job). Once no session of it
/// is open, a registration past `description_reused_for` has a worker describe it again.
#[tokio::test]
async fn a_job_whose_dataset_changed_between_runs_of_one_coordinator_is_registered_anew(
) -> TestResult {
    let network = MemoryNetwork::new();
    let state = tempfile::tempdir()?;
    let mut config = service_config(&network, Vec::new())?;
    // Shorter than the lease timeout, so the workers stay live through the waits below.
    config.description_reused_for = Duration::from_millis(100);
    let (service, _stop) = serve(&network, CoordinatorService::open(state.path(), config)?);
    start_data_server(&network, Vec::new())?;
    let mut client = coordinator(&network, None);
    let first = register_worker(&mut client).await?;
    let (before, session) = open(&mut client, 1).await?;
    // The dataset grows to 12 steps; the worker that saw 8 leaves.
    client.leave(LeaveRequest { worker_id: first }).await?;
    let grown = "worker-b:7001";
    start_describer(&network, grown, 12, 48);
    register_worker_at(&mut client, grown).await?;
    // While a session of it is open, past the reuse: the run's later ranks are answered as
    // its first were, no worker asked (a run's ranks read one dataset).
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(register_job(&mut client).await?, before);
    client
        .close_session(CloseSessionRequest {
            session: Some(session),
        })
        .await?;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let registered = registration(&mut client).await?;
    assert_eq!(registered.steps_per_epoch, 12);
    assert_ne!(registered.job_id, before);
    assert_eq!(service.core_stats().jobs, 2);
    Ok(())
}

/// A dataset changed between two runs into another of the same step count (other samples, its
/// fingerprint another): described again, it is registered as a new job, never under the old
/// one's id (whose workers, holding the old dataset open, would serve the new run's batches
/// from it, the new ones' from the new: one epoch of both).
#[tokio::test]
async fn a_dataset_changed_into_one_of_the_same_steps_is_a_new_job() -> TestResult {
    let network = MemoryNetwork::new();
    let state = tempfile::tempdir()?;
    let mut config = service_config(&network, Vec::new())?;
    config.description_reused_for = Duration::from_millis(100);
    let (service, _stop) = serve(&network, CoordinatorService::open(state.path(), config)?);
    let mut client = coordinator(&network, None);
    let before = "worker-before:7001";
    start_describer_of(&network, before, 8, 32, "before");
    let first = register_worker_at(&mut client, before).await?;
    let old = register_job(&mut client).await?;
    client.leave(LeaveRequest { worker_id: first }).await?;
    let after = "worker-after:7001";
    start_describer_of(&network, after, 8, 32, "after");
    register_worker_at(&mut client, after).await?;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let registered = registration(&mut client).await?;
    assert_ne!(registered.job_id, old);
    assert_eq!(registered.dataset_fingerprint, "after");
    assert_eq!(service.core_stats().jobs, 2);
    // Its later ranks are answered with the new job.
    assert_eq!(register_job(&mut client).await?, registered.job_id);
    Ok(())
}

/// A job whose epoch leaves no batch per rank (3 samples, batch 4, drop_last) was refused as
/// "steps_per_epoch must be at least 1", a field no user sets: the refusal says it in the
/// spec's terms now.
#[tokio::test]
async fn a_job_leaving_no_batch_per_rank_is_refused_in_its_own_terms() -> TestResult {
    let network = MemoryNetwork::new();
    let state = tempfile::tempdir()?;
    let (_service, _stop) = start(&network, state.path(), Vec::new())?;
    let address = "worker-small:7001";
    start_describer(&network, address, 0, 3);
    let mut client = coordinator(&network, None);
    register_worker_at(&mut client, address).await?;
    let error = client
        .register_job(RegisterJobRequest {
            spec: Some(JobSpec {
                drop_last: true,
                ..spec()
            }),
            weight: 0,
        })
        .await
        .expect_err("a job of no batch was registered");
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    let message = error.message();
    assert!(
        message.contains("3 samples")
            && message.contains("batches of 4")
            && message.contains("drop_last"),
        "{message}"
    );
    Ok(())
}

#[tokio::test]
async fn a_worker_id_of_an_earlier_run_is_refused_though_its_core_id_is_taken_again() -> TestResult
{
    let (network, state, stop) = restartable()?;
    let old = register_worker(&mut coordinator(&network, None)).await?;
    let (_second, _stop) = restart(&network, state.path(), stop).await?;
    let mut client = coordinator(&network, None);
    // Core ids start at 0 again: another worker registers first in the new run.
    let new = register_worker(&mut client).await?;
    assert_ne!(new, old);
    client
        .heartbeat(stoker_proto::v1::HeartbeatRequest { worker_id: new })
        .await?;
    // A worker of the earlier run that never saw a call fail: told to register again, not
    // taken for the new one (whose leases it could report or keep alive).
    let refused = client
        .heartbeat(stoker_proto::v1::HeartbeatRequest { worker_id: old })
        .await
        .expect_err("an earlier run's worker id");
    assert_eq!(refused.code(), Code::NotFound, "{refused}");
    assert!(refused.message().contains("register again"), "{refused}");
    let leased = lease(&mut client, old, 1).await.expect_err("refused too");
    assert_eq!(leased.code(), Code::NotFound);
    Ok(())
}

/// A disk whose syncs wait while it is stalled (at most [`Stall::LONGEST`], so a coordinator
/// that waits on it fails a test rather than hanging it).
#[derive(Debug, Default)]
struct Stall {
    stalled: std::sync::Mutex<bool>,
    resumed: std::sync::Condvar,
    /// Syncs waiting now.
    waiting: std::sync::atomic::AtomicUsize,
}

impl Stall {
    const LONGEST: Duration = Duration::from_secs(5);

    fn set(&self, stalled: bool) {
        *self.stalled.lock().unwrap_or_else(|p| p.into_inner()) = stalled;
        self.resumed.notify_all();
    }

    fn waiting(&self) -> usize {
        self.waiting.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Called by each sync: returns once the disk is not stalled.
    fn pass(&self) {
        let stalled = self.stalled.lock().unwrap_or_else(|p| p.into_inner());
        if !*stalled {
            return;
        }
        self.waiting
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let _resumed = self
            .resumed
            .wait_timeout_while(stalled, Self::LONGEST, |stalled| *stalled);
        self.waiting
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Waits until a write waits on the stalled disk, blocking the calling thread (the test's
    /// own: the runtime's timers may stop while the coordinator's threads wait on the disk).
    fn a_write_waits(&self) -> TestResult {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while self.waiting() == 0 {
            if std::time::Instant::now() >= deadline {
                return Err("no journal write reached the stalled disk".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }
}

/// The journal's file, its syncs held by `stall`.
#[derive(Debug)]
struct StallingDisk {
    file: redb::backends::FileBackend,
    stall: std::sync::Arc<Stall>,
}

impl redb::StorageBackend for StallingDisk {
    fn len(&self) -> std::io::Result<u64> {
        self.file.len()
    }
    fn read(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        self.file.read(offset, len)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.file.set_len(len)
    }
    fn sync_data(&self, eventual: bool) -> std::io::Result<()> {
        self.stall.pass();
        self.file.sync_data(eventual)
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.file.write(offset, data)
    }
}

/// A coordinator as [`fixture`]'s, its journal on a disk `stall` stalls.
fn stalling_fixture(stall: &std::sync::Arc<Stall>) -> Result<Fixture, Box<dyn std::error::Error>> {
    let network = MemoryNetwork::new();
    let state = tempfile::tempdir()?;
    let (path, disk) = (
        state.path().join(crate::JOURNAL_FILE),
        std::sync::Arc::clone(stall),
    );
    let open: crate::journal::OpenDatabase = Box::new(move || {
        redb::Builder::new().create_with_backend(StallingDisk {
            file: crate::journal::journal_file(&path)?,
            stall: std::sync::Arc::clone(&disk),
        })
    });
    let config = service_config(&network, Vec::new())?;
    let core = crate::Durable::open_with(state.path(), config.core.clone(), open)?;
    let (service, stop) = serve(&network, CoordinatorService::with_core(core, config));
    start_data_server(&network, Vec::new())?;
    Ok(Fixture {
        network,
        service,
        state,
        stop,
    })
}

/// A coordinator on a disk `stall` stalls ([`stalling_fixture`]), a client of it, a worker
/// registered and rank 0's session of [`spec`]'s job open with 2 credits.
async fn with_a_session(
    stall: &std::sync::Arc<Stall>,
) -> Result<
    (
        Fixture,
        CoordinatorClient<RpcChannel>,
        u64,
        u64,
        SessionToken,
    ),
    Box<dyn std::error::Error>,
> {
    let fixture = stalling_fixture(stall)?;
    let mut client = coordinator(&fixture.network, None);
    let worker = register_worker(&mut client).await?;
    let (job, session) = open(&mut client, 2).await?;
    Ok((fixture, client, worker, job, session))
}

/// Runs `call`, refused when it takes a lease timeout or more (on a stalled disk it would).
async fn promptly<T>(
    what: &str,
    call: impl std::future::Future<Output = Result<T, Status>>,
) -> Result<T, Box<dyn std::error::Error>> {
    let started = std::time::Instant::now();
    let answer = call.await?;
    let took = started.elapsed();
    if took >= LEASE_TIMEOUT {
        return Err(format!("{what} took {took:?} while the journal's disk was stalled").into());
    }
    Ok(answer)
}

/// One round of `worker` leasing up to 4 tasks and reporting them done, and the client of
/// `session` acknowledging them and granting their credits again, each call refused when it
/// takes a lease timeout or more ([`promptly`]). Returns the acknowledged position.
async fn serve_promptly(
    client: &mut CoordinatorClient<RpcChannel>,
    worker: u64,
    session: SessionToken,
) -> Result<u64, Box<dyn std::error::Error>> {
    let tasks = promptly("a lease", lease(client, worker, 4)).await?;
    promptly("a report", report(client, worker, &tasks)).await?;
    let credits = tasks.len() as u64;
    promptly(
        "an acknowledgement",
        update(client, session, credits, steps(&tasks)),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_and_clients_are_answered_while_the_journals_disk_is_stalled() -> TestResult {
    let stall = std::sync::Arc::new(Stall::default());
    let (fixture, mut client, worker, job, session) = with_a_session(&stall).await?;
    let tasks = lease(&mut client, worker, 4).await?;
    report(&mut client, worker, &tasks).await?;
    stall.set(true);
    assert_eq!(update(&mut client, session, 2, steps(&tasks)).await?, 2);
    // The next flush (every 100 ms) takes position 2 and waits on the disk.
    stall.a_write_waits()?;
    // For three lease timeouts the worker leases and reports, the client acknowledges and
    // grants, each answered at once.
    let mut acknowledged = 2;
    let until = std::time::Instant::now() + LEASE_TIMEOUT * 3;
    while std::time::Instant::now() < until {
        acknowledged = serve_promptly(&mut client, worker, session).await?;
    }
    assert!(stall.waiting() > 0, "the write stalled all along");
    assert_eq!(acknowledged, STEPS, "the epoch went on to its end");
    assert_eq!(
        fixture.service.workers().len(),
        1,
        "the worker was not lost"
    );
    stall.set(false);
    // Stopped (the last positions written once the disk moves again) and restarted: nothing
    // acknowledged was lost.
    let fixture = fixture.restarted().await?;
    let reopened = reopen_from_journal(&mut coordinator(&fixture.network, None), job).await?;
    assert_eq!(reopened.acknowledged_position, STEPS);
    Ok(())
}

/// A registration of the job of `seed` (another job than [`spec`]'s), asking for `weight`.
async fn register_other(
    mut client: CoordinatorClient<RpcChannel>,
    seed: u64,
    weight: u32,
) -> Result<u64, Status> {
    let mut other = spec();
    other.seed = seed;
    let request = RegisterJobRequest {
        spec: Some(other),
        weight,
    };
    Ok(client.register_job(request).await?.into_inner().job_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_waiting_on_the_journals_disk_holds_up_no_other_call() -> TestResult {
    let stall = std::sync::Arc::new(Stall::default());
    let (fixture, mut client, worker, job, session) = with_a_session(&stall).await?;
    stall.set(true);
    // A new job's registration is durable before it is answered: it waits on the disk, and
    // a second rank's registration of the same job, asking for a weight, waits behind it.
    let first = tokio::spawn(register_other(coordinator(&fixture.network, None), 2, 0));
    stall.a_write_waits()?;
    let second = tokio::spawn(register_other(coordinator(&fixture.network, None), 2, 3));
    // For three lease timeouts the worker leases and reports, the client acknowledges and
    // grants, and the job registered before is registered again, each answered at once.
    let until = std::time::Instant::now() + LEASE_TIMEOUT * 3;
    let mut acknowledged = 0;
    while std::time::Instant::now() < until {
        acknowledged = serve_promptly(&mut client, worker, session).await?;
        let again = promptly("a registration of a known job", register_job(&mut client)).await?;
        assert_eq!(again, job);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(acknowledged, STEPS, "the epoch went on to its end");
    assert!(
        !first.is_finished() && !second.is_finished(),
        "both wait on the disk"
    );
    assert_eq!(
        fixture.service.workers().len(),
        1,
        "the worker was not lost"
    );
    stall.set(false);
    let other = first.await??;
    assert_eq!(second.await??, other, "one job for both ranks");
    assert_ne!(other, job);
    let weight = fixture
        .service
        .locked_core()
        .job_share(crate::JobId(other))
        .weight;
    assert_eq!(weight, 3, "the second rank's weight was given");
    // Both writes landed: a restarted coordinator knows the job and its weight.
    let fixture = fixture.restarted().await?;
    let weight = fixture
        .service
        .locked_core()
        .job_share(crate::JobId(other))
        .weight;
    assert_eq!(weight, 3, "the weight was journaled");
    register_worker(&mut coordinator(&fixture.network, None)).await?;
    let again = register_other(coordinator(&fixture.network, None), 2, 0).await?;
    assert_eq!(again, other, "the job was journaled");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_stalled_for_longer_than_a_lease_timeout_costs_no_worker_its_place(
) -> TestResult {
    let Fixture {
        network,
        service,
        stop: _stop,
        ..
    } = fixture(Vec::new())?;
    let mut client = coordinator(&network, None);
    let worker = register_worker(&mut client).await?;
    open(&mut client, 1).await?;
    let tasks = lease(&mut client, worker, 4).await?;
    assert_eq!(steps(&tasks), [0]);
    // The coordinator stopped for three lease timeouts (a paused machine, no CPU): its lock
    // held by the test's own thread, so nobody is heard, the worker included, and the
    // runtime's threads that want the lock wait for it (so the test's thread sleeps, not its
    // runtime's timers).
    {
        let _stalled = service.locked_core();
        std::thread::sleep(LEASE_TIMEOUT * 3);
    }
    // The look for silent workers that waited for the lock runs first, with the stall
    // excused: the worker still holds its place and its lease.
    tokio::time::sleep(Duration::from_millis(50)).await;
    report(&mut client, worker, &tasks).await?;
    completed(&service, 1, 0);
    assert_eq!(service.workers().len(), 1, "the worker was not lost");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_with_no_session_open_for_its_retention_is_retired_and_registered_anew() -> TestResult
{
    let network = MemoryNetwork::new();
    let state = tempfile::tempdir()?;
    let mut config = service_config(&network, Vec::new())?;
    config.core.job_retention = Some(Duration::from_millis(400));
    let (service, _stop) = serve(&network, CoordinatorService::open(state.path(), config)?);
    start_data_server(&network, Vec::new())?;
    let mut client = coordinator(&network, None);
    let worker = register_worker(&mut client).await?;
    let (job, session) = open(&mut client, 2).await?;
    let tasks = lease(&mut client, worker, 4).await?;
    report(&mut client, worker, &tasks).await?;
    let request = SessionUpdateRequest {
        session: Some(session),
        grant_credits: 0,
        acknowledged: steps(&tasks),
        stats: Some(stoker_proto::v1::ClientStats::default()),
        ..SessionUpdateRequest::default()
    };
    client.update_session(request).await?;
    assert!(
        service.clients().iter().any(|entry| entry.job == job),
        "the client's report is kept"
    );
    // Open for three retentions: kept.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let get = |job: u64| {
        let mut client = coordinator(&network, None);
        async move {
            let request = stoker_proto::v1::GetJobRequest { job_id: job };
            client
                .get_job(request)
                .await
                .err()
                .map(|status| status.code())
        }
    };
    assert_eq!(get(job).await, None, "a job with a session open is kept");
    client
        .close_session(stoker_proto::v1::CloseSessionRequest {
            session: Some(session),
        })
        .await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while get(job).await.is_none() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(get(job).await, Some(Code::NotFound), "retired");
    assert_eq!(service.core_stats().jobs_retired, 1);
    assert_eq!(service.core_stats().jobs, 0);
    assert!(
        service.clients().iter().all(|entry| entry.job != job),
        "and its client's report forgotten"
    );
    let reopened = client
        .open_session(OpenSessionRequest {
            job_id: job,
            rank: 0,
            epoch: 0,
            start_step: 0,
            resume_from_journal: false,
        })
        .await;
    assert_eq!(
        reopened.err().map(|status| status.code()),
        Some(Code::NotFound),
        "its clients are told it is unknown"
    );
    // Registered again, under a new id, described afresh (by a worker live now: the first
    // sent no heartbeat, so it is gone).
    register_worker(&mut client).await?;
    let (again, _) = open(&mut client, 1).await?;
    assert_ne!(again, job);
    assert_eq!(get(again).await, None);
    Ok(())
}

/// The body of `GET path` from the dashboard at `address` (loopback: no credential).
fn dashboard_get(address: std::net::SocketAddr, path: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}

/// A rank whose reports stopped stayed on the dashboard, sampled into its full history and
/// exported on `/metrics` as current, until its job was retired (a day by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_silent_past_its_limit_leaves_the_dashboard() -> TestResult {
    let network = MemoryNetwork::new();
    let state = tempfile::tempdir()?;
    let mut config = service_config(&network, Vec::new())?;
    config.rank_forgotten_after = Duration::from_millis(1500);
    let dashboard =
        std::sync::Arc::new(stoker_dashboard::Dashboard::start("127.0.0.1:0".parse()?)?);
    let address = dashboard.local_addr();
    let service = CoordinatorService::open(state.path(), config)?.with_dashboard(dashboard);
    let (service, _stop) = serve(&network, service);
    start_data_server(&network, Vec::new())?;
    let mut client = coordinator(&network, None);
    register_worker(&mut client).await?;
    let (job, session) = open(&mut client, 2).await?;
    let request = SessionUpdateRequest {
        session: Some(session),
        stats: Some(stoker_proto::v1::ClientStats {
            batches: 3,
            samples: 24,
            elapsed_ns: 1_000_000_000,
            ..Default::default()
        }),
        ..SessionUpdateRequest::default()
    };
    client.update_session(request).await?;
    let name = format!("\"name\":\"job {job} ");
    let shown = tokio::task::spawn_blocking(move || dashboard_get(address, "/api/jobs")).await??;
    assert!(shown.contains(&name), "the rank is charted: {shown}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut left = false;
    while !left && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let (jobs, metrics) = tokio::task::spawn_blocking(move || {
            Ok::<_, std::io::Error>((
                dashboard_get(address, "/api/jobs")?,
                dashboard_get(address, "/metrics")?,
            ))
        })
        .await??;
        left = !jobs.contains(&name) && !metrics.contains("stoker_samples_total{");
    }
    assert!(left, "the silent rank is still shown");
    assert!(service.clients().is_empty(), "and its report forgotten");
    Ok(())
}

/// Without a dashboard (no `--http`) a silent rank's report was held until its job retired
/// (never, with a retention of 0): one entry per rank that ever reported. Let go alike now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_ranks_report_is_let_go_without_a_dashboard_too() -> TestResult {
    let network = MemoryNetwork::new();
    let state = tempfile::tempdir()?;
    let mut config = service_config(&network, Vec::new())?;
    config.rank_forgotten_after = Duration::from_millis(500);
    let (service, _stop) = serve(&network, CoordinatorService::open(state.path(), config)?);
    start_data_server(&network, Vec::new())?;
    let mut client = coordinator(&network, None);
    register_worker(&mut client).await?;
    let (_, session) = open(&mut client, 2).await?;
    let request = SessionUpdateRequest {
        session: Some(session),
        stats: Some(stoker_proto::v1::ClientStats {
            batches: 3,
            elapsed_ns: 1_000_000_000,
            ..Default::default()
        }),
        ..SessionUpdateRequest::default()
    };
    client.update_session(request).await?;
    assert_eq!(service.clients().len(), 1, "the report is held");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !service.clients().is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        service.clients().is_empty(),
        "the silent rank's report is held"
    );
    Ok(())
}

/// A worker that does not open a new job in time: the client's error read "could not reach
/// coordinator X", though the coordinator answered; it names the worker and the setting now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_too_slow_to_open_a_job_is_named_with_the_setting_to_raise() -> TestResult {
    let network = MemoryNetwork::new();
    let state = tempfile::tempdir()?;
    let mut config = service_config(&network, Vec::new())?;
    config.describe_timeout = Duration::from_millis(300);
    let (_service, _stop) = serve(&network, CoordinatorService::open(state.path(), config)?);
    // Connections to it are taken and never answered.
    let _silent = network.listen("silent-worker:7001");
    let mut client = coordinator(&network, None);
    register_worker_at(&mut client, "silent-worker:7001").await?;
    let status = tokio::time::timeout(Duration::from_secs(30), register_job(&mut client))
        .await?
        .expect_err("no worker opened the job");
    assert!(
        stoker_rpc::error_kinds::is_worker_unreachable(&status),
        "{status:?}"
    );
    assert!(
        status.message().contains("silent-worker:7001")
            && status.message().contains("--describe-timeout-secs"),
        "{status:?}"
    );
    Ok(())
}

/// Every worker stuck opening a job (a shared store that hangs): each was given the whole
/// describe timeout in turn, so six cost a registration six timeouts; the check takes one in
/// all now, and its error names every worker that did not answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_workers_cost_a_registration_one_describe_timeout_in_all() -> TestResult {
    let network = MemoryNetwork::new();
    let state = tempfile::tempdir()?;
    let mut config = service_config(&network, Vec::new())?;
    config.describe_timeout = Duration::from_millis(800);
    let (_service, _stop) = serve(&network, CoordinatorService::open(state.path(), config)?);
    let addresses = [
        "silent-0:7001",
        "silent-1:7001",
        "silent-2:7001",
        "silent-3:7001",
        "silent-4:7001",
        "silent-5:7001",
    ];
    let _silent: Vec<_> = addresses.iter().map(|at| network.listen(at)).collect();
    let mut client = coordinator(&network, None);
    for at in addresses {
        register_worker_at(&mut client, at).await?;
    }
    let started = std::time::Instant::now();
    let status = tokio::time::timeout(Duration::from_secs(30), register_job(&mut client))
        .await?
        .expect_err("no worker opened the job");
    let took = started.elapsed();
    // Six in turn took 4.8 s; one timeout and the time to answer, now.
    assert!(took < Duration::from_millis(4000), "{took:?}");
    assert!(
        stoker_rpc::error_kinds::is_worker_unreachable(&status),
        "{status:?}"
    );
    assert!(
        status.message().contains("--describe-timeout-secs"),
        "{status:?}"
    );
    for at in addresses {
        assert!(status.message().contains(at), "{at}: {status:?}");
    }
    Ok(())
}

/// A worker that answers, registered after ten stuck ones: it was asked only once each stuck
/// one had used the whole timeout (ten of 4 s: 40 s); each is joined by the next within a
/// fraction of it now (more workers, shorter head starts), and the job opens well within one
/// timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_answers_is_asked_while_stuck_ones_are_still_waited_for() -> TestResult {
    let network = MemoryNetwork::new();
    let state = tempfile::tempdir()?;
    let mut config = service_config(&network, Vec::new())?;
    config.describe_timeout = Duration::from_secs(4);
    let (_service, _stop) = serve(&network, CoordinatorService::open(state.path(), config)?);
    let stuck: Vec<String> = (0..10).map(|n| format!("silent-{n}:7001")).collect();
    let _silent: Vec<_> = stuck.iter().map(|at| network.listen(at)).collect();
    let mut client = coordinator(&network, None);
    for at in &stuck {
        register_worker_at(&mut client, at).await?;
    }
    let answering = "worker-d:7001";
    start_describer(&network, answering, 12, 48);
    register_worker_at(&mut client, answering).await?;
    let started = std::time::Instant::now();
    let registered =
        tokio::time::timeout(Duration::from_secs(30), registration(&mut client)).await??;
    let took = started.elapsed();
    assert_eq!(registered.steps_per_epoch, 12);
    assert!(took < Duration::from_millis(3500), "{took:?}");
    Ok(())
}

/// A writer into a shared buffer, for a log subscriber's lines.
#[derive(Clone, Default)]
struct LogLines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogLines {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A worker's report of its failed tasks (a store failing for it) wrote two warnings per task,
/// each under the state's lock every job's calls wait for: it writes one line now, off it.
#[tokio::test]
async fn a_report_of_many_failed_tasks_is_one_warning() -> TestResult {
    let lines = LogLines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // A current-thread runtime: the coordinator's tasks log on this thread.
    let _logging = tracing::subscriber::set_default(subscriber);
    let fixture = fixture(Vec::new())?;
    let mut client = coordinator(&fixture.network, None);
    let worker = register_worker(&mut client).await?;
    let (_job, _session) = open(&mut client, STEPS).await?;
    let mut tasks = Vec::new();
    while (tasks.len() as u64) < STEPS {
        let more = lease(&mut client, worker, STEPS as u32).await?;
        assert!(!more.is_empty(), "only {} tasks leased", tasks.len());
        tasks.extend(more);
    }
    // Callsites other tests' threads registered meanwhile are told of this subscriber too
    // (one registered while it was set could have cached "no interest").
    tracing::callsite::rebuild_interest_cache();
    let reason = "the store answers 503 Slow Down (a unique reason)";
    client
        .report(ReportRequest {
            worker_id: worker,
            failed: tasks
                .iter()
                .map(|task| stoker_proto::v1::FailedTask {
                    lease_id: task.lease_id,
                    reason: reason.into(),
                    unclaimed: false,
                })
                .collect(),
            ..ReportRequest::default()
        })
        .await?;
    let logged = String::from_utf8(lines.0.lock().unwrap().clone())?;
    let warnings: Vec<&str> = logged
        .lines()
        .filter(|line| line.contains(reason))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(warnings[0].contains("failed=8"), "{}", warnings[0]);
    Ok(())
}

/// Workers handing a job's tasks back for a cause of their own (a store failing for every
/// worker) left its client to time out naming no cause: the coordinator keeps the last reason,
/// which `GetJob` gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_reason_a_task_went_back_is_given_with_the_job() -> TestResult {
    let fixture = fixture(Vec::new())?;
    let mut client = coordinator(&fixture.network, None);
    let worker = register_worker(&mut client).await?;
    let (job, _session) = open(&mut client, 2).await?;
    let get = |client: &mut CoordinatorClient<RpcChannel>| {
        let mut client = client.clone();
        async move {
            client
                .get_job(stoker_proto::v1::GetJobRequest { job_id: job })
                .await
                .map(|answer| answer.into_inner())
        }
    };
    let before = get(&mut client).await?;
    assert_eq!(
        (before.last_failure.as_str(), before.last_failure_age_s),
        ("", 0)
    );
    let tasks = lease(&mut client, worker, 1).await?;
    client
        .report(ReportRequest {
            worker_id: worker,
            failed: tasks
                .iter()
                .map(|task| stoker_proto::v1::FailedTask {
                    lease_id: task.lease_id,
                    reason: "the store answers 503 Slow Down".into(),
                    unclaimed: false,
                })
                .collect(),
            ..ReportRequest::default()
        })
        .await?;
    let after = get(&mut client).await?;
    assert_eq!(after.last_failure, "the store answers 503 Slow Down");
    assert!(after.last_failure_age_s < 5, "{after:?}");
    Ok(())
}

/// Two sessions of one (job, rank) (its next epoch opened early, or two runs of the same
/// settings): a report of one older than the other's kept replaced it, and the rank's figures
/// went back (`/metrics`' counters down). The newer is kept now, until it goes quiet.
#[tokio::test]
async fn an_older_report_of_another_session_of_a_rank_never_takes_the_newer_ones_place(
) -> TestResult {
    let Fixture {
        network,
        service,
        state: _state,
        stop: _stop,
    } = fixture(Vec::new())?;
    let mut client = coordinator(&network, None);
    register_worker(&mut client).await?;
    let (job, first) = open(&mut client, 1).await?;
    let second = client
        .open_session(OpenSessionRequest {
            job_id: job,
            rank: 0,
            epoch: 1,
            start_step: 0,
            resume_from_journal: false,
        })
        .await?
        .into_inner()
        .session
        .ok_or("a session without a token")?;
    let report = |session: SessionToken, elapsed_s: u64| SessionUpdateRequest {
        session: Some(session),
        stats: Some(stoker_proto::v1::ClientStats {
            batches: elapsed_s,
            elapsed_ns: elapsed_s * 1_000_000_000,
            ..Default::default()
        }),
        ..SessionUpdateRequest::default()
    };
    client.update_session(report(second, 10)).await?;
    client.update_session(report(first, 9)).await?;
    let kept: Vec<u64> = service
        .clients()
        .iter()
        .map(|c| c.stats.elapsed_ns)
        .collect();
    assert_eq!(kept, [10_000_000_000], "the newer report is kept");
    // Its own session's later report is taken as it is.
    client.update_session(report(second, 11)).await?;
    let kept: Vec<u64> = service
        .clients()
        .iter()
        .map(|c| c.stats.elapsed_ns)
        .collect();
    assert_eq!(kept, [11_000_000_000]);
    Ok(())
}

/// A client's update naming a worker it cannot reach takes back that worker's leases of the
/// session: a worker waiting for work is woken for them at once, not at the end of its wait
/// (the wake-ups counted the credits an update grants, none for the steps it took back).
#[tokio::test]
async fn steps_taken_back_from_a_worker_the_client_cannot_reach_wake_a_waiting_one() -> TestResult {
    let network = MemoryNetwork::new();
    let state = tempfile::tempdir()?;
    let mut config = service_config(&network, Vec::new())?;
    // No lease times out here: the steps come back by the client's word alone.
    config.core.lease_timeout = Duration::from_secs(60);
    config.max_lease_wait = Duration::from_secs(30);
    let (_service, _stop) = serve(&network, CoordinatorService::open(state.path(), config)?);
    start_data_server(&network, Vec::new())?;
    let mut unreachable = coordinator(&network, None);
    let unreachable_id = register_worker(&mut unreachable).await?;
    let mut client = coordinator(&network, None);
    let (_, session) = open(&mut client, 2).await?;
    assert_eq!(
        steps(&lease(&mut unreachable, unreachable_id, 4).await?),
        [0, 1]
    );
    let mut waiting = coordinator(&network, None);
    let waiting_id = register_worker_at(&mut waiting, "worker-b:7001").await?;
    let waited = tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        let request = LeaseRequest {
            worker_id: waiting_id,
            max_tasks: 4,
            wait_ms: 20_000,
            report: None,
            full_sessions: Vec::new(),
        };
        let leased = waiting.lease(request).await.map(|r| r.into_inner().tasks);
        (leased, started.elapsed())
    });
    // The waiting call is in before the update. The client names the worker by the id the
    // coordinator's list gave it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let request = SessionUpdateRequest {
        session: Some(session),
        ..SessionUpdateRequest::default()
    };
    let listed = client.update_session(request).await?.into_inner().workers;
    let unreachable_listed = listed
        .iter()
        .find(|worker| worker.data_address == DATA_SERVER)
        .ok_or("the first worker listed")?
        .worker_id;
    let request = SessionUpdateRequest {
        session: Some(session),
        unreachable_workers: Some(WorkerSet {
            workers: vec![unreachable_listed],
        }),
        ..SessionUpdateRequest::default()
    };
    client.update_session(request).await?;
    let (leased, waited_for) = tokio::time::timeout(Duration::from_secs(40), waited).await??;
    assert_eq!(steps(&leased?), [0, 1], "the steps taken back");
    assert!(
        waited_for < Duration::from_secs(10),
        "woken after {waited_for:?}, at the end of its wait"
    );
    Ok(())
}
