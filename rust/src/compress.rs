//! The compressors of the paper as pure functions on `ndarray` views.
//!
//! A compressor is a [`Spec`]: a sparsifier (which coordinates each worker sends, and the
//! scale) followed by an optional quantizer of the sent values (`C_i ∘ Q_i`, Lemma
//! "Composition"). All three entry points — one worker ([`compress`]), all workers'
//! compressed rows ([`compress_all`]) and the server's average ([`aggregate`]) — run the same
//! per-worker routine ([`emit_worker`]) on the same [`RoundPlan`], so they agree bit for bit.
//! The average is `(Σ_{i = 0, 1, …, n-1} C_i(a_i)) / n`, summed in worker order.

use ndarray::{Array1, Array2, ArrayView1, ArrayView2};
use num_traits::Float;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use crate::error::{CoreError, Result};
use crate::rng::{self, Purpose, SHARED};

/// The float types the kernels accept.
pub trait Real: Float + Send + Sync + std::fmt::Debug + std::ops::AddAssign + 'static {
    fn of(x: f64) -> Self;
    fn f64(self) -> f64;
    /// The magnitude as an integer key, ordered like `|x|` for finite `x` (the bits with the
    /// sign cleared); `>= Self::NON_FINITE_KEY` exactly for NaN and ±inf.
    fn magnitude_key(self) -> u64;
    const NON_FINITE_KEY: u64;
}
impl Real for f64 {
    #[inline]
    fn of(x: f64) -> Self {
        x
    }
    #[inline]
    fn f64(self) -> f64 {
        self
    }
    #[inline]
    fn magnitude_key(self) -> u64 {
        self.to_bits() & 0x7FFF_FFFF_FFFF_FFFF
    }
    const NON_FINITE_KEY: u64 = 0x7FF0_0000_0000_0000;
}
impl Real for f32 {
    #[inline]
    fn of(x: f64) -> Self {
        x as f32
    }
    #[inline]
    fn f64(self) -> f64 {
        self as f64
    }
    #[inline]
    fn magnitude_key(self) -> u64 {
        (self.to_bits() & 0x7FFF_FFFF) as u64
    }
    const NON_FINITE_KEY: u64 = 0x7F80_0000;
}

/// A partition of the coordinates into blocks (BlockPermK, "More Examples").
#[derive(Clone, Debug, PartialEq)]
pub enum Partition {
    /// `m` contiguous blocks of sizes `⌊d/m⌋` or `⌈d/m⌉`.
    Contiguous { m: usize },
    /// `labels[j]` is the block of coordinate `j`; blocks `0..m` all non-empty.
    Labels { labels: Vec<u32>, m: usize },
}

impl Partition {
    pub fn labels(labels: Vec<u32>) -> Result<Self> {
        if labels.is_empty() {
            return Err(CoreError::invalid("partition", "must label at least one coordinate"));
        }
        let m = *labels.iter().max().unwrap() as usize + 1;
        if m > labels.len() {
            // m non-empty blocks need at least m coordinates (and this bounds the allocation).
            return Err(CoreError::invalid(
                "partition",
                format!("block labels must be 0..m-1 with every block non-empty; label {} needs more than {} coordinates", m - 1, labels.len()),
            ));
        }
        let mut seen = vec![false; m];
        for &l in &labels {
            seen[l as usize] = true;
        }
        if let Some(b) = seen.iter().position(|s| !s) {
            return Err(CoreError::invalid(
                "partition",
                format!("block labels must be 0..m-1 with every block non-empty; block {b} is empty"),
            ));
        }
        Ok(Partition::Labels { labels, m })
    }

    pub fn m(&self) -> usize {
        match self {
            Partition::Contiguous { m } => *m,
            Partition::Labels { m, .. } => *m,
        }
    }

    /// The blocks as CSR: `coords[offsets[b]..offsets[b + 1]]` is block `b`.
    fn csr(&self, d: usize) -> Result<(Vec<usize>, Vec<u32>)> {
        match self {
            Partition::Contiguous { m } => {
                if *m > d {
                    return Err(CoreError::invalid("m", format!("m = {m} blocks exceed d = {d} coordinates")));
                }
                let offsets = (0..=*m).map(|b| b * d / m).collect();
                Ok((offsets, (0..d as u32).collect()))
            }
            Partition::Labels { labels, m } => {
                if labels.len() != d {
                    return Err(CoreError::invalid(
                        "partition",
                        format!("labels {} coordinates but the input has d = {d}", labels.len()),
                    ));
                }
                let mut offsets = vec![0usize; m + 1];
                for &l in labels {
                    offsets[l as usize + 1] += 1;
                }
                for b in 0..*m {
                    offsets[b + 1] += offsets[b];
                }
                let mut fill = offsets.clone();
                let mut coords = vec![0u32; d];
                for (j, &l) in labels.iter().enumerate() {
                    coords[fill[l as usize]] = j as u32;
                    fill[l as usize] += 1;
                }
                Ok((offsets, coords))
            }
        }
    }
}

/// Which coordinates each worker sends.
#[derive(Clone, Debug, PartialEq)]
pub enum Sparsifier {
    /// No compression.
    Identity,
    /// PermK: Definitions 1 and 2 and their general forms (appendix "General Examples").
    PermK,
    /// Independent RandK, scaled by `d/k`; per-worker randomness from `(seed, round, worker)`.
    RandK { k: usize },
    /// Deterministic TopK by magnitude (ties: lower index first).
    TopK { k: usize },
    /// The block permutation compressor.
    BlockPermK { partition: Partition },
}

/// An unbiased quantizer applied to the values a worker sends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Quantizer {
    None,
    /// Natural compression: random rounding to one of the two nearest powers of two.
    Natural,
    /// QSGD with `s` levels, relative to the worker's full input norm.
    Qsgd { s: u32 },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    pub sparsifier: Sparsifier,
    pub quantizer: Quantizer,
}

impl Spec {
    pub fn new(sparsifier: Sparsifier, quantizer: Quantizer) -> Result<Self> {
        match &sparsifier {
            Sparsifier::RandK { k } | Sparsifier::TopK { k } if *k == 0 => {
                return Err(CoreError::invalid("k", "must be at least 1"))
            }
            Sparsifier::BlockPermK { partition } if partition.m() == 0 => {
                return Err(CoreError::invalid("m", "must be at least 1"))
            }
            _ => {}
        }
        if let Quantizer::Qsgd { s: 0 } = quantizer {
            return Err(CoreError::invalid("s", "QSGD needs at least 1 level"));
        }
        Ok(Spec { sparsifier, quantizer })
    }

    /// Checks that the spec is defined for `n` workers in dimension `d`.
    pub fn check(&self, n: usize, d: usize) -> Result<()> {
        if n == 0 {
            return Err(CoreError::invalid("n_workers", "must be at least 1"));
        }
        if d == 0 {
            return Err(CoreError::invalid("d", "the dimension must be at least 1"));
        }
        if n > u32::MAX as usize {
            return Err(CoreError::invalid("n_workers", format!("n_workers = {n} must be below 2**32")));
        }
        if d > u32::MAX as usize {
            return Err(CoreError::invalid("d", format!("d = {d} must be below 2**32")));
        }
        match &self.sparsifier {
            Sparsifier::RandK { k } | Sparsifier::TopK { k } if *k > d => {
                Err(CoreError::invalid("k", format!("k = {k} is outside [1, d] with d = {d}")))
            }
            Sparsifier::BlockPermK { partition } if partition.m() > n => Err(CoreError::invalid(
                "m",
                format!("m = {} blocks exceed n = {n} workers (need m <= n)", partition.m()),
            )),
            Sparsifier::BlockPermK { partition } => partition.csr(d).map(|_| ()),
            _ => Ok(()),
        }
    }

