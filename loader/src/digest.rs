//! A SHA-256 over batches, in step order: tensor names, dtypes, shapes and bytes, so two runs
//! can be compared with one line.

use sha2::{Digest, Sha256};
use stoker_pipeline::Batch;

/// Running digest of a sequence of batches.
#[derive(Default, Clone)]
pub struct BatchDigest {
    hasher: Sha256,
    batches: u64,
}

impl BatchDigest {
    /// An empty digest.
    pub fn new() -> Self {
        Self::default()
    }

    /// Folds in one batch. Stage timings and bad-sample notes are left out: they describe how
    /// the batch was made, not what it holds.
    pub fn update(&mut self, batch: &Batch) {
        self.hasher.update(batch.step.to_le_bytes());
        for tensor in &batch.tensors {
            self.hasher.update((tensor.name.len() as u64).to_le_bytes());
            self.hasher.update(tensor.name.as_bytes());
            self.hasher.update((tensor.dtype as i32).to_le_bytes());
            self.hasher
                .update((tensor.shape.len() as u64).to_le_bytes());
            for dim in &tensor.shape {
                self.hasher.update(dim.to_le_bytes());
            }
            self.hasher.update((tensor.data.len() as u64).to_le_bytes());
            self.hasher.update(&tensor.data);
        }
        self.batches += 1;
    }

    /// Batches folded in so far.
    pub fn batches(&self) -> u64 {
        self.batches
    }

    /// The hex digest.
    pub fn hex(&self) -> String {
        let digest = self.hasher.clone().finalize();
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }
}
