//! Reproducible randomness shared by workers.
//!
//! Every random quantity of round `t` is drawn from a ChaCha8 stream whose 256-bit key is
//! `(seed, purpose, worker, 0)` (four little-endian `u64` words) and whose stream number is
//! the round. It is therefore a pure function of `(seed, round)` (shared quantities use
//! `worker = SHARED`) or of `(seed, round, worker)` (per-worker quantities), and every process
//! recomputes it identically, on any thread count.

use rand::RngExt;

use crate::error::{CoreError, Result};
use crate::mem;
use rand_chacha::rand_core::{Rng, SeedableRng};
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
    /// CoordinateSampling's owner of every coordinate.
    CoordinateSampling = 5,
    /// The shared permutation of [`shared_permutation`] (the permutation of mappings).
    Mapping = 6,
    /// PermK's `"rebalance"` sampler: the independent owners of one chunk of coordinates
    /// (the stream's `worker` word is the chunk's index; [`crate::balanced`]).
    OwnerChunk = 7,
    /// PermK's `"rebalance"` sampler: the workers with a leftover coordinate, the released
    /// coordinates and their new owners (one shared stream; [`crate::balanced`]).
    Rebalance = 8,
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
/// multiply with Canon's correction).
#[inline(always)]
pub(crate) fn below_inclusive(rng: &mut ChaCha8Rng, hi: usize) -> usize {
    if hi <= u32::MAX as usize {
        below_inclusive_u32(rng, hi as u32) as usize
    } else {
        rng.random_range(0..=hi as u64) as usize
    }
}

/// `rng.random_range(0..=hi)` for `u32` exactly as rand 0.10 computes it with the `unbiased`
/// feature (Canon's method on `next_u32` draws), written out so that the shuffles' hot loops
/// never depend on the compiler inlining rand's generic code. The outputs are identical (see
/// the test `bounded_draws_match_rand`).
#[inline(always)]
fn below_inclusive_u32(rng: &mut ChaCha8Rng, hi: u32) -> u32 {
    let range = hi.wrapping_add(1);
    if range == 0 {
        return rng.next_u32();
    }
    let wmul = |x: u32| {
        let t = x as u64 * range as u64;
        ((t >> 32) as u32, t as u32)
    };
    let (mut result, mut lo) = wmul(rng.next_u32());
    while lo > range.wrapping_neg() {
        let (new_hi, new_lo) = wmul(rng.next_u32());
        match lo.checked_add(new_hi) {
            Some(x) if x < u32::MAX => break,
            None => {
                result += 1;
                break;
            }
            _ => lo = new_lo,
        }
    }
    result
}

/// In-place Fisher–Yates (Durstenfeld) shuffle: `O(len)` work and `len - 1` bounded draws.
pub fn shuffle<T>(rng: &mut ChaCha8Rng, v: &mut [T]) {
    for i in (1..v.len()).rev() {
        let j = below_inclusive(rng, i);
        v.swap(i, j);
    }
}

/// [`shuffle`] (the same draws, the same result) calling `visit(i, v[i])` as soon as entry `i`
/// is final: for `i = len−1, …, 1` right after step `i`, then for `i = 0`.
#[inline]
pub fn shuffle_visit<T: Copy>(rng: &mut ChaCha8Rng, v: &mut [T], mut visit: impl FnMut(usize, T)) {
    for i in (1..v.len()).rev() {
        let j = below_inclusive(rng, i);
        v.swap(i, j);
        visit(i, v[i]);
    }
    if let Some(&v0) = v.first() {
        visit(0, v0);
    }
}

/// A uniformly random permutation of `0..len` (`len <= 2^32`), allocated fallibly.
pub fn permutation(rng: &mut ChaCha8Rng, len: usize) -> Result<Vec<u32>> {
    if len > 1 << 32 {
        return Err(CoreError::invalid("n", format!("a permutation of {len} elements needs more than 32-bit labels")));
    }
    let mut p = mem::collect("the permutation", len, (0..len as u64).map(|v| v as u32))?;
    shuffle(rng, &mut p);
    Ok(p)
}

