//! Deterministic TopK: each worker sends its `k` largest-magnitude coordinates (ties: lower
//! index first), unscaled. Data-dependent: there is no shared plan.

use ndarray::{ArrayView1, ArrayView2};
use rayon::prelude::*;

use super::{check_k, take_k, Footprint, Sparsify};
use crate::error::{CoreError, Result};
use crate::params::Params;
use crate::plan::{Assignment, OwnedCoords, RoundPlan, Selection};
use crate::real::Real;
use crate::{mem, threads};

#[derive(Clone, Debug, PartialEq)]
pub struct TopK {
    pub k: usize,
}

/// Rows at least this large (`n·d` elements) select on the pool's threads (each row's
/// selection is independent of the thread count).
pub const PAR_THRESHOLD: usize = 1 << 16;

impl Sparsify for TopK {
    const NAME: &'static str = "topk";
    const TITLE: &'static str = "TopK";
    const PARAMS: &'static [&'static str] = &["k"];

    fn from_params(params: &mut Params) -> Result<Self> {
        let k = take_k(params, "topk")?;
        Ok(TopK { k })
    }

    fn check(&self, _n: usize, d: usize) -> Result<()> {
        check_k(self.k, d)
    }

    fn footprint(&self, n: usize, d: usize) -> Footprint {
        let (n128, k) = (n as u128, self.k as u128);
        let threads = threads::num_threads().unwrap_or(1) as u128;
        Footprint {
            // the lists, the plan and every thread's candidate buffer
            assign: 8 * n128 * k + 16 * n128 + 8 + threads * (16 * (2 * k + 32).min(d as u128 + 1) + 4 * k),
            plan: 0,
            coords: n128 * k,
            worker_max: k,
            scratch: 0,
        }
    }

    fn assign<T: Real>(&self, n: usize, d: usize, seed: u64, round: u64, data: Option<ArrayView2<T>>) -> Result<Assignment> {
        Ok(Assignment::Plan(self.assign_rows(n, d, seed, round, 0, n, data)?))
    }

    /// The rows' selections, on the pool's threads for large inputs.
    fn assign_rows<T: Real>(&self, _n: usize, d: usize, _seed: u64, _round: u64, start: usize, m: usize, data: Option<ArrayView2<T>>) -> Result<RoundPlan> {
        let k = self.k;
        let a = data.ok_or_else(|| CoreError::invalid("A", "TopK needs the data to choose coordinates"))?;
        if a.dim() != (m, d) {
            return Err(CoreError::invalid("A", format!("must have shape ({m}, {d}), got {:?}", a.dim())));
        }
        let lists: Vec<Result<Vec<u32>>> = if m * d >= PAR_THRESHOLD && m > 1 {
            threads::install(|| (0..m).into_par_iter().map(|i| topk_coords(a.row(i), k, start + i)).collect())?
        } else {
            (0..m).map(|i| topk_coords(a.row(i), k, start + i)).collect()
        };
        let mut offsets = mem::vec("the plan's offsets", m + 1)?;
        offsets.push(0);
        let mut coords = mem::vec("the plan's coordinates", m * k)?;
        for l in lists {
            // the first failing worker in worker order, whatever the thread count
            coords.extend_from_slice(&l?);
            offsets.push(coords.len());
        }
        let scales = mem::filled("the plan's scales", m, 1.0)?;
        Ok(RoundPlan::Csr { offsets, coords, scales })
    }

    fn select<T: Real>(&self, _n: usize, _d: usize, _seed: u64, _round: u64, worker: usize, x: Option<ArrayView1<T>>) -> Result<Selection> {
        let x = x.ok_or_else(|| CoreError::invalid("x", "TopK needs the data to choose coordinates"))?;
        Ok((OwnedCoords::List(topk_coords(x, self.k, worker)?), 1.0))
    }

    fn data_dependent(&self) -> bool {
        true
    }
}