    /// True when the coordinates a worker sends depend only on `(seed, round, worker)`.
    pub fn has_shared_coordinates(&self) -> bool {
        !matches!(self.sparsifier, Sparsifier::TopK { .. })
    }
}

/// The coordinates and scale of every worker in one round.
#[derive(Clone, Debug, PartialEq)]
pub enum RoundPlan {
    /// Every worker sends every coordinate unscaled.
    All { n: usize },
    /// Worker `i` sends `coords[offsets[i]..offsets[i + 1]]`, each value multiplied by `scales[i]`.
    Csr { offsets: Vec<usize>, coords: Vec<u32>, scales: Vec<f64> },
    /// Worker `i` sends block `slot_block[pi[i]]` (none when it is `IDLE`) of the partition
    /// `coords_b[offsets_b[b]..offsets_b[b + 1]]`, scaled by `scale`: the block permutation
    /// compressors, indexed without copying the blocks out per worker.
    Blocks { pi: Vec<u32>, slot_block: Vec<u32>, offsets_b: Vec<usize>, coords_b: Vec<u32>, scale: f64 },
}

/// An idle slot of [`RoundPlan::Blocks`].
pub const IDLE: u32 = u32::MAX;

impl RoundPlan {
    pub fn n(&self) -> usize {
        match self {
            RoundPlan::All { n } => *n,
            RoundPlan::Csr { scales, .. } => scales.len(),
            RoundPlan::Blocks { pi, .. } => pi.len(),
        }
    }

    /// `(Some(coords) | None for all, scale)` of worker `i`.
    #[inline]
    pub fn worker(&self, i: usize) -> (Option<&[u32]>, f64) {
        match self {
            RoundPlan::All { .. } => (None, 1.0),
            RoundPlan::Csr { offsets, coords, scales } => (Some(&coords[offsets[i]..offsets[i + 1]]), scales[i]),
            RoundPlan::Blocks { pi, slot_block, offsets_b, coords_b, scale } => match slot_block[pi[i] as usize] {
                IDLE => (Some(&[]), *scale),
                b => (Some(&coords_b[offsets_b[b as usize]..offsets_b[b as usize + 1]]), *scale),
            },
        }
    }

    /// The plan as CSR arrays `(offsets, coords, scales)` for dimension `d`.
    pub fn to_csr(&self, d: usize) -> (Vec<usize>, Vec<u32>, Vec<f64>) {
        let n = self.n();
        let mut offsets = Vec::with_capacity(n + 1);
        let mut coords = Vec::new();
        let mut scales = Vec::with_capacity(n);
        offsets.push(0);
        for i in 0..n {
            let (c, s) = self.worker(i);
            match c {
                Some(c) => coords.extend_from_slice(c),
                None => coords.extend(0..d as u32),
            }
            offsets.push(coords.len());
            scales.push(s);
        }
        (offsets, coords, scales)
    }
}

/// PermK for `d >= n` (general form, `d = kn + r`) from its two permutations: worker `i` gets
/// `pi_d[ik .. (i+1)k]` and, when `pi_n[i] < r`, the leftover `pi_d[kn + pi_n[i]]`; scale `n`.
/// With `r = 0` this is Definition 1 and `pi_n` is not used.
pub fn permk_plan_wide(n: usize, d: usize, pi_d: &[u32], pi_n: &[u32]) -> RoundPlan {
    let k = d / n;
    let r = d % n;
    let mut offsets = Vec::with_capacity(n + 1);
    let mut coords = Vec::with_capacity(d);
    offsets.push(0);
    for i in 0..n {
        coords.extend_from_slice(&pi_d[i * k..(i + 1) * k]);
        if r > 0 && (pi_n[i] as usize) < r {
            coords.push(pi_d[k * n + pi_n[i] as usize]);
        }
        offsets.push(coords.len());
    }
    RoundPlan::Csr { offsets, coords, scales: vec![n as f64; n] }
}

/// The block permutation compressor from its permutation `pi` of the workers: with
/// `n = mq + r`, worker `i` is idle when `pi[i] >= mq` and otherwise sends block `pi[i] / q`
/// scaled by `n/q`. PermK for `n > d` (Definition 2 and its general form) is this with the
/// `d` singleton blocks.
pub fn block_plan(n: usize, offsets_b: Vec<usize>, coords_b: Vec<u32>, pi: Vec<u32>) -> RoundPlan {
    let m = offsets_b.len() - 1;
    let q = n / m;
    // slot s holds block s / q (s < mq) or nothing: filled block by block, without a division
    let mut slot_block = vec![IDLE; n];
    for (b, slots) in slot_block[..m * q].chunks_exact_mut(q).enumerate() {
        slots.fill(b as u32);
    }
    RoundPlan::Blocks { pi, slot_block, offsets_b, coords_b, scale: n as f64 / q as f64 }
}

/// A round's assignment of coordinates to workers in the compact forms the kernels use
/// ([`RoundPlan`] is its CSR form, [`Assignment::into_plan`]).
enum Assignment {
    /// PermK, `d >= n`: coordinate `j` is sent by worker `owner[j]` alone, scaled by `n`.
    Owners { owner: Owner, n: usize },
    /// Any other sparsifier, as a plan.
    Plan(RoundPlan),
}

/// The owner of every coordinate (PermK, `d >= n`) in the narrowest integer type that holds
/// the workers' indices: the shuffle and the aggregation pass then touch less memory.
enum Owner {
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
}

/// An owner label: an unsigned integer type holding worker indices.
pub(crate) trait Label: Copy + Send + Sync {
    fn idx(self) -> usize;
}
impl Label for u8 {
    #[inline(always)]
    fn idx(self) -> usize {
        self as usize
    }
}
impl Label for u16 {
    #[inline(always)]
    fn idx(self) -> usize {
        self as usize
    }
}
impl Label for u32 {
    #[inline(always)]
    fn idx(self) -> usize {
        self as usize
    }
}

/// Runs `$body` with `$v` bound to the owner slice, whatever its integer type.
macro_rules! with_owner {
    ($owner:expr, mut $v:ident => $body:expr) => {
        match $owner {
            Owner::U8(mut $v) => $body,
            Owner::U16(mut $v) => $body,
            Owner::U32(mut $v) => $body,
        }
    };
    ($owner:expr, $v:ident => $body:expr) => {
        match $owner {
            Owner::U8($v) => $body,
            Owner::U16($v) => $body,
            Owner::U32($v) => $body,
        }
    };
}

