//! MDS shards written by [`write_mds`] in Streaming's layout, read back: every encoding a sample
//! or label column may use, compressed shards, token windows from `ndarray` columns, and
//! damaged files named in errors.

use super::*;
use crate::token_dtype::TokenDtype;

fn column(name: &str, encoding: &str, size: Option<u32>) -> MdsColumn {
    MdsColumn {
        name: name.into(),
        encoding: encoding.into(),
        size,
    }
}

/// 10 samples: an image (`jpeg` bytes of its own), an int64 label, a uint8 `cls`, a text.
fn samples() -> (Vec<MdsColumn>, Vec<Vec<Vec<u8>>>) {
    let columns = vec![
        column("text", "str", None),
        column("image", "jpeg", None),
        column("label", "int", Some(8)),
        column("cls", "uint8", Some(1)),
    ];
    let rows = (0..10u8)
        .map(|k| {
            vec![
                format!("document {k}").into_bytes(),
                vec![k; 3 + usize::from(k)],
                i64::from(k % 4).to_le_bytes().to_vec(),
                vec![9 - k],
            ]
        })
        .collect();
    (columns, rows)
}

fn open(dir: &Path, options: &MdsOptions, cache: &Path) -> Result<MdsDataset> {
    let cache = cache.to_path_buf();
    MdsDataset::open_with_cache(dir, options, &move || Ok(ObjectCacheOptions::new(&cache)))
}

#[test]
fn samples_and_labels_read_back_plain_and_compressed() {
    let temp = tempfile::tempdir().unwrap();
    let (columns, rows) = samples();
    for (name, compression) in [
        ("plain", None),
        ("zstd", Some("zstd:7")),
        ("gz", Some("gz")),
    ] {
        let dir = temp.path().join(name);
        assert_eq!(write_mds(&dir, &columns, &rows, 4, compression).unwrap(), 3);
        assert!(looks_like_mds(&dir));
        let dataset = open(&dir, &MdsOptions::default(), &temp.path().join("cache")).unwrap();
        assert_eq!(dataset.len(), 10);
        assert_eq!(dataset.shard_sizes(), Some(vec![4, 4, 2]));
        assert_eq!(dataset.class_names(), ["0", "1", "2", "3"]);
        for k in 0..10u8 {
            assert_eq!(
                dataset.read(u64::from(k)).unwrap(),
                vec![k; 3 + usize::from(k)]
            );
            assert_eq!(dataset.label(u64::from(k)), i64::from(k % 4));
        }
        let shard = match compression.and_then(|c| c.split(':').next()) {
            None => "shard.00001.mds".to_string(),
            Some(extension) => format!("shard.00001.mds.{extension}"),
        };
        let described = dataset.describe(5);
        assert!(
            described.ends_with(&format!("{shard}:sample 1")),
            "{described}"
        );
        // Other columns by name: the text, and the uint8 labels.
        let named = MdsOptions {
            sample_column: Some("text".into()),
            label_column: Some("cls".into()),
            ..MdsOptions::default()
        };
        let text = open(&dir, &named, &temp.path().join("cache")).unwrap();
        assert_eq!(text.read(2).unwrap(), b"document 2");
        assert_eq!(text.label(2), 7);
    }
}

/// A compressed shard's copy in the cache tier is not held locked once the set is open (a
/// descriptor a shard: a set of more shards than the descriptor limit could not open): evicted,
/// it is made again at its next read, the same bytes; its source replaced meanwhile stops the
/// read, naming it, rather than serve other samples.
#[test]
fn a_compressed_shards_copy_is_let_go_and_made_again_once_evicted() {
    let temp = tempfile::tempdir().unwrap();
    let (columns, rows) = samples();
    let dir = temp.path().join("zstd");
    write_mds(&dir, &columns, &rows, 4, Some("zstd")).unwrap();
    let dataset = open(&dir, &MdsOptions::default(), &temp.path().join("cache")).unwrap();
    let expected: Vec<Vec<u8>> = (0..10).map(|k| dataset.read(k).unwrap()).collect();
    for shard in &dataset.shards {
        let copy = shard._copy.as_ref().expect("a copy in the cache tier");
        assert!(!copy.is_locked(), "{} is held locked", shard.path.display());
    }
    // Evicted: every copy gone from the cache tier, the pooled files closed.
    let evict = |dataset: &MdsDataset| {
        FilePool::global().forget(dataset.pool_keys.clone());
        for shard in &dataset.shards {
            let _ = std::fs::remove_file(&shard.read_from);
        }
    };
    evict(&dataset);
    for k in 0..10u64 {
        assert_eq!(dataset.read(k).unwrap(), expected[k as usize]);
    }
    // A source rewritten in place while its copy is gone: the same length and file, another
    // time (and other bytes).
    evict(&dataset);
    let zip = dataset.shards[0].path.clone();
    let mut bytes = std::fs::read(&zip).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    let modified = std::fs::metadata(&zip).unwrap().modified().unwrap();
    std::fs::write(&zip, &bytes).unwrap();
    let later = modified + std::time::Duration::from_secs(10);
    std::fs::File::options()
        .write(true)
        .open(&zip)
        .unwrap()
        .set_modified(later)
        .unwrap();
    let error = dataset.read(0).unwrap_err();
    assert!(
        matches!(&error, Error::FileReplaced { path, .. } if *path == zip),
        "{error}"
    );
    assert!(error.dataset_changed());
    assert_eq!(dataset.read(9).unwrap(), expected[9]);
}

