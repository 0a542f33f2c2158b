//! PermK: Definitions 1 and 2 and their general forms (appendix "General Examples of PermK").
//!
//! For `d >= n` (`d = kn + r`) one shared permutation of the coordinates gives every worker
//! `k` of them and a second permutation of the workers hands out the `r` leftovers; values
//! are scaled by `n`. For `n > d` it is the block permutation compressor with the `d`
//! singleton blocks.

use ndarray::{Array1, ArrayView2};
use rand_chacha::ChaCha8Rng;

use super::{Footprint, Sparsify};
use crate::error::Result;
use crate::params::Params;
use crate::plan::{self, with_owner, Assignment, Blocks, CsrArrays, Owner, Ranges, RoundPlan};
use crate::real::Real;
use crate::rng::{self, permutation, Purpose, SHARED};
use crate::{kernels, mem};

#[derive(Clone, Debug, PartialEq)]
pub struct PermK;

impl Sparsify for PermK {
    const NAME: &'static str = "permk";
    const TITLE: &'static str = "PermK";
    const PARAMS: &'static [&'static str] = &[];

    fn from_params(_params: &mut Params) -> Result<Self> {
        Ok(PermK)
    }

    fn footprint(&self, n: usize, d: usize) -> Footprint {
        if d >= n {
            Footprint { worker_max: d.div_ceil(n) as u128, ..Footprint::owners(n, d) }
        } else {
            Footprint::blocks(n, d, d, false, 1)
        }
    }

    fn assign<T: Real>(&self, n: usize, d: usize, seed: u64, round: u64, _data: Option<ArrayView2<T>>) -> Result<Assignment> {
        if d >= n {
            return Ok(Assignment::Owners { owner: owners(seed, round, n, d)?, n, scale: n as f64 });
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
        // below the parallel gather's threshold, overlapping the shuffle with the reads wins
        if d >= n && d < kernels::OWNERS_PAR_THRESHOLD {
            let (mut rng, owner) = labels(seed, round, n, d)?;
            return with_owner!(owner, mut v => kernels::owners_fused(a, &mut rng, &mut v));
        }
        Ok(None)
    }
}

/// PermK for `d >= n` (`d = kn + r`), sampled as the general definition says: the owner of
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
