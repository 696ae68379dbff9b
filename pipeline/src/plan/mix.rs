//! Weighted mixing of sources: which source, and which of that source's samples, each position
//! of a mixed epoch holds. A pure function of (seed, epoch, position), like the plain order.
//!
//! The rule (the proto's `Mix` states it for users):
//! - **Counts.** The weights are normalised to sum 1 and rounded to 12 decimal places (the
//!   precision a saved state compares them at); source `k` gets `floor(share_k * window)`
//!   positions of every window, and the sources with the largest remainders one more each until
//!   the counts sum to `window` (ties go to the earlier source), in exact arithmetic on those
//!   shares. A source whose count comes out 0 is refused: it would never be read.
//! - **Windows.** Epoch positions `[m * window, (m + 1) * window)` form window `m`. Without
//!   shuffle each window is the same even interleave (the `j`-th sample of source `k` sits at
//!   `(2j + 1) / (2 counts[k])` of the window, ties to the earlier source); with shuffle that
//!   interleave is permuted by a key of (seed, epoch, window). Either way every whole window
//!   holds exactly `counts[k]` samples of source `k`.
//! - **Draws.** The `j`-th position of source `k` in the epoch (its draw `j`) reads sample
//!   `j mod len_k` of pass `j / len_k` of that source: pass `p` is the source's own order (its
//!   seed derived from the job's seed and `k`, shuffled or not, shard-aware with a shuffle
//!   window), keyed by [`source_epoch`] of (epoch, p), so a source that restarts is
//!   reshuffled, and its augmentations differ from the pass before.
//! - **Epoch end.** See [`MixEnd`]; every rule but a fixed sample count ends on a whole window.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::rng::mix64;

use super::{epoch_key, window_key, Permutation};

/// Positions per window when the spec leaves it 0.
pub const DEFAULT_MIX_WINDOW: u32 = 100;

/// Most sources one mix takes (a window must give each at least one position).
pub const MAX_MIX_SOURCES: usize = 1024;

/// Widest window: a window is laid out in memory when a batch reads it.
pub const MAX_MIX_WINDOW: u32 = 1 << 20;

/// Positions one batch of a mixed job may lay out at most (the windows its positions fall in,
/// each laid out whole, when none of them is among the windows kept laid out): about a tenth
/// of a second of one thread (a position costs 17-25 ns in a release build, `benches/`
/// `mix_order`).
pub const MAX_MIX_LAYOUT_PER_BATCH: u64 = 1 << 22;

/// Positions of the windows an order keeps laid out (8 bytes each: 16 MiB), besides the newest
/// window, which is kept whatever its size.
const KEPT_LAYOUT_POSITIONS: u64 = 1 << 21;

/// Windows an order keeps laid out at most.
const KEPT_LAYOUT_WINDOWS: usize = 64;

/// Positions a batch of `batch` samples of one of `world` ranks lays out in a mix of `window`
/// positions: its positions are strided by the world size, so they fall in about
/// `batch * world / window + 1` windows (at most one per sample), each laid out whole.
pub fn layout_per_batch(batch: u32, world: u32, window: u64) -> u64 {
    let span = u64::from(batch) * u64::from(world.max(1));
    let windows = (span / window.max(1) + 1).min(u64::from(batch));
    windows * window
}

/// Where a mixed epoch ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MixEnd {
    /// The whole windows every source fills without repeating a sample.
    FirstExhausted,
    /// The whole windows it takes every source to give each of its samples once (the others
    /// restart).
    AllExhausted,
    /// A fixed number of positions (the sources restart as needed).
    Samples(u64),
}

/// One position's sample: the source and which of its draws (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Draw {
    /// Index of the source, in the order given.
    pub source: usize,
    /// The source's draw: its `draw`-th position in the epoch.
    pub draw: u64,
}

/// The mixed order of a job: counts per window, the epoch length, and position lookups.
#[derive(Debug, Clone)]
pub struct MixOrder {
    counts: Vec<u64>,
    lens: Vec<u64>,
    window: u64,
    epoch_len: u64,
    seed: u64,
    shuffle: bool,
    /// The window's sources before any shuffle: the even interleave.
    interleave: Vec<u32>,
    /// Windows laid out lately, shared by the order's clones.
    kept: Arc<KeptLayouts>,
    /// Where the window's counts are far from the weights ([`rounding_notice`]).
    rounding: Option<String>,
}

