//! `Round` and `PendingRound`: one round's plan computed once and used natively; plans from
//! explicit permutations (exact enumeration).

use super::*;

/// One round's plan of a spec with a shared plan, computed once (`Spec.round`, `Spec.round_ahead`).
#[pyclass(frozen, module = "permk._core", name = "Round")]
pub struct PyRound(pub(super) Round);

#[pymethods]
impl PyRound {
    #[getter]
    fn n(&self) -> usize {
        self.0.n()
    }

    #[getter]
    fn d(&self) -> usize {
        self.0.d()
    }

    /// Every coordinate is sent by at most one worker this round.
    #[getter]
    fn disjoint(&self, py: Python<'_>) -> bool {
        py.detach(|| self.0.disjoint())
    }

    fn offsets<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i64>>> {
        Ok(py.detach(|| self.0.offsets_i64())?.into_pyarray(py))
    }

    fn scales<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        Ok(py.detach(|| self.0.scales())?.into_pyarray(py))
    }

    fn coords<'py>(&self, py: Python<'py>, start: usize, stop: usize) -> PyResult<Bound<'py, PyArray1<i64>>> {
        Ok(py.detach(|| self.0.coords(start, stop))?.into_pyarray(py))
    }

    fn rows<'py>(&self, py: Python<'py>, start: usize, stop: usize) -> PyResult<Bound<'py, PyArray1<i64>>> {
        Ok(py.detach(|| self.0.rows(start, stop))?.into_pyarray(py))
    }

    fn ranges<'py>(&self, py: Python<'py>) -> PyResult<Option<PlanArrays<'py>>> {
        let r = py.detach(|| self.0.ranges())?;
        Ok(ranges_arrays(py, r))
    }

    /// The workers' values in plan order (`divide`: each `(v + 0) / k`; `out`: written there
    /// and returned).
    #[pyo3(signature = (a, start, *, divide=None, out=None))]
    fn gather<'py>(
        &self,
        py: Python<'py>,
        a: &Bound<'py, PyAny>,
        start: usize,
        divide: Option<&Bound<'py, PyAny>>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        fn go<'py, T: Real + numpy::Element>(
            py: Python<'py>,
            r: &Round,
            a: ArrayView2<T>,
            start: usize,
            divide: Option<Divisor>,
            out: Option<&Bound<'py, PyAny>>,
            dtype: &str,
        ) -> PyResult<Bound<'py, PyAny>> {
            let Some(out) = out else {
                return Ok(py.detach(|| r.gather_div(a, start, divide))?.into_pyarray(py).into_any());
            };
            let mut w = out_array::<T>(out, dtype, &[("a", extent(&a))])?;
            let o = out_slice(&mut w)?;
            py.detach(|| r.gather_into(a, start, divide, o))?;
            Ok(out.clone())
        }
        let divide = divisor(divide)?;
        match arr2(a, "a")? {
            Arr2::F64(x) => go(py, &self.0, x.as_array(), start, divide, out, "float64 (a's dtype)"),
            Arr2::F32(x) => go(py, &self.0, x.as_array(), start, divide, out, "float32 (a's dtype)"),
        }
    }

    /// This round restricted to `workers` (strictly increasing), their scales times `factor`;
    /// the other workers send nothing (partial participation's round).
    fn restricted(&self, py: Python<'_>, workers: PyReadonlyArray1<'_, i64>, factor: f64) -> PyResult<PyRound> {
        let ws = indices(&workers, "workers")?;
        Ok(PyRound(py.detach(|| self.0.restricted(&ws, factor))?))
    }

    /// The largest number of values one worker sends this round (the slot width of a padded gather).
    #[getter]
    fn max_count(&self) -> usize {
        self.0.max_count()
    }

    /// A disjoint round's values received in padded slots (worker `i`'s in
    /// `recv[i*width : i*width + count_i]`) copied to their coordinates in `out` (`d` values,
    /// float32 or float64 like `recv`; every one written). Returns `out`.
    fn place<'py>(&self, py: Python<'py>, recv: &Bound<'py, PyAny>, width: usize, out: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        fn go<'py, T: numpy::Element + Copy + Default + Send + Sync>(
            py: Python<'py>,
            r: &Round,
            recv: ArrayView1<'_, T>,
            width: usize,
            out: &Bound<'py, PyAny>,
            dtype: &str,
        ) -> PyResult<()> {
            let src = recv.as_slice().ok_or_else(|| PyValueError::new_err("recv: must be C-contiguous"))?;
            let mut w = out_array::<T>(out, dtype, &[("recv", extent(&recv))])?;
            let o = out_slice(&mut w)?;
            py.detach(|| r.place_into(src, width, o))?;
            Ok(())
        }
        match arr1(recv, "recv")? {
            Arr1::F64(x) => go(py, &self.0, x.as_array(), width, out, "float64 (recv's dtype)")?,
            Arr1::F32(x) => go(py, &self.0, x.as_array(), width, out, "float32 (recv's dtype)")?,
        }
        Ok(out.clone())
    }

    /// The average of all workers' values (`out`: written there and returned).
    #[pyo3(signature = (values, *, out=None))]
    fn mean<'py>(&self, py: Python<'py>, values: PyReadonlyArray1<'py, f64>, out: Option<&Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let v = values.as_array();
        let Some(out) = out else {
            let out = py.detach(|| -> PyResult<Vec<f64>> { Ok(self.0.mean(&slice_of(&v, "values")?)?) })?;
            return Ok(out.into_pyarray(py));
        };
        let mut w = out_array::<f64>(out, "float64", &[("values", extent(&v))])?;
        let o = out_slice(&mut w)?;
        py.detach(|| -> PyResult<()> { Ok(self.0.mean_into(&slice_of(&v, "values")?, o)?) })?;
        Ok(out.cast::<PyArray1<f64>>()?.clone())
    }
}

/// A round being computed on a background thread (`Spec.round_ahead`).
#[pyclass(frozen, module = "permk._core", name = "PendingRound")]
pub struct PyPendingRound(pub(super) PendingRound);

#[pymethods]
impl PyPendingRound {
    /// Joins the computation (GIL released) and returns its round, once.
    fn wait(&self, py: Python<'_>) -> PyResult<PyRound> {
        let handle = self.0.take()?;
        Ok(PyRound(py.detach(|| PendingRound::join(handle))?))
    }
}

/// PermK's plan (`d >= n`, general form) from explicit permutations, for exact enumeration.
#[pyfunction]
pub(super) fn permk_plan_from_permutations(py: Python<'_>, n: usize, d: usize, pi_d: Vec<u32>, pi_n: Vec<u32>) -> PyResult<PlanArrays<'_>> {
    let p = py.detach(|| permk::plan_from_permutations(n, d, &pi_d, &pi_n))?;
    Ok(plan_arrays(py, p))
}

/// The block permutation plan from an explicit permutation of the workers; `labels[j]` is the
/// block of coordinate `j` (PermK for `n > d` is `labels = range(d)`).
#[pyfunction]
pub(super) fn block_plan_from_permutation(py: Python<'_>, labels: Vec<u32>, pi: Vec<u32>) -> PyResult<PlanArrays<'_>> {
    let p = py.detach(|| blockpermk::plan_from_permutation(labels, pi))?;
    Ok(plan_arrays(py, p))
}
