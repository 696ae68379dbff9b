//! Replays the committed fuzz inputs of this crate's targets (`fuzz/corpus/<target>/` and the
//! crash inputs kept in `fuzz/regressions/<target>/`) through the same functions the libFuzzer
//! targets call, in an ordinary build: a panic in any of them fails the test and names the
//! file. `write_seed_corpora` (ignored) writes the seed files from code in this repo.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, Float32Array, Int64Array, RecordBatch, StringArray};
use parquet::arrow::ArrowWriter;
use stoker_datasets::fuzz_targets;
use stoker_datasets::{
    write_parquet, write_synthetic_tokens, write_tar_shards, ParquetWriterOptions, SampleSource,
    SyntheticTokensSpec, TarShardsWriterOptions, TokenDtype,
};

type TestResult<T> = Result<T, Box<dyn std::error::Error>>;

fn replay(target: &str, body: fn(&[u8], &Path) -> io::Result<()>) -> TestResult<()> {
    let files = fuzz_targets::committed_inputs(target);
    let scratch = tempfile::tempdir()?;
    for file in &files {
        // Shown only when the body panics: which input did it.
        eprintln!("replaying {}", file.display());
        let data = std::fs::read(file)?;
        body(&data, &scratch.path().join("input"))?;
    }
    Ok(())
}

#[test]
fn megatron_index_corpus_replays() -> TestResult<()> {
    replay("megatron_index", |data, _| {
        fuzz_targets::megatron_index(data);
        Ok(())
    })
}

#[test]
fn mds_corpus_replays() -> TestResult<()> {
    replay("mds", fuzz_targets::mds)
}

#[test]
fn tar_shards_corpus_replays() -> TestResult<()> {
    replay("tar_shards", fuzz_targets::tar_shards)
}

#[test]
fn source_pattern_corpus_replays() -> TestResult<()> {
    replay("source_pattern", fuzz_targets::source_pattern)
}

#[test]
fn parquet_corpus_replays() -> TestResult<()> {
    replay("parquet", fuzz_targets::parquet)
}

#[test]
fn parquet_ranged_corpus_replays() -> TestResult<()> {
    replay("parquet_ranged", |data, _| {
        fuzz_targets::parquet_ranged(data);
        Ok(())
    })
}

#[test]
fn jsonl_compressed_corpus_replays() -> TestResult<()> {
    replay("jsonl_compressed", fuzz_targets::jsonl_compressed)?;
    // The seeds are good files, so the replay reaches past the decompression.
    let scratch = tempfile::tempdir()?;
    for file in fuzz_targets::committed_inputs("jsonl_compressed") {
        fuzz_targets::jsonl_compressed(&std::fs::read(&file)?, scratch.path())?;
        let written = std::fs::read_dir(scratch.path())?
            .next()
            .ok_or("the target wrote no file")??
            .path();
        let documents = stoker_datasets::JsonlDocuments::open(&written, "", "")?;
        assert_eq!(documents.len(), 2, "{}", file.display());
    }
    Ok(())
}

#[test]
fn hf_arrow_corpus_replays() -> TestResult<()> {
    replay("hf_arrow", fuzz_targets::hf_arrow)?;
    // The seeds are good shards, so the replay reaches past the open (the kept crash inputs
    // are not).
    let scratch = tempfile::tempdir()?;
    let seeds = fuzz_targets::committed_inputs("hf_arrow")
        .into_iter()
        .filter(|file| !file.components().any(|c| c.as_os_str() == "regressions"));
    for file in seeds {
        fuzz_targets::hf_arrow(&std::fs::read(&file)?, scratch.path())?;
        let dataset = stoker_datasets::HfDataset::open(
            scratch.path(),
            &stoker_datasets::ParquetOptions::default(),
        )?;
        assert_eq!(dataset.len(), 3, "{}", file.display());
        assert!(dataset.read(2).is_ok(), "{}", file.display());
    }
    Ok(())
}

