//! The sparsifiers: which coordinates each worker sends, and the scale of the values.
//!
//! Each sparsifier is its own type implementing [`Sparsify`], in its own file of this
//! directory, and is listed once in the [`registry!`] invocation below, which generates the
//! [`Sparsifier`] enum (static dispatch), its name-based constructor and its forwarding
//! methods. Adding a sparsifier is: a new file `sparsify/<name>.rs` with a type implementing
//! [`Sparsify`], and one line `<name>::<Type>,` in the registry. Nothing else changes: the
//! Python glue passes `Spec(name, **params)` through [`Sparsifier::from_name`].

use std::fmt;

use ndarray::{Array1, ArrayView1, ArrayView2};

use crate::error::{CoreError, Result};
use crate::params::Params;
use crate::plan::{Assignment, Ranges, RoundPlan, Selection};
use crate::real::Real;

/// Estimated memory of a sparsifier's round in dimension `d` for `n` workers (bytes, except
/// the counts), for the memory guard of the entry points ([`crate::mem::Need`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// Bytes `assign` allocates (its compact form and its temporaries).
    pub assign: u128,
    /// Bytes the per-worker plan adds (`Assignment::into_plan`).
    pub plan: u128,
    /// The number of `(worker, coordinate)` pairs of a round (the CSR plan's length).
    pub coords: u128,
    /// The most coordinates one worker sends.
    pub worker_max: u128,
    /// Bytes of scratch a specialised aggregation kernel adds ([`Sparsify::aggregate_fast`]).
    pub scratch: u128,
}

impl Footprint {
    /// An owners assignment (every coordinate has one owner) of `d` coordinates.
    pub fn owners(n: usize, d: usize) -> Self {
        let (n, d) = (n as u128, d as u128);
        Footprint {
            assign: d * crate::plan::Owner::label_bytes(n as usize) + 4 * n,
            plan: 4 * d + 24 * n + 16,
            coords: d,
            worker_max: d,
            scratch: 0,
        }
    }

    /// A block plan of `n` workers over a partition of the `d` coordinates into `m` blocks;
    /// `listed` when the blocks are listed coordinates (not ranges); `worker_max` is the largest
    /// block.
    pub fn blocks(n: usize, d: usize, m: usize, listed: bool, worker_max: u128) -> Self {
        let (n128, d128, m128) = (n as u128, d as u128, m as u128);
        let q = (n / m.max(1)) as u128;
        Footprint {
            assign: 8 * n128 + 8 * (m128 + 1) + if listed { 4 * d128 + 8 * (m128 + 1) } else { 0 },
            plan: 0,
            coords: q * d128,
            worker_max,
            scratch: 0,
        }
    }
}