/// A set under an `s3://` prefix held each shard's copy locked in the cache tier from open to
/// drop (a descriptor a shard: a set of more shards than the descriptor limit could not open).
/// Let go of now: evicted by a cap, a shard's copy is fetched (and decompressed) again at its
/// next read, the same samples, or, its object rewritten since it was listed, none.
#[cfg(feature = "s3")]
#[test]
fn a_remote_shards_copy_is_let_go_and_fetched_again_once_evicted() {
    use crate::s3_server::{S3Server, ACCESS_KEY, SECRET_KEY};
    use crate::storage::evict_all;
    let temp = tempfile::tempdir().unwrap();
    let server = S3Server::start(&temp.path().join("server"));
    let mut options = ObjectCacheOptions::new(temp.path().join("cache"));
    options.s3 = crate::S3Settings {
        endpoint: Some(server.endpoint()),
        access_key_id: Some(ACCESS_KEY.into()),
        secret_access_key: Some(SECRET_KEY.into()),
        region: Some("us-east-1".into()),
        allow_http: false,
    };
    let cache = std::sync::Arc::new(crate::ObjectCache::new(options).unwrap());
    let (columns, rows) = samples();
    for compression in [None, Some("zstd")] {
        let name = compression.unwrap_or("raw");
        write_mds(
            &server.bucket_dir("data").join(name),
            &columns,
            &rows,
            4,
            compression,
        )
        .unwrap();
        let uri = format!("s3://data/{name}");
        let options = MdsOptions::default();
        let dataset =
            MdsDataset::open_remote(&uri, std::sync::Arc::clone(&cache), &options).unwrap();
        let expected: Vec<Vec<u8>> = (0..10).map(|k| dataset.read(k).unwrap()).collect();
        for shard in &dataset.shards {
            let copy = shard._copy.as_ref().expect("a copy in the cache tier");
            assert!(!copy.is_locked(), "{} is held locked", shard.path.display());
        }
        FilePool::global().forget(dataset.pool_keys.clone());
        evict_all(&cache);
        for shard in &dataset.shards {
            assert!(
                !shard.read_from.exists(),
                "{} evicted",
                shard.read_from.display()
            );
        }
        let gets = server.counts.object_gets();
        for k in 0..10u64 {
            assert_eq!(
                dataset.read(k).unwrap(),
                expected[k as usize],
                "{uri} sample {k}"
            );
        }
        assert_eq!(
            server.counts.object_gets(),
            gets + 3,
            "{uri}: its 3 shards fetched again"
        );

        // The first shard's object rewritten since it was listed (here only its time: this
        // store lists no ETags), while its copy is gone: the job stops, naming it. Before, an
        // object of such a store was fetched again as whatever it held by then.
        FilePool::global().forget(dataset.pool_keys.clone());
        evict_all(&cache);
        let object = dataset.shards[0]
            .path
            .to_string_lossy()
            .replace("s3://data/", "");
        let object = server.bucket_dir("data").join(object);
        let later = std::fs::metadata(&object).unwrap().modified().unwrap()
            + std::time::Duration::from_secs(10);
        std::fs::File::options()
            .write(true)
            .open(&object)
            .unwrap()
            .set_modified(later)
            .unwrap();
        let error = dataset.read(0).unwrap_err();
        assert!(
            matches!(error, Error::ObjectChanged { .. }),
            "{uri}: {error}"
        );
        assert!(
            error.dataset_changed() && error.to_string().contains(&uri),
            "{error}"
        );
    }
}

/// A copy made again after an eviction takes its own room under the cap: a set whose copies
/// fill the cap but for a byte reads on once one is evicted, and a failure to make it again
/// is the cache's, never a bad sample. Before, the evicted copy's room still counted against
/// it, and the cap refused it.
#[test]
fn a_copy_made_again_under_a_full_cap_takes_its_own_room() {
    let temp = tempfile::tempdir().unwrap();
    let (columns, rows) = samples();
    let dir = temp.path().join("zstd");
    write_mds(&dir, &columns, &rows, 4, Some("zstd")).unwrap();
    let sizing = open(&dir, &MdsOptions::default(), &temp.path().join("sizing")).unwrap();
    let copies: u64 = sizing
        .shards
        .iter()
        .map(|shard| std::fs::metadata(&shard.read_from).unwrap().len())
        .sum();
    drop(sizing);
    let cache = temp.path().join("cache");
    let options = move || {
        let mut options = ObjectCacheOptions::new(&cache);
        options.max_bytes = copies + 1;
        Ok(options)
    };
    let dataset = MdsDataset::open_with_cache(&dir, &MdsOptions::default(), &options).unwrap();
    let first = dataset.read(0).unwrap();
    FilePool::global().forget(dataset.pool_keys.clone());
    // Evicted (by this test, or already by the cap as the set was opened).
    let _ = std::fs::remove_file(&dataset.shards[0].read_from);
    assert_eq!(dataset.read(0).unwrap(), first);
}

