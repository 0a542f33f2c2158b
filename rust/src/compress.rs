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
}

impl RoundPlan {
    pub fn n(&self) -> usize {
        match self {
            RoundPlan::All { n } => *n,
            RoundPlan::Csr { scales, .. } => scales.len(),
        }
    }

    /// `(Some(coords) | None for all, scale)` of worker `i`.
    pub fn worker(&self, i: usize) -> (Option<&[u32]>, f64) {
        match self {
            RoundPlan::All { .. } => (None, 1.0),
            RoundPlan::Csr { offsets, coords, scales } => (Some(&coords[offsets[i]..offsets[i + 1]]), scales[i]),
        }
    }
}

fn csr_from_lists(lists: Vec<Vec<u32>>, scales: Vec<f64>) -> RoundPlan {
    let mut offsets = Vec::with_capacity(lists.len() + 1);
    offsets.push(0);
    let mut coords = Vec::with_capacity(lists.iter().map(Vec::len).sum());
    for l in &lists {
        coords.extend_from_slice(l);
        offsets.push(coords.len());
    }
    RoundPlan::Csr { offsets, coords, scales }
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
pub fn block_plan(n: usize, offsets_b: &[usize], coords_b: &[u32], pi: &[u32]) -> RoundPlan {
    let m = offsets_b.len() - 1;
    let q = n / m;
    let mut offsets = Vec::with_capacity(n + 1);
    let mut coords = Vec::with_capacity(q * coords_b.len());
    offsets.push(0);
    for &s in &pi[..n] {
        let s = s as usize;
        if s < m * q {
            let b = s / q;
            coords.extend_from_slice(&coords_b[offsets_b[b]..offsets_b[b + 1]]);
        }
        offsets.push(coords.len());
    }
    RoundPlan::Csr { offsets, coords, scales: vec![n as f64 / q as f64; n] }
}

/// The `k` largest-magnitude coordinates of `row` (ties: lower index), ascending.
fn topk_coords<T: Real>(row: ArrayView1<T>, k: usize, worker: usize) -> Result<Vec<u32>> {
    let mut keyed: Vec<(T, u32)> = Vec::with_capacity(row.len());
    for (j, &v) in row.iter().enumerate() {
        if !v.is_finite() {
            return Err(CoreError::NonFinite { what: "input", worker, coord: j });
        }
        keyed.push((v.abs(), j as u32));
    }
    let by_rank = |a: &(T, u32), b: &(T, u32)| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1));
    if k < keyed.len() {
        keyed.select_nth_unstable_by(k - 1, by_rank);
    }
    let mut out: Vec<u32> = keyed[..k].iter().map(|p| p.1).collect();
    out.sort_unstable();
    Ok(out)
}

fn randk_coords(seed: u64, round: u64, worker: usize, k: usize, buf: &mut [u32], out: &mut Vec<u32>) {
    let mut rng = rng::stream(seed, Purpose::RandK, worker as u64, round);
    rng::sample_without_replacement(&mut rng, buf, k, out);
}

/// Rows at least this large use rayon for TopK's per-worker selection.
const PAR_THRESHOLD: usize = 1 << 16;

/// The plan of round `round`. TopK needs the data (`a`); the others ignore it.
pub fn round_plan<T: Real>(spec: &Spec, n: usize, d: usize, seed: u64, round: u64, a: Option<ArrayView2<T>>) -> Result<RoundPlan> {
    spec.check(n, d)?;
    Ok(match &spec.sparsifier {
        Sparsifier::Identity => RoundPlan::All { n },
        Sparsifier::PermK if d >= n => {
            let mut rng = rng::stream(seed, Purpose::Permutation, SHARED, round);
            let pi_d = rng::permutation(&mut rng, d);
            let pi_n = if d % n > 0 { rng::permutation(&mut rng, n) } else { Vec::new() };
            permk_plan_wide(n, d, &pi_d, &pi_n)
        }
        Sparsifier::PermK => {
            let pi = rng::permutation(&mut rng::stream(seed, Purpose::Permutation, SHARED, round), n);
            let offsets: Vec<usize> = (0..=d).collect();
            let coords: Vec<u32> = (0..d as u32).collect();
            block_plan(n, &offsets, &coords, &pi)
        }
        Sparsifier::BlockPermK { partition } => {
            let (offsets, coords) = partition.csr(d)?;
            let pi = rng::permutation(&mut rng::stream(seed, Purpose::Permutation, SHARED, round), n);
            block_plan(n, &offsets, &coords, &pi)
        }
        Sparsifier::RandK { k } => {
            let mut buf: Vec<u32> = (0..d as u32).collect();
            let mut offsets = Vec::with_capacity(n + 1);
            let mut coords = Vec::with_capacity(n * k);
            let mut out = Vec::with_capacity(*k);
            offsets.push(0);
            for i in 0..n {
                randk_coords(seed, round, i, *k, &mut buf, &mut out);
                coords.extend_from_slice(&out);
                offsets.push(coords.len());
            }
            RoundPlan::Csr { offsets, coords, scales: vec![d as f64 / *k as f64; n] }
        }
        Sparsifier::TopK { k } => {
            let a = a.ok_or_else(|| CoreError::invalid("A", "TopK needs the data to choose coordinates"))?;
            let lists: Result<Vec<Vec<u32>>> = if n * d >= PAR_THRESHOLD && n > 1 {
                (0..n).into_par_iter().map(|i| topk_coords(a.row(i), *k, i)).collect()
            } else {
                (0..n).map(|i| topk_coords(a.row(i), *k, i)).collect()
            };
            csr_from_lists(lists?, vec![1.0; n])
        }
    })
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
            let mut buf: Vec<u32> = (0..d as u32).collect();
            let mut out = Vec::with_capacity(*k);
            randk_coords(seed, round, worker, *k, &mut buf, &mut out);
            Ok((Some(out), d as f64 / *k as f64))
        }
        Sparsifier::TopK { k } => {
            let x = x.ok_or_else(|| CoreError::invalid("x", "TopK needs the data to choose coordinates"))?;
            Ok((Some(topk_coords(x, *k, worker)?), 1.0))
        }
        _ => {
            let plan = round_plan::<T>(spec, n, d, seed, round, None)?;
            let (c, s) = plan.worker(worker);
            Ok((c.map(<[u32]>::to_vec), s))
        }
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
pub fn aggregate<T: Real>(spec: &Spec, a: ArrayView2<T>, seed: u64, round: u64) -> Result<Array1<T>> {
    let (n, d) = a.dim();
    check_shape(n, d)?;
    let plan = round_plan(spec, n, d, seed, round, Some(a))?;
    aggregate_with_plan(spec, &plan, a, seed, round)
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
    let plan = round_plan(spec, n, d, seed, round, Some(a))?;
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
