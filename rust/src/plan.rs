//! A round's assignment of coordinates to workers and its plan forms.
//!
//! A sparsifier's [`Assignment`] is the compact form its kernels use; [`RoundPlan`] is the
//! per-worker form every path can read ([`RoundPlan::worker`]); [`CsrArrays`] and [`Ranges`]
//! are the numpy-ready forms of `Spec.plan` and `Spec.plan_ranges`.

use crate::error::{CoreError, Result};
use crate::mem;

/// An idle slot of [`RoundPlan::Blocks`].
pub const IDLE: u32 = u32::MAX;

/// The coordinates one worker sends, in message order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Coords<'a> {
    /// Every coordinate `0..d`.
    All,
    /// These coordinates.
    List(&'a [u32]),
    /// The coordinates `start..stop`, increasing.
    Range(usize, usize),
}

impl Coords<'_> {
    pub fn len(&self, d: usize) -> usize {
        match *self {
            Coords::All => d,
            Coords::List(c) => c.len(),
            Coords::Range(a, b) => b - a,
        }
    }

    /// Calls `f(j)` for every coordinate in message order, stopping at the first error.
    #[inline]
    pub fn try_for_each<E>(self, d: usize, mut f: impl FnMut(usize) -> std::result::Result<(), E>) -> std::result::Result<(), E> {
        match self {
            Coords::All => (0..d).try_for_each(f),
            Coords::List(c) => c.iter().try_for_each(|&j| f(j as usize)),
            Coords::Range(a, b) => (a..b).try_for_each(f),
        }
    }

    /// Calls `f(j)` for every coordinate in message order.
    #[inline]
    pub fn for_each(self, d: usize, mut f: impl FnMut(usize)) {
        let _ = self.try_for_each::<()>(d, |j| {
            f(j);
            Ok(())
        });
    }
}

/// [`Coords`] owning its list.
#[derive(Clone, Debug, PartialEq)]
pub enum OwnedCoords {
    All,
    List(Vec<u32>),
    Range(usize, usize),
}

impl OwnedCoords {
    pub fn as_coords(&self) -> Coords<'_> {
        match self {
            OwnedCoords::All => Coords::All,
            OwnedCoords::List(c) => Coords::List(c),
            OwnedCoords::Range(a, b) => Coords::Range(*a, *b),
        }
    }
}

/// One worker's coordinates and scale.
pub type Selection = (OwnedCoords, f64);

/// The blocks of a block permutation plan.
#[derive(Clone, Debug, PartialEq)]
pub enum Blocks {
    /// Block `b` is the range `bounds[b]..bounds[b + 1]` (`bounds` increasing from 0 to `d`).
    Ranges(Vec<usize>),
    /// Block `b` is `coords[offsets[b]..offsets[b + 1]]` (increasing within a block).
    Listed { offsets: Vec<usize>, coords: Vec<u32> },
}

impl Blocks {
    pub fn m(&self) -> usize {
        match self {
            Blocks::Ranges(bounds) => bounds.len() - 1,
            Blocks::Listed { offsets, .. } => offsets.len() - 1,
        }
    }

    #[inline]
    pub fn block(&self, b: usize) -> Coords<'_> {
        match self {
            Blocks::Ranges(bounds) => Coords::Range(bounds[b], bounds[b + 1]),
            Blocks::Listed { offsets, coords } => Coords::List(&coords[offsets[b]..offsets[b + 1]]),
        }
    }
}

/// The coordinates and scale of every worker in one round.
#[derive(Clone, Debug, PartialEq)]
pub enum RoundPlan {
    /// Every worker sends every coordinate unscaled.
    All { n: usize },
    /// Worker `i` sends `coords[offsets[i]..offsets[i + 1]]`, each value multiplied by `scales[i]`.
    Csr { offsets: Vec<usize>, coords: Vec<u32>, scales: Vec<f64> },
    /// Worker `i` sends block `slot_block[pi[i]]` (none when it is `IDLE`), scaled by `scale`:
    /// the block permutation compressors, indexed without copying the blocks out per worker.
    Blocks { pi: Vec<u32>, slot_block: Vec<u32>, blocks: Blocks, scale: f64 },
}

