//! PermK's round as a uniformly random *balanced* assignment of the `d` coordinates to the `n`
//! workers, drawn in coordinate order (PermK's `"rebalance"` sampler, its default).
//!
//! PermK's messages depend only on which worker owns each coordinate. With `d = kn + r`, the
//! owners of the general definition (`L[σ(j)]`, `L = (0^k, …, (n−1)^k, τ_0, …, τ_{r−1})`, `σ`
//! and `τ` uniform) are a uniformly random arrangement of the counts `c_i = k + [i ∈ τ[..r]]`:
//! every assignment in which worker `i` owns exactly `c_i` coordinates is equally likely. This
//! module draws that distribution without a shuffle of `d` labels (random access, `O(d)` cache
//! misses):
//!
//! 1. **Independent owners, in chunks.** The coordinates are cut into fixed chunks of
//!    [`chunk_len`] (a function of `n` only); chunk `c`'s owners are independent and uniform over
//!    the workers, drawn from their own stream `(seed, OwnerChunk, c, round)`
//!    ([`Labeler`]: `m` labels from one 64-bit word, `n^m ≤ 2^56`, about `log2 n` random bits
//!    per coordinate), and counted per worker. The chunks are independent, so they are
//!    drawn on the pool's threads.
//! 2. **Rebalancing.** From one shared stream `(seed, Rebalance, SHARED, round)`: `τ` (when
//!    `r > 0`), hence the counts `c_i`; each worker with `X_i > c_i` coordinates releases a
//!    uniformly random subset of `X_i − c_i` of them (ranks among its coordinates in coordinate
//!    order, Floyd's algorithm), and the released coordinates, in coordinate order, take the
//!    labels of a uniform shuffle of the missing ones (`c_i − X_i` copies of each worker `i`
//!    short of its count). `Σ (X_i − c_i)⁺` is about `0.4·sqrt(nd)`, a small fraction of `d`.
//!    The released coordinates are located chunk by chunk (on the pool's threads), from the
//!    per-chunk counts.
//!
//! **Why this is exactly uniform.** Given `τ`, every step is equivariant under relabelling the
//! coordinates: permuting the coordinates of an independent uniform assignment gives an
//! independent uniform assignment, a uniform subset of a worker's coordinates and a uniform
//! arrangement of the missing labels over the released ones are defined without reference to
//! the coordinates' order. So the output's distribution is invariant under every permutation
//! of the coordinates, and it is supported on the assignments with counts `c`, on which the
//! permutations act transitively: it is the uniform distribution on them (the tests check it
//! by exact enumeration on small cases). Every worker's coordinates are then listed in
//! increasing order by the owners' plan form, as for every owners assignment.
//!
//! The result is a pure function of `(seed, round, n, d)`: the chunks, their streams and the
//! rebalancing never depend on the number of threads.

use std::collections::HashSet;

use rand_chacha::rand_core::Rng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use crate::error::Result;
use crate::mem;
use crate::plan::{count_labels, Label, Owner};
use crate::rng::{self, Purpose, SHARED};
use crate::threads;

/// The smallest chunk of coordinates (see [`chunk_len`]).
pub const MIN_CHUNK: usize = 1 << 16;
/// Rounds of at least this many coordinates draw and rebalance their chunks on the pool's threads.
pub const PAR_THRESHOLD: usize = 1 << 18;
/// A chunk with at most this many workers releasing coordinates finds them worker by worker
/// (a vectorised count of its labels per block); more, in one pass over its labels.
const SCAN_WORKERS: usize = 32;

/// The coordinates per chunk for `n` workers: [`MIN_CHUNK`], or more so that a chunk has at
/// least `32 n` coordinates (its `n` counts then cost at most 1/8 of a label each).
pub fn chunk_len(n: usize) -> usize {
    MIN_CHUNK.max(n.saturating_mul(32).next_power_of_two())
}

/// A source of uniform integers in `0..=hi`: the rebalancing stream (ChaCha8, the crate's
/// unbiased bounded draws), or an enumeration of every outcome in the tests.
pub trait Draw {
    fn below_inclusive(&mut self, hi: usize) -> usize;
}

impl Draw for ChaCha8Rng {
    #[inline]
    fn below_inclusive(&mut self, hi: usize) -> usize {
        rng::below_inclusive(self, hi)
    }
}

