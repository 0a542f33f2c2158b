//! The aggregation kernels of the sparsifiers without quantizer. Each returns `Ok(None)` when
//! an input or a scaled value is not finite (the generic path then reports the first one).
//! Every value is `scale · a[i, j]` rounded once to `T` (`a[i, j]` itself when the scale is 1),
//! accumulated into a zeroed output in worker order and finally divided by `n`, as in
//! [`crate::compress::aggregate_with_plan`], so the results agree bit for bit.

use std::mem::MaybeUninit;

use ndarray::{Array1, Array2, ArrayView2};
use rayon::prelude::*;

use crate::error::Result;
use crate::mem;
use crate::plan::{Blocks, Coords, Label, RoundPlan};
use crate::real::Real;
use crate::rng;
use crate::threads;

/// How far ahead the random-access loops prefetch.
const AHEAD: usize = 32;

#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
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
pub fn scaled<T: Real>(x: T, scale: f64) -> T {
    if scale == 1.0 {
        x
    } else {
        T::of(scale * x.f64())
    }
}

fn finish<T: Real>(mut out: Vec<T>, n: usize, ok: bool) -> Option<Array1<T>> {
    if !ok {
        return None;
    }
    let nt = T::of(n as f64);
    out.iter_mut().for_each(|v| *v = *v / nt);
    Some(Array1::from(out))
}

/// Coordinate `j` comes from worker `owner[j]` alone (PermK for `d >= n`, CoordinateSampling),
/// so `out[j] = (0 + scale·a[owner[j], j]) / n`: one sequential pass over the coordinates
/// (reading `a` at scattered rows, prefetched ahead), then the division (vectorised).
pub fn owners<T: Real, L: Label>(a: ArrayView2<T>, owner: &[L], scale: f64) -> Result<Option<Array1<T>>> {
    let (n, d) = a.dim();
    let mut out = mem::zeros::<T>("the average", &[d])?;
    // Each output coordinate is computed on its own: splitting the pass into chunks (and
    // running them on the pool's threads for large inputs) cannot change any bit.
    let chunk = |start: usize, out: &mut [T]| -> bool {
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
        threads::install(|| out.par_chunks_mut(OWNERS_CHUNK).enumerate().map(|(c, o)| chunk(c * OWNERS_CHUNK, o)).reduce(|| true, |x, y| x && y))?
    } else {
        out.chunks_mut(OWNERS_CHUNK).enumerate().fold(true, |ok, (c, o)| chunk(c * OWNERS_CHUNK, o) && ok)
    };
    Ok(ok.then(|| Array1::from(out)))
}

/// PermK, `d >= n`, fused with the shuffle: coordinate `j`'s owner is final right after step
/// `j` of the Fisher–Yates shuffle (from the end), so its value is prefetched then and read
/// `AHEAD` steps later, overlapping the shuffle with the scattered reads.
pub fn owners_fused<T: Real, L: Label>(a: ArrayView2<T>, rng: &mut rand_chacha::ChaCha8Rng, labels: &mut [L]) -> Result<Option<Array1<T>>> {
    let (n, d) = a.dim();
    let scale = n as f64;
    let nt = T::of(scale);
    let mut out = mem::zeros::<T>("the average", &[d])?;
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
    Ok(ok.then(|| Array1::from(out)))
}

/// Owner inputs with at least this many coordinates gather on the pool's threads, in chunks.
pub const OWNERS_PAR_THRESHOLD: usize = 1 << 18;
const OWNERS_CHUNK: usize = 1 << 15;

/// The block compressors, worker by worker: worker `i` adds its block. The first value of a
/// later worker's block is prefetched (with singleton blocks every worker reads one value of
/// its own row: a latency-bound walk down the rows otherwise).
pub fn blocks<T: Real>(a: ArrayView2<T>, pi: &[u32], slot_block: &[u32], blocks: &Blocks, scale: f64) -> Result<Option<Array1<T>>> {
    let (n, d) = a.dim();
    let block = |i: usize| -> Coords<'_> {
        match RoundPlan::block_of(pi, slot_block, i) {
            None => Coords::List(&[]),
            Some(b) => blocks.block(b),
        }
    };
    let first = |c: Coords<'_>| -> Option<usize> {
        match c {
            Coords::List(c) => c.first().map(|&j| j as usize),
            Coords::Range(lo, hi) => (lo < hi).then_some(lo),
            Coords::All => (d > 0).then_some(0),
        }
    };
    let mut out = mem::zeros::<T>("the average", &[d])?;
    let mut ok = true;
    for i in 0..n {
        if i + AHEAD < n {
            if let Some(j) = first(block(i + AHEAD)) {
                prefetch(addr(&a, i + AHEAD, j));
            }
        }
        let row = a.row(i);
        block(i).for_each(d, |j| {
            let v = scaled(row[j], scale);
            ok &= v.is_finite();
            out[j] += v;
        });
    }
    Ok(finish(out, n, ok))
}

