//! The bodies of the fuzz targets for this crate's parsers of untrusted bytes, as plain functions.
//!
//! `fuzz/` (libFuzzer, see its README) and the corpus replay in `tests/it/fuzz_replay.rs` call
//! the same function, so every seed and every crash input kept as a regression case is replayed
//! by the ordinary test run, without an instrumented build. A body returns normally whatever the
//! input; a panic (or an abort, a hang, an out-of-memory) is a bug in the parser.
//!
//! The formats are opened through their public entry points, which take paths: a body writes
//! the input into `scratch` (a folder the caller owns; emptied first) and opens that, so the
//! index caches, memory maps and file handles take the same paths as in production. The
//! ranged-read Parquet body serves the file's ranges from memory instead, as the object
//! cache serves an object's.
//! Errors from the parsers are the expected outcome for most inputs and are dropped; only an
//! error of the scratch folder itself is returned.

use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::sample_source::SampleSource;
use crate::storage::ByteRanges;
use crate::{
    HfDataset, JsonlDocuments, ParquetDataset, ParquetOptions, TarShards, TokenDtype, TokenFile,
};

/// For a libFuzzer target's `init`: keeps the panic hook libFuzzer installed (report, then
/// abort) for every panic but those inside a decoder this crate contains (`without_panics`:
/// arrow's and parquet's on untrusted bytes), which unwind to the error they become, as in
/// production. The bodies below then fail only on a panic that would reach the caller.
pub fn let_contained_panics_unwind() {
    let abort = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !crate::decoder_panics::panic_is_contained() {
            abort(info);
        }
    }));
}

/// Samples read back per input at most: enough to reach every code path, bounded in time.
const SAMPLES_READ: u64 = 64;

/// Decoded row groups kept by the Parquet target (the default of 512 MB would let one input
/// hold that much).
const PARQUET_CACHE_BYTES: usize = 16 << 20;

/// Empties `scratch` (creating it when missing) and writes `data` to `scratch/name`.
fn write_input(scratch: &Path, name: &str, data: &[u8]) -> io::Result<PathBuf> {
    match std::fs::remove_dir_all(scratch) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    std::fs::create_dir_all(scratch)?;
    let path = scratch.join(name);
    std::fs::write(&path, data)?;
    Ok(path)
}

/// Reads the first samples of `source`, their labels and descriptions.
fn read_some(source: &dyn SampleSource) {
    for index in 0..source.len().min(SAMPLES_READ) {
        let _ = source.read(index);
        let _ = source.label(index);
        let _ = source.describe(index);
    }
    // Past the end must be an error, not a panic.
    let _ = source.read(source.len());
    let _ = source.class_names();
    let _ = source.shard_sizes();
}

/// A tar shard: its header walk (the sample index), the index cache written beside it and
/// read back on a second open, and the samples it indexed.
pub fn tar_shards(data: &[u8], scratch: &Path) -> io::Result<()> {
    let shard = write_input(scratch, "shard.tar", data)?;
    for _cold_then_cached in 0..2 {
        if let Ok(shards) = TarShards::open_with_cache_dir(&shard, None) {
            read_some(&shards);
        }
    }
    Ok(())
}

/// A Parquet file: footer and schema (open), the label column, the first rows of the sample
/// column, and every numeric column read as `f32` and `i64`.
pub fn parquet(data: &[u8], scratch: &Path) -> io::Result<()> {
    let file = write_input(scratch, "data.parquet", data)?;
    let options = ParquetOptions {
        cache_bytes: PARQUET_CACHE_BYTES,
        ..ParquetOptions::default()
    };
    let Ok(dataset) = ParquetDataset::open(&file, &options) else {
        return Ok(());
    };
    read_some(&dataset);
    let summary = dataset.summary();
    let rows: Vec<u64> = (0..dataset.len().min(SAMPLES_READ)).collect();
    for column in &summary.columns {
        let _ = dataset.numeric_kind(&column.name);
        let _ = dataset.read_f32_columns(&[&column.name], &rows, &mut Vec::new());
        let _ = dataset.read_i64_columns(&[&column.name], &rows, &mut Vec::new());
    }
    Ok(())
}

/// A Parquet file read as an object in a store is: the footer found from a tail read (and a
/// second read when the footer is longer), then row groups fetched as the column-chunk ranges
/// the footer names, with every read served from `data` in memory. Checked: no range asked for
/// lies past the file's end or runs backwards. Then samples, labels and numeric columns are
/// read as in [`parquet`].
pub fn parquet_ranged(data: &[u8]) {
    let bytes: Arc<dyn ByteRanges> = Arc::new(InMemory(data.to_vec()));
    let options = ParquetOptions {
        cache_bytes: PARQUET_CACHE_BYTES,
        ..ParquetOptions::default()
    };
    let Ok(dataset) = ParquetDataset::open_ranged(Path::new("fuzz.parquet"), bytes, &options)
    else {
        return;
    };
    read_some(&dataset);
    let summary = dataset.summary();
    let rows: Vec<u64> = (0..dataset.len().min(SAMPLES_READ)).collect();
    for column in &summary.columns {
        let _ = dataset.read_f32_columns(&[&column.name], &rows, &mut Vec::new());
        let _ = dataset.read_i64_columns(&[&column.name], &rows, &mut Vec::new());
    }
}

