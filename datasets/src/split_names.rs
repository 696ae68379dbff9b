//! The names a split goes by, shared by the local split layouts (`naming/`), the objects of an
//! object store (`naming/remote.rs`) and image folders laid out by split in an object store
//! (`image_folder/remote.rs`): a folder's whole name, or a keyword inside a file's name.

/// The names a split goes by on the hub (the keywords `datasets` recognises).
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

/// Whether `byte` may stand beside a split's keyword in a file name: the hub's separators
/// (`-`, `.`, `_`, space) and digits.
fn is_keyword_separator(byte: u8) -> bool {
    matches!(byte, b'-' | b'.' | b'_' | b' ') || byte.is_ascii_digit()
}

/// The split keyword a file's name holds as a word of its own (any case): at the start of the
/// name or after a separator, and followed by one (`train.jsonl`, `imagenet-val-0003.tar`,
/// `my_test_set.parquet`; not `pretrain.jsonl` nor `devices.jsonl`), lowercased; the first
/// from the left when several do. `None` when none does.
pub(crate) fn split_keyword_in_file_name(name: &str) -> Option<&'static str> {
    let bytes = name.as_bytes();
    (0..bytes.len())
        .filter(|&at| at == 0 || is_keyword_separator(bytes[at - 1]))
        .find_map(|at| {
            SPLIT_FOLDER_NAMES.iter().copied().find(|keyword| {
                let end = at + keyword.len();
                end < bytes.len()
                    && bytes[at..end].eq_ignore_ascii_case(keyword.as_bytes())
                    && is_keyword_separator(bytes[end])
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_keyword_counts_in_a_file_name_as_a_word_of_its_own() {
        for (name, split) in [
            ("train.jsonl", Some("train")),
            ("test.parquet", Some("test")),
            ("Validation.jsonl.zst", Some("validation")),
            ("imagenet1k-train-0000.tar", Some("train")),
            ("imagenet1k-validation-00.tar", Some("validation")),
            ("c4-train.00000-of-01024.jsonl.gz", Some("train")),
            ("my_test_set.parquet", Some("test")),
            ("2024dev 3.jsonl", Some("dev")),
            ("training.parquet", Some("training")),
            ("val-test.tar", Some("val")),
            ("pretrain.jsonl", None),
            ("devices.jsonl", None),
            ("testing", None),
            ("train", None),
            ("shard-000000.tar", None),
            ("data-00000-of-00002.arrow", None),
            ("contest-1.tar", None),
            ("", None),
        ] {
            assert_eq!(split_keyword_in_file_name(name), split, "{name}");
        }
    }
}
