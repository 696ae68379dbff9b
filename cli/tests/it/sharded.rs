//! Jobs sharded over a fleet of coordinator processes: three coordinators (`--shard I/3`, each
//! with its own journal), workers given the list of all three, clients given the same list.
//! Every job goes to the coordinator its spec hashes to, one shard is killed mid-epoch and
//! restarted from its journal, and every rank's epoch is still the embedded mode's, sample for
//! sample and byte for byte.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use stoker_proto::v1::JobSpec;
use stoker_rpc::shards::job_shard;

use crate::common::Daemon;
use crate::distributed::{assert_specs_match_embedded, distributed_specs, fixture, remote, spec};

/// Rank `rank` of the test job of `seed` over `data`.
fn seeded(data: &std::path::Path, seed: u64, rank: u32) -> JobSpec {
    JobSpec {
        seed,
        ..spec(data, rank)
    }
}

#[test]
fn three_coordinator_shards_serve_their_own_jobs_and_a_killed_one_resumes_from_its_journal() {
    let dir = fixture();
    let data = dir.path().join("data");
    let shard_flag = |i: usize| format!("{i}/3");
    let states: Vec<_> = (0..3)
        .map(|i| dir.path().join(format!("state-{i}")))
        .collect();
    let mut coordinators: Vec<Daemon> = (0..3)
        .map(|i| Daemon::coordinator_with(&states[i], "127.0.0.1:0", &["--shard", &shard_flag(i)]))
        .collect();
    let addresses: Vec<String> = coordinators.iter().map(|c| c.address.clone()).collect();
    let list = addresses.join(",");
    let _workers: Vec<Daemon> = (0..2).map(|_| Daemon::worker(&list, dir.path())).collect();

    // One job per shard: the first seeds whose specs hash to 0, 1 and 2.
    let mut seeds = [None; 3];
    for seed in 0..1000u64 {
        let shard = job_shard(&seeded(&data, seed, 0), 3);
        seeds[shard].get_or_insert(seed);
        if seeds.iter().all(Option::is_some) {
            break;
        }
    }
    let seeds = seeds.map(|seed| seed.expect("a seed for every shard"));

    // A client given one coordinator that does not own its job is refused, by name.
    let wrong = (job_shard(&seeded(&data, seeds[0], 0), 3) + 1) % 3;
    let refused = remote(&addresses[wrong], seeded(&data, seeds[0], 0))
        .err()
        .expect("the job refused by a coordinator that does not own it");
    assert!(
        refused.to_string().contains("--shard"),
        "the refusal names the shard setting: {refused}"
    );

    for (shard, seed) in seeds.into_iter().enumerate() {
        let make = |rank| seeded(&data, seed, rank);
        let mut restarted = None;
        let got = distributed_specs(&list, &make, Duration::from_secs(3), || {
            // The job's own coordinator dies halfway and comes back on its port and journal.
            coordinators[shard].kill();
            restarted = Some(Daemon::coordinator_with(
                &states[shard],
                &addresses[shard],
                &["--shard", &shard_flag(shard)],
            ));
        });
        assert_specs_match_embedded(&make, &got);
        if let Some(again) = restarted {
            coordinators[shard] = again;
        }
        // The shard kept a journal of its own in its own state folder.
        assert!(
            states[shard]
                .join(stoker_coordinator::JOURNAL_FILE)
                .exists(),
            "shard {shard} journaled"
        );
    }
}