#[test]
fn tar_index_corpus_replays() -> TestResult<()> {
    replay("tar_index", |data, _scratch| {
        fuzz_targets::tar_index(data);
        Ok(())
    })
}

#[test]
fn token_file_corpus_replays() -> TestResult<()> {
    replay("token_file", fuzz_targets::token_file)
}

#[test]
fn jsonl_corpus_replays() -> TestResult<()> {
    replay("jsonl", fuzz_targets::jsonl)
}

/// Two tiny "images" (a JPEG and a PNG signature followed by a few bytes), labels 0 and 1.
struct TwoSamples;

impl SampleSource for TwoSamples {
    fn len(&self) -> u64 {
        2
    }

    fn label(&self, index: u64) -> i64 {
        index as i64
    }

    fn describe(&self, index: u64) -> String {
        format!("seed {index}")
    }

    fn read(&self, index: u64) -> stoker_datasets::Result<Vec<u8>> {
        Ok(match index {
            0 => vec![
                0xFF, 0xD8, 0xFF, 0xE0, 0, 16, b'J', b'F', b'I', b'F', 0, 0xFF, 0xD9,
            ],
            _ => b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec(),
        })
    }

    fn class_names(&self) -> &[String] {
        static NAMES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
        NAMES.get_or_init(|| vec!["cat".into(), "dog".into()])
    }
}

/// The only file `write_*` put in `dir` with extension `extension`.
fn only_file(dir: &Path, extension: &str) -> TestResult<PathBuf> {
    let mut found = std::fs::read_dir(dir)?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == extension));
    let file = found
        .next()
        .ok_or_else(|| io::Error::other(format!("no .{extension} file in {}", dir.display())))?;
    Ok(file)
}

/// A tar with labels from `.cls` and `.json`, a member without a sample, a directory and a
/// long (GNU) member name.
fn hand_made_tar() -> TestResult<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut append = |name: &str, data: &[u8]| -> io::Result<()> {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut header, name, data)
    };
    append("d/a.jpg", &[0xFF, 0xD8, 0xFF, 0xD9])?;
    append("d/a.cls", b" 2\n")?;
    append("d/b.png", b"\x89PNG\r\n\x1a\n")?;
    append("d/b.json", br#"{"label": 1, "cls": 4}"#)?;
    append("d/c.txt", b"no sample")?;
    append(&format!("d/{}.jpg", "long".repeat(40)), &[0xFF, 0xD8])?;
    append(&format!("d/{}.cls", "long".repeat(40)), b"0")?;
    let mut dir = tar::Header::new_gnu();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_size(0);
    dir.set_mode(0o755);
    builder.append_data(&mut dir, "d/sub/", io::empty())?;
    Ok(builder.into_inner()?)
}

/// A tar whose names and one member's size come in PAX records (as Python's tarfile and
/// WebDataset write names over 100 bytes, and sizes of 8 GiB or more: 0 in the header).
fn pax_tar() -> TestResult<Vec<u8>> {
    let mut out = Vec::new();
    let mut member = |records: &[(&str, String)], name: &str, header_size: u64, data: &[u8]| {
        let mut body = String::new();
        for (key, value) in records {
            // "<length> key=value\n", the length counting its own digits.
            let record = format!(" {key}={value}\n");
            let mut length = record.len() + 1;
            while format!("{length}").len() + record.len() != length {
                length += 1;
            }
            body.push_str(&format!("{length}{record}"));
        }
        for (kind, size, path, bytes) in [
            (
                tar::EntryType::XHeader,
                body.len() as u64,
                "PaxHeader",
                body.as_bytes(),
            ),
            (tar::EntryType::Regular, header_size, name, data),
        ] {
            let mut header = tar::Header::new_ustar();
            header.set_entry_type(kind);
            header.set_size(size);
            header.set_mode(0o644);
            header.set_path(path)?;
            header.set_cksum();
            out.extend_from_slice(header.as_bytes());
            out.extend_from_slice(bytes);
            out.resize(out.len().div_ceil(512) * 512, 0);
        }
        io::Result::Ok(())
    };
    let long = "pax".repeat(40);
    member(
        &[("path", format!("d/{long}.jpg"))],
        "d/short.jpg",
        2,
        &[0xFF, 0xD8],
    )?;
    member(&[("path", format!("d/{long}.cls"))], "d/short.cls", 1, b"3")?;
    member(
        &[("size", "4".into())],
        "d/big.jpg",
        0,
        &[0xFF, 0xD8, 0xFF, 0xD9],
    )?;
    member(&[], "d/big.cls", 1, b"1")?;
    out.extend_from_slice(&[0; 1024]);
    Ok(out)
}

