//! The compressors of the paper as pure functions on `ndarray` views.
//!
//! A compressor is a [`Spec`]: a sparsifier (which coordinates each worker sends, and the
//! scale; [`crate::sparsify`]) followed by an optional quantizer of the sent values
//! (`C_i ∘ Q_i`, Lemma "Composition"). Every entry point — one worker ([`compress`]), some
//! workers' messages ([`compress_rows`]), all workers' compressed rows ([`compress_all`]) and
//! the server's average ([`aggregate`]) — runs the same per-worker routine ([`emit_worker`])
//! on the same assignment, so they agree bit for bit. The average is
//! `(Σ_{i = 0, 1, …, n-1} C_i(a_i)) / n`, summed in worker order.
//!
//! Every entry point validates its arguments and estimates its peak memory
//! ([`crate::mem::Need`]) before allocating or computing anything.

use ndarray::{Array1, Array2, ArrayView1, ArrayView2};
use rayon::prelude::*;
use rand_chacha::ChaCha8Rng;

use crate::error::{CoreError, Result};
use crate::kernels;
use crate::mem::{self, Need};
use crate::params::Params;
pub use crate::plan::{block_plan, Assignment, Blocks, Coords, CsrArrays, OwnedCoords, Ranges, RoundPlan, Selection, IDLE};
use crate::plan::with_owner;
pub use crate::real::Real;
use crate::rng::{self, Purpose};
pub use crate::sparsify::blockpermk::Partition;
pub use crate::sparsify::{BlockPermK, CoordinateSampling, Footprint, Identity, PermK, RandK, Sparsifier, Sparsify, TopK};

/// An unbiased quantizer applied to the values a worker sends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Quantizer {
    None,
    /// Natural compression: random rounding to one of the two nearest powers of two.
    Natural,
    /// QSGD with `s` levels, relative to the worker's full input norm.
    Qsgd { s: u32 },
}