/// PermK for `d >= n` (`d = kn + r`), sampled as the general definition says: the owner of
/// coordinate `j` is `L[σ(j)]` with `L = (0^k, 1^k, …, (n−1)^k, τ_0, …, τ_{r−1})`, `σ` a
/// uniform permutation of the coordinates (a Fisher–Yates shuffle of `L` in place) and `τ` a
/// uniform permutation of the workers (drawn first, only when `r > 0`). This is exactly
/// [`permk_plan_wide`] with `pi_d = σ⁻¹` and `pi_n = τ⁻¹` (uniform too), without inverting.
/// The shuffle's draws depend only on `d`, not on the label type.
fn permk_owners(seed: u64, round: u64, n: usize, d: usize) -> Owner {
    let (mut rng, owner) = permk_labels(seed, round, n, d);
    with_owner!(owner, mut v => {
        rng::shuffle(&mut rng, &mut v);
        v.into()
    })
}

/// The stream of PermK's round (after `τ`) and the labels `L` before the shuffle.
fn permk_labels(seed: u64, round: u64, n: usize, d: usize) -> (ChaCha8Rng, Owner) {
    fn build<L: Copy + TryFrom<usize>>(n: usize, d: usize, tau: &[u32]) -> Vec<L> {
        let label = |i: usize| L::try_from(i).ok().expect("the label type holds every worker index");
        let k = d / n;
        let mut owner = Vec::with_capacity(d);
        for i in 0..n {
            owner.extend(std::iter::repeat(label(i)).take(k));
        }
        owner.extend(tau.iter().map(|&t| label(t as usize)));
        owner
    }
    let r = d % n;
    let mut rng = rng::stream(seed, Purpose::Permutation, SHARED, round);
    let tau = if r > 0 { rng::permutation(&mut rng, n) } else { Vec::new() };
    let tau = &tau[..r];
    let owner = if n <= 1 << 8 {
        Owner::U8(build(n, d, tau))
    } else if n <= 1 << 16 {
        Owner::U16(build(n, d, tau))
    } else {
        Owner::U32(build(n, d, tau))
    };
    (rng, owner)
}

impl From<Vec<u8>> for Owner {
    fn from(v: Vec<u8>) -> Self {
        Owner::U8(v)
    }
}
impl From<Vec<u16>> for Owner {
    fn from(v: Vec<u16>) -> Self {
        Owner::U16(v)
    }
}
impl From<Vec<u32>> for Owner {
    fn from(v: Vec<u32>) -> Self {
        Owner::U32(v)
    }
}

impl Assignment {
    /// The plan. PermK (`d >= n`) lists each worker's coordinates in increasing order.
    fn into_plan(self, d: usize) -> RoundPlan {
        match self {
            Assignment::Owners { owner, n } => {
                let mut offsets = vec![0usize; n + 1];
                let mut coords = vec![0u32; d];
                with_owner!(&owner, v => {
                    for &o in v.iter() {
                        offsets[o.idx() + 1] += 1;
                    }
                    for i in 0..n {
                        offsets[i + 1] += offsets[i];
                    }
                    let mut fill = offsets[..n].to_vec();
                    for (j, &o) in v.iter().enumerate() {
                        coords[fill[o.idx()]] = j as u32;
                        fill[o.idx()] += 1;
                    }
                });
                RoundPlan::Csr { offsets, coords, scales: vec![n as f64; n] }
            }
            Assignment::Plan(p) => p,
        }
    }

    /// The coordinates (in plan order) and scale of worker `w`, as [`Self::into_plan`] has them.
    fn worker(&self, w: usize) -> (Option<Vec<u32>>, f64) {
        match self {
            Assignment::Owners { owner, n } => (
                Some(with_owner!(owner, v => {
                    v.iter().enumerate().filter(|&(_, &o)| o.idx() == w).map(|(j, _)| j as u32).collect()
                })),
                *n as f64,
            ),
            Assignment::Plan(p) => {
                let (c, s) = p.worker(w);
                (c.map(<[u32]>::to_vec), s)
            }
        }
    }
}

/// The `k` largest-magnitude coordinates of `row` (ties: lower index), in increasing order.
///
/// One pass keeps a buffer of candidates: once it holds `k` of them, only values of larger
/// magnitude than the current `k`-th can still enter (a later equal magnitude has a larger
/// index, so it ranks lower); when the buffer fills up it is cut back to its top `k`. On long
/// rows a strided sample first suggests a starting bar (about the `2k`-th largest magnitude);
/// if fewer than `k` values clear it, the pass is redone without it. This is `O(d)` work,
/// typically one comparison per coordinate, and selects exactly the set a full sort by
/// (magnitude descending, index ascending) would.
fn topk_coords<T: Real>(row: ArrayView1<T>, k: usize, worker: usize) -> Result<Vec<u32>> {
    fn scan(keys: impl Iterator<Item = u64>, k: usize, cap: usize, lo: u64) -> (Vec<(u64, u32)>, u64) {
        let by_rank = |a: &(u64, u32), b: &(u64, u32)| b.0.cmp(&a.0).then(a.1.cmp(&b.1));
        let mut buf: Vec<(u64, u32)> = Vec::with_capacity(cap);
        let mut lo = lo; // keys >= lo may still be in the top k
        let mut max_key = 0u64;
        for (j, key) in keys.enumerate() {
            max_key = max_key.max(key);
            if key >= lo {
                buf.push((key, j as u32));
                if buf.len() == cap {
                    buf.select_nth_unstable_by(k - 1, by_rank);
                    buf.truncate(k);
                    lo = buf.iter().map(|p| p.0).min().unwrap_or(0) + 1;
                }
            }
        }
        if buf.len() > k {
            buf.select_nth_unstable_by(k - 1, by_rank);
            buf.truncate(k);
        }
        (buf, max_key)
    }
    let d = row.len();
    let cap = (2 * k + 32).min(d + 1);
    let run = |lo: u64| match row.as_slice() {
        Some(s) => scan(s.iter().map(|v| v.magnitude_key()), k, cap, lo),
        None => scan(row.iter().map(|v| v.magnitude_key()), k, cap, lo),
    };
    // A starting bar from a strided sample of m keys: its r-th largest, r about twice the
    // sample's expected share of the top k (so about 2k values clear it).
    const M: usize = 4096;
    let r = 2 * k * M / d.max(1);
    let bar = if d >= 4 * M && (8..M).contains(&r) {
        let step = d / M;
        let mut sample: Vec<u64> = (0..M).map(|t| row[t * step].magnitude_key()).collect();
        let (_, &mut v, _) = sample.select_nth_unstable_by(r, |a, b| b.cmp(a));
        v.min(T::NON_FINITE_KEY)
    } else {
        0
    };
    let (mut buf, mut max_key) = run(bar);
    if buf.len() < k {
        (buf, max_key) = run(0);
    }
    if max_key >= T::NON_FINITE_KEY {
        let j = row.iter().position(|v| !v.is_finite()).unwrap_or(0);
        return Err(CoreError::NonFinite { what: "input", worker, coord: j });
    }
    let mut out: Vec<u32> = buf.into_iter().map(|p| p.1).collect();
    out.sort_unstable();
    Ok(out)
}

fn randk_coords(seed: u64, round: u64, worker: usize, k: usize, sampler: &mut rng::Sampler, out: &mut Vec<u32>) {
    let mut rng = rng::stream(seed, Purpose::RandK, worker as u64, round);
    sampler.sample(&mut rng, k, out);
}

