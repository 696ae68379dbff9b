//! Token files: windows of seq_len + 1 tokens, both dtypes, the file-name rule, bad files.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use stoker_datasets::{
    looks_like_token_file, write_synthetic_tokens, Error, SampleSource, SyntheticTokensSpec,
    TokenDtype, TokenError, TokenFile,
};

fn write_u16(path: &Path, tokens: impl Iterator<Item = u16>) {
    let bytes: Vec<u8> = tokens.flat_map(u16::to_le_bytes).collect();
    std::fs::write(path, bytes).unwrap();
}

fn as_u16(bytes: &[u8]) -> Vec<u16> {
    bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

#[test]
fn windows_overlap_by_one_token_and_drop_the_incomplete_tail() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.bin");
    // 0..=22: 23 tokens, seq_len 4 -> windows start at 0, 4, 8, 12, 16; (23 - 1) / 4 = 5.
    write_u16(&path, 0..23);
    let file = TokenFile::open(&path, TokenDtype::Uint16, 4).unwrap();
    assert_eq!(file.len(), 5);
    assert_eq!(file.tokens(), 23);
    for window in 0..5u16 {
        let tokens = as_u16(&file.read(u64::from(window)).unwrap());
        let start = window * 4;
        assert_eq!(tokens, (start..start + 5).collect::<Vec<_>>());
    }
    assert!(matches!(
        file.read(5),
        Err(Error::IndexOutOfRange { index: 5, len: 5 })
    ));
    assert_eq!(file.describe(1), format!("{}:tokens[4..9)", path.display()));
    // Exactly one more token makes one more window: 25 tokens -> (25 - 1) / 4 = 6.
    write_u16(&path, 0..25);
    assert_eq!(
        TokenFile::open(&path, TokenDtype::Uint16, 4).unwrap().len(),
        6
    );
}

#[test]
fn uint32_files_read_four_bytes_per_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.u32.bin");
    let tokens: Vec<u32> = (0..11).map(|t| t * 100_000).collect();
    std::fs::write(
        &path,
        tokens
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect::<Vec<_>>(),
    )
    .unwrap();
    assert_eq!(TokenDtype::from_file_name(&path), TokenDtype::Uint32);
    let file = TokenFile::open(&path, TokenDtype::Uint32, 5).unwrap();
    assert_eq!(file.len(), 2);
    let window: Vec<u32> = file
        .read(1)
        .unwrap()
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(window, tokens[5..11]);
    assert_eq!(file.report().unwrap().max_token, 1_000_000);
}

#[test]
fn odd_sized_and_short_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join("odd.bin");
    std::fs::write(&odd, [1u8, 0, 2, 0, 3]).unwrap();
    let error = TokenFile::open(&odd, TokenDtype::Uint16, 1).err().unwrap();
    assert!(
        matches!(
            error,
            Error::Tokens(TokenError::TokenFileSize { bytes: 5, .. })
        ),
        "{error}"
    );
    assert!(error.to_string().contains("not a multiple"), "{error}");
    // 6 bytes are 3 uint16 tokens but not a whole number of uint32 ones.
    let six = dir.path().join("six.bin");
    std::fs::write(&six, [0u8; 6]).unwrap();
    assert!(TokenFile::open(&six, TokenDtype::Uint16, 2).is_ok());
    assert!(matches!(
        TokenFile::open(&six, TokenDtype::Uint32, 1),
        Err(Error::Tokens(TokenError::TokenFileSize { .. }))
    ));
    assert!(matches!(
        TokenFile::open(&six, TokenDtype::Uint16, 3),
        Err(Error::Tokens(TokenError::TokenFileTooShort {
            tokens: 3,
            window: 4,
            ..
        }))
    ));
    let empty = dir.path().join("empty.bin");
    std::fs::write(&empty, []).unwrap();
    assert!(matches!(
        TokenFile::open(&empty, TokenDtype::Uint16, 3),
        Err(Error::Tokens(TokenError::TokenFileTooShort {
            tokens: 0,
            ..
        }))
    ));
    assert!(matches!(
        TokenFile::open(&dir.path().join("missing.bin"), TokenDtype::Uint16, 3),
        Err(Error::RootNotFound(_))
    ));
    assert!(TokenFile::open(&six, TokenDtype::Uint16, 0).is_err());
}

