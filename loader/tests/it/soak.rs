//! `stoker bench soak` as CI runs it: two minutes of the distributed mode with workers SIGKILLed
//! every ~10 s and the coordinator every ~30 s, every epoch of both ranks checked against the
//! embedded loader. Slopes are reported, not judged, at this length (the JSON says so).

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
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    for zero in ["lost", "duplicated", "digest_mismatches", "crashes"] {
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
    assert!(kills >= 8, "{report}");
    assert!(restarts >= 2, "{report}");
    assert!(report["epochs"].as_u64().unwrap() >= 10, "{report}");
    // Every incarnation was sampled: three workers plus one per kill, one coordinator plus one
    // per restart, two clients.
    let processes = &report["processes"];
    assert_eq!(processes["worker"]["incarnations"], 3 + kills);
    assert_eq!(processes["coordinator"]["incarnations"], 1 + restarts);
    assert_eq!(processes["client"]["incarnations"], 2);
    // The first worker is spared: it lives the whole run, and is fitted alone only from five
    // minutes on, so nothing here; the within-life slopes are reported for every role.
    assert!(report["long_lived"]
        .as_array()
        .unwrap()
        .iter()
        .all(|l| l["role"] == "client"));
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
}
