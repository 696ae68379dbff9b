//! A third-party decoder's panic on untrusted bytes (arrow, parquet) turned into the error of
//! the one sample or file it was decoding, never a dead thread; and whether a panic now is one
//! of those (the fuzz targets' panic hook lets only those unwind).

thread_local! {
    /// How many [`without_panics`] calls this thread is inside.
    static CONTAINING: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether this thread is inside [`without_panics`]: a panic now is a decoder's (arrow, parquet)
/// on untrusted bytes, which becomes an error for that sample or file. The fuzz targets' panic
/// hook lets such a panic unwind to that error, and aborts on any other.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn panic_is_contained() -> bool {
    CONTAINING.with(|depth| depth.get() > 0)
}

/// Runs `decode` on untrusted bytes, turning a panic in a third-party `decoder` (named in the
/// message, e.g. "parquet") into its message: one bad file or row group, not a dead thread.
pub(crate) fn without_panics<T>(
    decoder: &str,
    decode: impl FnOnce() -> T,
) -> std::result::Result<T, String> {
    /// Leaves the contained region however `decode` ends.
    struct Inside;
    impl Drop for Inside {
        fn drop(&mut self) {
            CONTAINING.with(|depth| depth.set(depth.get().saturating_sub(1)));
        }
    }
    CONTAINING.with(|depth| depth.set(depth.get() + 1));
    let inside = Inside;
    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(decode));
    drop(inside);
    decoded.map_err(|panic| {
        let message = panic
            .downcast_ref::<&str>()
            .map(|text| (*text).to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_string());
        format!("the {decoder} decoder panicked: {message}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_without_panics_is_contained_and_the_region_ends_with_it() {
        assert!(!panic_is_contained());
        assert!(without_panics("test", panic_is_contained).unwrap_or(false));
        let message = without_panics("test", || -> u8 {
            assert!(panic_is_contained());
            panic!("bad bytes")
        })
        .unwrap_err();
        assert_eq!(message, "the test decoder panicked: bad bytes");
        assert!(!panic_is_contained(), "left after the panic");
    }
}