/// Elements per task of the contiguous block kernels.
const TILE: usize = 1 << 12;
/// Contiguous block work (values read) from which the kernels run on the pool's threads.
pub const RANGES_PAR_THRESHOLD: usize = 1 << 18;

/// `o = combine(o, f(x))` for a later worker over a tile (the first one writes through
/// [`init_pass`]): add, and the last one divides by `n` — the generic path's arithmetic
/// (`out[j] += v` into zeros, then `out[j] / n`) in one pass.
#[inline(always)]
fn combine_with<T: Real>(o: &mut [T], x: &[T], last: bool, nt: T, f: impl Fn(T) -> T) {
    if last {
        o.iter_mut().zip(x).for_each(|(o, &x)| *o = (*o + f(x)) / nt)
    } else {
        o.iter_mut().zip(x).for_each(|(o, &x)| *o += f(x))
    }
}

#[inline(always)]
fn combine<T: Real>(o: &mut [T], x: &[T], last: bool, nt: T, scale: f64) {
    if scale == 1.0 {
        combine_with(o, x, last, nt, |v| v)
    } else {
        combine_with(o, x, last, nt, |v| T::of(scale * v.f64()))
    }
}

/// True when every value is finite (vectorised: `v·0` is 0 exactly for finite `v`).
#[inline(always)]
pub(crate) fn all_finite<T: Real>(o: &[T]) -> bool {
    let mut probe = [T::zero(); 8];
    let chunks = o.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for l in 0..8 {
            probe[l] += c[l] * T::zero();
        }
    }
    let mut p = probe.iter().fold(T::zero(), |s, &v| s + v);
    for &v in tail {
        p += v * T::zero();
    }
    p == T::zero()
}

/// One worker's pass over a tile ([`combine`]), followed by the finite check after the last
/// worker; `true` unless a value is not finite.
#[inline(always)]
fn tile_pass<T: Real>(o: &mut [T], x: &[T], last: bool, nt: T, scale: f64) -> bool {
    combine(o, x, last, nt, scale);
    !last || all_finite(o)
}

/// `$base(args)` compiled for the widest vector instructions the CPU has: `$avx512(args)` or
/// `$avx2(args)` (the kernel's copies in [`simd`], one per instruction set) when the CPU has
/// them (detected at run time), else `$base(args)` itself. IEEE arithmetic gives the same bits at
/// every vector width (and Rust never contracts `a·b + c` into a fused multiply-add), so the
/// choice changes only the speed. Returns from the calling function in the vector cases.
macro_rules! widest {
    ($avx512:path, $avx2:path, $base:path, ($($arg:expr),* $(,)?)) => {{
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU supports AVX-512F (checked just above).
                return unsafe { $avx512($($arg),*) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU supports AVX2 (checked just above).
                return unsafe { $avx2($($arg),*) };
            }
        }
        $base($($arg),*)
    }};
}

/// [`tile_pass`] at the widest vector width ([`widest!`]): the division of the average by `n`
/// bounds the contiguous kernels, and AVX-512 divides twice as many values per cycle as the
/// baseline SSE2.
#[inline]
fn tile_pass_dispatch<T: Real>(o: &mut [T], x: &[T], last: bool, nt: T, scale: f64) -> bool {
    widest!(simd::tile_pass_avx512, simd::tile_pass_avx2, tile_pass, (o, x, last, nt, scale))
}

/// [`first_pass`] compiled for the widest vector instructions the CPU has (as
/// [`tile_pass_dispatch`]).
#[inline]
fn first_pass_dispatch<'a, T: Real>(o: &'a mut [MaybeUninit<T>], x: &[T], last: bool, nt: T, scale: f64) -> (&'a mut [T], bool) {
    widest!(simd::first_pass_avx512, simd::first_pass_avx2, first_pass, (o, x, last, nt, scale))
}

