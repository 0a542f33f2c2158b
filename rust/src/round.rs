//! One round's plan of a spec with a shared plan, computed once ([`Round::new`], or ahead on a
//! background thread: [`PendingRound`]) and used natively: the held workers' values
//! ([`Round::gather`], [`Round::values`]) and the server's average ([`Round::mean`]).
//!
//! A [`Round`] keeps the sparsifier's compact [`Assignment`] (owner labels, block plans,
//! ranges) and the `n + 1` CSR offsets of its plan, nothing of size `O(total)`: the int64 CSR
//! arrays of `Spec.plan` are built only when asked ([`Round::coords`]). Every worker's
//! coordinates, in order, and its scale are those of [`crate::compress::plan`] for the same
//! `(n, d, seed, round)`, bit for bit (the same [`crate::sparsify::Sparsify::assign`]).

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use ndarray::ArrayView2;
use rayon::prelude::*;

use crate::compress::{Spec, RANGES_MIN_BLOCK};
use crate::error::{CoreError, Result};
use crate::kernels::{self, ValueRows};
use crate::mem::{self, Need, Zeroed};
use crate::plan::{count_labels, with_owner, Assignment, Blocks, Coords, Label, Ranges, RoundPlan};
use crate::real::Real;
use crate::threads;

/// What [`Round::values`] writes for every `(worker, coordinate)` pair of the round, in plan
/// order: worker `i`'s value at coordinate `j` with the worker's scale `scale`.
pub trait Emit<V>: Sync {
    fn one(&self, i: usize, j: usize, scale: f64) -> V;

    /// A hint that worker `i`'s value at coordinate `j` comes soon (the owners' pass calls it
    /// [`AHEAD`] coordinates ahead): an input read at random may be prefetched.
    #[inline(always)]
    fn ahead(&self, _i: usize, _j: usize) {}

    /// Worker `i`'s values on the coordinates `lo..hi` into `out` (`hi - lo` of them): the
    /// same values as [`Emit::one`], possibly computed with vector instructions.
    fn range(&self, i: usize, lo: usize, hi: usize, scale: f64, out: &mut [V]) {
        for (o, j) in out.iter_mut().zip(lo..hi) {
            *o = self.one(i, j, scale);
        }
    }

    /// Worker `i`'s values at the coordinates `coords` into `out` (as many): the same values as
    /// [`Emit::one`].
    fn list(&self, i: usize, coords: &[u32], scale: f64, out: &mut [V]) {
        for (o, &j) in out.iter_mut().zip(coords) {
            *o = self.one(i, j as usize, scale);
        }
    }
}

/// Plan values of at least this many entries are computed on the pool's threads when it has
/// more than one (plan forms other than owners), in chunks of `VALUES_CHUNK` positions (a
/// worker's values may span several chunks).
pub const VALUES_PAR_THRESHOLD: usize = 1 << 18;
const VALUES_CHUNK: usize = 1 << 15;
/// Owner rounds of at least this many coordinates take their average on the pool's threads, in
/// chunks of `OWNERS_CHUNK` coordinates.
pub const OWNERS_PAR_THRESHOLD: usize = 1 << 18;
const OWNERS_CHUNK: usize = 1 << 16;
/// One worker's values of an owners round are gathered by blocks of this many coordinates.
const SEL_BLOCK: usize = 1 << 12;
/// Ranges up to this long are computed value by value ([`Emit::one`]).
const SHORT_RANGE: usize = 4;
/// How many coordinates ahead the owners' passes announce a value ([`Emit::ahead`]).
pub const AHEAD: usize = 16;

/// One round's plan of a spec with a shared plan, in the sparsifier's compact form.
#[derive(Debug)]
pub struct Round {
    n: usize,
    d: usize,
    asg: Assignment,
    /// Worker `i`'s values are `offsets[i]..offsets[i + 1]` of the concatenated plan values.
    offsets: Vec<usize>,
    /// Block plans whose blocks are ranges (PermK for `n > d`, contiguous BlockPermK): worker
    /// `i` sends the range `starts[i] .. starts[i] + (offsets[i + 1] − offsets[i])` (0 when
    /// idle), so the hot loops read two sequential arrays instead of the plan's indirections.
    /// Empty for the other plans.
    starts: Vec<usize>,
    /// The sparsifier guarantees one range per worker ([`crate::sparsify::Sparsify::contiguous`]).
    contiguous: bool,
    disjoint: OnceLock<bool>,
}

/// A segment of one worker's coordinates in plan order ([`Round::visit`]).
#[derive(Clone, Copy, Debug)]
pub enum Seg<'a> {
    /// One coordinate.
    One(usize),
    /// The coordinates `lo..hi`.
    Range(usize, usize),
    /// These coordinates.
    List(&'a [u32]),
}

/// The coordinates themselves.
struct CoordsOf;

impl Emit<i64> for CoordsOf {
    #[inline(always)]
    fn one(&self, _i: usize, j: usize, _scale: f64) -> i64 {
        j as i64
    }

    fn list(&self, _i: usize, coords: &[u32], _scale: f64, out: &mut [i64]) {
        out.iter_mut().zip(coords).for_each(|(o, &j)| *o = j as i64);
    }

    fn range(&self, _i: usize, lo: usize, _hi: usize, _scale: f64, out: &mut [i64]) {
        for (t, o) in out.iter_mut().enumerate() {
            *o = (lo + t) as i64;
        }
    }
}

/// The `divide` option of [`Round::gather_into`] and
/// [`crate::quadratic::Tridiagonal::round_values_into`]: an integer `k` in `1..=2^53` (exactly
/// a float64), each value then becoming `(v + 0) / k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Divisor(u64);

impl Divisor {
    /// The largest divisor: every integer up to it is exactly a float64.
    pub const MAX: u64 = 1 << 53;

    /// `k`, or an error naming `divide` unless `1 <= k <= 2^53`.
    pub fn new(k: u64) -> Result<Divisor> {
        if !(1..=Self::MAX).contains(&k) {
            return Err(CoreError::invalid("divide", format!("must be an integer in [1, 2**53], got {k}")));
        }
        Ok(Divisor(k))
    }

    pub fn get(self) -> u64 {
        self.0
    }
}

/// What the value kernels do to each value once computed, in the same loop (one pass): nothing
/// ([`Keep`]), or `(v + 0) / k` ([`DivideBy`], [`TimesInverse`]).
pub trait Post<T>: Copy + Send + Sync {
    /// True for [`Keep`] (the value is written as computed).
    const KEEP: bool = false;
    fn apply(self, v: T) -> T;
}

/// The value as computed.
#[derive(Clone, Copy, Debug)]
pub struct Keep;

impl<T> Post<T> for Keep {
    const KEEP: bool = true;
    #[inline(always)]
    fn apply(self, v: T) -> T {
        v
    }
}

/// `(v + 0) / k`: two IEEE operations in `T` (`+ 0` turns −0 into +0, as a sum from zero does).
#[derive(Clone, Copy, Debug)]
pub struct DivideBy<T>(pub T);

impl<T: Real> Post<T> for DivideBy<T> {
    #[inline(always)]
    fn apply(self, v: T) -> T {
        (v + T::zero()) / self.0
    }
}

/// `(v + 0) · 2^−m` for `k = 2^m`: the same bits as `(v + 0) / k` (both are the correctly
/// rounded `(v + 0) / k`, the reciprocal of a power of two being exact), without a division.
#[derive(Clone, Copy, Debug)]
pub struct TimesInverse<T>(pub T);

impl<T: Real> Post<T> for TimesInverse<T> {
    #[inline(always)]
    fn apply(self, v: T) -> T {
        (v + T::zero()) * self.0
    }
}

/// Evaluates `$body` with `$p` bound to the [`Post`] (on values of type `$t`) of the
/// `Option<Divisor>` `$divide`: [`Keep`] for `None`, [`TimesInverse`] for a power of two,
/// else [`DivideBy`] (`k` rounded once to `$t`).
macro_rules! with_post {
    ($divide:expr, $t:ty, $p:ident => $body:expr) => {
        match $divide {
            None => {
                let $p = $crate::round::Keep;
                $body
            }
            Some(k) if k.get().is_power_of_two() => {
                let $p = $crate::round::TimesInverse(<$t as $crate::real::Real>::of(1.0 / k.get() as f64));
                $body
            }
            Some(k) => {
                let $p = $crate::round::DivideBy(<$t as $crate::real::Real>::of(k.get() as f64));
                $body
            }
        }
    };
}
pub(crate) use with_post;

/// `post(T::of(scale · a[i − start, j]))` (`a[i − start, j]` itself when the scale is 1): the
/// values of the plan, as every aggregation path computes them, then `post`'s.
struct Gather<'a, T, P> {
    a: ArrayView2<'a, T>,
    start: usize,
    post: P,
}

impl<T: Real, P: Post<T>> Emit<T> for Gather<'_, T, P> {
    #[inline(always)]
    fn one(&self, i: usize, j: usize, scale: f64) -> T {
        self.post.apply(kernels::scaled(self.a[[i - self.start, j]], scale))
    }

    fn list(&self, i: usize, coords: &[u32], scale: f64, out: &mut [T]) {
        let row = self.a.row(i - self.start);
        let p = self.post;
        match row.as_slice() {
            Some(r) if scale == 1.0 => out.iter_mut().zip(coords).for_each(|(o, &j)| *o = p.apply(r[j as usize])),
            Some(r) => out.iter_mut().zip(coords).for_each(|(o, &j)| *o = p.apply(T::of(scale * r[j as usize].f64()))),
            None => out.iter_mut().zip(coords).for_each(|(o, &j)| *o = p.apply(kernels::scaled(row[j as usize], scale))),
        }
    }

    fn range(&self, i: usize, lo: usize, hi: usize, scale: f64, out: &mut [T]) {
        let row = self.a.row(i - self.start);
        let p = self.post;
        match row.as_slice() {
            Some(r) if scale == 1.0 && P::KEEP => out.copy_from_slice(&r[lo..hi]),
            Some(r) if scale == 1.0 => out.iter_mut().zip(&r[lo..hi]).for_each(|(o, &x)| *o = p.apply(x)),
            Some(r) => out.iter_mut().zip(&r[lo..hi]).for_each(|(o, &x)| *o = p.apply(T::of(scale * x.f64()))),
            None => out.iter_mut().zip(lo..hi).for_each(|(o, j)| *o = p.apply(kernels::scaled(row[j], scale))),
        }
    }
}

