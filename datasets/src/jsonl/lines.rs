//! One JSONL file's line index: its non-blank lines found once at open by a `memchr` scan of
//! the file read in chunks, and one line read back by a positioned read on a pooled file (a
//! file cut short since is an error naming it).

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::file_pool::{failed_for_descriptors, FileKey, FilePool, PooledFile};
use crate::same_file::SameFile;
use crate::storage::{self, CachedObject, Remake};

use super::lenient::BOM;

/// One indexed line.
#[derive(Debug, Clone, Copy)]
pub(super) struct LineRef {
    /// Byte offset of the line in its file.
    pub(super) start: u64,
    /// Length without the line ending.
    pub(super) len: u32,
    /// 1-based line number, for errors.
    pub(super) line: u32,
}

/// One JSONL file's line index.
pub(super) struct JsonlFile {
    /// The file as the user named it (the compressed one, when compressed), for messages.
    pub(super) path: PathBuf,
    /// The file read: `path`, or its decompressed copy.
    pub(super) read_from: PathBuf,
    /// The file's length when it was indexed.
    pub(super) bytes: u64,
    /// The file read as it was indexed: each read refuses another one in its place, or the
    /// file cut (lines appended are left unread).
    same: SameFile,
    pub(super) lines: Vec<LineRef>,
    /// The copy in the cache tier (decompressed, or an object's): locked while the file is
    /// indexed, then let go of (a derived copy's room under the cap kept).
    _copy: Option<CachedObject>,
    /// How the copy is made or fetched again once evicted (`storage/remake.rs`).
    remake: Option<Remake>,
}

/// The line being scanned at open.
struct LineScan {
    start: u64,
    /// Whitespace so far, after a byte-order mark if the line opens with one (a line of a mark
    /// alone is blank, as a reader of the text sees it).
    blank: bool,
    /// How many of the line's bytes so far are the byte-order mark's first ones; more than
    /// the mark's length once the line is past where one may stand.
    mark: usize,
    ends_with_cr: bool,
    number: u32,
}

impl LineScan {
    fn take(&mut self, bytes: &[u8]) {
        let Some(last) = bytes.last() else {
            return;
        };
        self.ends_with_cr = *last == b'\r';
        for &byte in bytes {
            if !self.blank {
                break;
            }
            if BOM.get(self.mark) == Some(&byte) {
                self.mark += 1;
                continue;
            }
            // Bytes of a mark cut short are no whitespace.
            let cut_short = self.mark_cut_short();
            self.mark = BOM.len() + 1;
            self.blank = !cut_short && byte.is_ascii_whitespace();
        }
    }

    /// Whether the line so far is part of a byte-order mark, no whole one.
    fn mark_cut_short(&self) -> bool {
        (1..BOM.len()).contains(&self.mark)
    }

    /// Ends the line at byte `end` (its newline or the end of the file).
    fn finish(&mut self, end: u64, path: &Path, lines: &mut Vec<LineRef>) -> Result<()> {
        self.number = self
            .number
            .checked_add(1)
            .ok_or_else(|| Error::TooLarge(path.to_path_buf()))?;
        // A line cut short inside a mark is no blank line but a bad document.
        if !self.blank || self.mark_cut_short() {
            let len = end - self.start - u64::from(self.ends_with_cr);
            let len = u32::try_from(len).map_err(|_| Error::MalformedRecord {
                path: path.to_path_buf(),
                line: u64::from(self.number),
                reason: "line longer than 4 GiB".into(),
            })?;
            lines.push(LineRef {
                start: self.start,
                len,
                line: self.number,
            });
        }
        self.start = end + 1;
        self.blank = true;
        self.mark = 0;
        self.ends_with_cr = false;
        Ok(())
    }
}