/// `MDSWriter(columns={"image": "jpeg:95", ...})` keeps the quality in the encoding's name,
/// as Streaming's coder reads it: the column is JPEG bytes all the same. Before, the set was
/// refused as having no image column, and with a `text` column beside it served that text.
#[test]
fn a_jpeg_column_written_with_its_quality_is_the_image_column() {
    let temp = tempfile::tempdir().unwrap();
    let columns = vec![
        column("image", "jpeg:95", None),
        column("label", "int", Some(8)),
        column("text", "str", None),
    ];
    let rows = (0..4u8)
        .map(|k| {
            vec![
                vec![k; 5],
                i64::from(k % 2).to_le_bytes().to_vec(),
                b"caption".to_vec(),
            ]
        })
        .collect::<Vec<_>>();
    let dir = temp.path().join("quality");
    write_mds(&dir, &columns, &rows, 4, None).unwrap();
    let dataset = open(&dir, &MdsOptions::default(), &temp.path().join("cache")).unwrap();
    for k in 0..4u8 {
        assert_eq!(dataset.read(u64::from(k)).unwrap(), vec![k; 5]);
        assert_eq!(dataset.label(u64::from(k)), i64::from(k % 2));
    }
}

/// A column claiming more than [`crate::MAX_SAMPLE_BYTES`] (MDS offsets are 32-bit, so up to
/// 4 GiB) is a sample too large, refused before anything is allocated for it, as a tar member
/// or a JSONL line is; the label beside it still reads. The shard is sparse: no 2 GiB written.
#[test]
fn a_column_past_the_sample_size_cap_is_too_large_not_read() {
    use std::os::unix::fs::FileExt;
    let temp = tempfile::tempdir().unwrap();
    let columns = vec![
        column("image", "jpeg", None),
        column("label", "int", Some(8)),
    ];
    let dir = temp.path().join("huge");
    write_mds(
        &dir,
        &columns,
        &[vec![vec![7; 4], 3i64.to_le_bytes().to_vec()]],
        1,
        None,
    )
    .unwrap();
    let path = dir.join("shard.00000.mds");
    let bytes = std::fs::read(&path).unwrap();
    let begin = u32::from_le_bytes(bytes[4..8].try_into().unwrap());
    let huge = u32::try_from(crate::MAX_SAMPLE_BYTES + 1).unwrap();
    let end = begin + 4 + huge + 8;
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(u64::from(end)).unwrap();
    file.write_all_at(&end.to_le_bytes(), 8).unwrap();
    file.write_all_at(&huge.to_le_bytes(), u64::from(begin))
        .unwrap();
    file.write_all_at(&3i64.to_le_bytes(), u64::from(end - 8))
        .unwrap();
    let dataset = open(&dir, &MdsOptions::default(), &temp.path().join("cache")).unwrap();
    assert_eq!(dataset.label(0), 3);
    let error = dataset.read(0).unwrap_err();
    assert!(
        matches!(error, Error::SampleTooLarge { bytes, .. } if bytes == u64::from(huge)),
        "{error}"
    );
}

/// MosaicML Streaming's own converters write `{"x": "jpeg", "y": "int"}`: `y` is the label
/// (it was not looked for, and every label read 0); a `y` of another encoding is not taken.
#[test]
fn streamings_x_and_y_columns_are_image_and_label() {
    let temp = tempfile::tempdir().unwrap();
    let columns = vec![column("x", "jpeg", None), column("y", "int", Some(8))];
    let rows = (0..4u8)
        .map(|k| vec![vec![k; 3], i64::from(k % 3).to_le_bytes().to_vec()])
        .collect::<Vec<_>>();
    let dir = temp.path().join("xy");
    write_mds(&dir, &columns, &rows, 4, None).unwrap();
    let cache = temp.path().join("cache");
    let dataset = open(&dir, &MdsOptions::default(), &cache).unwrap();
    assert_eq!(
        (0..4).map(|k| dataset.label(k)).collect::<Vec<_>>(),
        [0, 1, 2, 0]
    );
    let columns = vec![column("x", "jpeg", None), column("y", "str", None)];
    let rows = (0..4u8)
        .map(|k| vec![vec![k; 3], b"a".to_vec()])
        .collect::<Vec<_>>();
    let dir = temp.path().join("text-y");
    write_mds(&dir, &columns, &rows, 4, None).unwrap();
    let dataset = open(&dir, &MdsOptions::default(), &cache).unwrap();
    assert_eq!(dataset.label(1), 0);
    // A `json` `y` may hold boxes or lists: not taken either.
    let columns = vec![column("x", "jpeg", None), column("y", "json", None)];
    let rows = (0..4u8)
        .map(|k| vec![vec![k; 3], b"[1, 2]".to_vec()])
        .collect::<Vec<_>>();
    let dir = temp.path().join("json-y");
    write_mds(&dir, &columns, &rows, 4, None).unwrap();
    let dataset = open(&dir, &MdsOptions::default(), &cache).unwrap();
    assert_eq!(dataset.label(1), 0);
    // A `label` of another encoding is refused, never passed over for `y`.
    let columns = vec![
        column("label", "str", None),
        column("x", "jpeg", None),
        column("y", "int", Some(8)),
    ];
    let rows = (0..4u8)
        .map(|k| {
            vec![
                b"cat".to_vec(),
                vec![k; 3],
                i64::from(k).to_le_bytes().to_vec(),
            ]
        })
        .collect::<Vec<_>>();
    let dir = temp.path().join("str-label");
    write_mds(&dir, &columns, &rows, 4, None).unwrap();
    let refused = open(&dir, &MdsOptions::default(), &cache)
        .err()
        .unwrap()
        .to_string();
    assert!(
        refused.contains("label column \"label\" is encoded str"),
        "{refused}"
    );
}