/// A plan as numpy-ready CSR arrays: worker `i` sends `coords[offsets[i]..offsets[i + 1]]`
/// scaled by `scales[i]`.
#[derive(Clone, Debug, PartialEq)]
pub struct CsrArrays {
    pub offsets: Vec<i64>,
    pub coords: Vec<i64>,
    pub scales: Vec<f64>,
}

/// Every worker's coordinates as one range `starts[i]..stops[i]` (empty for an idle worker),
/// scaled by `scales[i]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Ranges {
    pub starts: Vec<i64>,
    pub stops: Vec<i64>,
    pub scales: Vec<f64>,
}

impl Ranges {
    /// `n` idle workers with scale `scale`, to be filled in.
    pub fn idle(n: usize, scale: f64) -> Result<Self> {
        Ok(Ranges {
            starts: mem::filled("the range starts", n, 0)?,
            stops: mem::filled("the range stops", n, 0)?,
            scales: mem::filled("the scales", n, scale)?,
        })
    }

    /// `n` workers that each send all of `0..d` with scale `scale`.
    pub fn full(n: usize, d: usize, scale: f64) -> Result<Self> {
        let mut r = Ranges::idle(n, scale)?;
        r.stops.fill(d as i64);
        Ok(r)
    }

    /// The bytes of the ranges of `n` workers.
    pub fn bytes(n: usize) -> u128 {
        24 * n as u128
    }
}

impl RoundPlan {
    pub fn n(&self) -> usize {
        match self {
            RoundPlan::All { n } => *n,
            RoundPlan::Csr { scales, .. } => scales.len(),
            RoundPlan::Blocks { pi, .. } => pi.len(),
        }
    }

    /// The block worker `i` sends (`None` when idle) in a block plan.
    #[inline]
    pub fn block_of(pi: &[u32], slot_block: &[u32], i: usize) -> Option<usize> {
        match slot_block[pi[i] as usize] {
            IDLE => None,
            b => Some(b as usize),
        }
    }

    /// The coordinates and scale of worker `i`.
    #[inline]
    pub fn worker(&self, i: usize) -> (Coords<'_>, f64) {
        match self {
            RoundPlan::All { .. } => (Coords::All, 1.0),
            RoundPlan::Csr { offsets, coords, scales } => (Coords::List(&coords[offsets[i]..offsets[i + 1]]), scales[i]),
            RoundPlan::Blocks { pi, slot_block, blocks, scale } => match Self::block_of(pi, slot_block, i) {
                None => (Coords::List(&[]), *scale),
                Some(b) => (blocks.block(b), *scale),
            },
        }
    }

    /// The plan of workers `start..stop` only (its worker `r` is worker `start + r`).
    pub fn rows(self, start: usize, stop: usize) -> Result<RoundPlan> {
        if start > stop || stop > self.n() {
            return Err(CoreError::invalid("start", format!("workers {start}..{stop} are outside [0, {}]", self.n())));
        }
        if start == 0 && stop == self.n() {
            return Ok(self);
        }
        Ok(match self {
            RoundPlan::All { .. } => RoundPlan::All { n: stop - start },
            RoundPlan::Csr { offsets, coords, scales } => {
                let base = offsets[start];
                RoundPlan::Csr {
                    offsets: mem::collect("the plan's offsets", stop - start + 1, offsets[start..=stop].iter().map(|&o| o - base))?,
                    coords: mem::copy("the plan's coordinates", &coords[base..offsets[stop]])?,
                    scales: mem::copy("the plan's scales", &scales[start..stop])?,
                }
            }
            RoundPlan::Blocks { pi, slot_block, blocks, scale } => {
                RoundPlan::Blocks { pi: mem::copy("the permutation", &pi[start..stop])?, slot_block, blocks, scale }
            }
        })
    }

