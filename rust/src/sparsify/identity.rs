//! No compression: every worker sends every coordinate, unscaled.

use ndarray::ArrayView2;

use super::{Footprint, Sparsify};
use crate::error::Result;
use crate::params::Params;
use crate::plan::{Assignment, Ranges, RoundPlan};
use crate::real::Real;

#[derive(Clone, Debug, PartialEq)]
pub struct Identity;

impl Sparsify for Identity {
    const NAME: &'static str = "identity";
    const TITLE: &'static str = "Identity";
    const PARAMS: &'static [&'static str] = &[];

    fn from_params(_params: &mut Params) -> Result<Self> {
        Ok(Identity)
    }

    fn footprint(&self, n: usize, d: usize) -> Footprint {
        Footprint { assign: 0, plan: 0, coords: n as u128 * d as u128, worker_max: d as u128, scratch: 0 }
    }

    fn assign<T: Real>(&self, n: usize, _d: usize, _seed: u64, _round: u64, _data: Option<ArrayView2<T>>) -> Result<Assignment> {
        Ok(Assignment::Plan(RoundPlan::All { n }))
    }

    fn contiguous(&self, _n: usize, _d: usize) -> bool {
        true
    }

    fn ranges(&self, n: usize, d: usize, _seed: u64, _round: u64) -> Result<Option<Ranges>> {
        Ok(Some(Ranges::full(n, d, 1.0)?))
    }
}
