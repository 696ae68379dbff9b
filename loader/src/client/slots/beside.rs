//! Page-locked room beside a pinned pool's slots for the small tensors a batch carries apart
//! from its slot (labels, sources, the GPU decode lane's row places): a pool of its own, made
//! when a batch first asks for it, within the same pinned budget, so the copies to the device
//! read them by DMA and no page is locked outside that budget for them.

use std::sync::Arc;

use bytes::Bytes;

use super::{slot_stride, SlotPool};

/// Each part starts at a multiple of this in its slot, so int64 views need no copy.
const ALIGN: usize = 8;

/// Where each part of `lens` bytes starts in one buffer (each `ALIGN`ed, in order), and the
/// buffer's length.
fn places(lens: impl Iterator<Item = usize>) -> (Vec<usize>, usize) {
    let mut end = 0usize;
    let starts = lens
        .map(|len| {
            let start = end.next_multiple_of(ALIGN);
            end = start + len;
            start
        })
        .collect();
    (starts, end)
}

impl SlotPool {
    /// The pool beside this one, once made.
    pub(super) fn beside_pool(&self) -> Option<&Arc<SlotPool>> {
        self.beside.get().and_then(Option::as_ref)
    }

    /// Copies `parts` into one page-locked slot beside this pinned pool's slots (each part
    /// 8-byte aligned) and returns each part's bytes there; that slot goes back when the last
    /// of them drops, as a batch's slot does, and is page-locked as it first goes out
    /// ([`SlotPool::pin_for_hand_out`]). The room is made on the first call: as many slots as
    /// this pool has, each the first call's parts rounded up to whole pages (a job's later
    /// batches are no larger), within the pinned budget this pool was made with.
    ///
    /// `None`, and the caller keeps its own (pageable) bytes: for a pool that does not pin, for
    /// no bytes at all, for a closed pool, when the room could not be made (the budget has no
    /// space for it left: said once in the log), when the parts do not fit a slot beside, or
    /// while every slot beside is held.
    pub fn pin_beside(&self, parts: &[&[u8]]) -> Option<Vec<Bytes>> {
        let pinning = self.pinning.as_ref()?;
        if self.is_closed() {
            // No room is made for a pool no loader uses (it would never be let go).
            return None;
        }
        let (starts, len) = places(parts.iter().map(|part| part.len()));
        if len == 0 {
            return None;
        }
        let beside = self.beside.get_or_init(|| {
            let made = SlotPool::pinned(
                slot_stride(len),
                self.capacity,
                false,
                Arc::clone(&pinning.locker),
                pinning.budget_bytes,
            );
            made.inspect_err(|error| {
                tracing::warn!(
                    %error,
                    "no page-locked room beside the batch slots: labels and row places are \
                     copied to the device from pageable memory"
                );
            })
            .ok()
        });
        let beside = beside.as_ref()?;
        if len > beside.slot_bytes {
            return None;
        }
        let mut slot = beside.try_take(len)?;
        let buffer = slot.as_mut_slice();
        for (part, &start) in parts.iter().zip(&starts) {
            buffer[start..start + part.len()].copy_from_slice(part);
        }
        beside.pin_for_hand_out(buffer.as_ptr());
        let bytes = slot.into_bytes();
        let slices = parts.iter().zip(starts);
        Some(
            slices
                .map(|(part, start)| bytes.slice(start..start + part.len()))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_lie_one_after_the_other_each_8_byte_aligned() {
        assert_eq!(
            places([16, 3, 8, 0, 5].into_iter()),
            (vec![0, 16, 24, 32, 32], 37)
        );
        assert_eq!(places(std::iter::empty()), (vec![], 0));
    }

    #[test]
    fn a_pool_that_does_not_pin_has_no_room_beside() {
        let pool = SlotPool::new(64, 2);
        assert!(pool.pin_beside(&[&[1, 2, 3]]).is_none());
        assert!(pool.beside_pool().is_none());
    }
}
