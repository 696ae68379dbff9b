use super::*;
use crate::sample_source::SampleSource;
use std::path::Path;

fn documents() -> Vec<Vec<u32>> {
    vec![vec![1, 2, 3], vec![40_000, 5], vec![6, 7, 8, 9], vec![10]]
}

#[test]
fn a_written_corpus_reads_back_with_its_dtype_and_document_starts() {
    let dir = tempfile::tempdir().unwrap();
    for dtype in [TokenDtype::Uint16, TokenDtype::Uint32] {
        let prefix = dir.path().join(format!("corpus_{}", dtype.name()));
        let (bin, idx) = write_megatron_corpus(&prefix, &documents(), dtype).unwrap();
        let index = MegatronIndex::read(&idx, true).unwrap();
        assert_eq!(index.dtype, dtype);
        assert_eq!(index.tokens(), 10);
        assert_eq!(index.documents(), 4);
        assert_eq!(index.document_starts(), Some(&[0, 3, 5, 9, 10][..]));
        assert_eq!(
            MegatronIndex::read(&idx, false).unwrap().document_starts(),
            None
        );
        // The .bin, the .idx and the prefix name the same corpus.
        for name in [&bin, &idx, &prefix] {
            let (tokens, _) = open_megatron(name, None, 4, false).unwrap();
            assert_eq!(tokens.document_starts(), None);
            let (tokens, index) = open_megatron(name, None, 4, true).unwrap();
            assert_eq!(tokens.document_starts(), Some(&[0, 3, 5, 9, 10][..]));
            assert_eq!(index.document_starts(), None, "handed to the windows");
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
        let error = open_megatron(&bin, Some(other), 4, false)
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
    let error = open_megatron(&prefix, None, 4, true)
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains(&bin.display().to_string()) && error.contains("shorter"),
        "{error}"
    );
    let mut longer = data.clone();
    longer.extend_from_slice(&[0, 0]);
    std::fs::write(&bin, &longer).unwrap();
    let error = open_megatron(&prefix, None, 4, true)
        .err()
        .unwrap()
        .to_string();
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

/// The index is read a chunk at a time: chunks of one, two and three elements cross the arrays'
/// ends and each other's, with empty documents (two starts at one sequence) and documents of
/// several sequences, and read what the whole read does; a contradiction in a later chunk is
/// found.
#[test]
fn an_index_read_in_chunks_reads_what_it_holds() {
    // Sequences of 3, 0, 2, 4, 1 and 5 tokens; documents starting at sequences 0, 2, 2, 3, 5.
    let lengths = [3i32, 0, 2, 4, 1, 5];
    let documents = [0i64, 2, 2, 3, 5, 6];
    let mut index = MEGATRON_INDEX_MAGIC.to_vec();
    index.extend_from_slice(&1u64.to_le_bytes());
    index.push(8);
    index.extend_from_slice(&(lengths.len() as u64).to_le_bytes());
    index.extend_from_slice(&(documents.len() as u64).to_le_bytes());
    lengths
        .iter()
        .for_each(|length| index.extend_from_slice(&length.to_le_bytes()));
    let mut pointer = 0i64;
    for length in lengths {
        index.extend_from_slice(&pointer.to_le_bytes());
        pointer += 2 * i64::from(length);
    }
    documents
        .iter()
        .for_each(|start| index.extend_from_slice(&start.to_le_bytes()));
    let path = Path::new("chunked.idx");
    let whole = MegatronIndex::parse(&index, path).unwrap();
    assert_eq!(whole.document_starts(), Some(&[0, 3, 3, 5, 10, 15][..]));
    assert_eq!(
        (whole.tokens(), whole.sequences(), whole.documents()),
        (15, 6, 5)
    );
    for chunk in 1..=3 {
        let read = MegatronIndex::read_from(&index::InMemory(&index), path, true, chunk).unwrap();
        assert_eq!(read, whole, "chunks of {chunk}");
        // The last sequence's pointer one token off.
        let mut changed = index.clone();
        let last_pointer = 34 + 4 * 6 + 8 * 5;
        changed[last_pointer..last_pointer + 8].copy_from_slice(&18i64.to_le_bytes());
        let error = MegatronIndex::read_from(&index::InMemory(&changed), path, false, chunk)
            .unwrap_err()
            .to_string();
        assert!(error.contains("sequence 5 starts at byte 18"), "{error}");
    }
}

/// An index over 2 GiB (a sparse file here, its arrays holes of zeros) opens from a local file
/// without being read whole: an index that large was refused before. Its holes are empty
/// sequences; every document but the last is empty too.
#[test]
fn an_index_over_two_gib_opens_from_its_file() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let (_, idx) =
        write_megatron_corpus(&dir.path().join("big"), &documents(), TokenDtype::Uint16).unwrap();
    let whole = std::fs::read(&idx).unwrap();
    // Past 2 GiB of 20-byte entries (a length, a pointer and a document start each).
    let sequences: u64 = (2 << 30) / 20 + 1;
    let header = 9 + 8 + 1;
    let len = header as u64 + 16 + sequences * 20 + 8;
    let file = std::fs::File::create(&idx).unwrap();
    file.set_len(len).unwrap();
    file.write_all_at(&whole[..header], 0).unwrap();
    file.write_all_at(&sequences.to_le_bytes(), header as u64)
        .unwrap();
    file.write_all_at(&(sequences + 1).to_le_bytes(), header as u64 + 8)
        .unwrap();
    // The document index: every start 0 (a hole) but the last, the sequence count.
    file.write_all_at(&sequences.to_le_bytes(), len - 8)
        .unwrap();
    drop(file);
    assert!(len > 2 << 30);
    let index = MegatronIndex::read(&idx, false).unwrap();
    assert_eq!(
        (index.tokens(), index.sequences(), index.documents()),
        (0, sequences, sequences)
    );
}