/// One window laid out: for each position, its source and how many positions of the same
/// source come before it in the window (both below [`MAX_MIX_WINDOW`]).
type Layout = Arc<[(u32, u32)]>;

/// The windows an order laid out lately, newest first: a rank's next batches mostly fall in
/// the window its last one did, and the ranks one process serves read the same windows at the
/// same step, so a window is laid out about once however many batches read it.
#[derive(Debug, Default)]
struct KeptLayouts(Mutex<VecDeque<(u64, u64, Layout)>>);

impl KeptLayouts {
    /// Window `window` of `epoch`, if kept (it becomes the newest).
    fn get(&self, epoch: u64, window: u64) -> Option<Layout> {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let at = kept
            .iter()
            .position(|(e, w, _)| *e == epoch && *w == window)?;
        let entry = kept.remove(at)?;
        let layout = entry.2.clone();
        kept.push_front(entry);
        Some(layout)
    }

    /// Keeps `layout` as the newest, dropping the oldest past the bounds.
    fn keep(&self, epoch: u64, window: u64, layout: Layout) {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        kept.retain(|(e, w, _)| !(*e == epoch && *w == window));
        kept.push_front((epoch, window, layout));
        let mut positions = 0u64;
        let mut keep = 0;
        for (_, _, layout) in kept.iter() {
            positions += layout.len() as u64;
            if keep > 0 && (keep == KEPT_LAYOUT_WINDOWS || positions > KEPT_LAYOUT_POSITIONS) {
                break;
            }
            keep += 1;
        }
        kept.truncate(keep);
    }

