//! The PyO3 glue: argument conversion, dtype dispatch, GIL release and error mapping only.
//! Every computation lives in the pure-Rust modules.

use numpy::ndarray::{Array1, ArrayView1, ArrayView2};
use numpy::{IntoPyArray, PyArray1, PyArray2, PyReadonlyArray1, PyReadonlyArray2, PyReadwriteArray1};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::compress::{self, Partition, Quantizer, Real, RoundPlan, Sparsifier, Spec};
use crate::error::CoreError;
use crate::quadratic;
use crate::rng;

impl From<CoreError> for PyErr {
    fn from(e: CoreError) -> PyErr {
        PyValueError::new_err(e.to_string())
    }
}

/// A float array argument: float64 or float32, any strides (no copy).
enum Arr2<'py> {
    F64(PyReadonlyArray2<'py, f64>),
    F32(PyReadonlyArray2<'py, f32>),
}
enum Arr1<'py> {
    F64(PyReadonlyArray1<'py, f64>),
    F32(PyReadonlyArray1<'py, f32>),
}

fn arr2<'py>(a: &Bound<'py, PyAny>, name: &str) -> PyResult<Arr2<'py>> {
    if let Ok(x) = a.extract::<PyReadonlyArray2<'py, f64>>() {
        Ok(Arr2::F64(x))
    } else if let Ok(x) = a.extract::<PyReadonlyArray2<'py, f32>>() {
        Ok(Arr2::F32(x))
    } else {
        Err(PyTypeError::new_err(format!("{name} must be a 2-D float64 or float32 numpy array")))
    }
}

fn arr1<'py>(a: &Bound<'py, PyAny>, name: &str) -> PyResult<Arr1<'py>> {
    if let Ok(x) = a.extract::<PyReadonlyArray1<'py, f64>>() {
        Ok(Arr1::F64(x))
    } else if let Ok(x) = a.extract::<PyReadonlyArray1<'py, f32>>() {
        Ok(Arr1::F32(x))
    } else {
        Err(PyTypeError::new_err(format!("{name} must be a 1-D float64 or float32 numpy array")))
    }
}

fn plan_arrays<'py>(py: Python<'py>, plan: RoundPlan, d: usize) -> PlanArrays<'py> {
    let (offsets, coords, scales) = plan.to_csr(d);
    (
        Array1::from(offsets.into_iter().map(|o| o as i64).collect::<Vec<_>>()).into_pyarray(py),
        Array1::from(coords.into_iter().map(i64::from).collect::<Vec<_>>()).into_pyarray(py),
        Array1::from(scales).into_pyarray(py),
    )
}

type PlanArrays<'py> = (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<f64>>);

/// A compressor specification (sparsifier ∘ quantizer) with the Rust kernels attached.
#[pyclass(frozen, module = "permk._core", name = "Spec")]
pub struct PySpec(Spec);

#[pymethods]
impl PySpec {
    #[new]
    #[pyo3(signature = (sparsifier, *, k=None, m=None, labels=None, quantizer="none", s=None))]
    fn new(sparsifier: &str, k: Option<usize>, m: Option<usize>, labels: Option<Vec<u32>>, quantizer: &str, s: Option<u32>) -> PyResult<Self> {
        let need_k = || k.ok_or_else(|| PyValueError::new_err(format!("{sparsifier} needs k")));
        let sp = match sparsifier {
            "identity" => Sparsifier::Identity,
            "permk" => Sparsifier::PermK,
            "randk" => Sparsifier::RandK { k: need_k()? },
            "topk" => Sparsifier::TopK { k: need_k()? },
            "blockpermk" => Sparsifier::BlockPermK {
                partition: match (m, labels) {
                    (_, Some(l)) => Partition::labels(l)?,
                    (Some(m), None) => Partition::Contiguous { m },
                    (None, None) => return Err(PyValueError::new_err("blockpermk needs m or labels")),
                },
            },
            other => return Err(PyValueError::new_err(format!("unknown sparsifier {other:?}"))),
        };
        let q = match quantizer {
            "none" => Quantizer::None,
            "natural" => Quantizer::Natural,
            "qsgd" => Quantizer::Qsgd { s: s.ok_or_else(|| PyValueError::new_err("qsgd needs s"))? },
            other => return Err(PyValueError::new_err(format!("unknown quantizer {other:?}"))),
        };
        Ok(PySpec(Spec::new(sp, q)?))
    }

    /// Raises ValueError unless the spec is defined for `n` workers in dimension `d`.
    fn check(&self, n: usize, d: usize) -> PyResult<()> {
        Ok(self.0.check(n, d)?)
    }