/// Fisher–Yates exactly as [`rng::shuffle`] (the same draws on a ChaCha8 stream).
fn shuffle<T, R: Draw>(rng: &mut R, v: &mut [T]) {
    for i in (1..v.len()).rev() {
        let j = rng.below_inclusive(i);
        v.swap(i, j);
    }
}

/// The largest `m` with `n^m ≤ 2^56`, and `n^m` (`n ≥ 2`).
fn digits_per_word(n: usize) -> (usize, u64) {
    let (mut m, mut p) = (0usize, 1u64);
    while let Some(q) = p.checked_mul(n as u64).filter(|&q| q <= 1 << 56) {
        p = q;
        m += 1;
    }
    (m, p)
}

/// Draws independent uniform labels in `0..n` (`n ≥ 2`): each 64-bit word `x` of the stream
/// gives the `m` base-`n` digits of `⌊x·n^m / 2^64⌋` (most significant first;
/// [`digits_per_word`]), accepted unless the low word of `x·n^m` is below `2^64 mod n^m`
/// (Lemire's rejection for the range `n^m`, probability below `2^−8`): the digits are then
/// exactly uniform and independent. A chunk's last labels are the first digits of one more word.
///
/// For `n = 2^b` nothing is rejected and the digits are the word's `b`-bit fields from the top;
/// with `b` dividing 8 they are read a byte at a time from a table (the same labels).
pub struct Labeler<L> {
    n: usize,
    m: usize,
    reject_below: u64,
    /// `n = 2^b`, `b` in {1, 2, 4, 8}: the `8/b` labels of every byte.
    table: Vec<[L; 8]>,
}

impl<L: Label> Labeler<L> {
    pub fn new(n: usize) -> Self {
        let (m, p) = digits_per_word(n);
        let mut table = Vec::new();
        if n.is_power_of_two() && 8 % n.trailing_zeros() == 0 {
            let b = n.trailing_zeros();
            table = (0..256usize)
                .map(|v| {
                    let mut t = [L::of(0); 8];
                    for (k, o) in t.iter_mut().take((8 / b) as usize).enumerate() {
                        *o = L::of((v >> (8 - b * (k as u32 + 1))) & (n - 1));
                    }
                    t
                })
                .collect();
        }
        Labeler { n, m, reject_below: p.wrapping_neg() % p, table }
    }

    /// Labels from `rng` into `out`.
    pub fn fill(&self, rng: &mut ChaCha8Rng, out: &mut [L]) {
        let (n, m) = (self.n, self.m);
        if !self.table.is_empty() {
            // m = 56/b labels: the word's top 7 bytes, 8/b labels each
            match m / 7 {
                8 => self.fill_bytes::<8>(rng, out),
                4 => self.fill_bytes::<4>(rng, out),
                2 => self.fill_bytes::<2>(rng, out),
                _ => self.fill_bytes::<1>(rng, out),
            }
        } else if n.is_power_of_two() {
            let b = n.trailing_zeros();
            let mask = n as u64 - 1;
            for block in out.chunks_mut(m) {
                let x = rng.next_u64();
                for (t, o) in block.iter_mut().enumerate() {
                    *o = L::of(((x >> (64 - b * (t as u32 + 1))) & mask) as usize);
                }
            }
        } else {
            let nn = n as u64;
            for block in out.chunks_mut(m) {
                loop {
                    let mut x = rng.next_u64();
                    for o in block.iter_mut() {
                        let t = x as u128 * nn as u128;
                        *o = L::of((t >> 64) as usize);
                        x = t as u64;
                    }
                    // the digits not written (a last, short block) leave the low word to multiply on
                    for _ in block.len()..m {
                        x = (x as u128 * nn as u128) as u64;
                    }
                    if x >= self.reject_below {
                        break;
                    }
                }
            }
        }
    }
}

