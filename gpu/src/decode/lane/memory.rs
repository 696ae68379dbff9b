//! The lane's device memory: planned within `gpu_memory` and allocated once when the lane
//! starts.

use std::sync::Arc;

use cudarc::driver::result;

use super::ALIGN;
use crate::cuda::Cuda;
use crate::decode::kernel::{CropItem, SENTINEL};
use crate::decode::GpuDecodeError;

/// The least memory left for decoding (arenas and nvJPEG) once the rows in flight are set
/// aside.
const MIN_DECODE_MEMORY: usize = 48 << 20;

/// The lane's device memory, allocated once within the cap: the decoded-image arena, kernel
/// parameters and sentinel rows (what the crop kernel gathers of each image's tail) of each
/// pipe, and a ring of output buffers (one batch of rows each) that
/// the training loop's batches hold until they are released. Freed when the lane and every
/// batch holding its rows are gone.
#[derive(Debug)]
pub struct LaneMemory {
    pub(super) cuda: Arc<Cuda>,
    pub(super) arenas: Vec<u64>,
    pub(super) arena_bytes: usize,
    pub(super) params: Vec<u64>,
    pub(super) ring: u64,
    pub(super) ring_slots: usize,
    pub(super) ring_slot_bytes: usize,
    pub(super) params_bytes: usize,
    /// Bytes of a pipe's sentinel rows, after its parameters in the same allocation.
    pub(super) sentinel_bytes: usize,
    /// nvJPEG's own device allocations may reach this much.
    pub(super) nvjpeg_limit: usize,
    pub(super) cap: usize,
    /// Pipes, each with an arena and kernel parameters of its own.
    pub(super) pipes: usize,
}

/// What nvJPEG's own device allocations through a hardware-backend decoder may reach, per pipe.
/// The hardware decoder keeps its buffers outside the allocators the lane gives it (on an H200
/// with nvJPEG 13 it made no call to them), so its share of the cap is kept small: a margin for
/// a release that does call them (past it an allocation is refused and its images are built on
/// the CPU, as any refused one is).
const HARDWARE_NVJPEG_SHARE: usize = 8 << 20;

/// How the lane splits its cap ([`plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Plan {
    pub(super) ring_slots: usize,
    pub(super) ring_slot_bytes: usize,
    pub(super) params_bytes: usize,
    pub(super) sentinel_bytes: usize,
    pub(super) arena_bytes: usize,
    pub(super) nvjpeg_limit: usize,
}

/// Splits `cap` bytes: up to 8 ring buffers of `batch_rows` rows of `row_bytes` (at least 2, at
/// most a quarter of the cap beyond those 2) and each pipe's kernel parameters and sentinel
/// rows; then, of the rest, nvJPEG's allocations may reach an equal part beside each of the
/// `pipes` arenas on nvJPEG's default backend, and [`HARDWARE_NVJPEG_SHARE`] a pipe on the
/// `hardware` one, the arenas sharing what is left.
pub(super) fn plan(
    cap: usize,
    batch_rows: usize,
    row_bytes: usize,
    pipes: usize,
    hardware: bool,
) -> std::result::Result<Plan, GpuDecodeError> {
    let pipes = pipes.max(1);
    let ring_slot_bytes = (batch_rows * row_bytes).div_ceil(ALIGN) * ALIGN;
    let params_bytes = (batch_rows * std::mem::size_of::<CropItem>()).max(ALIGN);
    // A sentinel row for each item the parameters hold (a pipe's `sentinel_rows`).
    let sentinel_bytes = params_bytes / std::mem::size_of::<CropItem>() * SENTINEL;
    let ring_slots = ((cap / 4) / ring_slot_bytes.max(1)).clamp(2, 8);
    let fixed = ring_slots * ring_slot_bytes + pipes * (params_bytes + sentinel_bytes);
    let rest = cap.saturating_sub(fixed);
    if rest < MIN_DECODE_MEMORY {
        return Err(GpuDecodeError::Memory(format!(
            "gpu_memory={cap} bytes leaves {rest} for decoding after {ring_slots} batches of \
             rows in flight ({ring_slot_bytes} bytes each); the lane needs at least {} \
             more: raise gpu_memory",
            MIN_DECODE_MEMORY - rest
        )));
    }
    let nvjpeg_share = match hardware {
        true => (pipes * HARDWARE_NVJPEG_SHARE).min(rest / (pipes + 1)),
        false => rest / (pipes + 1),
    };
    let arena_bytes = ((rest - nvjpeg_share) / pipes) / ALIGN * ALIGN;
    Ok(Plan {
        ring_slots,
        ring_slot_bytes,
        params_bytes,
        sentinel_bytes,
        arena_bytes,
        nvjpeg_limit: rest - pipes * arena_bytes,
    })
}

