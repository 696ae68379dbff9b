//! The Rust allocator of Stoker's artifacts: the `stoker` and `stoker-worker` binaries and the
//! Python extension each name this crate once (`use stoker_alloc as _;`), and no library does,
//! so a program that links the libraries keeps its own allocator.
//!
//! jemalloc rather than the C library's: a client's HTTP/2 library allocates a buffer for the
//! frames it receives as they come, and glibc gave those buffers back to the kernel when freed,
//! so every frame was faulted in anew (it cost a batch stream up to two thirds of its rate; see
//! `benches/README.md`, "Batches over the wire"). jemalloc keeps freed pages for a while. Its
//! symbols are prefixed, so in the extension it serves Rust's allocations only, never the
//! interpreter's or another library's; its thread-local state is reached without the
//! initial-exec model, so the extension loads with `dlopen`.

#[cfg(unix)]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read once when it starts (`_RJEM_MALLOC_CONF` in the environment is read
/// after them, so it can still change them). `oversize_threshold:0`: allocations of 8 MiB and
/// more (a batch's tensor buffer, a tonic message being encoded) stay in the ordinary arenas,
/// which keep freed pages a while, rather than going to the one that hands them back at once.
/// `background_thread:true`: a few threads of jemalloc's own give an arena's freed pages back
/// once they went unused for the decay time (10 s), where an arena gave them back only as it
/// allocated again, so the memory of a spike (a huge image, a long document, the row groups of
/// a shuffled Parquet set) stayed with an idle thread for good. A process forked from one that
/// runs them (a `from_dataset` worker) has none, and purges as it allocates.
#[cfg(unix)]
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: ConfString =
    ConfString(c"oversize_threshold:0,background_thread:true".as_ptr());

/// A pointer to a C string, as jemalloc reads its `malloc_conf`.
#[cfg(unix)]
#[repr(transparent)]
struct ConfString(*const std::ffi::c_char);

// SAFETY: it points at a string literal, never written.
#[cfg(unix)]
unsafe impl Sync for ConfString {}

#[cfg(all(test, unix))]
mod tests {
    use std::ffi::{c_void, CStr};

    /// A setting of jemalloc of type `T` (`size_t` or `bool`, as the setting is), read
    /// through `mallctl`.
    fn setting<T: Copy>(name: &CStr, mut value: T) -> T {
        let mut len = std::mem::size_of::<T>();
        // SAFETY: `value` and `len` are valid for writes of a `T`, the setting's type (the
        // callers name settings of their own type); no new value is given.
        let status = unsafe {
            tikv_jemalloc_sys::mallctl(
                name.as_ptr(),
                (&mut value as *mut T).cast::<c_void>(),
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        assert_eq!(status, 0, "mallctl({name:?})");
        value
    }

    #[test]
    fn jemalloc_starts_with_the_settings_of_this_crate() {
        // Allocating through the global allocator starts jemalloc here, as in the artifacts.
        let buffer = vec![1u8; 16 << 20];
        assert_eq!(buffer.iter().map(|b| *b as usize).sum::<usize>(), 16 << 20);
        // Without the settings this is jemalloc's default, 8 MiB.
        assert_eq!(setting(c"opt.oversize_threshold", usize::MAX), 0);
        // jemalloc's default is off; the second is whether the threads run.
        assert!(setting(c"opt.background_thread", false));
        assert!(setting(c"background_thread", false));
    }
}
