//! How a `NativeLoader` is built: its recipe (what makes a loader like it for another spec,
//! as a resume on another world size needs) and the dashboard it starts.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use stoker_gpu::{DevicePinning, PinDevice, StartGpuLane};
use stoker_loader::{
    Dashboard, DashboardAccess, DashboardError, EmbeddedSource, Loader, LoaderOptions, PageLocker,
    PinOptions, RemoteOptions, RemoteSource, Token,
};
use stoker_proto::v1::JobSpec;

use crate::buffer::PinnedRelease;
use crate::dataset::DatasetRecipe;
use crate::errors::{from_loader, raise, Kind};
use crate::settings::LoaderSettings;

use super::access::Held;
use super::NativeLoader;

/// How to build a loader like this one for another spec.
pub(super) struct Recipe {
    pub(super) spec: JobSpec,
    pub(super) options: LoaderOptions,
    pub(super) remote: Option<(String, RemoteOptions)>,
    /// A Python dataset's source and its length (`Loader.from_dataset`), in place of the
    /// spec's dataset.
    pub(super) dataset: Option<(DatasetRecipe, u64)>,
    /// What page-locks the slots of every loader built from this recipe (`options.pin`'s).
    pub(super) pinning: Option<Arc<DevicePinning>>,
    /// What starts the GPU decode lane (`options.decode_lane`'s), for the lane's figures.
    pub(super) lane: Option<Arc<StartGpuLane>>,
}

impl Recipe {
    /// The recipe of `spec` on `threads` decode threads (or dataset lanes) with `settings`'
    /// queue, deadline and pinning (on `pin_device`; with `pin_follow`, on the device the
    /// process uses when the first batch goes out, `pin_device` where it uses none); no
    /// coordinator, Python dataset or GPU decode lane yet.
    pub(super) fn new(spec: JobSpec, threads: usize, settings: &LoaderSettings) -> Recipe {
        let pinning = settings.pin_device.map(|device| {
            Arc::new(DevicePinning::new(if settings.pin_follow {
                PinDevice::Follow(device)
            } else {
                PinDevice::Fixed(device)
            }))
        });
        let pin = pinning.as_ref().map(|pinning| PinOptions {
            locker: Arc::clone(pinning) as Arc<dyn PageLocker>,
            budget_bytes: settings.pinned_budget,
        });
        Recipe {
            spec,
            options: LoaderOptions {
                threads,
                prefetch: settings.prefetch,
                max_prefetch_bytes: settings.max_prefetch_bytes,
                deadline: Duration::from_secs_f64(settings.timeout_s),
                max_held_batches: settings.max_held_batches,
                pin,
                ..LoaderOptions::default()
            },
            remote: None,
            dataset: None,
            pinning,
            lane: None,
        }
    }

    /// Served by the coordinator at this address with these options (`None`: in process). The
    /// coordinator (or a worker for the job) out of reach at the start is waited for as long
    /// as mid-run: `worker_grace`.
    pub(super) fn remote_at(&mut self, remote: Option<(String, RemoteOptions)>) {
        self.remote = remote.map(|(address, options)| {
            let connect_timeout = options.worker_grace;
            let options = RemoteOptions {
                connect_timeout,
                ..options
            };
            (address, options)
        });
    }

    pub(super) fn build(&self, spec: JobSpec) -> stoker_loader::Result<Loader> {
        if let Some((dataset, num_samples)) = &self.dataset {
            let source = dataset.build(spec, *num_samples)?;
            return Loader::with_source(Box::new(source), self.options.clone());
        }
        match &self.remote {
            Some((address, remote)) => {
                Loader::remote(address, spec, self.options.clone(), remote.clone())
            }
            None => Loader::new(spec, self.options.clone()),
        }
    }

    /// The loader of `spec`, an epoch resumed on another world size, beside `plain` (this
    /// recipe's loader): over its slots, and on its decode threads and GPU lane in the
    /// embedded mode (a Python dataset's workers and a coordinator's job are new ones).
    pub(super) fn build_beside(
        &self,
        plain: &Loader,
        spec: JobSpec,
    ) -> stoker_loader::Result<Loader> {
        plain.beside(spec, self.options.clone(), |spec| {
            if let Some((dataset, num_samples)) = &self.dataset {
                return Ok(Box::new(dataset.build(spec, *num_samples)?));
            }
            match &self.remote {
                Some((address, remote)) => Ok(Box::new(RemoteSource::connect(
                    address,
                    spec,
                    remote.clone(),
                )?)),
                None => {
                    let job = stoker_pipeline::Job::open(spec)?;
                    let lane = self.options.start_lane(&job)?;
                    Ok(Box::new(EmbeddedSource::start_with(
                        job,
                        self.options.threads,
                        lane,
                    )?))
                }
            }
        })
    }
}