    /// Windows kept now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// The epoch key a source's pass `pass` of `epoch` is ordered and augmented with: `epoch`
/// itself for the first pass, a mix of both after.
pub fn source_epoch(epoch: u64, pass: u64) -> u64 {
    if pass == 0 {
        epoch
    } else {
        mix64(epoch ^ mix64(pass.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x4d49_5850_4153_5331))
    }
}

/// The seed of source `source`'s order and augmentations in a mix seeded by `seed`.
pub fn source_seed(seed: u64, source: usize) -> u64 {
    mix64(seed ^ mix64((source as u64).wrapping_add(1) ^ 0x4d49_5853_4545_4431))
}

/// The resolution of a source's share in [`window_counts`]: 10^-12, the digits to which a saved
/// state's mix is compared.
const SHARE_UNITS: f64 = 1e12;

/// The counts per window of `weights` (see the module docs); errors name the weight at fault.
pub fn window_counts(weights: &[f64], window: u32) -> Result<Vec<u64>> {
    if weights.is_empty() {
        return Err(Error::InvalidSpec("a mix needs at least one source".into()));
    }
    if window == 0 || window > MAX_MIX_WINDOW {
        return Err(Error::InvalidSpec(format!(
            "a mix's window must be in 1..={MAX_MIX_WINDOW} positions, got {window}"
        )));
    }
    if weights.len() > MAX_MIX_SOURCES {
        return Err(Error::InvalidSpec(format!(
            "a mix takes at most {MAX_MIX_SOURCES} sources, got {}",
            weights.len()
        )));
    }
    if let Some((k, w)) = weights
        .iter()
        .enumerate()
        .find(|(_, w)| !(w.is_finite() && **w > 0.0))
    {
        return Err(Error::InvalidSpec(format!(
            "the weight of mixed source {k} must be a positive finite number, got {w}"
        )));
    }
    let window = u64::from(window);
    // Weights whose sum overflows (each finite, say 1e308 twice) are taken relative to the
    // largest; weights that sum finite are used as given, so their counts never change.
    let relative: Vec<f64>;
    let mut total: f64 = weights.iter().sum();
    let weights = if total.is_finite() {
        weights
    } else {
        let largest = weights.iter().copied().fold(0.0, f64::max);
        relative = weights.iter().map(|w| w / largest).collect();
        total = relative.iter().sum();
        &relative[..]
    };
    // Each share as a whole number of 10^-12ths, the precision a saved state compares mixes
    // at: the counts are then exact integer arithmetic on those, so weights that state the
    // same shares ({7, 1} and {0.35, 0.05}) get the same counts, and a tie is a tie (in floats
    // the remainders' rounding noise broke ties either way).
    let units: Vec<u128> = weights
        .iter()
        .map(|w| (w / total * SHARE_UNITS).round() as u128)
        .collect();
    let denominator: u128 = units.iter().sum::<u128>().max(1);
    let quotas: Vec<u128> = units.iter().map(|u| u * u128::from(window)).collect();
    let mut counts: Vec<u64> = quotas.iter().map(|q| (q / denominator) as u64).collect();
    let assigned: u64 = counts.iter().sum();
    // Largest remainders first, the earlier source on ties (a stable sort keeps index order).
    let mut by_remainder: Vec<usize> = (0..weights.len()).collect();
    by_remainder.sort_by_key(|&k| std::cmp::Reverse(quotas[k] % denominator));
    for &k in by_remainder
        .iter()
        .take(window.saturating_sub(assigned) as usize)
    {
        counts[k] += 1;
    }
    let starved: Vec<usize> = (0..counts.len()).filter(|&k| counts[k] == 0).collect();
    if let Some(&k) = starved.first() {
        // The window that gives every starved source a position: its share of it is >= 1.
        let needed = (starved.iter())
            .map(|&k| (total / weights[k]).ceil())
            .fold(0.0, f64::max);
        let remedy = if needed <= f64::from(MAX_MIX_WINDOW) {
            format!("raise the window to at least {needed} or the weight")
        } else {
            format!("a window would need {needed:.3e}, past the most ({MAX_MIX_WINDOW}): raise the weight")
        };
        let others = match starved.len() {
            1 => String::new(),
            2 => " and 1 other source".to_string(),
            n => format!(" and {} other sources", n - 1),
        };
        let (weight, share) = (weights[k], weights[k] / total);
        // Plain digits where they read well, else powers of ten (1e-300 is 300 digits).
        let weight = if (1e-3..1e6).contains(&weight) {
            format!("{weight}")
        } else {
            format!("{weight:.6e}")
        };
        return Err(Error::InvalidSpec(format!(
            "mixed source {k} (weight {weight}, {share:.2e} of the mix){others} gets 0 of the \
             {window} positions of a window; {remedy}"
        )));
    }
    Ok(counts)
}

/// Where `counts` of a `window` give a source a share more than a hundredth off the share its
/// weight asks (a weight small beside the window's resolution: 0.005 of a window of 100 gets
/// 0.01; three equal weights get 34, 33 and 33), in words, naming up to four such sources;
/// `None` when every share is within.
pub fn rounding_notice(weights: &[f64], counts: &[u64], window: u64) -> Option<String> {
    let largest = weights.iter().copied().fold(0.0, f64::max);
    let total: f64 = weights.iter().map(|w| w / largest).sum();
    let off: Vec<String> = weights
        .iter()
        .zip(counts)
        .enumerate()
        .filter_map(|(k, (w, &count))| {
            let asked = w / largest / total;
            let gets = count as f64 / window as f64;
            ((gets - asked).abs() > asked / 100.0)
                .then(|| format!("source {k} asks {asked:.4} of the mix and gets {gets:.4}"))
        })
        .collect();
    if off.is_empty() {
        return None;
    }
    let shown: Vec<&str> = off.iter().take(4).map(String::as_str).collect();
    Some(format!(
        "a mix's window of {window} positions rounds its weights: {}{}; a larger window \
         (window=) rounds them less",
        shown.join(", "),
        if off.len() > shown.len() { ", ..." } else { "" }
    ))
}

impl MixOrder {
    /// The order of a mix of sources of `lens` samples with `weights`, `window` positions per
    /// window (0: `DEFAULT_MIX_WINDOW`, 100) and the epoch rule `end`.
    pub fn new(
        weights: &[f64],
        lens: &[u64],
        window: u32,
        end: MixEnd,
        seed: u64,
        shuffle: bool,
    ) -> Result<Self> {
        let window = if window == 0 {
            DEFAULT_MIX_WINDOW
        } else {
            window
        };
        let counts = window_counts(weights, window)?;
        if lens.len() != counts.len() {
            return Err(Error::InvalidSpec(format!(
                "{} weights for {} mixed sources",
                counts.len(),
                lens.len()
            )));
        }
        if let Some(k) = lens.iter().position(|&n| n == 0) {
            return Err(Error::InvalidSpec(format!(
                "mixed source {k} has no samples"
            )));
        }
        let window = u64::from(window);
        let windows = match end {
            MixEnd::FirstExhausted => {
                let (k, windows) = lens
                    .iter()
                    .zip(&counts)
                    .map(|(n, c)| n / c)
                    .enumerate()
                    .min_by_key(|&(_, w)| w)
                    .unwrap_or((0, 0));
                if windows == 0 {
                    return Err(Error::InvalidSpec(format!(
                        "mixed source {k} has {} samples, fewer than the {} it gives each \
                         window, so an epoch that ends when the first source runs out would be \
                         empty; use a smaller window or epoch_end='all_exhausted'",
                        lens[k], counts[k]
                    )));
                }
                Some(windows)
            }
            MixEnd::AllExhausted => lens.iter().zip(&counts).map(|(n, c)| n.div_ceil(*c)).max(),
            MixEnd::Samples(_) => None,
        };
        let epoch_len = match (windows, end) {
            (Some(windows), _) => windows.checked_mul(window),
            (None, MixEnd::Samples(0)) => {
                return Err(Error::InvalidSpec(
                    "a mix's epoch_samples must be at least 1".into(),
                ))
            }
            (None, MixEnd::Samples(n)) => Some(n),
            (None, _) => None,
        }
        .filter(|&len| len <= 1 << 62)
        .ok_or_else(|| Error::InvalidSpec("a mixed epoch of more than 2^62 samples".into()))?;
        Ok(Self {
            interleave: interleave(&counts),
            rounding: rounding_notice(weights, &counts, window),
            counts,
            lens: lens.to_vec(),
            window,
            epoch_len,
            seed,
            shuffle,
            kept: Arc::default(),
        })
    }

