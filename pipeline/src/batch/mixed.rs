//! Batches of a mix of sources. The mix order (`plan::mix`) says which source and which of its
//! draws each position holds; a draw is a sample of one pass of that source's own order. The
//! rows of each (source, pass) are built by that source's assembler (its pipeline, its seed,
//! the pass's epoch key) and copied into their places in the batch; packed text is tokenised
//! per source and packed once, after the documents are mixed, so a row can hold documents of
//! several sources. Every batch carries `source`, each sample's source (packed text: each
//! document's, indexed like `document_ids`).

use stoker_datasets::{CacheStats, SampleSource};

use super::{AssembledBatch, BatchAssembler, BatchKey, TensorLayout};
use crate::error::{Error, Result};
use crate::job_pipeline::JobPipeline;
use crate::plan::mix::source_epoch;
use crate::plan::{EpochPlan, MixOrder, PlanConfig};

/// One mixed source: its assembler and the inputs of its own order.
pub struct MixedPart {
    /// Builds the source's rows through its pipeline, seeded with the source's seed.
    pub assembler: BatchAssembler,
    /// The source's order: its length, seed, shuffle and shuffle window (batch 1, one rank).
    pub config: PlanConfig,
    /// Samples per shard, for a shard-aware order.
    pub shard_sizes: Option<Vec<u64>>,
}

/// Builds the batches of a mix.
pub struct MixedAssembler {
    parts: Vec<MixedPart>,
    order: MixOrder,
    class_names: Vec<String>,
}

/// One row of a mixed batch.
#[derive(Debug, Clone, Copy)]
struct Row {
    source: usize,
    pass: u64,
    /// The sample of the source.
    index: u64,
}

