//! Labels a dataset reads whole when it opens (Parquet files, Hugging Face folders, MDS
//! shards), checked there once for all of them: a negative label refuses the dataset (a class
//! index it cannot be; Hugging Face writes -1 for a missing one), labels past the class names
//! the files give are told once, class names made from numbers are capped
//! ([`numbered_class_names`]), and an image dataset without a label column is told that every
//! label is 0.

use std::path::Path;

use crate::error::{LabelError, Result};
use crate::sample_source::numbered_class_names;

/// What checking a dataset's labels found: its class names, and what its user should be told.
#[derive(Debug, Default)]
pub(crate) struct CheckedLabels {
    /// The names the files give, else `"0"` to the largest label.
    pub(crate) class_names: Vec<String>,
    /// Labels past the names the files give, in words.
    pub(crate) notice: Option<String>,
}

/// Checks `labels`, the whole column `column` of the dataset at `path` (`describe` names
/// sample `i` in messages), against `names`, the class names the files give.
pub(crate) fn check_labels(
    path: &Path,
    column: &str,
    labels: &[i64],
    names: Option<Vec<String>>,
    describe: impl Fn(u64) -> String,
) -> Result<CheckedLabels> {
    let negative = labels.iter().filter(|label| **label < 0).count();
    if let Some(first) = labels.iter().position(|label| *label < 0) {
        return Err(LabelError::NegativeLabels {
            path: path.to_path_buf(),
            column: column.to_string(),
            count: negative as u64,
            label: labels[first],
            first: describe(first as u64),
        }
        .into());
    }
    let max = labels.iter().copied().max();
    let Some(names) = names else {
        return Ok(CheckedLabels {
            class_names: numbered_class_names(path, max)?,
            notice: None,
        });
    };
    let past = max.filter(|max| usize::try_from(*max).map_or(true, |max| max >= names.len()));
    let notice = past.map(|max| {
        let count = labels
            .iter()
            .filter(|label| usize::try_from(**label).map_or(true, |l| l >= names.len()))
            .count();
        format!(
            "{}: {count} label(s) of column {column:?} go past the {} class names the files \
             give (up to {max}); the batches carry them as they are",
            path.display(),
            names.len()
        )
    });
    Ok(CheckedLabels {
        class_names: names,
        notice,
    })
}

/// Integer columns taken for the label, in this order, when no column is named, none is named
/// `label` and none is a `ClassLabel`: the names other tools write (MosaicML Streaming's
/// converters `y`, a `labels` or `target` column).
pub(crate) const LABEL_FALLBACK_NAMES: [&str; 5] = ["labels", "cls", "target", "targets", "y"];

/// Warns that `chosen` was taken as the label column among several that could be (`ClassLabel`
/// columns: CIFAR-100's `fine_label` and `coarse_label`), naming the others.
pub(crate) fn warn_of_label_choice(path: &Path, chosen: &str, candidates: &[&str]) {
    if candidates.len() > 1 {
        tracing::warn!(
            path = %path.display(),
            label_column = chosen,
            candidates = ?candidates,
            "several columns could be the label; the first is taken (label_column names another)"
        );
    }
}

/// The notice of an image dataset at `path` without a label column (`looked_for` says which
/// columns would have been one; `columns`, its columns).
pub(crate) fn no_label_column(path: &Path, looked_for: &str, columns: &[String]) -> String {
    format!(
        "{}: no label column ({looked_for}; its columns: {}): every label is 0; label_column \
         names one",
        path.display(),
        columns.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    fn names(names: &[&str]) -> Option<Vec<String>> {
        Some(names.iter().map(|name| name.to_string()).collect())
    }

    #[test]
    fn a_negative_label_refuses_the_dataset_naming_the_first_and_the_count() {
        let error = check_labels(Path::new("d"), "label", &[0, -1, 2, -1], None, |i| {
            format!("row {i}")
        })
        .unwrap_err();
        let message = error.to_string();
        assert!(matches!(
            error,
            Error::Labels(LabelError::NegativeLabels {
                count: 2,
                label: -1,
                ..
            })
        ));
        assert!(message.contains("row 1"), "{message}");
        assert!(message.contains("missing label"), "{message}");
    }

    #[test]
    fn labels_past_the_files_class_names_are_told_and_kept() {
        let checked = check_labels(
            Path::new("d"),
            "label",
            &[0, 7, 2, 9],
            names(&["a", "b", "c"]),
            |i| i.to_string(),
        )
        .unwrap();
        assert_eq!(checked.class_names, ["a", "b", "c"]);
        let notice = checked.notice.unwrap();
        assert!(
            notice.contains("2 label(s)") && notice.contains("up to 9"),
            "{notice}"
        );
        let within = check_labels(
            Path::new("d"),
            "label",
            &[0, 2],
            names(&["a", "b", "c"]),
            |i| i.to_string(),
        )
        .unwrap();
        assert!(within.notice.is_none());
    }

    #[test]
    fn without_names_the_classes_are_numbered_up_to_the_largest_label_within_the_cap() {
        let checked =
            check_labels(Path::new("d"), "label", &[0, 3], None, |i| i.to_string()).unwrap();
        assert_eq!(checked.class_names, ["0", "1", "2", "3"]);
        assert!(checked.notice.is_none());
        let error =
            check_labels(Path::new("d"), "label", &[1 << 23], None, |i| i.to_string()).unwrap_err();
        assert!(
            matches!(error, Error::Labels(LabelError::TooManyClasses { .. })),
            "{error}"
        );
    }
}
