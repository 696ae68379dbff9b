//! A job opened from its spec: the dataset (or the mixed datasets), the checked pipeline and the
//! planner inputs. Every batch of the job is a pure function of (spec, epoch, rank, step);
//! [`Job::batch`] computes one.

use std::sync::Arc;

use crate::batch::{
    AssembledBatch, Batch, BatchAssembler, BatchKey, ImageDiverter, MixedAssembler, MixedPart,
    ReadWatch,
};
use crate::error::{Error, Result};
use crate::job_pipeline::JobPipeline;
use crate::plan::mix::{layout_per_batch, source_seed, MAX_MIX_LAYOUT_PER_BATCH};
use crate::plan::{EpochPlan, MixEnd, MixOrder, PlanConfig, Resize};
use stoker_datasets::SampleSource;
use stoker_proto::v1::{self as proto, BadSamplePolicy, JobSpec, MixEpochEnd, UnevenTail};

mod fingerprint;
mod sources;

pub use fingerprint::{fingerprint, SAMPLED as FINGERPRINT_SAMPLES};
pub use sources::{
    open_source, open_sources, source_names, source_split, spec_sources, token_dtype_fits,
};

/// Larger batches than this are refused as a likely mistake (a 1M-image batch of 224x224 RGB
/// would need 150 GB).
pub const MAX_BATCH_SIZE: u32 = 65_536;

/// A buffer a batch is built in, in place (the client's pooled slots): the batch's tensors
/// become slices of it.
pub trait BatchBuffer {
    /// The bytes to write the batch into.
    fn as_mut_slice(&mut self) -> &mut [u8];
    /// The written bytes, shared by the batch's tensors.
    fn into_bytes(self) -> bytes::Bytes;
}

/// A job ready to produce batches.
pub struct Job {
    spec: JobSpec,
    builder: Builder,
    plan_config: PlanConfig,
    /// Samples per shard when the plan is shard-aware (shuffle, a shuffle window and a source
    /// with shards).
    shard_sizes: Option<Arc<[u64]>>,
    /// The reads in progress ([`Job::reading_now`]).
    watch: Arc<ReadWatch>,
}

/// What builds a job's batches: one source's assembler, or a mix's.
enum Builder {
    Single(BatchAssembler),
    Mixed(MixedAssembler),
}

/// The most bytes one batch may take (checked when a job opens): each side and the batch size
/// are bounded on their own, not their product, and a batch is one allocation, which a daemon
/// serving other jobs must never be asked to make past what any machine holds.
pub const MAX_BATCH_BYTES: usize = 16 << 30;

/// Ranks one job has at most (the coordinator keeps state for each).
pub const MAX_WORLD_SIZE: u32 = 1 << 20;

/// The checks of `spec` that open nothing, which the coordinator runs before it schedules a
/// job (the daemons run them again as part of [`Job::open`]): a batch size in range, a world
/// size one coordinator serves, and a dataset with a URI (a mix: one for each source).
pub fn check_spec_shape(spec: &JobSpec) -> Result<()> {
    if spec.batch_size == 0 || spec.batch_size > MAX_BATCH_SIZE {
        return Err(Error::InvalidSpec(format!(
            "batch_size must be in 1..={MAX_BATCH_SIZE}, got {}",
            spec.batch_size
        )));
    }
    let sources = spec_sources(spec);
    let named = spec.mix.as_ref().map_or(1, |mix| mix.sources.len());
    if sources.is_empty() || sources.len() != named {
        return Err(Error::InvalidSpec("job spec has no dataset".into()));
    }
    if sources
        .iter()
        .any(|(dataset, _)| sources::source_names(dataset).is_empty())
    {
        return Err(Error::InvalidSpec("dataset.uri is empty".into()));
    }
    if spec.world_size > MAX_WORLD_SIZE {
        return Err(Error::InvalidSpec(format!(
            "world_size {} is more ranks than one coordinator serves (at most {MAX_WORLD_SIZE})",
            spec.world_size
        )));
    }
    Ok(())
}

/// The epoch rule of `mix`.
fn mix_end(mix: &proto::Mix) -> Result<MixEnd> {
    let rule = MixEpochEnd::try_from(mix.epoch_end)
        .map_err(|_| Error::InvalidSpec(format!("mix epoch_end {} is not known", mix.epoch_end)))?;
    match rule {
        MixEpochEnd::Samples => Ok(MixEnd::Samples(mix.epoch_samples)),
        _ if mix.epoch_samples != 0 => Err(Error::InvalidSpec(
            "a mix's epoch_samples applies to the SAMPLES epoch rule only".into(),
        )),
        MixEpochEnd::FirstExhausted => Ok(MixEnd::FirstExhausted),
        MixEpochEnd::AllExhausted => Ok(MixEnd::AllExhausted),
    }
}