/// `*v /= nt` for every value of `o` (`nt` a positive worker count), the same bits: a
/// multiplication by the exact reciprocal when `nt` is a power of two (both are the correctly
/// rounded quotient), else the division with the widest vector instructions the CPU has (the
/// baseline's two quotients per instruction bound the owners' average otherwise).
pub fn divide_all(o: &mut [f64], nt: f64) {
    if let Some(inv) = exact_reciprocal(nt) {
        o.iter_mut().for_each(|v| *v *= inv);
        return;
    }
    widest!(simd::divide_avx512, simd::divide_avx2, divide, (o, nt))
}

/// `*v /= nt` for every value of `o`: [`divide_all`]'s pass (compiled for each vector width).
#[inline(always)]
fn divide(o: &mut [f64], nt: f64) {
    o.iter_mut().for_each(|v| *v /= nt);
}

/// `1/v` when it is exact (`v` a power of two whose reciprocal is normal): then `x·(1/v)` is the
/// correctly rounded `x/v`, the same bits as the division.
fn exact_reciprocal(v: f64) -> Option<f64> {
    let exact = v.is_normal() && v > 0.0 && v.to_bits() & ((1u64 << 52) - 1) == 0 && (1.0 / v).is_normal();
    exact.then(|| 1.0 / v)
}

/// One participant's gradient at one point, formed on the fly: `a·t_j + c_j` at coordinate `j`
/// (the synthetic quadratic's rows from the products `t = T x` and `c = c·x` every worker
/// shares: [`crate::quadratic::Tridiagonal::dasha_pp_values`]).
#[derive(Clone, Copy, Debug)]
pub struct Affine<'a> {
    pub a: f64,
    pub t: &'a [f64],
    pub c: &'a [f64],
}

/// DASHA-PP's estimator step at one coordinate, from the participant's gradients `nv`, `ov` at
/// the two points: `dh = ((nv − ov) − (h − ov)·b)/p`, `h += dh`, `g += dh·w`, bit for bit numpy's
/// `dh = new − old; dh −= (h − old)·b; dh /= p; h += dh; g += dh·w`.
#[inline(always)]
pub fn pp_step(h: &mut f64, g: &mut f64, nv: f64, ov: f64, b: f64, w: f64, quot: impl Fn(f64) -> f64) {
    let dh = quot((nv - ov) - (*h - ov) * b);
    *h += dh;
    *g += dh * w;
}

/// [`pp_step`] at every coordinate of one participant's rows `h`, `g`, its gradients formed on
/// the fly ([`Affine`]: no row of them is written or read). The quotient by `p` is a
/// multiplication by the exact reciprocal when `p` is a power of two (the same correctly rounded
/// value, as [`divide_all`]), else the division; both with the widest vector instructions the
/// CPU has.
pub fn pp_estimators_affine(h: &mut [f64], g: &mut [f64], new: Affine, old: Affine, b: f64, p: f64, w: f64) {
    let recip = exact_reciprocal(p);
    widest!(simd::pp_affine_avx512, simd::pp_affine_avx2, pp_affine_quot, (h, g, new, old, b, p, recip, w))
}

/// [`pp_estimators_affine`]'s pass, by the reciprocal `recip` when given, else by `p`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn pp_affine_quot(h: &mut [f64], g: &mut [f64], new: Affine, old: Affine, b: f64, p: f64, recip: Option<f64>, w: f64) {
    match recip {
        Some(r) => pp_affine(h, g, new, old, b, w, |v| v * r),
        None => pp_affine(h, g, new, old, b, w, |v| v / p),
    }
}

