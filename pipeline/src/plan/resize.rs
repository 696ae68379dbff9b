//! An epoch resumed on another world size.
//!
//! Ranks stride an order: rank `r` of `W` reads positions `r, r + W, r + 2W, ...`, in batches
//! of `B`. When every rank has read `s` batches, positions `[0, s * B * W)` are read, a prefix:
//! that prefix is the resize's `cursor`. Ranks ahead of the slowest one read some positions past
//! it, listed in `taken`. The positions left, in order, form a new, shorter order that the new
//! ranks stride the same way, with the job's rules for an uneven tail and `drop_last`. A second
//! resize in the same epoch does the same to that shorter order: a chain of [`Resize`]s maps a
//! position of the last order back to the epoch order, one lookup per resize.

use stoker_proto::v1::{JobSpec, ResizedEpoch};

use super::{EpochPlan, PlanConfig};
use crate::error::{Error, Result};

/// One change of world size inside an epoch (the proto's `WorldResize`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Resize {
    /// Positions `[0, cursor)` of the order were read before the resize.
    pub cursor: u64,
    /// Positions past `cursor` read too (by ranks ahead), sorted, without repeats.
    pub taken: Vec<u64>,
}

impl Resize {
    /// Checks the resize against the length `len` of the order it cuts, and returns the
    /// length of the order it leaves.
    pub(super) fn check(&self, len: u64) -> Result<u64> {
        if self.cursor > len {
            return Err(Error::InvalidSpec(format!(
                "resize cursor {} is past the {len} positions of the order it resumes",
                self.cursor
            )));
        }
        let mut previous = None;
        for &position in &self.taken {
            if position < self.cursor || position >= len || previous.is_some_and(|p| p >= position)
            {
                return Err(Error::InvalidSpec(format!(
                    "resize taken positions must be sorted, unique and within [{}, {len}); got {position}",
                    self.cursor
                )));
            }
            previous = Some(position);
        }
        Ok(len - self.cursor - self.taken.len() as u64)
    }

    /// The position, in the order this resize cuts, of position `index` of the order it leaves.
    pub(super) fn left(&self, index: u64) -> u64 {
        // The answer is cursor + index + (taken positions at or below it): grow the count until
        // it stops changing. Each round adds the taken positions the previous guess skipped.
        let mut skipped = 0usize;
        loop {
            let guess = self.cursor + index + skipped as u64;
            let below = self.taken.partition_point(|&t| t <= guess);
            if below == skipped {
                return guess;
            }
            skipped = below;
        }
    }
}

/// The spec that resumes `epoch` on `spec`'s own world size and rank, after the ranks of
/// `old_world` — striding what `earlier` resizes of that epoch left, oldest first — read
/// `steps[r]` batches each (rank `r`; give every rank the same count when all are at the same
/// step). `num_samples` is the dataset's size. The order does not matter here: only positions
/// are counted, so no dataset needs to be open.
pub fn resized_spec(
    spec: &JobSpec,
    num_samples: u64,
    epoch: u64,
    old_world: u32,
    earlier: Vec<Resize>,
    steps: &[u64],
) -> Result<JobSpec> {
    let old = PlanConfig {
        rank: 0,
        world_size: old_world.max(1),
        ..PlanConfig::from_spec(spec, num_samples)
    };
    let plan = EpochPlan::new(old, epoch)?.resized(earlier)?;
    let resize = plan.resize_after(steps)?;
    let mut resizes: Vec<stoker_proto::v1::WorldResize> =
        plan.resizes().iter().map(Into::into).collect();
    resizes.push((&resize).into());
    let mut resumed = spec.clone();
    resumed.resized_epoch = Some(ResizedEpoch { epoch, resizes });
    Ok(resumed)
}

impl From<&stoker_proto::v1::WorldResize> for Resize {
    fn from(resize: &stoker_proto::v1::WorldResize) -> Self {
        Resize {
            cursor: resize.cursor,
            taken: resize.taken.clone(),
        }
    }
}

impl From<&Resize> for stoker_proto::v1::WorldResize {
    fn from(resize: &Resize) -> Self {
        stoker_proto::v1::WorldResize {
            cursor: resize.cursor,
            taken: resize.taken.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn left_skips_the_taken_positions() {
        let resize = Resize {
            cursor: 4,
            taken: vec![5, 6, 9],
        };
        assert_eq!(resize.check(12).unwrap(), 5);
        let left: Vec<u64> = (0..5).map(|i| resize.left(i)).collect();
        assert_eq!(left, vec![4, 7, 8, 10, 11]);
        let plain = Resize {
            cursor: 3,
            taken: vec![],
        };
        assert_eq!(plain.left(0), 3);
    }

    #[test]
    fn bad_resizes_are_refused() {
        for (resize, len) in [
            (
                Resize {
                    cursor: 11,
                    taken: vec![],
                },
                10,
            ),
            (
                Resize {
                    cursor: 2,
                    taken: vec![4, 3],
                },
                10,
            ),
            (
                Resize {
                    cursor: 2,
                    taken: vec![1],
                },
                10,
            ),
            (
                Resize {
                    cursor: 2,
                    taken: vec![10],
                },
                10,
            ),
        ] {
            assert!(resize.check(len).is_err(), "{resize:?}");
        }
    }
}
