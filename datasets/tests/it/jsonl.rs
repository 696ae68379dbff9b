//! JSONL documents: the line index over files, text and label fields, malformed lines.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use stoker_datasets::{looks_like_jsonl, Error, JsonlDocuments, ObjectCacheOptions, SampleSource};

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

/// A folder source reads the files directly in it; JSONL files in its subfolders are told of,
/// with a pattern that reads them, not left out unsaid.
#[test]
fn jsonl_files_in_subfolders_are_told_of() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.jsonl"), "{\"text\": \"top\"}\n").unwrap();
    let documents = JsonlDocuments::open(dir.path(), "", "").unwrap();
    assert!(documents.notices().is_empty());
    std::fs::create_dir_all(dir.path().join("sub/deeper")).unwrap();
    std::fs::create_dir_all(dir.path().join(".cache")).unwrap();
    std::fs::write(dir.path().join("sub/b.jsonl"), "{\"text\": \"b\"}\n").unwrap();
    std::fs::write(dir.path().join("sub/deeper/c.jsonl"), "{\"text\": \"c\"}\n").unwrap();
    std::fs::write(dir.path().join(".cache/d.jsonl"), "{\"text\": \"d\"}\n").unwrap();
    let documents = JsonlDocuments::open(dir.path(), "", "").unwrap();
    assert_eq!(documents.len(), 1);
    let notices = documents.notices();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert!(
        notices[0].starts_with("2 JSONL file(s) in subfolders")
            && notices[0].contains("sub/b.jsonl the first")
            && notices[0].contains("/**/*.jsonl"),
        "{notices:?}"
    );
    // One file named: nothing to tell.
    let one = JsonlDocuments::open(&dir.path().join("a.jsonl"), "", "").unwrap();
    assert!(one.notices().is_empty());
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
    // A label field misnamed (or holding no integer) is refused at open, naming the file and
    // the fields there: before, every label read -1.
    for misnamed in ["labels", "body"] {
        let refused = JsonlDocuments::open(&path, "body", misnamed)
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("docs.jsonl:1")
                && refused.contains(&format!("label field {misnamed:?}"))
                && refused.contains("\"y\""),
            "{refused}"
        );
    }
}

/// Lines as Python's `json.dumps` writes them (a float that is not finite as `NaN` or
/// `Infinity`, a `str` holding a lone surrogate as its escape), after a byte-order mark:
/// documents, read as `json.loads` reads them back, not bad samples replaced by a neighbour.
#[test]
fn what_pythons_json_writes_is_read_as_it_reads_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.jsonl");
    std::fs::write(
        &path,
        concat!(
            "\u{FEFF}{\"text\": \"first\", \"label\": 1}\n",
            "{\"text\": \"second\", \"score\": NaN, \"label\": 2}\n",
            "{\"meta\": [Infinity, -Infinity], \"text\": \"third\", \"label\": 3}\n",
            "{\"text\": \"lone \\ud800 half\", \"label\": 4}\n",
            "{\"text\": NaN}\n",
        ),
    )
    .unwrap();
    let documents = JsonlDocuments::open(&path, "", "").unwrap();
    assert_eq!(documents.label_field(), Some("label"));
    assert_eq!(
        (0..4).map(|i| text(&documents, i)).collect::<Vec<_>>(),
        ["first", "second", "third", "lone \u{FFFD} half"]
    );
    assert_eq!(
        (0..4).map(|i| documents.label(i)).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    // A text that is not a number stays a bad sample.
    let message = documents.read(4).unwrap_err().to_string();
    assert!(message.contains("holds null, not a string"), "{message}");
    assert_eq!(documents.report().malformed, 1);
}