    /// Positions of source `k` in each whole window.
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    /// Positions per window.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// Where the window's counts give sources shares far from their weights', in words.
    pub fn rounding(&self) -> Option<&str> {
        self.rounding.as_deref()
    }

    /// Positions of an epoch (the same for every epoch).
    pub fn epoch_len(&self) -> u64 {
        self.epoch_len
    }

    /// Samples of each source.
    pub fn lens(&self) -> &[u64] {
        &self.lens
    }

    /// The sources of window `window` of `epoch`, position by position.
    pub fn window_sources(&self, epoch: u64, window: u64) -> Vec<u32> {
        if !self.shuffle {
            return self.interleave.clone();
        }
        let key = window_key(epoch_key(self.seed ^ 0x4d49_5857_494e_444f, epoch), window);
        let permutation = Permutation::new(self.window, key);
        (0..self.window)
            .map(|o| self.interleave[permutation.apply(o) as usize])
            .collect()
    }

    /// The draws at `positions` of `epoch` (each below [`Self::epoch_len`]), in order. Each
    /// window met is laid out once, unless it is among the windows kept from earlier calls.
    pub fn draws(&self, epoch: u64, positions: &[u64]) -> Vec<Draw> {
        let mut met: Vec<(u64, Layout)> = Vec::new();
        positions
            .iter()
            .map(|&position| {
                let window = position / self.window;
                let offset = (position % self.window) as usize;
                let at = match met.iter().position(|(w, _)| *w == window) {
                    Some(at) => at,
                    None => {
                        met.push((window, self.layout(epoch, window)));
                        met.len() - 1
                    }
                };
                let (source, occurrence) = met[at].1[offset];
                let source = source as usize;
                Draw {
                    source,
                    draw: window * self.counts[source] + u64::from(occurrence),
                }
            })
            .collect()
    }