    /// The CSR plan of explicit per-worker selections.
    pub fn from_selections(sel: &[Selection], d: usize) -> Result<RoundPlan> {
        let total = sel.iter().map(|(c, _)| c.as_coords().len(d)).sum();
        let mut offsets = mem::vec("the plan's offsets", sel.len() + 1)?;
        let mut coords = mem::vec("the plan's coordinates", total)?;
        offsets.push(0);
        for (c, _) in sel {
            c.as_coords().for_each(d, |j| coords.push(j as u32));
            offsets.push(coords.len());
        }
        let scales = mem::collect("the plan's scales", sel.len(), sel.iter().map(|s| s.1))?;
        Ok(RoundPlan::Csr { offsets, coords, scales })
    }

    /// The total number of coordinates sent in dimension `d`.
    pub fn total(&self, d: usize) -> usize {
        (0..self.n()).map(|i| self.worker(i).0.len(d)).sum()
    }

    /// The plan as numpy-ready [`CsrArrays`] for dimension `d`.
    pub fn csr_arrays(&self, d: usize) -> Result<CsrArrays> {
        let n = self.n();
        let mut offsets = mem::vec("the plan's offsets", n + 1)?;
        let mut coords = mem::vec("the plan's coordinates", self.total(d))?;
        let mut scales = mem::vec("the plan's scales", n)?;
        offsets.push(0);
        for i in 0..n {
            let (c, s) = self.worker(i);
            c.for_each(d, |j| coords.push(j as i64));
            offsets.push(coords.len() as i64);
            scales.push(s);
        }
        Ok(CsrArrays { offsets, coords, scales })
    }
}

/// The block permutation plan from its permutation `pi` of the workers: with `n = mq + r`,
/// worker `i` is idle when `pi[i] >= mq` and otherwise sends block `pi[i] / q` scaled by
/// `n/q`. PermK for `n > d` is this with the `d` singleton blocks.
pub fn block_plan(n: usize, blocks: Blocks, pi: Vec<u32>) -> Result<RoundPlan> {
    let m = blocks.m();
    if m == 0 || m > n || pi.len() != n {
        return Err(CoreError::invalid("m", format!("a block plan needs 1 <= m <= n, got m = {m} blocks for n = {n} workers")));
    }
    let q = n / m;
    // slot s holds block s / q (s < mq) or nothing: filled block by block, without a division
    let mut slot_block = mem::filled("the block slots", n, IDLE)?;
    for (b, slots) in slot_block[..m * q].chunks_exact_mut(q).enumerate() {
        slots.fill(b as u32);
    }
    Ok(RoundPlan::Blocks { pi, slot_block, blocks, scale: n as f64 / q as f64 })
}

/// The owner of every coordinate in the narrowest integer type that holds the workers'
/// indices: shuffles and aggregation passes then touch less memory.
#[derive(Clone, Debug, PartialEq)]
pub enum Owner {
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
}

/// An owner label: an unsigned integer type holding worker indices.
pub trait Label: Copy + Send + Sync + PartialEq + 'static {
    fn idx(self) -> usize;
    /// The label of worker `i` (which the type must hold).
    fn of(i: usize) -> Self;

    /// Bit `t` set where `block[t] == w` (`block` at most 64 labels; panics otherwise in
    /// debug builds, and ignores labels beyond 64 in release builds).
    #[inline(always)]
    fn eq_mask(block: &[Self], w: Self) -> u64 {
        debug_assert!(block.len() <= 64);
        let mut m = 0u64;
        for (t, &o) in block.iter().take(64).enumerate() {
            m |= ((o == w) as u64) << t;
        }
        m
    }
}
macro_rules! label {
    ($($t:ty),*) => {$(
        impl Label for $t {
            #[inline(always)]
            fn idx(self) -> usize {
                self as usize
            }
            #[inline(always)]
            fn of(i: usize) -> Self {
                i as $t
            }
        }
    )*};
}
label!(u16, u32);