/// A line holding a byte-order mark and nothing else is blank, as a reader of the text sees
/// it (also with the mark across the index's read chunks): before, it was a document, a bad
/// sample replaced by a neighbour, which then trained twice. A line cut short inside a mark,
/// or with one after its whitespace, stays a bad document.
#[test]
fn a_line_of_a_byte_order_mark_alone_is_blank() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.jsonl");
    std::fs::write(&path, "\u{FEFF}\r\n{\"text\": \"only\"}\n\u{FEFF}  \n").unwrap();
    let documents = JsonlDocuments::open(&path, "", "").unwrap();
    assert_eq!(documents.len(), 1);
    assert_eq!(text(&documents, 0), "only");
    // The mark's bytes on both sides of the index's 1 MiB read.
    let first = format!("{{\"text\": \"a\"}}{}\n", " ".repeat((1 << 20) - 15));
    assert_eq!(first.len(), (1 << 20) - 1);
    std::fs::write(&path, format!("{first}\u{FEFF}\n{{\"text\": \"b\"}}\n")).unwrap();
    let documents = JsonlDocuments::open(&path, "", "").unwrap();
    assert_eq!(documents.len(), 2);
    assert_eq!(text(&documents, 1), "b");
    let mut bytes = b"\xEF\xBB\n  \xEF\xBB\xBF\n\xEF\xBB\r\n\xEF \n".to_vec();
    bytes.extend_from_slice(b"{\"text\": \"c\"}\n");
    std::fs::write(&path, bytes).unwrap();
    let documents = JsonlDocuments::open(&path, "", "").unwrap();
    assert_eq!(documents.len(), 5);
    for bad in 0..4 {
        assert!(documents.read(bad).is_err(), "line {}", bad + 1);
    }
    assert_eq!(text(&documents, 4), "c");
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

/// Writes `text` gzip-compressed (two members, as `cat a.gz b.gz` makes) or zstd-compressed,
/// by the name's ending.
pub(crate) fn write_compressed(path: &Path, text: &str) {
    use std::io::Write;
    let out = std::fs::File::create(path).unwrap();
    if path.to_string_lossy().ends_with(".gz") {
        let (head, tail) = text.as_bytes().split_at(text.len() / 2);
        for part in [head, tail] {
            let mut encoder = flate2::write::GzEncoder::new(
                out.try_clone().unwrap(),
                flate2::Compression::default(),
            );
            encoder.write_all(part).unwrap();
            encoder.finish().unwrap();
        }
    } else {
        zstd::stream::copy_encode(text.as_bytes(), out, 3).unwrap();
    }
}

fn open_cached(path: &Path, cache: &Path) -> Result<JsonlDocuments, Error> {
    let options = || Ok(ObjectCacheOptions::new(cache));
    JsonlDocuments::open_with_cache(path, "", "", &options)
}

const DOCUMENTS: &str = "{\"text\": \"one\", \"label\": 1}\n\n{\"text\": \"two\", \"label\": 2}\n\
                         {\"text\": \"three\"}\n[1]\n{\"text\": \"five\", \"label\": 5}\n";

#[test]
fn gzip_and_zstd_files_read_like_the_plain_file() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let plain = dir.path().join("docs.jsonl");
    std::fs::write(&plain, DOCUMENTS).unwrap();
    let expected = JsonlDocuments::open(&plain, "", "").unwrap();
    for name in ["docs.jsonl.gz", "docs.jsonl.zst", "DOCS.JSONL.ZSTD"] {
        let path = dir.path().join(name);
        write_compressed(&path, DOCUMENTS);
        assert!(looks_like_jsonl(&path), "{name}");
        let documents = open_cached(&path, &cache).unwrap();
        assert_eq!(documents.len(), expected.len(), "{name}");
        for index in 0..expected.len() {
            assert_eq!(
                documents.read(index).ok(),
                expected.read(index).ok(),
                "{name} #{index}"
            );
            assert_eq!(documents.label(index), expected.label(index));
        }
        // Errors and descriptions name the compressed file the user gave.
        let message = documents.read(3).unwrap_err().to_string();
        assert!(
            message.starts_with(&format!("{}:5: ", path.display())),
            "{message}"
        );
        assert_eq!(documents.describe(0), format!("{}:1", path.display()));
    }

    // A folder mixes plain and compressed files, in name order.
    let folder = dir.path().join("folder");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("b.jsonl"), "{\"text\": \"b\"}\n").unwrap();
    write_compressed(&folder.join("a.jsonl.gz"), "{\"text\": \"a\"}\n");
    write_compressed(&folder.join("c.jsonl.zst"), "{\"text\": \"c\"}\n");
    std::fs::write(folder.join("d.json.gz"), "not jsonl").unwrap();
    assert!(looks_like_jsonl(&folder));
    let documents = open_cached(&folder, &cache).unwrap();
    assert_eq!(
        (0..3).map(|i| text(&documents, i)).collect::<Vec<_>>(),
        ["a", "b", "c"]
    );
}

