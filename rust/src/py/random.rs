//! The shared random streams: MARINA's coin, a round's permutation, partial participation's draw.

use super::*;

/// MARINA's shared Bernoulli(p) coin of round `round`.
#[pyfunction]
pub(super) fn coin(seed: u64, round: u64, p: f64) -> PyResult<bool> {
    Ok(rng::coin(seed, round, p)?)
}

/// A uniformly random permutation of range(n) shared by all workers: a pure function of
/// (seed, round).
#[pyfunction]
pub(super) fn permutation(py: Python<'_>, seed: u64, round: u64, n: usize) -> PyResult<Bound<'_, PyArray1<i64>>> {
    let p = py.detach(|| rng::shared_permutation(seed, round, n))?;
    Ok(p.into_pyarray(py))
}

/// The sorted first `s` of `numpy.random.default_rng(entropy).permutation(n)`, natively and bit
/// for bit (partial participation's draw of a round's participants).
#[pyfunction]
pub(super) fn numpy_permutation_head<'py>(py: Python<'py>, entropy: Vec<u64>, n: usize, s: usize) -> PyResult<Bound<'py, PyArray1<i64>>> {
    Ok(py.detach(|| crate::numpy_rng::first_sorted(&entropy, n, s))?.into_pyarray(py))
}