/// The dashboard credential in `token_file` (none without one), refused when it is the
/// distributed mode's token `rpc`: the dashboard serves plain HTTP, and its credential opens
/// the page alone.
fn dashboard_credentials(
    token_file: Option<&std::path::Path>,
    rpc: Option<&Token>,
) -> PyResult<Vec<Token>> {
    let Some(path) = token_file else {
        return Ok(Vec::new());
    };
    let credential = Token::read(path)
        .map_err(|e| PyValueError::new_err(format!("dashboard_token_file: {e}")))?;
    if rpc.is_some_and(|rpc| rpc.expose() == credential.expose()) {
        return Err(PyValueError::new_err(
            "dashboard_token_file holds the distributed mode's token: the dashboard's \
             credential must differ from it (the dashboard serves plain HTTP, and its \
             credential may travel where the token must not)",
        ));
    }
    Ok(vec![credential])
}

/// Starts the dashboard at `address` ("host:port"; off loopback only with `credentials`) with
/// `loader`'s figures as `job_name`; with credentials, also on loopback only to requests that
/// carry one.
fn start_dashboard(
    dashboard: Option<(String, Vec<Token>)>,
    job_name: &str,
    rank: u32,
    loader: &Loader,
) -> PyResult<Option<Dashboard>> {
    let Some((address, credentials)) = dashboard else {
        return Ok(None);
    };
    // A host name is resolved (`localhost:8321`), its first IPv4 address taken where it has
    // one.
    let resolved: Vec<std::net::SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(&address)
        .map_err(|e| {
            PyValueError::new_err(format!(
                "dashboard address {address:?} is not a host:port that resolves ({e})"
            ))
        })?
        .collect();
    let address = resolved
        .iter()
        .find(|address| address.is_ipv4())
        .or(resolved.first())
        .copied()
        .ok_or_else(|| {
            PyValueError::new_err(format!("dashboard address {address:?} resolves to nothing"))
        })?;
    let access = DashboardAccess {
        credentials,
        ..DashboardAccess::default()
    };
    let dashboard = Dashboard::start_with(address, access).map_err(|e| match e {
        DashboardError::NeedsCredential(_) => PyValueError::new_err(e.to_string()),
        e => raise(Kind::Stoker, format!("cannot start the dashboard: {e}")),
    })?;
    dashboard.register_job(job_name, rank, loader.monitor());
    Ok(Some(dashboard))
}

impl NativeLoader {
    /// Builds the loader `recipe` describes (the interpreter let go meanwhile) and its
    /// dashboard, when `settings` give it an address.
    pub(super) fn from_recipe(
        py: Python<'_>,
        recipe: Recipe,
        address: Option<String>,
        settings: LoaderSettings,
    ) -> PyResult<Self> {
        crate::logs::install();
        // Read before the loader is built: a refused credential does not wait for a
        // coordinator first.
        // The token the client will send: `token=`, else `STOKER_TOKEN`.
        let rpc_token = match &recipe.remote {
            Some((_, remote)) => Token::or_from_env(remote.token.clone())
                .map_err(|e| PyValueError::new_err(format!("token: {e}")))?,
            None => None,
        };
        let credentials =
            dashboard_credentials(settings.dashboard_token_file.as_deref(), rpc_token.as_ref())?;
        let loader = py
            .detach(|| recipe.build(recipe.spec.clone()))
            .map_err(from_loader)?;
        let LoaderSettings {
            dashboard,
            job_name,
            rank,
            release_streams,
            ..
        } = settings;
        let dashboard = dashboard.map(|address| (address, credentials));
        let dashboard = start_dashboard(dashboard, &job_name, rank, &loader)?;
        let release = match &recipe.pinning {
            Some(pinning) if loader.slots().is_pinned() => Some(Arc::new(PinnedRelease {
                streams: release_streams,
                pinning: Arc::clone(pinning),
            })),
            _ => None,
        };
        Ok(Self {
            held: Mutex::new(Held {
                loader: Some(Arc::new(loader)),
                resumed: None,
                resumed_empty: None,
                dashboard,
                charted_as: (job_name, rank),
                charting_resumed: false,
            }),
            current: Mutex::new(None),
            waiting: Mutex::new(None),
            close_deferred: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            address,
            recipe,
            release,
        })
    }
}