/// Rows at least this large (`n·d` elements) use rayon for TopK's per-worker selection (each
/// row's selection is independent of the thread count).
const PAR_THRESHOLD: usize = 1 << 16;

/// The assignment of round `round`. TopK needs the data (`a`); the others ignore it.
fn assignment<T: Real>(spec: &Spec, n: usize, d: usize, seed: u64, round: u64, a: Option<ArrayView2<T>>) -> Result<Assignment> {
    spec.check(n, d)?;
    Ok(match &spec.sparsifier {
        Sparsifier::Identity => Assignment::Plan(RoundPlan::All { n }),
        Sparsifier::PermK if d >= n => Assignment::Owners { owner: permk_owners(seed, round, n, d), n },
        Sparsifier::PermK => {
            let pi = rng::permutation(&mut rng::stream(seed, Purpose::Permutation, SHARED, round), n);
            Assignment::Plan(block_plan(n, (0..=d).collect(), (0..d as u32).collect(), pi))
        }
        Sparsifier::BlockPermK { partition } => {
            let (offsets_b, coords_b) = partition.csr(d)?;
            let pi = rng::permutation(&mut rng::stream(seed, Purpose::Permutation, SHARED, round), n);
            Assignment::Plan(block_plan(n, offsets_b, coords_b, pi))
        }
        Sparsifier::RandK { k } => {
            let mut sampler = rng::Sampler::new(d, *k);
            let mut offsets = Vec::with_capacity(n + 1);
            offsets.push(0);
            let mut coords = Vec::with_capacity(n * k);
            let mut out = Vec::with_capacity(*k);
            for i in 0..n {
                randk_coords(seed, round, i, *k, &mut sampler, &mut out);
                coords.extend_from_slice(&out);
                offsets.push(coords.len());
            }
            Assignment::Plan(RoundPlan::Csr { offsets, coords, scales: vec![d as f64 / *k as f64; n] })
        }
        Sparsifier::TopK { k } => {
            let a = a.ok_or_else(|| CoreError::invalid("A", "TopK needs the data to choose coordinates"))?;
            let lists: Vec<Result<Vec<u32>>> = if n * d >= PAR_THRESHOLD && n > 1 {
                (0..n).into_par_iter().map(|i| topk_coords(a.row(i), *k, i)).collect()
            } else {
                (0..n).map(|i| topk_coords(a.row(i), *k, i)).collect()
            };
            let mut offsets = Vec::with_capacity(n + 1);
            offsets.push(0);
            let mut coords = Vec::with_capacity(n * k);
            for l in lists {
                // the first failing worker in worker order, whatever the thread count
                coords.extend_from_slice(&l?);
                offsets.push(coords.len());
            }
            Assignment::Plan(RoundPlan::Csr { offsets, coords, scales: vec![1.0; n] })
        }
    })
}

/// The plan of round `round`. TopK needs the data (`a`); the others ignore it.
pub fn round_plan<T: Real>(spec: &Spec, n: usize, d: usize, seed: u64, round: u64, a: Option<ArrayView2<T>>) -> Result<RoundPlan> {
    Ok(assignment(spec, n, d, seed, round, a)?.into_plan(d))
}

/// The coordinates and scale of one worker (cheaper than a whole plan for RandK and TopK).
pub fn worker_selection<T: Real>(
    spec: &Spec,
    n: usize,
    d: usize,
    seed: u64,
    round: u64,
    worker: usize,
    x: Option<ArrayView1<T>>,
) -> Result<(Option<Vec<u32>>, f64)> {
    spec.check(n, d)?;
    if worker >= n {
        return Err(CoreError::invalid("worker", format!("worker = {worker} is outside [0, n_workers) with n_workers = {n}")));
    }
    match &spec.sparsifier {
        Sparsifier::RandK { k } => {
            let mut out = Vec::with_capacity(*k);
            randk_coords(seed, round, worker, *k, &mut rng::Sampler::new(d, *k), &mut out);
            Ok((Some(out), d as f64 / *k as f64))
        }
        Sparsifier::TopK { k } => {
            let x = x.ok_or_else(|| CoreError::invalid("x", "TopK needs the data to choose coordinates"))?;
            Ok((Some(topk_coords(x, *k, worker)?), 1.0))
        }
        _ => Ok(assignment::<T>(spec, n, d, seed, round, None)?.worker(worker)),
    }
}

/// Random rounding to a neighbouring power of two (natural compression), unbiased.
#[inline]
fn natural(x: f64, rng: &mut ChaCha8Rng) -> f64 {
    if x == 0.0 {
        return 0.0;
    }
    let a = x.abs();
    // The largest power of two <= a: clear the mantissa (rescale subnormals first).
    let lo = if a.is_normal() {
        f64::from_bits(a.to_bits() & 0x7FF0_0000_0000_0000)
    } else {
        let t = 18014398509481984.0; // 2^54
        f64::from_bits((a * t).to_bits() & 0x7FF0_0000_0000_0000) / t
    };
    let p_up = (a - lo) / lo;
    let mag = if rng::unit(rng) < p_up { 2.0 * lo } else { lo };
    mag.copysign(x)
}

/// QSGD rounding of `x` with `s` levels relative to `norm`, unbiased.
#[inline]
fn qsgd(x: f64, norm: f64, s: u32, rng: &mut ChaCha8Rng) -> f64 {
    if norm == 0.0 {
        return 0.0;
    }
    let r = x.abs() / norm * s as f64;
    let l = r.floor();
    let level = if rng::unit(rng) < r - l { l + 1.0 } else { l };
    (norm * level / s as f64).copysign(x)
}

/// The one per-worker routine: reads worker `i`'s input `row` on its coordinates, applies the
/// quantizer and the scale, and hands each `(coordinate, value)` to `emit` in message order.
pub fn emit_worker<T: Real>(
    spec: &Spec,
    row: ArrayView1<T>,
    coords: Option<&[u32]>,
    scale: f64,
    seed: u64,
    round: u64,
    worker: usize,
    mut emit: impl FnMut(usize, T),
) -> Result<()> {
    let mut qrng = match spec.quantizer {
        Quantizer::None => None,
        _ => Some(rng::stream(seed, Purpose::Quantizer, worker as u64, round)),
    };
    let norm = match spec.quantizer {
        Quantizer::Qsgd { .. } => {
            let mut s = 0.0f64;
            for (j, &v) in row.iter().enumerate() {
                if !v.is_finite() {
                    return Err(CoreError::NonFinite { what: "input", worker, coord: j });
                }
                s += v.f64() * v.f64();
            }
            s.sqrt()
        }
        _ => 0.0,
    };
    let mut one = |j: usize| -> Result<()> {
        let x = row[j];
        if !x.is_finite() {
            return Err(CoreError::NonFinite { what: "input", worker, coord: j });
        }
        let q = match (spec.quantizer, qrng.as_mut()) {
            (Quantizer::Natural, Some(r)) => natural(x.f64(), r),
            (Quantizer::Qsgd { s }, Some(r)) => qsgd(x.f64(), norm, s, r),
            _ => x.f64(),
        };
        let v = if scale == 1.0 && matches!(spec.quantizer, Quantizer::None) { x } else { T::of(scale * q) };
        if !v.is_finite() {
            return Err(CoreError::NonFinite { what: "the compressed output (overflow)", worker, coord: j });
        }
        emit(j, v);
        Ok(())
    };
    match coords {
        None => (0..row.len()).try_for_each(&mut one),
        Some(c) => c.iter().try_for_each(|&j| one(j as usize)),
    }
}