/// A tensor's name, dtype and per-sample shape, for comparing sources.
fn describe(layout: &[TensorLayout]) -> String {
    layout
        .iter()
        .map(|t| {
            let dims: Vec<String> = t.shape[1..].iter().map(u64::to_string).collect();
            format!("{} {} [{}]", t.name, t.dtype.as_str_name(), dims.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

impl MixedAssembler {
    /// The assembler of `parts` mixed by `order`. Fails, naming the sources and what they give,
    /// when their batches would not have the same tensors (names, dtypes, shapes, labels) or
    /// packed text packs differently.
    pub fn new(parts: Vec<MixedPart>, order: MixOrder) -> Result<Self> {
        let Some(first) = parts.first() else {
            return Err(Error::InvalidSpec("a mix needs at least one source".into()));
        };
        let first_layout = first.assembler.layout(1);
        let reference = describe(&first_layout);
        if first_layout.iter().any(|tensor| tensor.name == "source") {
            // The mix adds a `source` tensor: one of the sources' own of that name would be
            // replaced by it, silently.
            return Err(Error::InvalidSpec(
                "mixed sources give a tensor named 'source', which the mix adds (each row's \
                 source): select or name that column otherwise"
                    .into(),
            ));
        }
        for (k, part) in parts.iter().enumerate().skip(1) {
            let layout = describe(&part.assembler.layout(1));
            if layout != reference {
                return Err(Error::InvalidSpec(format!(
                    "mixed sources must give the same tensors: source 0 gives {reference}, \
                     source {k} gives {layout}"
                )));
            }
            if part.assembler.has_labels() != first.assembler.has_labels() {
                let says = |labelled: bool| if labelled { "has" } else { "has no" };
                return Err(Error::InvalidSpec(format!(
                    "mixed sources must give the same tensors: source 0 {} labels, source {k} {}",
                    says(first.assembler.has_labels()),
                    says(part.assembler.has_labels())
                )));
            }
            if let (JobPipeline::PackedText(a), JobPipeline::PackedText(b)) =
                (first.assembler.pipeline(), part.assembler.pipeline())
            {
                if a.pack != b.pack {
                    return Err(Error::InvalidSpec(format!(
                        "mixed text sources are packed together, so their PackSequences must \
                         be the same: source 0 has {:?}, source {k} has {:?}",
                        a.pack, b.pack
                    )));
                }
                // Rows hold documents of several sources: an id must mean one token in all.
                if let Some(difference) = a.tokenizer.vocabulary_difference(&b.tokenizer) {
                    return Err(Error::InvalidSpec(format!(
                        "mixed text sources are packed into the same rows, so their tokenizers \
                         must give every token the same id: source 0 and source {k} differ \
                         ({difference})"
                    )));
                }
            }
        }
        let names = |part: &MixedPart| part.assembler.source().class_names().to_vec();
        let class_names = if parts.iter().all(|part| names(part) == names(first)) {
            names(first)
        } else {
            Vec::new()
        };
        Ok(Self {
            parts,
            order,
            class_names,
        })
    }

    /// Where the sources have labels of other class names, in words: their labels share one
    /// number space (label 1 of one is not label 1 of the other), which the loader then says.
    pub fn classes_notice(&self) -> Option<String> {
        let named: Vec<(usize, &[String])> = self
            .parts
            .iter()
            .enumerate()
            .map(|(k, part)| (k, part.assembler.source().class_names()))
            .filter(|(_, names)| !names.is_empty())
            .collect();
        let (first, names) = named.first()?;
        let (other, _) = named.iter().find(|(_, other)| other != names)?;
        Some(format!(
            "mixed sources {first} and {other} have other class names: their labels share one \
             number space (a label means one class in source {first} and another in source \
             {other}), and the loader has no class names"
        ))
    }

    /// The mix order.
    pub fn order(&self) -> &MixOrder {
        &self.order
    }

    /// The tensors of a batch of `samples` in its buffer (every source's are the same).
    pub fn layout(&self, samples: usize) -> Vec<TensorLayout> {
        self.parts[0].assembler.layout(samples)
    }

    /// Bytes of the buffer of a batch of `samples`.
    pub fn batch_bytes(&self, samples: usize) -> usize {
        self.parts[0].assembler.batch_bytes(samples)
    }

    /// The sources' class names when they all have the same, else none (labels then index each
    /// source's own classes; `source` tells which).
    pub fn class_names(&self) -> &[String] {
        &self.class_names
    }

    /// The sources' pipelines, in the spec's order.
    pub fn pipelines(&self) -> impl Iterator<Item = &JobPipeline> {
        self.parts.iter().map(|part| part.assembler.pipeline())
    }

    /// The mixed datasets, in the spec's order.
    pub fn sources(&self) -> Vec<&dyn SampleSource> {
        self.parts
            .iter()
            .map(|part| part.assembler.source().as_ref())
            .collect()
    }

    /// The cache tier's figures summed over the sources read from an object store.
    pub fn cache_stats(&self) -> Option<CacheStats> {
        self.parts
            .iter()
            .filter_map(|part| part.assembler.source().cache_stats())
            .reduce(|a, b| CacheStats {
                hits: a.hits + b.hits,
                misses: a.misses + b.misses,
                bytes_fetched: a.bytes_fetched + b.bytes_fetched,
                bytes_from_cache: a.bytes_from_cache + b.bytes_from_cache,
                requests: a.requests + b.requests,
                retries: a.retries + b.retries,
                evictions: a.evictions + b.evictions,
                bytes_evicted: a.bytes_evicted + b.bytes_evicted,
                read_ahead: a.read_ahead + b.read_ahead,
            })
    }

    /// Tells each source which of its samples `positions` of `epoch` read (see
    /// `SampleSource::prefetch`): sources in an object store fetch them in the background.
    pub fn prefetch(&self, epoch: u64, positions: &[u64]) {
        let Ok(rows) = self.rows(epoch, positions) else {
            return;
        };
        for (source, part) in self.parts.iter().enumerate() {
            let indices: Vec<u64> = rows
                .iter()
                .filter(|row| row.source == source)
                .map(|row| row.index)
                .collect();
            if !indices.is_empty() {
                part.assembler.source().prefetch(&indices);
            }
        }
    }

    /// The rows at `positions` of `epoch`'s mixed order.
    fn rows(&self, epoch: u64, positions: &[u64]) -> Result<Vec<Row>> {
        let orders: Vec<(PlanConfig, Option<&[u64]>)> = self
            .parts
            .iter()
            .map(|part| (part.config, part.shard_sizes.as_deref()))
            .collect();
        Ok(mix_samples(&self.order, &orders, epoch, positions)?
            .into_iter()
            .map(|(source, pass, index)| Row {
                source,
                pass,
                index,
            })
            .collect())
    }

    /// Builds the batch at `positions` (mixed-order positions in batch order) into `buffer`,
    /// which must hold exactly [`Self::batch_bytes`] bytes. Returns the batch and each row's
    /// sample index in its source.
    pub fn assemble_into(
        &self,
        key: BatchKey,
        positions: &[u64],
        buffer: &mut [u8],
    ) -> Result<(AssembledBatch, Vec<u64>)> {
        let n = positions.len();
        let mut assembled = AssembledBatch::start(key, self.layout(n), n, buffer.len())?;
        let rows = self.rows(key.epoch, positions)?;
        assembled.sources = rows.iter().map(|row| row.source as i64).collect();
        if let JobPipeline::PackedText(first) = self.parts[0].assembler.pipeline() {
            let mut documents: Vec<Vec<u32>> = vec![Vec::new(); n];
            for (source, _, members) in groups(&rows) {
                let assembler = &self.parts[source].assembler;
                let JobPipeline::PackedText(packed) = assembler.pipeline() else {
                    return Err(Error::InvalidSpec(format!(
                        "mixed source {source} is not packed text like source 0"
                    )));
                };
                let indices: Vec<u64> = members.iter().map(|&r| rows[r].index).collect();
                let tokenised = assembler.documents(packed, &indices, &mut assembled)?;
                for (document, &row) in tokenised.into_iter().zip(&members) {
                    documents[row] = document;
                }
            }
            let pack = first.pack;
            self.parts[0]
                .assembler
                .pack(&pack, &documents, buffer, &mut assembled);
        } else {
            let mut labels = vec![0i64; n];
            let mut labelled = false;
            for (source, pass, members) in groups(&rows) {
                let assembler = &self.parts[source].assembler;
                let indices: Vec<u64> = members.iter().map(|&r| rows[r].index).collect();
                let part_key = BatchKey {
                    epoch: source_epoch(key.epoch, pass),
                    ..key
                };
                let mut part_buffer = vec![0u8; assembler.batch_bytes(indices.len())];
                let part = assembler.assemble_into(part_key, &indices, &mut part_buffer)?;
                let started = std::time::Instant::now();
                for (whole, piece) in assembled.tensors.iter().zip(&part.tensors) {
                    let row_bytes = piece.bytes.len() / indices.len();
                    for (i, &row) in members.iter().enumerate() {
                        let from = piece.bytes.start + i * row_bytes;
                        let to = whole.bytes.start + row * row_bytes;
                        buffer[to..to + row_bytes]
                            .copy_from_slice(&part_buffer[from..from + row_bytes]);
                    }
                }
                if !part.labels.is_empty() {
                    labelled = true;
                    for (&label, &row) in part.labels.iter().zip(&members) {
                        labels[row] = label;
                    }
                }
                assembled.timings.add(&part.timings);
                assembled.timings.assemble_ns += started.elapsed().as_nanos() as u64;
                assembled.bad_samples.extend(part.bad_samples);
            }
            if labelled {
                assembled.labels = labels;
            }
        }
        let indices = rows.iter().map(|row| row.index).collect();
        Ok((assembled, indices))
    }
}

/// The sample each of `positions` of `epoch` reads in a mix ordered by `order`, whose sources
/// have their own orders `orders` (planner inputs and shard sizes): (source, pass, sample index
/// in the source). The one rule for native and Python sources.
pub fn mix_samples(
    order: &MixOrder,
    orders: &[(PlanConfig, Option<&[u64]>)],
    epoch: u64,
    positions: &[u64],
) -> Result<Vec<(usize, u64, u64)>> {
    let mut rows: Vec<Row> = order
        .draws(epoch, positions)
        .iter()
        .map(|draw| {
            let len = order.lens()[draw.source];
            Row {
                source: draw.source,
                pass: draw.draw / len,
                // The position in the pass until the pass's order maps it below.
                index: draw.draw % len,
            }
        })
        .collect();
    for (source, pass, members) in groups(&rows) {
        let (config, shard_sizes) = orders
            .get(source)
            .copied()
            .ok_or_else(|| Error::InvalidSpec(format!("mixed source {source} has no order")))?;
        let pass_epoch = source_epoch(epoch, pass);
        let plan = match shard_sizes {
            Some(sizes) => EpochPlan::new_sharded(config, pass_epoch, sizes),
            None => EpochPlan::new(config, pass_epoch),
        }?;
        for row in members {
            rows[row].index = plan.sample_at(rows[row].index);
        }
    }
    Ok(rows
        .into_iter()
        .map(|row| (row.source, row.pass, row.index))
        .collect())
}

/// The rows of each (source, pass), in order of first appearance.
fn groups(rows: &[Row]) -> Vec<(usize, u64, Vec<usize>)> {
    let mut groups: Vec<(usize, u64, Vec<usize>)> = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        match groups
            .iter_mut()
            .find(|(source, pass, _)| *source == row.source && *pass == row.pass)
        {
            Some((_, _, members)) => members.push(i),
            None => groups.push((row.source, row.pass, vec![i])),
        }
    }
    groups
}
