//! The training loop's side: a [`Loader`] over one [`BatchSource`] seam.
//!
//! Below the seam, the two ways batches are made: [`embedded`] (decode threads in this process)
//! and [`remote`] (a coordinator's workers, over gRPC). Above it, once for both: the slot pool
//! ([`slots`]), the prefetch controller ([`prefetch`]), the reorder buffer, deadline and
//! epoch-boundary prefetch ([`stream`]), the statistics ([`stats`], with what a decode lane
//! costs the consumer's step: [`lane_cost`]) and the monitor the dashboard reads
//! ([`monitor`]). Two hooks take what a device driver adds: a pinned pool's
//! [`slots::PageLocker`], and a [`decode_lane::DecodeLane`] beside the embedded decode
//! threads (both `stoker-gpu`'s).

pub(crate) mod decode_lane;
pub(crate) mod embedded;
pub mod landing;
pub(crate) mod lane_cost;
pub(crate) mod loader;
pub(crate) mod monitor;
pub(crate) mod prefetch;
pub(crate) mod remote;
pub(crate) mod slots;
pub(crate) mod source;
pub(crate) mod stats;
pub(crate) mod stream;