fn check_shape(n: usize, d: usize) -> Result<()> {
    if n == 0 || d == 0 {
        return Err(CoreError::invalid("A", format!("must have shape (n_workers, d) with both >= 1, got ({n}, {d})")));
    }
    Ok(())
}

/// `(1/n) Σ_i C_i(a_i)` (summed in worker order, then divided by `n`) without materialising
/// the compressed rows.
///
/// Without a quantizer the sparsifiers run tight kernels (below) that compute exactly what
/// [`emit_worker`] computes, in the same order; on a non-finite value they defer to the
/// generic path, which reports the first one in worker and message order.
pub fn aggregate<T: Real>(spec: &Spec, a: ArrayView2<T>, seed: u64, round: u64) -> Result<Array1<T>> {
    let (n, d) = a.dim();
    check_shape(n, d)?;
    if let (Sparsifier::RandK { k }, Quantizer::None) = (&spec.sparsifier, spec.quantizer) {
        spec.check(n, d)?;
        if n > 1 && n * k >= RANDK_PAR_THRESHOLD {
            if let Some(out) = kernels::randk_parallel(a, *k, seed, round) {
                return Ok(out);
            }
        }
    }
    if let (Sparsifier::PermK, Quantizer::None) = (&spec.sparsifier, spec.quantizer) {
        spec.check(n, d)?;
        // below the parallel gather's threshold, overlapping the shuffle with the reads wins
        if d >= n && d < kernels::OWNERS_PAR_THRESHOLD {
            let (mut rng, owner) = permk_labels(seed, round, n, d);
            if let Some(out) = with_owner!(owner, mut v => kernels::owners_fused(a, &mut rng, &mut v)) {
                return Ok(out);
            }
        }
    }
    let asg = assignment(spec, n, d, seed, round, Some(a))?;
    if spec.quantizer == Quantizer::None {
        let fast = match &asg {
            Assignment::Owners { owner, .. } => with_owner!(owner, v => kernels::owners(a, v)),
            Assignment::Plan(RoundPlan::All { .. }) => kernels::all(a),
            Assignment::Plan(RoundPlan::Blocks { pi, slot_block, offsets_b, coords_b, scale }) => {
                kernels::blocks(a, pi, slot_block, offsets_b, coords_b, *scale)
            }
            Assignment::Plan(plan) => kernels::plan(a, plan),
        };
        if let Some(out) = fast {
            return Ok(out);
        }
    }
    aggregate_with_plan(spec, &asg.into_plan(d), a, seed, round)
}

/// RandK with at least this many sampled values in all (`n·k`) samples and gathers them on
/// rayon's threads.
const RANDK_PAR_THRESHOLD: usize = 1 << 15;

/// The aggregation kernels of the sparsifiers without quantizer. Each returns `None` when an
/// input or a scaled value is not finite. Every value is `scale · a[i, j]` rounded once to `T`
/// (`a[i, j]` itself when the scale is 1), accumulated into a zeroed output in worker order
/// and finally divided by `n`, as in [`aggregate_with_plan`], so the results agree bit for bit.
mod kernels {
    use super::{rng, Label, Real, RoundPlan};
    use ndarray::{Array1, ArrayView2};
    use rayon::prelude::*;

    /// How far ahead the random-access loops prefetch.
    const AHEAD: usize = 32;