impl JsonlFile {
    /// Indexes `path`, reading it from `copy` (its decompressed copy) when given; a copy that
    /// `remake` can make again is let go of once indexed.
    pub(super) fn open(
        path: PathBuf,
        mut copy: Option<CachedObject>,
        remake: Option<Remake>,
    ) -> Result<JsonlFile> {
        const CHUNK: usize = 1 << 20;
        let read_from = copy
            .as_ref()
            .map_or_else(|| path.clone(), |copy| copy.path().to_path_buf());
        let mut file = File::open(&read_from).map_err(|source| Error::io(&path, source))?;
        let mut chunk = vec![0u8; CHUNK];
        let mut lines = Vec::new();
        let mut scan = LineScan {
            start: 0,
            blank: true,
            mark: 0,
            ends_with_cr: false,
            number: 0,
        };
        let mut offset = 0u64;
        loop {
            let filled = match file.read(&mut chunk) {
                Ok(0) => break,
                Ok(filled) => filled,
                Err(source) if source.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(source) => return Err(Error::io(&path, source)),
            };
            let bytes = &chunk[..filled];
            let mut segment_start = 0;
            for newline in memchr::memchr_iter(b'\n', bytes) {
                scan.take(&bytes[segment_start..newline]);
                scan.finish(offset + newline as u64, &path, &mut lines)?;
                segment_start = newline + 1;
            }
            scan.take(&bytes[segment_start..]);
            offset += filled as u64;
        }
        scan.finish(offset, &path, &mut lines)?;
        let same = SameFile::of_file(&file, &path)?;
        if let (Some(copy), Some(_)) = (&mut copy, &remake) {
            copy.release_lock();
        }
        Ok(JsonlFile {
            path,
            read_from,
            bytes: offset,
            same,
            lines,
            _copy: copy,
            remake,
        })
    }

    /// The file opened again to read it: `read_from`, or, when that copy was evicted from the
    /// cache tier, the copy made again from its file as it was when the set was opened
    /// ([`Remake::open_again`]: a file changed since, lines appended included, or an object
    /// rewritten, stops the job, naming it).
    fn open_again(&self) -> Result<File> {
        storage::open_again(self.remake.as_ref(), &self.path, &self.read_from)
    }

    /// Refuses `file` (opened again by its path) when it is not the file indexed: see
    /// [`SameFile::check_appended`]; a copy that can be made again is checked by its length
    /// ([`Remake::check_copy`]).
    fn check_unchanged(&self, file: &File) -> Result<()> {
        match self.remake {
            Some(_) => Remake::check_copy(file, &self.read_from, self.same.len()),
            None => self.same.check_appended(file, &self.path),
        }
    }

