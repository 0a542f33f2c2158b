//! `Tridiagonal`: the synthetic quadratic's oracles and fused method steps.

use super::*;

/// The synthetic quadratic's oracles (Algorithm 1): `A_i = a_i T + c I`, `b_i = beta_i e_1`.
#[pyclass(frozen, module = "permk._core", name = "Tridiagonal")]
pub struct PyTridiagonal(pub(super) quadratic::Tridiagonal);

#[pymethods]
impl PyTridiagonal {
    #[new]
    fn new(py: Python<'_>, a: Vec<f64>, c: f64, beta: Vec<f64>) -> PyResult<Self> {
        Ok(PyTridiagonal(py.detach(|| quadratic::Tridiagonal::new(a, c, beta))?))
    }

    fn loss(&self, py: Python<'_>, x: PyReadonlyArray1<'_, f64>) -> PyResult<f64> {
        let x = x.as_array();
        Ok(py.detach(|| self.0.loss(x))?)
    }

    fn grad<'py>(&self, py: Python<'py>, x: PyReadonlyArray1<'py, f64>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let x = x.as_array();
        Ok(py.detach(|| self.0.grad(x))?.into_pyarray(py))
    }

    #[pyo3(signature = (x, start=0, stop=None))]
    fn local_grads<'py>(&self, py: Python<'py>, x: PyReadonlyArray1<'py, f64>, start: usize, stop: Option<usize>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        let x = x.as_array();
        let stop = stop.unwrap_or(self.0.n());
        Ok(py.detach(|| self.0.local_grads(x, start, stop))?.into_pyarray(py))
    }

    /// The local gradients of the workers `rows`, one row each in that order.
    fn local_grads_rows<'py>(&self, py: Python<'py>, x: PyReadonlyArray1<'py, f64>, rows: PyReadonlyArray1<'py, i64>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        let (x, rows) = (x.as_array(), indices(&rows, "rows")?);
        Ok(py.detach(|| self.0.local_grads_rows(x, &rows))?.into_pyarray(py))
    }

    fn local_grad_coords<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArray1<'py, f64>,
        rows: PyReadonlyArray1<'py, i64>,
        cols: PyReadonlyArray1<'py, i64>,
    ) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let (x, rows, cols) = (x.as_array(), rows.as_array(), cols.as_array());
        Ok(py.detach(|| self.0.local_grad_coords(x, rows, cols))?.into_pyarray(py))
    }

    /// `(1/n) Σ_i C_i(∇f_i(x_new) − ∇f_i(x_old))` for a spec with a shared plan.
    fn compressed_mean_diff<'py>(
        &self,
        py: Python<'py>,
        spec: &PySpec,
        x_new: PyReadonlyArray1<'py, f64>,
        x_old: PyReadonlyArray1<'py, f64>,
        seed: u64,
        round: u64,
    ) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let (x_new, x_old) = (x_new.as_array(), x_old.as_array());
        Ok(py.detach(|| self.0.compressed_mean_diff(&spec.0, x_new, x_old, seed, round))?.into_pyarray(py))
    }

    /// EF21's worker step for workers `start .. start + m` (`G` is their `(m, d)` estimators,
    /// updated in place): `(offsets, indices, values, finite)`.
    #[allow(non_snake_case, clippy::too_many_arguments)]
    #[pyo3(signature = (spec, x, G, seed, round, start=0))]
    fn error_feedback<'py>(
        &self,
        py: Python<'py>,
        spec: &PySpec,
        x: PyReadonlyArray1<'py, f64>,
        mut G: PyReadwriteArray2<'py, f64>,
        seed: u64,
        round: u64,
        start: usize,
    ) -> PyResult<FeedbackArrays<'py>> {
        let (x, gmat) = (x.as_array(), G.as_array_mut());
        let fb = py.detach(|| self.0.error_feedback(&spec.0, x, gmat, seed, round, start))?;
        let (o, i, v) = message_arrays(py, fb.messages);
        Ok((o, i, v, fb.finite))
    }

    /// DASHA-PP's round for workers `start..stop`: the participants' (`rows`, held rows from
    /// worker `row0`) values of `round`, `((∇f_i(x_new)_j − coef·∇f_i(x_old)_j) − beta·G_ij)·scale_i`
    /// with `G_ij +=` each, then their estimators `H_r += dh`, `G_r += w·dh`,
    /// `dh = ((new − old) − (H_r − old)·b)/p`, each participant's two gradients evaluated once;
    /// `divide` and `out` as in [`PyTridiagonal::round_values`].
    #[allow(non_snake_case, clippy::too_many_arguments)]
    #[pyo3(signature = (round, x_new, x_old, start, stop, *, H, G, rows, row0=0, coef, beta, b, p, w, divide=None, out=None))]
    fn dasha_pp_values<'py>(
        &self,
        py: Python<'py>,
        round: &PyRound,
        x_new: PyReadonlyArray1<'py, f64>,
        x_old: PyReadonlyArray1<'py, f64>,
        start: usize,
        stop: usize,
        H: &Bound<'py, PyAny>,
        G: &Bound<'py, PyAny>,
        rows: &Bound<'py, PyAny>,
        row0: usize,
        coef: f64,
        beta: f64,
        b: f64,
        p: f64,
        w: f64,
        divide: Option<&Bound<'py, PyAny>>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let divide = divisor(divide)?;
        let why = "updated in place; H and G not shared";
        let (mut H, mut G) = (writeable_f64_2d(H, "H", why)?, writeable_f64_2d(G, "G", why)?);
        let rows = rows
            .extract::<PyReadonlyArray1<'py, i64>>()
            .map_err(|_| PyTypeError::new_err(format!("rows: must be a 1-D int64 numpy array, got {}", type_name(rows))))?;
        let rows = indices(&rows, "rows")?;
        let (xn, xo, h, g) = (x_new.as_array(), x_old.as_array(), H.as_array_mut(), G.as_array_mut());
        let step = quadratic::PPStep { b, p, w };
        let Some(out) = out else {
            return Ok(py.detach(|| self.0.dasha_pp_values(&round.0, xn, xo, h, g, &rows, row0, coef, beta, step, start, stop, divide, None))?.into_pyarray(py));
        };
        let inputs = [("x_new", extent(&xn)), ("x_old", extent(&xo)), ("H", extent(&h.view())), ("G", extent(&g.view()))];
        let mut wr = out_array::<f64>(out, "float64", &inputs)?;
        let o = out_slice(&mut wr)?;
        py.detach(|| self.0.dasha_pp_values(&round.0, xn, xo, h, g, &rows, row0, coef, beta, step, start, stop, divide, Some(o)))?;
        Ok(out.cast::<PyArray1<f64>>()?.clone())
    }

    /// The values of workers `start..stop` of `round` in plan order:
    /// `scale_i * ((∇f_i(x)_j − coef·∇f_i(y)_j) − beta·H[i − row0, j])` (the terms present);
    /// `alpha`: `H[i − row0, j] += alpha·v` in place (H writeable); `divide`: each
    /// `(v + 0) / k`; `out`: written there and returned.
    #[allow(clippy::too_many_arguments, non_snake_case)]
    #[pyo3(signature = (round, x, y, start, stop, *, coef=1.0, H=None, row0=0, beta=1.0, alpha=None, divide=None, out=None))]
    fn round_values<'py>(
        &self,
        py: Python<'py>,
        round: &PyRound,
        x: PyReadonlyArray1<'py, f64>,
        y: Option<PyReadonlyArray1<'py, f64>>,
        start: usize,
        stop: usize,
        coef: f64,
        H: Option<&Bound<'py, PyAny>>,
        row0: usize,
        beta: f64,
        alpha: Option<f64>,
        divide: Option<&Bound<'py, PyAny>>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let divide = divisor(divide)?;
        let (x, y) = (x.as_array(), y.as_ref().map(|y| y.as_array()));
        let mut inputs = vec![("x", extent(&x))];
        if let Some(y) = &y {
            inputs.push(("y", extent(y)));
        }
        let Some(H) = H else {
            if coef != 1.0 || beta != 1.0 || alpha.is_some() || row0 != 0 {
                return Err(PyValueError::new_err("coef, beta, alpha and row0 are the shift's options: pass H with them (coef needs y)"));
            }
            let Some(out) = out else {
                return Ok(py.detach(|| self.0.round_values_div(&round.0, x, y, start, stop, divide))?.into_pyarray(py));
            };
            let mut w = out_array::<f64>(out, "float64", &inputs)?;
            let o = out_slice(&mut w)?;
            py.detach(|| self.0.round_values_into(&round.0, x, y, start, stop, divide, o))?;
            return Ok(out.cast::<PyArray1<f64>>()?.clone());
        };
        if let Some(alpha) = alpha {
            // updated in place: a writeable float64 (m, d) array
            let mut hw = writeable_f64_2d(H, "H", "updated in place with alpha")?;
            let hm = hw.as_array_mut();
            inputs.push(("H", extent(&hm.view())));
            let Some(out) = out else {
                return Ok(py.detach(|| self.0.round_values_update(&round.0, x, y, coef, hm, row0, beta, alpha, start, stop, divide, None))?.into_pyarray(py));
            };
            let mut w = out_array::<f64>(out, "float64", &inputs)?;
            let o = out_slice(&mut w)?;
            py.detach(|| self.0.round_values_update(&round.0, x, y, coef, hm, row0, beta, alpha, start, stop, divide, Some(o)))?;
            return Ok(out.cast::<PyArray1<f64>>()?.clone());
        }
        let hr = H
            .extract::<PyReadonlyArray2<'py, f64>>()
            .map_err(|_| PyTypeError::new_err(format!("H: must be a float64 numpy array of 2 dimensions, got {}", type_name(H))))?;
        let hv = hr.as_array();
        inputs.push(("H", extent(&hv)));
        let Some(out) = out else {
            return Ok(py.detach(|| self.0.round_values_shifted(&round.0, x, y, coef, hv, row0, beta, start, stop, divide, None))?.into_pyarray(py));
        };
        let mut w = out_array::<f64>(out, "float64", &inputs)?;
        let o = out_slice(&mut w)?;
        py.detach(|| self.0.round_values_shifted(&round.0, x, y, coef, hv, row0, beta, start, stop, divide, Some(o)))?;
        Ok(out.cast::<PyArray1<f64>>()?.clone())
    }

    /// `(1/n) Σ_i C_i(·)` of the whole round `round` from the values of
    /// [`PyTridiagonal::round_values`] for every worker (`H` with `alpha`: updated in place).
    #[allow(clippy::too_many_arguments, non_snake_case)]
    #[pyo3(signature = (round, x, y, *, coef=1.0, H=None, row0=0, beta=1.0, alpha=None))]
    fn round_mean<'py>(
        &self,
        py: Python<'py>,
        round: &PyRound,
        x: PyReadonlyArray1<'py, f64>,
        y: Option<PyReadonlyArray1<'py, f64>>,
        coef: f64,
        H: Option<&Bound<'py, PyAny>>,
        row0: usize,
        beta: f64,
        alpha: Option<f64>,
    ) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let (x, y) = (x.as_array(), y.as_ref().map(|y| y.as_array()));
        let Some(H) = H else {
            if coef != 1.0 || beta != 1.0 || alpha.is_some() || row0 != 0 {
                return Err(PyValueError::new_err("coef, beta, alpha and row0 are the shift's options: pass H with them (coef needs y)"));
            }
            return Ok(py.detach(|| self.0.round_mean(&round.0, x, y, 1.0, None))?.into_pyarray(py));
        };
        if alpha.is_none() {
            let hr = H
                .extract::<PyReadonlyArray2<'py, f64>>()
                .map_err(|_| PyTypeError::new_err(format!("H: must be a float64 numpy array of 2 dimensions, got {}", type_name(H))))?;
            let h = hr.as_array();
            let n = round.0.n();
            let mean = py.detach(|| self.0.round_values_shifted(&round.0, x, y, coef, h, row0, beta, 0, n, None, None).and_then(|v| round.0.mean(&v)))?;
            return Ok(mean.into_pyarray(py));
        }
        let mut hw = writeable_f64_2d(H, "H", "updated in place with alpha")?;
        let h = hw.as_array_mut();
        let shift = quadratic::MeanShift { h, row0, beta, alpha };
        Ok(py.detach(|| self.0.round_mean(&round.0, x, y, coef, Some(shift)))?.into_pyarray(py))
    }

    /// Solves `((1/n) Σ A_i) x = rhs` in `O(d)`.
    fn solve_mean<'py>(&self, py: Python<'py>, rhs: Vec<f64>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        Ok(py.detach(|| self.0.solve_mean(&rhs))?.into_pyarray(py))
    }
}