/// A file's bytes in memory, read by ranges.
struct InMemory(Vec<u8>);

impl ByteRanges for InMemory {
    fn size(&self) -> u64 {
        self.0.len() as u64
    }

    fn read_ranges(&self, ranges: &[Range<u64>]) -> crate::Result<Vec<Vec<u8>>> {
        Ok(ranges
            .iter()
            .map(|range| {
                assert!(
                    range.start <= range.end && range.end <= self.size(),
                    "asked for bytes {range:?} of a {}-byte file",
                    self.size()
                );
                self.0[range.start as usize..range.end as usize].to_vec()
            })
            .collect())
    }

    fn listed(&self) -> Option<&object_store::ObjectMeta> {
        None
    }
}

/// A token file. The first three bytes choose how it is opened (bit 0 of the first: `uint32`
/// rather than `uint16`; the next two, little-endian, plus one: `seq_len`); the rest is the
/// file. Checks the sizes `open` promises against what the windows hold.
pub fn token_file(data: &[u8], scratch: &Path) -> io::Result<()> {
    let (dtype, seq_len, body) = match data {
        [flags, low, high, body @ ..] => {
            let dtype = if flags & 1 == 1 {
                TokenDtype::Uint32
            } else {
                TokenDtype::Uint16
            };
            (
                dtype,
                u32::from(u16::from_le_bytes([*low, *high])) + 1,
                body,
            )
        }
        _ => return Ok(()),
    };
    let file = write_input(scratch, "tokens.bin", body)?;
    let Ok(tokens) = TokenFile::open(&file, dtype, seq_len) else {
        return Ok(());
    };
    assert_eq!(tokens.tokens() * dtype.size() as u64, body.len() as u64);
    for index in 0..tokens.len().min(SAMPLES_READ) {
        let window = tokens.read(index).map(|window| window.len());
        assert_eq!(window.ok(), Some(tokens.window_bytes()));
    }
    assert!(tokens.read(tokens.len()).is_err());
    // The file does not change under the target: its report must read.
    match tokens.report() {
        Ok(report) => assert_eq!(report.windows, tokens.len()),
        Err(error) => panic!("the report of an opened token file failed: {error}"),
    }
    Ok(())
}

/// A JSONL file: the line index built at open, the default label detection, the first
/// documents' text, and the report.
pub fn jsonl(data: &[u8], scratch: &Path) -> io::Result<()> {
    let file = write_input(scratch, "docs.jsonl", data)?;
    for (text_field, label_field) in [("", ""), ("body", "y")] {
        if let Ok(documents) = JsonlDocuments::open(&file, text_field, label_field) {
            read_some(&documents);
            let _ = documents.report();
        }
    }
    Ok(())
}

/// A compressed JSONL file: bit 0 of the first byte chooses gzip (`.jsonl.gz`) or Zstandard
/// (`.jsonl.zst`), the rest is the file: decompression, the line index built at open, the
/// documents and the report, as [`jsonl`] reads a plain one.
pub fn jsonl_compressed(data: &[u8], scratch: &Path) -> io::Result<()> {
    let Some((flags, body)) = data.split_first() else {
        return Ok(());
    };
    let name = if flags & 1 == 0 {
        "docs.jsonl.gz"
    } else {
        "docs.jsonl.zst"
    };
    let file = write_input(scratch, name, body)?;
    for (text_field, label_field) in [("", ""), ("body", "y")] {
        if let Ok(documents) = JsonlDocuments::open(&file, text_field, label_field) {
            read_some(&documents);
            let _ = documents.report();
        }
    }
    Ok(())
}

/// The `dataset_info.json` features the Hugging Face target declares, chosen by the input's
/// first byte: an image column with class labels, or text with class labels.
const HF_FEATURES: [&str; 2] = [
    concat!(
        r#"{"features":{"image":{"_type":"Image"},"#,
        r#""label":{"_type":"ClassLabel","names":["a","b","c"]}}}"#
    ),
    concat!(
        r#"{"features":{"text":{"_type":"Value","dtype":"string"},"#,
        r#""label":{"_type":"ClassLabel","names":["x","y"]}}}"#
    ),
];