/// MDSWriter keeps columns in name order: of `x` (jpeg) and `depth` (png), the first is no
/// choice of the writer's, so neither is taken without being named.
#[test]
fn several_image_columns_none_named_image_are_refused_until_one_is_named() {
    let temp = tempfile::tempdir().unwrap();
    let columns = vec![
        column("depth", "png", None),
        column("label", "int", Some(8)),
        column("x", "jpeg", None),
    ];
    let rows = (0..4u8)
        .map(|k| {
            vec![
                vec![200 + k; 4],
                i64::from(k).to_le_bytes().to_vec(),
                vec![k; 3],
            ]
        })
        .collect::<Vec<_>>();
    let dir = temp.path().join("two");
    write_mds(&dir, &columns, &rows, 4, None).unwrap();
    let cache = temp.path().join("cache");
    let refused = open(&dir, &MdsOptions::default(), &cache)
        .err()
        .unwrap()
        .to_string();
    assert!(
        refused.contains("several image columns, depth (png), x (jpeg)")
            && refused.contains("image_column="),
        "{refused}"
    );
    let named = MdsOptions {
        sample_column: Some("x".into()),
        ..MdsOptions::default()
    };
    assert_eq!(
        open(&dir, &named, &cache).unwrap().read(2).unwrap(),
        vec![2; 3]
    );
    // One image column under another name is the one.
    let one = temp.path().join("one");
    let rows: Vec<Vec<Vec<u8>>> = rows.into_iter().map(|row| row[1..].to_vec()).collect();
    write_mds(&one, &columns[1..], &rows, 4, None).unwrap();
    assert_eq!(
        open(&one, &MdsOptions::default(), &cache)
            .unwrap()
            .read(1)
            .unwrap(),
        vec![1; 3]
    );
}

/// PIL's `convert("RGB")` of the modes a `pil` column holds besides RGB and L (values from
/// Pillow 13: `Image.frombytes(mode, size, raw).convert("RGB")`): they were bad samples,
/// replaced by their neighbours. A `P` image, whose palette the encoding drops (PIL decodes it
/// black), and an unknown mode are refused by name.
#[test]
fn pil_modes_convert_as_pil_does() {
    let pil = |mode: &str, pixels: &[u8], width: u32, height: u32| {
        let mut bytes = Vec::new();
        for word in [width, height, mode.len() as u32] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        bytes.extend_from_slice(mode.as_bytes());
        bytes.extend_from_slice(pixels);
        bytes
    };
    assert_eq!(
        pil_as_pnm(&pil("CMYK", &[0, 0, 0, 0, 255, 0, 0, 128], 2, 1)).unwrap(),
        b"P6\n2 1\n255\n\xff\xff\xff\x00\x7f\x7f"
    );
    assert_eq!(
        pil_as_pnm(&pil("1", &[0b1010_0000, 0b1100_0000], 10, 1)).unwrap(),
        b"P5\n10 1\n255\n\xff\x00\xff\x00\x00\x00\x00\x00\xff\xff"
    );
    let sixteen: Vec<u8> = [0u16, 300, 65535]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(
        pil_as_pnm(&pil("I;16", &sixteen, 3, 1)).unwrap(),
        b"P5\n3 1\n255\n\x00\xff\xff"
    );
    let error = pil_as_pnm(&pil("P", &[0, 1], 2, 1)).unwrap_err();
    assert!(error.contains("keeps no palette"), "{error}");
    let error = pil_as_pnm(&pil("YCbCr", &[0; 3], 1, 1)).unwrap_err();
    assert!(error.contains("\"YCbCr\""), "{error}");
    let error = pil_as_pnm(&pil("RGB", &[0; 5], 1, 2)).unwrap_err();
    assert!(error.contains("not 1x2"), "{error}");
}

