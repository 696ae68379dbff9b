//! Rows a lane gives back to the CPU, built into their batch's slot: each row's chain of reads
//! runs again from its sample (its window and flip drawn from the sample's own RNG, as the
//! decode threads would have drawn them), in the lane's pipes and in the helper lane's client
//! alike.

use std::borrow::Cow;
use std::sync::Arc;

use stoker_loader::{Error, Result, Slot};
use stoker_pipeline::{AssembledBatch, Job};

use crate::decode::RowTail;

/// A row built on the CPU: the batch row and its sample (the RNG stream it draws from).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CpuRow {
    pub(crate) row: usize,
    pub(crate) sample: u64,
}

/// Where a batch's CPU rows go: its slot, the bytes of a row in it, and what assembling the
/// batch gave (labels and bad samples, which the rows built here correct).
pub(crate) struct CpuRows<'a> {
    pub(crate) job: &'a Arc<Job>,
    pub(crate) epoch: u64,
    pub(crate) slot: &'a mut Slot,
    pub(crate) assembled: &'a mut AssembledBatch,
    pub(crate) row_bytes: usize,
}

impl CpuRows<'_> {
    /// Builds each of `rows` into the slot and, for one that also has device row `k` (an image
    /// the decode left unwritten), hands its bytes to `replace(k, bytes)`, which puts them over
    /// the device's row. Stops at the first error.
    pub(crate) fn build(
        &mut self,
        rows: impl IntoIterator<Item = (CpuRow, Option<usize>)>,
        mut replace: impl FnMut(usize, &[u8]) -> std::result::Result<(), String>,
    ) -> Result<()> {
        let image_start = self.assembled.tensors.first().map_or(0, |t| t.bytes.start);
        for (cpu, device_row) in rows {
            let start = image_start + cpu.row * self.row_bytes;
            let Some(dest) = self
                .slot
                .as_mut_slice()
                .get_mut(start..start + self.row_bytes)
            else {
                return Err(Error::Stopped(format!(
                    "row {} lies outside its batch's slot",
                    cpu.row
                )));
            };
            let (label, bad) = self.job.image_row(self.epoch, cpu.sample, dest)?;
            if let Some(slot_label) = self.assembled.labels.get_mut(cpu.row) {
                *slot_label = label;
            }
            // The row's chain of reads ran again from its sample: its bad sample, if any,
            // replaces the one the decode threads recorded for that sample.
            if let Some(bad) = bad {
                self.assembled
                    .bad_samples
                    .retain(|known| known.sample_index != bad.sample_index);
                self.assembled.bad_samples.push(bad);
            }
            if let Some(k) = device_row {
                replace(k, dest).map_err(|error| {
                    Error::Gpu(format!(
                        "replacing an undecoded GPU row with the CPU's: {error}"
                    ))
                })?;
            }
        }
        Ok(())
    }
}

/// A slot row as the lane's kernel would have written it: the bytes themselves, or with the
/// lane's `tail` applied. `row` is one uint8 NHWC row of `height x width`.
pub(crate) fn as_device_row(
    tail: RowTail,
    row: &[u8],
    height: u32,
    width: u32,
) -> std::result::Result<Cow<'_, [u8]>, String> {
    let byte_row = RowTail::BYTES.row_bytes(height, width);
    if row.len() != byte_row {
        return Err(format!(
            "device rows of {byte_row} bytes against slot rows of {}",
            row.len()
        ));
    }
    if tail.is_bytes() {
        return Ok(Cow::Borrowed(row));
    }
    let mut converted = vec![0u8; tail.row_bytes(height, width)];
    tail.apply(row, height, width, &mut converted);
    Ok(Cow::Owned(converted))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::Element;

    #[test]
    fn a_slot_row_becomes_the_kernels_row() {
        let row: Vec<u8> = (0..2 * 3 * 3).map(|v| v as u8).collect();
        let same = as_device_row(RowTail::BYTES, &row, 2, 3).unwrap();
        assert!(matches!(same, Cow::Borrowed(_)));
        assert_eq!(&*same, &row[..]);
        let tail = RowTail {
            element: Element::F32,
            planar: false,
            scale: [2.0; 3],
            shift: [1.0; 3],
        };
        let made = as_device_row(tail, &row, 2, 3).unwrap();
        let mut expected = vec![0u8; tail.row_bytes(2, 3)];
        tail.apply(&row, 2, 3, &mut expected);
        assert_eq!(&*made, &expected[..]);
        let first = f32::from_le_bytes(made[4..8].try_into().unwrap());
        assert_eq!(first, 3.0, "1 x 2 + 1");
        let short = as_device_row(RowTail::BYTES, &row[1..], 2, 3).unwrap_err();
        assert!(short.contains("against slot rows of 17"), "{short}");
    }
}