#[test]
fn synthetic_token_files_are_seeded_and_within_the_vocabulary() {
    let dir = tempfile::tempdir().unwrap();
    let spec = SyntheticTokensSpec {
        tokens: 10_000,
        vocab: 50_257,
        dtype: TokenDtype::Uint16,
        seed: 3,
    };
    let (a, b, c) = (
        dir.path().join("a.bin"),
        dir.path().join("b.bin"),
        dir.path().join("c.bin"),
    );
    write_synthetic_tokens(&a, &spec).unwrap();
    write_synthetic_tokens(&b, &spec).unwrap();
    write_synthetic_tokens(&c, &SyntheticTokensSpec { seed: 4, ..spec }).unwrap();
    let bytes = std::fs::read(&a).unwrap();
    assert_eq!(bytes.len(), 20_000);
    assert_eq!(bytes, std::fs::read(&b).unwrap());
    assert_ne!(bytes, std::fs::read(&c).unwrap());
    let ids = as_u16(&bytes);
    assert!(ids.iter().all(|&t| u32::from(t) < 50_257));
    assert!(
        ids.iter().any(|&t| t > 40_000),
        "ids spread over the vocabulary"
    );
    assert!(looks_like_token_file(&a));
    assert!(!looks_like_token_file(dir.path()));
    let too_big = SyntheticTokensSpec {
        vocab: 70_000,
        ..spec
    };
    assert!(write_synthetic_tokens(&a, &too_big).is_err());
}

/// Another process cuts the file to `bytes` while a job reads it.
fn cut(path: &Path, bytes: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(bytes)
        .unwrap();
}

fn assert_changed(read: stoker_datasets::Result<()>, path: &Path) {
    let error = read.unwrap_err();
    assert!(
        matches!(
            error,
            Error::FileChanged {
                opened_len: 200_002,
                ..
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains(&path.display().to_string()));
    assert_eq!(error.read_fault(), stoker_datasets::ReadFault::Source);
}

/// 100,001 tokens (200,002 bytes, many pages), windows of 10 + 1: token `t` is `t % 60,000`.
fn mapped_token_file(dir: &Path) -> (std::path::PathBuf, TokenFile) {
    let path = dir.join("train.bin");
    write_u16(&path, (0..100_001u32).map(|t| (t % 60_000) as u16));
    let file = TokenFile::open(&path, TokenDtype::Uint16, 10).unwrap();
    assert!(file.is_mapped(), "windows come out of a memory map");
    assert_eq!(file.len(), 10_000);
    (path, file)
}

#[test]
fn a_file_truncated_after_opening_is_an_error_naming_it_not_a_signal() {
    let dir = tempfile::tempdir().unwrap();
    let (path, file) = mapped_token_file(dir.path());
    let mut window = vec![0u8; file.window_bytes()];
    file.read_into(9_999, &mut window).unwrap();
    let expected: Vec<u16> = (99_990..100_001u32).map(|t| (t % 60_000) as u16).collect();
    assert_eq!(as_u16(&window), expected);

    // Cut to 4,096 tokens (two pages of 4 KiB): window 5 still lies wholly in the file.
    cut(&path, 8_192);
    file.read_into(5, &mut window).unwrap();
    assert_eq!(as_u16(&window), (50..61).collect::<Vec<_>>());
    // A window past the cut faults in the map: an error, and the process lives on.
    assert_changed(file.read(9_000).map(drop), &path);
    // From then on every window errors, those still in the file too.
    assert_changed(file.read_into(5, &mut window), &path);
    assert_changed(file.read_into(9_999, &mut window), &path);
    assert!(matches!(file.report(), Err(Error::FileChanged { .. })));
}

#[test]
fn a_window_in_the_page_holding_the_new_end_is_an_error_not_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let (path, file) = mapped_token_file(dir.path());
    // Cut to 3,500 tokens: bytes 7,000..8,192 of that page now read as zeros without a fault.
    cut(&path, 7_000);
    let mut window = vec![0u8; file.window_bytes()];
    // Window 360 holds tokens 3,600..3,611 (bytes 7,200..7,222).
    assert_changed(file.read_into(360, &mut window), &path);
}