#[test]
fn a_compressed_file_is_decompressed_once_per_version() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let path = dir.path().join("docs.jsonl.gz");
    write_compressed(&path, DOCUMENTS);
    let first = open_cached(&path, &cache).unwrap();
    let copy = std::fs::read_dir(
        cache.join("local").join(
            dir.path()
                .canonicalize()
                .unwrap()
                .strip_prefix("/")
                .unwrap(),
        ),
    )
    .unwrap()
    .flatten()
    .map(|entry| entry.path())
    .find(|path| {
        // The copy (named by the file's version), not its lock or metadata.
        let name = path.to_string_lossy();
        name.contains(".decompressed-") && !name.contains(".stoker-")
    })
    .unwrap();
    let made = std::fs::metadata(&copy).unwrap().modified().unwrap();
    drop(first);
    let again = open_cached(&path, &cache).unwrap();
    assert_eq!(again.len(), 5);
    assert_eq!(
        std::fs::metadata(&copy).unwrap().modified().unwrap(),
        made,
        "the copy is reused"
    );
    drop(again);
    // A new version of the file (other size) is decompressed again.
    write_compressed(&path, "{\"text\": \"only\"}\n");
    let changed = open_cached(&path, &cache).unwrap();
    assert_eq!(changed.len(), 1);
    assert_eq!(text(&changed, 0), "only");
}

#[test]
fn damaged_or_oversized_compressed_files_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    for name in ["cut.jsonl.gz", "cut.jsonl.zst"] {
        let path = dir.path().join(name);
        write_compressed(&path, &DOCUMENTS.repeat(50));
        let bytes = std::fs::read(&path).unwrap();
        // Inside the last gzip member (cutting between members leaves a valid file).
        std::fs::write(&path, &bytes[..bytes.len() * 2 / 3]).unwrap();
        let error = open_cached(&path, &cache).unwrap_err();
        assert!(matches!(error, Error::Decompress { .. }), "{error:?}");
        assert!(error.to_string().contains(name), "{error}");
    }
    let garbage = dir.path().join("garbage.jsonl.gz");
    std::fs::write(&garbage, b"plain text, not gzip").unwrap();
    let error = open_cached(&garbage, &cache).unwrap_err();
    assert!(error.to_string().contains("garbage.jsonl.gz"), "{error}");

    // A bomb: 10 MB of zeros is refused against a 1 MB cap, leaving no copy behind.
    let bomb = dir.path().join("bomb.jsonl.zst");
    zstd::stream::copy_encode(
        vec![b'\n'; 10 << 20].as_slice(),
        std::fs::File::create(&bomb).unwrap(),
        19,
    )
    .unwrap();
    let capped = || {
        let mut options = ObjectCacheOptions::new(&cache);
        options.max_bytes = 1 << 20;
        Ok(options)
    };
    let error = JsonlDocuments::open_with_cache(&bomb, "", "", &capped).unwrap_err();
    assert!(error.to_string().contains("cache cap"), "{error}");
}

/// A line of more than 2 GiB is a bad sample naming it, never read (a document that size,
/// parsed and tokenised, took several times its size per decode thread). Sparse: no disk used.
#[test]
fn a_line_past_the_size_bound_is_refused_unread() {
    use std::io::{Seek, SeekFrom, Write};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.jsonl");
    let mut file = std::fs::File::create(&path).unwrap();
    file.write_all(b"{\"text\": \"small\"}\n").unwrap();
    let end = file.stream_position().unwrap() + stoker_datasets::MAX_SAMPLE_BYTES + 1;
    file.seek(SeekFrom::Start(end)).unwrap();
    file.write_all(b"\n{\"text\": \"after\"}\n").unwrap();
    drop(file);
    let documents = JsonlDocuments::open(&path, "", "").unwrap();
    assert_eq!(documents.len(), 3);
    assert_eq!(text(&documents, 0), "small");
    let error = documents.read(1).unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(error, Error::SampleTooLarge { .. }) && message.contains("docs.jsonl:2"),
        "{message}"
    );
    assert_eq!(text(&documents, 2), "after");
}