impl Round {
    /// Checks that a round of `spec` can be computed for `n` workers in dimension `d`: a shared
    /// plan, a defined `(n, d)`, and the memory of its compact form.
    pub fn check(spec: &Spec, n: usize, d: usize) -> Result<()> {
        if !spec.shared_plan() {
            let why = if spec.sparsifier.data_dependent() {
                format!("{}'s coordinates depend on the data", spec.sparsifier.title())
            } else {
                format!("the quantizer {:?} changes the values", spec.quantizer.name())
            };
            return Err(CoreError::invalid("spec", format!("a round needs a spec with a shared plan (Spec.shared_plan); {why}")));
        }
        spec.check(n, d)?;
        let fp = spec.sparsifier.footprint(n, d);
        Need::new()
            .bytes("the round's assignment", fp.assign)
            .array::<usize>("the round's offsets", &[n.saturating_add(1)])
            .array::<usize>("the workers' ranges", &[n])
            .check()
    }

    /// The round `round` of `spec` for `n` workers in dimension `d`.
    pub fn new(spec: &Spec, n: usize, d: usize, seed: u64, round: u64) -> Result<Round> {
        Self::check(spec, n, d)?;
        Self::compute(spec, n, d, seed, round)
    }

    /// [`Round::new`] after [`Round::check`].
    fn compute(spec: &Spec, n: usize, d: usize, seed: u64, round: u64) -> Result<Round> {
        let asg = spec.sparsifier.assign::<f64>(n, d, seed, round, None)?;
        let mut starts = Vec::new();
        let offsets = match &asg {
            Assignment::Owners { owner, sizes, .. } => with_owner!(owner, v => Assignment::owner_offsets(v, n, sizes.as_deref()))?,
            Assignment::Plan(RoundPlan::All { .. }) => mem::collect("the round's offsets", n + 1, (0..=n).map(|i| i * d))?,
            Assignment::Plan(RoundPlan::Csr { offsets, .. }) => mem::copy("the round's offsets", offsets)?,
            Assignment::Plan(RoundPlan::Blocks { pi, slot_block, blocks, .. }) => {
                let mut o = mem::vec("the round's offsets", n + 1)?;
                if let Blocks::Ranges(_) = blocks {
                    starts = mem::vec("the workers' ranges", n)?;
                }
                let mut total = 0;
                o.push(0);
                for i in 0..n {
                    let c = RoundPlan::block_of(pi, slot_block, i).map_or(Coords::List(&[]), |b| blocks.block(b));
                    total += c.len(d);
                    o.push(total);
                    if let Blocks::Ranges(_) = blocks {
                        starts.push(if let Coords::Range(a, _) = c { a } else { 0 });
                    }
                }
                o
            }
        };
        if offsets.len() != n + 1 {
            return Err(CoreError::Internal(format!("the round's plan has {} workers, expected {n}", offsets.len().saturating_sub(1))));
        }
        Ok(Round { n, d, asg, offsets, starts, contiguous: spec.sparsifier.contiguous(n, d), disjoint: OnceLock::new() })
    }

    pub fn n(&self) -> usize {
        self.n
    }

    pub fn d(&self) -> usize {
        self.d
    }

    /// The compact assignment.
    pub fn assignment(&self) -> &Assignment {
        &self.asg
    }

    /// The CSR offsets (`n + 1`): worker `i`'s values are `offsets[i]..offsets[i + 1]`.
    pub fn offsets(&self) -> &[usize] {
        &self.offsets
    }

    /// The number of values of all workers (`offsets[n]`).
    pub fn total(&self) -> usize {
        self.offsets[self.n]
    }

    /// True when every coordinate is sent by at most one worker this round: owners (PermK for
    /// `d >= n`, CoordinateSampling), block plans with one worker per block, a single worker,
    /// or a listed plan (RandK) whose coordinates happen to be distinct (checked once, on
    /// first use).
    pub fn disjoint(&self) -> bool {
        *self.disjoint.get_or_init(|| match &self.asg {
            Assignment::Owners { .. } => true,
            _ if self.n == 1 => true,
            Assignment::Plan(RoundPlan::All { .. }) => false,
            Assignment::Plan(RoundPlan::Blocks { blocks, .. }) => self.n / blocks.m() == 1,
            Assignment::Plan(RoundPlan::Csr { coords, .. }) => {
                if coords.len() > self.d {
                    return false;
                }
                // a sorted copy has no repeated coordinate (a copy the machine cannot hold: not
                // known to be disjoint)
                match mem::copy("a copy of the round's coordinates", coords) {
                    Ok(mut c) => {
                        c.sort_unstable();
                        c.windows(2).all(|w| w[0] != w[1])
                    }
                    Err(_) => false,
                }
            }
        })
    }

    /// Fails unless `start <= stop <= n`.
    pub fn check_workers(&self, start: usize, stop: usize) -> Result<()> {
        if stop > self.n {
            return Err(CoreError::invalid("stop", format!("stop = {stop} exceeds the round's n = {} workers", self.n)));
        }
        if start > stop {
            return Err(CoreError::invalid("start", format!("start = {start} exceeds stop = {stop}")));
        }
        Ok(())
    }

    /// The number of values of workers `start..stop` (checked).
    pub fn len_of(&self, start: usize, stop: usize) -> Result<usize> {
        self.check_workers(start, stop)?;
        Ok(self.offsets[stop] - self.offsets[start])
    }

    /// [`Round::len_of`], and an error naming `out` unless `out_len` is that number.
    pub fn check_out_len(&self, start: usize, stop: usize, out_len: usize) -> Result<usize> {
        let len = self.len_of(start, stop)?;
        if out_len != len {
            return Err(CoreError::invalid(
                "out",
                format!("must have the {len} values of workers {start}..{stop} (offsets[stop] − offsets[start]), got {out_len}"),
            ));
        }
        Ok(len)
    }

    /// The bytes of [`Round::values`]' temporaries for workers `start..stop` (checked).
    pub fn values_scratch(&self, start: usize, stop: usize) -> u128 {
        let m = stop.saturating_sub(start) as u128;
        let len = self.offsets[stop.min(self.n)].saturating_sub(self.offsets[start.min(self.n)]) as u128;
        let sel = if matches!(self.asg, Assignment::Owners { .. }) && m < self.n as u128 { 4 * (len + 1) } else { 0 };
        8 * m + sel
    }

    /// The offsets as int64 (`O(n)`).
    pub fn offsets_i64(&self) -> Result<Vec<i64>> {
        Need::new().array::<i64>("the round's offsets", &[self.n + 1]).check()?;
        mem::collect("the round's offsets", self.n + 1, self.offsets.iter().map(|&o| o as i64))
    }

    /// Every worker's scale (`O(n)`).
    pub fn scales(&self) -> Result<Vec<f64>> {
        Need::new().array::<f64>("the round's scales", &[self.n]).check()?;
        match &self.asg {
            Assignment::Owners { scale, .. } | Assignment::Plan(RoundPlan::Blocks { scale, .. }) => mem::filled("the round's scales", self.n, *scale),
            Assignment::Plan(RoundPlan::All { .. }) => mem::filled("the round's scales", self.n, 1.0),
            Assignment::Plan(RoundPlan::Csr { scales, .. }) => mem::copy("the round's scales", scales),
        }
    }

    /// The coordinates of workers `start..stop` in plan order (`O(d)` for owners, else
    /// `O(values)`).
    pub fn coords(&self, start: usize, stop: usize) -> Result<Vec<i64>> {
        let len = self.len_of(start, stop)?;
        Need::new().array::<i64>("the round's coordinates", &[len]).bytes("the workers' positions", self.values_scratch(start, stop)).check()?;
        self.values("the round's coordinates", start, stop, &CoordsOf)
    }

    /// The worker of each value of workers `start..stop` (`np.repeat(arange(start, stop), sizes)`).
    pub fn rows(&self, start: usize, stop: usize) -> Result<Vec<i64>> {
        let len = self.len_of(start, stop)?;
        Need::new().array::<i64>("the round's rows", &[len]).check()?;
        let mut out = mem::vec("the round's rows", len)?;
        for i in start..stop {
            let k = self.offsets[i + 1] - self.offsets[i];
            out.extend(std::iter::repeat(i as i64).take(k));
        }
        Ok(out)
    }

    /// Every worker's coordinates as one range, when the sparsifier guarantees that for
    /// `(n, d)` (the rule of `Spec.plan_ranges`, whose result this equals); `O(n)`.
    pub fn ranges(&self) -> Result<Option<Ranges>> {
        if !self.contiguous {
            return Ok(None);
        }
        let (n, d) = (self.n, self.d);
        Need::new().bytes("the ranges", Ranges::bytes(n)).check()?;
        match &self.asg {
            Assignment::Owners { scale, .. } if n == 1 => Ok(Some(Ranges::full(1, d, *scale)?)),
            // contiguous owners: d <= n, so O(n)
            Assignment::Owners { .. } => self.asg.owner_ranges(),
            Assignment::Plan(RoundPlan::All { .. }) => Ok(Some(Ranges::full(n, d, 1.0)?)),
            Assignment::Plan(RoundPlan::Blocks { blocks: Blocks::Ranges(_), scale, .. }) => {
                let mut r = Ranges::idle(n, *scale)?;
                for i in 0..n {
                    let len = self.offsets[i + 1] - self.offsets[i];
                    if len > 0 {
                        r.starts[i] = self.starts[i] as i64;
                        r.stops[i] = (self.starts[i] + len) as i64;
                    }
                }
                Ok(Some(r))
            }
            Assignment::Plan(RoundPlan::Blocks { blocks: Blocks::Listed { .. }, .. }) => Ok(None),
            Assignment::Plan(RoundPlan::Csr { offsets, coords, scales }) => {
                let mut r = Ranges::idle(n, 1.0)?;
                r.scales.copy_from_slice(scales);
                for i in 0..n {
                    let c = &coords[offsets[i]..offsets[i + 1]];
                    let Some(&first) = c.first() else { continue };
                    if c.windows(2).any(|w| w[1] != w[0].wrapping_add(1)) {
                        return Ok(None);
                    }
                    r.starts[i] = first as i64;
                    r.stops[i] = first as i64 + c.len() as i64;
                }
                Ok(Some(r))
            }
        }
    }