impl Quantizer {
    pub const NAMES: &'static [&'static str] = &["none", "natural", "qsgd"];

    /// The quantizer called `name`, taking its parameters (`s` for QSGD) out of `params`.
    pub fn from_name(name: &str, params: &mut Params) -> Result<Self> {
        match name {
            "none" => Ok(Quantizer::None),
            "natural" => Ok(Quantizer::Natural),
            "qsgd" => {
                let s = params.take_int("s", 1, u32::MAX as i64)?.ok_or_else(|| CoreError::invalid("s", "qsgd needs s"))?;
                Ok(Quantizer::Qsgd { s: s as u32 })
            }
            other => Err(CoreError::invalid(
                "quantizer",
                format!("unknown quantizer {other:?} (known: {})", Self::NAMES.join(", ")),
            )),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Quantizer::None => "none",
            Quantizer::Natural => "natural",
            Quantizer::Qsgd { .. } => "qsgd",
        }
    }

    pub fn known_params(&self) -> &'static [&'static str] {
        match self {
            Quantizer::Qsgd { .. } => &["s"],
            _ => &[],
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    pub sparsifier: Sparsifier,
    pub quantizer: Quantizer,
}

impl Spec {
    pub fn new(sparsifier: impl Into<Sparsifier>, quantizer: Quantizer) -> Result<Self> {
        if let Quantizer::Qsgd { s: 0 } = quantizer {
            return Err(CoreError::invalid("s", "QSGD needs at least 1 level"));
        }
        Ok(Spec { sparsifier: sparsifier.into(), quantizer })
    }

    /// The spec `Spec(sparsifier, quantizer=quantizer, **params)`: every parameter must be
    /// taken by the sparsifier or the quantizer.
    pub fn from_name(sparsifier: &str, quantizer: &str, mut params: Params) -> Result<Self> {
        let sp = Sparsifier::from_name(sparsifier, &mut params)?;
        let q = Quantizer::from_name(quantizer, &mut params)?;
        let known: Vec<&str> = sp.known_params().iter().chain(q.known_params()).copied().collect();
        params.finish(&format!("Spec({sparsifier:?}, quantizer={quantizer:?})"), &known)?;
        Spec::new(sp, q)
    }

    /// The sparsifier's registered name.
    pub fn name(&self) -> &'static str {
        self.sparsifier.name()
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
        self.sparsifier.check(n, d)
    }

    /// True when the coordinates a worker sends depend only on `(seed, round, worker)`.
    pub fn has_shared_coordinates(&self) -> bool {
        !self.sparsifier.data_dependent()
    }

    /// True when every worker's coordinates are a pure function of `(seed, round, worker)` and
    /// its values are `scale_i · x_j` (no quantizer, not data-dependent).
    pub fn shared_plan(&self) -> bool {
        self.has_shared_coordinates() && self.quantizer == Quantizer::None
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

/// The one per-worker routine: reads worker `worker`'s input `row` on its coordinates,
/// applies the quantizer and the scale, and hands each `(coordinate, value)` to `emit` in
/// message order.
#[allow(clippy::too_many_arguments)]
pub fn emit_worker<T: Real>(
    spec: &Spec,
    row: ArrayView1<T>,
    coords: Coords<'_>,
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
    let one = |j: usize| -> Result<()> {
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
    coords.try_for_each(row.len(), one)
}

fn check_shape(n: usize, d: usize) -> Result<()> {
    if n == 0 || d == 0 {
        return Err(CoreError::invalid("A", format!("must have shape (n_workers, d) with both >= 1, got ({n}, {d})")));
    }
    Ok(())
}

/// Blocks at least this large (on average) use the contiguous block kernels; smaller ones
/// (PermK for `n > d`: singletons) walk the workers.
pub(crate) const RANGES_MIN_BLOCK: usize = 32;

/// `(1/n) Σ_i C_i(a_i)` (summed in worker order, then divided by `n`) without materialising
/// the compressed rows.
///
/// Without a quantizer the sparsifiers run tight kernels ([`crate::kernels`]) that compute
/// exactly what [`emit_worker`] computes, in the same order; on a non-finite value they defer
/// to the generic path, which reports the first one in worker and message order.
pub fn aggregate<T: Real>(spec: &Spec, a: ArrayView2<T>, seed: u64, round: u64) -> Result<Array1<T>> {
    let (n, d) = a.dim();
    check_shape(n, d)?;
    spec.check(n, d)?;
    let fp = spec.sparsifier.footprint(n, d);
    Need::new()
        .array::<T>("the average", &[d])
        .bytes("the round's plan", fp.assign + fp.plan)
        .bytes("the kernel's scratch", fp.scratch)
        .check()?;
    if spec.quantizer == Quantizer::None {
        if let Some(out) = spec.sparsifier.aggregate_fast(a, seed, round)? {
            return Ok(out);
        }
    }
    let asg = spec.sparsifier.assign(n, d, seed, round, Some(a))?;
    if spec.quantizer == Quantizer::None {
        let fast = match &asg {
            Assignment::Owners { owner, scale, .. } => with_owner!(owner, v => kernels::owners(a, v, *scale))?,
            Assignment::Plan(RoundPlan::All { .. }) => kernels::all(a)?,
            Assignment::Plan(RoundPlan::Blocks { pi, slot_block, blocks: Blocks::Ranges(bounds), scale }) if d / (bounds.len() - 1) >= RANGES_MIN_BLOCK => {
                kernels::blocks_ranges(a, pi, slot_block, bounds, *scale)?
            }
            Assignment::Plan(RoundPlan::Blocks { pi, slot_block, blocks, scale }) => kernels::blocks(a, pi, slot_block, blocks, *scale)?,
            Assignment::Plan(RoundPlan::Csr { offsets, coords, scales }) => kernels::plan(a, offsets, coords, scales)?,
        };
        if let Some(out) = fast {
            return Ok(out);
        }
    }
    aggregate_with_plan(spec, &asg.into_plan(d)?, a, seed, round)
}

/// [`aggregate`] on a precomputed plan: the generic path.
pub fn aggregate_with_plan<T: Real>(spec: &Spec, plan: &RoundPlan, a: ArrayView2<T>, seed: u64, round: u64) -> Result<Array1<T>> {
    let (n, d) = a.dim();
    if plan.n() != n {
        return Err(CoreError::invalid("A", format!("the plan has {} workers but A has {n} rows", plan.n())));
    }
    let mut out = mem::zeros::<T>("the average", &[d])?;
    for i in 0..n {
        let (coords, scale) = plan.worker(i);
        emit_worker(spec, a.row(i), coords, scale, seed, round, i, |j, v| out[j] += v)?;
    }
    let nt = T::of(n as f64);
    out.iter_mut().for_each(|v| *v = *v / nt);
    Ok(Array1::from(out))
}

/// The `(n, d)` array of compressed rows `C_i(a_i)`.
pub fn compress_all<T: Real>(spec: &Spec, a: ArrayView2<T>, seed: u64, round: u64) -> Result<Array2<T>> {
    let (n, d) = a.dim();
    check_shape(n, d)?;
    spec.check(n, d)?;
    let fp = spec.sparsifier.footprint(n, d);
    Need::new().array::<T>("the compressed rows", &[n, d]).bytes("the round's plan", fp.assign + fp.plan).check()?;
    let asg = spec.sparsifier.assign(n, d, seed, round, Some(a))?;
    if spec.quantizer == Quantizer::None {
        if let Assignment::Plan(RoundPlan::Blocks { pi, slot_block, blocks: Blocks::Ranges(bounds), scale }) = &asg {
            if let Some(out) = kernels::compress_all_ranges(a, pi, slot_block, bounds, *scale)? {
                return Ok(out);
            }
        }
    }
    let plan = asg.into_plan(d)?;
    let mut out = mem::zeros::<T>("the compressed rows", &[n, d])?;
    for (i, row) in out.chunks_mut(d).enumerate() {
        let (coords, scale) = plan.worker(i);
        emit_worker(spec, a.row(i), coords, scale, seed, round, i, |j, v| row[j] = v)?;
    }
    Array2::from_shape_vec((n, d), out).map_err(|e| CoreError::invalid("A", e.to_string()))
}

/// One worker's message: the coordinates it sends and their values, in message order.
pub fn compress<T: Real>(spec: &Spec, x: ArrayView1<T>, worker: usize, n: usize, seed: u64, round: u64) -> Result<(Vec<i64>, Vec<T>)> {
    let d = x.len();
    spec.check(n, d)?;
    if worker >= n {
        return Err(CoreError::invalid("worker", format!("worker = {worker} is outside [0, n_workers) with n_workers = {n}")));
    }
    let fp = spec.sparsifier.footprint(n, d);
    Need::new()
        .bytes("the round's plan", fp.assign)
        .bytes("the worker's coordinates", 4 * fp.worker_max)
        .array::<i64>("the message's indices", &[fp.worker_max.min(usize::MAX as u128) as usize])
        .array::<T>("the message's values", &[fp.worker_max.min(usize::MAX as u128) as usize])
        .check()?;
    let (coords, scale) = spec.sparsifier.select(n, d, seed, round, worker, Some(x))?;
    let len = coords.as_coords().len(d);
    let mut idx = mem::vec("the message's indices", len)?;
    let mut val = mem::vec("the message's values", len)?;
    emit_worker(spec, x, coords.as_coords(), scale, seed, round, worker, |j, v| {
        idx.push(j as i64);
        val.push(v);
    })?;
    Ok((idx, val))
}

/// The messages of several workers, concatenated: worker `start + r` (row `r`) sends
/// `indices[offsets[r]..offsets[r + 1]]` with `values[offsets[r]..offsets[r + 1]]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Messages<T> {
    pub offsets: Vec<i64>,
    pub indices: Vec<i64>,
    pub values: Vec<T>,
}

impl<T> Messages<T> {
    /// Empty messages with room for `rows` workers and `len` values in all.
    pub fn with_capacity(rows: usize, len: usize) -> Result<Self> {
        let mut offsets = mem::vec("the messages' offsets", rows + 1)?;
        offsets.push(0);
        Ok(Messages { offsets, indices: mem::vec("the messages' indices", len)?, values: mem::vec("the messages' values", len)? })
    }

    /// Ends the current worker's message.
    pub fn end_worker(&mut self) {
        self.offsets.push(self.indices.len() as i64);
    }
}

/// The estimated bytes of `rows` workers' messages of `T` values.
pub fn messages_bytes<T>(fp: &Footprint, rows: usize) -> u128 {
    let len = (rows as u128 * fp.worker_max).min(fp.coords);
    8 * (rows as u128 + 1) + len * (8 + std::mem::size_of::<T>() as u128)
}

/// The spec is defined for `n` workers in dimension `d`, and workers `start .. start + m` exist.
fn check_rows(spec: &Spec, m: usize, d: usize, start: usize, n: usize) -> Result<()> {
    spec.check(n, d)?;
    if start.checked_add(m).map_or(true, |stop| stop > n) {
        return Err(CoreError::invalid(
            "start",
            format!("the workers start .. start + m = {start} .. {start} + {m} exceed n_workers = {n}"),
        ));
    }
    Ok(())
}

/// The messages of workers `start .. start + m` whose inputs are the rows of `a` (`(m, d)`),
/// for `n` workers in all: for each worker the values and order of [`compress`], bit for bit.
pub fn compress_rows<T: Real>(spec: &Spec, a: ArrayView2<T>, start: usize, n: usize, seed: u64, round: u64) -> Result<Messages<T>> {
    let (m, d) = a.dim();
    check_rows(spec, m, d, start, n)?;
    let fp = spec.sparsifier.footprint(n, d);
    Need::new()
        .bytes("the round's plan", fp.assign + fp.plan + m as u128 * (4 * fp.worker_max + 24))
        .bytes("the messages", messages_bytes::<T>(&fp, m))
        .check()?;
    let plan = spec.sparsifier.assign_rows(n, d, seed, round, start, m, Some(a))?;
    let mut out = Messages::with_capacity(m, plan.total(d))?;
    for r in 0..m {
        let (coords, scale) = plan.worker(r);
        emit_worker(spec, a.row(r), coords, scale, seed, round, start + r, |j, v| {
            out.indices.push(j as i64);
            out.values.push(v);
        })?;
        out.end_worker();
    }
    Ok(out)
}

/// Inputs of at least this many elements (`m·d`) are compressed on the pool's threads, one
/// worker per task (each worker's message is independent of the thread count).
pub const SHIFTED_PAR_MIN: usize = 1 << 16;

/// The messages of workers `start .. start + m` whose inputs are `v_i = g_i − β·h_i` (`g_i`
/// the rows of `g`, or `g[rows[i]]` with `rows`, `m = rows.len()`; `h_i` the rows of `h`, one per
/// worker, in `T` or another dtype (float32 estimators: [`Shift::apply_mixed`]); `v_i = g_i`
/// without `h`), for `n` workers in all: for each worker the values and order
/// of [`compress_rows`] on the `(m, d)` array of the `v_i`, bit for bit (`g − h` when `β = 1`,
/// else `g − h·β`, in `T`), without forming that array (see [`compress_filled_rows`]), nor the
/// gathered `g[rows]`: workers sharing a row of `g` (the autoencoder's workers sharing a split)
/// read it in place. `None` when an input is not finite (no worker's message is then
/// meaningful: the caller handles the divergence).
#[allow(clippy::too_many_arguments)]
pub fn compress_shifted_rows<T: Real, U: Real>(
    spec: &Spec,
    g: ArrayView2<T>,
    rows: Option<&[usize]>,
    h: Option<ArrayView2<U>>,
    beta: f64,
    start: usize,
    n: usize,
    seed: u64,
    round: u64,
) -> Result<Option<Messages<T>>> {
    let (g_rows, d) = g.dim();
    let m = rows.map_or(g_rows, <[usize]>::len);
    if let Some(rows) = rows {
        if let Some(&bad) = rows.iter().find(|&&r| r >= g_rows) {
            return Err(CoreError::invalid("rows", format!("must index the {g_rows} rows of G, got {bad}")));
        }
    }
    if let Some(h) = &h {
        if h.dim() != (m, d) {
            let what = if rows.is_some() { "one row per worker" } else { "the shape of G" };
            return Err(CoreError::invalid("H", format!("must have {what} ({m}, {d}), got {:?}", h.dim())));
        }
    }
    let row = |r: usize| g.row(rows.map_or(r, |rows| rows[r]));
    let shift = Shift::new(beta)?;
    compress_filled_rows(spec, m, d, start, n, seed, round, |r, buf: &mut [T]| match &h {
        None => buf.iter_mut().zip(row(r)).for_each(|(v, &x)| *v = x),
        Some(h) => match (row(r).to_slice(), h.row(r).to_slice()) {
            (Some(gs), Some(hs)) => buf.iter_mut().zip(gs).zip(hs).for_each(|((v, &x), &y)| *v = shift.apply_mixed(x, y)),
            _ => buf.iter_mut().zip(row(r)).zip(h.row(r)).for_each(|((v, &x), &y)| *v = shift.apply_mixed(x, y)),
        },
    })
}

/// The shift `g − β·h` of the shifted exchanges, in `T` as numpy computes it: `g − h` when
/// `β = 1`, else `g − h·β`.
#[derive(Clone, Copy)]
pub struct Shift {
    beta: f64,
}

impl Shift {
    /// `β = 1`.
    pub const ONE: Shift = Shift { beta: 1.0 };

    /// Checks that `β` is finite.
    pub fn new(beta: f64) -> Result<Self> {
        Ok(Shift { beta: CoreError::finite("beta", beta)? })
    }

    /// Whether `β = 1` (`g − h`).
    #[inline(always)]
    pub fn is_one(self) -> bool {
        self.beta == 1.0
    }

    /// `g − β·h` in `T`.
    #[inline(always)]
    pub fn apply<T: Real>(self, g: T, h: T) -> T {
        if self.beta == 1.0 {
            g - h
        } else {
            g - h * T::of(self.beta)
        }
    }

    /// `g − β·h` for a shift `h` kept in its own dtype `U` (float32 estimators of a float64
    /// input): `h·β` in `U`, then converted, then subtracted in `T` — numpy's `g − h·β` of a
    /// float32 `h` and a Python float (NEP 50: the product stays float32); [`Shift::apply`]
    /// when `U` is `T`.
    #[inline(always)]
    pub fn apply_mixed<T: Real, U: Real>(self, g: T, h: U) -> T {
        if self.beta == 1.0 {
            g - T::of(h.f64())
        } else {
            g - T::of((h * U::of(self.beta)).f64())
        }
    }
}

/// The messages of workers `start .. start + m`, for `n` workers in all, whose inputs (`d`
/// values each) `fill(r, buf)` writes into `buf` for row `r`: each worker's input is formed in a
/// buffer of `d` values, checked (a NaN probe while `buf` is in the cache; a data-dependent
/// selection checks what it reads itself) and compressed in one go, on the pool's threads for
/// large inputs when it has more than one (one worker per task; no value depends on the thread
/// count), else on the caller; the values and order of [`compress_rows`] on the `(m, d)` array
/// of those inputs, which is never formed. `None` when an input is not finite. `fill` must
/// write every value of `buf` (it is reused from worker to worker).
#[allow(clippy::too_many_arguments)]
pub fn compress_filled_rows<T: Real, F>(spec: &Spec, m: usize, d: usize, start: usize, n: usize, seed: u64, round: u64, fill: F) -> Result<Option<Messages<T>>>
where
    F: Fn(usize, &mut [T]) + Sync,
{
    check_rows(spec, m, d, start, n)?;
    let fp = spec.sparsifier.footprint(n, d);
    let threads = crate::threads::num_threads()? as u128;
    Need::new()
        .bytes("the round's plan", rows_plan_bytes(spec, &fp, m))
        .bytes("the workers' inputs", threads * (d as u128) * std::mem::size_of::<T>() as u128)
        .bytes("the messages", 2 * messages_bytes::<T>(&fp, m))
        .check()?;
    let plan = rows_plan::<T>(spec, n, d, seed, round, start, m)?;
    let data_dependent = spec.sparsifier.data_dependent();
    let worker = |r: usize| -> Result<Option<Vec<(u32, T)>>> {
        with_scratch::<T, _>("a worker's input", d, |buf| {
            fill(r, buf);
            // a data-dependent selection reports a non-finite input itself (it reads every value)
            if !data_dependent && !kernels::all_finite(buf) {
                return Ok(None);
            }
            worker_message(spec, plan.as_ref(), ArrayView1::from(&*buf), r, start + r, n, seed, round)
        })?
    };
    type Message<T> = Result<Option<Vec<(u32, T)>>>;
    let msgs: Vec<Message<T>> = if crate::threads::spread(m, m * d, SHIFTED_PAR_MIN)? {
        crate::threads::install(|| (0..m).into_par_iter().map(worker).collect())?
    } else {
        (0..m).map(worker).collect()
    };
    let mut list = mem::vec::<Vec<(u32, T)>>("the messages", m)?;
    for msg in msgs {
        // the first error in worker order, whatever the thread count
        match msg? {
            Some(l) => list.push(l),
            None => return Ok(None),
        }
    }
    let mut out = Messages::with_capacity(m, list.iter().map(Vec::len).sum())?;
    for l in &list {
        for &(j, x) in l {
            out.indices.push(j as i64);
            out.values.push(x);
        }
        out.end_worker();
    }
    Ok(Some(out))
}

/// The plan of workers `start .. start + m` when the spec's selection does not read the data;
/// None for a data-dependent one (TopK), which [`worker_message`] selects worker by worker.
pub(crate) fn rows_plan<T: Real>(spec: &Spec, n: usize, d: usize, seed: u64, round: u64, start: usize, m: usize) -> Result<Option<RoundPlan>> {
    if spec.sparsifier.data_dependent() {
        return Ok(None);
    }
    Ok(Some(spec.sparsifier.assign_rows::<T>(n, d, seed, round, start, m, None)?))
}

/// The estimated bytes of [`rows_plan`] for `m` workers.
pub(crate) fn rows_plan_bytes(spec: &Spec, fp: &Footprint, m: usize) -> u128 {
    if spec.sparsifier.data_dependent() {
        0
    } else {
        fp.assign + fp.plan + m as u128 * (4 * fp.worker_max + 24)
    }
}

/// The message of `worker` (row `r` of `plan`, the [`rows_plan`] of its block) on its input
/// `v`: the plan's coordinates or the spec's own selection, then [`emit_worker`], as
/// `(coordinate, value)` pairs in message order; None when a value of the message, or any value
/// of `v` a data-dependent selection reads, is not finite.
#[allow(clippy::too_many_arguments)]
pub(crate) fn worker_message<T: Real>(
    spec: &Spec,
    plan: Option<&RoundPlan>,
    v: ArrayView1<T>,
    r: usize,
    worker: usize,
    n: usize,
    seed: u64,
    round: u64,
) -> Result<Option<Vec<(u32, T)>>> {
    let d = v.len();
    let owned;
    let (coords, scale) = match plan {
        Some(p) => p.worker(r),
        None => match spec.sparsifier.select(n, d, seed, round, worker, Some(v)) {
            Ok(sel) => {
                owned = sel;
                (owned.0.as_coords(), owned.1)
            }
            Err(CoreError::NonFinite { .. }) => return Ok(None),
            Err(e) => return Err(e),
        },
    };
    let mut msg = mem::vec("the message", coords.len(d))?;
    match emit_worker(spec, v, coords, scale, seed, round, worker, |j, x| msg.push((j as u32, x))) {
        Ok(()) => Ok(Some(msg)),
        Err(CoreError::NonFinite { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

thread_local! {
    /// Each thread's buffer for [`with_scratch`], kept between calls.
    static SCRATCH: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on a buffer of `len` values owned by the calling thread and kept between calls (no
/// allocation, zeroing or page fault per call once it is large enough); its values are left
/// from the previous use (or zero). A nested call on the same thread gets a new buffer.
fn with_scratch<T: Real, R>(what: &str, len: usize, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
    const { assert!(std::mem::align_of::<T>() <= std::mem::align_of::<u64>()) };
    let words = len.checked_mul(std::mem::size_of::<T>()).map(|b| b.div_ceil(8)).ok_or_else(|| mem::alloc_error::<T>(what, &[len]))?;
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut v) => {
            if v.len() < words {
                *v = mem::filled(what, words, 0u64)?;
            }
            // SAFETY: the buffer holds at least `len · size_of::<T>()` initialised bytes, aligned
            // for `T` (checked above), and every bit pattern is a valid `f32` or `f64` (`Real`).
            let buf = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut T, len) };
            Ok(f(buf))
        }
        Err(_) => Ok(f(&mut mem::zeros::<T>(what, &[len])?)),
    })
}

/// The plan of round `round`: data-dependent sparsifiers need the data `a`; the others
/// ignore it.
pub fn round_plan<T: Real>(spec: &Spec, n: usize, d: usize, seed: u64, round: u64, a: Option<ArrayView2<T>>) -> Result<RoundPlan> {
    spec.check(n, d)?;
    let fp = spec.sparsifier.footprint(n, d);
    Need::new().bytes("the round's plan", fp.assign + fp.plan).check()?;
    spec.sparsifier.assign(n, d, seed, round, a)?.into_plan(d)
}

/// The round's plan as numpy-ready CSR arrays (not for a data-dependent sparsifier).
pub fn plan(spec: &Spec, n: usize, d: usize, seed: u64, round: u64) -> Result<CsrArrays> {
    if spec.sparsifier.data_dependent() {
        return Err(CoreError::invalid(
            "sparsifier",
            format!("{}'s coordinates depend on the data; it has no shared plan", spec.sparsifier.title()),
        ));
    }
    spec.check(n, d)?;
    let fp = spec.sparsifier.footprint(n, d);
    let n128 = n as u128;
    Need::new()
        .bytes("the round's assignment", fp.assign + 16 * n128 + 8)
        .array::<i64>("the plan's coordinates", &[fp.coords.min(usize::MAX as u128) as usize])
        .array::<i64>("the plan's offsets", &[n.saturating_add(1)])
        .array::<f64>("the plan's scales", &[n])
        .check()?;
    spec.sparsifier.assign::<f64>(n, d, seed, round, None)?.csr_arrays(d)
}

/// Every worker's coordinates as one range (`O(n)` work), when the spec has a shared plan and
/// the sparsifier guarantees contiguous ranges for `(n, d)`; `None` otherwise.
pub fn plan_ranges(spec: &Spec, n: usize, d: usize, seed: u64, round: u64) -> Result<Option<Ranges>> {
    spec.check(n, d)?;
    if !spec.shared_plan() {
        return Ok(None);
    }
    Need::new().bytes("the ranges", Ranges::bytes(n) + 8 * n as u128 + 8 * (d.min(n) as u128 + 1)).check()?;
    spec.sparsifier.ranges(n, d, seed, round)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Value;
    use crate::sparsify::{permk, topk::topk_coords};
    use ndarray::{s, Array2};

    fn spec(s: impl Into<Sparsifier>) -> Spec {
        Spec::new(s, Quantizer::None).unwrap()
    }

    fn contiguous(m: usize) -> BlockPermK {
        BlockPermK { partition: Partition::Contiguous { m } }
    }

    fn data(n: usize, d: usize) -> Array2<f64> {
        Array2::from_shape_fn((n, d), |(i, j)| ((i * 31 + j * 17) % 13) as f64 - 6.5 + 0.25 * i as f64)
    }

    fn big(n: usize, d: usize) -> Array2<f64> {
        Array2::from_shape_fn((n, d), |(i, j)| ((i * 7919 + j * 104729) % 1000003) as f64 / 997.0 - 500.0)
    }

    /// Every built-in sparsifier, with and without quantizers.
    fn all_specs() -> Vec<Spec> {
        let mut v = vec![
            spec(PermK::default()),
            spec(PermK::SHUFFLE),
            spec(RandK { k: 3 }),
            spec(RandK { k: 1 }),
            spec(TopK { k: 2 }),
            spec(Identity),
            spec(contiguous(2)),
            spec(BlockPermK { partition: Partition::labels(vec![1, 0, 1, 0, 1]).unwrap() }),
            spec(BlockPermK { partition: Partition::labels(vec![0, 0, 1, 1, 1]).unwrap() }),
            spec(CoordinateSampling),
        ];
        for q in [Quantizer::Natural, Quantizer::Qsgd { s: 4 }] {
            v.push(Spec::new(PermK::default(), q).unwrap());
            v.push(Spec::new(TopK { k: 2 }, q).unwrap());
            v.push(Spec::new(CoordinateSampling, q).unwrap());
        }
        v
    }

    /// The worker sets of a plan (message order aside).
    fn sets(plan: &RoundPlan, d: usize) -> Vec<Vec<i64>> {
        let csr = plan.csr_arrays(d).unwrap();
        (0..csr.offsets.len() - 1)
            .map(|i| {
                let mut c = csr.coords[csr.offsets[i] as usize..csr.offsets[i + 1] as usize].to_vec();
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
    fn shared_randomness_is_pinned() {
        // The Python suite's GOLDEN plans (tests/test_compressors.py): the streams never change.
        // PermK's default sampler (rebalance) replaced the shuffle as PermK's stream on purpose;
        // the shuffle's stream is pinned as it was.
        #[allow(clippy::type_complexity)]
        let golden: [(Spec, usize, usize, Vec<i64>, Vec<i64>); 6] = [
            (spec(PermK::SHUFFLE), 4, 10, vec![2, 4, 1, 5, 9, 0, 8, 3, 6, 7], vec![0, 2, 5, 7, 10]),
            (spec(PermK::default()), 4, 10, vec![0, 7, 9, 4, 6, 8, 2, 5, 1, 3], vec![0, 3, 6, 8, 10]),
            (spec(RandK { k: 3 }), 2, 10, vec![2, 7, 4, 3, 6, 9], vec![0, 3, 6]),
            (spec(PermK::default()), 7, 3, vec![0, 1, 2, 1, 2, 0], vec![0, 1, 2, 3, 3, 4, 5, 6]),
            (spec(PermK::SHUFFLE), 7, 3, vec![0, 1, 2, 1, 2, 0], vec![0, 1, 2, 3, 3, 4, 5, 6]),
            (spec(contiguous(2)), 5, 6, vec![0, 1, 2, 3, 4, 5, 3, 4, 5, 0, 1, 2], vec![0, 3, 3, 6, 9, 12]),
        ];
        for (sp, n, d, coords, offsets) in golden {
            let p = plan(&sp, n, d, 0, 0).unwrap();
            assert_eq!((p.coords, p.offsets), (coords, offsets), "{sp:?}");
        }
    }

    #[test]
    fn the_rebalance_stream_is_pinned_beyond_one_chunk() {
        // a round of several chunks (2^16 coordinates each), rebalanced across them: a digest
        // (FNV-1a) of the owners, and the first coordinates of every worker
        let asg = PermK::REBALANCE.assign::<f64>(5, 300_001, 3, 7, None).unwrap();
        let Assignment::Owners { owner: crate::plan::Owner::U8(v), .. } = &asg else { panic!("owners") };
        let digest = v.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &l| (h ^ l as u64).wrapping_mul(0x100_0000_01b3));
        let csr = asg.csr_arrays(300_001).unwrap();
        let firsts: Vec<Vec<i64>> = (0..5).map(|i| csr.coords[csr.offsets[i] as usize..][..4].to_vec()).collect();
        assert_eq!(
            (digest, firsts),
            (18133433112386602096, vec![vec![0, 4, 9, 15], vec![3, 7, 12, 16], vec![2, 6, 10, 11], vec![1, 8, 13, 20], vec![5, 14, 19, 30]])
        );
    }

    #[test]
    fn the_registry_builds_every_sparsifier_by_name() {
        let mut names = Vec::new();
        for &name in Sparsifier::NAMES {
            let params = match name {
                "randk" | "topk" => Params::new().with("k", Value::Int(2)),
                "blockpermk" => Params::new().with("m", Value::Int(2)),
                _ => Params::new(),
            };
            let sp = Spec::from_name(name, "none", params).unwrap();
            assert_eq!(sp.name(), name);
            names.push(name);
            sp.check(4, 10).unwrap();
            let shared = !matches!(sp.sparsifier, Sparsifier::TopK(_));
            assert_eq!(sp.shared_plan(), shared, "{name}");
            assert!(!Spec::from_name(name, "natural", Params::new().with("k", Value::Int(2)).with("m", Value::Int(2))).is_ok_and(|s| s.shared_plan()));
        }
        assert_eq!(names, ["identity", "permk", "randk", "topk", "blockpermk", "coordinate_sampling"]);
        let err = |r: Result<Spec>| r.unwrap_err();
        assert!(matches!(err(Spec::from_name("bogus", "none", Params::new())), CoreError::InvalidArgument { name, .. } if name == "sparsifier"));
        assert!(matches!(err(Spec::from_name("permk", "bogus", Params::new())), CoreError::InvalidArgument { name, .. } if name == "quantizer"));
        assert!(matches!(err(Spec::from_name("permk", "none", Params::new().with("k", Value::Int(2)))), CoreError::InvalidArgument { name, .. } if name == "k"));
        assert!(matches!(err(Spec::from_name("randk", "none", Params::new())), CoreError::InvalidArgument { name, .. } if name == "k"));
        assert!(matches!(err(Spec::from_name("randk", "none", Params::new().with("k", Value::Float(2.0)))), CoreError::WrongType { name, .. } if name == "k"));
        assert!(matches!(err(Spec::from_name("topk", "none", Params::new().with("k", Value::Int(0)))), CoreError::InvalidArgument { name, .. } if name == "k"));
        assert!(matches!(err(Spec::from_name("blockpermk", "none", Params::new())), CoreError::InvalidArgument { name, .. } if name == "m"));
        assert!(matches!(err(Spec::from_name("blockpermk", "none", Params::new().with("labels", Value::Ints(vec![0, -1])))), CoreError::InvalidArgument { name, .. } if name == "partition"));
        assert!(matches!(err(Spec::from_name("blockpermk", "none", Params::new().with("labels", Value::Ints(vec![0, 1])).with("m", Value::Int(3)))), CoreError::InvalidArgument { name, .. } if name == "m"));
        assert!(matches!(err(Spec::from_name("permk", "qsgd", Params::new())), CoreError::InvalidArgument { name, .. } if name == "s"));
        assert!(matches!(err(Spec::from_name("permk", "qsgd", Params::new().with("s", Value::Int(1 << 40)))), CoreError::InvalidArgument { name, .. } if name == "s"));
        let q = Spec::from_name("blockpermk", "qsgd", Params::new().with("labels", Value::Ints(vec![0, 1, 1])).with("s", Value::Int(3))).unwrap();
        assert_eq!(q.quantizer, Quantizer::Qsgd { s: 3 });
        assert!(matches!(&q.sparsifier, Sparsifier::BlockPermK(b) if b.partition.m() == 2));
    }

    #[test]
    fn seeded_permk_is_the_definition_on_the_streams_permutations() {
        // The shuffle sampler is `plan_wide` (the paper's general definition, checked by exact
        // enumeration in Python) applied to pi_d = σ⁻¹ and pi_n = τ⁻¹, with τ and then σ the
        // stream's first two permutations.
        for (n, d) in [(3, 9), (4, 10), (5, 5), (1, 7), (6, 13), (300, 1000), (2, 70000)] {
            for round in 0..3 {
                let plan = round_plan::<f64>(&spec(PermK::SHUFFLE), n, d, 11, round, None).unwrap();
                let mut rng = rng::stream(11, Purpose::Permutation, rng::SHARED, round);
                let tau = if d % n > 0 { rng::permutation(&mut rng, n).unwrap() } else { (0..n as u32).collect() };
                let sigma = rng::permutation(&mut rng, d).unwrap();
                let reference = permk::plan_wide(n, d, &inverse(&sigma), &inverse(&tau)).unwrap();
                assert_eq!(sets(&plan, d), sets(&reference, d), "n={n} d={d}");
                let csr = plan.csr_arrays(d).unwrap();
                for i in 0..n {
                    assert!(csr.coords[csr.offsets[i] as usize..csr.offsets[i + 1] as usize].windows(2).all(|w| w[0] < w[1]), "increasing");
                }
            }
        }
        // tall regime: block_plan on the stream's permutation of the workers, for both samplers
        for (n, d) in [(7, 3), (10, 4)] {
            let pi = rng::permutation(&mut rng::stream(2, Purpose::Permutation, rng::SHARED, 8), n).unwrap();
            for sp in [PermK::SHUFFLE, PermK::REBALANCE] {
                let plan = round_plan::<f64>(&spec(sp), n, d, 2, 8, None).unwrap();
                assert_eq!(plan, block_plan(n, Blocks::Ranges((0..=d).collect()), pi.clone()).unwrap());
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
            (0..500).map(|j| j as f64).collect(),                   // increasing: every value enters
            (0..500).map(|j| -(j as f64)).collect(),                // decreasing
            vec![1.0; 300],                                         // all tied
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
                let got = topk_coords(ArrayView1::from(x.as_slice()), k, 0).unwrap();
                assert_eq!(got, topk_naive(x, k), "k={k} x[..4]={:?}", &x[..4]);
                let xs: Vec<f32> = x.iter().map(|&v| v as f32).collect();
                let x32: Vec<f64> = xs.iter().map(|&v| v as f64).collect();
                if !xs.iter().all(|v| v.is_finite()) {
                    continue;
                }
                let got = topk_coords(ArrayView1::from(xs.as_slice()), k, 0).unwrap();
                assert_eq!(got, topk_naive(&x32, k), "f32 k={k}");
            }
        }
        let bad = [1.0, f64::NAN, f64::INFINITY];
        assert!(matches!(topk_coords(ArrayView1::from(&bad[..]), 1, 3), Err(CoreError::NonFinite { worker: 3, coord: 1, .. })));
        assert!(topk_coords(ArrayView1::from(&bad[..]), 4, 3).is_err());
        // a NaN or an infinity among small values of a long row (in a block no value of which
        // can enter), in the blocks and in the tail, contiguous or strided, is found
        for at in [5, 4000, 19_990, 19_999] {
            for v in [f64::NAN, -f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
                let mut x: Vec<f64> = (0..20_000).map(|j| if j < 8 { 1e6 } else { 1e-3 }).collect();
                x[at] = v;
                for row in [ArrayView1::from(x.as_slice()), ArrayView1::from(x.as_slice()).slice_move(s![..;1])] {
                    assert!(matches!(topk_coords(row, 3, 2), Err(CoreError::NonFinite { worker: 2, coord, .. }) if coord == at), "at={at} v={v}");
                }
                let mut strided = vec![0.0; 40_000];
                strided.iter_mut().step_by(2).zip(&x).for_each(|(s, &v)| *s = v);
                let row = ArrayView1::from(strided.as_slice()).slice_move(s![..;2]);
                assert!(matches!(topk_coords(row, 3, 2), Err(CoreError::NonFinite { coord, .. }) if coord == at));
            }
        }
    }

    #[test]
    fn fast_kernels_agree_with_the_generic_path() {
        // Large enough for the chunked/parallel kernels (PermK d >= 2^18, RandK n·k >= 2^15,
        // TopK n·d >= 2^16, contiguous blocks), plus strided views and float32.
        let specs = [
            spec(PermK::default()),
            spec(PermK::SHUFFLE),
            spec(RandK { k: 1 }),
            spec(RandK { k: 9000 }),
            spec(TopK { k: 5 }),
            spec(Identity),
            spec(contiguous(1)),
            spec(contiguous(2)),
            spec(contiguous(7)),
            spec(CoordinateSampling),
        ];
        let shapes = [(4, 10), (7, 3), (1, 5), (2, (1 << 18) + 3), (8, 9001), (9, 70_001), (300, 40)];
        for &(n, d) in &shapes {
            let whole = big(n, 2 * d);
            let views = [whole.slice(s![.., ..d]).to_owned(), whole.slice(s![.., ..;2]).to_owned()];
            let strided = whole.slice(s![.., ..;2]);
            for a in &views {
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

    /// `compress_all` worker by worker with the generic routine.
    fn compress_all_generic<T: Real>(sp: &Spec, a: ArrayView2<T>, seed: u64, round: u64) -> Array2<T> {
        let (n, d) = a.dim();
        let plan = round_plan(sp, n, d, seed, round, Some(a)).unwrap();
        let mut out = Array2::<T>::zeros((n, d));
        for i in 0..n {
            let (c, s) = plan.worker(i);
            let mut row = out.row_mut(i);
            emit_worker(sp, a.row(i), c, s, seed, round, i, |j, v| row[j] = v).unwrap();
        }
        out
    }

    #[test]
    fn contiguous_block_kernels_are_the_generic_path() {
        // aggregate and compress_all with contiguous blocks (including sorted labels), every
        // block size regime, strided and float32 inputs, and both thread counts.
        let specs = [
            spec(contiguous(1)),
            spec(contiguous(3)),
            spec(contiguous(100)),
            spec(BlockPermK { partition: Partition::labels((0..5000u32).map(|j| j * 4 / 5000).collect()).unwrap() }),
        ];
        for &(n, d) in &[(3, 5000), (100, 5000), (103, 5000), (250, 5000), (4, 300_000)] {
            let whole = big(n, 2 * d);
            for sp in &specs {
                if sp.check(n, d).is_err() {
                    continue;
                }
                for a in [whole.slice(s![.., ..d]), whole.slice(s![.., ..;2])] {
                    let plan = round_plan(sp, n, d, 7, 2, Some(a)).unwrap();
                    let generic = aggregate_with_plan(sp, &plan, a, 7, 2).unwrap();
                    assert_eq!(aggregate(sp, a, 7, 2).unwrap(), generic, "{sp:?} n={n} d={d}");
                    assert_eq!(compress_all(sp, a, 7, 2).unwrap(), compress_all_generic(sp, a, 7, 2));
                    let a32 = a.mapv(|v| v as f32);
                    let plan32 = round_plan(sp, n, d, 7, 2, Some(a32.view())).unwrap();
                    assert_eq!(aggregate(sp, a32.view(), 7, 2).unwrap(), aggregate_with_plan(sp, &plan32, a32.view(), 7, 2).unwrap());
                    assert_eq!(compress_all(sp, a32.view(), 7, 2).unwrap(), compress_all_generic(sp, a32.view(), 7, 2));
                }
            }
        }
        // -0.0 inputs stay +0.0 in the average (0 + (-0) = +0), as in the generic path
        let z = Array2::from_elem((2, 64), -0.0f64);
        let avg = aggregate(&spec(contiguous(1)), z.view(), 0, 0).unwrap();
        assert!(avg.iter().all(|v| v.to_bits() == 0));
        // non-finite values and overflows: the generic path's errors and results
        let mut bad = big(4, 4096);
        bad[[2, 100]] = f64::NAN;
        let sp = spec(contiguous(2));
        assert!(matches!(aggregate(&sp, bad.view(), 0, 0), Err(CoreError::NonFinite { .. })) || aggregate(&sp, bad.view(), 0, 0).is_ok());
        let plan = round_plan(&sp, 4, 4096, 0, 0, Some(bad.view())).unwrap();
        assert_eq!(aggregate(&sp, bad.view(), 0, 0).err(), aggregate_with_plan(&sp, &plan, bad.view(), 0, 0).err());
        assert_eq!(compress_all(&sp, bad.view(), 0, 0).err(), {
            let p = round_plan(&sp, 4, 4096, 0, 0, Some(bad.view())).unwrap();
            (0..4).find_map(|i| {
                let (c, s) = p.worker(i);
                emit_worker(&sp, bad.row(i), c, s, 0, 0, i, |_, _| {}).err()
            })
        });
        let huge = Array2::from_elem((4, 4096), f64::MAX / 2.0);
        let plan = round_plan(&sp, 4, 4096, 0, 0, Some(huge.view())).unwrap();
        assert_eq!(aggregate(&sp, huge.view(), 0, 0).err(), aggregate_with_plan(&sp, &plan, huge.view(), 0, 0).err());
        let f32max = Array2::from_elem((4, 4096), 3e38f32);
        let plan = round_plan(&sp, 4, 4096, 0, 0, Some(f32max.view())).unwrap();
        let e = aggregate(&sp, f32max.view(), 0, 0).unwrap_err();
        assert_eq!(Some(e.clone()), aggregate_with_plan(&sp, &plan, f32max.view(), 0, 0).err());
        assert!(e.to_string().contains("overflow"));
    }

    /// `g − h·β` (`g − h` for `β = 1`) as numpy computes it, in `T`.
    fn shifted<T: Real>(g: ArrayView2<T>, h: ArrayView2<T>, beta: f64) -> Array2<T> {
        let b = T::of(beta);
        Array2::from_shape_fn(g.dim(), |ij| if beta == 1.0 { g[ij] - h[ij] } else { g[ij] - h[ij] * b })
    }

    #[test]
    fn gathered_rows_are_the_shifted_rows_of_the_gathered_array() {
        let (n, d) = (6, 5);
        let g = data(3, d); // three distinct rows, shared by the workers as `rows` says
        let rows = [2usize, 0, 0, 1, 2, 2];
        let gathered = Array2::from_shape_fn((n, d), |(i, j)| g[[rows[i], j]]);
        let h = data(n, d).mapv(|v| 0.3 * v + 0.1);
        for sp in all_specs() {
            for (start, stop) in [(0, n), (1, 4)] {
                let (r, hs) = (&rows[start..stop], h.slice(s![start..stop, ..]));
                for beta in [1.0, 0.5] {
                    let want = compress_shifted_rows(&sp, gathered.slice(s![start..stop, ..]), None, Some(hs), beta, start, n, 7, 3).unwrap();
                    assert_eq!(compress_shifted_rows(&sp, g.view(), Some(r), Some(hs), beta, start, n, 7, 3).unwrap(), want, "{sp:?}");
                }
                let want = compress_shifted_rows(&sp, gathered.slice(s![start..stop, ..]), None, None::<ArrayView2<f64>>, 1.0, start, n, 7, 3).unwrap();
                assert_eq!(compress_shifted_rows(&sp, g.view(), Some(r), None::<ArrayView2<f64>>, 1.0, start, n, 7, 3).unwrap(), want);
            }
        }
        let sp = spec(TopK { k: 2 });
        let err = |rows: &[usize], h: ArrayView2<f64>| compress_shifted_rows(&sp, g.view(), Some(rows), Some(h), 1.0, 0, n, 0, 0).unwrap_err().to_string();
        assert!(err(&[0, 3, 1, 1, 1, 1], h.view()).contains("must index the 3 rows of G, got 3"));
        assert!(err(&rows[..5], h.view()).contains("one row per worker (5, 5)"));
        // a non-finite shared row makes every worker reading it diverge: None, as on the gathered array
        let mut bad = g.clone();
        bad[[1, 2]] = f64::NAN;
        assert_eq!(compress_shifted_rows(&sp, bad.view(), Some(&rows), Some(h.view()), 1.0, 0, n, 0, 0).unwrap(), None);
    }

    #[test]
    fn compress_shifted_rows_is_compress_rows_of_the_shifted_inputs() {
        let (n, d) = (4, 5);
        let g = data(n, d);
        let h = data(n, d).mapv(|v| 0.3 * v + 0.1);
        for sp in all_specs() {
            for (start, stop) in [(0, n), (1, 3), (2, 2)] {
                let (gs, hs) = (g.slice(s![start..stop, ..]), h.slice(s![start..stop, ..]));
                for beta in [1.0, 0.5] {
                    let want = compress_rows(&sp, shifted(gs, hs, beta).view(), start, n, 7, 3).unwrap();
                    assert_eq!(compress_shifted_rows(&sp, gs, None, Some(hs), beta, start, n, 7, 3).unwrap(), Some(want), "{sp:?} beta={beta}");
                }
                let want = compress_rows(&sp, gs, start, n, 7, 3).unwrap();
                assert_eq!(compress_shifted_rows(&sp, gs, None, None::<ArrayView2<f64>>, 1.0, start, n, 7, 3).unwrap(), Some(want));
                // float32 inputs: the arithmetic in float32
                let (g32, h32) = (gs.mapv(|v| v as f32 / 3.0), hs.mapv(|v| v as f32 / 7.0));
                let want = compress_rows(&sp, shifted(g32.view(), h32.view(), 0.3).view(), start, n, 7, 3).unwrap();
                assert_eq!(compress_shifted_rows(&sp, g32.view(), None, Some(h32.view()), 0.3, start, n, 7, 3).unwrap(), Some(want));
            }
        }
        // large inputs run on the pool's threads: the same messages on 1 and 3 threads, and as compress_rows
        let (g, h) = (big(16, 40_000), big(16, 40_000).mapv(|v| v * 0.5));
        let _lock = crate::threads::TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        for sp in [spec(TopK { k: 7 }), spec(RandK { k: 100 }), Spec::new(TopK { k: 3 }, Quantizer::Natural).unwrap()] {
            let want = Some(compress_rows(&sp, shifted(g.view(), h.view(), 1.0).view(), 0, 16, 1, 2).unwrap());
            for k in [1, 3] {
                crate::threads::set_num_threads(k).unwrap();
                assert_eq!(compress_shifted_rows(&sp, g.view(), None, Some(h.view()), 1.0, 0, 16, 1, 2).unwrap(), want);
            }
        }
    }

    #[test]
    fn compress_shifted_rows_reports_non_finite_inputs_and_bad_arguments() {
        let (n, d) = (4, 50);
        let g = data(n, d);
        for (i, j) in [(0, 0), (3, 49), (2, 17)] {
            for bad in [f64::NAN, f64::INFINITY] {
                let mut h = Array2::zeros((n, d));
                h[[i, j]] = bad; // wherever it is: RandK(1) reads one coordinate of each worker
                for sp in [spec(TopK { k: 2 }), spec(RandK { k: 1 }), spec(PermK::default())] {
                    assert_eq!(compress_shifted_rows(&sp, g.view(), None, Some(h.view()), 1.0, 0, n, 0, 0).unwrap(), None, "{sp:?}");
                }
            }
        }
        let huge = Array2::from_elem((n, d), f64::MAX);
        assert_eq!(compress_shifted_rows(&spec(TopK { k: 2 }), huge.view(), None, Some((-&huge).view()), 1.0, 0, n, 0, 0).unwrap(), None); // overflow
        let sp = spec(TopK { k: 2 });
        assert!(compress_shifted_rows(&sp, g.view(), None, Some(g.slice(s![..3, ..])), 1.0, 0, n, 0, 0).is_err());
        assert!(compress_shifted_rows(&sp, g.view(), None, None::<ArrayView2<f64>>, 1.0, 1, n, 0, 0).is_err());
        assert!(compress_shifted_rows(&sp, g.view(), None, Some(g.view()), f64::NAN, 0, n, 0, 0).is_err());
        assert!(compress_shifted_rows(&spec(TopK { k: 51 }), g.view(), None, None::<ArrayView2<f64>>, 1.0, 0, n, 0, 0).is_err());
        // strided rows are read as they are
        let wide = data(n, 2 * d);
        let (gs, hs) = (wide.slice(s![.., ..;2]), wide.slice(s![.., 1..;2]));
        let want = compress_rows(&sp, shifted(gs, hs, 1.0).view(), 0, n, 0, 0).unwrap();
        assert_eq!(compress_shifted_rows(&sp, gs, None, Some(hs), 1.0, 0, n, 0, 0).unwrap(), Some(want));
    }

    #[test]
    fn results_do_not_depend_on_the_thread_count() {
        let a = big(16, 300_000);
        let specs = [spec(PermK::default()), spec(RandK { k: 5000 }), spec(TopK { k: 3 }), spec(contiguous(4)), spec(CoordinateSampling)];
        let run = || -> Vec<(Array1<f64>, Array2<f64>, Messages<f64>)> {
            specs
                .iter()
                .map(|sp| (aggregate(sp, a.view(), 1, 2).unwrap(), compress_all(sp, a.view(), 1, 2).unwrap(), compress_rows(sp, a.view(), 0, 16, 1, 2).unwrap()))
                .collect()
        };
        let _lock = crate::threads::TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        crate::threads::set_num_threads(1).unwrap();
        let one = run();
        crate::threads::set_num_threads(3).unwrap();
        assert!(one == run());
    }

    #[test]
    fn permk_wide_partitions_coordinates() {
        for (n, d) in [(3, 9), (4, 10), (5, 5), (1, 7), (6, 13)] {
            let plan = round_plan::<f64>(&spec(PermK::default()), n, d, 5, 2, None).unwrap();
            let mut seen = vec![0; d];
            for i in 0..n {
                let (c, s) = plan.worker(i);
                let Coords::List(c) = c else { panic!("a list") };
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
            let plan = round_plan::<f64>(&spec(PermK::default()), n, d, 1, 0, None).unwrap();
            let q = n / d;
            let mut seen = vec![0; d];
            let mut idle = 0;
            for i in 0..n {
                let (c, s) = plan.worker(i);
                assert!(c.len(d) <= 1);
                assert_eq!(s, n as f64 / q as f64);
                if c.len(d) == 0 {
                    idle += 1;
                }
                c.for_each(d, |j| seen[j] += 1);
            }
            assert_eq!(idle, n % d);
            assert!(seen.iter().all(|&s| s == q));
        }
    }

    #[test]
    fn coordinate_sampling_gives_each_coordinate_one_uniform_owner() {
        let (n, d) = (5, 20_000);
        let plan = round_plan::<f64>(&spec(CoordinateSampling), n, d, 3, 0, None).unwrap();
        let mut seen = vec![0; d];
        let mut counts = vec![0f64; n];
        for (i, count) in counts.iter_mut().enumerate() {
            let (c, s) = plan.worker(i);
            assert_eq!(s, n as f64);
            let Coords::List(c) = c else { panic!("a list") };
            assert!(c.windows(2).all(|w| w[0] < w[1]));
            *count = c.len() as f64;
            c.iter().for_each(|&j| seen[j as usize] += 1);
        }
        assert!(seen.iter().all(|&s| s == 1));
        // chi-square with 4 dof: P(chi2 > 18.5) < 0.001
        let e = d as f64 / n as f64;
        let chi2: f64 = counts.iter().map(|c| (c - e).powi(2) / e).sum();
        assert!(chi2 < 18.5, "chi2 = {chi2} counts = {counts:?}");
        // the owners of a coordinate over rounds are uniform and independent of PermK's stream
        let mut per_worker = [0f64; 3];
        for round in 0..6000 {
            let p = round_plan::<f64>(&spec(CoordinateSampling), 3, 2, 9, round, None).unwrap();
            (0..3).for_each(|i| per_worker[i] += p.worker(i).0.len(2) as f64);
        }
        let chi2: f64 = per_worker.iter().map(|c| (c - 4000.0).powi(2) / 4000.0).sum();
        assert!(chi2 < 13.8, "{per_worker:?}");
        // unbiased: the average of many rounds' aggregates of equal rows approaches the row
        let a = Array2::from_shape_fn((4, 6), |(_, j)| j as f64 + 1.0);
        let mut mean = Array1::<f64>::zeros(6);
        for round in 0..4000 {
            mean += &aggregate(&spec(CoordinateSampling), a.view(), 1, round).unwrap();
        }
        mean /= 4000.0;
        for j in 0..6 {
            assert!((mean[j] - a[[0, j]]).abs() < 0.1 * a[[0, j]], "{mean}");
        }
        // n = 1 owns everything; d < n works
        assert_eq!(aggregate(&spec(CoordinateSampling), a.slice(s![..1, ..]), 0, 0).unwrap(), a.row(0));
        assert!(aggregate(&spec(CoordinateSampling), data(9, 2).view(), 0, 0).is_ok());
    }

    #[test]
    fn three_paths_agree() {
        for (n, d) in [(4, 10), (7, 3), (5, 5)] {
            let a = data(n, d);
            for sp in &all_specs() {
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
    fn compress_rows_is_compress_worker_by_worker() {
        for (n, d) in [(4, 10), (7, 3), (5, 5), (6, 70_000)] {
            let a = big(n, d);
            for sp in &all_specs() {
                if sp.check(n, d).is_err() {
                    continue;
                }
                for (start, stop) in [(0, n), (1, n), (0, 1), (n - 2, n - 1), (2, 2)] {
                    let rows = a.slice(s![start..stop, ..]);
                    let m = compress_rows(sp, rows, start, n, 5, 6).unwrap();
                    assert_eq!(m.offsets.len(), stop - start + 1);
                    for r in 0..stop - start {
                        let (idx, val) = compress(sp, rows.row(r), start + r, n, 5, 6).unwrap();
                        let (lo, hi) = (m.offsets[r] as usize, m.offsets[r + 1] as usize);
                        assert_eq!(m.indices[lo..hi], idx[..], "{sp:?} worker {}", start + r);
                        assert!(m.values[lo..hi].iter().zip(&val).all(|(x, y)| x.to_bits() == y.to_bits()));
                    }
                    let rows32 = rows.mapv(|v| v as f32);
                    let m32 = compress_rows(sp, rows32.view(), start, n, 5, 6).unwrap();
                    if stop > start {
                        let (idx, val) = compress(sp, rows32.row(0), start, n, 5, 6).unwrap();
                        assert_eq!(m32.indices[..idx.len()], idx[..]);
                        assert_eq!(m32.values[..val.len()], val[..]);
                    }
                }
                assert!(matches!(compress_rows(sp, a.view(), 1, n, 0, 0), Err(CoreError::InvalidArgument { name, .. }) if name == "start"));
                assert!(compress_rows(sp, a.view(), usize::MAX, n, 0, 0).is_err());
            }
        }
        let mut bad = data(3, 4);
        bad[[1, 2]] = f64::NAN;
        assert!(matches!(compress_rows(&spec(TopK { k: 1 }), bad.view(), 4, 8, 0, 0), Err(CoreError::NonFinite { worker: 5, coord: 2, .. })));
    }

    #[test]
    fn plan_ranges_are_the_plan_when_contiguous() {
        let cases: Vec<(Spec, usize, usize, bool)> = vec![
            (spec(Identity), 3, 7, true),
            (spec(PermK::default()), 7, 3, true),
            (spec(PermK::default()), 5, 5, true),
            (spec(PermK::default()), 1, 9, true),
            (spec(PermK::default()), 4, 10, false),
            (spec(contiguous(3)), 7, 10, true),
            (spec(contiguous(3)), 3, 10, true),
            (spec(BlockPermK { partition: Partition::labels(vec![0, 0, 1, 1, 1, 2]).unwrap() }), 4, 6, true),
            (spec(BlockPermK { partition: Partition::labels(vec![0, 1, 0, 1]).unwrap() }), 4, 4, false),
            (spec(RandK { k: 1 }), 6, 9, true),
            (spec(RandK { k: 2 }), 6, 9, false),
            (spec(CoordinateSampling), 1, 9, true),
            (spec(CoordinateSampling), 6, 1, true),
            (spec(CoordinateSampling), 3, 9, false),
            (spec(TopK { k: 1 }), 3, 9, false),
            (Spec::new(PermK::default(), Quantizer::Natural).unwrap(), 7, 3, false),
        ];
        for (sp, n, d, some) in cases {
            for round in 0..4 {
                let r = plan_ranges(&sp, n, d, 8, round).unwrap();
                assert_eq!(r.is_some(), some, "{sp:?} n={n} d={d}");
                let Some(r) = r else { continue };
                let p = plan(&sp, n, d, 8, round).unwrap();
                for i in 0..n {
                    let got: Vec<i64> = (r.starts[i]..r.stops[i]).collect();
                    assert_eq!(got[..], p.coords[p.offsets[i] as usize..p.offsets[i + 1] as usize], "{sp:?} worker {i}");
                    assert!(r.starts[i] <= r.stops[i]);
                    if r.starts[i] == r.stops[i] {
                        assert_eq!(r.starts[i], 0);
                    }
                }
                assert_eq!(r.scales, p.scales);
            }
        }
    }

    #[test]
    fn permk_aggregate_of_equal_inputs_is_exact() {
        // IV(1): equal inputs have zero variance.
        let a = Array2::from_shape_fn((4, 12), |(_, j)| j as f64 * 0.5);
        let agg = aggregate(&spec(PermK::default()), a.view(), 1, 1).unwrap();
        assert_eq!(agg, a.row(0));
    }

    #[test]
    fn topk_picks_largest_with_ties_by_index() {
        let x = ndarray::arr1(&[1.0, -3.0, 2.0, 3.0, 0.5]);
        let (idx, val) = compress(&spec(TopK { k: 2 }), x.view(), 0, 1, 0, 0).unwrap();
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
        assert!(aggregate(&spec(RandK { k: 5 }), a.view(), 0, 0).is_err());
        assert!(aggregate(&spec(contiguous(4)), a.view(), 0, 0).is_err());
        let mut b = a.clone();
        b[[1, 2]] = f64::NAN;
        assert!(matches!(aggregate(&spec(TopK { k: 1 }), b.view(), 0, 0), Err(CoreError::NonFinite { worker: 1, coord: 2, .. })));
        assert!(compress(&spec(PermK::default()), a.row(0), 3, 3, 0, 0).is_err());
        let empty = Array2::<f64>::zeros((0, 4));
        assert!(aggregate(&spec(PermK::default()), empty.view(), 0, 0).is_err());
        assert!(compress_all(&spec(PermK::default()), empty.view(), 0, 0).is_err());
        assert!(compress(&spec(PermK::default()), ArrayView1::<f64>::from(&[][..]), 0, 1, 0, 0).is_err());
        assert!(Partition::labels(vec![0, 2, 2]).is_err());
        assert!(Partition::labels(vec![]).is_err());
        assert!(Partition::labels(vec![u32::MAX]).is_err());
        assert!(matches!(plan(&spec(TopK { k: 1 }), 2, 3, 0, 0), Err(e) if e.to_string().contains("TopK")));
        assert!(plan(&spec(PermK::default()), 0, 3, 0, 0).is_err());
        assert!(plan(&spec(PermK::default()), 3, 0, 0, 0).is_err());
        assert!(plan(&spec(PermK::default()), 1 << 33, 3, 0, 0).is_err());
        // explicit permutations: lengths are checked before anything scales with them
        assert!(matches!(permk::plan_from_permutations(1, 1 << 40, &[0], &[0]), Err(CoreError::InvalidArgument { name, .. }) if name == "pi_d"));
        assert!(permk::plan_from_permutations(2, 3, &[0, 0, 1], &[0, 1]).is_err());
        assert!(permk::plan_from_permutations(2, 3, &[0, 5, 1], &[0, 1]).is_err());
        assert!(crate::sparsify::blockpermk::plan_from_permutation(vec![0, 1], vec![0, 2, 1, 5]).is_err());
        assert!(crate::sparsify::blockpermk::plan_from_permutation(vec![0, 1], vec![]).is_err());
        assert!(crate::sparsify::blockpermk::plan_from_permutation(vec![u32::MAX], vec![0]).is_err());
    }

    #[test]
    fn explicit_permutation_plans() {
        // block_plan_from_permutation groups coordinates by block, increasing, in block order
        let p = crate::sparsify::blockpermk::plan_from_permutation(vec![1, 0, 1, 0, 2], vec![2, 0, 1, 3]).unwrap();
        assert_eq!(p.offsets, vec![0, 1, 3, 5, 5]);
        assert_eq!(p.coords, vec![4, 1, 3, 0, 2]);
        assert_eq!(p.scales, vec![4.0; 4]);
        let p = permk::plan_from_permutations(2, 5, &[4, 3, 2, 1, 0], &[1, 0]).unwrap();
        assert_eq!(p.offsets, vec![0, 2, 5]);
        assert_eq!(p.coords, vec![4, 3, 2, 1, 0]);
    }

    #[test]
    fn sizes_are_checked_before_allocating() {
        let mem_err = |r: Result<()>| matches!(r, Err(CoreError::Memory { .. }));
        // a broadcast (zero-stride) view of one value: 2^62 elements, nothing allocated
        let one = ndarray::arr2(&[[1.0f64]]);
        let (n, d) = (1usize << 31, (1usize << 31) - 1);
        let view = one.broadcast((n, d)).unwrap();
        assert!(mem_err(compress_all(&spec(PermK::default()), view, 0, 0).map(|_| ())));
        let e = compress_all(&spec(contiguous(2)), view, 0, 0).unwrap_err();
        assert!(e.to_string().starts_with("Unable to allocate"), "{e}");
        assert!(e.to_string().contains(&format!("the compressed rows with shape ({n}, {d}) and data type float64")), "{e}");
        assert!(mem_err(aggregate(&spec(RandK { k: d }), view, 0, 0).map(|_| ())));
        assert!(mem_err(compress_rows(&spec(Identity), view, 0, n, 0, 0).map(|_| ())));
        assert!(mem_err(plan(&spec(RandK { k: 1 }), u32::MAX as usize, 10, 0, 0).map(|_| ())));
        assert!(mem_err(plan(&spec(PermK::default()), 1 << 31, u32::MAX as usize, 0, 0).map(|_| ())));
        assert!(mem_err(plan(&spec(Identity), u32::MAX as usize, u32::MAX as usize, 0, 0).map(|_| ())));
        assert!(mem_err(round_plan::<f64>(&spec(CoordinateSampling), 1 << 20, u32::MAX as usize, 0, 0, None).map(|_| ())) || physical_is_huge());
        assert!(mem_err(rng::shared_permutation(0, 0, usize::MAX / 2).map(|_| ())));
    }

    fn physical_is_huge() -> bool {
        crate::mem::physical().map_or(true, |p| p > 1 << 40)
    }
}