impl LaneMemory {
    /// Allocates what [`plan`] gives the arenas, parameters and ring (nvJPEG's share is
    /// allocated by nvJPEG, through the decoders' budgets).
    pub(super) fn allocate(
        cuda: &Arc<Cuda>,
        cap: usize,
        batch_rows: usize,
        row_bytes: usize,
        pipes: usize,
        hardware: bool,
    ) -> std::result::Result<LaneMemory, GpuDecodeError> {
        let plan = plan(cap, batch_rows, row_bytes, pipes, hardware)?;
        let Plan {
            ring_slots,
            ring_slot_bytes,
            params_bytes,
            sentinel_bytes,
            arena_bytes,
            nvjpeg_limit,
        } = plan;
        let mut memory = LaneMemory {
            cuda: Arc::clone(cuda),
            arenas: Vec::new(),
            arena_bytes,
            params: Vec::new(),
            ring: 0,
            ring_slots,
            ring_slot_bytes,
            params_bytes,
            sentinel_bytes,
            nvjpeg_limit,
            cap,
            pipes,
        };
        // On failure `memory` drops and frees what was allocated so far.
        cuda.in_context("cuMemAlloc", || {
            for _ in 0..pipes {
                // SAFETY: plain allocations in the device's context.
                memory
                    .arenas
                    .push(unsafe { result::malloc_sync(arena_bytes) }?);
                memory
                    .params
                    .push(unsafe { result::malloc_sync(params_bytes + sentinel_bytes) }?);
            }
            // SAFETY: as above.
            memory.ring = unsafe { result::malloc_sync(ring_slots * ring_slot_bytes) }?;
            Ok(())
        })
        .map_err(|e| GpuDecodeError::Memory(format!("allocating the lane's memory: {e}")))?;
        Ok(memory)
    }

    /// Device bytes allocated here (nvJPEG's own are counted apart).
    pub fn allocated(&self) -> usize {
        self.pipes * (self.arena_bytes + self.params_bytes + self.sentinel_bytes)
            + self.ring_slots * self.ring_slot_bytes
    }

    /// The cap the memory was planned within.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// The largest decoded image (bytes of interleaved RGB) a pipe's arena holds; larger ones
    /// are decoded on the CPU.
    pub fn arena_bytes(&self) -> usize {
        self.arena_bytes
    }

    /// Pipe `pipe`'s sentinel rows on the device ([`SENTINEL`] bytes a batch row).
    pub(super) fn sentinels_ptr(&self, pipe: usize) -> u64 {
        self.params[pipe] + self.params_bytes as u64
    }

    pub(super) fn ring_ptr(&self, index: usize) -> u64 {
        self.ring + (index * self.ring_slot_bytes) as u64
    }
}

impl Drop for LaneMemory {
    fn drop(&mut self) {
        let pointers: Vec<u64> = self
            .arenas
            .iter()
            .chain(&self.params)
            .copied()
            .chain((self.ring != 0).then_some(self.ring))
            .collect();
        let freed = self.cuda.in_context("cuMemFree", || {
            for ptr in pointers {
                // SAFETY: each pointer was allocated by `allocate` and nothing uses it now:
                // the lane's thread and every batch holding rows are gone.
                unsafe { result::free_sync(ptr) }?;
            }
            Ok(())
        });
        if let Err(error) = freed {
            tracing::warn!(%error, "could not free the GPU decode lane's memory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn on_the_hardware_backend_the_arenas_take_what_the_default_one_leaves_to_nvjpeg() {
        // The default cap, a batch of 256 rows of 224 x 224 x 3, two pipes.
        let (cap, rows, row) = (1024 * MIB, 256, 224 * 224 * 3);
        let default = plan(cap, rows, row, 2, false).unwrap();
        let hardware = plan(cap, rows, row, 2, true).unwrap();
        // The same ring and parameters either way.
        assert_eq!(default.ring_slots, hardware.ring_slots);
        assert_eq!(default.params_bytes, hardware.params_bytes);
        let fixed = default.ring_slots * default.ring_slot_bytes
            + 2 * (default.params_bytes + default.sentinel_bytes);
        for p in [default, hardware] {
            assert_eq!(
                fixed + 2 * p.arena_bytes + p.nvjpeg_limit,
                cap,
                "the cap, all of it"
            );
            assert_eq!(p.arena_bytes % ALIGN, 0);
        }
        // The default backend: a third of the rest each for nvJPEG and the two arenas.
        let rest = cap - fixed;
        assert!(default.nvjpeg_limit >= rest / 3 && default.nvjpeg_limit < rest / 3 + 2 * ALIGN);
        // The hardware backend: a margin for nvJPEG, the arenas the rest.
        assert!(hardware.nvjpeg_limit >= 2 * HARDWARE_NVJPEG_SHARE);
        assert!(hardware.nvjpeg_limit < 2 * HARDWARE_NVJPEG_SHARE + 2 * ALIGN);
        // Each arena gains half of what the default backend's nvJPEG share was, less its margin.
        let gained = default.nvjpeg_limit / 2 - HARDWARE_NVJPEG_SHARE;
        assert!(hardware.arena_bytes + ALIGN > default.arena_bytes + gained);
        assert!(hardware.arena_bytes > default.arena_bytes + 100 * MIB);
    }

    #[test]
    fn a_small_cap_keeps_nvjpegs_margin_within_an_equal_part_and_too_small_a_cap_is_refused() {
        let (rows, row) = (16, 32 * 32 * 3);
        let tight = plan(60 * MIB, rows, row, 8, true).unwrap();
        assert!(tight.nvjpeg_limit < 8 * HARDWARE_NVJPEG_SHARE, "{tight:?}");
        assert!(tight.arena_bytes > 0);
        let error = plan(40 * MIB, rows, row, 2, true).unwrap_err().to_string();
        assert!(error.contains("raise gpu_memory"), "{error}");
    }
}