#[inline(always)]
fn pp_affine(h: &mut [f64], g: &mut [f64], new: Affine, old: Affine, b: f64, w: f64, quot: impl Fn(f64) -> f64 + Copy) {
    let len = h.len();
    let (g, tn, cn, to, co) = (&mut g[..len], &new.t[..len], &new.c[..len], &old.t[..len], &old.c[..len]);
    let (an, ao) = (new.a, old.a);
    for (j, (hv, gv)) in h.iter_mut().zip(g.iter_mut()).enumerate() {
        pp_step(hv, gv, an * tn[j] + cn[j], ao * to[j] + co[j], b, w, quot);
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{divide, first_pass, pp_affine_quot, tile_pass, Affine, MaybeUninit, Real};

    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn pp_affine_avx512(h: &mut [f64], g: &mut [f64], new: Affine, old: Affine, b: f64, p: f64, recip: Option<f64>, w: f64) {
        pp_affine_quot(h, g, new, old, b, p, recip, w)
    }

    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn pp_affine_avx2(h: &mut [f64], g: &mut [f64], new: Affine, old: Affine, b: f64, p: f64, recip: Option<f64>, w: f64) {
        pp_affine_quot(h, g, new, old, b, p, recip, w)
    }

    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn divide_avx512(o: &mut [f64], nt: f64) {
        divide(o, nt)
    }

    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub unsafe fn divide_avx2(o: &mut [f64], nt: f64) {
        divide(o, nt)
    }

    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn first_pass_avx512<'a, T: Real>(o: &'a mut [MaybeUninit<T>], x: &[T], last: bool, nt: T, scale: f64) -> (&'a mut [T], bool) {
        first_pass(o, x, last, nt, scale)
    }

    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub unsafe fn first_pass_avx2<'a, T: Real>(o: &'a mut [MaybeUninit<T>], x: &[T], last: bool, nt: T, scale: f64) -> (&'a mut [T], bool) {
        first_pass(o, x, last, nt, scale)
    }

    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn tile_pass_avx512<T: Real>(o: &mut [T], x: &[T], last: bool, nt: T, scale: f64) -> bool {
        tile_pass(o, x, last, nt, scale)
    }

    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub unsafe fn tile_pass_avx2<T: Real>(o: &mut [T], x: &[T], last: bool, nt: T, scale: f64) -> bool {
        tile_pass(o, x, last, nt, scale)
    }
}

/// Row `i`'s values `lo..hi`, borrowed when the row is contiguous, else copied into `buf`.
#[inline]
fn row_part<'a, T: Real>(a: &'a ArrayView2<T>, i: usize, lo: usize, hi: usize, buf: &'a mut Vec<T>) -> &'a [T] {
    let row = a.row(i);
    match row.to_slice() {
        Some(s) => &s[lo..hi],
        None => {
            buf.clear();
            buf.extend((lo..hi).map(|j| row[j]));
            buf
        }
    }
}

/// The tasks of a contiguous block kernel: `(block, lo, hi)` tiles in coordinate order.
fn range_tiles(bounds: &[usize]) -> Result<Vec<(usize, usize, usize)>> {
    let m = bounds.len() - 1;
    let count: usize = (0..m).map(|b| (bounds[b + 1] - bounds[b]).div_ceil(TILE)).sum();
    let mut tiles = mem::vec("the block tiles", count)?;
    for b in 0..m {
        let mut lo = bounds[b];
        while lo < bounds[b + 1] {
            let hi = (lo + TILE).min(bounds[b + 1]);
            tiles.push((b, lo, hi));
            lo = hi;
        }
    }
    Ok(tiles)
}

/// The workers of every block in worker order: `workers[first[b]..first[b + 1]]`.
pub fn block_workers(pi: &[u32], slot_block: &[u32], m: usize) -> Result<(Vec<usize>, Vec<u32>)> {
    let n = pi.len();
    let mut first = mem::filled("the block workers", m + 1, 0usize)?;
    for i in 0..n {
        if let Some(b) = RoundPlan::block_of(pi, slot_block, i) {
            first[b + 1] += 1;
        }
    }
    for b in 0..m {
        first[b + 1] += first[b];
    }
    let mut workers = mem::filled("the block workers", first[m], 0u32)?;
    let mut fill = mem::copy("the block workers", &first[..m])?;
    for i in 0..n {
        if let Some(b) = RoundPlan::block_of(pi, slot_block, i) {
            workers[fill[b]] = i as u32;
            fill[b] += 1;
        }
    }
    Ok((first, workers))
}

/// Writes `o[t] = combine(0, f(x[t]))` for the first worker of a tile (every element, so the
/// tile is initialised) and returns it initialised.
#[inline(always)]
fn init_pass<'a, T: Real>(o: &'a mut [MaybeUninit<T>], x: &[T], last: bool, nt: T, scale: f64) -> &'a mut [T] {
    let len = o.len().min(x.len());
    let (o, x) = (&mut o[..len], &x[..len]);
    match (last, scale == 1.0) {
        (true, true) => o.iter_mut().zip(x).for_each(|(o, &x)| *o = MaybeUninit::new((T::zero() + x) / nt)),
        (true, false) => o.iter_mut().zip(x).for_each(|(o, &x)| *o = MaybeUninit::new((T::zero() + T::of(scale * x.f64())) / nt)),
        (false, true) => o.iter_mut().zip(x).for_each(|(o, &x)| *o = MaybeUninit::new(T::zero() + x)),
        (false, false) => o.iter_mut().zip(x).for_each(|(o, &x)| *o = MaybeUninit::new(T::zero() + T::of(scale * x.f64()))),
    }
    // SAFETY: the loop above wrote every one of the `len` elements of `o`, and `MaybeUninit<T>`
    // has the layout of `T`.
    unsafe { std::slice::from_raw_parts_mut(o.as_mut_ptr() as *mut T, len) }
}