/// A sparsifier: one round's choice of coordinates and scales for `n` workers in dimension `d`.
///
/// Every method is a pure function of its arguments (the randomness of round `round` comes
/// from [`rng::stream`] of `(seed, purpose, worker)`), so every process and every thread count
/// computes the same assignment. The caller has checked `1 <= n, d < 2^32` and
/// [`Sparsify::check`] before calling anything else.
pub trait Sparsify: Sized + Clone + fmt::Debug + PartialEq + Send + Sync {
    /// The name `Spec(name, ...)` takes.
    const NAME: &'static str;
    /// The name in messages ("TopK").
    const TITLE: &'static str;
    /// The parameters [`Sparsify::from_params`] takes.
    const PARAMS: &'static [&'static str];

    /// Builds the sparsifier from its parameters, taking those it reads out of `params`.
    fn from_params(params: &mut Params) -> Result<Self>;

    /// Checks that the sparsifier is defined for `n` workers in dimension `d`.
    fn check(&self, _n: usize, _d: usize) -> Result<()> {
        Ok(())
    }

    /// Estimated memory of a round.
    fn footprint(&self, n: usize, d: usize) -> Footprint;

    /// The assignment of round `round`. A data-dependent sparsifier needs the inputs `data`
    /// (`(n, d)`); the others ignore them.
    fn assign<T: Real>(&self, n: usize, d: usize, seed: u64, round: u64, data: Option<ArrayView2<T>>) -> Result<Assignment>;

    /// The coordinates (in message order) and scale of one worker, whose input is `x` (needed
    /// only when data-dependent). Must equal `assign(...)`'s worker `worker`.
    fn select<T: Real>(&self, n: usize, d: usize, seed: u64, round: u64, worker: usize, x: Option<ArrayView1<T>>) -> Result<Selection> {
        let _ = x;
        self.assign::<T>(n, d, seed, round, None)?.worker(worker)
    }

    /// True when the coordinates depend on the inputs (no shared plan). Such a selection reads
    /// every value of its input and must report a non-finite one ([`CoreError::NonFinite`]):
    /// the shifted compression relies on it instead of checking the input itself.
    fn data_dependent(&self) -> bool {
        false
    }

    /// The plan of workers `start .. start + m` only (the plan's worker `r` is worker
    /// `start + r`); `data` are their `(m, d)` inputs (needed only when data-dependent). Each
    /// worker's coordinates and scale are those of [`Sparsify::select`]. The default selects
    /// worker by worker when data-dependent, else restricts the whole assignment's plan.
    #[allow(clippy::too_many_arguments)]
    fn assign_rows<T: Real>(&self, n: usize, d: usize, seed: u64, round: u64, start: usize, m: usize, data: Option<ArrayView2<T>>) -> Result<RoundPlan> {
        if self.data_dependent() {
            let a = data.ok_or_else(|| CoreError::invalid("A", "a data-dependent sparsifier needs the data to choose coordinates"))?;
            let mut sel = Vec::new();
            sel.try_reserve_exact(m).map_err(|_| crate::mem::alloc_error::<Selection>("the selections", &[m]))?;
            for r in 0..m {
                sel.push(self.select(n, d, seed, round, start + r, Some(a.row(r)))?);
            }
            return RoundPlan::from_selections(&sel, d);
        }
        self.assign::<T>(n, d, seed, round, None)?.into_plan(d)?.rows(start, start + m)
    }

    /// True when the sparsifier guarantees that every worker's coordinates form one range for
    /// `(n, d)` in every round: exactly when [`Sparsify::ranges`] returns `Some`.
    fn contiguous(&self, _n: usize, _d: usize) -> bool {
        false
    }

    /// Every worker's coordinates as one range when [`Sparsify::contiguous`]; `O(n)` work.
    /// `None` otherwise.
    fn ranges(&self, _n: usize, _d: usize, _seed: u64, _round: u64) -> Result<Option<Ranges>> {
        Ok(None)
    }

    /// A specialised `(1/n) Σ_i C_i(a_i)` without quantizer, bit for bit the generic one, or
    /// `None` (no such kernel, or a non-finite value: the generic path then reports it).
    fn aggregate_fast<T: Real>(&self, _a: ArrayView2<T>, _seed: u64, _round: u64) -> Result<Option<Array1<T>>> {
        Ok(None)
    }
}

/// The required `k` of a k-sparsifier (`name` says which, in the error when it is missing).
pub(crate) fn take_k(params: &mut Params, name: &str) -> Result<usize> {
    params.take_count("k", 1)?.ok_or_else(|| CoreError::invalid("k", format!("{name} needs k")))
}

/// A k-sparsifier fits `d` coordinates when `k ≤ d`.
pub(crate) fn check_k(k: usize, d: usize) -> Result<()> {
    if k > d {
        return Err(CoreError::invalid("k", format!("k = {k} is outside [1, d] with d = {d}")));
    }
    Ok(())
}