impl<L: Label> Labeler<L> {
    /// [`Labeler::fill`] from the table: `PER = 8/b` labels per byte, 7 bytes per word.
    fn fill_bytes<const PER: usize>(&self, rng: &mut ChaCha8Rng, out: &mut [L]) {
        let m = 7 * PER;
        let mut blocks = out.chunks_exact_mut(m);
        for block in &mut blocks {
            let x = rng.next_u64();
            for (k, part) in block.chunks_exact_mut(PER).enumerate() {
                let t: &[L; 8] = &self.table[((x >> (56 - 8 * k)) & 0xFF) as usize];
                part.copy_from_slice(&t[..PER]);
            }
        }
        let rest = blocks.into_remainder();
        if !rest.is_empty() {
            let x = rng.next_u64();
            for (k, part) in rest.chunks_mut(PER).enumerate() {
                let t = &self.table[((x >> (56 - 8 * k)) & 0xFF) as usize];
                part.copy_from_slice(&t[..part.len()]);
            }
        }
    }
}

/// [`Labeler::fill`] with a labeler made for this call.
pub fn uniform_labels<L: Label>(rng: &mut ChaCha8Rng, n: usize, out: &mut [L]) {
    Labeler::new(n).fill(rng, out)
}

/// Chunk `c`'s independent owners from its stream, and their counts per worker (`counts`,
/// `n` of them, zero before).
fn draw_chunk<L: Label>(labeler: &Labeler<L>, seed: u64, round: u64, c: usize, labels: &mut [L], counts: &mut [usize]) {
    let mut rng = rng::stream(seed, Purpose::OwnerChunk, c as u64, round);
    labeler.fill(&mut rng, labels);
    count_labels(labels, counts);
}

/// Releases of one worker in one chunk: the ranks `ranks[lo..hi]` (counted over the worker's
/// coordinates from 0; `base` of them lie in earlier chunks).
#[derive(Clone, Copy, Debug)]
struct Job {
    worker: u32,
    lo: usize,
    hi: usize,
    base: u32,
}

/// A uniformly random `s`-subset of `0..x` (Floyd's algorithm), appended to `out` in increasing
/// order. For `x ≤ 64` (a worker's excess over its share is drawn from its few coordinates: the
/// common case, once per over-full worker of every round) the set is a bit mask, not a hash set:
/// the same draws, the same subset.
fn sorted_subset<R: Draw>(rng: &mut R, x: usize, s: usize, out: &mut Vec<u32>) -> Result<()> {
    if x <= 64 {
        let mut set = 0u64;
        for j in x - s..x {
            let t = rng.below_inclusive(j);
            set |= if set >> t & 1 == 0 { 1u64 << t } else { 1u64 << j };
        }
        out.try_reserve(s).map_err(|_| mem::alloc_error::<u32>("the released coordinates", &[out.len() + s]))?;
        while set != 0 {
            out.push(set.trailing_zeros());
            set &= set - 1;
        }
        return Ok(());
    }
    sorted_subset_hashed(rng, x, s, out)
}

/// [`sorted_subset`] with a hash set (any `x`).
fn sorted_subset_hashed<R: Draw>(rng: &mut R, x: usize, s: usize, out: &mut Vec<u32>) -> Result<()> {
    let mut set: HashSet<u32> = HashSet::new();
    set.try_reserve(s).map_err(|_| mem::alloc_error::<u32>("the released coordinates", &[s]))?;
    for j in x - s..x {
        let t = rng.below_inclusive(j) as u32;
        if !set.insert(t) {
            set.insert(j as u32);
        }
    }
    let start = out.len();
    out.extend(set);
    out[start..].sort_unstable();
    Ok(())
}