#[test]
fn pil_images_become_pnm_and_other_columns_are_refused_by_name() {
    let temp = tempfile::tempdir().unwrap();
    let pil = |mode: &str, pixels: &[u8], width: u32, height: u32| {
        let mut bytes = Vec::new();
        for word in [width, height, mode.len() as u32] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        bytes.extend_from_slice(mode.as_bytes());
        bytes.extend_from_slice(pixels);
        bytes
    };
    let columns = vec![
        column("img", "pil", None),
        column("label", "str_int", None),
        column("cls", "json", None),
    ];
    let rows = vec![
        vec![
            pil("RGB", &[1, 2, 3, 4, 5, 6], 2, 1),
            b"4".to_vec(),
            b"1".to_vec(),
        ],
        vec![pil("L", &[7, 8], 1, 2), b" 5".to_vec(), b"12".to_vec()],
        vec![pil("CMYK", &[0; 4], 1, 1), b"6".to_vec(), b"0".to_vec()],
        vec![
            pil("RGBA", &[1, 2, 3, 250, 4, 5, 6, 0], 2, 1),
            b"7".to_vec(),
            b"2".to_vec(),
        ],
        vec![
            pil("LA", &[9, 128, 10, 0], 1, 2),
            b"8".to_vec(),
            b"3".to_vec(),
        ],
    ];
    let dir = temp.path().join("pil");
    write_mds(&dir, &columns, &rows, 10, None).unwrap();
    let dataset = open(&dir, &MdsOptions::default(), temp.path()).unwrap();
    assert_eq!(
        dataset.read(0).unwrap(),
        b"P6\n2 1\n255\n\x01\x02\x03\x04\x05\x06"
    );
    assert_eq!(dataset.read(1).unwrap(), b"P5\n1 2\n255\n\x07\x08");
    // CMYK without ink: white, as PIL's convert("RGB") makes it.
    assert_eq!(dataset.read(2).unwrap(), b"P6\n1 1\n255\n\xff\xff\xff");
    // Alpha dropped, as PIL's convert("RGB") drops it.
    assert_eq!(
        dataset.read(3).unwrap(),
        b"P6\n2 1\n255\n\x01\x02\x03\x04\x05\x06"
    );
    assert_eq!(dataset.read(4).unwrap(), b"P5\n1 2\n255\n\x09\x0a");
    assert_eq!(
        (0..5).map(|k| dataset.label(k)).collect::<Vec<_>>(),
        [4, 5, 6, 7, 8]
    );
    // A `json` column of integers is a label column too; one holding other values is not read.
    let by_json = MdsOptions {
        label_column: Some("cls".into()),
        ..MdsOptions::default()
    };
    let dataset = open(&dir, &by_json, temp.path()).unwrap();
    assert_eq!(
        (0..5).map(|k| dataset.label(k)).collect::<Vec<_>>(),
        [1, 12, 0, 2, 3]
    );
    let objects = temp.path().join("json-objects");
    let rows = vec![vec![b"x".to_vec(), br#"{"class": 1}"#.to_vec()]];
    let columns = [
        column("image", "bytes", None),
        column("label", "json", None),
    ];
    write_mds(&objects, &columns, &rows, 10, None).unwrap();
    let error = open(&objects, &MdsOptions::default(), temp.path())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("label column label (json) holds 12 bytes that are no label"),
        "{error}"
    );

    let error = open(
        &dir,
        &MdsOptions {
            sample_column: Some("label".into()),
            ..MdsOptions::default()
        },
        temp.path(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("column \"label\" is encoded str_int"),
        "{error}"
    );
    let error = open(
        &dir,
        &MdsOptions {
            label_column: Some("img".into()),
            ..MdsOptions::default()
        },
        temp.path(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("label column \"img\" is encoded pil"),
        "{error}"
    );
    let error = open(
        &dir,
        &MdsOptions {
            sample_column: Some("nope".into()),
            ..MdsOptions::default()
        },
        temp.path(),
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("img (pil), label (str_int)"), "{error}");
}

#[test]
fn damaged_shards_and_indexes_are_errors_naming_the_file() {
    let temp = tempfile::tempdir().unwrap();
    let (columns, rows) = samples();
    let dir = temp.path().join("set");
    write_mds(&dir, &columns, &rows, 4, None).unwrap();
    let shard = dir.join("shard.00001.mds");
    let bytes = std::fs::read(&shard).unwrap();

    // Cut short: the last offset runs past the end.
    std::fs::write(&shard, &bytes[..bytes.len() - 3]).unwrap();
    let error = open(&dir, &MdsOptions::default(), temp.path())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("shard.00001.mds") && error.contains("offsets"),
        "{error}"
    );

    // Another sample count than the index's.
    let mut other = bytes.clone();
    other[0] = 3;
    std::fs::write(&shard, &other).unwrap();
    let error = open(&dir, &MdsOptions::default(), temp.path())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("holds 3 samples but index.json says 4"),
        "{error}"
    );

    // Offsets that run backwards.
    let mut backwards = bytes.clone();
    backwards[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(&shard, &backwards).unwrap();
    let error = open(&dir, &MdsOptions::default(), temp.path())
        .unwrap_err()
        .to_string();
    assert!(error.contains("backwards"), "{error}");

    // A sample whose sizes do not add up is a bad sample naming the shard and the sample (in
    // a set without labels: a labelled one reads each sample's label at open, which refuses
    // it there).
    let unlabelled = temp.path().join("unlabelled");
    let rows_unlabelled: Vec<Vec<Vec<u8>>> = rows.iter().map(|row| row[..2].to_vec()).collect();
    write_mds(&unlabelled, &columns[..2], &rows_unlabelled, 4, None).unwrap();
    let shard = unlabelled.join("shard.00001.mds");
    let mut sized = std::fs::read(&shard).unwrap();
    let first = u32::from_le_bytes([sized[4], sized[5], sized[6], sized[7]]) as usize;
    sized[first..first + 4].copy_from_slice(&1000u32.to_le_bytes());
    std::fs::write(&shard, &sized).unwrap();
    let dataset = open(&unlabelled, &MdsOptions::default(), temp.path()).unwrap();
    let error = dataset.read(4).unwrap_err();
    assert_eq!(
        error.read_fault(),
        crate::error::ReadFault::Sample,
        "{error}"
    );
    assert!(
        error.to_string().contains("shard.00001.mds: sample 0"),
        "{error}"
    );

    // A damaged compressed shard names itself.
    let zipped = temp.path().join("zipped");
    write_mds(&zipped, &columns, &rows, 4, Some("zstd")).unwrap();
    std::fs::write(
        zipped.join("shard.00002.mds.zstd"),
        b"\x28\xb5\x2f\xfdgarbage",
    )
    .unwrap();
    let error = open(&zipped, &MdsOptions::default(), &temp.path().join("c"))
        .unwrap_err()
        .to_string();
    assert!(error.contains("shard.00002.mds.zstd"), "{error}");

    // An index of another format, or naming a file outside the folder.
    let index = dir.join(MDS_INDEX_FILE);
    let text = std::fs::read_to_string(&index).unwrap();
    std::fs::write(&index, text.replace("\"mds\"", "\"jsonl\"")).unwrap();
    assert!(!looks_like_mds(&dir));
    let error = open(&dir, &MdsOptions::default(), temp.path())
        .unwrap_err()
        .to_string();
    assert!(error.contains("MDS version 2 is read"), "{error}");
    std::fs::write(
        &index,
        text.replace("shard.00000.mds", "../shard.00000.mds"),
    )
    .unwrap();
    let error = open(&dir, &MdsOptions::default(), temp.path())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("not a file name inside the folder"),
        "{error}"
    );
    for outside in [
        "/tmp/shard.00000.mds",
        "./shard.00000.mds",
        "a/../../shard.00000.mds",
    ] {
        std::fs::write(&index, text.replace("shard.00000.mds", outside)).unwrap();
        let error = open(&dir, &MdsOptions::default(), temp.path())
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("not a file name inside the folder"),
            "{outside}: {error}"
        );
    }
}