/// The first worker's pass over a tile ([`init_pass`]), and the finite check when it is also
/// the last; returns the initialised tile and `true` unless a value is not finite.
#[inline(always)]
fn first_pass<'a, T: Real>(o: &'a mut [MaybeUninit<T>], x: &[T], last: bool, nt: T, scale: f64) -> (&'a mut [T], bool) {
    let o = init_pass(o, x, last, nt, scale);
    let ok = !last || all_finite(o);
    (o, ok)
}

/// Where the contiguous block kernel ([`ranges_combine`]) reads worker `w`'s values on the
/// coordinates `lo..hi` of a block starting at `block_lo`.
pub trait RowParts<T>: Sync {
    fn part<'a>(&'a self, w: usize, block_lo: usize, lo: usize, hi: usize, buf: &'a mut Vec<T>) -> &'a [T];
}

/// The rows of an `(n, d)` input: worker `w`'s value at `j` is `a[w, j]`.
pub struct ArrayRows<'v, T>(pub ArrayView2<'v, T>);

impl<T: Real> RowParts<T> for ArrayRows<'_, T> {
    #[inline]
    fn part<'a>(&'a self, w: usize, _block_lo: usize, lo: usize, hi: usize, buf: &'a mut Vec<T>) -> &'a [T] {
        row_part(&self.0, w, lo, hi, buf)
    }
}

/// The values of a plan concatenated in worker order: worker `w`'s block values start at
/// `values[offsets[w]]`.
pub struct ValueRows<'v, T> {
    pub values: &'v [T],
    pub offsets: &'v [usize],
}

impl<T: Real> RowParts<T> for ValueRows<'_, T> {
    #[inline]
    fn part<'a>(&'a self, w: usize, block_lo: usize, lo: usize, hi: usize, _buf: &'a mut Vec<T>) -> &'a [T] {
        let o = self.offsets[w];
        &self.values[o + (lo - block_lo)..o + (hi - block_lo)]
    }
}

/// The block compressors whose blocks are ranges (BlockPermK with a contiguous partition,
/// PermK for `n > d`): block by block and tile by tile, the block's workers (in worker order)
/// are combined in one pass over contiguous memory each ([`combine`]: the first worker writes
/// `0 + v`, the later ones add, the last one divides by `n`). Tiles are independent, so they run
/// on the pool's threads for large inputs without changing any bit. The output is written once
/// (never zeroed first): every coordinate is in a block with at least one worker.
pub fn blocks_ranges<T: Real>(a: ArrayView2<T>, pi: &[u32], slot_block: &[u32], bounds: &[usize], scale: f64) -> Result<Option<Array1<T>>> {
    let (n, d) = a.dim();
    let m = bounds.len() - 1;
    let (first, workers) = block_workers(pi, slot_block, m)?;
    Ok(match ranges_combine(&ArrayRows(a), n, d, bounds, &first, &workers, scale)? {
        Some((out, true)) => Some(Array1::from(out)),
        _ => None,
    })
}

/// The contiguous block kernel of [`blocks_ranges`] on any row source: block `b` is
/// `bounds[b]..bounds[b + 1]` and its workers are `workers[first[b]..first[b + 1]]` in worker
/// order; the result is `(Σ_w scale·v_w) / n` per coordinate, summed in worker order from 0.
/// `None` when the bounds are not a partition of `0..d` or a block has no worker; otherwise the
/// average and whether every value of it is finite.
pub fn ranges_combine<T: Real, R: RowParts<T>>(
    rows: &R,
    n: usize,
    d: usize,
    bounds: &[usize],
    first: &[usize],
    workers: &[u32],
    scale: f64,
) -> Result<Option<(Vec<T>, bool)>> {
    if !ranges_partition(d, bounds, first) {
        return Ok(None);
    }
    let mut out = mem::vec::<T>("the average", d)?;
    let Some(finite) = ranges_combine_into(rows, n, d, bounds, first, workers, scale, &mut out.spare_capacity_mut()[..d])? else {
        return Ok(None);
    };
    // SAFETY: `ranges_combine_into` returned `Some`: it wrote every one of the `d` elements
    // (the tiles partition 0..d and every tile was written in full by its first worker).
    unsafe { out.set_len(d) };
    Ok(Some((out, finite)))
}

