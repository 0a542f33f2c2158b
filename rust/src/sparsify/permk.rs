//! PermK: Definitions 1 and 2 and their general forms (appendix "General Examples of PermK").
//!
//! For `d >= n` (`d = kn + r`) every worker owns `k` coordinates and `r` workers (uniform) one
//! more, the assignment uniformly random among those with these counts; values are scaled by
//! `n`. Two samplers draw it, with the same distribution and different streams:
//! [`Sampler::Rebalance`] (the default: independent owners, rebalanced, in coordinate order;
//! [`crate::balanced`]) and [`Sampler::Shuffle`] (the definition's permutations, a
//! Fisher–Yates shuffle of the `d` labels; PermK's only stream before the rebalancing sampler).
//! For `n > d` it is the block permutation compressor with the `d` singleton blocks, whatever
//! the sampler.

use ndarray::{Array1, ArrayView2};
use rand_chacha::ChaCha8Rng;

use super::{Footprint, Sparsify};
use crate::error::{CoreError, Result};
use crate::params::Params;
use crate::plan::{self, with_owner, Assignment, Blocks, CsrArrays, Owner, Ranges, RoundPlan};
use crate::real::Real;
use crate::rng::{self, permutation, Purpose, SHARED};
use crate::{balanced, kernels, mem};

/// How PermK draws a round's owners for `d >= n` (the same distribution, different streams).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Sampler {
    /// Independent owners in chunks, rebalanced to the counts ([`crate::balanced`]): about
    /// `log2 n` random bits per coordinate, streaming memory access, on the pool's threads.
    #[default]
    Rebalance,
    /// A Fisher–Yates shuffle of the labels `L` ([`owners`]): `d` bounded draws at random
    /// positions of the labels.
    Shuffle,
}

impl Sampler {
    /// The names `Spec("permk", sampler=...)` takes.
    pub const NAMES: &'static [&'static str] = &["rebalance", "shuffle"];

    pub fn name(self) -> &'static str {
        match self {
            Sampler::Rebalance => "rebalance",
            Sampler::Shuffle => "shuffle",
        }
    }

    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "rebalance" => Ok(Sampler::Rebalance),
            "shuffle" => Ok(Sampler::Shuffle),
            other => Err(CoreError::invalid("sampler", format!("unknown PermK sampler {other:?} (known: {})", Self::NAMES.join(", ")))),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PermK {
    pub sampler: Sampler,
}

impl PermK {
    /// PermK with the default sampler ([`Sampler::Rebalance`]).
    pub const REBALANCE: PermK = PermK { sampler: Sampler::Rebalance };
    /// PermK with the shuffle of the labels ([`Sampler::Shuffle`]).
    pub const SHUFFLE: PermK = PermK { sampler: Sampler::Shuffle };
}

impl Sparsify for PermK {
    const NAME: &'static str = "permk";
    const TITLE: &'static str = "PermK";
    const PARAMS: &'static [&'static str] = &["sampler"];

    fn from_params(params: &mut Params) -> Result<Self> {
        let sampler = match params.take_str("sampler")? {
            None => Sampler::default(),
            Some(name) => Sampler::from_name(&name)?,
        };
        Ok(PermK { sampler })
    }

    fn footprint(&self, n: usize, d: usize) -> Footprint {
        if d >= n {
            let base = Footprint { worker_max: d.div_ceil(n) as u128, ..Footprint::owners(n, d) };
            match self.sampler {
                Sampler::Rebalance => Footprint { assign: base.assign + balanced::scratch_bytes(n, d), ..base },
                Sampler::Shuffle => base,
            }
        } else {
            Footprint::blocks(n, d, d, false, 1)
        }
    }

    fn assign<T: Real>(&self, n: usize, d: usize, seed: u64, round: u64, _data: Option<ArrayView2<T>>) -> Result<Assignment> {
        if d >= n {
            let (owner, sizes) = match self.sampler {
                Sampler::Rebalance => {
                    let (owner, sizes) = balanced::owners(seed, round, n, d)?;
                    (owner, Some(sizes))
                }
                Sampler::Shuffle => (owners(seed, round, n, d)?, None),
            };
            return Ok(Assignment::Owners { owner, n, scale: n as f64, sizes });
        }
        let pi = permutation(&mut rng::stream(seed, Purpose::Permutation, SHARED, round), n)?;
        let bounds = mem::collect("the blocks", d + 1, 0..=d)?;
        Ok(Assignment::Plan(plan::block_plan(n, Blocks::Ranges(bounds), pi)?))
    }

    fn contiguous(&self, n: usize, d: usize) -> bool {
        n == 1 || d <= n
    }

    fn ranges(&self, n: usize, d: usize, seed: u64, round: u64) -> Result<Option<Ranges>> {
        if !self.contiguous(n, d) {
            return Ok(None);
        }
        if n == 1 {
            return Ok(Some(Ranges::full(1, d, 1.0)?));
        }
        // one coordinate per worker at most: O(n) work
        let asg = self.assign::<f64>(n, d, seed, round, None)?;
        match asg {
            Assignment::Owners { .. } => asg.owner_ranges(),
            _ => asg.block_ranges(),
        }
    }

    fn aggregate_fast<T: Real>(&self, a: ArrayView2<T>, seed: u64, round: u64) -> Result<Option<Array1<T>>> {
        let (n, d) = a.dim();
        // the shuffle below the parallel gather's threshold: overlapping it with the reads wins
        // (the rebalancing sampler's owners take the generic owners kernel)
        if self.sampler == Sampler::Shuffle && d >= n && d < kernels::OWNERS_PAR_THRESHOLD {
            let (mut rng, owner) = labels(seed, round, n, d)?;
            return with_owner!(owner, mut v => kernels::owners_fused(a, &mut rng, &mut v));
        }
        Ok(None)
    }
}

