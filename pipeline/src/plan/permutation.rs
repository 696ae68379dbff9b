//! A seeded bijection over `[0, n)` evaluated on demand: a balanced Feistel network over the
//! smallest even-bit power of two that holds `n`, with cycle walking back into range. O(1)
//! memory and O(1) expected time per lookup (fewer than 4 walks on average), for any `n` up to
//! 2^62.

/// Number of Feistel rounds; 6 rounds of a strong mixer shuffle well past what training needs.
const ROUNDS: usize = 6;

/// SplitMix64's finaliser.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A keyed permutation of `[0, n)`.
#[derive(Debug, Clone)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    half_mask: u64,
    round_keys: [u64; ROUNDS],
}

impl Permutation {
    /// The permutation of `[0, n)` selected by `key`.
    pub fn new(n: u64, key: u64) -> Self {
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        let half_bits = bits.div_ceil(2).max(1);
        let mut round_keys = [0u64; ROUNDS];
        let mut state = mix64(key ^ 0x7065_726d_7574_6531);
        for round_key in &mut round_keys {
            state = mix64(state.wrapping_add(0x9e37_79b9_7f4a_7c15));
            *round_key = state;
        }
        Self {
            n,
            half_bits,
            half_mask: (1u64 << half_bits) - 1,
            round_keys,
        }
    }

    /// Size of the domain.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// True for the empty domain.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    fn encrypt(&self, value: u64) -> u64 {
        let mut left = value >> self.half_bits;
        let mut right = value & self.half_mask;
        for key in &self.round_keys {
            let next = left ^ (mix64(right ^ key) & self.half_mask);
            left = right;
            right = next;
        }
        (left << self.half_bits) | right
    }

    /// The image of `position`, which must be below `len()`.
    pub fn apply(&self, position: u64) -> u64 {
        debug_assert!(position < self.n);
        let mut value = self.encrypt(position);
        while value >= self.n {
            value = self.encrypt(value);
        }
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_domains_are_bijections() {
        for n in 1..300u64 {
            let perm = Permutation::new(n, n * 31 + 7);
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let v = perm.apply(i);
                assert!(v < n);
                assert!(!seen[v as usize], "n={n}: {v} twice");
                seen[v as usize] = true;
            }
        }
    }

    #[test]
    fn huge_domains_stay_in_range() {
        let n = 1u64 << 40;
        let perm = Permutation::new(n, 42);
        for i in (0..n).step_by((n / 1000) as usize) {
            assert!(perm.apply(i) < n);
        }
        let n = (1u64 << 40) + 12_345;
        let perm = Permutation::new(n, 43);
        assert!(perm.apply(n - 1) < n);
    }
}