    #[inline(always)]
    fn prefetch<T>(p: *const T) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch is a hint; it never faults, whatever the address.
        #[allow(unused_unsafe)]
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = p;
    }

    /// The address of `a[i, j]` (computed without dereferencing; only used for prefetching).
    #[inline(always)]
    fn addr<T>(a: &ArrayView2<T>, i: usize, j: usize) -> *const T {
        let s = a.strides();
        a.as_ptr().wrapping_offset(i as isize * s[0] + j as isize * s[1])
    }

    #[inline(always)]
    fn scaled<T: Real>(x: T, scale: f64) -> T {
        if scale == 1.0 {
            x
        } else {
            T::of(scale * x.f64())
        }
    }

    /// PermK, `d >= n`: coordinate `j` comes from worker `owner[j]` alone, so
    /// `out[j] = (0 + n·a[owner[j], j]) / n`: one sequential pass over the coordinates (reading
    /// `a` at scattered rows, prefetched ahead), then the division (vectorised).
    pub fn owners<T: Real, L: Label>(a: ArrayView2<T>, owner: &[L]) -> Option<Array1<T>> {
        let (n, d) = a.dim();
        let mut out = vec![T::zero(); d];
        // Each output coordinate is computed on its own: splitting the pass into chunks (and
        // running them on rayon's threads for large inputs) cannot change any bit.
        let chunk = |start: usize, out: &mut [T]| -> bool {
            let scale = n as f64;
            let owner = &owner[start..start + out.len()];
            let mut ok = true;
            for (p, (o, &i)) in out.iter_mut().zip(owner).enumerate() {
                if let Some(&ia) = owner.get(p + AHEAD) {
                    prefetch(addr(&a, ia.idx(), start + p + AHEAD));
                }
                let v = scaled(a[[i.idx(), start + p]], scale);
                ok &= v.is_finite();
                *o += v;
            }
            let nt = T::of(n as f64);
            out.iter_mut().for_each(|v| *v = *v / nt);
            ok
        };
        let ok = if n > 1 && d >= OWNERS_PAR_THRESHOLD {
            out.par_chunks_mut(OWNERS_CHUNK).enumerate().map(|(c, o)| chunk(c * OWNERS_CHUNK, o)).reduce(|| true, |x, y| x && y)
        } else {
            out.chunks_mut(OWNERS_CHUNK).enumerate().fold(true, |ok, (c, o)| chunk(c * OWNERS_CHUNK, o) && ok)
        };
        ok.then(|| Array1::from(out))
    }

    /// PermK, `d >= n`, fused with the shuffle: coordinate `j`'s owner is final right after
    /// step `j` of the Fisher–Yates shuffle (from the end), so its value is prefetched then and
    /// read `AHEAD` steps later, overlapping the shuffle with the scattered reads.
    pub fn owners_fused<T: Real, L: Label>(a: ArrayView2<T>, rng: &mut rand_chacha::ChaCha8Rng, labels: &mut [L]) -> Option<Array1<T>> {
        let (n, d) = a.dim();
        let scale = n as f64;
        let nt = T::of(scale);
        let mut out = vec![T::zero(); d];
        let mut ok = true;
        let mut ring = [(0usize, 0usize); AHEAD];
        let mut pending = 0usize;
        let mut emit = |i: usize, j: usize, out: &mut [T]| {
            let v = scaled(a[[i, j]], scale);
            ok &= v.is_finite();
            out[j] = (T::zero() + v) / nt;
        };
        rng::shuffle_visit(rng, labels, |j, o| {
            let i = o.idx();
            prefetch(addr(&a, i, j));
            let slot = pending % AHEAD;
            if pending >= AHEAD {
                let (pi, pj) = ring[slot];
                emit(pi, pj, &mut out);
            }
            ring[slot] = (i, j);
            pending += 1;
        });
        for t in pending.saturating_sub(AHEAD)..pending {
            let (pi, pj) = ring[t % AHEAD];
            emit(pi, pj, &mut out);
        }
        ok.then(|| Array1::from(out))
    }

    /// PermK inputs with at least this many coordinates gather on rayon's threads, in chunks.
    pub const OWNERS_PAR_THRESHOLD: usize = 1 << 18;
    const OWNERS_CHUNK: usize = 1 << 15;

    /// The block compressors (PermK `n > d`, BlockPermK): worker `i` adds its block. The first
    /// value of a later worker's block is prefetched (with singleton blocks every worker reads
    /// one value of its own row: a latency-bound walk down the rows otherwise).
    pub fn blocks<T: Real>(
        a: ArrayView2<T>,
        pi: &[u32],
        slot_block: &[u32],
        offsets_b: &[usize],
        coords_b: &[u32],
        scale: f64,
    ) -> Option<Array1<T>> {
        let (n, d) = a.dim();
        let block = |i: usize| -> &[u32] {
            match slot_block[pi[i] as usize] {
                super::IDLE => &[],
                b => &coords_b[offsets_b[b as usize]..offsets_b[b as usize + 1]],
            }
        };
        let mut out = vec![T::zero(); d];
        let mut ok = true;
        for i in 0..n {
            if i + AHEAD < n {
                if let Some(&j) = block(i + AHEAD).first() {
                    prefetch(addr(&a, i + AHEAD, j as usize));
                }
            }
            let row = a.row(i);
            for &j in block(i) {
                let v = scaled(row[j as usize], scale);
                ok &= v.is_finite();
                out[j as usize] += v;
            }
        }
        finish(out, n, ok)
    }

    /// A plan (RandK, TopK, the block compressors): worker `i` adds its coordinates in plan
    /// order, prefetching ahead (RandK's coordinates are in random order).
    pub fn plan<T: Real>(a: ArrayView2<T>, plan: &RoundPlan) -> Option<Array1<T>> {
        let (n, d) = a.dim();
        let mut out = vec![T::zero(); d];
        let mut ok = true;
        for i in 0..n {
            let (c, scale) = plan.worker(i);
            let c = c.expect("a plan with coordinates");
            let row = a.row(i);
            for (p, &j) in c.iter().enumerate() {
                if let Some(&ja) = c.get(p + AHEAD) {
                    prefetch(addr(&a, i, ja as usize));
                    prefetch(out.as_ptr().wrapping_add(ja as usize));
                }
                let v = scaled(row[j as usize], scale);
                ok &= v.is_finite();
                out[j as usize] += v;
            }
        }
        finish(out, n, ok)
    }

    /// RandK: the workers are split into contiguous ranges of about `2^13` samples, run on
    /// rayon's threads; each range samples its workers' coordinates (per-worker streams) and
    /// gathers their scaled values, then the values are added in worker order. Neither the
    /// samples nor the order of the additions depend on the split, so the result is the
    /// sequential one, bit for bit.
    pub fn randk_parallel<T: Real>(a: ArrayView2<T>, k: usize, seed: u64, round: u64) -> Option<Array1<T>> {
        let (n, d) = a.dim();
        let scale = d as f64 / k as f64;
        let per_part = (RANDK_PART / k).max(1);
        let part = |lo: usize| -> (Vec<u32>, Vec<T>, bool) {
            let hi = (lo + per_part).min(n);
            let mut sampler = rng::Sampler::new(d, k);
            let mut sel = Vec::with_capacity(k);
            let mut coords = Vec::with_capacity((hi - lo) * k);
            let mut vals = Vec::with_capacity((hi - lo) * k);
            let mut ok = true;
            for i in lo..hi {
                super::randk_coords(seed, round, i, k, &mut sampler, &mut sel);
                let row = a.row(i);
                for (q, &j) in sel.iter().enumerate() {
                    if let Some(&ja) = sel.get(q + AHEAD) {
                        prefetch(addr(&a, i, ja as usize));
                    }
                    let v = scaled(row[j as usize], scale);
                    ok &= v.is_finite();
                    vals.push(v);
                }
                coords.extend_from_slice(&sel);
            }
            (coords, vals, ok)
        };
        let done: Vec<(Vec<u32>, Vec<T>, bool)> = (0..n).step_by(per_part).collect::<Vec<_>>().into_par_iter().map(part).collect();
        let mut out = vec![T::zero(); d];
        let mut ok = true;
        for (c, v, o) in &done {
            ok &= o;
            for (q, (&j, &x)) in c.iter().zip(v).enumerate() {
                if let Some(&ja) = c.get(q + AHEAD) {
                    prefetch(out.as_ptr().wrapping_add(ja as usize));
                }
                out[j as usize] += x;
            }
        }
        finish(out, n, ok)
    }

    /// Samples per parallel RandK task.
    const RANDK_PART: usize = 1 << 13;

    /// Identity: the plain average, summed in worker order.
    pub fn all<T: Real>(a: ArrayView2<T>) -> Option<Array1<T>> {
        let (n, d) = a.dim();
        let mut out = vec![T::zero(); d];
        let mut ok = true;
        for row in a.rows() {
            match row.as_slice() {
                Some(s) => {
                    for (o, &x) in out.iter_mut().zip(s) {
                        ok &= x.is_finite();
                        *o += x;
                    }
                }
                None => {
                    for (o, &x) in out.iter_mut().zip(row.iter()) {
                        ok &= x.is_finite();
                        *o += x;
                    }
                }
            }
        }
        finish(out, n, ok)
    }

    fn finish<T: Real>(mut out: Vec<T>, n: usize, ok: bool) -> Option<Array1<T>> {
        if !ok {
            return None;
        }
        let nt = T::of(n as f64);
        out.iter_mut().for_each(|v| *v = *v / nt);
        Some(Array1::from(out))
    }
}

/// [`aggregate`] on a precomputed plan.
pub fn aggregate_with_plan<T: Real>(spec: &Spec, plan: &RoundPlan, a: ArrayView2<T>, seed: u64, round: u64) -> Result<Array1<T>> {
    let (n, d) = a.dim();
    let mut out = Array1::<T>::zeros(d);
    {
        let o = out.as_slice_mut().expect("fresh array is contiguous");
        for i in 0..n {
            let (coords, scale) = plan.worker(i);
            emit_worker(spec, a.row(i), coords, scale, seed, round, i, |j, v| o[j] += v)?;
        }
    }
    let nt = T::of(n as f64);
    out.mapv_inplace(|v| v / nt);
    Ok(out)
}

/// The `(n, d)` array of compressed rows `C_i(a_i)`.
pub fn compress_all<T: Real>(spec: &Spec, a: ArrayView2<T>, seed: u64, round: u64) -> Result<Array2<T>> {
    let (n, d) = a.dim();
    check_shape(n, d)?;
    let plan = assignment(spec, n, d, seed, round, Some(a))?.into_plan(d);
    let mut out = Array2::<T>::zeros((n, d));
    for i in 0..n {
        let (coords, scale) = plan.worker(i);
        let mut row = out.row_mut(i);
        emit_worker(spec, a.row(i), coords, scale, seed, round, i, |j, v| row[j] = v)?;
    }
    Ok(out)
}

