//! Coordinate sampling (the authors' `coordinate_sampling`): every coordinate `j` is sent by
//! one worker drawn independently and uniformly from `0..n` (a stream shared by all workers,
//! [`Purpose::CoordinateSampling`]), scaled by `n`. Unbiased: `E[C_i(x)] = n·(1/n)·x = x`.
//! An owners assignment like PermK for `d >= n`, for any `n, d >= 1`.

use ndarray::ArrayView2;

use super::{Footprint, Sparsify};
use crate::error::Result;
use crate::params::Params;
use crate::plan::{Assignment, Owner, Ranges};
use crate::real::Real;
use crate::rng::{self, Purpose, SHARED};

#[derive(Clone, Debug, PartialEq)]
pub struct CoordinateSampling;

/// The owner of every coordinate in round `round`: `d` independent uniform draws from `0..n`
/// in coordinate order (none when `n = 1`).
pub fn owners(seed: u64, round: u64, n: usize, d: usize) -> Result<Owner> {
    let mut rng = rng::stream(seed, Purpose::CoordinateSampling, SHARED, round);
    Owner::build(n, d, |_| if n == 1 { 0 } else { rng::below_inclusive(&mut rng, n - 1) })
}

impl Sparsify for CoordinateSampling {
    const NAME: &'static str = "coordinate_sampling";
    const TITLE: &'static str = "CoordinateSampling";
    const PARAMS: &'static [&'static str] = &[];

    fn from_params(_params: &mut Params) -> Result<Self> {
        Ok(CoordinateSampling)
    }

    fn footprint(&self, n: usize, d: usize) -> Footprint {
        Footprint::owners(n, d)
    }

    fn assign<T: Real>(&self, n: usize, d: usize, seed: u64, round: u64, _data: Option<ArrayView2<T>>) -> Result<Assignment> {
        Ok(Assignment::Owners { owner: owners(seed, round, n, d)?, n, scale: n as f64, sizes: None })
    }

    fn contiguous(&self, n: usize, d: usize) -> bool {
        n == 1 || d == 1
    }

    fn ranges(&self, n: usize, d: usize, seed: u64, round: u64) -> Result<Option<Ranges>> {
        // a single worker owns everything, or a single coordinate has one owner: O(n) work
        if n == 1 {
            return Ok(Some(Ranges::full(1, d, 1.0)?));
        }
        if d == 1 {
            return self.assign::<f64>(n, d, seed, round, None)?.owner_ranges();
        }
        Ok(None)
    }
}