    /// The values `e` gives for workers `start..stop`, in plan order (`offsets[stop] −
    /// offsets[start]` of them), in a new array ([`Round::values_into`]). The caller has
    /// checked the memory (the output and [`Round::values_scratch`]).
    pub fn values<V: Zeroed + Send, E: Emit<V>>(&self, what: &str, start: usize, stop: usize, e: &E) -> Result<Vec<V>> {
        let len = self.len_of(start, stop)?;
        let mut out = mem::zeros::<V>(what, &[len])?;
        self.values_into(start, stop, e, &mut out)?;
        Ok(out)
    }

    /// The values `e` gives for workers `start..stop`, in plan order, written into `out`
    /// (exactly `offsets[stop] − offsets[start]` of them, else an error naming `out` before
    /// anything is written; every element is then written once): owners in one pass over the
    /// coordinates (two for some of the workers: their coordinates, then their values), the
    /// other plans by chunks of positions, on the pool's threads for large outputs (each value
    /// is computed on its own, so the result does not depend on the split). The caller has
    /// checked the memory of [`Round::values_scratch`].
    pub fn values_into<V: Send, E: Emit<V>>(&self, start: usize, stop: usize, e: &E, out: &mut [V]) -> Result<()> {
        self.check_out_len(start, stop, out.len())?;
        match &self.asg {
            Assignment::Owners { owner, scale, .. } => with_owner!(owner, v => self.values_owners(v, *scale, start, stop, out, e)),
            Assignment::Plan(p) => self.values_plan(p, start, out, e),
        }
    }

    fn values_owners<L: Label, V, E: Emit<V>>(&self, owner: &[L], scale: f64, start: usize, stop: usize, out: &mut [V], e: &E) -> Result<()> {
        if start == stop {
            return Ok(());
        }
        let base = self.offsets[start];
        let len = out.len();
        let mut fill = mem::collect("the workers' positions", stop - start, self.offsets[start..stop].iter().map(|&o| o - base))?;
        let mut put = |i: usize, j: usize| {
            let p = &mut fill[i - start];
            out[*p] = e.one(i, j, scale);
            *p += 1;
        };
        if stop - start == self.n {
            for (j, &o) in owner.iter().enumerate() {
                if let Some(a) = owner.get(j + AHEAD) {
                    e.ahead(a.idx(), j + AHEAD);
                }
                put(o.idx(), j);
            }
            return Ok(());
        }
        // some workers (a rank's): their coordinates first, compacted without branches (whether
        // a coordinate is theirs is unpredictable), then their values
        let m = stop - start;
        if m == 1 {
            // one worker: block by block, its coordinates compacted into a buffer that stays in
            // the cache, then its values, written in order
            let mut sel = mem::filled("the worker's coordinates", SEL_BLOCK + 1, 0u32)?;
            let w = L::of(start);
            let mut q = 0;
            for (b, ow) in owner.chunks(SEL_BLOCK).enumerate() {
                let mut k = 0;
                // 64 owners at a time: a bit mask of the worker's, then its set bits (about
                // 64/n of them) instead of a step per coordinate
                for (c, blk) in ow.chunks(64).enumerate() {
                    let base = (b * SEL_BLOCK + c * 64) as u32;
                    let mut m = L::eq_mask(blk, w);
                    while m != 0 {
                        sel[k] = base + m.trailing_zeros();
                        k += 1;
                        m &= m - 1;
                    }
                }
                e.list(start, &sel[..k], scale, &mut out[q..q + k]);
                q += k;
            }
            return Ok(());
        }
        let mut sel = mem::filled("the workers' coordinates", len + 1, 0u32)?;
        let mut k = 0;
        for (j, &o) in owner.iter().enumerate() {
            sel[k] = j as u32;
            k += (o.idx().wrapping_sub(start) < m) as usize;
        }
        sel[..k].iter().for_each(|&j| put(owner[j as usize].idx(), j as usize));
        Ok(())
    }

    fn values_plan<V: Send, E: Emit<V>>(&self, plan: &RoundPlan, start: usize, out: &mut [V], e: &E) -> Result<()> {
        let offsets = &self.offsets;
        let starts = &self.starts;
        let block_scale = match plan {
            RoundPlan::Blocks { scale, .. } => *scale,
            _ => 1.0,
        };
        // worker i's values t0..t1 (of its offsets[i + 1] − offsets[i]) into `seg`
        let part = |i: usize, t0: usize, t1: usize, seg: &mut [V]| {
            if !starts.is_empty() {
                // range blocks: worker i sends starts[i] .. starts[i] + len
                let a = starts[i];
                if offsets[i + 1] - offsets[i] <= SHORT_RANGE {
                    seg.iter_mut().zip(a + t0..a + t1).for_each(|(o, j)| *o = e.one(i, j, block_scale));
                } else {
                    e.range(i, a + t0, a + t1, block_scale, seg);
                }
                return;
            }
            let (c, s) = plan.worker(i);
            match c {
                Coords::All => e.range(i, t0, t1, s, seg),
                // short ranges (PermK for n > d: singletons) one by one, without the setup of a
                // vectorised range
                Coords::Range(a, b) if b - a <= SHORT_RANGE => seg.iter_mut().zip(a + t0..a + t1).for_each(|(o, j)| *o = e.one(i, j, s)),
                Coords::Range(a, _) => e.range(i, a + t0, a + t1, s, seg),
                Coords::List(c) => seg.iter_mut().zip(&c[t0..t1]).for_each(|(o, &j)| *o = e.one(i, j as usize, s)),
            }
        };
        // the values at positions p0 .. p0 + out.len() of the round's (offsets) into `out`
        let run = |p0: usize, out: &mut [V]| {
            let p1 = p0 + out.len();
            if p0 == p1 {
                return;
            }
            // the worker holding position p0 (offsets[i] <= p0 < offsets[i + 1])
            let mut i = offsets.partition_point(|&o| o <= p0) - 1;
            let mut pos = p0;
            while pos < p1 {
                let (w0, w1) = (offsets[i], offsets[i + 1]);
                let (t0, t1) = (pos.max(w0) - w0, p1.min(w1) - w0);
                if t0 < t1 {
                    part(i, t0, t1, &mut out[w0 + t0 - p0..w0 + t1 - p0]);
                }
                pos = w1;
                i += 1;
            }
        };
        let base = offsets[start];
        // a pool of one thread: here, without handing the work over (which measurably costs)
        if out.len() < VALUES_PAR_THRESHOLD || threads::num_threads()? < 2 {
            run(base, out);
            return Ok(());
        }
        // chunks of VALUES_CHUNK positions (a worker's values may span several: one worker's
        // block of a BlockPermK(n) round is split too)
        threads::install(|| out.par_chunks_mut(VALUES_CHUNK).enumerate().for_each(|(c, o)| run(base + c * VALUES_CHUNK, o)))
    }

