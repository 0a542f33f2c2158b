//! `Spec`: a compressor (sparsifier ∘ quantizer) with its Rust kernels.

use super::*;

/// A compressor specification (sparsifier ∘ quantizer) with the Rust kernels attached.
#[pyclass(frozen, module = "permk._core", name = "Spec")]
pub struct PySpec(pub(super) Arc<Spec>);

#[pymethods]
impl PySpec {
    #[new]
    #[pyo3(signature = (sparsifier, *, quantizer="none", **params))]
    fn new(py: Python<'_>, sparsifier: &str, quantizer: &str, params: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let mut p = Params::new();
        if let Some(params) = params {
            for (k, v) in params.iter() {
                let key: String = k.extract()?;
                if let Some(value) = param_value(&key, &v)? {
                    p.insert(&key, value);
                }
            }
        }
        // a partition's labels are O(d)
        Ok(PySpec(Arc::new(py.detach(|| Spec::from_name(sparsifier, quantizer, p))?)))
    }

    /// The sparsifier's name.
    #[getter]
    fn name(&self) -> &'static str {
        self.0.name()
    }

    /// True when the coordinates are a pure function of (seed, round, worker) and the values
    /// are `scale_i * x_j`.
    #[getter]
    fn shared_plan(&self) -> bool {
        self.0.shared_plan()
    }

    /// Raises ValueError unless the spec is defined for `n` workers in dimension `d`.
    fn check(&self, n: usize, d: usize) -> PyResult<()> {
        Ok(self.0.check(n, d)?)
    }

    /// `(1/n) Σ_i C_i(A[i])` for the `(n, d)` array `A`.
    fn aggregate<'py>(&self, py: Python<'py>, a: &Bound<'py, PyAny>, seed: u64, round: u64) -> PyResult<Bound<'py, PyAny>> {
        fn go<'py, T: Real + numpy::Element>(py: Python<'py>, spec: &Spec, a: ArrayView2<T>, seed: u64, round: u64) -> PyResult<Bound<'py, PyAny>> {
            let out = py.detach(|| compress::aggregate(spec, a, seed, round))?;
            Ok(out.into_pyarray(py).into_any())
        }
        match arr2(a, "A")? {
            Arr2::F64(x) => go(py, &self.0, x.as_array(), seed, round),
            Arr2::F32(x) => go(py, &self.0, x.as_array(), seed, round),
        }
    }

    /// The `(n, d)` array of compressed rows `C_i(A[i])`.
    fn compress_all<'py>(&self, py: Python<'py>, a: &Bound<'py, PyAny>, seed: u64, round: u64) -> PyResult<Bound<'py, PyAny>> {
        fn go<'py, T: Real + numpy::Element>(py: Python<'py>, spec: &Spec, a: ArrayView2<T>, seed: u64, round: u64) -> PyResult<Bound<'py, PyAny>> {
            let out = py.detach(|| compress::compress_all(spec, a, seed, round))?;
            Ok(out.into_pyarray(py).into_any())
        }
        match arr2(a, "A")? {
            Arr2::F64(x) => go(py, &self.0, x.as_array(), seed, round),
            Arr2::F32(x) => go(py, &self.0, x.as_array(), seed, round),
        }
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
        fn go<'py, T: Real + numpy::Element>(
            py: Python<'py>,
            spec: &Spec,
            x: ArrayView1<T>,
            w: usize,
            n: usize,
            seed: u64,
            round: u64,
        ) -> PyResult<(Bound<'py, PyArray1<i64>>, Bound<'py, PyAny>)> {
            let (idx, val) = py.detach(|| compress::compress(spec, x, w, n, seed, round))?;
            Ok((idx.into_pyarray(py), val.into_pyarray(py).into_any()))
        }
        match arr1(x, "x")? {
            Arr1::F64(a) => go(py, &self.0, a.as_array(), worker, n_workers, seed, round),
            Arr1::F32(a) => go(py, &self.0, a.as_array(), worker, n_workers, seed, round),
        }
    }

    /// The messages of workers `start .. start + m` (rows of the `(m, d)` array `A`):
    /// `(offsets, indices, values)`.
    fn compress_rows<'py>(
        &self,
        py: Python<'py>,
        a: &Bound<'py, PyAny>,
        start: usize,
        n_workers: usize,
        seed: u64,
        round: u64,
    ) -> PyResult<MessageArrays<'py>> {
        fn go<'py, T: Real + numpy::Element>(
            py: Python<'py>,
            spec: &Spec,
            a: ArrayView2<T>,
            start: usize,
            n: usize,
            seed: u64,
            round: u64,
        ) -> PyResult<MessageArrays<'py>> {
            let m = py.detach(|| compress::compress_rows(spec, a, start, n, seed, round))?;
            Ok(message_arrays(py, m))
        }
        match arr2(a, "A")? {
            Arr2::F64(x) => go(py, &self.0, x.as_array(), start, n_workers, seed, round),
            Arr2::F32(x) => go(py, &self.0, x.as_array(), start, n_workers, seed, round),
        }
    }

    /// The messages of workers `start .. start + m` whose inputs are `G − beta·H` (`G` without
    /// `H`; `G`, `H` of shape `(m, d)`, one dtype), formed row by row: `(offsets, indices,
    /// values)`, or None when an input (or a message) is not finite. With `rows` (int64, `m`
    /// values), worker `r`'s row of `G` is `G[rows[r]]`: the same messages as on `G[rows]`,
    /// which is never formed.
    #[allow(non_snake_case, clippy::too_many_arguments)]
    #[pyo3(signature = (G, H, beta, start, n_workers, seed, round, rows=None))]
    fn compress_shifted_rows<'py>(
        &self,
        py: Python<'py>,
        G: &Bound<'py, PyAny>,
        H: Option<&Bound<'py, PyAny>>,
        beta: f64,
        start: usize,
        n_workers: usize,
        seed: u64,
        round: u64,
        rows: Option<PyReadonlyArray1<'py, i64>>,
    ) -> PyResult<Option<MessageArrays<'py>>> {
        #[allow(clippy::too_many_arguments)]
        fn go<'py, T: Real + numpy::Element, U: Real>(
            py: Python<'py>,
            spec: &Spec,
            g: ArrayView2<T>,
            rows: Option<&[usize]>,
            h: Option<ArrayView2<U>>,
            beta: f64,
            start: usize,
            n: usize,
            seed: u64,
            round: u64,
        ) -> PyResult<Option<MessageArrays<'py>>> {
            let m = py.detach(|| compress::compress_shifted_rows(spec, g, rows, h, beta, start, n, seed, round))?;
            Ok(m.map(|m| message_arrays(py, m)))
        }
        let rows = rows.as_ref().map(|r| indices(r, "rows")).transpose()?;
        let rows = rows.as_deref();
        let h = H.map(|h| arr2(h, "H")).transpose()?;
        match (arr2(G, "G")?, h) {
            (Arr2::F64(g), None) => go(py, &self.0, g.as_array(), rows, None::<ArrayView2<f64>>, beta, start, n_workers, seed, round),
            (Arr2::F32(g), None) => go(py, &self.0, g.as_array(), rows, None::<ArrayView2<f64>>, beta, start, n_workers, seed, round),
            (Arr2::F64(g), Some(Arr2::F64(h))) => go(py, &self.0, g.as_array(), rows, Some(h.as_array()), beta, start, n_workers, seed, round),
            (Arr2::F32(g), Some(Arr2::F32(h))) => go(py, &self.0, g.as_array(), rows, Some(h.as_array()), beta, start, n_workers, seed, round),
            // float32 estimators of float64 inputs (a float32 problem's EF21 state): h·β in float32, the rest in float64
            (Arr2::F64(g), Some(Arr2::F32(h))) => go(py, &self.0, g.as_array(), rows, Some(h.as_array()), beta, start, n_workers, seed, round),
            _ => Err(PyTypeError::new_err("G and H must have the same dtype (float64 or float32), or H float32 with G float64")),
        }
    }

    /// The round's plan as CSR arrays `(offsets, coords, scales)`.
    fn plan<'py>(&self, py: Python<'py>, n: usize, d: usize, seed: u64, round: u64) -> PyResult<PlanArrays<'py>> {
        let p = py.detach(|| compress::plan(&self.0, n, d, seed, round))?;
        Ok(plan_arrays(py, p))
    }

    /// The round's plan computed once, in its compact form (a spec with a shared plan).
    fn round(&self, py: Python<'_>, n: usize, d: usize, seed: u64, round: u64) -> PyResult<PyRound> {
        Ok(PyRound(py.detach(|| Round::new(&self.0, n, d, seed, round))?))
    }

    /// Starts computing the round on a background thread; returns at once.
    fn round_ahead(&self, n: usize, d: usize, seed: u64, round: u64) -> PyResult<PyPendingRound> {
        Ok(PyPendingRound(PendingRound::spawn(Arc::clone(&self.0), n, d, seed, round)?))
    }

    /// Every worker's coordinates as one range `(starts, stops, scales)`, or None.
    #[allow(clippy::type_complexity)]
    fn plan_ranges<'py>(&self, py: Python<'py>, n: usize, d: usize, seed: u64, round: u64) -> PyResult<Option<PlanArrays<'py>>> {
        let r = py.detach(|| compress::plan_ranges(&self.0, n, d, seed, round))?;
        Ok(ranges_arrays(py, r))
    }
}