/// A tar whose second header is a GNU long name claiming 100 MiB, in a file of a few KiB.
fn huge_long_name_tar() -> TestResult<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(2);
    header.set_mode(0o644);
    builder.append_data(&mut header, "a.jpg", &[0xFF, 0xD8][..])?;
    let mut out = builder.into_inner()?;
    out.truncate(out.len() - 1024);
    let mut long_name = tar::Header::new_gnu();
    long_name.set_entry_type(tar::EntryType::GNULongName);
    long_name.set_size(100 << 20);
    long_name.set_path("././@LongLink")?;
    long_name.set_cksum();
    out.extend_from_slice(long_name.as_bytes());
    out.extend_from_slice(&[b'x'; 2048]);
    Ok(out)
}

/// A Parquet file of text documents with an integer label and a float column.
fn text_parquet() -> TestResult<Vec<u8>> {
    let columns: Vec<(&str, ArrayRef)> = vec![
        (
            "text",
            Arc::new(StringArray::from(vec!["one doc", "", "three \u{e9}"])),
        ),
        ("label", Arc::new(Int64Array::from(vec![0, 2, 1]))),
        ("x", Arc::new(Float32Array::from(vec![0.5, -1.0, 3.25]))),
    ];
    let batch = RecordBatch::try_from_iter(columns)?;
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, batch.schema(), None)?;
    writer.write(&batch)?;
    writer.close()?;
    Ok(out)
}