/// A uniformly random permutation of `0..n` shared by all workers: a pure function of
/// `(seed, round)` (its own stream, [`Purpose::Mapping`]).
pub fn shared_permutation(seed: u64, round: u64, n: usize) -> Result<Vec<i64>> {
    mem::Need::new().array::<i64>("the permutation", &[n]).check()?;
    let mut p = mem::collect("the permutation", n, (0..n as u64).map(|v| v as i64))?;
    shuffle(&mut stream(seed, Purpose::Mapping, SHARED, round), &mut p);
    Ok(p)
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

/// Draws uniform `k`-subsets of `0..d` in uniform order: the first `k` entries of a partial
/// Fisher–Yates shuffle of the identity, exactly as [`sample_without_replacement`] computes
/// them (same draws, same output), in `O(k)` per sample. For `d` large against `k` the
/// shuffled identity is not stored: a small open-addressing table keeps the displaced
/// positions only (so no `O(d)` buffer is built or touched at random).
pub struct Sampler {
    d: usize,
    /// Dense mode: the identity (restored after every sample) and the swaps to undo.
    dense: Vec<u32>,
    swaps: Vec<(u32, u32)>,
    /// Sparse mode: position -> value of the displaced positions (`EMPTY` keys are free).
    keys: Vec<u32>,
    vals: Vec<u32>,
    shift: u32,
}

const EMPTY: u32 = u32::MAX;

impl Sampler {
    /// A sampler of `k`-subsets (`1 <= k <= d < 2^32`).
    pub fn new(d: usize, k: usize) -> Result<Self> {
        let sparse = Self::is_sparse(d, k);
        let (keys, vals, shift) = if sparse {
            let cap = (2 * k).next_power_of_two().max(16);
            (mem::filled("RandK's sample table", cap, EMPTY)?, mem::filled("RandK's sample table", cap, 0)?, 64 - cap.trailing_zeros())
        } else {
            (Vec::new(), Vec::new(), 0)
        };
        let dense = if sparse { Vec::new() } else { mem::collect("RandK's sample buffer", d, 0..d as u32)? };
        let swaps = mem::vec("RandK's sample buffer", if sparse { 0 } else { k })?;
        Ok(Sampler { d, dense, swaps, keys, vals, shift })
    }

    fn is_sparse(d: usize, k: usize) -> bool {
        d > 4096 && d > 16 * k
    }

    /// The bytes [`Self::new`] allocates.
    pub fn bytes(d: usize, k: usize) -> u128 {
        if Self::is_sparse(d, k) {
            8 * (2 * k as u128).next_power_of_two().max(16)
        } else {
            12 * d as u128
        }
    }

    #[inline]
    fn slot(&self, pos: u32) -> usize {
        ((pos as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    #[inline]
    fn get(&self, pos: u32) -> u32 {
        let mask = self.keys.len() - 1;
        let mut i = self.slot(pos);
        loop {
            match self.keys[i] {
                k if k == pos => return self.vals[i],
                EMPTY => return pos,
                _ => i = (i + 1) & mask,
            }
        }
    }

    #[inline]
    fn set(&mut self, pos: u32, val: u32) {
        let mask = self.keys.len() - 1;
        let mut i = self.slot(pos);
        while self.keys[i] != pos && self.keys[i] != EMPTY {
            i = (i + 1) & mask;
        }
        self.keys[i] = pos;
        self.vals[i] = val;
    }

    /// A uniform `k`-subset in uniform order into `out` (`k` at most the `k` of [`Self::new`]).
    pub fn sample(&mut self, rng: &mut ChaCha8Rng, k: usize, out: &mut Vec<u32>) {
        let d = self.d;
        out.clear();
        if self.keys.is_empty() {
            for i in 0..k {
                let j = i + below_inclusive(rng, d - 1 - i);
                self.dense.swap(i, j);
                self.swaps.push((i as u32, j as u32));
                out.push(self.dense[i]);
            }
            for &(i, j) in self.swaps.iter().rev() {
                self.dense.swap(i as usize, j as usize);
            }
            self.swaps.clear();
        } else {
            debug_assert!(2 * k <= self.keys.len());
            for i in 0..k {
                let j = i + below_inclusive(rng, d - 1 - i);
                let vj = self.get(j as u32);
                if j != i {
                    let vi = self.get(i as u32);
                    self.set(j as u32, vi);
                }
                out.push(vj);
            }
            self.keys.fill(EMPTY);
        }
    }
}

/// Uniform in `[0, 1)` with 53 random bits.
#[inline]
pub fn unit(rng: &mut ChaCha8Rng) -> f64 {
    rng.random::<f64>()
}

/// MARINA's shared coin of round `t`: `true` with probability `p`, a probability in
/// `[0, 1]` (anything else, NaN included, is an error naming `p`).
pub fn coin(seed: u64, round: u64, p: f64) -> Result<bool> {
    if !(0.0..=1.0).contains(&p) {
        return Err(CoreError::invalid("p", format!("must be a probability in [0, 1], got {p}")));
    }
    if p >= 1.0 {
        return Ok(true);
    }
    Ok(unit(&mut stream(seed, Purpose::Coin, SHARED, round)) < p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_pure_functions() {
        let a = permutation(&mut stream(7, Purpose::Permutation, SHARED, 3), 50).unwrap();
        let b = permutation(&mut stream(7, Purpose::Permutation, SHARED, 3), 50).unwrap();
        let c = permutation(&mut stream(7, Purpose::Permutation, SHARED, 4), 50).unwrap();
        let e = permutation(&mut stream(8, Purpose::Permutation, SHARED, 3), 50).unwrap();
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
            let p = permutation(&mut stream(1, Purpose::Permutation, SHARED, t), 3).unwrap();
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
    fn bounded_draws_match_rand() {
        let mut a = stream(5, Purpose::Permutation, SHARED, 0);
        let mut b = a.clone();
        for i in 0..200_000u64 {
            // small, large and near-2^32 ranges (where Canon's correction kicks in often)
            let hi = match i % 4 {
                0 => (i % 97) as u32,
                1 => (i * 7919 % 1_000_003) as u32,
                2 => u32::MAX - (i % 1000) as u32,
                _ => (3u64 << 30) as u32 + (i % 5) as u32,
            };
            assert_eq!(below_inclusive_u32(&mut a, hi), b.random_range(0..=hi), "i = {i}, hi = {hi}");
        }
    }

    #[test]
    fn sampler_matches_the_dense_partial_shuffle() {
        for (d, k) in [(1usize, 1usize), (5, 5), (4097, 3), (10_000, 1), (10_000, 600), (100_000, 100), (70_000, 4375)] {
            let mut buf: Vec<u32> = (0..d as u32).collect();
            let mut sampler = Sampler::new(d, k).unwrap();
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for round in 0..20 {
                let kk = 1 + (round as usize * 7919) % k;
                sample_without_replacement(&mut stream(9, Purpose::RandK, 3, round), &mut buf, kk, &mut a);
                sampler.sample(&mut stream(9, Purpose::RandK, 3, round), kk, &mut b);
                assert_eq!(a, b, "d={d} k={kk}");
            }
            assert_eq!(buf, (0..d as u32).collect::<Vec<u32>>());
        }
    }

    #[test]
    fn coin_frequency() {
        let heads = (0..20_000u64).filter(|&t| coin(11, t, 0.25).unwrap()).count() as f64;
        // mean 5000, sd ~61: 6 sd tolerance
        assert!((heads - 5000.0).abs() < 370.0, "heads = {heads}");
        assert!(coin(11, 0, 1.0).unwrap());
        assert!(!coin(11, 0, 0.0).unwrap());
    }

    #[test]
    fn coin_refuses_what_is_not_a_probability() {
        for p in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 2.0, 1.0 + f64::EPSILON, -0.5, -f64::MIN_POSITIVE] {
            let e = coin(11, 0, p).unwrap_err();
            assert!(matches!(&e, CoreError::InvalidArgument { name, .. } if name == "p"), "p = {p}: {e:?}");
        }
    }
}