/// Streaming's `merge_index` over sets converted in parts names each shard by its part's
/// folder (`0/shard.00000.mds`): read as the whole set.
#[test]
fn a_merged_index_names_shards_in_subfolders() {
    let temp = tempfile::tempdir().unwrap();
    let (columns, rows) = samples();
    let whole = temp.path().join("whole");
    write_mds(&whole, &columns, &rows, 4, None).unwrap();
    let merged = temp.path().join("merged");
    std::fs::create_dir_all(merged.join("0")).unwrap();
    let index = std::fs::read_to_string(whole.join(MDS_INDEX_FILE)).unwrap();
    for shard in ["shard.00000.mds", "shard.00001.mds", "shard.00002.mds"] {
        std::fs::copy(whole.join(shard), merged.join("0").join(shard)).unwrap();
    }
    let index = index.replace("\"shard.", "\"0/shard.");
    std::fs::write(merged.join(MDS_INDEX_FILE), index).unwrap();
    let cache = temp.path().join("cache");
    let dataset = open(&merged, &MdsOptions::default(), &cache).unwrap();
    assert_eq!(dataset.len(), 10);
    assert_eq!(dataset.read(7).unwrap(), vec![7; 10]);
}

/// `ids` as Streaming's `ndarray` encoding writes an array of them: the dtype's code unless the
/// encoding names the dtype, a one-axis shape header unless it names the shape, the values
/// (each `size` bytes, little-endian).
fn ndarray(ids: &[i64], code: u8, size: usize, dtype_named: bool, shape_named: bool) -> Vec<u8> {
    let mut bytes = Vec::new();
    if !dtype_named {
        bytes.push(code);
    }
    if !shape_named {
        match u8::try_from(ids.len()) {
            Ok(count) => bytes.extend([1 << 2, count]),
            Err(_) => {
                bytes.push((1 << 2) | 1);
                bytes.extend_from_slice(&(ids.len() as u16).to_le_bytes());
            }
        }
    }
    for id in ids {
        bytes.extend_from_slice(&id.to_le_bytes()[..size]);
    }
    bytes
}

fn token_windows(seq_len: u32, document_boundaries: bool) -> MdsTokenWindows {
    MdsTokenWindows {
        seq_len,
        document_boundaries,
        ..MdsTokenWindows::default()
    }
}

fn tokens_only() -> MdsOptions {
    MdsOptions {
        tokens_only: true,
        ..MdsOptions::default()
    }
}

/// Documents of 3, 1, 5, 2 and 4 ids: 15 ids in all.
fn documents() -> Vec<Vec<i64>> {
    let lengths = [3, 1, 5, 2, 4];
    let mut next = 0;
    lengths
        .iter()
        .map(|&length| {
            let document = (next..next + length).map(|id| id * 1000).collect();
            next += length;
            document
        })
        .collect()
}

