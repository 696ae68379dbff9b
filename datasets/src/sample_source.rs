//! The interface every dataset format offers to the pipeline: samples addressed by a dense index.

use crate::cache_stats::CacheStats;
use crate::error::Result;
use crate::token_dtype::TokenDtype;

/// The shape of a token-window source's samples: each is `seq_len + 1` tokens of `dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenWindowShape {
    /// Element type of the tokens.
    pub dtype: TokenDtype,
    /// Tokens per window minus one.
    pub seq_len: u32,
}

/// A dataset of (encoded bytes, label) samples addressed by a dense index `0..len`.
///
/// Implementations are shared between decode threads, so they are `Send + Sync` and reading
/// takes `&self`.
pub trait SampleSource: Send + Sync {
    /// Number of samples.
    fn len(&self) -> u64;

    /// Whether the dataset holds no sample.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The class label of sample `index`.
    ///
    /// # Panics
    ///
    /// May panic when `index >= len()`, like slice indexing: indices come from the epoch
    /// planner, which never goes past `len()`.
    fn label(&self, index: u64) -> i64;

    /// Human-readable location of the sample (its file path) for logs and errors.
    ///
    /// Never fails: an index out of range is described as such.
    fn describe(&self, index: u64) -> String;

    /// What a dataset's fingerprint reads of sample `index` (the fingerprint a saved loader
    /// state carries): its location ([`Self::describe`]) and its label; the fingerprint
    /// leaves out the folder all the dataset's locations share. Names only what the index
    /// holds, with no read: a source whose labels live in the samples' own bytes leaves them
    /// out.
    fn fingerprint_key(&self, index: u64) -> String {
        format!("{}#{}", self.describe(index), self.label(index))
    }

    /// Reads the sample's encoded bytes.
    ///
    /// A missing or unreadable file gives an error naming its path; an index out of range gives
    /// [`Error::IndexOutOfRange`](crate::Error::IndexOutOfRange).
    fn read(&self, index: u64) -> Result<Vec<u8>>;

    /// Reads the sample's bytes into `dest`, which must be exactly as long as the sample
    /// (fixed-size samples: token windows). The default reads and copies; a source that can
    /// read straight into `dest` (one copy fewer) overrides it.
    fn read_into(&self, index: u64, dest: &mut [u8]) -> Result<()> {
        let bytes = self.read(index)?;
        if bytes.len() != dest.len() {
            return Err(crate::Error::InvalidArgument(format!(
                "sample {index} holds {} bytes, not the {} asked for",
                bytes.len(),
                dest.len()
            )));
        }
        dest.copy_from_slice(&bytes);
        Ok(())
    }

    /// Class names, indexed by label.
    fn class_names(&self) -> &[String];

    /// Samples per shard, in shard order, for sources made of shards whose samples are
    /// contiguous per shard in index order (shard 0 holds `0..sizes[0]`, and so on); the sizes
    /// sum to `len()`. `None` (the default) for sources without shards. The epoch planner uses
    /// it to keep reads mostly sequential.
    fn shard_sizes(&self) -> Option<Vec<u64>> {
        None
    }

    /// For sources of fixed token windows (token files): their dtype and length, so a pipeline
    /// can size its tensor. `None` (the default) for every other source.
    fn token_windows(&self) -> Option<TokenWindowShape> {
        None
    }

    /// Whether [`SampleSource::read`] gives samples' bytes. `false` for a numeric-only Parquet
    /// dataset, whose rows only [`SampleSource::numeric_columns`] reads; `true` (the default)
    /// for every other source.
    fn has_sample_bytes(&self) -> bool {
        true
    }

    /// Typed reads of named numeric columns, for sources that have them (Parquet); `None`
    /// (the default) for sources of encoded samples only.
    fn numeric_columns(&self) -> Option<&dyn NumericColumns> {
        None
    }

    /// A hint that `indices` are read soon (the epoch plan's next batch): a source read from
    /// an object store starts bringing them into its cache in the background, a bounded
    /// number of hints ahead; the default, for local sources, does nothing. Never blocks and
    /// never fails: a sample whose read-ahead failed is fetched when it is read.
    fn prefetch(&self, indices: &[u64]) {
        let _ = indices;
    }

    /// The token offset of each document's first token, ascending, for token sources that know
    /// their documents (a Megatron corpus opened with them); `None` by default.
    fn document_starts(&self) -> Option<&[u64]> {
        None
    }

    /// What opening the source found that its user should be told once, in words (an image
    /// folder's image files of formats it does not take); none by default. The loader hands
    /// them to its caller (Python logs each as a warning).
    fn notices(&self) -> Vec<String> {
        Vec::new()
    }

    /// What the local cache tier did for this source (hits, misses, bytes fetched), for
    /// sources read from an object store; `None` (the default) for local ones.
    fn cache_stats(&self) -> Option<CacheStats> {
        None
    }
}

/// The element type a numeric column reads as without conversion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumericKind {
    /// Integer columns (any width, signed or not), read as `i64`.
    Integer,
    /// Floating-point columns, read as `f32`.
    Float,
}

/// Named numeric columns read as tensors for a list of samples (the SelectColumns op).
pub trait NumericColumns {
    /// Whether column `name` holds integers or floats; an error when it is missing or not
    /// numeric.
    fn numeric_kind(&self, name: &str) -> Result<NumericKind>;

    /// Appends the values of `columns` for each of `indices` to `out` as `f32`, row-major (a
    /// `[indices.len(), columns.len()]` tensor). Integer and floating-point columns convert.
    fn read_f32_columns(&self, columns: &[&str], indices: &[u64], out: &mut Vec<f32>)
        -> Result<()>;

    /// Like [`NumericColumns::read_f32_columns`] as `i64`, for integer columns only.
    fn read_i64_columns(&self, columns: &[&str], indices: &[u64], out: &mut Vec<i64>)
        -> Result<()>;
}

/// Most classes a dataset with labels but no class names gets, named `"0"`, `"1"`, ...: a label
/// past it is far more likely damage than a class, and naming it would take gigabytes (a
/// `.cls` member or a Parquet label of 10^18 once did).
pub const MAX_NUMBERED_CLASSES: u64 = 1 << 22;

/// The class names `"0"` to `max_label` (none without labels), or an error naming `path`
/// when that is more than [`MAX_NUMBERED_CLASSES`].
pub(crate) fn numbered_class_names(
    path: &std::path::Path,
    max_label: Option<i64>,
) -> Result<Vec<String>> {
    let Some(max_label) = max_label else {
        return Ok(Vec::new());
    };
    let count = u64::try_from(max_label.saturating_add(1)).unwrap_or(0);
    if count > MAX_NUMBERED_CLASSES {
        return Err(crate::error::LabelError::TooManyClasses {
            path: path.to_path_buf(),
            max_label,
            limit: MAX_NUMBERED_CLASSES,
        }
        .into());
    }
    Ok((0..count).map(|label| label.to_string()).collect())
}