/// Writes the seed corpora of this crate's targets into `fuzz/corpus/`; run by hand when a
/// format changes (`cargo test --release -p stoker-datasets --test it write_seed_corpora --
/// --ignored`), then commit what changed.
#[test]
#[ignore = "writes into the source tree; run by hand to refresh the seeds"]
fn write_seed_corpora() -> TestResult<()> {
    let put = |target: &str, name: &str, data: &[u8]| fuzz_targets::write_seed(target, name, data);
    let work = tempfile::tempdir()?;

    let shards = work.path().join("shards");
    write_tar_shards(
        &TwoSamples,
        &shards,
        &TarShardsWriterOptions::default(),
        &|_| {},
    )?;
    put(
        "tar_shards",
        "written.tar",
        &std::fs::read(only_file(&shards, "tar")?)?,
    )?;
    let tar = hand_made_tar()?;
    put("tar_shards", "hand_made.tar", &tar)?;
    put("tar_shards", "cut.tar", &tar[..tar.len() - 700])?;
    put("tar_shards", "pax.tar", &pax_tar()?)?;
    put("tar_shards", "huge_long_name.tar", &huge_long_name_tar()?)?;

    let parquet_dir = work.path().join("parquet");
    let options = ParquetWriterOptions {
        rows_per_group: 1,
        ..ParquetWriterOptions::default()
    };
    write_parquet(&TwoSamples, &parquet_dir, &options, &|_| {})?;
    put(
        "parquet",
        "written.parquet",
        &std::fs::read(only_file(&parquet_dir, "parquet")?)?,
    )?;
    put("parquet", "text.parquet", &text_parquet()?)?;
    // The same files read by ranges, as from an object store.
    put(
        "parquet_ranged",
        "written.parquet",
        &std::fs::read(only_file(&parquet_dir, "parquet")?)?,
    )?;
    put("parquet_ranged", "text.parquet", &text_parquet()?)?;

    for (name, flags, seq_len, dtype, tokens) in [
        ("u16_seq8", 0u8, 8u16, TokenDtype::Uint16, 40u64),
        ("u32_seq3", 1, 3, TokenDtype::Uint32, 13),
    ] {
        let file = work.path().join(format!("{name}.bin"));
        let spec = SyntheticTokensSpec {
            tokens,
            vocab: 1000,
            dtype,
            seed: 5,
        };
        write_synthetic_tokens(&file, &spec)?;
        // The target's three leading bytes: dtype flag, then `seq_len - 1` little-endian.
        let mut data = vec![flags];
        data.extend_from_slice(&(seq_len - 1).to_le_bytes());
        data.extend_from_slice(&std::fs::read(&file)?);
        put("token_file", name, &data)?;
    }

    put(
        "jsonl",
        "labelled.jsonl",
        b"{\"text\": \"first\", \"label\": 3}\n\n{\"text\": \"caf\\u00e9\", \"label\": 0}\r\n",
    )?;
    put(
        "jsonl",
        "mixed.jsonl",
        b"{\"body\": \"x\", \"y\": 1}\n[1, 2]\n{\"text\": 5}\n   \nnot json\n{\"text\": \"end\"}",
    )?;

    for (name, index) in fuzz_targets::tar_index_seeds()? {
        put("tar_index", name, &index)?;
    }

    // Megatron indexes as the corpus writer lays them out (its layout is Megatron's).
    for (name, dtype, documents) in [
        (
            "uint16_four_documents",
            TokenDtype::Uint16,
            vec![vec![1, 2, 3], vec![4], vec![], vec![5, 6]],
        ),
        (
            "int32_two_documents",
            TokenDtype::Uint32,
            vec![vec![70_000; 5], vec![1; 2]],
        ),
    ] {
        let (_, idx) =
            stoker_datasets::write_megatron_corpus(&work.path().join(name), &documents, dtype)?;
        put("megatron_index", name, &std::fs::read(idx)?)?;
    }

    // MDS: a folder of images and labels, one of text with uint8 `cls` labels, one of uint8
    // pixel arrays (dtype and shape in each sample) and one of uint16 token arrays.
    let columns = |spec: &[(&str, &str, Option<u32>)]| -> Vec<stoker_datasets::MdsColumn> {
        spec.iter()
            .map(|(name, encoding, size)| stoker_datasets::MdsColumn {
                name: name.to_string(),
                encoding: encoding.to_string(),
                size: *size,
            })
            .collect()
    };
    let images = columns(&[("image", "jpeg", None), ("label", "int", Some(8))]);
    let image_rows: Vec<Vec<Vec<u8>>> = (0..4i64)
        .map(|k| vec![vec![0xff, 0xd8, 0xff, k as u8], k.to_le_bytes().to_vec()])
        .collect();
    let text = columns(&[("text", "str", None), ("cls", "uint8", Some(1))]);
    let text_rows: Vec<Vec<Vec<u8>>> = (0..3u8)
        .map(|k| vec![format!("document {k}").into_bytes(), vec![k]])
        .collect();
    let pixels = columns(&[("image", "ndarray", None), ("label", "json", None)]);
    let pixel_rows: Vec<Vec<Vec<u8>>> = (0..3u8)
        .map(|k| vec![vec![8, 2 << 2, 1, 2, k, k + 1], format!("{k}").into_bytes()])
        .collect();
    let tokens = columns(&[("tokens", "ndarray:uint16", None)]);
    let token_rows: Vec<Vec<Vec<u8>>> = (0..3u8)
        .map(|k| vec![vec![1 << 2, 2, k, 0, k + 1, 0]])
        .collect();
    for (name, columns, rows) in [
        ("images", &images, &image_rows),
        ("text", &text, &text_rows),
        ("pixels", &pixels, &pixel_rows),
        ("tokens", &tokens, &token_rows),
    ] {
        let dir = work.path().join(format!("mds-{name}"));
        stoker_datasets::write_mds(&dir, columns, rows, 100, None)?;
        put("mds", name, &fuzz_targets::mds_input(&dir)?)?;
    }

    // Compressed JSONL: a leading byte (bit 0: zstd rather than gzip), then the file.
    let lines = b"{\"text\": \"first\", \"label\": 3}\n{\"text\": \"second\", \"label\": 1}\n";
    let gzip = |data: &[u8]| -> io::Result<Vec<u8>> {
        use std::io::Write;
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(data)?;
        encoder.finish()
    };
    let mut two_members = gzip(&lines[..32])?;
    two_members.extend(gzip(&lines[32..])?);
    for (name, flag, file) in [
        ("gzip", 0u8, gzip(lines)?),
        ("gzip_two_members", 0, two_members),
        ("zstd", 1, zstd::encode_all(&lines[..], 3)?),
    ] {
        let mut input = vec![flag];
        input.extend(file);
        put("jsonl_compressed", name, &input)?;
    }

    // Hugging Face shards: a leading byte (bit 0: the text features rather than the image
    // ones), then one Arrow IPC stream.
    for (name, choice, batches) in [
        (
            "image_two_batches",
            0u8,
            vec![hf_image_rows(0..2)?, hf_image_rows(2..3)?],
        ),
        ("text", 1, vec![hf_text_rows()?]),
    ] {
        let mut input = vec![choice];
        let mut writer = arrow_ipc::writer::StreamWriter::try_new(&mut input, &batches[0].schema())
            .map_err(io::Error::other)?;
        for batch in &batches {
            writer.write(batch).map_err(io::Error::other)?;
        }
        writer.finish().map_err(io::Error::other)?;
        drop(writer);
        put("hf_arrow", name, &input)?;
    }
    Ok(())
}