/// The candidates: keys `>= lo` may still be in the top `k`.
struct Candidates {
    buf: Vec<(u64, u32)>,
    k: usize,
    cap: usize,
    lo: u64,
}
impl Candidates {
    fn by_rank(a: &(u64, u32), b: &(u64, u32)) -> std::cmp::Ordering {
        b.0.cmp(&a.0).then(a.1.cmp(&b.1))
    }
    #[inline]
    fn offer(&mut self, key: u64, j: usize) {
        if key >= self.lo {
            self.buf.push((key, j as u32));
            if self.buf.len() == self.cap {
                self.buf.select_nth_unstable_by(self.k - 1, Self::by_rank);
                self.buf.truncate(self.k);
                self.lo = self.buf.iter().map(|p| p.0).min().unwrap_or(0) + 1;
            }
        }
    }
    fn finish(mut self) -> Vec<(u64, u32)> {
        if self.buf.len() > self.k {
            self.buf.select_nth_unstable_by(self.k - 1, Self::by_rank);
            self.buf.truncate(self.k);
        }
        self.buf
    }
}
/// One pass over any row: the candidates and the largest key.
fn scan(keys: impl Iterator<Item = u64>, mut c: Candidates) -> (Vec<(u64, u32)>, u64) {
    let mut max_key = 0u64;
    for (j, key) in keys.enumerate() {
        max_key = max_key.max(key);
        c.offer(key, j);
    }
    (c.finish(), max_key)
}
/// The same over a contiguous row, in blocks of 16: the values of a block whose magnitudes are
/// not below the candidates' bar are offered (a comparison of all 16 at once into a bit mask,
/// so it vectorizes; the bar as a value, exact since the keys of non-negative values are
/// ordered like the values; the other values could not enter). The comparison is unordered
/// (`!(|x| < bar)`), so a NaN or ±inf is always offered: the largest key offered, returned, is
/// `>= T::NON_FINITE_KEY` exactly when a value is not finite.
#[inline(always)]
fn scan_slice<T: Real>(s: &[T], mut c: Candidates) -> (Vec<(u64, u32)>, u64) {
    const B: usize = 16;
    let bar_of = |lo: u64| T::of_magnitude_key(lo.min(T::NON_FINITE_KEY + 1));
    let mut max_key = 0u64;
    let (mut lo, mut bar) = (c.lo, bar_of(c.lo));
    let blocks = s.chunks_exact(B);
    let tail = blocks.len() * B;
    for (b, x) in blocks.enumerate() {
        #[allow(clippy::neg_cmp_op_on_partial_ord)] // unordered on purpose: a NaN must open its block
        let mut hits = x.iter().enumerate().fold(0u32, |m, (t, v)| m | ((!(v.abs() < bar)) as u32) << t);
        if hits != 0 {
            while hits != 0 {
                let t = hits.trailing_zeros() as usize;
                hits &= hits - 1;
                let key = x[t].magnitude_key();
                max_key = max_key.max(key);
                c.offer(key, b * B + t);
            }
            if c.lo != lo {
                (lo, bar) = (c.lo, bar_of(c.lo));
            }
        }
    }
    for (j, v) in s.iter().enumerate().skip(tail) {
        max_key = max_key.max(v.magnitude_key());
        c.offer(v.magnitude_key(), j);
    }
    (c.finish(), max_key)
}

/// [`scan_slice`] compiled for AVX2 when the CPU has it (detected at run time): the blocks'
/// comparisons take half the instructions; the same candidates (no value depends on the vector
/// width).
#[inline]
fn scan_slice_dispatch<T: Real>(s: &[T], c: Candidates) -> (Vec<(u64, u32)>, u64) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { scan_slice_avx2(s, c) };
        }
    }
    scan_slice(s, c)
}

/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scan_slice_avx2<T: Real>(s: &[T], c: Candidates) -> (Vec<(u64, u32)>, u64) {
    scan_slice(s, c)
}

/// The `k` largest-magnitude coordinates of `row` (ties: lower index), in increasing order.
///
/// One pass keeps a buffer of candidates: once it holds `k` of them, only values of larger
/// magnitude than the current `k`-th can still enter (a later equal magnitude has a larger
/// index, so it ranks lower); when the buffer fills up it is cut back to its top `k`. On long
/// rows a strided sample first suggests a starting bar (about the `2k`-th largest magnitude);
/// if fewer than `k` values clear it, the pass is redone without it. A contiguous row is read in
/// blocks of 16 whose magnitudes are compared with the bar first (vectorized), so most blocks
/// cost one vector comparison. This is `O(d)` work and selects exactly the set a full sort by
/// (magnitude descending, index ascending) would.
pub fn topk_coords<T: Real>(row: ArrayView1<T>, k: usize, worker: usize) -> Result<Vec<u32>> {
    let d = row.len();
    if k == 0 || k > d {
        return Err(CoreError::invalid("k", format!("k = {k} is outside [1, d] with d = {d}")));
    }
    let cap = (2 * k + 32).min(d + 1);
    let run = |lo: u64| -> Result<(Vec<(u64, u32)>, u64)> {
        let c = Candidates { buf: mem::vec("TopK's candidates", cap)?, k, cap, lo };
        Ok(match row.as_slice() {
            Some(s) => scan_slice_dispatch(s, c),
            None => scan(row.iter().map(|v| v.magnitude_key()), c),
        })
    };
    // A starting bar from a strided sample of m keys: its r-th largest, r about twice the
    // sample's expected share of the top k (so about 2k values clear it).
    const M: usize = 1024;
    let r = 2 * k * M / d.max(1);
    let bar = if d >= 4 * M && (8..M).contains(&r) {
        let step = d / M;
        let mut sample: Vec<u64> = (0..M).map(|t| row[t * step].magnitude_key()).collect();
        let (_, &mut v, _) = sample.select_nth_unstable_by(r, |a, b| b.cmp(a));
        v.min(T::NON_FINITE_KEY)
    } else {
        0
    };
    let (mut buf, mut max_key) = run(bar)?;
    if buf.len() < k {
        (buf, max_key) = run(0)?;
    }
    if max_key >= T::NON_FINITE_KEY {
        let j = row.iter().position(|v| !v.is_finite()).unwrap_or(0);
        return Err(CoreError::NonFinite { what: "input", worker, coord: j });
    }
    let mut out: Vec<u32> = mem::collect("TopK's coordinates", k, buf.into_iter().map(|p| p.1))?;
    out.sort_unstable();
    Ok(out)
}