/// PermK's [`Sampler::Shuffle`] for `d >= n` (`d = kn + r`), sampled as the general definition says: the owner of
/// coordinate `j` is `L[σ(j)]` with `L = (0^k, 1^k, …, (n−1)^k, τ_0, …, τ_{r−1})`, `σ` a
/// uniform permutation of the coordinates (a Fisher–Yates shuffle of `L` in place) and `τ` a
/// uniform permutation of the workers (drawn first, only when `r > 0`). This is exactly
/// [`plan_wide`] with `pi_d = σ⁻¹` and `pi_n = τ⁻¹` (uniform too), without inverting.
/// The shuffle's draws depend only on `d`, not on the label type.
pub fn owners(seed: u64, round: u64, n: usize, d: usize) -> Result<Owner> {
    let (mut rng, owner) = labels(seed, round, n, d)?;
    Ok(with_owner!(owner, mut v => {
        rng::shuffle(&mut rng, &mut v);
        v.into()
    }))
}

/// The stream of PermK's round (after `τ`) and the labels `L` before the shuffle.
fn labels(seed: u64, round: u64, n: usize, d: usize) -> Result<(ChaCha8Rng, Owner)> {
    let k = d / n;
    let r = d % n;
    let mut rng = rng::stream(seed, Purpose::Permutation, SHARED, round);
    let tau = if r > 0 { permutation(&mut rng, n)? } else { Vec::new() };
    let owner = Owner::build(n, d, |j| if j < k * n { j / k } else { tau[j - k * n] as usize })?;
    Ok((rng, owner))
}

/// PermK for `d >= n` (general form, `d = kn + r`) from its two permutations: worker `i` gets
/// `pi_d[ik .. (i+1)k]` and, when `pi_n[i] < r`, the leftover `pi_d[kn + pi_n[i]]`; scale `n`.
/// With `r = 0` this is Definition 1 and `pi_n` is not used.
pub fn plan_wide(n: usize, d: usize, pi_d: &[u32], pi_n: &[u32]) -> Result<RoundPlan> {
    let k = d / n;
    let r = d % n;
    let mut offsets = mem::vec("the plan's offsets", n + 1)?;
    let mut coords = mem::vec("the plan's coordinates", d)?;
    offsets.push(0);
    for i in 0..n {
        coords.extend_from_slice(&pi_d[i * k..(i + 1) * k]);
        if r > 0 && (pi_n[i] as usize) < r {
            coords.push(pi_d[k * n + pi_n[i] as usize]);
        }
        offsets.push(coords.len());
    }
    Ok(RoundPlan::Csr { offsets, coords, scales: mem::filled("the plan's scales", n, n as f64)? })
}

/// [`plan_wide`] from explicit permutations, validated (lengths first), as numpy-ready arrays:
/// the exact enumeration of the tests.
pub fn plan_from_permutations(n: usize, d: usize, pi_d: &[u32], pi_n: &[u32]) -> Result<CsrArrays> {
    if n == 0 || d < n {
        return Err(crate::error::CoreError::invalid("n", format!("needs 1 <= n <= d, got n = {n}, d = {d}")));
    }
    plan::check_permutation(pi_d, d, "pi_d")?;
    plan::check_permutation(pi_n, n, "pi_n")?;
    mem::Need::new().bytes("the plan", 20 * d as u128 + 24 * n as u128).check()?;
    plan_wide(n, d, pi_d, pi_n)?.csr_arrays(d)
}