/// Steps 2 of the module's description on the independent owners `labels` (chunks of `chunk`
/// coordinates, whose counts per worker are `counts[c·n .. (c+1)·n]`): the balanced owners, in
/// place. `scan_workers` is [`SCAN_WORKERS`] (smaller or larger in the tests, to run both ways
/// of locating the releases: the result is the same).
fn rebalance<L: Label, R: Draw>(labels: &mut [L], counts: &[usize], n: usize, chunk: usize, rng: &mut R, parallel: bool, scan_workers: usize) -> Result<Vec<usize>> {
    let d = labels.len();
    let chunks = d.div_ceil(chunk);
    let (k, r) = (d / n, d % n);
    let mut have = mem::filled("the workers' counts", n, 0usize)?;
    for c in counts.chunks(n) {
        have.iter_mut().zip(c).for_each(|(h, &x)| *h += x);
    }
    let mut want = mem::filled("the workers' counts", n, k)?;
    if r > 0 {
        let mut tau = mem::collect("the permutation", n, (0..n as u64).map(|v| v as u32))?;
        shuffle(rng, &mut tau);
        for &w in &tau[..r] {
            want[w as usize] += 1;
        }
    }
    let released: usize = have.iter().zip(&want).map(|(&h, &w)| h.saturating_sub(w)).sum();
    if released == 0 {
        return Ok(want);
    }
    // the releases: ranks among each worker's coordinates, worker by worker
    let mut ranks = mem::vec::<u32>("the released coordinates", released)?;
    let mut over = mem::vec::<(u32, usize, usize)>("the released coordinates", n.min(released))?;
    for i in 0..n {
        if have[i] > want[i] {
            let lo = ranks.len();
            sorted_subset(rng, have[i], have[i] - want[i], &mut ranks)?;
            over.push((i as u32, lo, ranks.len()));
        }
    }
    // their new owners, in coordinate order
    let mut missing = mem::vec::<L>("the released coordinates' owners", released)?;
    for i in 0..n {
        missing.extend(std::iter::repeat(L::of(i)).take(want[i].saturating_sub(have[i])));
    }
    shuffle(rng, &mut missing);
    // the releases of every chunk
    let mut jobs = mem::vec::<Job>("the releases", over.len())?;
    let mut chunk_jobs = mem::vec::<usize>("the releases", chunks + 1)?;
    let mut chunk_out = mem::vec::<usize>("the releases", chunks + 1)?;
    let mut next: Vec<(usize, u32)> = mem::collect("the releases", over.len(), over.iter().map(|&(_, lo, _)| (lo, 0u32)))?;
    chunk_jobs.push(0);
    chunk_out.push(0);
    let mut out = 0;
    for c in 0..chunks {
        let cc = &counts[c * n..(c + 1) * n];
        for (&(w, _, hi), (p, base)) in over.iter().zip(next.iter_mut()) {
            let end = *base + cc[w as usize] as u32;
            let q = *p + ranks[*p..hi].partition_point(|&x| x < end);
            if q > *p {
                jobs.try_reserve(1).map_err(|_| mem::alloc_error::<Job>("the releases", &[jobs.len() + 1]))?;
                jobs.push(Job { worker: w, lo: *p, hi: q, base: *base });
                out += q - *p;
            }
            *p = q;
            *base = end;
        }
        chunk_jobs.push(jobs.len());
        chunk_out.push(out);
    }
    let place_chunk = |c: usize, lab: &mut [L]| -> Result<()> {
        place(lab, &jobs[chunk_jobs[c]..chunk_jobs[c + 1]], &ranks, &missing[chunk_out[c]..chunk_out[c + 1]], n, scan_workers)
    };
    if parallel {
        threads::install(|| labels.par_chunks_mut(chunk).enumerate().try_for_each(|(c, lab)| place_chunk(c, lab)))??;
    } else {
        labels.chunks_mut(chunk).enumerate().try_for_each(|(c, lab)| place_chunk(c, lab))?;
    }
    Ok(want)
}