    /// Every `(worker, coordinates, position)` of workers `start..stop` in plan order, one
    /// sequential pass (the order of [`Round::values_into`]: `pos` counts from
    /// `offsets[start]`): a segment of a worker's coordinates at a time ([`Seg`]). The caller
    /// has checked the memory of [`Round::values_scratch`].
    pub fn visit(&self, start: usize, stop: usize, f: impl FnMut(usize, Seg<'_>, usize)) -> Result<()> {
        self.visit_ahead(start, stop, |_, _| {}, f)
    }

    /// [`Round::visit`], calling `ahead(i, j)` [`AHEAD`] coordinates ahead of an owner's value
    /// (worker `i`'s at coordinate `j`: an input read at random may be prefetched).
    pub fn visit_ahead(&self, start: usize, stop: usize, ahead: impl Fn(usize, usize), mut f: impl FnMut(usize, Seg<'_>, usize)) -> Result<()> {
        self.check_workers(start, stop)?;
        if start == stop {
            return Ok(());
        }
        let base = self.offsets[start];
        match &self.asg {
            Assignment::Owners { owner, .. } => {
                let mut fill = mem::collect("the workers' positions", stop - start, self.offsets[start..stop].iter().map(|&o| o - base))?;
                let m = stop - start;
                with_owner!(owner, v => {
                    for (j, &o) in v.iter().enumerate() {
                        if let Some(a) = v.get(j + AHEAD) {
                            ahead(a.idx(), j + AHEAD);
                        }
                        let i = o.idx();
                        if i.wrapping_sub(start) < m {
                            let p = &mut fill[i - start];
                            f(i, Seg::One(j), *p);
                            *p += 1;
                        }
                    }
                });
            }
            Assignment::Plan(plan) => {
                for i in start..stop {
                    let (pos, len) = (self.offsets[i] - base, self.offsets[i + 1] - self.offsets[i]);
                    if len == 0 {
                        continue;
                    }
                    if !self.starts.is_empty() {
                        f(i, Seg::Range(self.starts[i], self.starts[i] + len), pos);
                        continue;
                    }
                    match plan.worker(i).0 {
                        Coords::All => f(i, Seg::Range(0, self.d), pos),
                        Coords::Range(a, b) => f(i, Seg::Range(a, b), pos),
                        Coords::List(c) => f(i, Seg::List(c), pos),
                    }
                }
            }
        }
        Ok(())
    }

    /// The scale of worker `i` (checked `i < n`).
    pub fn scale_of(&self, i: usize) -> f64 {
        match &self.asg {
            Assignment::Owners { scale, .. } | Assignment::Plan(RoundPlan::Blocks { scale, .. }) => *scale,
            Assignment::Plan(RoundPlan::All { .. }) => 1.0,
            Assignment::Plan(RoundPlan::Csr { scales, .. }) => scales[i],
        }
    }

    /// This round restricted to the workers `workers` (strictly increasing, each `< n`): they
    /// keep their coordinates (in plan order) with their scales times `factor` (`scale ·
    /// factor`, rounded once), every other worker sends nothing. Partial participation's round
    /// (`permk.compressors.Participation`: `factor = n/s`), as a listed plan in `O(n + values)`.
    /// `factor` must be positive and finite, and so must every scale it multiplies (or stay
    /// 0): an error naming it otherwise.
    pub fn restricted(&self, workers: &[usize], factor: f64) -> Result<Round> {
        let (n, d) = (self.n, self.d);
        if !(factor > 0.0 && factor.is_finite()) {
            return Err(CoreError::invalid("factor", format!("must be positive and finite, got {factor:?}")));
        }
        if let Some(i) = (0..n).find(|&i| !(self.scale_of(i) * factor).is_finite()) {
            let s = self.scale_of(i);
            return Err(CoreError::invalid("factor", format!("worker {i}'s scale {s:?} times {factor:?} overflows to {:?}", s * factor)));
        }
        if let Some(k) = workers.windows(2).position(|w| w[0] >= w[1]) {
            return Err(CoreError::invalid("workers", format!("must be strictly increasing, got {} then {}", workers[k], workers[k + 1])));
        }
        if let Some(&w) = workers.iter().find(|&&w| w >= n) {
            return Err(CoreError::invalid("workers", format!("worker {w} is outside [0, {n})")));
        }
        let mut len = 0usize;
        for &w in workers {
            len += self.offsets[w + 1] - self.offsets[w];
        }
        Need::new()
            .array::<u32>("the restricted round's coordinates", &[len])
            .array::<usize>("the restricted round's offsets", &[2 * (n + 1)])
            .array::<f64>("the restricted round's scales", &[n])
            .bytes("the workers' positions", self.values_scratch(0, n))
            .check()?;
        let mut coords = mem::vec::<u32>("the restricted round's coordinates", len)?;
        let mut sizes = mem::filled("the restricted round's offsets", n + 1, 0usize)?;
        let mut scales = mem::filled("the restricted round's scales", n, 0.0f64)?;
        for (i, s) in scales.iter_mut().enumerate() {
            *s = self.scale_of(i) * factor;
        }
        let mut member = mem::filled("the participants", n, false)?;
        workers.iter().for_each(|&w| member[w] = true);
        if let Assignment::Owners { owner, .. } = &self.asg {
            // one pass over the coordinates, each participant's in increasing order (its plan order)
            let mut fill = mem::filled("the workers' positions", n, 0usize)?;
            let mut at = 0;
            for &w in workers {
                fill[w] = at;
                at += self.offsets[w + 1] - self.offsets[w];
            }
            coords.resize(len, 0);
            with_owner!(owner, v => {
                for (j, &o) in v.iter().enumerate() {
                    let i = o.idx();
                    if member[i] {
                        coords[fill[i]] = j as u32;
                        fill[i] += 1;
                    }
                }
            });
        } else {
            for &w in workers {
                self.visit(w, w + 1, |_, seg, _| match seg {
                    Seg::One(j) => coords.push(j as u32),
                    Seg::Range(a, b) => coords.extend((a..b).map(|j| j as u32)),
                    Seg::List(c) => coords.extend_from_slice(c),
                })?;
            }
        }
        for i in 0..n {
            sizes[i + 1] = sizes[i] + if member[i] { self.offsets[i + 1] - self.offsets[i] } else { 0 };
        }
        let offsets = mem::copy("the restricted round's offsets", &sizes)?;
        Ok(Round {
            n,
            d,
            asg: Assignment::Plan(RoundPlan::Csr { offsets: sizes, coords, scales }),
            offsets,
            starts: Vec::new(),
            contiguous: false,
            disjoint: OnceLock::new(),
        })
    }

    /// Checks `a` (`(m, d)` inputs of workers `start .. start + m`): `(stop, values)`.
    fn gather_workers<T>(&self, a: &ArrayView2<T>, start: usize) -> Result<(usize, usize)> {
        let (m, d) = a.dim();
        if d != self.d {
            return Err(CoreError::invalid("a", format!("must have d = {} columns, got {d}", self.d)));
        }
        let stop = start.checked_add(m).filter(|&s| s <= self.n).ok_or_else(|| {
            CoreError::invalid("a", format!("its {m} rows from start = {start} exceed the round's n = {} workers", self.n))
        })?;
        Ok((stop, self.len_of(start, stop)?))
    }

    /// The values of workers `start .. start + m` whose `(m, d)` inputs are `a`:
    /// `T::of(scale_i · a[i − start, j])` at their coordinates in plan order (exactly the
    /// values every aggregation path sums). Non-finite values are passed on, not reported.
    pub fn gather<T: Real>(&self, a: ArrayView2<T>, start: usize) -> Result<Vec<T>> {
        self.gather_div(a, start, None)
    }

    /// [`Round::gather`], each value `v` then `(v + 0) / k` in `T` (two IEEE operations, in
    /// the same pass) when `divide` is `Some(k)`: the worker-order sum's term divided by `n`
    /// for `k = n`.
    pub fn gather_div<T: Real>(&self, a: ArrayView2<T>, start: usize, divide: Option<Divisor>) -> Result<Vec<T>> {
        let (stop, len) = self.gather_workers(&a, start)?;
        Need::new().array::<T>("the gathered values", &[len]).bytes("the workers' positions", self.values_scratch(start, stop)).check()?;
        with_post!(divide, T, post => self.values("the gathered values", start, stop, &Gather { a, start, post }))
    }

    /// [`Round::gather_div`] written into `out` (exactly the workers' number of values, else an
    /// error naming `out`; all arguments are checked before anything is written).
    pub fn gather_into<T: Real>(&self, a: ArrayView2<T>, start: usize, divide: Option<Divisor>, out: &mut [T]) -> Result<()> {
        let (stop, _) = self.gather_workers(&a, start)?;
        Need::new().bytes("the workers' positions", self.values_scratch(start, stop)).check()?;
        with_post!(divide, T, post => self.values_into(start, stop, &Gather { a, start, post }, out))
    }

    /// The largest number of values one worker sends this round (`O(n)`): the slot width of a
    /// padded gather ([`Round::place_into`]).
    pub fn max_count(&self) -> usize {
        self.offsets.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0)
    }

    /// Places the values of a **disjoint** round received in padded slots: worker `i`'s values,
    /// in plan order, are `recv[i·width .. i·width + count_i]` (the rest of its slot is not
    /// read); each is copied to its coordinate in `out` (`d` values, all written: a coordinate
    /// nobody sends becomes `T::default()`, zero for floats). Only copies, no arithmetic: the
    /// senders scaled their values and divided them by `n` (`(v + 0)/n`, the worker-order sum's
    /// one term), so this is the disjoint round's average bit for bit. Owners take one pass
    /// over the coordinates (on the pool's threads for large rounds, by chunks: the same
    /// copies); other plans worker by worker. Errors, before anything is written: a round that
    /// is not disjoint, `width` below the largest count, `recv` not `n · width` long, `out`
    /// not `d` long.
    pub fn place_into<T: Copy + Default + Send + Sync>(&self, recv: &[T], width: usize, out: &mut [T]) -> Result<()> {
        let (n, d) = (self.n, self.d);
        if !self.disjoint() {
            return Err(CoreError::invalid("round", "place needs a disjoint round (no coordinate sent by two workers); sum the values instead"));
        }
        let most = self.max_count();
        if width < most {
            return Err(CoreError::invalid("width", format!("must hold the largest message of the round ({most} values), got {width}")));
        }
        let slots = n.checked_mul(width).ok_or_else(|| CoreError::invalid("width", format!("{n} slots of {width} values overflow")))?;
        if recv.len() != slots {
            return Err(CoreError::invalid("recv", format!("must hold the {n} workers' slots of width {width} ({slots} values), got {}", recv.len())));
        }
        if out.len() != d {
            return Err(CoreError::invalid("out", format!("must have the round's d = {d} coordinates, got {}", out.len())));
        }
        match &self.asg {
            Assignment::Owners { owner, .. } => {
                Need::new().bytes("the workers' positions", self.mean_scratch()).check()?;
                with_owner!(owner, v => self.place_owners(v, recv, width, out))
            }
            Assignment::Plan(plan) => {
                if self.total() < d {
                    out.fill(T::default());
                }
                for i in 0..n {
                    let k = self.offsets[i + 1] - self.offsets[i];
                    let src = &recv[i * width..i * width + k];
                    let c = if self.starts.is_empty() { plan.worker(i).0 } else { Coords::Range(self.starts[i], self.starts[i] + k) };
                    match c {
                        Coords::All => out.copy_from_slice(src),
                        Coords::Range(a, b) => out[a..b].copy_from_slice(src),
                        Coords::List(c) => c.iter().zip(src).for_each(|(&j, &x)| out[j as usize] = x),
                    }
                }
                Ok(())
            }
        }
    }

    /// [`Round::place_into`] for owners: coordinate `j`'s value is the next of its owner's slot.
    fn place_owners<L: Label, T: Copy + Send + Sync>(&self, owner: &[L], recv: &[T], width: usize, out: &mut [T]) -> Result<()> {
        // (a pass worker by worker over bit masks of 64 owners, as the packing does, measured
        // 1.6–2× slower here for 4 workers: n masks and n mispredicted loop exits per 64)
        let pass = |o: &mut [T], ow: &[L], fill: &mut [usize]| {
            for (x, &l) in o.iter_mut().zip(ow) {
                let p = &mut fill[l.idx()];
                // each worker's slot is a stream of its own (n of them interleaved)
                kernels::prefetch(recv.as_ptr().wrapping_add(*p + 32));
                *x = recv[*p];
                *p += 1;
            }
        };
        match self.chunk_fills(owner)? {
            Some(mut fills) => {
                // from positions in the concatenated values to positions in the slots
                for f in fills.chunks_mut(self.n) {
                    for (i, p) in f.iter_mut().enumerate() {
                        *p = *p - self.offsets[i] + i * width;
                    }
                }
                threads::install(|| {
                    out.par_chunks_mut(OWNERS_CHUNK)
                        .zip(owner.par_chunks(OWNERS_CHUNK))
                        .zip(fills.par_chunks_mut(self.n))
                        .for_each(|((o, ow), fill)| pass(o, ow, fill))
                })?
            }
            None => {
                let mut fill = mem::collect("the workers' positions", self.n, (0..self.n).map(|i| i * width))?;
                pass(out, owner, &mut fill);
            }
        }
        Ok(())
    }

    /// `(1/n) Σ_i C_i(a_i)` from the values of all `n` workers concatenated in worker and plan
    /// order (`offsets[n]` of them, e.g. [`Round::gather`]'s): summed in worker order into a
    /// zeroed float64 output, then divided by `n`, which is bit for bit
    /// `np.bincount(coords, weights=values, minlength=d) / n` (and, for a disjoint round,
    /// `0.0 + v` placed at each coordinate, then divided by `n`). Owners take one pass over the
    /// coordinates; contiguous blocks combine their workers tile by tile ([`kernels::ranges_combine`]);
    /// the other plans add worker by worker. Non-finite values propagate.
    pub fn mean(&self, values: &[f64]) -> Result<Vec<f64>> {
        self.check_values(values)?;
        Need::new().array::<f64>("the average", &[self.d]).bytes("the workers' positions", self.mean_scratch()).check()?;
        self.mean_to(values, None)
    }

    /// [`Round::mean`] written into `out` (`d` values, all overwritten; else an error naming
    /// `out`, before anything is written): the same bits.
    pub fn mean_into(&self, values: &[f64], out: &mut [f64]) -> Result<()> {
        self.check_values(values)?;
        if out.len() != self.d {
            return Err(CoreError::invalid("out", format!("must have the round's d = {} coordinates, got {}", self.d, out.len())));
        }
        Need::new().bytes("the workers' positions", self.mean_scratch()).check()?;
        self.mean_to(values, Some(out)).map(drop)
    }

    fn check_values(&self, values: &[f64]) -> Result<()> {
        if values.len() != self.total() {
            return Err(CoreError::invalid(
                "values",
                format!("must hold the {} values of all {} workers (offsets[n]), got {}", self.total(), self.n, values.len()),
            ));
        }
        Ok(())
    }

    /// The bytes of [`Round::mean`]'s temporaries (the owners' chunk positions).
    fn mean_scratch(&self) -> u128 {
        let (n, d) = (self.n as u128, self.d as u128);
        let chunks = (self.d.div_ceil(OWNERS_CHUNK) as u128).min(d / 8 / n + 1);
        8 * n * (chunks + 1)
    }

    /// The average into `out`, or into a new array when `out` is `None` (returned; empty
    /// otherwise). The arguments and the memory are checked.
    fn mean_to(&self, values: &[f64], mut out: Option<&mut [f64]>) -> Result<Vec<f64>> {
        let (n, d) = (self.n, self.d);
        let rows = ValueRows { values, offsets: &self.offsets };
        // contiguous blocks: written once, tile by tile (`None`: the generic path)
        let combine = |bounds: &[usize], first: &[usize], workers: &[u32], out: Option<&mut [f64]>| -> Result<Option<Vec<f64>>> {
            Ok(match out {
                Some(o) => kernels::ranges_combine_over(&rows, n, d, bounds, first, workers, 1.0, o)?.map(|_| Vec::new()),
                None => kernels::ranges_combine(&rows, n, d, bounds, first, workers, 1.0)?.map(|(v, _)| v),
            })
        };
        match &self.asg {
            Assignment::Owners { owner, .. } => {
                return match out {
                    Some(o) => with_owner!(owner, v => self.mean_owners(v, values, o)).map(|_| Vec::new()),
                    None => {
                        let mut o = mem::zeros::<f64>("the average", &[d])?;
                        with_owner!(owner, v => self.mean_owners(v, values, &mut o))?;
                        Ok(o)
                    }
                };
            }
            Assignment::Plan(RoundPlan::All { .. }) if d >= RANGES_MIN_BLOCK => {
                let workers = mem::collect("the block workers", n, 0..n as u32)?;
                if let Some(v) = combine(&[0, d], &[0, n], &workers, out.as_deref_mut())? {
                    return Ok(v);
                }
            }
            Assignment::Plan(RoundPlan::Blocks { pi, slot_block, blocks: Blocks::Ranges(bounds), .. }) if d / (bounds.len() - 1) >= RANGES_MIN_BLOCK => {
                let (first, workers) = kernels::block_workers(pi, slot_block, bounds.len() - 1)?;
                if let Some(v) = combine(bounds, &first, &workers, out.as_deref_mut())? {
                    return Ok(v);
                }
            }
            _ => {}
        }
        let Assignment::Plan(plan) = &self.asg else {
            return Err(CoreError::Internal("the owners' average returned above".into()));
        };
        let mut new = Vec::new();
        let out: &mut [f64] = match out {
            Some(o) => {
                o.fill(0.0);
                o
            }
            None => {
                new = mem::zeros::<f64>("the average", &[d])?;
                &mut new
            }
        };
        let add = |out: &mut [f64], c: Coords<'_>, v: &[f64]| match c {
            Coords::All => out.iter_mut().zip(v).for_each(|(o, &x)| *o += x),
            Coords::Range(a, b) => out[a..b].iter_mut().zip(v).for_each(|(o, &x)| *o += x),
            Coords::List(c) => c.iter().zip(v).for_each(|(&j, &x)| out[j as usize] += x),
        };
        if !self.starts.is_empty() {
            // small range blocks (PermK for n > d: singletons)
            for i in 0..n {
                let v = &values[self.offsets[i]..self.offsets[i + 1]];
                match v {
                    [] => {}
                    [x] => out[self.starts[i]] += x,
                    _ => add(out, Coords::Range(self.starts[i], self.starts[i] + v.len()), v),
                }
            }
        } else {
            for i in 0..n {
                add(out, plan.worker(i).0, &values[self.offsets[i]..self.offsets[i + 1]]);
            }
        }
        kernels::divide_all(out, n as f64);
        Ok(new)
    }

