//! What a Parquet dataset is opened with (which columns, how much decoded data it keeps) and
//! what its summary reports.

/// Which columns a [`ParquetDataset`](super::ParquetDataset) reads, and how much decoded data it keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParquetOptions {
    /// The column of encoded images. `None`: the first of `image`, `jpg`, `png` present, and
    /// failing those the text column.
    pub image_column: Option<String>,
    /// The text column, read when no image column is named or found. `None`: `text`.
    pub text_column: Option<String>,
    /// The integer label column. `None`: `label` when present, else every label is 0 and the
    /// dataset has no class names.
    pub label_column: Option<String>,
    /// Bytes of decoded row groups kept for the rows read after them (the latest group is
    /// kept whatever its size).
    pub cache_bytes: usize,
}

impl Default for ParquetOptions {
    /// Columns picked by name; 512 MB of decoded row groups, room for a shuffle window of a
    /// dozen 256-image groups of ImageNet-sized JPEGs.
    fn default() -> Self {
        ParquetOptions {
            image_column: None,
            text_column: None,
            label_column: None,
            cache_bytes: 512_000_000,
        }
    }
}

/// What the sample column holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParquetSampleKind {
    /// Encoded images (bytes), read as they are.
    Image,
    /// UTF-8 text, read as its bytes.
    Text,
    /// No sample column: the files hold numeric columns only, read by SelectColumns.
    Numeric,
}

/// A column of a Parquet dataset's schema, for reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParquetColumnInfo {
    /// The column name.
    pub name: String,
    /// Its Arrow type, in words.
    pub data_type: String,
}

/// Facts about an opened dataset of Arrow rows (`stoker inspect`): Parquet files
/// ([`ParquetSummary`]) or a Hugging Face folder ([`HfSummary`](crate::HfSummary)); `C`
/// describes a column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnarSummary<C> {
    /// Number of files (Parquet files, or `.arrow` shards).
    pub files: usize,
    /// Number of rows (samples).
    pub rows: u64,
    /// Number of chunks rows are decoded in, over all files: row groups, or record batches.
    pub chunks: usize,
    /// The columns, in schema order (of the first file, for Parquet).
    pub columns: Vec<C>,
    /// The column samples are read from; `None` for a numeric-only Parquet set.
    pub sample_column: Option<String>,
    /// What it holds.
    pub sample_kind: ParquetSampleKind,
    /// The label column, if any.
    pub label_column: Option<String>,
    /// Total size of the files in bytes.
    pub file_bytes: u64,
}

/// Facts about an opened [`ParquetDataset`](super::ParquetDataset); its chunks are row groups.
pub type ParquetSummary = ColumnarSummary<ParquetColumnInfo>;
