use super::*;
use crate::sample_source::SampleSource;

fn documents() -> Vec<Vec<u32>> {
    vec![vec![1, 2, 3], vec![40_000, 5], vec![6, 7, 8, 9], vec![10]]
}

#[test]
fn a_written_corpus_reads_back_with_its_dtype_and_document_starts() {
    let dir = tempfile::tempdir().unwrap();
    for dtype in [TokenDtype::Uint16, TokenDtype::Uint32] {
        let prefix = dir.path().join(format!("corpus_{}", dtype.name()));
        let (bin, idx) = write_megatron_corpus(&prefix, &documents(), dtype).unwrap();
        let index = MegatronIndex::read(&idx).unwrap();
        assert_eq!(index.dtype, dtype);
        assert_eq!(index.tokens(), 10);
        assert_eq!(index.documents(), 4);
        assert_eq!(index.document_starts(), [0, 3, 5, 9, 10]);
        // The .bin, the .idx and the prefix name the same corpus.
        for name in [&bin, &idx, &prefix] {
            let (tokens, _) = open_megatron(name, None, 4).unwrap();
            assert_eq!(tokens.dtype(), dtype);
            assert_eq!(
                tokens.len(),
                2,
                "windows of 5 sharing a token: (10 - 1) / 4"
            );
            let window = tokens.read(1).unwrap();
            let ids: Vec<u32> = match dtype {
                TokenDtype::Uint16 => window
                    .chunks_exact(2)
                    .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]])))
                    .collect(),
                TokenDtype::Uint32 => window
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            };
            assert_eq!(ids, [5, 6, 7, 8, 9]);
        }
        let other = match dtype {
            TokenDtype::Uint16 => TokenDtype::Uint32,
            TokenDtype::Uint32 => TokenDtype::Uint16,
        };
        let error = open_megatron(&bin, Some(other), 4)
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains(&idx.display().to_string()), "{error}");
    }
}

#[test]
fn a_truncated_index_and_a_short_bin_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("corpus");
    let (bin, idx) = write_megatron_corpus(&prefix, &documents(), TokenDtype::Uint16).unwrap();
    let whole = std::fs::read(&idx).unwrap();
    for keep in [0, 5, 20, whole.len() - 1] {
        let error = MegatronIndex::parse(&whole[..keep], &idx)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(&idx.display().to_string()) && error.contains("truncated"),
            "{keep}: {error}"
        );
    }
    let data = std::fs::read(&bin).unwrap();
    std::fs::write(&bin, &data[..data.len() - 2]).unwrap();
    let error = open_megatron(&prefix, None, 4).err().unwrap().to_string();
    assert!(
        error.contains(&bin.display().to_string()) && error.contains("shorter"),
        "{error}"
    );
    let mut longer = data.clone();
    longer.extend_from_slice(&[0, 0]);
    std::fs::write(&bin, &longer).unwrap();
    let error = open_megatron(&prefix, None, 4).err().unwrap().to_string();
    assert!(error.contains("longer"), "{error}");
}

#[test]
fn an_index_that_contradicts_itself_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("corpus");
    let (_, idx) = write_megatron_corpus(&prefix, &documents(), TokenDtype::Uint16).unwrap();
    let whole = std::fs::read(&idx).unwrap();
    let header = 9 + 8 + 1 + 8 + 8;
    let cases: [(usize, &[u8], &str); 5] = [
        (0, b"NOTMEGAT", "not a Megatron index"),
        (9, &2u64.to_le_bytes(), "version 2"),
        (17, &[7], "float32"),
        // The second sequence's pointer off by one token.
        (header + 4 * 4 + 8, &8i64.to_le_bytes(), "starts at byte 8"),
        // A document index that ends before the last sequence.
        (whole.len() - 8, &3i64.to_le_bytes(), "document index"),
    ];
    for (at, bytes, expected) in cases {
        let mut changed = whole.clone();
        changed[at..at + bytes.len()].copy_from_slice(bytes);
        let error = MegatronIndex::parse(&changed, &idx)
            .unwrap_err()
            .to_string();
        assert!(error.contains(expected), "{expected}: {error}");
    }
    // Counts no file could hold are refused before any allocation.
    let mut huge = whole[..header].to_vec();
    huge[18..26].copy_from_slice(&u64::MAX.to_le_bytes());
    let error = MegatronIndex::parse(&huge, &idx).unwrap_err().to_string();
    assert!(error.contains("sequence lengths"), "{error}");
}

/// An index past the 2 GiB read (a sparse file here) is refused before it is read, saying
/// what to do.
#[test]
fn an_index_past_the_read_is_refused_naming_the_remedy() {
    let dir = tempfile::tempdir().unwrap();
    let (_, idx) =
        write_megatron_corpus(&dir.path().join("big"), &documents(), TokenDtype::Uint16).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&idx)
        .unwrap()
        .set_len(MAX_INDEX_BYTES + 1)
        .unwrap();
    let message = MegatronIndex::read(&idx).unwrap_err().to_string();
    assert!(
        message.contains("over the 2147483648 read") && message.contains("stoker.megatron_blend"),
        "{message}"
    );
}