    /// `(1/n) Σ_i C_i(A[i])` for the `(n, d)` array `A`.
    fn aggregate<'py>(&self, py: Python<'py>, a: &Bound<'py, PyAny>, seed: u64, round: u64) -> PyResult<Bound<'py, PyAny>> {
        fn go<T: Real + numpy::Element>(py: Python<'_>, spec: &Spec, a: ArrayView2<T>, seed: u64, round: u64) -> PyResult<Py<PyAny>> {
            let out = py.detach(|| compress::aggregate(spec, a, seed, round))?;
            Ok(out.into_pyarray(py).into_any().unbind())
        }
        let r = match arr2(a, "A")? {
            Arr2::F64(x) => go(py, &self.0, x.as_array(), seed, round)?,
            Arr2::F32(x) => go(py, &self.0, x.as_array(), seed, round)?,
        };
        Ok(r.into_bound(py))
    }

    /// The `(n, d)` array of compressed rows `C_i(A[i])`.
    fn compress_all<'py>(&self, py: Python<'py>, a: &Bound<'py, PyAny>, seed: u64, round: u64) -> PyResult<Bound<'py, PyAny>> {
        fn go<T: Real + numpy::Element>(py: Python<'_>, spec: &Spec, a: ArrayView2<T>, seed: u64, round: u64) -> PyResult<Py<PyAny>> {
            let out = py.detach(|| compress::compress_all(spec, a, seed, round))?;
            Ok(out.into_pyarray(py).into_any().unbind())
        }
        let r = match arr2(a, "A")? {
            Arr2::F64(x) => go(py, &self.0, x.as_array(), seed, round)?,
            Arr2::F32(x) => go(py, &self.0, x.as_array(), seed, round)?,
        };
        Ok(r.into_bound(py))
    }

    /// One worker's message `(indices, values)`.
    fn compress<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        worker: usize,
        n_workers: usize,
        seed: u64,
        round: u64,
    ) -> PyResult<(Bound<'py, PyArray1<i64>>, Bound<'py, PyAny>)> {
        #[allow(clippy::type_complexity)]
        fn go<T: Real + numpy::Element>(
            py: Python<'_>,
            spec: &Spec,
            x: ArrayView1<T>,
            w: usize,
            n: usize,
            seed: u64,
            round: u64,
        ) -> PyResult<(Py<PyArray1<i64>>, Py<PyAny>)> {
            let (idx, val) = py.detach(|| compress::compress(spec, x, w, n, seed, round))?;
            let idx = Array1::from(idx.into_iter().map(i64::from).collect::<Vec<_>>()).into_pyarray(py).unbind();
            Ok((idx, Array1::from(val).into_pyarray(py).into_any().unbind()))
        }
        let (i, v) = match arr1(x, "x")? {
            Arr1::F64(a) => go(py, &self.0, a.as_array(), worker, n_workers, seed, round)?,
            Arr1::F32(a) => go(py, &self.0, a.as_array(), worker, n_workers, seed, round)?,
        };
        Ok((i.into_bound(py), v.into_bound(py)))
    }

    /// The round's plan as CSR arrays `(offsets, coords, scales)`: worker `i` sends
    /// `coords[offsets[i]:offsets[i+1]]` scaled by `scales[i]`. Not for TopK (data-dependent).
    fn plan<'py>(&self, py: Python<'py>, n: usize, d: usize, seed: u64, round: u64) -> PyResult<PlanArrays<'py>> {
        if !self.0.has_shared_coordinates() {
            return Err(PyValueError::new_err("TopK's coordinates depend on the data; it has no shared plan"));
        }
        let plan = py.detach(|| compress::round_plan::<f64>(&self.0, n, d, seed, round, None))?;
        Ok(plan_arrays(py, plan, d))
    }
}

fn check_perm(p: &[u32], len: usize, name: &str) -> PyResult<()> {
    let mut seen = vec![false; len];
    if p.len() != len || p.iter().any(|&v| (v as usize) >= len || std::mem::replace(&mut seen[v as usize], true)) {
        return Err(PyValueError::new_err(format!("{name} must be a permutation of range({len})")));
    }
    Ok(())
}

/// PermK's plan (`d >= n`, general form) from explicit permutations, for exact enumeration.
#[pyfunction]
fn permk_plan_from_permutations<'py>(py: Python<'py>, n: usize, d: usize, pi_d: Vec<u32>, pi_n: Vec<u32>) -> PyResult<PlanArrays<'py>> {
    if n == 0 || d < n {
        return Err(PyValueError::new_err("needs 1 <= n <= d"));
    }
    check_perm(&pi_d, d, "pi_d")?;
    check_perm(&pi_n, n, "pi_n")?;
    Ok(plan_arrays(py, compress::permk_plan_wide(n, d, &pi_d, &pi_n), d))
}