/// True when `bounds` partition `0..d` into ranges and every block has a worker (the
/// precondition of the contiguous block kernel; checked before writing anything).
pub fn ranges_partition(d: usize, bounds: &[usize], first: &[usize]) -> bool {
    let m = bounds.len() - 1;
    // not a partition of 0..d into ranges: the generic path
    bounds[0] == 0 && bounds[m] == d && bounds.windows(2).all(|w| w[0] <= w[1]) && first.len() == m + 1
        // a block without workers would leave its coordinates unwritten
        && (0..m).all(|b| first[b] < first[b + 1])
}

/// [`ranges_combine`] into `out` (`d` slots, initialised or not): `Some(finite)` once every
/// slot is written, `None` (nothing written) unless [`ranges_partition`], or (never, for
/// consistent offsets) when a worker's part does not cover its tile, some slots then written.
/// Only initialised values are ever written into `out`.
#[allow(clippy::too_many_arguments)]
fn ranges_combine_into<T: Real, R: RowParts<T>>(
    rows: &R,
    n: usize,
    d: usize,
    bounds: &[usize],
    first: &[usize],
    workers: &[u32],
    scale: f64,
    out: &mut [MaybeUninit<T>],
) -> Result<Option<bool>> {
    let m = bounds.len() - 1;
    if out.len() != d || !ranges_partition(d, bounds, first) {
        return Ok(None);
    }
    let tiles = range_tiles(bounds)?;
    let nt = T::of(n as f64);
    // `Some(finite)`, or `None` when a worker's part does not cover the tile (never, for
    // consistent offsets: then the tile is not fully written)
    let tile = |&(b, lo, hi): &(usize, usize, usize), o: &mut [MaybeUninit<T>], buf: &mut Vec<T>| -> Option<bool> {
        let ws = &workers[first[b]..first[b + 1]];
        let (&w0, rest) = ws.split_first()?;
        let x = rows.part(w0 as usize, bounds[b], lo, hi, buf);
        if x.len() != o.len() {
            return None;
        }
        let (o, mut ok) = first_pass_dispatch(o, x, rest.is_empty(), nt, scale);
        for (t, &w) in rest.iter().enumerate() {
            let x = rows.part(w as usize, bounds[b], lo, hi, buf);
            if x.len() != o.len() {
                return None;
            }
            ok &= tile_pass_dispatch(o, x, t + 1 == rest.len(), nt, scale);
        }
        Some(ok)
    };
    let both = |x: Option<bool>, y: Option<bool>| Some(x? && y?);
    let mut parts: Vec<&mut [MaybeUninit<T>]> = mem::vec("the block tiles", tiles.len())?;
    let mut rest: &mut [MaybeUninit<T>] = out;
    for &(_, lo, hi) in &tiles {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(hi - lo);
        parts.push(head);
        rest = tail;
    }
    let work = workers.len() / m.max(1) * d;
    let written = if work >= RANGES_PAR_THRESHOLD && tiles.len() > 1 {
        threads::install(|| {
            parts
                .into_par_iter()
                .zip(tiles.par_iter())
                .map_init(Vec::new, |buf, (o, t)| tile(t, o, buf))
                .reduce(|| Some(true), both)
        })?
    } else {
        let mut buf = Vec::new();
        parts.into_iter().zip(&tiles).try_fold(true, |ok, (o, t)| Some(tile(t, o, &mut buf)? && ok))
    };
    // `Some`: the tiles partition 0..d (bounds run from 0 to d, checked above) and every tile
    // was written in full by its first worker (every block has a worker and every part covers
    // its tile), so all `d` slots are written
    Ok(written)
}

/// [`ranges_combine`] into the initialised `out` (`d` values, overwritten): `Some(finite)`
/// once every value is written; `None` with `out` untouched unless [`ranges_partition`] (and,
/// never for consistent offsets, `None` with `out` partly written when a worker's values do
/// not cover its tile).
#[allow(clippy::too_many_arguments)]
pub fn ranges_combine_over<T: Real, R: RowParts<T>>(
    rows: &R,
    n: usize,
    d: usize,
    bounds: &[usize],
    first: &[usize],
    workers: &[u32],
    scale: f64,
    out: &mut [T],
) -> Result<Option<bool>> {
    // SAFETY: `MaybeUninit<T>` has the layout of `T`, and `ranges_combine_into` only writes
    // initialised values into its slots (`MaybeUninit::new`), never reads them before writing
    // and never exposes the slots, so every element of `out` stays a valid `T` (`T: Copy`,
    // nothing to drop).
    let slots = unsafe { &mut *(out as *mut [T] as *mut [MaybeUninit<T>]) };
    ranges_combine_into(rows, n, d, bounds, first, workers, scale, slots)
}