/// A Hugging Face `save_to_disk` folder whose one shard is the input (after a first byte that
/// chooses the declared features, image or text, from `HF_FEATURES`): the Arrow IPC stream read
/// at open (schema, batch offsets), the columns chosen, the first samples, labels and
/// descriptions.
pub fn hf_arrow(data: &[u8], scratch: &Path) -> io::Result<()> {
    let Some((choice, shard)) = data.split_first() else {
        return Ok(());
    };
    let name = "data-00000-of-00001.arrow";
    let file = write_input(scratch, name, shard)?;
    let folder = file.parent().unwrap_or(scratch);
    std::fs::write(
        folder.join("state.json"),
        format!(r#"{{"_data_files":[{{"filename":"{name}"}}]}}"#),
    )?;
    std::fs::write(
        folder.join("dataset_info.json"),
        HF_FEATURES[usize::from(choice & 1)],
    )?;
    let options = ParquetOptions {
        cache_bytes: PARQUET_CACHE_BYTES,
        ..ParquetOptions::default()
    };
    if let Ok(dataset) = HfDataset::open(folder, &options) {
        read_some(&dataset);
        let _ = dataset.summary();
    }
    Ok(())
}

/// A source name as a user writes it (the input, as UTF-8, lossy), under a scratch folder
/// holding a small hub-like tree: brace expansion, the glob's compilation and walk, split
/// detection over what it names, and the reach a worker checks against its roots. Patterns
/// that expand to more than a few hundred names stop after the expansion (each name is a file
/// system lookup, and the cap itself is tested in the unit tests).
pub fn source_pattern(data: &[u8], scratch: &Path) -> io::Result<()> {
    if data.len() > 256 {
        return Ok(());
    }
    let tree = scratch.join("tree");
    if !tree.join("data/test-00000-of-00001.parquet").is_file() {
        for name in [
            "data/train-00000-of-00002.parquet",
            "data/train-00001-of-00002.parquet",
            "data/test-00000-of-00001.parquet",
            "shards/shard-000000.tar",
            "shards/shard-000001.tar",
            "shards/val/shard-000000.tar",
            "docs/a.jsonl",
        ] {
            let path = tree.join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(path, b"x")?;
        }
    }
    let text = String::from_utf8_lossy(data);
    crate::naming::fuzz_names(&tree, &text);
    Ok(())
}

/// Decompressed size the tar index target allows (production allows 1 GiB).
const TAR_INDEX_MAX_BYTES: usize = 16 << 20;

/// A tar set's index object (`stoker-tar-index.bin`) as opening an `s3://` set reads it: zstd,
/// then every shard and sample entry. What decodes must encode and decode back to the same.
pub fn tar_index(data: &[u8]) {
    use crate::tar_shards::index_object::{decode, encode};
    let Ok(shards) = decode(data, "s3://fuzz/set", TAR_INDEX_MAX_BYTES) else {
        return;
    };
    let encoded = encode(&shards, TAR_INDEX_MAX_BYTES).expect("a decoded index encodes");
    let again = decode(&encoded, "s3://fuzz/set", TAR_INDEX_MAX_BYTES)
        .expect("an index this crate encoded decodes");
    assert_eq!(again.len(), shards.len());
    for (first, second) in shards.iter().zip(&again) {
        assert_eq!(
            (&first.name, first.size, &first.e_tag, &first.index),
            (&second.name, second.size, &second.e_tag, &second.index)
        );
    }
}

/// A Megatron `.idx` as opening a corpus reads it: never panics, an index that parses holds
/// together (its documents' starts run up from 0 to its token count), and a read an element at
/// a time, with or without the starts, finds what the whole read does.
pub fn megatron_index(data: &[u8]) {
    let path = std::path::Path::new("fuzz.idx");
    let whole = crate::MegatronIndex::parse(data, path);
    let bytes = crate::megatron::InMemory(data);
    let by_one = crate::MegatronIndex::read_from(&bytes, path, true, 1);
    assert_eq!(
        whole.as_ref().map_err(ToString::to_string),
        by_one.as_ref().map_err(ToString::to_string)
    );
    let Ok(index) = whole else {
        return;
    };
    let counted = crate::MegatronIndex::read_from(&bytes, path, false, 1).ok();
    assert_eq!(
        counted.map(|c| (c.tokens(), c.sequences(), c.documents())),
        Some((index.tokens(), index.sequences(), index.documents()))
    );
    let starts = index.document_starts().unwrap_or_default();
    assert_eq!(starts.len() as u64, index.documents() + 1);
    assert_eq!(starts.first(), Some(&0));
    assert_eq!(starts.last(), Some(&index.tokens()));
    assert!(starts.windows(2).all(|pair| pair[0] <= pair[1]));
}

/// An MDS folder: the first two bytes (little-endian) the length of its `index.json`, then the
/// index, then the bytes of its one shard `shard.00000.mds`: the index's and the shard's checks
/// at open, every label read then, the samples (by the default columns, and by named ones), and
/// the token windows of an integer `ndarray` column, with their documents.
pub fn mds(data: &[u8], scratch: &Path) -> io::Result<()> {
    let Some((length, rest)) = data.split_first_chunk::<2>() else {
        return Ok(());
    };
    let length = usize::from(u16::from_le_bytes(*length));
    let (Some(index), Some(shard)) = (rest.get(..length), rest.get(length..)) else {
        return Ok(());
    };
    write_input(scratch, crate::MDS_INDEX_FILE, index)?;
    std::fs::write(scratch.join("shard.00000.mds"), shard)?;
    let cache = scratch.join("cache");
    let options = move || Ok(crate::ObjectCacheOptions::new(&cache));
    let named = crate::MdsOptions {
        sample_column: Some("text".into()),
        label_column: Some("cls".into()),
        tokens_only: false,
    };
    for columns in [crate::MdsOptions::default(), named] {
        if let Ok(dataset) = crate::MdsDataset::open_with_cache(scratch, &columns, &options) {
            read_some(&dataset);
        }
    }
    let tokens_only = crate::MdsOptions {
        tokens_only: true,
        ..crate::MdsOptions::default()
    };
    if let Ok(dataset) = crate::MdsDataset::open_with_cache(scratch, &tokens_only, &options) {
        let windows = crate::MdsTokenWindows {
            seq_len: 4,
            document_boundaries: true,
            ..crate::MdsTokenWindows::default()
        };
        if let Ok(tokens) = options().and_then(|cache| dataset.token_windows(&windows, &cache)) {
            read_some(&tokens);
        }
    }
    Ok(())
}

/// The input of [`mds`] for the MDS folder `dir` that [`crate::write_mds`] wrote with one
/// uncompressed shard.
pub fn mds_input(dir: &Path) -> io::Result<Vec<u8>> {
    let index = std::fs::read(dir.join(crate::MDS_INDEX_FILE))?;
    let length = u16::try_from(index.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "index.json past 64 KiB"))?;
    let mut input = length.to_le_bytes().to_vec();
    input.extend(index);
    input.extend(std::fs::read(dir.join("shard.00000.mds"))?);
    Ok(input)
}