impl Label for u8 {
    #[inline(always)]
    fn idx(self) -> usize {
        self as usize
    }
    #[inline(always)]
    fn of(i: usize) -> Self {
        i as u8
    }

    /// 64 labels: four SSE2 byte comparisons and their sign masks.
    #[inline(always)]
    fn eq_mask(block: &[u8], w: u8) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if block.len() == 64 {
            use core::arch::x86_64::{_mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_set1_epi8, __m128i};
            // SAFETY: SSE2 is part of every x86_64 target; the four unaligned 16-byte loads read
            // bytes 0..64 of `block`, which has 64.
            #[allow(unused_unsafe)]
            return unsafe {
                let v = _mm_set1_epi8(w as i8);
                let p = block.as_ptr() as *const __m128i;
                let m = |k: usize| _mm_movemask_epi8(_mm_cmpeq_epi8(_mm_loadu_si128(p.add(k)), v)) as u16 as u64;
                m(0) | m(1) << 16 | m(2) << 32 | m(3) << 48
            };
        }
        debug_assert!(block.len() <= 64);
        let mut m = 0u64;
        for (t, &o) in block.iter().take(64).enumerate() {
            m |= ((o == w) as u64) << t;
        }
        m
    }
}

/// Labels of at most this many workers are counted value by value ([`count_labels`]).
const COUNT_BY_VALUE: usize = 4;
/// Labels of at most this many workers are counted into four interleaved histograms.
const COUNT_INTERLEAVED: usize = 256;

/// Adds the number of labels `i` in `v` to `counts[i]` (every label below `counts.len()`).
///
/// A histogram's increments of one counter wait for each other (a store-to-load chain of
/// several cycles), which bounds it when consecutive labels are often equal (few workers): up
/// to [`COUNT_BY_VALUE`] workers are counted value by value (one vectorised comparison pass
/// each), up to [`COUNT_INTERLEAVED`] into four histograms taking every fourth label.
pub fn count_labels<L: Label>(v: &[L], counts: &mut [usize]) {
    let n = counts.len();
    if n <= COUNT_BY_VALUE {
        for (i, c) in counts.iter_mut().enumerate() {
            let li = L::of(i);
            // u32 lanes, in blocks that cannot overflow them
            *c += v.chunks(1 << 20).map(|b| b.iter().map(|&l| (l == li) as u32).sum::<u32>() as usize).sum::<usize>();
        }
    } else if n <= COUNT_INTERLEAVED {
        let mut h = [[0u32; COUNT_INTERLEAVED]; 4];
        for block in v.chunks(1 << 30) {
            let quads = block.chunks_exact(4);
            for &l in quads.remainder() {
                h[0][l.idx()] += 1;
            }
            for q in quads {
                h[0][q[0].idx()] += 1;
                h[1][q[1].idx()] += 1;
                h[2][q[2].idx()] += 1;
                h[3][q[3].idx()] += 1;
            }
            for (i, c) in counts.iter_mut().enumerate() {
                *c += (h[0][i] + h[1][i] + h[2][i] + h[3][i]) as usize;
            }
            h = [[0u32; COUNT_INTERLEAVED]; 4];
        }
    } else {
        for &l in v {
            counts[l.idx()] += 1;
        }
    }
}

/// Runs `$body` with `$v` bound to the owner vector, whatever its integer type, and `$L` to
/// the label type (to build a new vector of it).
#[macro_export]
#[doc(hidden)]
macro_rules! with_owner {
    ($owner:expr, mut $v:ident => $body:expr) => {
        match $owner {
            $crate::plan::Owner::U8(mut $v) => $body,
            $crate::plan::Owner::U16(mut $v) => $body,
            $crate::plan::Owner::U32(mut $v) => $body,
        }
    };
    ($owner:expr, $v:ident => $body:expr) => {
        match $owner {
            $crate::plan::Owner::U8($v) => $body,
            $crate::plan::Owner::U16($v) => $body,
            $crate::plan::Owner::U32($v) => $body,
        }
    };
}
pub use with_owner;

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

