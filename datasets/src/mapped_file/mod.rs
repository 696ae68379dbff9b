//! Data files read out of a read-only memory map, where a file cut short under a running job is
//! an error naming it ([`Error::FileChanged`]), never SIGBUS and never zeros passed off as data.
//!
//! Copying out of a map costs no system call per read, which is what token windows (a few KiB
//! each, hundreds of thousands a second) need; `pread` per window was a third slower. The cost
//! of a map is what happens when the file shrinks under it, and this module deals with both
//! ways that shows:
//!
//! - A page wholly past the new end faults (SIGBUS). The handler in `sigbus.rs` maps zeros over
//!   that page and marks the mapping changed; the read, which checks the mark after its copy,
//!   returns the error. A mapping once marked stays failed: every later read errors.
//! - The page holding the new end does not fault: its tail reads as zeros. So after each copy
//!   the reader also touches the page after the last one it read (a "probe"): that page lies
//!   wholly past the end exactly when the file now ends before it, so the probe faults, and
//!   the mark is set, whenever the copied pages could hold zeros that are not in the file.
//!   Reads that end in the file's final page have no page after it to probe; they are served
//!   with `pread`, which sees the file's length as it is now.
//!
//! The mark is checked after the copy and the probe, never only before: a cut that lands during
//! the copy faults in the copy or in the probe, and so is seen. A file rewritten in place (cut,
//! then written again) can give any mix of old and new bytes, as it can with `pread`; what this
//! module promises is that a cut is an error.
//!
//! The mapping needs no descriptor once it is made. The file stays open beside it (one
//! descriptor per mapped file, outside the pool of `file_pool.rs`: a token dataset is one file)
//! for those final-page reads and as the fallback, `pread` for every read, when the file fits
//! in one page, when it cannot be mapped, or when the handler's fixed registry is full. JSONL
//! files are not mapped: they are read line by line with `pread` through the pool, and their
//! rate is bounded by tokenising, not by the read.

mod sigbus;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use tracing::{debug, warn};

use crate::error::{Error, Result};

use sigbus::{page_size, Registration};

/// A file read by position, out of a read-only map when it can be; see the module docs.
pub(crate) struct MappedFile {
    path: PathBuf,
    /// Kept for reads of the final page and for the `pread` fallback.
    file: File,
    /// The file's length when it was opened.
    len: u64,
    map: Option<Mapping>,
}

impl MappedFile {
    /// Maps `file` (`len` bytes long, opened from `path`) read-only, or keeps it for `pread`
    /// when it is not worth mapping or cannot be mapped. Never fails: the fallback reads the
    /// same bytes.
    pub(crate) fn new(path: &Path, file: File, len: u64) -> MappedFile {
        let map = match Mapping::new(&file, len) {
            Ok(map) => map,
            Err(reason) => {
                warn!(path = %path.display(), %reason, "reading the file with pread, not a map");
                None
            }
        };
        MappedFile {
            path: path.to_path_buf(),
            file,
            len,
            map,
        }
    }

    /// The file's length when it was opened.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Whether reads come out of a memory map (`false`: every read is a `pread`).
    pub(crate) fn is_mapped(&self) -> bool {
        self.map.is_some()
    }

    /// Fills `dest` from byte `offset` of the file.
    ///
    /// [`Error::FileChanged`] when the file has been cut short since it was opened (from then
    /// on, for every read of a mapped file); [`Error::InvalidArgument`] for a range past the
    /// length the file had when opened.
    pub(crate) fn read_at(&self, dest: &mut [u8], offset: u64) -> Result<()> {
        let end = offset.saturating_add(dest.len() as u64);
        if end > self.len {
            return Err(Error::InvalidArgument(format!(
                "bytes {offset}..{end} lie past the end ({}) of {}",
                self.len,
                self.path.display()
            )));
        }
        if let Some(map) = &self.map {
            if map.registration.changed() {
                return Err(self.changed(end));
            }
            if end <= map.checked_end {
                map.pages.copy_out_and_probe(dest, offset);
                if map.registration.changed() {
                    return Err(self.changed(end));
                }
                return Ok(());
            }
        }
        match self.file.read_exact_at(dest, offset) {
            Ok(()) => Ok(()),
            Err(source) if source.kind() == std::io::ErrorKind::UnexpectedEof => {
                if let Some(map) = &self.map {
                    map.registration.mark_changed();
                }
                Err(self.changed(end))
            }
            Err(source) => Err(Error::io(&self.path, source)),
        }
    }