    /// Owners: coordinate `j`'s one value is the next of its owner's, in one pass over `out`
    /// (`d` values, all overwritten) by chunks of coordinates (each gathered, then divided
    /// while in cache); large rounds with the chunks on the pool's threads
    /// ([`Round::chunk_fills`]).
    fn mean_owners<L: Label>(&self, owner: &[L], values: &[f64], out: &mut [f64]) -> Result<()> {
        let nt = self.n as f64;
        // coordinates `o` (owners `ow`) from the workers' positions `fill`
        let pass = |o: &mut [f64], ow: &[L], fill: &mut [usize]| {
            for (x, &l) in o.iter_mut().zip(ow) {
                let p = &mut fill[l.idx()];
                // each worker's values are a stream of their own (n of them interleaved): fetch
                // two cache lines ahead in this one
                kernels::prefetch(values.as_ptr().wrapping_add(*p + 16));
                *x = 0.0 + values[*p];
                *p += 1;
            }
            // the division apart, vectorised (the same operations on the same values)
            kernels::divide_all(o, nt);
        };
        // two workers: their positions in registers (a position in memory, incremented by
        // consecutive coordinates of one worker, waits for its own store every time; measured
        // 10% faster at d = 10^7)
        let pass = |o: &mut [f64], ow: &[L], fill: &mut [usize]| match self.n {
            2 => pass_few::<2, L>(o, ow, fill, values, nt),
            _ => pass(o, ow, fill),
        };
        match self.chunk_fills(owner)? {
            Some(mut fills) => threads::install(|| {
                out.par_chunks_mut(OWNERS_CHUNK)
                    .zip(owner.par_chunks(OWNERS_CHUNK))
                    .zip(fills.par_chunks_mut(self.n))
                    .for_each(|((o, ow), fill)| pass(o, ow, fill))
            })?,
            None => {
                let mut fill = mem::copy("the workers' positions", &self.offsets[..self.n])?;
                out.chunks_mut(OWNERS_CHUNK).zip(owner.chunks(OWNERS_CHUNK)).for_each(|(o, ow)| pass(o, ow, &mut fill));
            }
        }
        Ok(())
    }

    /// For a parallel pass over the owners in chunks of `OWNERS_CHUNK` coordinates: every
    /// worker's first position in every chunk (`fills[c·n + i]`), from a counting pass. `None`
    /// when the round is too small to pay, or has too many workers for its chunks
    /// (`n · chunks > d / 8`: the counts would cost as much as the pass).
    fn chunk_fills<L: Label>(&self, owner: &[L]) -> Result<Option<Vec<usize>>> {
        let (n, d) = (self.n, self.d);
        let chunks = d.div_ceil(OWNERS_CHUNK);
        // on one thread the counting pass would only add to the pass
        if !threads::spread(chunks, d, OWNERS_PAR_THRESHOLD)? || n.saturating_mul(chunks) > d / 8 {
            return Ok(None);
        }
        let mut fills = mem::filled("the workers' chunk positions", n * chunks, 0usize)?;
        threads::install(|| fills.par_chunks_mut(n).zip(owner.par_chunks(OWNERS_CHUNK)).for_each(|(f, ow)| count_labels(ow, f)))?;
        let mut next = mem::copy("the workers' positions", &self.offsets[..n])?;
        for f in fills.chunks_mut(n) {
            for (f, p) in f.iter_mut().zip(next.iter_mut()) {
                let count = *f;
                *f = *p;
                *p += count;
            }
        }
        Ok(Some(fills))
    }
}

/// [`Round::mean_owners`]' pass over coordinates `o` (owners `ow`, labels below `N`) with the
/// workers' positions `fill` held in registers: the same values, in the same order.
#[inline]
fn pass_few<const N: usize, L: Label>(o: &mut [f64], ow: &[L], fill: &mut [usize], values: &[f64], nt: f64) {
    let mut f = [0usize; N];
    f.copy_from_slice(&fill[..N]);
    for (x, &l) in o.iter_mut().zip(ow) {
        let i = l.idx();
        // the position of worker i, selected without branches
        let p = f.iter().enumerate().fold(0usize, |p, (k, &fk)| p | (fk & 0usize.wrapping_sub((i == k) as usize)));
        *x = 0.0 + values[p];
        for (k, fk) in f.iter_mut().enumerate() {
            *fk += (i == k) as usize;
        }
    }
    fill[..N].copy_from_slice(&f);
    kernels::divide_all(o, nt);
}

