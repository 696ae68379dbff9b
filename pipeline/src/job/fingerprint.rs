//! A job's datasets' fingerprint, which a saved loader state carries so that resuming it over
//! another dataset with the same sample count is refused rather than run: its positions would
//! name other samples, some read twice and some never.
//!
//! The fingerprint is a SHA-256 over each dataset's sample count, class names, and what
//! [`SampleSource::fingerprint_key`] gives of [`SAMPLED`] samples spread evenly over it: a
//! sample's location (`/data/train/n01/file.jpg`, `/data/shard-0003.tar:train/000123.jpg`,
//! `/data/year=2022/part-0.parquet:row 17`) and its label (not for JSONL, whose labels are in
//! the lines), with the folder every sampled location shares left out: the paths below the
//! dataset's own folder. So a dataset moved to another folder, machine or bucket keeps its
//! fingerprint, while renamed, replaced, added-and-removed or relabelled files (and folders
//! below its own: a partition replaced by another of the same size) change it. A file whose
//! bytes change in place under the same name does not change it.

use sha2::{Digest, Sha256};
use stoker_datasets::SampleSource;

/// Samples named in a dataset's fingerprint (all of them in a smaller dataset).
pub const SAMPLED: u64 = 4096;

/// The version of the rule, the fingerprint's prefix: a state with another one is not compared
/// (v2 named each sample without any folder, so folders below the dataset's own went unseen).
pub const VERSION: &str = "v3";

/// The fingerprint of `sources`, in order (a mix's sources in the spec's order), as
/// `v3:` and 32 hexadecimal digits.
pub fn fingerprint(sources: &[&dyn SampleSource]) -> String {
    let mut hash = Sha256::new();
    for source in sources {
        let len = source.len();
        hash.update(len.to_le_bytes());
        let classes = source.class_names();
        hash.update((classes.len() as u64).to_le_bytes());
        for class in classes {
            field(&mut hash, class);
        }
        let sampled = len.min(SAMPLED);
        let keys: Vec<String> = (0..sampled)
            .map(|k| {
                // Evenly spread, the first sample and (for k = sampled - 1) one near the last.
                let index = u64::try_from(u128::from(k) * u128::from(len) / u128::from(sampled))
                    .unwrap_or(len - 1);
                source.fingerprint_key(index)
            })
            .collect();
        let shared = shared_folder(&keys);
        for key in &keys {
            field(&mut hash, &key[shared..]);
        }
    }
    let digest = hash.finalize();
    let hex: String = digest[..16]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    format!("{VERSION}:{hex}")
}

/// The length of the folder every key starts with: their common prefix cut back to its last
/// `/` (0 when they share none). Files sort by their paths, so the first and the last sampled
/// share what all the dataset's do.
fn shared_folder(keys: &[String]) -> usize {
    let Some(first) = keys.first() else {
        return 0;
    };
    let mut common = first.len();
    for key in &keys[1..] {
        common = common.min(
            first
                .bytes()
                .zip(key.bytes())
                .take_while(|(a, b)| a == b)
                .count(),
        );
    }
    first.as_bytes()[..common]
        .iter()
        .rposition(|&byte| byte == b'/')
        .map_or(0, |slash| slash + 1)
}

/// Feeds `text` with its length, so that two fields never run into each other.
fn field(hash: &mut Sha256, text: &str) {
    hash.update((text.len() as u64).to_le_bytes());
    hash.update(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use stoker_datasets::Result as DatasetResult;

    /// Samples named `{folder}/{names[i]}` with labels `labels[i]`.
    struct Named {
        folder: &'static str,
        names: Vec<String>,
        labels: Vec<i64>,
        classes: Vec<String>,
    }

    impl Named {
        fn new(folder: &'static str, count: usize) -> Named {
            Named {
                folder,
                names: (0..count).map(|i| format!("img-{i:05}.jpg")).collect(),
                labels: (0..count).map(|i| (i % 3) as i64).collect(),
                classes: vec!["a".into(), "b".into(), "c".into()],
            }
        }
    }

    impl SampleSource for Named {
        fn len(&self) -> u64 {
            self.names.len() as u64
        }
        fn label(&self, index: u64) -> i64 {
            self.labels[index as usize]
        }
        fn describe(&self, index: u64) -> String {
            format!("{}/{}", self.folder, self.names[index as usize])
        }
        fn read(&self, _index: u64) -> DatasetResult<Vec<u8>> {
            Ok(Vec::new())
        }
        fn class_names(&self) -> &[String] {
            &self.classes
        }
    }

    fn of(source: &Named) -> String {
        fingerprint(&[source])
    }

    #[test]
    fn a_moved_dataset_keeps_its_fingerprint() {
        let here = Named::new("/data/set", 10_000);
        let there = Named::new("s3://bucket/elsewhere/set", 10_000);
        assert_eq!(of(&here), of(&there));
        assert!(of(&here).starts_with("v3:") && of(&here).len() == 3 + 32);
    }

    #[test]
    fn a_folder_below_the_datasets_own_is_part_of_its_samples_names() {
        // Partitions of the same size and file names: another partition is another dataset.
        let partitioned = |years: [&str; 2]| {
            let mut set = Named::new("/data/sales", 100);
            for (i, name) in set.names.iter_mut().enumerate() {
                *name = format!("year={}/part-{}.parquet:row {}", years[i / 50], 0, i % 50);
            }
            set
        };
        let before = partitioned(["2022", "2023"]);
        assert_ne!(of(&before), of(&partitioned(["2023", "2024"])));
        // Moved whole, it is the same.
        let mut moved = partitioned(["2022", "2023"]);
        moved.folder = "s3://bucket/copy";
        assert_eq!(of(&before), of(&moved));
    }

    #[test]
    fn a_renamed_or_relabelled_sample_changes_it() {
        let base = Named::new("/data", 100);
        let mut renamed = Named::new("/data", 100);
        renamed.names[37] = "other.jpg".into();
        let mut relabelled = Named::new("/data", 100);
        relabelled.labels[37] = (relabelled.labels[37] + 1) % 3;
        let mut reclassed = Named::new("/data", 100);
        reclassed.classes[1] = "bee".into();
        for changed in [&renamed, &relabelled, &reclassed] {
            assert_ne!(of(&base), of(changed));
        }
    }

    #[test]
    fn a_sample_shifted_in_a_large_dataset_changes_it() {
        // One file removed and another added at the end: the same count, every later sample
        // one place earlier, which the evenly spread samples see.
        let base = Named::new("/data", 100_000);
        let mut shifted = Named::new("/data", 100_000);
        shifted.names.remove(500);
        shifted.names.push("zzz-new.jpg".into());
        assert_ne!(of(&base), of(&shifted));
    }

    #[test]
    fn a_mix_fingerprints_its_sources_in_order() {
        let (a, b) = (Named::new("/a", 50), Named::new("/b", 60));
        assert_ne!(fingerprint(&[&a, &b]), fingerprint(&[&b, &a]));
        assert_ne!(fingerprint(&[&a, &b]), fingerprint(&[&a]));
    }

    #[test]
    fn the_fingerprint_is_stable_across_builds() {
        // The value a state saved today carries: a change of the rule must change VERSION.
        let base = Named::new("/data", 20);
        assert_eq!(of(&base), "v3:2026159b18b46de0a76e8348fa323417");
    }
}
