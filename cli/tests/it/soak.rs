//! `stoker bench soak` as CI runs it: two minutes of the distributed mode with workers SIGKILLed
//! every ~10 s, the coordinator every ~30 s and the client not spared every ~30 s (resumed at
//! its last checkpoint), every checkpoint of both ranks checked against the embedded loader; slopes are
//! reported, not judged, at this length (the JSON says so). And a short run judged on purpose,
//! with a leak planted in one client, that must fail on that client's growth.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use crate::common;

fn soak(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_stoker"))
        .args(["bench", "soak"])
        .args(args)
        .env("STOKER_WORKER_BIN", common::worker_binary())
        .output()
        .expect("stoker runs")
}

#[test]
fn two_minutes_of_kills_and_restarts_lose_and_duplicate_nothing() {
    let out = soak(&[
        "--minutes",
        "2",
        "--kill-every-s",
        "10",
        "--restart-every-s",
        "30",
        "--client-kill-every-s",
        "30",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    for zero in [
        "lost",
        "duplicated",
        "digest_mismatches",
        "misplaced",
        "crashes",
    ] {
        assert_eq!(report[zero], 0, "{zero}: {report}");
    }
    assert_eq!(report["ok"], true);
    assert_eq!(
        report["flat_judged"], false,
        "two minutes are too short to judge"
    );
    let kills = report["kills"].as_u64().unwrap();
    let restarts = report["restarts"].as_u64().unwrap();
    // Intervals are drawn from 0.5x to 1.5x the mean: at least 120 / 15 and 120 / 45 of them.
    let client_kills = report["client_kills"].as_u64().unwrap();
    assert!(kills >= 8, "{report}");
    assert!(restarts >= 2, "{report}");
    assert!(client_kills >= 2, "{report}");
    assert!(report["epochs"].as_u64().unwrap() >= 10, "{report}");
    // Every incarnation was sampled: three workers plus one per kill, one coordinator plus one
    // per restart, two clients plus one per kill.
    let processes = &report["processes"];
    assert_eq!(processes["worker"]["incarnations"], 3 + kills);
    assert_eq!(processes["coordinator"]["incarnations"], 1 + restarts);
    assert_eq!(processes["client"]["incarnations"], 2 + client_kills);
    for role in ["worker", "coordinator", "client"] {
        assert!(
            processes[role]["within_life_rss_mib_per_10min"].is_f64(),
            "{report}"
        );
        assert!(
            processes[role]["peak_rss_mib"].as_f64().unwrap() > 1.0,
            "{report}"
        );
        assert!(
            processes[role]["peak_fds"].as_u64().unwrap() >= 3,
            "{report}"
        );
    }
}

#[test]
fn client_kills_that_cut_an_acknowledgement_interval_lose_and_duplicate_nothing() {
    // Clients hold wanted credits up to 2 s, acknowledgements riding with them (or alone after
    // 200 ms): a client killed every ~6 s dies with steps arrived that the coordinator has not
    // heard acknowledged. Its successor resumes at its last checkpoint all the same.
    let out = soak(&[
        "--minutes",
        "0.75",
        "--ack-interval-ms",
        "2000",
        "--client-kill-every-s",
        "6",
        "--spared-clients",
        "0",
        "--kill-every-s",
        "1000",
        "--restart-every-s",
        "1000",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    for zero in ["lost", "duplicated", "digest_mismatches", "misplaced"] {
        assert_eq!(report[zero], 0, "{zero}: {report}");
    }
    assert!(report["client_kills"].as_u64().unwrap() >= 4, "{report}");
    assert_eq!(report["ok"], true, "{report}");
}

#[test]
fn a_planted_leak_fails_the_verdict_on_the_client_that_leaks() {
    // Rank 0's client grows by 100 MiB per 10 minutes; no client is killed, so both live the
    // whole run and, judged on purpose at this length, are fitted alone from half of it.
    let out = soak(&[
        "--minutes",
        "1.5",
        "--judge",
        "--plant-leak-mib-per-10min",
        "100",
        "--client-kill-every-s",
        "1000",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "the soak passed with a leak: {stdout}"
    );
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(report["flat_judged"], true);
    assert_eq!(report["ok"], false);
    assert_eq!(report["flat_roles"]["client"], false, "{report}");
    for zero in ["lost", "duplicated", "digest_mismatches", "misplaced"] {
        assert_eq!(report[zero], 0, "only memory fails: {report}");
    }
    let slope = |slot: u64| {
        report["long_lived"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["role"] == "client" && l["slot"] == slot)
            .and_then(|l| l["rss_mib_per_10min"].as_f64())
            .unwrap_or_else(|| panic!("client {slot} fitted alone: {report}"))
    };
    // The leak shows at about its rate on rank 0, and not on rank 1.
    assert!(slope(0) > 50.0, "{report}");
    assert!(slope(1) < 10.0, "{report}");
}

#[test]
fn settings_out_of_range_are_refused_by_name() {
    let out = soak(&["--minutes", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--minutes"));
    let out = soak(&["--workers", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--workers"));
    let out = soak(&["--workers", "2", "--spared-workers", "3"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--spared-workers"));
    let out = soak(&["--client-kill-every-s", "0.5"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--client-kill-every-s"));
    let out = soak(&["--spared-clients", "3"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--spared-clients"));
    let out = soak(&["--coordinator-rest-s", "600"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--coordinator-rest-s"));
    let out = soak(&["--plant-leak-mib-per-10min=-1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--plant-leak-mib-per-10min"));
}