#[test]
fn ndarray_token_columns_are_cut_into_windows_with_each_sample_a_document() {
    let temp = tempfile::tempdir().unwrap();
    let cache = ObjectCacheOptions::new(temp.path().join("cache"));
    let ids: Vec<i64> = documents().into_iter().flatten().collect();
    // The encodings LLM Foundry and others write: the dtype named (uint32, int64) or in each
    // sample's first byte, the shape in each sample or named in the encoding.
    let layouts = [
        ("ndarray:uint32", 32, 4, true, false, TokenDtype::Uint32),
        ("ndarray", 65, 8, false, false, TokenDtype::Uint32),
        ("ndarray:int64", 65, 8, true, false, TokenDtype::Uint32),
    ];
    for (encoding, code, size, dtype_named, shape_named, dtype) in layouts {
        let dir = temp.path().join(encoding.replace(':', "-"));
        let rows: Vec<Vec<Vec<u8>>> = documents()
            .iter()
            .map(|document| {
                vec![
                    b"text".to_vec(),
                    ndarray(document, code, size, dtype_named, shape_named),
                ]
            })
            .collect();
        let columns = vec![
            column("text", "str", None),
            column("tokens", encoding, None),
        ];
        write_mds(&dir, &columns, &rows, 2, Some("zstd")).unwrap();
        let dataset = open(&dir, &tokens_only(), &cache.dir).unwrap();
        // Twice: the second reads the copy the first wrote.
        for _ in 0..2 {
            let windows = dataset
                .token_windows(&token_windows(4, true), &cache)
                .unwrap();
            assert_eq!(windows.dtype(), dtype, "{encoding}");
            assert_eq!(windows.tokens(), 15);
            assert_eq!(windows.len(), 3);
            for window in 0..3u64 {
                let expected: Vec<u8> = ids[window as usize * 4..window as usize * 4 + 5]
                    .iter()
                    .flat_map(|&id| (id as u32).to_le_bytes())
                    .collect();
                assert_eq!(windows.read(window).unwrap(), expected, "{encoding}");
            }
            assert_eq!(windows.document_starts(), Some(&[0, 3, 4, 9, 11][..]));
        }
    }

    // A named shape and uint16 ids: uint16 windows, unless uint32 is asked for.
    let dir = temp.path().join("fixed");
    let rows: Vec<Vec<Vec<u8>>> = (0..6i64)
        .map(|k| vec![ndarray(&[k, k + 100, 65_535], 16, 2, true, true)])
        .collect();
    write_mds(
        &dir,
        &[column("input_ids", "ndarray:uint16:3", Some(6))],
        &rows,
        4,
        None,
    )
    .unwrap();
    let dataset = open(&dir, &tokens_only(), &cache.dir).unwrap();
    let windows = dataset
        .token_windows(&token_windows(8, false), &cache)
        .unwrap();
    assert_eq!(windows.dtype(), TokenDtype::Uint16);
    assert_eq!(windows.tokens(), 18);
    assert_eq!(windows.document_starts(), None);
    assert_eq!(
        windows.read(1).unwrap(),
        [65_535i64, 3, 103, 65_535, 4, 104, 65_535, 5, 105]
            .iter()
            .flat_map(|&id| (id as u16).to_le_bytes())
            .collect::<Vec<u8>>()
    );
    let wide = MdsTokenWindows {
        dtype: Some(TokenDtype::Uint32),
        ..token_windows(8, false)
    };
    assert_eq!(
        dataset.token_windows(&wide, &cache).unwrap().dtype(),
        TokenDtype::Uint32
    );
    // Sample reads are refused on a dataset opened for its tokens.
    let error = dataset.read(0).unwrap_err().to_string();
    assert!(error.contains("opened for token windows"), "{error}");
}

#[test]
fn token_ids_that_do_not_fit_and_arrays_of_floats_are_errors_naming_the_sample() {
    let temp = tempfile::tempdir().unwrap();
    let cache = ObjectCacheOptions::new(temp.path().join("cache"));
    // A negative id in the second shard's first sample.
    let dir = temp.path().join("negative");
    let rows: Vec<Vec<Vec<u8>>> = [vec![1, 2], vec![3, 4], vec![5, -6]]
        .iter()
        .map(|ids| vec![ndarray(ids, 65, 8, true, false)])
        .collect();
    write_mds(
        &dir,
        &[column("tokens", "ndarray:int64", None)],
        &rows,
        2,
        None,
    )
    .unwrap();
    let dataset = open(&dir, &tokens_only(), &cache.dir).unwrap();
    let error = dataset
        .token_windows(&token_windows(2, false), &cache)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("shard.00001.mds") && error.contains("sample 0: token -6"),
        "{error}"
    );
    // uint16 asked for ids past its range.
    let narrow = MdsTokenWindows {
        dtype: Some(TokenDtype::Uint16),
        ..token_windows(2, false)
    };
    let dir = temp.path().join("wide");
    let rows = vec![vec![ndarray(&[1, 70_000], 32, 4, true, false)]];
    write_mds(
        &dir,
        &[column("tokens", "ndarray:uint32", None)],
        &rows,
        2,
        None,
    )
    .unwrap();
    let dataset = open(&dir, &tokens_only(), &cache.dir).unwrap();
    let error = dataset
        .token_windows(&narrow, &cache)
        .unwrap_err()
        .to_string();
    assert!(error.contains("token 70000 does not fit uint16"), "{error}");

    // A shape that holds more values than the bytes: the sample named.
    let dir = temp.path().join("short");
    let mut damaged = ndarray(&[1, 2, 3], 32, 4, true, false);
    damaged[1] = 9;
    write_mds(
        &dir,
        &[column("tokens", "ndarray:uint32", None)],
        &[vec![damaged]],
        2,
        None,
    )
    .unwrap();
    let dataset = open(&dir, &tokens_only(), &cache.dir).unwrap();
    let error = dataset
        .token_windows(&token_windows(1, false), &cache)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("sample 0: column tokens: its shape holds 9 values but its bytes 3"),
        "{error}"
    );

    // Float arrays and other columns are refused at the pick, naming the column.
    let dir = temp.path().join("floats");
    let rows = vec![vec![ndarray(&[0], 34, 4, true, false), b"x".to_vec()]];
    let columns = [
        column("tokens", "ndarray:float32", None),
        column("text", "str", None),
    ];
    write_mds(&dir, &columns, &rows, 2, None).unwrap();
    let dataset = open(&dir, &tokens_only(), &cache.dir).unwrap();
    let error = dataset
        .token_windows(&token_windows(1, false), &cache)
        .unwrap_err()
        .to_string();
    assert!(error.contains("has no integer ndarray column"), "{error}");
    let named = MdsTokenWindows {
        column: Some("text".into()),
        ..token_windows(1, false)
    };
    let error = dataset
        .token_windows(&named, &cache)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("token column \"text\" is encoded str"),
        "{error}"
    );
}