    /// The bytes of `line`, read from the file of pool key `key`.
    pub(super) fn line(&self, pool: &FilePool, key: FileKey, line: LineRef) -> Result<Vec<u8>> {
        let opened = pool.get_or_open(
            key,
            || self.open_again().map(PooledFile::plain),
            failed_for_descriptors,
        )?;
        // The pool opens it again by its path once it let it go: a file renamed over it
        // would give other documents' bytes at the offsets indexed. Lines appended since
        // leave those as they were.
        self.check_unchanged(&opened.file)?;
        if u64::from(line.len) > crate::MAX_SAMPLE_BYTES {
            return Err(Error::SampleTooLarge {
                what: format!("{}:{}", self.path.display(), line.line),
                bytes: u64::from(line.len),
            });
        }
        let mut bytes = vec![0u8; line.len as usize];
        match opened.file.read_exact_at(&mut bytes, line.start) {
            Ok(()) => Ok(bytes),
            Err(source) if source.kind() == std::io::ErrorKind::UnexpectedEof => {
                Err(Error::FileChanged {
                    path: self.path.clone(),
                    opened_len: self.bytes,
                    end: line.start + u64::from(line.len),
                })
            }
            Err(source) => Err(Error::io(&self.path, source)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::compressed::Compression;
    use super::*;
    use crate::storage::{DerivedSource, ObjectCacheOptions};

    /// A file renamed over the indexed one, same length, other documents, read once the pool
    /// opens it again by its path (it let it go for others): refused, where before the other
    /// file's lines came back under the offsets and labels indexed.
    #[test]
    fn a_file_replaced_under_the_index_is_refused_when_opened_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.jsonl");
        std::fs::write(&path, "{\"text\": \"first\"}\n{\"text\": \"again\"}\n").unwrap();
        let file = JsonlFile::open(path.clone(), None, None).unwrap();
        let pool = FilePool::with_budget(1);
        let key = pool.reserve_keys(1).start;
        let first = file.lines[0];
        assert_eq!(
            file.line(&pool, key, first).unwrap(),
            b"{\"text\": \"first\"}"
        );
        let other = dir.path().join("a.jsonl.new");
        std::fs::write(&other, "{\"text\": \"FIRST\"}\n{\"text\": \"AGAIN\"}\n").unwrap();
        std::fs::rename(&other, &path).unwrap();
        // Still held: the file indexed, read as it was.
        assert_eq!(
            file.line(&pool, key, first).unwrap(),
            b"{\"text\": \"first\"}"
        );
        pool.forget(key..key + 1);
        let error = file.line(&pool, key, first).unwrap_err();
        assert!(matches!(error, Error::FileReplaced { .. }), "{error:?}");
        assert!(error.dataset_changed() && error.to_string().contains("a.jsonl"));
    }

    /// A compressed file's copy in the cache tier is not held locked once indexed (a
    /// descriptor a file: a set of more files than the descriptor limit could not open):
    /// evicted, it is made again at the next read, the same lines; the file changed meanwhile
    /// (lines appended too: the copy would be made of other bytes) stops the read, naming it.
    #[test]
    fn a_compressed_files_copy_is_let_go_and_made_again_once_evicted() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.jsonl.gz");
        let gzip = |text: &str| {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            encoder.write_all(text.as_bytes()).unwrap();
            encoder.finish().unwrap()
        };
        std::fs::write(
            &path,
            gzip("{\"text\": \"first\"}\n{\"text\": \"again\"}\n"),
        )
        .unwrap();
        let options = ObjectCacheOptions::new(dir.path().join("cache"));
        let source = DerivedSource::new(&path, &options, "decompressed").unwrap();
        let remake = Compression::Gzip.remake(source, &path);
        let copy = remake.copy().unwrap();
        let file = JsonlFile::open(path.clone(), Some(copy), Some(remake)).unwrap();
        assert!(!file._copy.as_ref().unwrap().is_locked());
        let pool = FilePool::with_budget(1);
        let key = pool.reserve_keys(1).start;
        let (first, second) = (file.lines[0], file.lines[1]);
        // Evicted: the copy gone from the cache tier, the pooled file closed.
        let evict = || {
            pool.forget(key..key + 1);
            let _ = std::fs::remove_file(&file.read_from);
        };
        assert_eq!(
            file.line(&pool, key, first).unwrap(),
            b"{\"text\": \"first\"}"
        );
        evict();
        assert_eq!(
            file.line(&pool, key, second).unwrap(),
            b"{\"text\": \"again\"}"
        );
        // Lines appended to the file (another gzip member) while its copy is gone.
        evict();
        let mut source = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        source.write_all(&gzip("{\"text\": \"more\"}\n")).unwrap();
        drop(source);
        let error = file.line(&pool, key, first).unwrap_err();
        assert!(
            matches!(&error, Error::FileReplaced { path: named, .. } if *named == path),
            "{error:?}"
        );
    }

    /// An object's copy (plain or decompressed) was held locked while its set was open, a
    /// descriptor an object; let go of now, it is fetched (and decompressed) again once
    /// evicted, the same lines.
    #[test]
    fn an_objects_copy_is_let_go_and_fetched_again_once_evicted() {
        use crate::storage::{evict_all, OneObject};
        let text = b"{\"text\": \"first\"}\n{\"text\": \"again\"}\n";
        let plain = OneObject::new(text);
        let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gzip, text).unwrap();
        let compressed = OneObject::new(&gzip.finish().unwrap());
        let uri = PathBuf::from("s3://bucket/set/a.txt");
        let source = DerivedSource::of_object(compressed.object.clone(), "decompressed").unwrap();
        for (one, remake) in [
            (&plain, Remake::Fetched(plain.object.clone())),
            (&compressed, Compression::Gzip.remake(source, &uri)),
        ] {
            let copy = remake.copy().unwrap();
            let file = JsonlFile::open(uri.clone(), Some(copy), Some(remake)).unwrap();
            assert!(!file._copy.as_ref().unwrap().is_locked());
            let pool = FilePool::with_budget(1);
            let key = pool.reserve_keys(1).start;
            assert_eq!(
                file.line(&pool, key, file.lines[0]).unwrap(),
                b"{\"text\": \"first\"}"
            );
            pool.forget(key..key + 1);
            evict_all(&one.cache);
            assert!(!file.read_from.exists(), "evicted");
            assert_eq!(
                file.line(&pool, key, file.lines[1]).unwrap(),
                b"{\"text\": \"again\"}"
            );
        }
    }
}