/// One chunk's releases `jobs` get the owners `missing`, in coordinate order.
fn place<L: Label>(lab: &mut [L], jobs: &[Job], ranks: &[u32], missing: &[L], n: usize, scan_workers: usize) -> Result<()> {
    if jobs.is_empty() {
        return Ok(());
    }
    let mut pos = mem::vec::<u32>("the released coordinates", missing.len())?;
    if jobs.len() <= scan_workers {
        // worker by worker: count its labels per block of 64 (vectorised), and look into the
        // blocks that hold a release only
        for job in jobs {
            let w = L::of(job.worker as usize);
            let mut want = ranks[job.lo..job.hi].iter().map(|&x| x - job.base);
            let Some(mut next) = want.next() else { continue };
            let mut seen = 0u32;
            'blocks: for (b, block) in lab.chunks(64).enumerate() {
                let cnt = block.iter().map(|&l| (l == w) as u8).fold(0u8, u8::wrapping_add) as u32;
                if seen + cnt <= next {
                    seen += cnt;
                    continue;
                }
                for (t, &l) in block.iter().enumerate() {
                    if l == w {
                        if seen == next {
                            pos.push((b * 64 + t) as u32);
                            match want.next() {
                                Some(x) => next = x,
                                None => break 'blocks,
                            }
                        }
                        seen += 1;
                    }
                }
            }
        }
        pos.sort_unstable();
    } else {
        // one pass: each releasing worker counts down the coordinates to its next release
        let mut gap = mem::filled("the releases", n, u32::MAX)?;
        let mut job_of = mem::filled("the releases", n, u32::MAX)?;
        let mut cursor = mem::collect("the releases", jobs.len(), jobs.iter().map(|j| j.lo))?;
        for (t, job) in jobs.iter().enumerate() {
            gap[job.worker as usize] = ranks[job.lo] - job.base;
            job_of[job.worker as usize] = t as u32;
        }
        for (j, &l) in lab.iter().enumerate() {
            let w = l.idx();
            let g = gap[w];
            if g != 0 {
                gap[w] = g.wrapping_sub(1);
                continue;
            }
            pos.push(j as u32);
            let t = job_of[w] as usize;
            let at = cursor[t];
            cursor[t] = at + 1;
            gap[w] = if at + 1 < jobs[t].hi { ranks[at + 1] - ranks[at] - 1 } else { u32::MAX };
        }
    }
    debug_assert_eq!(pos.len(), missing.len());
    for (&p, &l) in pos.iter().zip(missing) {
        lab[p as usize] = l;
    }
    Ok(())
}

/// The bytes [`owners`] allocates besides the owners themselves (the per-chunk counts, and the
/// releases: about `0.4·sqrt(nd)` of them; counted for `2·sqrt(nd) + n`).
pub fn scratch_bytes(n: usize, d: usize) -> u128 {
    let chunks = d.div_ceil(chunk_len(n)) as u128;
    let released = (2.0 * (n as f64 * d as f64).sqrt()) as u128 + n as u128;
    8 * n as u128 * chunks + 40 * n as u128 + 48 * released.min(d as u128)
}

/// The owners of PermK's round `round` for `n` workers in dimension `d` (`1 ≤ n ≤ d < 2^32`): a
/// uniformly random assignment in which `r = d mod n` workers (uniform) own `⌊d/n⌋ + 1`
/// coordinates and the others `⌊d/n⌋` (see the module's description); and each worker's number
/// of coordinates.
pub fn owners(seed: u64, round: u64, n: usize, d: usize) -> Result<(Owner, Vec<usize>)> {
    let chunk = chunk_len(n);
    let parallel = threads::spread(d.div_ceil(chunk), d, PAR_THRESHOLD)?;
    Ok(if n <= 1 << 8 {
        let (v, sizes) = owners_as(seed, round, n, d, chunk, parallel, SCAN_WORKERS)?;
        (Owner::U8(v), sizes)
    } else if n <= 1 << 16 {
        let (v, sizes) = owners_as(seed, round, n, d, chunk, parallel, SCAN_WORKERS)?;
        (Owner::U16(v), sizes)
    } else {
        let (v, sizes) = owners_as(seed, round, n, d, chunk, parallel, SCAN_WORKERS)?;
        (Owner::U32(v), sizes)
    })
}