/// One worker's message: the coordinates it sends and their values, in message order.
pub fn compress<T: Real>(spec: &Spec, x: ArrayView1<T>, worker: usize, n: usize, seed: u64, round: u64) -> Result<(Vec<u32>, Vec<T>)> {
    let d = x.len();
    let (coords, scale) = worker_selection(spec, n, d, seed, round, worker, Some(x))?;
    let mut idx = Vec::with_capacity(coords.as_ref().map_or(d, Vec::len));
    let mut val = Vec::with_capacity(idx.capacity());
    emit_worker(spec, x, coords.as_deref(), scale, seed, round, worker, |j, v| {
        idx.push(j as u32);
        val.push(v);
    })?;
    Ok((idx, val))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;

    fn spec(s: Sparsifier) -> Spec {
        Spec::new(s, Quantizer::None).unwrap()
    }

    fn data(n: usize, d: usize) -> Array2<f64> {
        Array2::from_shape_fn((n, d), |(i, j)| ((i * 31 + j * 17) % 13) as f64 - 6.5 + 0.25 * i as f64)
    }

    /// The worker sets of a plan (message order aside).
    fn sets(plan: &RoundPlan, d: usize) -> Vec<Vec<u32>> {
        let (offsets, coords, _) = plan.to_csr(d);
        (0..offsets.len() - 1)
            .map(|i| {
                let mut c = coords[offsets[i]..offsets[i + 1]].to_vec();
                c.sort_unstable();
                c
            })
            .collect()
    }

    fn inverse(p: &[u32]) -> Vec<u32> {
        let mut inv = vec![0u32; p.len()];
        for (i, &v) in p.iter().enumerate() {
            inv[v as usize] = i as u32;
        }
        inv
    }

    #[test]
    fn seeded_permk_is_the_definition_on_the_streams_permutations() {
        // The seeded sampler is `permk_plan_wide` (the paper's general definition, checked by
        // exact enumeration in Python) applied to pi_d = σ⁻¹ and pi_n = τ⁻¹, with τ and then σ
        // the stream's first two permutations.
        for (n, d) in [(3, 9), (4, 10), (5, 5), (1, 7), (6, 13), (300, 1000), (2, 70000)] {
            for round in 0..3 {
                let plan = round_plan::<f64>(&spec(Sparsifier::PermK), n, d, 11, round, None).unwrap();
                let mut rng = rng::stream(11, Purpose::Permutation, SHARED, round);
                let tau = if d % n > 0 { rng::permutation(&mut rng, n) } else { (0..n as u32).collect() };
                let sigma = rng::permutation(&mut rng, d);
                let reference = permk_plan_wide(n, d, &inverse(&sigma), &inverse(&tau));
                assert_eq!(sets(&plan, d), sets(&reference, d), "n={n} d={d}");
                let (offsets, coords, _) = plan.to_csr(d);
                for i in 0..n {
                    assert!(coords[offsets[i]..offsets[i + 1]].windows(2).all(|w| w[0] < w[1]), "increasing");
                }
            }
        }
        // tall regime and BlockPermK: block_plan on the stream's permutation of the workers
        for (n, d) in [(7, 3), (10, 4), (5, 5)] {
            let plan = round_plan::<f64>(&spec(Sparsifier::PermK), n, d, 2, 8, None).unwrap();
            if n > d {
                let pi = rng::permutation(&mut rng::stream(2, Purpose::Permutation, SHARED, 8), n);
                assert_eq!(plan, block_plan(n, (0..=d).collect(), (0..d as u32).collect(), pi));
            }
        }
    }

    /// The k largest magnitudes (ties: lower index), increasing: the definition, by sorting.
    fn topk_naive(x: &[f64], k: usize) -> Vec<u32> {
        let mut idx: Vec<u32> = (0..x.len() as u32).collect();
        idx.sort_by(|&a, &b| x[b as usize].abs().partial_cmp(&x[a as usize].abs()).unwrap().then(a.cmp(&b)));
        let mut top = idx[..k].to_vec();
        top.sort_unstable();
        top
    }

    #[test]
    fn topk_selection_matches_a_full_sort() {
        let mut r = rng::stream(4, Purpose::Quantizer, 0, 0);
        let rows: Vec<Vec<f64>> = vec![
            (0..500).map(|_| rng::unit(&mut r) - 0.5).collect(),
            (0..500).map(|j| j as f64).collect(),            // increasing: every value enters
            (0..500).map(|j| -(j as f64)).collect(),         // decreasing
            vec![1.0; 300],                                  // all tied
            (0..400).map(|j| ((j * 7) % 5) as f64 - 2.0).collect(), // many ties, ± zero
            vec![0.0, -0.0, 0.0, -0.0],
            (0..1000).map(|j| if j % 97 == 0 { 1e300 } else { 1e-300 * j as f64 }).collect(),
            // long rows (the sampled starting bar), including ones that fool the sample
            (0..20000).map(|_| rng::unit(&mut r) - 0.5).collect(),
            (0..20000).map(|j| j as f64).collect(),
            (0..20000).map(|j| if j % 4 == 0 { 1.0 } else { 0.5 }).collect(),
            (0..20000).map(|j| if j % 4 == 0 { 1.0 } else if j % 4 == 1 { 2.0 } else { 0.0 }).collect(),
        ];
        for x in &rows {
            for k in [1, 2, 3, 17, 64, 150, 1500, 6000, x.len() / 2, x.len() - 1, x.len()] {
                if k == 0 || k > x.len() {
                    continue;
                }
                let got = topk_coords(ndarray::ArrayView1::from(x.as_slice()), k, 0).unwrap();
                assert_eq!(got, topk_naive(x, k), "k={k} x[..4]={:?}", &x[..4]);
                let xs: Vec<f32> = x.iter().map(|&v| v as f32).collect();
                let x32: Vec<f64> = xs.iter().map(|&v| v as f64).collect();
                if !xs.iter().all(|v| v.is_finite()) {
                    continue;
                }
                let got = topk_coords(ndarray::ArrayView1::from(xs.as_slice()), k, 0).unwrap();
                assert_eq!(got, topk_naive(&x32, k), "f32 k={k}");
            }
        }
        let bad = [1.0, f64::NAN, f64::INFINITY];
        assert!(matches!(
            topk_coords(ndarray::ArrayView1::from(&bad[..]), 1, 3),
            Err(CoreError::NonFinite { worker: 3, coord: 1, .. })
        ));
    }

    #[test]
    fn fast_kernels_agree_with_the_generic_path() {
        // Large enough for the chunked/parallel kernels (PermK d >= 2^18, RandK n·k >= 2^15,
        // TopK n·d >= 2^16), plus strided and float32 views.
        let specs = [
            spec(Sparsifier::PermK),
            spec(Sparsifier::RandK { k: 1 }),
            spec(Sparsifier::RandK { k: 9000 }),
            spec(Sparsifier::TopK { k: 5 }),
            spec(Sparsifier::Identity),
            spec(Sparsifier::BlockPermK { partition: Partition::Contiguous { m: 2 } }),
        ];
        let shapes = [(4, 10), (7, 3), (1, 5), (2, (1 << 18) + 3), (8, 9001)];
        for &(n, d) in &shapes {
            let big = Array2::from_shape_fn((n, 2 * d), |(i, j)| ((i * 7919 + j * 104729) % 1000003) as f64 / 997.0 - 500.0);
            let views = [big.slice(ndarray::s![.., ..d]).to_owned(), big.slice(ndarray::s![.., ..;2]).to_owned()];
            for a in &views {
                let strided = big.slice(ndarray::s![.., ..;2]);
                for sp in &specs {
                    if sp.check(n, d).is_err() {
                        continue;
                    }
                    let plan = round_plan(sp, n, d, 3, 1, Some(a.view())).unwrap();
                    let generic = aggregate_with_plan(sp, &plan, a.view(), 3, 1).unwrap();
                    assert_eq!(aggregate(sp, a.view(), 3, 1).unwrap(), generic, "{sp:?} n={n} d={d}");
                    assert_eq!(aggregate(sp, strided, 3, 1).unwrap(), aggregate(sp, views[1].view(), 3, 1).unwrap());
                    let a32 = a.mapv(|v| v as f32);
                    let plan32 = round_plan(sp, n, d, 3, 1, Some(a32.view())).unwrap();
                    assert_eq!(aggregate(sp, a32.view(), 3, 1).unwrap(), aggregate_with_plan(sp, &plan32, a32.view(), 3, 1).unwrap());
                }
            }
        }
    }

    #[test]
    fn permk_wide_partitions_coordinates() {
        for (n, d) in [(3, 9), (4, 10), (5, 5), (1, 7), (6, 13)] {
            let plan = round_plan::<f64>(&spec(Sparsifier::PermK), n, d, 5, 2, None).unwrap();
            let mut seen = vec![0; d];
            for i in 0..n {
                let (c, s) = plan.worker(i);
                let c = c.unwrap();
                assert!(c.len() == d / n || c.len() == d / n + 1);
                assert_eq!(s, n as f64);
                for &j in c {
                    seen[j as usize] += 1;
                }
            }
            assert!(seen.iter().all(|&s| s == 1), "n={n} d={d}: {seen:?}");
        }
    }

    #[test]
    fn permk_tall_each_coordinate_q_times() {
        for (n, d) in [(6, 3), (7, 3), (10, 4)] {
            let plan = round_plan::<f64>(&spec(Sparsifier::PermK), n, d, 1, 0, None).unwrap();
            let q = n / d;
            let mut seen = vec![0; d];
            let mut idle = 0;
            for i in 0..n {
                let (c, s) = plan.worker(i);
                let c = c.unwrap();
                assert!(c.len() <= 1);
                assert_eq!(s, n as f64 / q as f64);
                if c.is_empty() {
                    idle += 1;
                }
                for &j in c {
                    seen[j as usize] += 1;
                }
            }
            assert_eq!(idle, n % d);
            assert!(seen.iter().all(|&s| s == q));
        }
    }

    #[test]
    fn three_paths_agree() {
        let specs = [
            spec(Sparsifier::PermK),
            spec(Sparsifier::RandK { k: 3 }),
            spec(Sparsifier::TopK { k: 2 }),
            spec(Sparsifier::Identity),
            spec(Sparsifier::BlockPermK { partition: Partition::Contiguous { m: 2 } }),
            Spec::new(Sparsifier::PermK, Quantizer::Natural).unwrap(),
            Spec::new(Sparsifier::PermK, Quantizer::Qsgd { s: 4 }).unwrap(),
        ];
        for (n, d) in [(4, 10), (7, 3), (5, 5)] {
            let a = data(n, d);
            for sp in &specs {
                if sp.check(n, d).is_err() {
                    continue;
                }
                let agg = aggregate(sp, a.view(), 9, 4).unwrap();
                let rows = compress_all(sp, a.view(), 9, 4).unwrap();
                let mut acc = Array1::<f64>::zeros(d);
                for i in 0..n {
                    let (idx, val) = compress(sp, a.row(i), i, n, 9, 4).unwrap();
                    let mut dense = Array1::<f64>::zeros(d);
                    for (j, v) in idx.iter().zip(val) {
                        dense[*j as usize] = v;
                    }
                    assert_eq!(dense, rows.row(i));
                    acc += &dense;
                }
                acc.mapv_inplace(|v| v / n as f64);
                assert_eq!(acc, agg, "{sp:?} n={n} d={d}");
            }
        }
    }

    #[test]
    fn permk_aggregate_of_equal_inputs_is_exact() {
        // IV(1): equal inputs have zero variance.
        let a = Array2::from_shape_fn((4, 12), |(_, j)| j as f64 * 0.5);
        let agg = aggregate(&spec(Sparsifier::PermK), a.view(), 1, 1).unwrap();
        assert_eq!(agg, a.row(0));
    }

    #[test]
    fn topk_picks_largest_with_ties_by_index() {
        let x = ndarray::arr1(&[1.0, -3.0, 2.0, 3.0, 0.5]);
        let (idx, val) = compress(&spec(Sparsifier::TopK { k: 2 }), x.view(), 0, 1, 0, 0).unwrap();
        assert_eq!(idx, vec![1, 3]);
        assert_eq!(val, vec![-3.0, 3.0]);
    }

    #[test]
    fn natural_rounds_to_neighbouring_powers() {
        let mut r = rng::stream(0, Purpose::Quantizer, 0, 0);
        for &x in &[3.0, -5.5, 0.75, 1e-310, 8.0] {
            for _ in 0..20 {
                let y = natural(x, &mut r);
                let a: f64 = x.abs();
                assert_eq!(y.signum(), x.signum());
                assert!(y.abs() <= 2.0 * a && y.abs() >= a / 2.0, "{x} -> {y}");
                assert_eq!(y.abs().log2().fract(), 0.0);
            }
        }
        assert_eq!(natural(8.0, &mut r), 8.0);
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let a = data(3, 4);
        assert!(aggregate(&spec(Sparsifier::RandK { k: 5 }), a.view(), 0, 0).is_err());
        assert!(Spec::new(Sparsifier::TopK { k: 0 }, Quantizer::None).is_err());
        assert!(aggregate(&spec(Sparsifier::BlockPermK { partition: Partition::Contiguous { m: 4 } }), a.view(), 0, 0).is_err());
        let mut b = a.clone();
        b[[1, 2]] = f64::NAN;
        assert!(matches!(
            aggregate(&spec(Sparsifier::TopK { k: 1 }), b.view(), 0, 0),
            Err(CoreError::NonFinite { worker: 1, coord: 2, .. })
        ));
        assert!(compress(&spec(Sparsifier::PermK), a.row(0), 3, 3, 0, 0).is_err());
        let empty = Array2::<f64>::zeros((0, 4));
        assert!(aggregate(&spec(Sparsifier::PermK), empty.view(), 0, 0).is_err());
        assert!(Partition::labels(vec![0, 2, 2]).is_err());
    }
}