/// The plan of `epoch` for a job with `spec` and planner inputs `config`: shard-aware when
/// shard sizes are given; a spec with a `resized_epoch` serves that epoch only, as what its
/// resizes left of it. [`Job::plan`] and the sources built outside a `Job` (a Python dataset)
/// plan through it.
pub fn plan_for_spec(
    spec: &JobSpec,
    config: PlanConfig,
    shard_sizes: Option<&[u64]>,
    epoch: u64,
) -> Result<EpochPlan> {
    let plan = match shard_sizes {
        Some(sizes) => EpochPlan::new_sharded(config, epoch, sizes),
        None => EpochPlan::new(config, epoch),
    }?;
    match &spec.resized_epoch {
        None => Ok(plan),
        Some(resized) if resized.epoch == epoch => {
            plan.resized(resized.resizes.iter().map(Resize::from).collect())
        }
        Some(resized) => Err(Error::InvalidSpec(format!(
            "this job resumes epoch {} on another world size and serves that epoch only, not epoch {epoch}",
            resized.epoch
        ))),
    }
}

impl Job {
    /// Checks `spec`, opens its datasets and compiles their pipelines.
    pub fn open(spec: JobSpec) -> Result<Job> {
        let sources = open_sources(&spec)?;
        Self::with_sources(spec, sources)
    }

    /// Like [`Job::open`] with an already opened source (a job of one dataset).
    pub fn with_source(spec: JobSpec, source: Arc<dyn SampleSource>) -> Result<Job> {
        Self::with_sources(spec, vec![source])
    }

    /// Like [`Job::open`] with the datasets [`open_sources`] opened, in the spec's order.
    pub fn with_sources(spec: JobSpec, mut sources: Vec<Arc<dyn SampleSource>>) -> Result<Job> {
        if spec.batch_size == 0 || spec.batch_size > MAX_BATCH_SIZE {
            return Err(Error::InvalidSpec(format!(
                "batch_size must be in 1..={MAX_BATCH_SIZE}, got {}",
                spec.batch_size
            )));
        }
        if BadSamplePolicy::try_from(spec.on_error).is_err() {
            return Err(Error::InvalidSpec(format!(
                "on_error {} is not a known policy",
                spec.on_error
            )));
        }
        if UnevenTail::try_from(spec.uneven_tail).is_err() {
            return Err(Error::InvalidSpec(format!(
                "uneven_tail {} is not a known mode",
                spec.uneven_tail
            )));
        }
        let job = if spec.mix.is_some() {
            Self::mixed(spec, sources)?
        } else {
            if sources.len() != 1 {
                return Err(Error::InvalidSpec(format!(
                    "a job of one dataset opened with {} sources",
                    sources.len()
                )));
            }
            let source = sources.remove(0);
            let pipeline = JobPipeline::from_ops(&spec.pipeline)?;
            let plan_config = PlanConfig::from_spec(&spec, source.len());
            let shard_sizes = match (spec.shuffle, spec.shuffle_window) {
                (_, 0) => None,
                (false, window) => {
                    tracing::warn!(
                        shuffle_window = window,
                        "shuffle is off: shuffle_window is not used"
                    );
                    None
                }
                (true, window) => {
                    let sizes = source.shard_sizes().map(Arc::from);
                    if sizes.is_none() {
                        tracing::warn!(
                            shuffle_window = window,
                            "the source has no shards: shuffle_window is not used, the shuffle \
                             is global"
                        );
                    }
                    sizes
                }
            };
            let watch = Arc::new(ReadWatch::default());
            let assembler = BatchAssembler::new(source, pipeline, spec.seed, spec.on_error())?
                .watched(Arc::clone(&watch), 0);
            Job {
                spec,
                builder: Builder::Single(assembler),
                plan_config,
                shard_sizes,
                watch,
            }
        };
        // Surface rank/world/batch/shard/resize errors now rather than at the first epoch.
        job.plan(job.first_epoch())?;
        let batch_size = job.spec.batch_size as usize;
        let bytes = job.batch_bytes(batch_size);
        if bytes > MAX_BATCH_BYTES {
            return Err(Error::InvalidSpec(format!(
                "a batch of {batch_size} samples would take {bytes} bytes, more than the \
                 {MAX_BATCH_BYTES} a batch may (its output size times batch_size): make the \
                 batch or the output smaller"
            )));
        }
        // Told where the job opens, in the command line's and the daemons' logs (the Python
        // module, which shows no Rust log, logs them itself from the loader's notices).
        for notice in job.notices() {
            tracing::warn!("{notice}");
        }
        Ok(job)
    }