impl Owner {
    /// The bytes of one label for `n` workers.
    pub fn label_bytes(n: usize) -> u128 {
        if n <= 1 << 8 {
            1
        } else if n <= 1 << 16 {
            2
        } else {
            4
        }
    }

    /// `len` labels for `n` workers (`n <= 2^32`), the `j`-th from `label(j)`, in the
    /// narrowest type.
    pub fn build(n: usize, len: usize, mut label: impl FnMut(usize) -> usize) -> Result<Self> {
        fn go<L: Label>(len: usize, label: &mut impl FnMut(usize) -> usize) -> Result<Vec<L>> {
            mem::collect("the coordinates' owners", len, (0..len).map(|j| L::of(label(j))))
        }
        Ok(if n <= 1 << 8 {
            Owner::U8(go(len, &mut label)?)
        } else if n <= 1 << 16 {
            Owner::U16(go(len, &mut label)?)
        } else {
            Owner::U32(go(len, &mut label)?)
        })
    }
}

/// A round's assignment of coordinates to workers in the compact forms the kernels use
/// ([`RoundPlan`] is its per-worker form, [`Assignment::into_plan`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Assignment {
    /// Coordinate `j` is sent by worker `owner[j]` alone, scaled by `scale` (PermK for
    /// `d >= n`, CoordinateSampling); each worker lists its coordinates in increasing order.
    /// `sizes`: each worker's number of coordinates when the sampler knows them (else they are
    /// counted from `owner` when needed).
    Owners { owner: Owner, n: usize, scale: f64, sizes: Option<Vec<usize>> },
    /// Any other assignment, as a plan.
    Plan(RoundPlan),
}

impl Assignment {
    /// The CSR offsets of an owners assignment: worker `i` has `offsets[i]..offsets[i + 1]`
    /// (from the workers' `sizes` when known, else counted).
    pub(crate) fn owner_offsets<L: Label>(v: &[L], n: usize, sizes: Option<&[usize]>) -> Result<Vec<usize>> {
        let mut offsets = mem::filled("the plan's offsets", n + 1, 0usize)?;
        match sizes {
            Some(s) if s.len() == n => offsets[1..].copy_from_slice(s),
            _ => count_labels(v, &mut offsets[1..]),
        }
        for i in 0..n {
            offsets[i + 1] += offsets[i];
        }
        Ok(offsets)
    }

    /// The plan. Owners list each worker's coordinates in increasing order.
    pub fn into_plan(self, d: usize) -> Result<RoundPlan> {
        match self {
            Assignment::Owners { owner, n, scale, sizes } => {
                let (offsets, coords) = with_owner!(&owner, v => {
                    let offsets = Self::owner_offsets(v, n, sizes.as_deref())?;
                    let mut coords = mem::filled("the plan's coordinates", d, 0u32)?;
                    let mut fill = mem::copy("the plan's offsets", &offsets[..n])?;
                    for (j, &o) in v.iter().enumerate() {
                        coords[fill[o.idx()]] = j as u32;
                        fill[o.idx()] += 1;
                    }
                    (offsets, coords)
                });
                Ok(RoundPlan::Csr { offsets, coords, scales: mem::filled("the plan's scales", n, scale)? })
            }
            Assignment::Plan(p) => Ok(p),
        }
    }

