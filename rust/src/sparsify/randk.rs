//! Independent RandK: each worker sends `k` uniformly random coordinates (its own stream of
//! `(seed, round, worker)`), scaled by `d/k`.

use ndarray::{Array1, ArrayView1, ArrayView2};

use super::{check_k, take_k, Footprint, Sparsify};
use crate::error::Result;
use crate::params::Params;
use crate::plan::{Assignment, OwnedCoords, Ranges, RoundPlan, Selection};
use crate::real::Real;
use crate::rng::{self, Purpose};
use crate::{kernels, mem};

#[derive(Clone, Debug, PartialEq)]
pub struct RandK {
    pub k: usize,
}

/// Worker `worker`'s sample of round `round` into `out`.
pub(crate) fn randk_coords(seed: u64, round: u64, worker: usize, k: usize, sampler: &mut rng::Sampler, out: &mut Vec<u32>) {
    let mut rng = rng::stream(seed, Purpose::RandK, worker as u64, round);
    sampler.sample(&mut rng, k, out);
}

impl Sparsify for RandK {
    const NAME: &'static str = "randk";
    const TITLE: &'static str = "RandK";
    const PARAMS: &'static [&'static str] = &["k"];

    fn from_params(params: &mut Params) -> Result<Self> {
        let k = take_k(params, "randk")?;
        Ok(RandK { k })
    }

    fn check(&self, _n: usize, d: usize) -> Result<()> {
        check_k(self.k, d)
    }

    fn footprint(&self, n: usize, d: usize) -> Footprint {
        let (n128, k) = (n as u128, self.k as u128);
        Footprint {
            // the sampler and the plan
            assign: rng::Sampler::bytes(d, self.k) + 4 * n128 * k + 16 * n128 + 8,
            plan: 0,
            coords: n128 * k,
            worker_max: k,
            // the parallel kernel's coordinates and values
            scratch: 12 * n128 * k,
        }
    }

    fn assign<T: Real>(&self, n: usize, d: usize, seed: u64, round: u64, data: Option<ArrayView2<T>>) -> Result<Assignment> {
        Ok(Assignment::Plan(self.assign_rows(n, d, seed, round, 0, n, data)?))
    }

    fn assign_rows<T: Real>(&self, _n: usize, d: usize, seed: u64, round: u64, start: usize, m: usize, _data: Option<ArrayView2<T>>) -> Result<RoundPlan> {
        let k = self.k;
        let mut sampler = rng::Sampler::new(d, k)?;
        let mut offsets = mem::vec("the plan's offsets", m + 1)?;
        offsets.push(0);
        let mut coords = mem::vec("the plan's coordinates", m * k)?;
        let mut out = mem::vec("RandK's sample", k)?;
        for i in start..start + m {
            randk_coords(seed, round, i, k, &mut sampler, &mut out);
            coords.extend_from_slice(&out);
            offsets.push(coords.len());
        }
        let scales = mem::filled("the plan's scales", m, d as f64 / k as f64)?;
        Ok(RoundPlan::Csr { offsets, coords, scales })
    }

    fn select<T: Real>(&self, _n: usize, d: usize, seed: u64, round: u64, worker: usize, _x: Option<ArrayView1<T>>) -> Result<Selection> {
        let mut out = mem::vec("RandK's sample", self.k)?;
        randk_coords(seed, round, worker, self.k, &mut rng::Sampler::new(d, self.k)?, &mut out);
        Ok((OwnedCoords::List(out), d as f64 / self.k as f64))
    }

    fn contiguous(&self, _n: usize, _d: usize) -> bool {
        self.k == 1
    }

    fn ranges(&self, n: usize, d: usize, seed: u64, round: u64) -> Result<Option<Ranges>> {
        if !self.contiguous(n, d) {
            return Ok(None);
        }
        // one coordinate per worker (O(n) draws)
        let mut r = Ranges::idle(n, d as f64)?;
        let mut sampler = rng::Sampler::new(d, 1)?;
        let mut out = Vec::with_capacity(1);
        for i in 0..n {
            randk_coords(seed, round, i, 1, &mut sampler, &mut out);
            r.starts[i] = out[0] as i64;
            r.stops[i] = out[0] as i64 + 1;
        }
        Ok(Some(r))
    }

    fn aggregate_fast<T: Real>(&self, a: ArrayView2<T>, seed: u64, round: u64) -> Result<Option<Array1<T>>> {
        let n = a.nrows();
        if n > 1 && n * self.k >= kernels::RANDK_PAR_THRESHOLD {
            let k = self.k;
            return kernels::randk_parallel(a, k, |i, sampler: &mut rng::Sampler, out: &mut Vec<u32>| {
                randk_coords(seed, round, i, k, sampler, out)
            });
        }
        Ok(None)
    }
}