    /// A mixed job: each source with its own pipeline and seed, the ranks striding the mix
    /// order's positions (the order itself is shuffled, so the plan over it is not).
    fn mixed(spec: JobSpec, sources: Vec<Arc<dyn SampleSource>>) -> Result<Job> {
        let Some(mix) = spec.mix.as_ref() else {
            return Err(Error::InvalidSpec("the spec has no mix".into()));
        };
        if spec.dataset.is_some() || !spec.pipeline.is_empty() {
            return Err(Error::InvalidSpec(
                "a mixed job names its datasets and pipelines in mix.sources, not in dataset \
                 and pipeline"
                    .into(),
            ));
        }
        if sources.len() != mix.sources.len() {
            return Err(Error::InvalidSpec(format!(
                "a mix of {} sources opened with {}",
                mix.sources.len(),
                sources.len()
            )));
        }
        let mut parts = Vec::with_capacity(sources.len());
        let watch = Arc::new(ReadWatch::default());
        for (k, (source, mixed)) in sources.into_iter().zip(&mix.sources).enumerate() {
            let in_source = |e: Error| match e {
                Error::InvalidSpec(message) => {
                    Error::InvalidSpec(format!("mixed source {k}: {message}"))
                }
                other => other,
            };
            let pipeline = JobPipeline::from_ops(&mixed.pipeline).map_err(in_source)?;
            let seed = source_seed(spec.seed, k);
            let config = PlanConfig {
                num_samples: source.len(),
                batch_size: 1,
                seed,
                shuffle: spec.shuffle,
                drop_last: false,
                rank: 0,
                world_size: 1,
                uneven_tail: UnevenTail::Pad,
                shuffle_window: spec.shuffle_window,
            };
            let shard_sizes = if spec.shuffle && spec.shuffle_window > 0 {
                source.shard_sizes()
            } else {
                None
            };
            let assembler = BatchAssembler::new(source, pipeline, seed, spec.on_error())
                .map_err(in_source)?
                .watched(Arc::clone(&watch), u16::try_from(k).unwrap_or(u16::MAX));
            parts.push(MixedPart {
                assembler,
                config,
                shard_sizes,
            });
        }
        let weights: Vec<f64> = mix.sources.iter().map(|s| s.weight).collect();
        let lens: Vec<u64> = parts.iter().map(|p| p.config.num_samples).collect();
        let order = MixOrder::new(
            &weights,
            &lens,
            mix.window,
            mix_end(mix)?,
            spec.seed,
            spec.shuffle,
        )?;
        let plan_config = PlanConfig {
            shuffle: false,
            shuffle_window: 0,
            ..PlanConfig::from_spec(&spec, order.epoch_len())
        };
        let layout = layout_per_batch(spec.batch_size, plan_config.world_size, order.window());
        if layout > MAX_MIX_LAYOUT_PER_BATCH {
            return Err(Error::InvalidSpec(format!(
                "a mix window of {} positions with {} ranks and batches of {} lays out {layout} \
                 positions per batch (at most {MAX_MIX_LAYOUT_PER_BATCH}): use a smaller window",
                order.window(),
                plan_config.world_size,
                spec.batch_size
            )));
        }
        Ok(Job {
            builder: Builder::Mixed(MixedAssembler::new(parts, order)?),
            spec,
            plan_config,
            shard_sizes: None,
            watch,
        })
    }

    /// The epoch a resized job serves, else 0 (any epoch is served).
    pub fn first_epoch(&self) -> u64 {
        self.spec.resized_epoch.as_ref().map_or(0, |r| r.epoch)
    }

    /// The spec.
    pub fn spec(&self) -> &JobSpec {
        &self.spec
    }

    /// Samples of an epoch: the dataset's, or the mix order's positions.
    pub fn num_samples(&self) -> u64 {
        self.plan_config.num_samples
    }

    /// Bytes of the buffer of a batch of `samples` (every tensor but `label` and `source`).
    pub fn batch_bytes(&self, samples: usize) -> usize {
        match &self.builder {
            Builder::Single(assembler) => assembler.batch_bytes(samples),
            Builder::Mixed(mixed) => mixed.batch_bytes(samples),
        }
    }

