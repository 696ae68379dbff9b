//! Jobs sharded over coordinators: a fleet runs several coordinator processes, each with its
//! own journal, and one address list names them all, in the same order for clients, workers and
//! the coordinators themselves (`stoker coordinator --shard I/N`).
//!
//! A job belongs to the coordinator its spec hashes to ([`job_shard`]): the SHA-256 of the
//! spec's protobuf encoding with the rank cleared (every rank of a job is one job at the
//! coordinator), its first eight bytes read as a little-endian number, modulo the list's
//! length. The hash is the same in every build and process, so a client finds its job's
//! coordinator with no lookup, and a coordinator refuses a job that is not its own. A worker
//! registers with every coordinator of the list and serves them all.

use prost::Message;
use sha2::{Digest, Sha256};
use stoker_proto::v1::JobSpec;

/// Why an address list cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ShardError {
    /// The list names no address.
    #[error("the coordinator address list is empty")]
    Empty,
    /// One entry of the list is empty (two commas, or a comma at an end).
    #[error("the coordinator address list {0:?} has an empty entry")]
    EmptyEntry(String),
    /// One address is named twice.
    #[error("the coordinator address list names {0} twice")]
    Duplicate(String),
}

/// The coordinators of a comma-separated list (`host:port,host:port`), in its order, each
/// trimmed of spaces. A single address is a list of one.
pub fn addresses(list: &str) -> Result<Vec<String>, ShardError> {
    if list.trim().is_empty() {
        return Err(ShardError::Empty);
    }
    let mut out: Vec<String> = Vec::new();
    for entry in list.split(',') {
        let entry = entry.trim();
        if entry.is_empty() {
            return Err(ShardError::EmptyEntry(list.to_string()));
        }
        if out.iter().any(|known| known == entry) {
            return Err(ShardError::Duplicate(entry.to_string()));
        }
        out.push(entry.to_string());
    }
    Ok(out)
}

/// The shard, of `shards`, that owns the job of `spec` (any of its ranks); 0 for one shard.
pub fn job_shard(spec: &JobSpec, shards: usize) -> usize {
    if shards <= 1 {
        return 0;
    }
    let mut key = spec.clone();
    key.rank = 0;
    let digest = Sha256::digest(key.encode_to_vec());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    // The remainder is below `shards`, a usize.
    (u64::from_le_bytes(first) % shards as u64) as usize
}

/// The address, of the comma-separated `list`, of the coordinator that owns the job of `spec`,
/// and its place in the list.
pub fn coordinator_of(list: &str, spec: &JobSpec) -> Result<(usize, String), ShardError> {
    let mut all = addresses(list)?;
    let shard = job_shard(spec, all.len());
    Ok((shard, all.swap_remove(shard)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(seed: u64, rank: u32) -> JobSpec {
        JobSpec {
            batch_size: 8,
            seed,
            rank,
            world_size: 4,
            ..JobSpec::default()
        }
    }

    #[test]
    fn every_rank_of_a_job_goes_to_one_shard_and_jobs_spread_over_all() {
        let mut seen = [0usize; 3];
        for seed in 0..300 {
            let shard = job_shard(&spec(seed, 0), 3);
            for rank in 1..4 {
                assert_eq!(job_shard(&spec(seed, rank), 3), shard, "seed {seed}");
            }
            seen[shard] += 1;
        }
        // 300 jobs over 3 shards: each gets about a third (a binomial's spread is ~8).
        assert!(seen.iter().all(|&n| (60..=140).contains(&n)), "{seen:?}");
        assert_eq!(job_shard(&spec(7, 0), 1), 0);
        assert_eq!(job_shard(&spec(7, 0), 0), 0);
    }

    #[test]
    fn the_hash_is_the_same_in_every_build() {
        // Pinned: a change here sends every running fleet's jobs to other coordinators.
        let shards: Vec<usize> = (0..8).map(|seed| job_shard(&spec(seed, 0), 5)).collect();
        assert_eq!(shards, PINNED_SHARDS);
    }

    /// `job_shard(spec(seed, 0), 5)` for seeds 0 to 7, as computed when the rule came in.
    const PINNED_SHARDS: [usize; 8] = [0, 1, 4, 3, 2, 1, 2, 0];

    #[test]
    fn address_lists_are_read_in_order_and_bad_ones_refused() {
        assert_eq!(addresses("a:1").unwrap(), ["a:1"]);
        assert_eq!(addresses("a:1, b:2,c:3").unwrap(), ["a:1", "b:2", "c:3"]);
        assert_eq!(addresses(" "), Err(ShardError::Empty));
        assert!(matches!(
            addresses("a:1,,b:2"),
            Err(ShardError::EmptyEntry(_))
        ));
        assert!(matches!(addresses("a:1,"), Err(ShardError::EmptyEntry(_))));
        assert_eq!(
            addresses("a:1,b:2,a:1"),
            Err(ShardError::Duplicate("a:1".into()))
        );
        let (shard, address) = coordinator_of("a:1,b:2,c:3", &spec(3, 2)).unwrap();
        assert_eq!(shard, job_shard(&spec(3, 0), 3));
        assert_eq!(address, ["a:1", "b:2", "c:3"][shard]);
    }
}