    fn changed(&self, end: u64) -> Error {
        Error::FileChanged {
            path: self.path.clone(),
            opened_len: self.len,
            end,
        }
    }
}

/// A registered read-only map of a whole file.
///
/// Fields drop in order: the registration is withdrawn before the pages are unmapped, so the
/// handler never repairs an address range that may since have been given to someone else.
struct Mapping {
    registration: Registration,
    pages: MappedPages,
    /// Reads ending at or before this byte (the start of the file's final page) are copied
    /// from the map; later ones are read with `pread`.
    checked_end: u64,
}

impl Mapping {
    /// Maps `file`, or says why not (`Ok(None)`: not worth it).
    fn new(file: &File, len: u64) -> std::result::Result<Option<Mapping>, String> {
        let page = page_size() as u64;
        if len <= page {
            // Every read would end in the final page.
            return Ok(None);
        }
        let pages = MappedPages::new(file, len)?;
        let Some(registration) = Registration::new(pages.base.as_ptr() as usize, pages.span())
        else {
            return Err(format!(
                "all {} mapping registrations are taken (or the sigbus handler is missing)",
                sigbus::SLOTS
            ));
        };
        Ok(Some(Mapping {
            registration,
            pages,
            checked_end: (len - 1) / page * page,
        }))
    }
}

/// Pages of a read-only shared file mapping; unmapped on drop.
struct MappedPages {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the pages are mapped read-only and only ever copied out of through raw pointers;
// nothing in the process writes them, so sharing the pointer between threads is sound.
unsafe impl Send for MappedPages {}
// SAFETY: as for Send: `&MappedPages` only allows copies out of read-only memory.
unsafe impl Sync for MappedPages {}

impl MappedPages {
    fn new(file: &File, len: u64) -> std::result::Result<MappedPages, String> {
        use std::os::fd::AsRawFd;
        let len = usize::try_from(len).map_err(|_| format!("{len} bytes do not fit in memory"))?;
        // SAFETY: a fresh read-only shared mapping of an open file at an address the kernel
        // picks; it aliases no memory the program owns.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(format!("mmap failed: {}", std::io::Error::last_os_error()));
        }
        let Some(base) = NonNull::new(base.cast::<u8>()) else {
            return Err("mmap returned a null address".to_string());
        };
        // Windows are read in shuffled order: read-ahead around a fault would be wasted.
        // SAFETY: advice about the range just mapped; it changes no contents.
        let advised = unsafe { libc::madvise(base.as_ptr().cast(), len, libc::MADV_RANDOM) };
        if advised != 0 {
            debug!(error = %std::io::Error::last_os_error(), "madvise(random) failed");
        }
        Ok(MappedPages { base, len })
    }

    /// Bytes of address space the mapping covers (whole pages).
    fn span(&self) -> usize {
        self.len.next_multiple_of(page_size())
    }

    /// Copies `dest.len()` bytes from `offset`, then reads one byte of the page after the
    /// last one copied. The caller keeps `offset + dest.len()` at or before the start of the
    /// final page, so that page exists.
    fn copy_out_and_probe(&self, dest: &mut [u8], offset: u64) {
        let page = page_size();
        let start = offset as usize;
        let end = start + dest.len();
        let probe = end.next_multiple_of(page);
        assert!(
            probe < self.len,
            "a mapped read must end before the final page"
        );
        // SAFETY: `start..end` lies inside the mapping (end <= probe < len), which lives as
        // long as `self`; `dest` is a distinct, writable buffer of that length. A page cut
        // from the file faults here, and the sigbus handler maps zeros over it before the
        // copy goes on, so the read always completes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.base.as_ptr().add(start),
                dest.as_mut_ptr(),
                end - start,
            );
        }
        // SAFETY: `probe < len`, inside the mapping; a volatile read so it is not optimised
        // away, faulting (and marking) when the file now ends before that page.
        unsafe {
            std::ptr::read_volatile(self.base.as_ptr().add(probe));
        }
    }
}

impl Drop for MappedPages {
    fn drop(&mut self) {
        // SAFETY: the range is the one mmap returned (zero pages the handler mapped over parts
        // of it included); nothing refers to it once its owner is dropped.
        let status = unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
        if status != 0 {
            debug!(error = %std::io::Error::last_os_error(), "munmap failed");
        }
    }
}

#[cfg(test)]
mod tests;
