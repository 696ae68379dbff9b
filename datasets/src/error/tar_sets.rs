//! Tar sets that cannot be indexed or read whole: an index past the size one may take, a set
//! whose `stoker convert` upload did not finish.

/// Why a tar set's index cannot be written, or the set read whole.
#[derive(Debug, thiserror::Error)]
pub enum TarSetError {
    /// A tar index (`stoker index`, or kept locally after a scan) over the size an index may be.
    #[error(
        "the tar index of {samples} samples would take {bytes} bytes, over the {limit} bytes a \
         tar index may hold; without one the set opens by scanning its shards"
    )]
    TarIndexTooLarge {
        /// Samples it would describe.
        samples: u64,
        /// Its size before compression.
        bytes: u64,
        /// The most an index may take.
        limit: u64,
    },
    /// Tar shards beside the marker of a `stoker convert` upload that did not finish: shards
    /// are missing from the set.
    #[error(
        "{marker} is there: the `stoker convert` that wrote this set stopped before its last \
         shards and index were uploaded, so shards are missing; run the convert again with the \
         same --out (it replaces what the unfinished one wrote)"
    )]
    UnfinishedUpload {
        /// The marker object.
        marker: String,
    },
}