/// `compress_all` of the block compressors whose blocks are ranges: row `i` of the zeroed
/// `(n, d)` output gets `scale · a[i, block]` on its block (the generic path writes the same
/// values), one contiguous loop per row. Sequential: the zeroed output's page faults bound it,
/// and a second thread did not measurably help.
pub fn compress_all_ranges<T: Real>(a: ArrayView2<T>, pi: &[u32], slot_block: &[u32], bounds: &[usize], scale: f64) -> Result<Option<Array2<T>>> {
    let (n, d) = a.dim();
    let mut out = mem::zeros::<T>("the compressed rows", &[n, d])?;
    let mut buf = Vec::new();
    let mut ok = true;
    for (i, dst) in out.chunks_mut(d).enumerate() {
        let Some(b) = RoundPlan::block_of(pi, slot_block, i) else { continue };
        let (lo, hi) = (bounds[b], bounds[b + 1]);
        let x = row_part(&a, i, lo, hi, &mut buf);
        let o = &mut dst[lo..hi];
        if scale == 1.0 {
            o.copy_from_slice(x);
        } else {
            o.iter_mut().zip(x).for_each(|(o, &x)| *o = T::of(scale * x.f64()));
        }
        ok &= all_finite(o);
    }
    if !ok {
        return Ok(None);
    }
    Ok(Array2::from_shape_vec((n, d), out).ok())
}

