//! The aggregation kernels of the sparsifiers without quantizer. Each returns `Ok(None)` when
//! an input or a scaled value is not finite (the generic path then reports the first one).
//! Every value is `scale · a[i, j]` rounded once to `T` (`a[i, j]` itself when the scale is 1),
//! accumulated into a zeroed output in worker order and finally divided by `n`, as in
//! [`crate::compress::aggregate_with_plan`], so the results agree bit for bit.

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

/// `o = combine(o, f(x))` for one worker over a tile: the first worker of a block writes
/// `0 + v`, the later ones add, the last one divides by `n` — the generic path's arithmetic
/// (`out[j] += v` into zeros, then `out[j] / n`) in one pass.
#[inline(always)]
fn combine_with<T: Real>(o: &mut [T], x: &[T], first: bool, last: bool, nt: T, f: impl Fn(T) -> T) {
    match (first, last) {
        (true, true) => o.iter_mut().zip(x).for_each(|(o, &x)| *o = (T::zero() + f(x)) / nt),
        (true, false) => o.iter_mut().zip(x).for_each(|(o, &x)| *o = T::zero() + f(x)),
        (false, false) => o.iter_mut().zip(x).for_each(|(o, &x)| *o += f(x)),
        (false, true) => o.iter_mut().zip(x).for_each(|(o, &x)| *o = (*o + f(x)) / nt),
    }
}

#[inline(always)]
fn combine<T: Real>(o: &mut [T], x: &[T], first: bool, last: bool, nt: T, scale: f64) {
    if scale == 1.0 {
        combine_with(o, x, first, last, nt, |v| v)
    } else {
        combine_with(o, x, first, last, nt, |v| T::of(scale * v.f64()))
    }
}

/// True when every value is finite (vectorised: `v·0` is 0 exactly for finite `v`).
#[inline]
fn all_finite<T: Real>(o: &[T]) -> bool {
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
fn block_workers(pi: &[u32], slot_block: &[u32], m: usize) -> Result<(Vec<usize>, Vec<u32>)> {
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

/// The block compressors whose blocks are ranges (BlockPermK with a contiguous partition,
/// PermK for `n > d`): block by block and tile by tile, the block's workers (in worker order)
/// are combined in one pass over contiguous memory ([`combine`]). Tiles are independent, so
/// they run on the pool's threads for large inputs without changing any bit.
pub fn blocks_ranges<T: Real>(a: ArrayView2<T>, pi: &[u32], slot_block: &[u32], bounds: &[usize], scale: f64) -> Result<Option<Array1<T>>> {
    let (n, d) = a.dim();
    let m = bounds.len() - 1;
    let (first, workers) = block_workers(pi, slot_block, m)?;
    let tiles = range_tiles(bounds)?;
    let mut out = mem::zeros::<T>("the average", &[d])?;
    let nt = T::of(n as f64);
    let tile = |&(b, lo, hi): &(usize, usize, usize), o: &mut [T], buf: &mut Vec<T>| -> bool {
        let ws = &workers[first[b]..first[b + 1]];
        for (t, &w) in ws.iter().enumerate() {
            let x = row_part(&a, w as usize, lo, hi, buf);
            combine(o, x, t == 0, t + 1 == ws.len(), nt, scale);
        }
        // every coordinate belongs to a block with at least one worker (m <= n)
        all_finite(o)
    };
    let mut parts: Vec<&mut [T]> = mem::vec("the block tiles", tiles.len())?;
    let mut rest: &mut [T] = &mut out;
    for &(_, lo, hi) in &tiles {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(hi - lo);
        parts.push(head);
        rest = tail;
    }
    let work = workers.len() / m.max(1) * d;
    let ok = if work >= RANGES_PAR_THRESHOLD && tiles.len() > 1 {
        threads::install(|| {
            parts
                .into_par_iter()
                .zip(tiles.par_iter())
                .map_init(Vec::new, |buf, (o, t)| tile(t, o, buf))
                .reduce(|| true, |x, y| x && y)
        })?
    } else {
        let mut buf = Vec::new();
        parts.into_iter().zip(&tiles).fold(true, |ok, (o, t)| tile(t, o, &mut buf) && ok)
    };
    Ok(ok.then(|| Array1::from(out)))
}

/// `compress_all` of the block compressors whose blocks are ranges: row `i` of the zeroed
/// `(n, d)` output gets `scale · a[i, block]` on its block (the generic path writes the same
/// values). Rows are independent (the pool's threads for large inputs).
pub fn compress_all_ranges<T: Real>(a: ArrayView2<T>, pi: &[u32], slot_block: &[u32], bounds: &[usize], scale: f64) -> Result<Option<Array2<T>>> {
    let (n, d) = a.dim();
    let mut out = mem::zeros::<T>("the compressed rows", &[n, d])?;
    let row = |i: usize, dst: &mut [T], buf: &mut Vec<T>| -> bool {
        let Some(b) = RoundPlan::block_of(pi, slot_block, i) else { return true };
        let (lo, hi) = (bounds[b], bounds[b + 1]);
        let x = row_part(&a, i, lo, hi, buf);
        let o = &mut dst[lo..hi];
        if scale == 1.0 {
            o.copy_from_slice(x);
        } else {
            o.iter_mut().zip(x).for_each(|(o, &x)| *o = T::of(scale * x.f64()));
        }
        all_finite(o)
    };
    let ok = if n > 1 && n * d >= RANGES_PAR_THRESHOLD {
        threads::install(|| out.par_chunks_mut(d).enumerate().map_init(Vec::new, |buf, (i, dst)| row(i, dst, buf)).reduce(|| true, |x, y| x && y))?
    } else {
        let mut buf = Vec::new();
        out.chunks_mut(d).enumerate().fold(true, |ok, (i, dst)| row(i, dst, &mut buf) && ok)
    };
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

/// RandK: the workers are split into contiguous ranges of about `2^13` samples, run on the
/// pool's threads; each range samples its workers' coordinates (per-worker streams) and
/// gathers their scaled values, then the values are added in worker order. Neither the
/// samples nor the order of the additions depend on the split, so the result is the
/// sequential one, bit for bit.
/// One RandK task's coordinates, scaled values and whether all were finite.
type RandKPart<T> = Result<(Vec<u32>, Vec<T>, bool)>;

pub fn randk_parallel<T: Real>(a: ArrayView2<T>, k: usize, seed: u64, round: u64) -> Result<Option<Array1<T>>> {
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
            crate::sparsify::randk::randk_coords(seed, round, i, k, &mut sampler, &mut sel);
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