/// A round being computed on a background thread ([`PendingRound::spawn`]): [`PendingRound::wait`]
/// joins it once. Dropped without waiting, the thread is detached: it ends with its
/// computation (pure Rust on owned data) and its result is dropped.
#[derive(Debug)]
pub struct PendingRound {
    handle: Mutex<Option<JoinHandle<Result<Round>>>>,
}

fn panic_text(p: &(dyn Any + Send)) -> String {
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_else(|| "(no message)".into())
}

impl PendingRound {
    /// Checks the arguments here (errors at once), then computes [`Round::new`]`(spec, n, d,
    /// seed, round)` on a new thread; the result is that round exactly.
    pub fn spawn(spec: Arc<Spec>, n: usize, d: usize, seed: u64, round: u64) -> Result<PendingRound> {
        Round::check(&spec, n, d)?;
        Self::start(move || Round::compute(&spec, n, d, seed, round))
    }

    /// Runs `f` on a new thread; a panic in it becomes an error of [`PendingRound::wait`].
    pub fn start(f: impl FnOnce() -> Result<Round> + Send + 'static) -> Result<PendingRound> {
        let handle = std::thread::Builder::new()
            .name("permk-round".into())
            .spawn(move || {
                catch_unwind(AssertUnwindSafe(f))
                    .unwrap_or_else(|p| Err(CoreError::Internal(format!("the round's background computation panicked: {}", panic_text(p.as_ref())))))
            })
            .map_err(|e| CoreError::Internal(format!("could not start the round's background thread: {e}")))?;
        Ok(PendingRound { handle: Mutex::new(Some(handle)) })
    }

