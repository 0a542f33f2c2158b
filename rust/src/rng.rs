//! Reproducible randomness shared by workers.
//!
//! Every random quantity of round `t` is drawn from a ChaCha8 stream whose 256-bit key is
//! `(seed, purpose, worker, 0)` (four little-endian `u64` words) and whose stream number is
//! the round. It is therefore a pure function of `(seed, round)` (shared quantities use
//! `worker = SHARED`) or of `(seed, round, worker)` (per-worker quantities), and every process
//! recomputes it identically, on any thread count.

use rand::RngExt;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Marker for randomness shared by all workers.
pub const SHARED: u64 = u64::MAX;

/// What a stream is used for: distinct purposes never share a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Purpose {
    /// The coordinate permutation(s) of PermK / BlockPermK.
    Permutation = 1,
    /// RandK's per-worker coordinate sample.
    RandK = 2,
    /// A quantizer's per-worker rounding.
    Quantizer = 3,
    /// MARINA's Bernoulli(p) coin.
    Coin = 4,
}

/// The ChaCha8 stream of `(seed, purpose, worker)` at `round`.
pub fn stream(seed: u64, purpose: Purpose, worker: u64, round: u64) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    key[0..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&(purpose as u64).to_le_bytes());
    key[16..24].copy_from_slice(&worker.to_le_bytes());
    let mut rng = ChaCha8Rng::from_seed(key);
    rng.set_stream(round);
    rng
}

/// Uniform integer in `0..=hi`, unbiased (rand's `unbiased` feature: Lemire's widening
/// multiply with rejection).
#[inline]
fn below_inclusive(rng: &mut ChaCha8Rng, hi: usize) -> usize {
    if hi <= u32::MAX as usize {
        rng.random_range(0..=hi as u32) as usize
    } else {
        rng.random_range(0..=hi as u64) as usize
    }
}

/// In-place Fisher–Yates (Durstenfeld) shuffle: `O(len)` work and `len - 1` bounded draws.
pub fn shuffle<T>(rng: &mut ChaCha8Rng, v: &mut [T]) {
    for i in (1..v.len()).rev() {
        let j = below_inclusive(rng, i);
        v.swap(i, j);
    }
}

/// A uniformly random permutation of `0..len`.
pub fn permutation(rng: &mut ChaCha8Rng, len: usize) -> Vec<u32> {
    let mut p: Vec<u32> = (0..len as u32).collect();
    shuffle(rng, &mut p);
    p
}

/// First `k` entries of a partial Fisher–Yates shuffle of `buf` (which must hold a permutation
/// of `0..d`): a uniform `k`-subset in uniform order. `buf` is restored afterwards, so a
/// single identity buffer serves any number of workers in `O(k)` each.
pub fn sample_without_replacement(rng: &mut ChaCha8Rng, buf: &mut [u32], k: usize, out: &mut Vec<u32>) {
    let d = buf.len();
    out.clear();
    let mut swaps: Vec<(usize, usize)> = Vec::with_capacity(k);
    for i in 0..k {
        let j = i + below_inclusive(rng, d - 1 - i);
        buf.swap(i, j);
        swaps.push((i, j));
        out.push(buf[i]);
    }
    for &(i, j) in swaps.iter().rev() {
        buf.swap(i, j);
    }
}

/// Uniform in `[0, 1)` with 53 random bits.
#[inline]
pub fn unit(rng: &mut ChaCha8Rng) -> f64 {
    rng.random::<f64>()
}

/// MARINA's shared coin of round `t`: `true` with probability `p`.
pub fn coin(seed: u64, round: u64, p: f64) -> bool {
    if p >= 1.0 {
        return true;
    }
    unit(&mut stream(seed, Purpose::Coin, SHARED, round)) < p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_pure_functions() {
        let a = permutation(&mut stream(7, Purpose::Permutation, SHARED, 3), 50);
        let b = permutation(&mut stream(7, Purpose::Permutation, SHARED, 3), 50);
        let c = permutation(&mut stream(7, Purpose::Permutation, SHARED, 4), 50);
        let e = permutation(&mut stream(8, Purpose::Permutation, SHARED, 3), 50);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, e);
        let mut s = a.clone();
        s.sort_unstable();
        assert_eq!(s, (0..50).collect::<Vec<u32>>());
    }

    #[test]
    fn shuffle_is_uniform_on_s3() {
        // 6 permutations of 3 elements, 60_000 draws: chi-square with 5 dof.
        let mut counts = std::collections::HashMap::new();
        let n = 60_000u64;
        for t in 0..n {
            let p = permutation(&mut stream(1, Purpose::Permutation, SHARED, t), 3);
            *counts.entry(p).or_insert(0u64) += 1;
        }
        assert_eq!(counts.len(), 6);
        let e = n as f64 / 6.0;
        let chi2: f64 = counts.values().map(|&c| (c as f64 - e).powi(2) / e).sum();
        // P(chi2_5 > 20.5) < 0.001
        assert!(chi2 < 20.5, "chi2 = {chi2}");
    }

    #[test]
    fn sample_without_replacement_restores_buffer() {
        let mut buf: Vec<u32> = (0..20).collect();
        let mut out = Vec::new();
        let mut rng = stream(3, Purpose::RandK, 0, 0);
        sample_without_replacement(&mut rng, &mut buf, 7, &mut out);
        assert_eq!(buf, (0..20).collect::<Vec<u32>>());
        let mut s = out.clone();
        s.sort_unstable();
        s.dedup();
        assert_eq!(s.len(), 7);
        assert!(s.iter().all(|&j| j < 20));
    }

    #[test]
    fn coin_frequency() {
        let heads = (0..20_000u64).filter(|&t| coin(11, t, 0.25)).count() as f64;
        // mean 5000, sd ~61: 6 sd tolerance
        assert!((heads - 5000.0).abs() < 370.0, "heads = {heads}");
        assert!(coin(11, 0, 1.0));
    }
}
