//! Labels a dataset cannot be read with: one variant of the crate's [`super::Error`],
//! `Error::Labels`.

use std::path::PathBuf;

/// Labels that refuse a dataset.
#[derive(Debug, thiserror::Error)]
pub enum LabelError {
    /// Labels without class names that go too far to name the classes by number: far more
    /// likely a damaged file than a real class count.
    #[error(
        "labels under {path} go up to {max_label}, more classes than are named by number \
         (at most {limit}); give the class names (classes.txt beside tar shards, the \
         stoker.class_names metadata in Parquet)"
    )]
    TooManyClasses {
        /// The dataset.
        path: PathBuf,
        /// The largest label.
        max_label: i64,
        /// [`crate::MAX_NUMBERED_CLASSES`].
        limit: u64,
    },

    /// Negative labels in a dataset that reads its labels whole at open: a class index cannot
    /// be negative (Hugging Face writes -1 for a missing label).
    #[error(
        "{count} label(s) of column {column:?} under {path} are negative, the first {label} at \
         {first}: labels are class indices from 0 (Hugging Face writes -1 for a missing label, \
         as in many test splits); leave out those rows, or the label column, before saving"
    )]
    NegativeLabels {
        /// The dataset.
        path: PathBuf,
        /// The label column.
        column: String,
        /// How many labels are negative.
        count: u64,
        /// The first of them.
        label: i64,
        /// The sample it labels, in words.
        first: String,
    },
}