    /// Takes the thread's handle, once (the second call is an error).
    pub fn take(&self) -> Result<JoinHandle<Result<Round>>> {
        self.handle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| CoreError::invalid("wait", "this PendingRound was already waited for (wait() returns its Round once)"))
    }

    /// Joins a handle of [`PendingRound::take`]: the round, or the computation's error.
    pub fn join(handle: JoinHandle<Result<Round>>) -> Result<Round> {
        handle
            .join()
            .unwrap_or_else(|p| Err(CoreError::Internal(format!("the round's background computation panicked: {}", panic_text(p.as_ref())))))
    }

    /// Waits for the round (once).
    pub fn wait(&self) -> Result<Round> {
        Self::join(self.take()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::{aggregate, aggregate_with_plan, plan, plan_ranges, round_plan, BlockPermK, CoordinateSampling, Identity, Partition, PermK, Quantizer, RandK, TopK};
    use crate::sparsify::Sparsifier;
    use ndarray::{s, Array2};

    fn spec(s: impl Into<Sparsifier>) -> Spec {
        Spec::new(s, Quantizer::None).unwrap()
    }

    fn big(n: usize, d: usize) -> Array2<f64> {
        Array2::from_shape_fn((n, d), |(i, j)| ((i * 7919 + j * 104729) % 1000003) as f64 / 997.0 - 500.0)
    }

    /// Every sparsifier with a shared plan, several forms of each.
    fn shared_specs() -> Vec<Spec> {
        vec![
            spec(Identity),
            spec(PermK::default()),
            spec(PermK::SHUFFLE),
            spec(RandK { k: 1 }),
            spec(RandK { k: 3 }),
            spec(BlockPermK { partition: Partition::Contiguous { m: 2 } }),
            spec(BlockPermK { partition: Partition::Contiguous { m: 1 } }),
            spec(BlockPermK { partition: Partition::labels(vec![1, 0, 1, 1, 0, 0, 1]).unwrap() }),
            spec(BlockPermK { partition: Partition::labels(vec![0, 0, 1, 1, 1, 2, 2]).unwrap() }),
            spec(CoordinateSampling),
        ]
    }

    /// (n, d) pairs: n > d, n = d, n < d, n = 1, d not divisible by n, large blocks.
    const SHAPES: [(usize, usize); 10] = [(4, 10), (7, 3), (5, 5), (1, 7), (3, 7), (10, 4), (6, 13), (20, 7), (2, 70_000), (9, 100)];

    fn bits(v: &[f64]) -> Vec<u64> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// `np.bincount(coords, weights=values, minlength=d) / n`.
    fn bincount_mean(coords: &[i64], values: &[f64], n: usize, d: usize) -> Vec<f64> {
        let mut out = vec![0.0; d];
        for (&j, &v) in coords.iter().zip(values) {
            out[j as usize] += v;
        }
        out.iter().map(|v| v / n as f64).collect()
    }

    #[test]
    fn a_round_is_the_plan() {
        for sp in shared_specs() {
            for (n, d) in SHAPES {
                if sp.check(n, d).is_err() {
                    continue;
                }
                for round in 0..3 {
                    let p = plan(&sp, n, d, 11, round).unwrap();
                    let r = Round::new(&sp, n, d, 11, round).unwrap();
                    assert_eq!((r.n(), r.d()), (n, d));
                    assert_eq!(r.offsets_i64().unwrap(), p.offsets, "{sp:?} n={n} d={d}");
                    assert_eq!(r.coords(0, n).unwrap(), p.coords, "{sp:?} n={n} d={d}");
                    assert_eq!(bits(&r.scales().unwrap()), bits(&p.scales));
                    for (a, b) in [(0, 0), (0, 1), (n / 2, n), (n - 1, n), (n / 3, 2 * n / 3)] {
                        let (lo, hi) = (p.offsets[a] as usize, p.offsets[b] as usize);
                        assert_eq!(r.coords(a, b).unwrap(), p.coords[lo..hi], "{sp:?} n={n} d={d} {a}..{b}");
                        let rows: Vec<i64> = (a..b).flat_map(|i| std::iter::repeat(i as i64).take((p.offsets[i + 1] - p.offsets[i]) as usize)).collect();
                        assert_eq!(r.rows(a, b).unwrap(), rows);
                    }
                    assert_eq!(r.ranges().unwrap(), plan_ranges(&sp, n, d, 11, round).unwrap(), "{sp:?} n={n} d={d}");
                    // disjoint: no coordinate twice
                    let mut seen = vec![0; d];
                    p.coords.iter().for_each(|&j| seen[j as usize] += 1);
                    assert_eq!(r.disjoint(), seen.iter().all(|&c| c <= 1), "{sp:?} n={n} d={d}");
                }
            }
        }
    }

    #[test]
    fn gather_and_mean_are_the_aggregate() {
        for sp in shared_specs() {
            for (n, d) in SHAPES {
                if sp.check(n, d).is_err() {
                    continue;
                }
                let a = big(n, d);
                let r = Round::new(&sp, n, d, 3, 5).unwrap();
                let p = plan(&sp, n, d, 3, 5).unwrap();
                let vals = r.gather(a.view(), 0).unwrap();
                // the values are the plan's: scale_i · a[i, j]
                let want: Vec<f64> = (0..n)
                    .flat_map(|i| (p.offsets[i] as usize..p.offsets[i + 1] as usize).map(move |t| (i, t)))
                    .map(|(i, t)| kernels::scaled(a[[i, p.coords[t] as usize]], p.scales[i]))
                    .collect();
                assert_eq!(bits(&vals), bits(&want), "{sp:?} n={n} d={d}");
                let mean = r.mean(&vals).unwrap();
                let agg = aggregate(&sp, a.view(), 3, 5).unwrap();
                let generic = aggregate_with_plan(&sp, &round_plan::<f64>(&sp, n, d, 3, 5, None).unwrap(), a.view(), 3, 5).unwrap();
                assert_eq!(bits(&mean), bits(agg.as_slice().unwrap()), "{sp:?} n={n} d={d}");
                assert_eq!(bits(&mean), bits(generic.as_slice().unwrap()));
                assert_eq!(bits(&mean), bits(&bincount_mean(&p.coords, &vals, n, d)));
                // any values (not only scaled inputs), with signed zeros and non-finite ones
                let mut any: Vec<f64> = (0..vals.len()).map(|t| ((t * 37) % 11) as f64 - 5.0).collect();
                for (t, v) in any.iter_mut().enumerate() {
                    match t % 13 {
                        3 => *v = -0.0,
                        7 => *v = 1e-310,
                        _ => {}
                    }
                }
                if !any.is_empty() && d > 1 {
                    any[vals.len() / 2] = f64::NAN;
                    any[0] = f64::INFINITY;
                }
                let m = r.mean(&any).unwrap();
                let b = bincount_mean(&p.coords, &any, n, d);
                assert!(m.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())), "{sp:?} n={n} d={d}");
                // gather of a slice of workers, float32 and strided inputs
                for (lo, hi) in [(0, n), (n / 2, n), (1.min(n), n), (0, 0)] {
                    let g = r.gather(a.slice(s![lo..hi, ..]), lo).unwrap();
                    assert_eq!(bits(&g), bits(&vals[p.offsets[lo] as usize..p.offsets[hi] as usize]));
                    let at = a.t().to_owned();
                    let g = r.gather(at.t().slice(s![lo..hi, ..]), lo).unwrap();
                    assert_eq!(bits(&g), bits(&vals[p.offsets[lo] as usize..p.offsets[hi] as usize]));
                }
                let a32 = a.mapv(|v| v as f32);
                let g32 = r.gather(a32.view(), 0).unwrap();
                let want32: Vec<f32> = (0..n)
                    .flat_map(|i| (p.offsets[i] as usize..p.offsets[i + 1] as usize).map(move |t| (i, t)))
                    .map(|(i, t)| (p.scales[i] * a32[[i, p.coords[t] as usize]] as f64) as f32)
                    .collect();
                assert_eq!(g32, want32);
            }
        }
    }

    /// `vals` (worker order, `offsets`) in slots of `width`, the pads `fill`.
    fn padded<T: Copy>(vals: &[T], offsets: &[usize], width: usize, fill: T) -> Vec<T> {
        let n = offsets.len() - 1;
        let mut recv = vec![fill; n * width];
        for i in 0..n {
            let k = offsets[i + 1] - offsets[i];
            recv[i * width..i * width + k].copy_from_slice(&vals[offsets[i]..offsets[i + 1]]);
        }
        recv
    }

    #[test]
    fn placed_slots_are_the_disjoint_average() {
        let mut shapes = SHAPES.to_vec();
        shapes.push((4, 600_001)); // owners by chunks on the pool's threads
        for sp in shared_specs() {
            for &(n, d) in &shapes {
                if sp.check(n, d).is_err() || (d > 100_000 && !matches!(sp.sparsifier, Sparsifier::PermK(_))) {
                    continue;
                }
                let r = Round::new(&sp, n, d, 3, 5).unwrap();
                let w = r.max_count();
                assert_eq!(w, r.offsets().windows(2).map(|o| o[1] - o[0]).max().unwrap());
                let a = big(n, d);
                let vals = r.gather_div(a.view(), 0, Some(Divisor::new(n as u64).unwrap())).unwrap();
                let mut out = vec![f64::NAN; d];
                if !r.disjoint() {
                    let e = r.place_into(&padded(&vals, r.offsets(), w.max(1), 0.0), w.max(1), &mut out).unwrap_err();
                    assert!(e.to_string().contains("disjoint"), "{e}");
                    assert!(out.iter().all(|v| v.is_nan()), "nothing written");
                    continue;
                }
                let want = r.mean(&r.gather(a.view(), 0).unwrap()).unwrap();
                for width in [w.max(1), w + 3] {
                    // pads that must not be read
                    r.place_into(&padded(&vals, r.offsets(), width, f64::NAN), width, &mut out).unwrap();
                    assert_eq!(bits(&out), bits(&want), "{sp:?} n={n} d={d} width={width}");
                }
                // float32, and signed zeros and non-finite values copied as they are
                let v32: Vec<f32> = (0..vals.len()).map(|t| [1.5f32, -0.0, f32::INFINITY, f32::NAN, 3e-40][t % 5]).collect();
                let mut o32 = vec![7.0f32; d];
                r.place_into(&padded(&v32, r.offsets(), w.max(1), f32::NAN), w.max(1), &mut o32).unwrap();
                let coords = r.coords(0, n).unwrap();
                let mut want32 = vec![0.0f32; d];
                coords.iter().zip(&v32).for_each(|(&j, &x)| want32[j as usize] = x);
                assert_eq!(o32.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want32.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), "{sp:?} n={n} d={d}");
            }
        }
    }

    #[test]
    fn label_masks_are_the_comparisons() {
        fn check<L: Label + std::fmt::Debug>(labels: &[L], n: usize) {
            for len in (0..=64).chain([64, 64]) {
                for start in [0, 1, 7, 64] {
                    let blk = &labels[start..start + len];
                    for w in 0..n {
                        let want = blk.iter().enumerate().fold(0u64, |m, (t, &l)| m | ((l == L::of(w)) as u64) << t);
                        assert_eq!(L::eq_mask(blk, L::of(w)), want, "len {len} start {start} w {w}");
                    }
                }
            }
        }
        for n in [1usize, 2, 4, 5, 200] {
            let v: Vec<usize> = (0..200).map(|t| (t * 7919 + t / 3) % n).collect();
            check(&v.iter().map(|&l| l as u8).collect::<Vec<_>>(), n);
            check(&v.iter().map(|&l| l as u16).collect::<Vec<_>>(), n);
            check(&v.iter().map(|&l| l as u32).collect::<Vec<_>>(), n);
        }
    }

    #[test]
    fn place_checks_its_sizes_before_writing() {
        let r = Round::new(&spec(PermK::default()), 4, 10, 0, 0).unwrap();
        let w = r.max_count();
        assert_eq!(w, 3);
        let mut out = vec![f64::NAN; 10];
        let bad: [(&[f64], usize, usize, &str); 5] = [
            (&[0.0; 8], 2, 10, "width"),           // a slot narrower than a message
            (&[0.0; 11], 3, 10, "recv"),           // not n · width values
            (&[0.0; 12], 3, 9, "out"),             // out not d long
            (&[0.0; 12], 3, 11, "out"),
            (&[0.0; 0], usize::MAX, 10, "width"), // n · width overflows
        ];
        for (recv, width, len, name) in bad {
            let mut o = vec![f64::NAN; len];
            let e = r.place_into(recv, width, &mut o).unwrap_err();
            assert!(matches!(&e, CoreError::InvalidArgument { name: got, .. } if got == name), "{e:?}");
            assert!(o.iter().all(|v| v.is_nan()));
        }
        r.place_into(&[1.0; 12], 3, &mut out).unwrap();
        assert!(out.iter().all(|&v| v == 1.0));
    }

    /// `(v + 0) / k` in `T`, as numpy's `(g + 0.0) / k` computes it.
    fn divided<T: Real>(v: &[T], k: u64) -> Vec<T> {
        v.iter().map(|&x| (x + T::zero()) / T::of(k as f64)).collect()
    }

    /// Distinct values of every sign, signed zeros, subnormals and non-finite ones.
    fn awkward(n: usize, d: usize) -> Array2<f64> {
        let mut a = big(n, d);
        for (t, v) in a.iter_mut().enumerate() {
            match t % 11 {
                2 => *v = -0.0,
                5 => *v = 0.0,
                7 => *v = -3e-310,
                9 => *v = 1e300,
                _ => {}
            }
        }
        if n * d > 4 {
            a[[0, d - 1]] = f64::INFINITY;
            a[[n - 1, 0]] = f64::NAN;
        }
        a
    }

    #[test]
    fn divided_and_written_values_are_the_composition() {
        for sp in shared_specs() {
            for (n, d) in SHAPES {
                if sp.check(n, d).is_err() {
                    continue;
                }
                let a = awkward(n, d);
                let a32 = a.mapv(|v| v as f32);
                let r = Round::new(&sp, n, d, 3, 5).unwrap();
                for (lo, hi) in [(0, n), (n / 2, n), (n - 1, n), (0, 0)] {
                    let rows = a.slice(s![lo..hi, ..]);
                    let plain = r.gather(rows, lo).unwrap();
                    let plain32 = r.gather(a32.slice(s![lo..hi, ..]), lo).unwrap();
                    for k in [1, 2, 3, 4, 7, n as u64, 1 << 20, (1 << 53) - 1, 1 << 53] {
                        let div = Some(Divisor::new(k).unwrap());
                        let want = divided(&plain, k);
                        assert_eq!(bits(&r.gather_div(rows, lo, div).unwrap()), bits(&want), "{sp:?} n={n} d={d} k={k}");
                        // into a buffer of garbage: every element is overwritten
                        let mut out = vec![f64::NAN; want.len()];
                        r.gather_into(rows, lo, div, &mut out).unwrap();
                        assert_eq!(bits(&out), bits(&want), "{sp:?} n={n} d={d} k={k}");
                        // −0.0 becomes +0.0, as in a sum from zero
                        let neg0 = (-0.0f64).to_bits();
                        assert!(plain.iter().zip(&out).all(|(v, o)| v.to_bits() != neg0 || o.to_bits() == 0));
                        let want32 = divided(&plain32, k);
                        let mut out32 = vec![f32::NAN; want32.len()];
                        r.gather_into(a32.slice(s![lo..hi, ..]), lo, div, &mut out32).unwrap();
                        let b32 = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(b32(&out32), b32(&want32), "{sp:?} n={n} d={d} k={k}");
                        assert_eq!(b32(&r.gather_div(a32.slice(s![lo..hi, ..]), lo, div).unwrap()), b32(&want32));
                    }
                    // without divide: the values themselves; strided input
                    let mut out = vec![f64::NAN; plain.len()];
                    let at = a.t().to_owned();
                    r.gather_into(at.t().slice(s![lo..hi, ..]), lo, None, &mut out).unwrap();
                    assert_eq!(bits(&out), bits(&plain));
                }
                // the mean into a buffer of garbage: the same bits
                let vals = r.gather(a.view(), 0).unwrap();
                let want = r.mean(&vals).unwrap();
                let mut out = vec![f64::NAN; d];
                r.mean_into(&vals, &mut out).unwrap();
                assert!(out.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())), "{sp:?} n={n} d={d}");
                let mut out = vec![-0.0; d];
                r.mean_into(&vals, &mut out).unwrap();
                assert!(out.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())), "{sp:?} n={n} d={d}");
            }
        }
    }

    #[test]
    fn a_power_of_two_divides_like_a_division() {
        // the reciprocal's product is the quotient for every kind of value, subnormal results too
        let xs = [0.0, -0.0, 1.0, -1.5, 3e-308, -2.2e-308, 5e-324, f64::MAX, f64::MIN_POSITIVE, 0.1, 1.0 / 3.0, f64::INFINITY, f64::NEG_INFINITY];
        for m in [0, 1, 2, 5, 30, 52, 53] {
            let k = 1u64 << m;
            let (p, q) = (TimesInverse(1.0 / k as f64), DivideBy(k as f64));
            for &x in &xs {
                assert_eq!(Post::<f64>::apply(p, x).to_bits(), q.apply(x).to_bits(), "x={x} k={k}");
                let x32 = x as f32;
                let (p32, q32) = (TimesInverse(1.0 / k as f32), DivideBy(k as f32));
                assert_eq!(Post::<f32>::apply(p32, x32).to_bits(), q32.apply(x32).to_bits(), "x={x32} k={k}");
            }
        }
    }

    #[test]
    fn bad_outputs_and_divisors_are_named_errors_before_writing() {
        let arg = |e: CoreError| match e {
            CoreError::InvalidArgument { name, .. } => name,
            other => panic!("{other:?}"),
        };
        assert_eq!(arg(Divisor::new(0).unwrap_err()), "divide");
        assert_eq!(arg(Divisor::new((1 << 53) + 1).unwrap_err()), "divide");
        assert_eq!(Divisor::new(1 << 53).unwrap().get(), 1 << 53);
        let r = Round::new(&spec(BlockPermK { partition: Partition::Contiguous { m: 2 } }), 2, 10, 0, 0).unwrap();
        let a = big(2, 10);
        let two = Some(Divisor::new(2).unwrap());
        for len in [0, 4, 6, 11] {
            let mut out = vec![7.0; len];
            assert_eq!(arg(r.gather_into(a.view(), 0, two, &mut out).unwrap_err()), "out");
            assert_eq!(arg(r.mean_into(&[1.0; 10], &mut out[..len.min(9)]).unwrap_err()), "out");
            assert!(out.iter().all(|&v| v == 7.0));
        }
        // the inputs are checked first, and nothing is written either
        let mut out = vec![7.0; 10];
        assert_eq!(arg(r.gather_into(big(2, 9).view(), 0, two, &mut out).unwrap_err()), "a");
        assert_eq!(arg(r.gather_into(a.view(), 1, two, &mut out).unwrap_err()), "a");
        assert_eq!(arg(r.mean_into(&[1.0; 9], &mut out).unwrap_err()), "values");
        assert_eq!(arg(r.values_into(0, 3, &CoordsOf, &mut [0i64; 10]).unwrap_err()), "stop");
        assert!(out.iter().all(|&v| v == 7.0));
    }

    #[test]
    fn large_rounds_do_not_depend_on_the_thread_count() {
        let (n, d) = (40, 300_000);
        let a = big(n, d);
        let specs = [spec(PermK::default()), spec(Identity), spec(BlockPermK { partition: Partition::Contiguous { m: 8 } }), spec(RandK { k: 20_000 })];
        let run = || -> Vec<(Vec<f64>, Vec<f64>)> {
            specs
                .iter()
                .map(|sp| {
                    let r = Round::new(sp, n, d, 1, 2).unwrap();
                    let v = r.gather(a.view(), 0).unwrap();
                    let m = r.mean(&v).unwrap();
                    // divided, into buffers, one worker's values (one block of 300 000 values
                    // split into chunks) and some workers'
                    let mut into = vec![f64::NAN; v.len()];
                    r.gather_into(a.view(), 0, Some(Divisor::new(3).unwrap()), &mut into).unwrap();
                    assert_eq!(bits(&into), bits(&divided(&v, 3)));
                    let mut mean = vec![f64::NAN; d];
                    r.mean_into(&v, &mut mean).unwrap();
                    assert_eq!(bits(&mean), bits(&m));
                    let o = r.offsets();
                    for (lo, hi) in [(0, 1), (5, 6), (3, 17)] {
                        let mut part = vec![f64::NAN; o[hi] - o[lo]];
                        r.gather_into(a.slice(s![lo..hi, ..]), lo, Some(Divisor::new(4).unwrap()), &mut part).unwrap();
                        assert_eq!(bits(&part), bits(&divided(&v[o[lo]..o[hi]], 4)));
                        into.extend(part);
                    }
                    (into, mean)
                })
                .collect()
        };
        let _lock = crate::threads::TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        crate::threads::set_num_threads(1).unwrap();
        let one = run();
        crate::threads::set_num_threads(3).unwrap();
        let three = run();
        for ((v1, m1), (v3, m3)) in one.iter().zip(&three) {
            assert_eq!(bits(v1), bits(v3));
            assert_eq!(bits(m1), bits(m3));
        }
        for (sp, (_, m)) in specs.iter().zip(&one) {
            assert_eq!(bits(m), bits(aggregate(sp, a.view(), 1, 2).unwrap().as_slice().unwrap()), "{sp:?}");
        }
    }

    #[test]
    fn bad_arguments_are_named_errors() {
        let name = |r: Result<Round>| match r {
            Err(CoreError::InvalidArgument { name, .. }) => name,
            other => panic!("{other:?}"),
        };
        assert_eq!(name(Round::new(&spec(TopK { k: 1 }), 3, 5, 0, 0)), "spec");
        assert_eq!(name(Round::new(&Spec::new(PermK::default(), Quantizer::Natural).unwrap(), 3, 5, 0, 0)), "spec");
        assert_eq!(name(Round::new(&spec(PermK::default()), 0, 5, 0, 0)), "n_workers");
        assert_eq!(name(Round::new(&spec(RandK { k: 9 }), 3, 5, 0, 0)), "k");
        let r = Round::new(&spec(PermK::default()), 3, 5, 0, 0).unwrap();
        let arg = |e: CoreError| match e {
            CoreError::InvalidArgument { name, .. } => name,
            other => panic!("{other:?}"),
        };
        assert_eq!(arg(r.coords(2, 1).unwrap_err()), "start");
        assert_eq!(arg(r.rows(0, 4).unwrap_err()), "stop");
        assert_eq!(arg(r.mean(&[1.0; 4]).unwrap_err()), "values");
        assert_eq!(arg(r.gather(big(3, 4).view(), 0).unwrap_err()), "a");
        assert_eq!(arg(r.gather(big(3, 5).view(), 1).unwrap_err()), "a");
        assert_eq!(arg(r.gather(big(1, 5).view(), usize::MAX).unwrap_err()), "a");
        // sizes are checked before allocating
        let id = Round::new(&spec(Identity), 1 << 20, 1 << 31, 0, 0).unwrap();
        assert!(matches!(id.coords(0, 1 << 20), Err(CoreError::Memory { .. })));
        assert!(matches!(Round::new(&spec(PermK::default()), 1 << 31, u32::MAX as usize, 0, 0), Err(CoreError::Memory { .. })));
    }

    #[test]
    fn visits_and_restricted_rounds_are_the_plan() {
        let mut specs = shared_specs();
        specs.push(spec(BlockPermK { partition: Partition::Contiguous { m: 1 } }));
        for (n, d) in [(3, 7), (7, 3), (4, 10), (1, 5), (12, 4), (5, 2_000)] {
            for sp in &specs {
                if sp.check(n, d).is_err() {
                    continue;
                }
                let r = Round::new(sp, n, d, 5, 2).unwrap();
                for (lo, hi) in [(0, n), (n / 2, n), (0, n / 2)] {
                    // the visit's (worker, coordinate, position) are those of rows/coords
                    let (rows, cols) = (r.rows(lo, hi).unwrap(), r.coords(lo, hi).unwrap());
                    let mut seen = vec![(usize::MAX, usize::MAX); rows.len()];
                    r.visit(lo, hi, |i, seg, pos| match seg {
                        Seg::One(j) => seen[pos] = (i, j),
                        Seg::Range(a, b) => (a..b).enumerate().for_each(|(k, j)| seen[pos + k] = (i, j)),
                        Seg::List(c) => c.iter().enumerate().for_each(|(k, &j)| seen[pos + k] = (i, j as usize)),
                    })
                    .unwrap();
                    let want: Vec<(usize, usize)> = rows.iter().zip(&cols).map(|(&i, &j)| (i as usize, j as usize)).collect();
                    assert_eq!(seen, want, "{sp:?} n={n} d={d} {lo}..{hi}");
                }
                // restricted to some workers: their coordinates and scales times the factor
                let who: Vec<usize> = (0..n).filter(|i| i % 3 != 1).collect();
                let f = n as f64 / who.len().max(1) as f64;
                let p = r.restricted(&who, f).unwrap();
                let (sc, ps) = (r.scales().unwrap(), p.scales().unwrap());
                for i in 0..n {
                    let mine = if who.contains(&i) { r.coords(i, i + 1).unwrap() } else { Vec::new() };
                    assert_eq!(p.coords(i, i + 1).unwrap(), mine, "{sp:?} n={n} d={d} worker {i}");
                    assert_eq!(ps[i].to_bits(), (sc[i] * f).to_bits());
                }
                assert!(r.restricted(&[1, 0], 1.0).is_err() || n < 2);
                assert!(r.restricted(&[n], 1.0).is_err());
                // the factor: positive and finite, and the scales it makes finite
                for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, -1.0] {
                    let e = r.restricted(&who, bad).unwrap_err();
                    assert!(matches!(&e, CoreError::InvalidArgument { name, .. } if name == "factor"), "{sp:?} factor {bad}: {e:?}");
                }
                let overflows = sc.iter().any(|s| !(s * 1e308).is_finite());
                match r.restricted(&who, 1e308) {
                    Err(CoreError::InvalidArgument { name, .. }) => assert!(overflows && name == "factor", "{sp:?}"),
                    other => assert!(!overflows && other.is_ok(), "{sp:?}"),
                }
            }
        }
        // PermK's scale n = 3 times 1e308 is inf (it used to give inf scales)
        let r = Round::new(&spec(PermK::default()), 3, 5, 0, 0).unwrap();
        let e = r.restricted(&[0, 1], 1e308).unwrap_err();
        assert_eq!(e.to_string(), "factor: worker 0's scale 3.0 times 1e308 overflows to inf");
    }

    #[test]
    fn a_round_ahead_is_the_round() {
        for sp in shared_specs() {
            for (n, d) in [(4, 10), (20, 7), (3, 7)] {
                if sp.check(n, d).is_err() {
                    continue;
                }
                let p = PendingRound::spawn(Arc::new(sp.clone()), n, d, 4, 9).unwrap();
                let got = p.wait().unwrap();
                let want = Round::new(&sp, n, d, 4, 9).unwrap();
                assert_eq!(got.assignment(), want.assignment());
                assert_eq!(got.offsets(), want.offsets());
                assert!(matches!(p.wait(), Err(CoreError::InvalidArgument { name, .. }) if name == "wait"));
            }
        }
        // errors: at once for bad arguments, at wait() for a panic; never waited: detached
        assert!(PendingRound::spawn(Arc::new(spec(TopK { k: 1 })), 3, 5, 0, 0).is_err());
        let p = PendingRound::start(|| panic!("boom")).unwrap();
        let e = p.wait().unwrap_err();
        assert!(matches!(&e, CoreError::Internal(m) if m.contains("boom")), "{e}");
        drop(PendingRound::spawn(Arc::new(spec(PermK::default())), 4, 100_000, 0, 0).unwrap());
    }
}