/// A CSR plan (RandK, TopK): worker `i` adds its coordinates in plan order, prefetching ahead
/// (RandK's coordinates are in random order).
pub fn plan<T: Real>(a: ArrayView2<T>, offsets: &[usize], coords: &[u32], scales: &[f64]) -> Result<Option<Array1<T>>> {
    let (n, d) = a.dim();
    let mut out = mem::zeros::<T>("the average", &[d])?;
    let mut ok = true;
    for i in 0..n {
        let c = &coords[offsets[i]..offsets[i + 1]];
        let scale = scales[i];
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
    Ok(finish(out, n, ok))
}

/// Samples per parallel RandK task.
const RANDK_PART: usize = 1 << 13;

/// RandK with at least this many sampled values in all (`n·k`) samples and gathers them on
/// the pool's threads.
pub const RANDK_PAR_THRESHOLD: usize = 1 << 15;

/// One RandK task's coordinates, scaled values and whether all were finite.
type RandKPart<T> = Result<(Vec<u32>, Vec<T>, bool)>;

/// RandK: the workers are split into contiguous ranges of about `2^13` samples, run on the
/// pool's threads; each range samples its workers' coordinates (`sample(i, sampler, out)`
/// writes worker `i`'s `k` coordinates: its own stream) and gathers their scaled values, then
/// the values are added in worker order. Neither the samples nor the order of the additions
/// depend on the split, so the result is the sequential one, bit for bit.
pub fn randk_parallel<T: Real, S>(a: ArrayView2<T>, k: usize, sample: S) -> Result<Option<Array1<T>>>
where
    S: Fn(usize, &mut rng::Sampler, &mut Vec<u32>) + Sync,
{
    let (n, d) = a.dim();
    let scale = d as f64 / k as f64;
    let per_part = (RANDK_PART / k).max(1);
    let part = |lo: usize| -> RandKPart<T> {
        let hi = (lo + per_part).min(n);
        let mut sampler = rng::Sampler::new(d, k)?;
        let mut sel = mem::vec("RandK's sample", k)?;
        let mut coords = mem::vec("RandK's coordinates", (hi - lo) * k)?;
        let mut vals = mem::vec("RandK's values", (hi - lo) * k)?;
        let mut ok = true;
        for i in lo..hi {
            sample(i, &mut sampler, &mut sel);
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
        Ok((coords, vals, ok))
    };
    let starts = mem::collect("RandK's parts", n.div_ceil(per_part), (0..n).step_by(per_part))?;
    let done: Vec<RandKPart<T>> = threads::install(|| starts.into_par_iter().map(part).collect())?;
    let mut out = mem::zeros::<T>("the average", &[d])?;
    let mut ok = true;
    for r in &done {
        let (c, v, o) = r.as_ref().map_err(Clone::clone)?;
        ok &= o;
        for (q, (&j, &x)) in c.iter().zip(v).enumerate() {
            if let Some(&ja) = c.get(q + AHEAD) {
                prefetch(out.as_ptr().wrapping_add(ja as usize));
            }
            out[j as usize] += x;
        }
    }
    Ok(finish(out, n, ok))
}

/// Identity: the plain average, summed in worker order.
pub fn all<T: Real>(a: ArrayView2<T>) -> Result<Option<Array1<T>>> {
    let (n, d) = a.dim();
    let mut out = mem::zeros::<T>("the average", &[d])?;
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
    Ok(finish(out, n, ok))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values of every kind: normal, tiny, subnormal, huge, signed zeros.
    fn values(len: usize, salt: u64) -> Vec<f64> {
        let mut r = rng::stream(salt, rng::Purpose::Quantizer, 0, 0);
        (0..len)
            .map(|j| {
                let u = rng::unit(&mut r) - 0.5;
                match j % 7 {
                    0 => u * 1e-310,
                    1 => u * 1e300,
                    2 => -0.0,
                    3 => 0.0,
                    _ => u * 1e3,
                }
            })
            .collect()
    }

    fn passes<T: Real>(x: &[T], y: &[T], z: &[T], nt: T, scale: f64) -> Vec<Vec<u64>> {
        // the variants this CPU can run: first, middle and last worker of a tile
        type First<T> = for<'a> fn(&'a mut [MaybeUninit<T>], &[T], bool, T, f64) -> (&'a mut [T], bool);
        type Pass<T> = fn(&mut [T], &[T], bool, T, f64) -> bool;
        let mut variants: Vec<(First<T>, Pass<T>)> = vec![(first_pass::<T>, tile_pass::<T>)];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY (in the closures): AVX2 is supported (checked above).
                variants.push((|o, x, l, nt, s| unsafe { simd::first_pass_avx2(o, x, l, nt, s) }, |o, x, l, nt, s| unsafe { simd::tile_pass_avx2(o, x, l, nt, s) }));
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY (in the closures): AVX-512F is supported (checked above).
                variants.push((|o, x, l, nt, s| unsafe { simd::first_pass_avx512(o, x, l, nt, s) }, |o, x, l, nt, s| unsafe { simd::tile_pass_avx512(o, x, l, nt, s) }));
            }
        }
        variants
            .into_iter()
            .map(|(first, pass)| {
                let mut out = vec![MaybeUninit::new(T::zero()); x.len()];
                let (o, ok1) = first(&mut out, x, false, nt, scale);
                let ok2 = pass(o, y, false, nt, scale);
                let ok3 = pass(o, z, true, nt, scale);
                assert!(ok1 && ok2);
                let mut bits: Vec<u64> = o.iter().map(|v| v.f64().to_bits()).collect();
                bits.push(ok3 as u64);
                bits
            })
            .collect()
    }

    #[test]
    fn divide_all_is_the_division() {
        let x = values(4099, 7);
        let mut specials = vec![f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 5e-324, -5e-324, f64::MAX, f64::MIN_POSITIVE];
        specials.extend_from_slice(&x);
        for n in [1usize, 2, 3, 4, 7, 16, 1000, 1024, 1 << 20, u32::MAX as usize] {
            let nt = n as f64;
            let mut a = specials.clone();
            divide_all(&mut a, nt);
            for (got, &v) in a.iter().zip(&specials) {
                let want = v / nt;
                assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{v} / {nt}: {got} != {want}");
            }
        }
    }

    #[test]
    fn every_instruction_set_gives_the_same_bits() {
        for len in [0usize, 1, 7, 8, 63, 4096] {
            let (x, y, z) = (values(len, 1), values(len, 2), values(len, 3));
            for scale in [1.0, 3.0, 1e-3, 7.5] {
                let runs = passes(&x, &y, &z, 7.0, scale);
                assert!(runs.windows(2).all(|w| w[0] == w[1]), "f64 len={len} scale={scale}");
                let f = |v: &Vec<f64>| v.iter().map(|&a| a as f32).collect::<Vec<f32>>();
                let runs = passes(&f(&x), &f(&y), &f(&z), 7.0f32, scale);
                assert!(runs.windows(2).all(|w| w[0] == w[1]), "f32 len={len} scale={scale}");
            }
        }
        // and the finite check sees an overflow or a NaN in any lane
        let mut x = values(64, 4);
        x[37] = f64::NAN;
        let y = values(64, 5);
        for run in passes(&x, &y, &y, 3.0, 2.0) {
            assert_eq!(*run.last().unwrap(), 0);
        }
    }
}
