//! The folder names a split goes by, shared by the local split layouts (`naming/`) and image
//! folders laid out by split in an object store (`image_folder/remote.rs`).

/// The folder names a split goes by on the hub (the keywords `datasets` recognises).
const SPLIT_FOLDER_NAMES: [&str; 10] = [
    "train",
    "training",
    "validation",
    "valid",
    "val",
    "dev",
    "test",
    "testing",
    "eval",
    "evaluation",
];

/// Whether a folder named `name` is a split's by its name (`train`, `val`, `test`...).
pub(crate) fn is_split_folder_name(name: &str) -> bool {
    SPLIT_FOLDER_NAMES
        .iter()
        .any(|split| split.eq_ignore_ascii_case(name))
}
