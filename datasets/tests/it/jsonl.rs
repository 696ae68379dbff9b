//! JSONL documents: the line index over files, text and label fields, malformed lines.
#![allow(clippy::unwrap_used)]

use stoker_datasets::{looks_like_jsonl, Error, JsonlDocuments, SampleSource};

fn text(documents: &JsonlDocuments, index: u64) -> String {
    String::from_utf8(documents.read(index).unwrap()).unwrap()
}

#[test]
fn a_folder_of_files_is_indexed_in_name_order_skipping_blank_lines() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("b.jsonl"),
        "{\"text\": \"third\", \"label\": 2}\n\n{\"text\": \"fourth\\nline\", \"label\": 5}",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("a.jsonl"),
        "{\"text\": \"first\", \"label\": 0}\r\n   \n{\"text\": \"sécond\", \"label\": 1}\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not a document\n").unwrap();
    assert!(looks_like_jsonl(dir.path()));
    let documents = JsonlDocuments::open(dir.path(), "", "").unwrap();
    assert_eq!(documents.len(), 4);
    assert_eq!(
        (0..4).map(|i| text(&documents, i)).collect::<Vec<_>>(),
        ["first", "sécond", "third", "fourth\nline"]
    );
    assert_eq!(
        (0..4).map(|i| documents.label(i)).collect::<Vec<_>>(),
        [0, 1, 2, 5]
    );
    assert_eq!(documents.shard_sizes(), Some(vec![2, 2]));
    let b = dir.path().join("b.jsonl");
    assert_eq!(documents.describe(3), format!("{}:3", b.display()));
    assert!(matches!(
        documents.read(4),
        Err(Error::IndexOutOfRange { index: 4, len: 4 })
    ));
}

#[test]
fn other_fields_and_missing_labels() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.jsonl");
    std::fs::write(&path, "{\"body\": \"x\", \"y\": 7}\n{\"body\": \"z\"}\n").unwrap();
    let plain = JsonlDocuments::open(&path, "body", "").unwrap();
    assert_eq!(plain.label_field(), None);
    assert_eq!(plain.label(0), -1);
    assert_eq!(text(&plain, 1), "z");
    let labelled = JsonlDocuments::open(&path, "body", "y").unwrap();
    assert_eq!((labelled.label(0), labelled.label(1)), (7, -1));
}

#[test]
fn malformed_lines_are_bad_samples_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.jsonl");
    std::fs::write(
        &path,
        concat!(
            "{\"text\": \"fine\"}\n",
            "{\"text\": \"cut short\n",
            "[1, 2]\n",
            "{\"title\": \"no text\"}\n",
            "{\"text\": 42}\n",
            "{\"text\": \"also fine\"}\n",
        ),
    )
    .unwrap();
    let documents = JsonlDocuments::open(&path, "", "").unwrap();
    assert_eq!(documents.len(), 6);
    assert_eq!(text(&documents, 0), "fine");
    assert_eq!(text(&documents, 5), "also fine");
    for (index, line, needle) in [
        (1, 2, "invalid JSON"),
        (2, 3, "expected a JSON object, found an array"),
        (3, 4, "no field \"text\""),
        (4, 5, "holds a number, not a string"),
    ] {
        let error = documents.read(index).unwrap_err();
        let message = error.to_string();
        assert!(
            matches!(error, Error::MalformedRecord { line: l, .. } if l == line),
            "{message}"
        );
        assert!(
            message.starts_with(&format!("{}:{line}: ", path.display())),
            "{message}"
        );
        assert!(message.contains(needle), "{message}");
    }
    let report = documents.report();
    assert_eq!((report.documents, report.malformed), (6, 4));
}

#[test]
fn empty_inputs_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        JsonlDocuments::open(dir.path(), "", ""),
        Err(Error::NoJsonlFiles(_))
    ));
    let blank = dir.path().join("blank.jsonl");
    std::fs::write(&blank, "\n  \n").unwrap();
    assert!(matches!(
        JsonlDocuments::open(&blank, "", ""),
        Err(Error::EmptyJsonl(_))
    ));
    std::fs::write(&blank, "").unwrap();
    assert!(matches!(
        JsonlDocuments::open(&blank, "", ""),
        Err(Error::EmptyJsonl(_))
    ));
    assert!(matches!(
        JsonlDocuments::open(&dir.path().join("nope.jsonl"), "", ""),
        Err(Error::RootNotFound(_))
    ));
}
