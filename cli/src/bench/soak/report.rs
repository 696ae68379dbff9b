//! The JSON line a soak prints, and its verdict on memory and descriptors per role.

use std::collections::BTreeMap;

use serde::Serialize;

use super::trend::{self, IncarnationTrend, RoleTrend};
use super::DataKind;

/// The JSON line `stoker bench soak` prints.
#[derive(Debug, Serialize)]
pub(super) struct SoakReport {
    pub(super) minutes: f64,
    pub(super) kind: DataKind,
    /// Epochs every rank finished (each checked).
    pub(super) epochs: u64,
    /// Batches read by all ranks.
    pub(super) batches: u64,
    /// Workers SIGKILLed (each restarted).
    pub(super) kills: u64,
    /// Coordinator restarts (SIGKILL, then the same port and journal).
    pub(super) restarts: u64,
    /// Clients SIGKILLed (each started again where its last checkpoint left off).
    pub(super) client_kills: u64,
    /// Daemons that exited without being killed (restarted, and a failure).
    pub(super) crashes: u64,
    /// Samples of a checked epoch a rank never got.
    pub(super) lost: u64,
    /// Samples a rank got more often than the embedded loader gives them.
    pub(super) duplicated: u64,
    /// Checked segments whose digest differs from the embedded loader's.
    pub(super) digest_mismatches: u64,
    /// Segments that did not start where their rank's last one ended.
    pub(super) misplaced: u64,
    /// Per role: the drift at a fixed age, and the within-life slope (not judged).
    pub(super) processes: BTreeMap<&'static str, RoleTrend>,
    /// Incarnations that lived five minutes (or half the run, when shorter) or more after two
    /// minutes (or a quarter of the run) from their start, fitted alone from then.
    pub(super) long_lived: Vec<IncarnationTrend>,
    /// Every judged slope within the bounds (RSS < 1 MiB / 10 min, descriptors 0 / 10 min), and
    /// every role judged: see [`flat_roles`].
    pub(super) flat: bool,
    /// The same verdict for each role.
    pub(super) flat_roles: BTreeMap<&'static str, bool>,
    /// Whether `flat` counts towards `ok` (runs of 10 minutes or more, or `--judge`).
    pub(super) flat_judged: bool,
    /// Client failures, if any.
    pub(super) failures: Vec<String>,
    /// Nothing lost, duplicated, different or crashed (and flat, when judged).
    pub(super) ok: bool,
}

/// The verdict on memory and descriptors, per role: each long-lived incarnation's own slope and
/// the role's drift are within the bounds, and the role has at least one of them (a role whose
/// processes all died before the drift age and none lived long is not flat: nothing shows it
/// is).
pub(super) fn flat_roles(
    processes: &BTreeMap<&'static str, RoleTrend>,
    long_lived: &[IncarnationTrend],
) -> BTreeMap<&'static str, bool> {
    processes
        .iter()
        .map(|(role, trend)| {
            let own = long_lived
                .iter()
                .filter(|l| l.role == *role)
                .map(|l| (l.rss_mib_per_10min, l.fds_per_10min));
            let drift = trend
                .drift
                .iter()
                .map(|d| (d.rss_mib_per_10min, d.fds_per_10min));
            let mut judged = own.chain(drift).peekable();
            let flat = judged.peek().is_some() && judged.all(|(rss, fds)| trend::is_flat(rss, fds));
            (*role, flat)
        })
        .collect()
}