/// [`owners`] in chunks of `chunk` coordinates, as labels of type `L`.
fn owners_as<L: Label + mem::Zeroed>(seed: u64, round: u64, n: usize, d: usize, chunk: usize, parallel: bool, scan_workers: usize) -> Result<(Vec<L>, Vec<usize>)> {
    let mut labels = mem::zeros::<L>("the coordinates' owners", &[d])?;
    if n == 1 {
        return Ok((labels, mem::filled("the workers' counts", 1, d)?));
    }
    let chunks = d.div_ceil(chunk);
    let mut counts = mem::filled("the chunks' counts", chunks * n, 0usize)?;
    let labeler = Labeler::new(n);
    let draw = |(c, (lab, cnt)): (usize, (&mut [L], &mut [usize]))| draw_chunk(&labeler, seed, round, c, lab, cnt);
    if parallel {
        threads::install(|| labels.par_chunks_mut(chunk).zip(counts.par_chunks_mut(n)).enumerate().for_each(draw))?;
    } else {
        labels.chunks_mut(chunk).zip(counts.chunks_mut(n)).enumerate().for_each(draw);
    }
    let mut rng = rng::stream(seed, Purpose::Rebalance, SHARED, round);
    let sizes = rebalance(&mut labels, &counts, n, chunk, &mut rng, parallel, scan_workers)?;
    Ok((labels, sizes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn labels_of(o: &Owner) -> Vec<usize> {
        crate::plan::with_owner!(o, v => v.iter().map(|l| l.idx()).collect())
    }

    /// Every worker owns `⌊d/n⌋` or `⌊d/n⌋ + 1` coordinates, `d mod n` of them one more.
    fn assert_balanced(v: &[usize], n: usize) {
        let d = v.len();
        let mut have = vec![0usize; n];
        for &l in v {
            assert!(l < n);
            have[l] += 1;
        }
        let (k, r) = (d / n, d % n);
        assert!(have.iter().all(|&h| h == k || h == k + 1), "{have:?}");
        assert_eq!(have.iter().filter(|&&h| h == k + 1).count(), if k + 1 == k { 0 } else { r }, "{have:?}");
    }

    #[test]
    fn the_bit_mask_subset_is_the_hash_set_subset() {
        // the same draws, the same subset, the stream left at the same place
        for x in [1usize, 2, 3, 7, 31, 63, 64] {
            for s in 0..=x {
                for seed in 0..4u64 {
                    let (mut a, mut b) = (rng::stream(seed, Purpose::Rebalance, SHARED, x as u64), rng::stream(seed, Purpose::Rebalance, SHARED, x as u64));
                    let (mut got, mut want) = (vec![9u32], vec![9u32]);
                    sorted_subset(&mut a, x, s, &mut got).unwrap();
                    sorted_subset_hashed(&mut b, x, s, &mut want).unwrap();
                    assert_eq!(got, want, "x={x} s={s} seed={seed}");
                    assert_eq!(got.len(), s + 1);
                    assert!(got[1..].windows(2).all(|w| w[0] < w[1]) && got[1..].iter().all(|&v| (v as usize) < x));
                    assert_eq!(rng::below_inclusive(&mut a, 1 << 20), rng::below_inclusive(&mut b, 1 << 20));
                }
            }
        }
    }

    #[test]
    fn digits_per_word_fill_56_bits() {
        assert_eq!(digits_per_word(2), (56, 1 << 56));
        assert_eq!(digits_per_word(16), (14, 1 << 56));
        assert_eq!(digits_per_word(1000), (5, 1_000_000_000_000_000));
        assert_eq!(digits_per_word(3).0, 35);
        assert_eq!(digits_per_word(u32::MAX as usize + 1).0, 1);
    }

    #[test]
    fn the_digits_of_a_power_of_two_are_the_fields_of_the_generic_rule() {
        // the fast path for n = 2^b equals the generic digits (nothing is rejected: 2^64 mod n^m = 0)
        for n in [2usize, 4, 8, 16, 256, 1 << 12] {
            let (m, p) = digits_per_word(n);
            assert_eq!(p.wrapping_neg() % p, 0);
            let mut a = vec![0u32; 3 * m + 5];
            uniform_labels(&mut rng::stream(1, Purpose::OwnerChunk, 0, 0), n, &mut a);
            let mut r = rng::stream(1, Purpose::OwnerChunk, 0, 0);
            let mut b = Vec::new();
            while b.len() < a.len() {
                let mut x = r.next_u64();
                for _ in 0..m {
                    let t = x as u128 * n as u128;
                    b.push((t >> 64) as u32);
                    x = t as u64;
                }
            }
            b.truncate(a.len());
            assert_eq!(a, b, "n = {n}");
        }
    }

    #[test]
    fn uniform_labels_are_uniform_and_independent_pairs() {
        // chi-square over the n^2 pairs of consecutive labels (word boundaries included)
        for n in [2usize, 3, 5, 7, 16, 1000] {
            let len = 400_000usize.max(40 * n * n);
            let mut v = vec![0u16; len];
            uniform_labels(&mut rng::stream(3, Purpose::OwnerChunk, n as u64, 0), n, &mut v);
            let cells = if n * n <= 64 { n * n } else { n };
            let mut counts = vec![0f64; cells];
            if cells == n * n {
                for p in v.chunks_exact(2) {
                    counts[p[0] as usize * n + p[1] as usize] += 1.0;
                }
            } else {
                for &l in &v {
                    counts[l as usize] += 1.0;
                }
            }
            let total: f64 = counts.iter().sum();
            let e = total / cells as f64;
            let chi2: f64 = counts.iter().map(|&c| (c - e).powi(2) / e).sum();
            // mean cells − 1, sd sqrt(2(cells − 1)): 6 sd
            let dof = (cells - 1) as f64;
            assert!(chi2 < dof + 6.0 * (2.0 * dof).sqrt(), "n = {n}: chi2 = {chi2} over {cells} cells");
        }
    }

    #[test]
    fn balanced_every_coordinate_once_for_many_shapes() {
        for (n, d) in [(1usize, 7usize), (2, 2), (2, 9), (3, 3), (3, 10), (7, 100), (16, 1 << 17), (5, 300_001), (1000, 100_000), (300, 70_000), (2, 1_000_003)] {
            for round in 0..3 {
                let (o, sizes) = owners(9, round, n, d).unwrap();
                let v = labels_of(&o);
                assert_eq!(v.len(), d);
                assert_eq!(sizes, (0..n).map(|i| v.iter().filter(|&&l| l == i).count()).collect::<Vec<_>>());
                assert_balanced(&v, n);
            }
        }
    }

    #[test]
    fn small_chunks_and_both_ways_of_locating_the_releases_agree() {
        // chunks far smaller than the real ones: many chunks, releases spread over them; the
        // worker-by-worker scans and the one-pass countdown give the same owners, sequential or
        // on threads
        for (n, d, chunk) in [(2usize, 1000usize, 64usize), (3, 1001, 64), (7, 5000, 128), (40, 20_000, 256), (300, 9000, 512)] {
            for round in 0..4 {
                let a = owners_as::<u16>(5, round, n, d, chunk, false, 0).unwrap().0;
                let b = owners_as::<u16>(5, round, n, d, chunk, false, usize::MAX).unwrap().0;
                let c = owners_as::<u16>(5, round, n, d, chunk, true, 3).unwrap().0;
                assert_eq!(a, b, "n={n} d={d}");
                assert_eq!(a, c, "n={n} d={d}");
                assert_balanced(&a.iter().map(|&l| l as usize).collect::<Vec<_>>(), n);
            }
        }
    }

    #[test]
    fn same_owners_on_any_number_of_threads() {
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let three = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        for (n, d) in [(2usize, 1_000_001usize), (4, 600_000), (1000, 2_000_000)] {
            // the pool's size only decides whether chunks run on threads: force both ways
            let seq = owners_as::<u16>(7, 3, n, d, chunk_len(n), false, SCAN_WORKERS).unwrap().0;
            let par1 = one.install(|| owners_as::<u16>(7, 3, n, d, chunk_len(n), true, SCAN_WORKERS).unwrap().0);
            let par3 = three.install(|| owners_as::<u16>(7, 3, n, d, chunk_len(n), true, SCAN_WORKERS).unwrap().0);
            assert_eq!(seq, par1);
            assert_eq!(seq, par3);
            let api = labels_of(&owners(7, 3, n, d).unwrap().0);
            assert!(api.iter().zip(&seq).all(|(&a, &b)| a == b as usize));
        }
    }

    /// Every outcome of a sequence of draws: `below_inclusive(hi)` answers from `path` (0 past
    /// its end) and records each range, so that [`Enumerate::advance`] moves to the next path.
    struct Enumerate {
        path: Vec<usize>,
        ranges: Vec<usize>,
    }

    impl Draw for Enumerate {
        fn below_inclusive(&mut self, hi: usize) -> usize {
            let t = self.ranges.len();
            self.ranges.push(hi + 1);
            if t == self.path.len() {
                self.path.push(0);
            }
            self.path[t]
        }
    }

    impl Enumerate {
        /// The probability of the path just run, then the next path (false when none is left).
        fn advance(&mut self) -> (f64, bool) {
            let p = self.ranges.iter().map(|&r| 1.0 / r as f64).product();
            self.path.truncate(self.ranges.len());
            while let Some(last) = self.path.pop() {
                let range = self.ranges[self.path.len()];
                if last + 1 < range {
                    self.path.push(last + 1);
                    self.ranges.clear();
                    return (p, true);
                }
            }
            self.ranges.clear();
            (p, false)
        }
    }

    /// The exact distribution of the rebalanced owners when the independent owners are uniform:
    /// every independent assignment (probability `n^−d`) and every path of the rebalancing's
    /// draws, in chunks of `chunk`.
    fn exact_distribution(n: usize, d: usize, chunk: usize, scan_workers: usize) -> HashMap<Vec<u8>, f64> {
        let mut dist = HashMap::new();
        let total = n.pow(d as u32);
        for code in 0..total {
            let start: Vec<u8> = (0..d).map(|j| (code / n.pow(j as u32) % n) as u8).collect();
            let mut counts = vec![0usize; d.div_ceil(chunk) * n];
            for (j, &l) in start.iter().enumerate() {
                counts[j / chunk * n + l as usize] += 1;
            }
            let mut e = Enumerate { path: Vec::new(), ranges: Vec::new() };
            loop {
                let mut v = start.clone();
                rebalance(&mut v, &counts, n, chunk, &mut e, false, scan_workers).unwrap();
                let (p, more) = e.advance();
                *dist.entry(v).or_insert(0.0) += p / total as f64;
                if !more {
                    break;
                }
            }
        }
        dist
    }

    fn multinomial_arrangements(n: usize, d: usize) -> usize {
        // d! / (k!^(n−r) (k+1)!^r) · C(n, r): the balanced assignments (any r workers get one more)
        let f = |m: usize| (1..=m).product::<usize>();
        let (k, r) = (d / n, d % n);
        f(d) / (f(k).pow((n - r) as u32) * f(k + 1).pow(r as u32)) * (f(n) / (f(r) * f(n - r)))
    }

    #[test]
    fn every_balanced_assignment_is_equally_likely_exact_enumeration() {
        // the rebalancing's exact output distribution from uniform independent owners: uniform
        // over the balanced assignments (each worker k or k+1 coordinates, r of them k+1), for
        // one chunk and for chunks of 1, 2 and 3 coordinates (releases spread over chunks, both
        // ways of locating them)
        for (n, d) in [(2usize, 4usize), (3, 5), (3, 6), (2, 5), (4, 5), (2, 7)] {
            let count = multinomial_arrangements(n, d);
            for (chunk, scan) in [(MIN_CHUNK, SCAN_WORKERS), (1, 0), (2, usize::MAX), (3, 1)] {
                let dist = exact_distribution(n, d, chunk, scan);
                assert_eq!(dist.len(), count, "n={n} d={d} chunk={chunk}: {} assignments reached", dist.len());
                let total: f64 = dist.values().sum();
                assert!((total - 1.0).abs() < 1e-12);
                for (v, &p) in &dist {
                    assert_balanced(&v.iter().map(|&l| l as usize).collect::<Vec<_>>(), n);
                    assert!((p * count as f64 - 1.0).abs() < 1e-9, "n={n} d={d} chunk={chunk}: P({v:?}) = {p}, expected 1/{count}");
                }
            }
        }
    }

    #[test]
    fn the_sampler_is_uniform_chi_square() {
        // the whole sampler (streams included) over many rounds: chi-square over the balanced
        // assignments, P(false alarm) < 1e-6 (mean cells − 1, 6 sd, plus slack for small cells)
        for (n, d, chunk) in [(2usize, 4usize, MIN_CHUNK), (3, 5, MIN_CHUNK), (3, 6, MIN_CHUNK), (3, 5, 2), (2, 6, 1)] {
            let cells = multinomial_arrangements(n, d);
            let rounds = 200 * cells as u64;
            let mut counts: HashMap<Vec<u8>, f64> = HashMap::new();
            for t in 0..rounds {
                let v = owners_as::<u8>(11, t, n, d, chunk, false, SCAN_WORKERS).unwrap().0;
                *counts.entry(v).or_insert(0.0) += 1.0;
            }
            assert_eq!(counts.len(), cells, "n={n} d={d}");
            let e = rounds as f64 / cells as f64;
            let chi2: f64 = counts.values().map(|&c| (c - e).powi(2) / e).sum();
            let dof = (cells - 1) as f64;
            assert!(chi2 < dof + 6.0 * (2.0 * dof).sqrt() + 10.0, "n={n} d={d}: chi2 = {chi2}, dof = {dof}");
        }
    }
}