#[test]
fn uint8_ndarray_images_become_pnm_and_other_arrays_are_bad_samples() {
    let temp = tempfile::tempdir().unwrap();
    // The shape named by the encoding: [height 2, width 1, 3 channels].
    let dir = temp.path().join("named");
    let rows = vec![vec![vec![1, 2, 3, 4, 5, 6], b"3".to_vec()]];
    let columns = [
        column("pixels", "ndarray:uint8:2,1,3", Some(6)),
        column("label", "str_int", None),
    ];
    write_mds(&dir, &columns, &rows, 4, None).unwrap();
    let named = MdsOptions {
        sample_column: Some("pixels".into()),
        ..MdsOptions::default()
    };
    let dataset = open(&dir, &named, temp.path()).unwrap();
    assert_eq!(
        dataset.read(0).unwrap(),
        b"P6\n1 2\n255\n\x01\x02\x03\x04\x05\x06"
    );

    // Dtype and shape in each sample (an `image` column, picked by its name): a [1, 2] gray
    // image, a uint16 array, a [1, 1, 4] array and one whose shape wants more values.
    let dynamic = |code: u8, shape: &[u8], values: &[u8]| {
        let mut bytes = vec![code, (shape.len() as u8) << 2];
        bytes.extend_from_slice(shape);
        bytes.extend_from_slice(values);
        bytes
    };
    let dir = temp.path().join("dynamic");
    let rows = vec![
        vec![dynamic(8, &[1, 2], &[7, 8])],
        vec![dynamic(16, &[1, 1], &[7, 8])],
        vec![dynamic(8, &[1, 1, 4], &[1, 2, 3, 4])],
        vec![dynamic(8, &[2, 2], &[1, 2, 3])],
    ];
    write_mds(&dir, &[column("image", "ndarray", None)], &rows, 4, None).unwrap();
    let dataset = open(&dir, &MdsOptions::default(), temp.path()).unwrap();
    assert_eq!(dataset.read(0).unwrap(), b"P5\n2 1\n255\n\x07\x08");
    for (k, problem) in [
        (1, "an array of uint16 of shape [1, 1] is no image"),
        (2, "an array of uint8 of shape [1, 1, 4] is no image"),
        (3, "its shape holds 4 values but its bytes 3"),
    ] {
        let error = dataset.read(k).unwrap_err().to_string();
        assert!(
            error.contains(&format!(
                "shard.00000.mds: sample {k}: column image: {problem}"
            )),
            "{error}"
        );
    }
}

/// A set converted again while it is open (samples of fixed sizes, in another order: the same
/// shard sizes), its shard copied over the old one by a rename: read at the offsets found at
/// open, its samples were other images under the labels read then, or bad samples replaced.
/// The job stops, naming the file. A shard only touched reads on.
#[test]
fn a_shard_rewritten_under_the_open_dataset_is_refused_by_name() {
    let temp = tempfile::tempdir().unwrap();
    let columns = vec![
        column("image", "jpeg", Some(4)),
        column("label", "int", Some(8)),
    ];
    let rows = |order: &dyn Fn(u8) -> u8| -> Vec<Vec<Vec<u8>>> {
        (0..8u8)
            .map(|k| {
                vec![
                    vec![order(k); 4],
                    i64::from(order(k)).to_le_bytes().to_vec(),
                ]
            })
            .collect()
    };
    let dir = temp.path().join("set");
    write_mds(&dir, &columns, &rows(&|k| k), 4, None).unwrap();
    let dataset = open(&dir, &MdsOptions::default(), &temp.path().join("cache")).unwrap();
    assert_eq!(dataset.read(1).unwrap(), vec![1; 4]);
    let shard = dir.join("shard.00000.mds");
    let before = std::fs::read(&shard).unwrap();
    let again = temp.path().join("again");
    write_mds(&again, &columns, &rows(&|k| 7 - k), 4, None).unwrap();
    let rewritten = std::fs::read(again.join("shard.00000.mds")).unwrap();
    assert_eq!(rewritten.len(), before.len());
    // Touched (its modification time only): the same file.
    let file = std::fs::File::options().write(true).open(&shard).unwrap();
    file.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(60))
        .unwrap();
    drop(file);
    FilePool::global().forget(dataset.pool_keys.clone());
    assert_eq!(dataset.read(1).unwrap(), vec![1; 4]);
    // Another file renamed over it, as rsync puts a new version in place; the pool opens it
    // again once it has closed the old one.
    let beside = dir.join("shard.00000.mds.new");
    std::fs::write(&beside, &rewritten).unwrap();
    std::fs::rename(&beside, &shard).unwrap();
    FilePool::global().forget(dataset.pool_keys.clone());
    let error = dataset.read(1).unwrap_err();
    assert_eq!(
        error.read_fault(),
        crate::error::ReadFault::Source,
        "{error}"
    );
    assert!(error.to_string().contains("shard.00000.mds"), "{error}");
}
