//! A third-party decoder's panic on untrusted bytes (arrow, parquet; redb on a damaged journal)
//! turned into the error of the one sample or file it was decoding, never a dead thread, and
//! not printed as a crash (a panic hook, chained before whatever hook the process had, leaves
//! such a panic to its error and lets every other through); and whether a panic now is one of
//! those (the fuzz targets' panic hook lets only those unwind).

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

/// Puts, once per process, a panic hook before the one the process has: a panic inside
/// [`without_panics`] is logged at debug level (it becomes an error that says it), any other
/// goes to the hook that was there.
fn quiet_contained_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        static FIRST: std::sync::Once = std::sync::Once::new();
        std::panic::set_hook(Box::new(move |info| {
            if CONTAINING.with(|depth| depth.get() > 0) {
                // The first one with where it was: a bug of Stoker's own in such a region
                // would show nowhere else.
                let mut said = false;
                FIRST.call_once(|| {
                    said = true;
                    tracing::warn!(%info, "a contained panic, turned into an error (the first; later ones are logged at debug)");
                });
                if !said {
                    tracing::debug!(%info, "a contained panic, turned into an error");
                }
            } else {
                previous(info);
            }
        }));
    });
}

/// Runs `decode` on untrusted bytes, turning a panic in a third-party `decoder` (named in the
/// message, e.g. "parquet") into its message: one bad file or row group, not a dead thread,
/// and no panic printed.
pub fn without_panics<T>(
    decoder: &str,
    decode: impl FnOnce() -> T,
) -> std::result::Result<T, String> {
    quiet_contained_panics();
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