    /// Class names, indexed by label (a mix: its sources', when they all have the same).
    pub fn class_names(&self) -> &[String] {
        match &self.builder {
            Builder::Single(assembler) => assembler.source().class_names(),
            Builder::Mixed(mixed) => mixed.class_names(),
        }
    }

    /// What opening the job's sources found that its user should be told once
    /// ([`SampleSource::notices`]), in source order, then its pipelines' (an id past the
    /// tokenizer's, [`JobPipeline::notices`]), then a mix's weights rounded off by its window
    /// and its sources' labels of other class names.
    pub fn notices(&self) -> Vec<String> {
        let mut notices: Vec<String> = self
            .sources()
            .iter()
            .flat_map(|source| source.notices())
            .collect();
        let pipelines: Vec<String> = match &self.builder {
            Builder::Single(assembler) => assembler.pipeline().notices(),
            Builder::Mixed(mixed) => mixed.pipelines().flat_map(|p| p.notices()).collect(),
        };
        // Mixed text sources share their PackSequences (and often the tokenizer): once each.
        for notice in pipelines {
            if !notices.contains(&notice) {
                notices.push(notice);
            }
        }
        if let Builder::Mixed(mixed) = &self.builder {
            notices.extend(mixed.order().rounding().map(str::to_string));
            notices.extend(mixed.classes_notice());
        }
        notices
    }

    /// What the object cache did for the job's sources read from an object store.
    pub fn cache_stats(&self) -> Option<stoker_datasets::CacheStats> {
        match &self.builder {
            Builder::Single(assembler) => assembler.source().cache_stats(),
            Builder::Mixed(mixed) => mixed.cache_stats(),
        }
    }