/// The block permutation plan from an explicit permutation of the workers; `labels[j]` is the
/// block of coordinate `j` (PermK for `n > d` is `labels = range(d)`).
#[pyfunction]
fn block_plan_from_permutation<'py>(py: Python<'py>, labels: Vec<u32>, pi: Vec<u32>) -> PyResult<PlanArrays<'py>> {
    let d = labels.len();
    let n = pi.len();
    let spec = Spec::new(Sparsifier::BlockPermK { partition: Partition::labels(labels)? }, Quantizer::None)?;
    spec.check(n, d)?;
    check_perm(&pi, n, "pi")?;
    let Sparsifier::BlockPermK { partition: Partition::Labels { labels, m } } = spec.sparsifier else { unreachable!() };
    let mut by_block: Vec<Vec<u32>> = vec![Vec::new(); m];
    for (j, &l) in labels.iter().enumerate() {
        by_block[l as usize].push(j as u32);
    }
    let mut offsets = vec![0usize];
    let mut coords = Vec::with_capacity(d);
    for b in by_block {
        coords.extend(b);
        offsets.push(coords.len());
    }
    Ok(plan_arrays(py, compress::block_plan(n, offsets, coords, pi), d))
}

/// The synthetic quadratic's oracles (Algorithm 1): `A_i = a_i T + c I`, `b_i = beta_i e_1`.
#[pyclass(frozen, module = "permk._core", name = "Tridiagonal")]
pub struct PyTridiagonal(quadratic::Tridiagonal);

#[pymethods]
impl PyTridiagonal {
    #[new]
    fn new(a: Vec<f64>, c: f64, beta: Vec<f64>) -> PyResult<Self> {
        Ok(PyTridiagonal(quadratic::Tridiagonal::new(a, c, beta)?))
    }

    fn loss(&self, x: PyReadonlyArray1<'_, f64>) -> f64 {
        self.0.loss(x.as_array())
    }

    fn grad<'py>(&self, py: Python<'py>, x: PyReadonlyArray1<'py, f64>) -> Bound<'py, PyArray1<f64>> {
        self.0.grad(x.as_array()).into_pyarray(py)
    }

    fn local_grads<'py>(&self, py: Python<'py>, x: PyReadonlyArray1<'py, f64>) -> Bound<'py, PyArray2<f64>> {
        let x = x.as_array();
        py.detach(|| self.0.local_grads(x)).into_pyarray(py)
    }

    fn local_grad_coords<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArray1<'py, f64>,
        rows: PyReadonlyArray1<'py, i64>,
        cols: PyReadonlyArray1<'py, i64>,
    ) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let (x, rows, cols) = (x.as_array(), rows.as_array(), cols.as_array());
        let (rows, cols) = (rows.to_vec(), cols.to_vec());
        Ok(py.detach(|| self.0.local_grad_coords(x, &rows, &cols))?.into_pyarray(py))
    }

    /// One MARINA round in place on `x`, `g` (float64, writeable); returns the coin.
    #[allow(clippy::too_many_arguments)]
    fn marina_round(
        &self,
        py: Python<'_>,
        spec: &PySpec,
        mut x: PyReadwriteArray1<'_, f64>,
        mut g: PyReadwriteArray1<'_, f64>,
        gamma: f64,
        p: f64,
        seed: u64,
        round: u64,
    ) -> PyResult<bool> {
        let (x, g) = (x.as_array_mut(), g.as_array_mut());
        Ok(py.detach(|| self.0.marina_round(&spec.0, x, g, gamma, p, seed, round))?)
    }

    /// One fused EF21 + TopK(`k`) round in place on `x`, `g` (float64) and the `(n, d)`
    /// C-contiguous float64 array `G` of the workers' estimators (issue 5).
    fn ef21_topk_round(
        &self,
        py: Python<'_>,
        mut x: PyReadwriteArray1<'_, f64>,
        mut g: PyReadwriteArray1<'_, f64>,
        mut gmat: numpy::PyReadwriteArray2<'_, f64>,
        gamma: f64,
        k: usize,
    ) -> PyResult<()> {
        let (x, g, gmat) = (x.as_array_mut(), g.as_array_mut(), gmat.as_array_mut());
        Ok(py.detach(|| self.0.ef21_topk_round(x, g, gmat, gamma, k))?)
    }

    /// Solves `((1/n) Σ A_i) x = rhs` in `O(d)`.
    fn solve_mean<'py>(&self, py: Python<'py>, rhs: Vec<f64>) -> Bound<'py, PyArray1<f64>> {
        let mean = self.0.a.iter().sum::<f64>() / self.0.n() as f64;
        Array1::from(quadratic::solve_mean(mean, self.0.c, &rhs)).into_pyarray(py)
    }
}

/// MARINA's shared Bernoulli(p) coin of round `round`.
#[pyfunction]
fn coin(seed: u64, round: u64, p: f64) -> bool {
    rng::coin(seed, round, p)
}

#[pymodule]
#[pyo3(name = "_core")]
fn core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<PySpec>()?;
    m.add_class::<PyTridiagonal>()?;
    m.add_function(wrap_pyfunction!(permk_plan_from_permutations, m)?)?;
    m.add_function(wrap_pyfunction!(block_plan_from_permutation, m)?)?;
    m.add_function(wrap_pyfunction!(coin, m)?)?;
    Ok(())
}