/// Seed inputs of [`tar_index`]: index objects as this crate writes them, by name.
pub fn tar_index_seeds() -> crate::Result<Vec<(&'static str, Vec<u8>)>> {
    use crate::tar_shards::index_object::{encode, IndexedShard};
    use crate::tar_shards::scan::ShardIndex;
    let shard = |name: &str, e_tag: Option<&str>, samples: &[(&str, u64, u64, i64)]| {
        let index = ShardIndex::of(1, samples);
        IndexedShard {
            name: name.to_string(),
            size: 10_240,
            e_tag: e_tag.map(str::to_string),
            index,
        }
    };
    Ok(vec![
        (
            "two_shards",
            encode(
                &[
                    shard(
                        "shard-000000.tar",
                        Some("\"etag-a\""),
                        &[("a/0.jpg", 512, 100, 0), ("a/1.jpg", 1536, 2000, 2)],
                    ),
                    shard("shard-000001.tar", None, &[("b/0.png", 512, 9000, -1)]),
                ],
                TAR_INDEX_MAX_BYTES,
            )?,
        ),
        ("empty_set", encode(&[], TAR_INDEX_MAX_BYTES)?),
    ])
}

/// The repository's `fuzz/` folder (beside this crate's).
pub fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// Every committed input of `target`: the seeds in `fuzz/corpus/<target>/` and the crash inputs
/// kept in `fuzz/regressions/<target>/`, in name order. The corpus replay tests of every crate
/// list their inputs with it; a target with none fails the test that asks (a replay of nothing
/// would pass whatever the code does).
pub fn committed_inputs(target: &str) -> Vec<PathBuf> {
    let fuzz_dir = fuzz_dir();
    let mut files = Vec::new();
    for kind in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(fuzz_dir.join(kind).join(target)) else {
            continue;
        };
        files.extend(
            entries
                .filter_map(|entry| entry.ok().map(|entry| entry.path()))
                .filter(|path| path.is_file()),
        );
    }
    files.sort();
    assert!(
        !files.is_empty(),
        "no committed fuzz inputs for {target} under {}",
        fuzz_dir.display()
    );
    files
}

/// Writes one seed input of `target` into the repository's corpus (the seed writers of the
/// replay tests, run by hand when a format changes).
pub fn write_seed(target: &str, name: &str, data: &[u8]) -> io::Result<()> {
    let dir = fuzz_dir().join("corpus").join(target);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(name), data)
}