/// Rows of a Hugging Face image table: `image` (a struct of encoded bytes and a path, as the
/// `Image` feature stores it) and `label`.
fn hf_image_rows(rows: std::ops::Range<usize>) -> TestResult<RecordBatch> {
    use arrow_array::{BinaryArray, StructArray};
    use arrow_schema::{DataType, Field};
    let bytes: Vec<Option<Vec<u8>>> = rows.clone().map(|row| Some(vec![row as u8; 8])).collect();
    let paths: Vec<Option<String>> = rows.clone().map(|row| Some(format!("{row}.jpg"))).collect();
    let image = StructArray::from(vec![
        (
            Arc::new(Field::new("bytes", DataType::Binary, true)),
            Arc::new(BinaryArray::from_iter(bytes)) as ArrayRef,
        ),
        (
            Arc::new(Field::new("path", DataType::Utf8, true)),
            Arc::new(StringArray::from(paths)) as ArrayRef,
        ),
    ]);
    let labels: Vec<i64> = rows.map(|row| (row % 3) as i64).collect();
    Ok(RecordBatch::try_from_iter(vec![
        ("image", Arc::new(image) as ArrayRef),
        ("label", Arc::new(Int64Array::from(labels)) as ArrayRef),
    ])?)
}

/// Rows of a Hugging Face text table: `text` and `label`.
fn hf_text_rows() -> TestResult<RecordBatch> {
    Ok(RecordBatch::try_from_iter(vec![
        (
            "text",
            Arc::new(StringArray::from(vec!["one", "two", "three"])) as ArrayRef,
        ),
        (
            "label",
            Arc::new(Int64Array::from(vec![0i64, 1, 0])) as ArrayRef,
        ),
    ])?)
}