    /// The SHA-256 of each tokenizer file the job's pipelines loaded, in source order, joined
    /// by `,` (empty without one): workers whose files differ would give other ids.
    pub fn tokenizer_digests(&self) -> String {
        let pipelines: Vec<&JobPipeline> = match &self.builder {
            Builder::Single(assembler) => vec![assembler.pipeline()],
            Builder::Mixed(mixed) => mixed.pipelines().collect(),
        };
        pipelines
            .into_iter()
            .filter_map(JobPipeline::tokenizer_sha256)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The fingerprint of the job's datasets (see [`fingerprint`]), which a saved state carries.
    pub fn dataset_fingerprint(&self) -> String {
        fingerprint(&self.sources())
    }

    /// The job's datasets, in the spec's order.
    pub fn sources(&self) -> Vec<&dyn SampleSource> {
        match &self.builder {
            Builder::Single(assembler) => vec![assembler.source().as_ref()],
            Builder::Mixed(mixed) => mixed.sources(),
        }
    }

    /// The samples being read right now (by the threads building its batches), each as its
    /// source describes it (its file), at most `limit` of them.
    pub fn reading_now(&self, limit: usize) -> Vec<String> {
        let sources = self.sources();
        let mut reads = self.watch.now();
        reads.sort_unstable();
        reads.dedup();
        reads
            .into_iter()
            .filter_map(|(source, index)| {
                let source = sources.get(usize::from(source))?;
                Some(format!("{} (sample {index})", source.describe(index)))
            })
            .take(limit)
            .collect()
    }

    /// The mix order, for a mixed job.
    pub fn mix_order(&self) -> Option<&MixOrder> {
        match &self.builder {
            Builder::Single(_) => None,
            Builder::Mixed(mixed) => Some(mixed.order()),
        }
    }

    /// The planner inputs.
    pub fn plan_config(&self) -> PlanConfig {
        self.plan_config
    }

    /// The plan of `epoch` for this job's rank. A job with a `resized_epoch` serves that epoch
    /// only, as what its resizes left of it.
    pub fn plan(&self, epoch: u64) -> Result<EpochPlan> {
        plan_for_spec(
            &self.spec,
            self.plan_config,
            self.shard_sizes.as_deref(),
            epoch,
        )
    }

    /// Builds batch `step` of `plan` on the current rayon pool, in a new buffer.
    pub fn batch(&self, plan: &EpochPlan, step: u64) -> Result<Batch> {
        let (key, indices) = self.batch_key(plan, step)?;
        self.read_ahead(plan, step, &indices);
        let mut buffer = vec![0u8; self.batch_bytes(indices.len())];
        let (assembled, indices) = self.assemble(key, indices, &mut buffer)?;
        Ok(assembled.into_batch(&indices, bytes::Bytes::from(buffer)))
    }

    /// Builds batch `step` of `plan` on the current rayon pool into `slot`; the batch tensors'
    /// bytes are the slot (slices of it), which goes back to its pool when the last reference
    /// drops.
    pub fn batch_into(
        &self,
        plan: &EpochPlan,
        step: u64,
        mut slot: impl BatchBuffer,
    ) -> Result<Batch> {
        let (key, indices) = self.batch_key(plan, step)?;
        self.read_ahead(plan, step, &indices);
        let (assembled, indices) = self.assemble(key, indices, slot.as_mut_slice())?;
        Ok(assembled.into_batch(&indices, slot.into_bytes()))
    }

    /// Builds batch `step` of `plan` into `buffer` (its [`Job::batch_bytes`]), leaving the image
    /// rows that `diverter` takes for it to fill; returns the batch's tensors and labels with
    /// the dataset index of each sample, which [`AssembledBatch::into_batch`] turns into the
    /// batch once those rows are in. A mix is built whole here (nothing is offered).
    pub fn assemble_step(
        &self,
        plan: &EpochPlan,
        step: u64,
        buffer: &mut [u8],
        diverter: Option<&dyn ImageDiverter>,
    ) -> Result<(AssembledBatch, Vec<u64>)> {
        let (key, indices) = self.batch_key(plan, step)?;
        self.read_ahead(plan, step, &indices);
        match &self.builder {
            Builder::Single(assembler) => Ok((
                assembler.assemble_diverted(key, &indices, buffer, diverter)?,
                indices,
            )),
            Builder::Mixed(mixed) => mixed.assemble_into(key, &indices, buffer),
        }
    }

    /// Builds one image row of `epoch` on the CPU for `sample` (the row's sample in dataset
    /// order), under the bad-input policy; returns the label of the sample read and the
    /// sample's bad-sample report, if it was replaced. For a row that [`Job::assemble_step`]'s
    /// diverter took and could not build.
    pub fn image_row(
        &self,
        epoch: u64,
        sample: u64,
        dest: &mut [u8],
    ) -> Result<(i64, Option<proto::BadSample>)> {
        match &self.builder {
            Builder::Single(assembler) => assembler.image_row(epoch, sample, dest),
            Builder::Mixed(_) => Err(Error::InvalidSpec(
                "rows of a mix are not built one by one".into(),
            )),
        }
    }

    /// The image pipeline, for a job of one source with one (`None` for mixes and other kinds).
    pub fn image_pipeline(&self) -> Option<&crate::pipeline::Pipeline> {
        match &self.builder {
            Builder::Single(assembler) => match assembler.pipeline() {
                JobPipeline::Image(pipeline) => Some(pipeline),
                _ => None,
            },
            Builder::Mixed(_) => None,
        }
    }

    /// Tells the sources that batch `step` (`indices`) and the one after it are read now: one
    /// read from an object store fetches their samples in the background (see
    /// `SampleSource::prefetch`; a mix tells each source its own samples).
    fn read_ahead(&self, plan: &EpochPlan, step: u64, indices: &[u64]) {
        let next = (step + 1 < plan.steps()).then(|| plan.batch_indices(step + 1));
        for batch in std::iter::once(indices).chain(next.as_deref()) {
            match &self.builder {
                Builder::Single(assembler) => assembler.source().prefetch(batch),
                Builder::Mixed(mixed) => mixed.prefetch(plan.epoch(), batch),
            }
        }
    }

    /// Builds the batch of the plan's `indices` into `buffer`; returns it with the dataset
    /// index of each sample (a mix: in its source).
    fn assemble(
        &self,
        key: BatchKey,
        indices: Vec<u64>,
        buffer: &mut [u8],
    ) -> Result<(AssembledBatch, Vec<u64>)> {
        match &self.builder {
            Builder::Single(assembler) => {
                Ok((assembler.assemble_into(key, &indices, buffer)?, indices))
            }
            Builder::Mixed(mixed) => mixed.assemble_into(key, &indices, buffer),
        }
    }

    fn batch_key(&self, plan: &EpochPlan, step: u64) -> Result<(BatchKey, Vec<u64>)> {
        if step >= plan.steps() {
            return Err(Error::InvalidSpec(format!(
                "step {step} is past the end of the epoch ({} steps)",
                plan.steps()
            )));
        }
        let key = BatchKey {
            epoch: plan.epoch(),
            rank: self.plan_config.rank,
            step,
        };
        Ok((key, plan.batch_indices(step)))
    }
}