/// Declares the sparsifier modules and generates [`Sparsifier`]: one variant per type, the
/// constructor by name and the methods of [`Sparsify`] dispatched statically.
macro_rules! registry {
    ($($module:ident :: $ty:ident),+ $(,)?) => {
        $(pub mod $module;)+
        $(pub use $module::$ty;)+

        /// Every registered sparsifier.
        #[derive(Clone, Debug, PartialEq)]
        pub enum Sparsifier {
            $($ty($ty)),+
        }

        $(
            impl From<$ty> for Sparsifier {
                fn from(s: $ty) -> Self {
                    Sparsifier::$ty(s)
                }
            }
        )+

        impl Sparsifier {
            /// The registered names.
            pub const NAMES: &'static [&'static str] = &[$(<$ty as Sparsify>::NAME),+];

            /// The sparsifier called `name`, built from (and taking) its parameters.
            pub fn from_name(name: &str, params: &mut Params) -> Result<Self> {
                $(
                    if name == <$ty as Sparsify>::NAME {
                        return Ok(Sparsifier::$ty(<$ty as Sparsify>::from_params(params)?));
                    }
                )+
                Err(CoreError::invalid(
                    "sparsifier",
                    format!("unknown sparsifier {name:?} (known: {})", Self::NAMES.join(", ")),
                ))
            }

            pub fn name(&self) -> &'static str {
                match self { $(Sparsifier::$ty(_) => <$ty as Sparsify>::NAME),+ }
            }

            pub fn title(&self) -> &'static str {
                match self { $(Sparsifier::$ty(_) => <$ty as Sparsify>::TITLE),+ }
            }

            pub fn known_params(&self) -> &'static [&'static str] {
                match self { $(Sparsifier::$ty(_) => <$ty as Sparsify>::PARAMS),+ }
            }

            pub fn check(&self, n: usize, d: usize) -> Result<()> {
                match self { $(Sparsifier::$ty(s) => s.check(n, d)),+ }
            }

            pub fn footprint(&self, n: usize, d: usize) -> Footprint {
                match self { $(Sparsifier::$ty(s) => s.footprint(n, d)),+ }
            }

            pub fn assign<T: Real>(&self, n: usize, d: usize, seed: u64, round: u64, data: Option<ArrayView2<T>>) -> Result<Assignment> {
                match self { $(Sparsifier::$ty(s) => s.assign(n, d, seed, round, data)),+ }
            }

            #[allow(clippy::too_many_arguments)]
            pub fn select<T: Real>(&self, n: usize, d: usize, seed: u64, round: u64, worker: usize, x: Option<ArrayView1<T>>) -> Result<Selection> {
                match self { $(Sparsifier::$ty(s) => s.select(n, d, seed, round, worker, x)),+ }
            }

            pub fn data_dependent(&self) -> bool {
                match self { $(Sparsifier::$ty(s) => s.data_dependent()),+ }
            }

            #[allow(clippy::too_many_arguments)]
            pub fn assign_rows<T: Real>(&self, n: usize, d: usize, seed: u64, round: u64, start: usize, m: usize, data: Option<ArrayView2<T>>) -> Result<RoundPlan> {
                match self { $(Sparsifier::$ty(s) => s.assign_rows(n, d, seed, round, start, m, data)),+ }
            }

            pub fn contiguous(&self, n: usize, d: usize) -> bool {
                match self { $(Sparsifier::$ty(s) => s.contiguous(n, d)),+ }
            }

            pub fn ranges(&self, n: usize, d: usize, seed: u64, round: u64) -> Result<Option<Ranges>> {
                match self { $(Sparsifier::$ty(s) => s.ranges(n, d, seed, round)),+ }
            }

            pub fn aggregate_fast<T: Real>(&self, a: ArrayView2<T>, seed: u64, round: u64) -> Result<Option<Array1<T>>> {
                match self { $(Sparsifier::$ty(s) => s.aggregate_fast(a, seed, round)),+ }
            }
        }
    };
}

// The registry: one line per sparsifier (`module::Type`).
registry! {
    identity::Identity,
    permk::PermK,
    randk::RandK,
    topk::TopK,
    blockpermk::BlockPermK,
    coordinate_sampling::CoordinateSampling,
}