    /// The coordinates (in plan order) and scale of worker `w`, as [`Self::into_plan`] has them.
    pub fn worker(&self, w: usize) -> Result<Selection> {
        match self {
            Assignment::Owners { owner, scale, .. } => {
                let mut c = Vec::new();
                with_owner!(owner, v => {
                    for (j, &o) in v.iter().enumerate() {
                        if o.idx() == w {
                            c.try_reserve(1).map_err(|_| mem::alloc_error::<u32>("the worker's coordinates", &[c.len() + 1]))?;
                            c.push(j as u32);
                        }
                    }
                });
                Ok((OwnedCoords::List(c), *scale))
            }
            Assignment::Plan(p) => {
                let (c, s) = p.worker(w);
                Ok((
                    match c {
                        Coords::All => OwnedCoords::All,
                        Coords::Range(a, b) => OwnedCoords::Range(a, b),
                        Coords::List(c) => OwnedCoords::List(mem::copy("the worker's coordinates", c)?),
                    },
                    s,
                ))
            }
        }
    }

    /// The numpy-ready CSR arrays of the plan, without an intermediate plan.
    pub fn csr_arrays(&self, d: usize) -> Result<CsrArrays> {
        match self {
            Assignment::Owners { owner, n, scale, sizes } => {
                let n = *n;
                with_owner!(owner, v => {
                    let offsets = Self::owner_offsets(v, n, sizes.as_deref())?;
                    let mut coords = mem::filled("the plan's coordinates", d, 0i64)?;
                    let mut fill = mem::copy("the plan's offsets", &offsets[..n])?;
                    for (j, &o) in v.iter().enumerate() {
                        coords[fill[o.idx()]] = j as i64;
                        fill[o.idx()] += 1;
                    }
                    drop(fill);
                    Ok(CsrArrays {
                        offsets: mem::collect("the plan's offsets", n + 1, offsets.iter().map(|&o| o as i64))?,
                        coords,
                        scales: mem::filled("the plan's scales", n, *scale)?,
                    })
                })
            }
            Assignment::Plan(p) => p.csr_arrays(d),
        }
    }

    /// One range per worker from an owners assignment, when every worker's coordinates form
    /// one range (e.g. each worker owns at most one coordinate); `None` otherwise. `O(n + d)`.
    pub fn owner_ranges(&self) -> Result<Option<Ranges>> {
        let Assignment::Owners { owner, n, scale, .. } = self else { return Ok(None) };
        let mut r = Ranges::idle(*n, *scale)?;
        let mut ok = true;
        with_owner!(owner, v => {
            for (j, &o) in v.iter().enumerate() {
                let i = o.idx();
                if r.starts[i] == r.stops[i] {
                    r.starts[i] = j as i64;
                    r.stops[i] = j as i64 + 1;
                } else if r.stops[i] == j as i64 {
                    r.stops[i] += 1;
                } else {
                    ok = false;
                }
            }
        });
        Ok(ok.then_some(r))
    }

    /// The ranges of a block plan whose blocks are ranges.
    pub fn block_ranges(&self) -> Result<Option<Ranges>> {
        let Assignment::Plan(RoundPlan::Blocks { pi, slot_block, blocks: Blocks::Ranges(bounds), scale }) = self else {
            return Ok(None);
        };
        let mut r = Ranges::idle(pi.len(), *scale)?;
        for i in 0..pi.len() {
            if let Some(b) = RoundPlan::block_of(pi, slot_block, i) {
                r.starts[i] = bounds[b] as i64;
                r.stops[i] = bounds[b + 1] as i64;
            }
        }
        Ok(Some(r))
    }
}

/// Checks that `p` is a permutation of `0..len` (its length first, so nothing scales with a
/// wrong `len`).
pub fn check_permutation(p: &[u32], len: usize, name: &str) -> Result<()> {
    let bad = || CoreError::invalid(name, format!("must be a permutation of range({len})"));
    if p.len() != len {
        return Err(CoreError::invalid(name, format!("must be a permutation of range({len}), got {} entries", p.len())));
    }
    let mut seen = mem::filled(name, len, false)?;
    for &v in p {
        match seen.get_mut(v as usize) {
            Some(s) if !*s => *s = true,
            _ => return Err(bad()),
        }
    }
    Ok(())
}