    /// Window `window` of `epoch` laid out: kept, or laid out now and kept.
    fn layout(&self, epoch: u64, window: u64) -> Layout {
        if let Some(layout) = self.kept.get(epoch, window) {
            return layout;
        }
        let mut seen = vec![0u32; self.counts.len()];
        let layout: Layout = self
            .window_sources(epoch, window)
            .into_iter()
            .map(|source| {
                let count = &mut seen[source as usize];
                *count += 1;
                (source, *count - 1)
            })
            .collect();
        self.kept.keep(epoch, window, layout.clone());
        layout
    }
}

/// The even interleave of a window: source `k`'s `j`-th position sits at
/// `(2j + 1) / (2 counts[k])` of the window; ties go to the earlier source.
fn interleave(counts: &[u64]) -> Vec<u32> {
    let mut places: Vec<(u64, u64, u32)> = counts
        .iter()
        .enumerate()
        .flat_map(|(k, &c)| (0..c).map(move |j| (2 * j + 1, 2 * c, k as u32)))
        .collect();
    // Compare (2j + 1) / (2c) as fractions, exactly.
    places.sort_by(|a, b| {
        (u128::from(a.0) * u128::from(b.1))
            .cmp(&(u128::from(b.0) * u128::from(a.1)))
            .then(a.2.cmp(&b.2))
    });
    places.into_iter().map(|(_, _, k)| k).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_lays_out_the_windows_its_strided_positions_fall_in() {
        // 256 samples of one of 12,288 ranks over 2^20-position windows: 3 M positions, in 4
        // windows at most; with 16,384 ranks, 4 M positions in 5 windows, past the bound.
        assert_eq!(layout_per_batch(256, 12_288, 1 << 20), 4 << 20);
        assert!(layout_per_batch(256, 12_288, 1 << 20) <= MAX_MIX_LAYOUT_PER_BATCH);
        assert_eq!(layout_per_batch(256, 16_384, 1 << 20), 5 << 20);
        assert!(layout_per_batch(256, 16_384, 1 << 20) > MAX_MIX_LAYOUT_PER_BATCH);
        // One window per sample at most: every sample of a huge world in a window of its own.
        assert_eq!(layout_per_batch(8, 1 << 20, 1 << 20), 8 << 20);
        assert!(layout_per_batch(65_536, 1 << 20, 1 << 20) > MAX_MIX_LAYOUT_PER_BATCH);
        // Small windows cost little however many ranks.
        assert!(layout_per_batch(65_536, 1 << 20, 100) <= 65_536 * 100);
        assert_eq!(layout_per_batch(10, 0, 4), 12);
    }

    #[test]
    fn counts_round_by_largest_remainder_ties_to_the_earlier_source() {
        assert_eq!(window_counts(&[0.7, 0.3], 100).unwrap(), vec![70, 30]);
        assert_eq!(window_counts(&[7.0, 3.0], 100).unwrap(), vec![70, 30]);
        assert_eq!(
            window_counts(&[1.0, 1.0, 1.0], 100).unwrap(),
            vec![34, 33, 33]
        );
        assert_eq!(window_counts(&[1.0, 1.0, 1.0], 10).unwrap(), vec![4, 3, 3]);
        // 0.625 * 8 = 5, 0.375 * 8 = 3: exact.
        assert_eq!(window_counts(&[5.0, 3.0], 8).unwrap(), vec![5, 3]);
        // Weights that state the same shares get the same counts, a tie going to the earlier
        // source however the weights are written (in floats, 0.35 / 0.4 * 100 fell below 87.5
        // and the later source took the tie: 87 / 13).
        assert_eq!(window_counts(&[7.0, 1.0], 100).unwrap(), vec![88, 12]);
        assert_eq!(window_counts(&[0.35, 0.05], 100).unwrap(), vec![88, 12]);
        assert_eq!(window_counts(&[0.7, 0.1], 20).unwrap(), vec![18, 2]);
        for scale in [1e-6, 1e-3, 0.1, 3.0, 1e3, 1e9] {
            for weights in [[0.35, 0.05, 0.6], [0.01, 0.13, 0.86], [0.07, 0.21, 0.72]] {
                let scaled: Vec<f64> = weights.iter().map(|w| w * scale).collect();
                for window in [50, 100, 300] {
                    assert_eq!(
                        window_counts(&scaled, window).unwrap(),
                        window_counts(&weights, window).unwrap(),
                        "{weights:?} x {scale} over {window}"
                    );
                }
            }
        }
        // Weights the window rounds off are told; those it holds to within a hundredth not.
        let notice = rounding_notice(&[0.7, 0.2949, 0.0051], &[70, 29, 1], 100).unwrap();
        assert!(
            notice.contains("source 2 asks 0.0051 of the mix and gets 0.0100"),
            "{notice}"
        );
        assert!(!notice.contains("source 0"), "{notice}");
        assert_eq!(rounding_notice(&[0.7, 0.3], &[70, 30], 100), None);
        // Equal weights a window cannot split evenly: 34 of 100 is 2% over a third.
        let notice = rounding_notice(&[1.0, 1.0, 1.0], &[34, 33, 33], 100).unwrap();
        assert!(
            notice.contains("source 0 asks 0.3333 of the mix and gets 0.3400"),
            "{notice}"
        );
        assert_eq!(
            rounding_notice(&[1.0, 1.0, 1.0], &[100, 100, 100], 300),
            None
        );
        // Finite weights whose sum is not: the counts still fill the window.
        assert_eq!(window_counts(&[1e308, 1e308], 100).unwrap(), vec![50, 50]);
        assert_eq!(
            window_counts(&[f64::MAX, f64::MAX / 3.0, f64::MAX], 10).unwrap(),
            vec![4, 2, 4]
        );
        // Remainders .6 and .4 of 2.6 and 1.4 (window 4): the larger remainder gets the extra.
        assert_eq!(window_counts(&[0.65, 0.35], 4).unwrap(), vec![3, 1]);
        for (weights, needle) in [
            (vec![], "at least one"),
            (vec![1.0, 0.0], "source 1"),
            (vec![f64::NAN], "source 0"),
            (vec![1.0, -2.0], "source 1"),
            (vec![1000.0, 1.0], "raise the window to at least 1001"),
            // The window every starved source needs, not the first one's alone.
            (
                vec![1.0, 0.004, 0.001],
                "source 1 (weight 0.004, 3.98e-3 of the mix) and 1 other source gets 0 of the \
                 100 positions of a window; raise the window to at least 1005",
            ),
            (vec![1.0, 1e-7], "past the most (1048576): raise the weight"),
            (
                vec![1.0, 1e-300],
                "weight 1.000000e-300, 1.00e-300 of the mix",
            ),
            (vec![1.0, 1e-300], "a window would need 1.000e300"),
        ] {
            let message = window_counts(&weights, 100).unwrap_err().to_string();
            assert!(message.contains(needle), "{weights:?}: {message}");
        }
    }

    #[test]
    fn windows_past_the_cap_are_refused() {
        let message = window_counts(&[1.0], MAX_MIX_WINDOW + 1)
            .unwrap_err()
            .to_string();
        assert!(message.contains("window must be in"), "{message}");
        assert_eq!(
            window_counts(&[1.0], MAX_MIX_WINDOW).unwrap(),
            vec![u64::from(MAX_MIX_WINDOW)]
        );
    }

    #[test]
    fn every_window_holds_the_exact_counts_shuffled_or_not() {
        for shuffle in [false, true] {
            let order = MixOrder::new(
                &[0.5, 0.3, 0.2],
                &[1000, 700, 90],
                50,
                MixEnd::AllExhausted,
                9,
                shuffle,
            )
            .unwrap();
            assert_eq!(order.counts(), &[25, 15, 10]);
            for epoch in 0..3 {
                for window in 0..20 {
                    let sources = order.window_sources(epoch, window);
                    for (k, &count) in order.counts().iter().enumerate() {
                        let seen = sources.iter().filter(|&&s| s as usize == k).count() as u64;
                        assert_eq!(seen, count, "epoch {epoch} window {window} source {k}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_interleave_spreads_each_source_evenly() {
        assert_eq!(interleave(&[2, 1]), vec![0, 1, 0]);
        assert_eq!(interleave(&[1, 1]), vec![0, 1]);
        assert_eq!(interleave(&[3, 1]), vec![0, 0, 1, 0]);
    }

    #[test]
    fn draws_count_each_sources_positions_in_order() {
        let order =
            MixOrder::new(&[0.75, 0.25], &[30, 10], 4, MixEnd::FirstExhausted, 3, true).unwrap();
        // 30 / 3 = 10 and 10 / 1 = 10 windows.
        assert_eq!(order.epoch_len(), 40);
        let positions: Vec<u64> = (0..order.epoch_len()).collect();
        let draws = order.draws(5, &positions);
        let mut next = [0u64; 2];
        for draw in &draws {
            assert_eq!(
                draw.draw, next[draw.source],
                "draws of a source go up by one"
            );
            next[draw.source] += 1;
        }
        assert_eq!(next, [30, 10]);
        // Looking positions up out of order gives the same draws.
        let backwards: Vec<u64> = positions.iter().rev().copied().collect();
        let mut again = order.draws(5, &backwards);
        again.reverse();
        assert_eq!(again, draws);
    }

    #[test]
    fn kept_windows_give_the_draws_a_fresh_order_gives() {
        let make = || {
            MixOrder::new(
                &[0.7, 0.3],
                &[7000, 3000],
                100,
                MixEnd::FirstExhausted,
                4,
                true,
            )
            .unwrap()
        };
        let walking = make();
        // A rank of 3 walking its batches of 16, then the same batches again (all kept), then
        // another epoch: each batch's draws are those of an order that kept nothing.
        for epoch in [0, 0, 1] {
            for step in 0..40u64 {
                let positions: Vec<u64> = (0..16).map(|i| (step * 16 + i) * 3 + 1).collect();
                assert_eq!(
                    walking.draws(epoch, &positions),
                    make().draws(epoch, &positions),
                    "epoch {epoch} step {step}"
                );
            }
        }
        // 40 steps of 48 positions met 20 windows per epoch; all are kept (64 at most).
        assert_eq!(walking.kept.len(), 40);
        // Clones share what is kept.
        assert_eq!(walking.clone().kept.len(), 40);
    }

    #[test]
    fn kept_windows_stay_within_their_bounds() {
        let kept = KeptLayouts::default();
        let layout = |n: usize| -> Layout { vec![(0, 0); n].into() };
        for window in 0..100 {
            kept.keep(0, window, layout(10));
        }
        assert_eq!(kept.len(), KEPT_LAYOUT_WINDOWS);
        assert!(kept.get(0, 99).is_some() && kept.get(0, 35).is_none());
        // Two windows of 2^20 positions: only the newest stays past the positions bound.
        kept.keep(1, 0, layout(1 << 20));
        kept.keep(1, 1, layout(1 << 20));
        assert!(kept.get(1, 1).is_some() && kept.get(1, 0).is_some());
        kept.keep(1, 2, layout(1 << 20));
        assert_eq!(kept.len(), 2, "2^21 positions at most besides the newest");
        // One window wider than the bound is still kept.
        kept.keep(2, 0, layout((1 << 21) + 1));
        assert_eq!(kept.len(), 1);
        assert!(kept.get(2, 0).is_some());
    }

    #[test]
    fn each_epoch_rule_has_its_length() {
        let lens = [1000, 250];
        let first = MixOrder::new(&[0.8, 0.2], &lens, 10, MixEnd::FirstExhausted, 0, true).unwrap();
        // counts 8 and 2: 1000 / 8 = 125 and 250 / 2 = 125 windows; make the second shorter.
        assert_eq!(first.epoch_len(), 1250);
        let lens = [1000, 100];
        let first = MixOrder::new(&[0.8, 0.2], &lens, 10, MixEnd::FirstExhausted, 0, true).unwrap();
        assert_eq!(first.epoch_len(), 50 * 10, "100 / 2 = 50 windows");
        let all = MixOrder::new(&[0.8, 0.2], &lens, 10, MixEnd::AllExhausted, 0, true).unwrap();
        assert_eq!(all.epoch_len(), 125 * 10, "1000 / 8 = 125 windows");
        let fixed = MixOrder::new(&[0.8, 0.2], &lens, 10, MixEnd::Samples(77), 0, true).unwrap();
        assert_eq!(fixed.epoch_len(), 77);
        let message = MixOrder::new(&[0.5, 0.5], &[100, 3], 10, MixEnd::FirstExhausted, 0, true)
            .unwrap_err()
            .to_string();
        assert!(message.contains("source 1 has 3 samples"), "{message}");
        assert!(MixOrder::new(&[1.0], &[5], 10, MixEnd::Samples(0), 0, true).is_err());
        assert!(MixOrder::new(&[1.0, 1.0], &[5, 0], 10, MixEnd::AllExhausted, 0, true).is_err());
    }

    #[test]
    fn the_order_depends_on_seed_and_epoch_only() {
        let make = |seed| {
            MixOrder::new(
                &[0.6, 0.4],
                &[600, 400],
                100,
                MixEnd::FirstExhausted,
                seed,
                true,
            )
            .unwrap()
        };
        let positions: Vec<u64> = (0..1000).collect();
        assert_eq!(make(1).draws(2, &positions), make(1).draws(2, &positions));
        assert_ne!(make(1).draws(2, &positions), make(2).draws(2, &positions));
        assert_ne!(make(1).draws(2, &positions), make(1).draws(3, &positions));
        assert_ne!(source_epoch(4, 0), source_epoch(4, 1));
        assert_eq!(source_epoch(4, 0), 4);
        assert_ne!(source_seed(1, 0), source_seed(1, 1));
    }
}
