//! The linear autoencoder's kernels: selected rows' dot products, split gradients, messages.

use super::*;

/// `out[i] = Σ_t x[ix[i], t] · y[iy[i], t]` (f64 products and sums, in a fixed order) for two
/// float64 or two float32 matrices with contiguous rows of one length.
#[pyfunction]
pub(super) fn row_dots<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    ix: PyReadonlyArray1<'py, i64>,
    y: &Bound<'py, PyAny>,
    iy: PyReadonlyArray1<'py, i64>,
) -> PyResult<Bound<'py, PyArray1<f64>>> {
    let (ix, iy) = (ix.as_slice()?, iy.as_slice()?);
    let out = match (arr2(x, "x")?, arr2(y, "y")?) {
        (Arr2::F64(a), Arr2::F64(b)) => {
            let (a, b) = (a.as_array(), b.as_array());
            py.detach(|| rowdots::row_dots(a, ix, b, iy))?
        }
        (Arr2::F32(a), Arr2::F32(b)) => {
            let (a, b) = (a.as_array(), b.as_array());
            py.detach(|| rowdots::row_dots(a, ix, b, iy))?
        }
        _ => return Err(PyTypeError::new_err("x and y must have the same dtype (float64 or float32)")),
    };
    Ok(out.into_pyarray(py))
}

/// A block's products and Gram matrices for the autoencoder's kernels: `zwa` and `gram`, both
/// float64 or both float32.
enum Products<'py> {
    F64(PyReadonlyArray3<'py, f64>, PyReadonlyArray3<'py, f64>),
    F32(PyReadonlyArray3<'py, f32>, PyReadonlyArray3<'py, f32>),
}

/// The float64 arguments of the autoencoder's kernels: `dec`, `reg_d`, `reg_e`, `cs`, `rs`.
type Coefs<'py> = (PyReadonlyArray2<'py, f64>, PyReadonlyArray2<'py, f64>, PyReadonlyArray2<'py, f64>, PyReadonlyArray1<'py, f64>, PyReadonlyArray1<'py, f64>);

#[allow(clippy::too_many_arguments)]
fn autoencoder_args<'py>(
    zwa: &Bound<'py, PyAny>,
    gram: &Bound<'py, PyAny>,
    dec: &Bound<'py, PyAny>,
    reg_d: &Bound<'py, PyAny>,
    reg_e: &Bound<'py, PyAny>,
    cs: &Bound<'py, PyAny>,
    rs: &Bound<'py, PyAny>,
) -> PyResult<(Products<'py>, Coefs<'py>)> {
    let products = if let (Ok(a), Ok(g)) = (zwa.extract(), gram.extract()) {
        Products::F64(a, g)
    } else if let (Ok(a), Ok(g)) = (zwa.extract(), gram.extract()) {
        Products::F32(a, g)
    } else {
        return Err(PyTypeError::new_err("zwa and gram must be 3-D numpy arrays, both float64 or both float32"));
    };
    let m2 = |a: &Bound<'py, PyAny>, name: &str| {
        a.extract::<PyReadonlyArray2<'py, f64>>().map_err(|_| PyTypeError::new_err(format!("{name} must be a 2-D float64 numpy array")))
    };
    let m1 = |a: &Bound<'py, PyAny>, name: &str| {
        a.extract::<PyReadonlyArray1<'py, f64>>().map_err(|_| PyTypeError::new_err(format!("{name} must be a 1-D float64 numpy array")))
    };
    Ok((products, (m2(dec, "dec")?, m2(reg_d, "reg_d")?, m2(reg_e, "reg_e")?, m1(cs, "cs")?, m1(rs, "rs")?)))
}

/// The checked block of the autoencoder's kernels.
fn block<'a, T: Real + numpy::Element>(
    zwa: &'a PyReadonlyArray3<'_, T>,
    gram: &'a PyReadonlyArray3<'_, T>,
    c: &'a Coefs<'_>,
) -> PyResult<autoencoder::Block<'a, T>> {
    Ok(autoencoder::Block::new(zwa.as_array(), gram.as_array(), c.0.as_array(), c.1.as_array(), c.2.as_array(), c.3.as_slice()?, c.4.as_slice()?)?)
}

/// The linear autoencoder's split gradients of a block of `b` splits, written into the rows of
/// `out` (`(b, d)` float64) from the block's products `zwa` (`(b, 2 d_e, d_f)`: `[Z_s W_s]ᵀA_s`)
/// and Gram matrices `gram` (`(b, d_e, d_e)`: `Z_sᵀZ_s`), both float64 or both float32, the
/// decoder `dec` (`D`, `(d_f, d_e)`), the regulariser's gradients `reg_d` (`(d_f, d_e)`) and
/// `reg_e` (`(d_e, d_f)`) and the splits' coefficients `cs`, `rs` (`b` values each), all float64
/// (see rust/src/autoencoder.rs); `on_caller`: on the calling thread only, not on the core's pool
/// (for a caller that runs blocks on threads of its own).
#[pyfunction]
#[pyo3(signature = (zwa, gram, dec, reg_d, reg_e, cs, rs, out, *, on_caller = false))]
#[allow(clippy::too_many_arguments)]
pub(super) fn autoencoder_split_grads<'py>(
    py: Python<'py>,
    zwa: &Bound<'py, PyAny>,
    gram: &Bound<'py, PyAny>,
    dec: &Bound<'py, PyAny>,
    reg_d: &Bound<'py, PyAny>,
    reg_e: &Bound<'py, PyAny>,
    cs: &Bound<'py, PyAny>,
    rs: &Bound<'py, PyAny>,
    out: &Bound<'py, PyAny>,
    on_caller: bool,
) -> PyResult<()> {
    fn go<T: Real + numpy::Element>(
        py: Python<'_>,
        zwa: PyReadonlyArray3<'_, T>,
        gram: PyReadonlyArray3<'_, T>,
        c: &Coefs<'_>,
        out: numpy::ndarray::ArrayViewMut2<'_, f64>,
        on_caller: bool,
    ) -> PyResult<()> {
        let block = block(&zwa, &gram, c)?;
        Ok(py.detach(|| where_run(on_caller, || autoencoder::split_grads(&block, out)))?)
    }
    let (products, coefs) = autoencoder_args(zwa, gram, dec, reg_d, reg_e, cs, rs)?;
    let mut out = out.extract::<PyReadwriteArray2<'py, f64>>().map_err(|_| PyTypeError::new_err("out must be a writeable 2-D float64 numpy array"))?;
    let o = out.as_array_mut();
    match products {
        Products::F64(a, g) => go(py, a, g, &coefs, o, on_caller),
        Products::F32(a, g) => go(py, a, g, &coefs, o, on_caller),
    }
}

/// `f()` on the calling thread only ([`threads::on_caller`]) when `on_caller`, else as usual.
fn where_run<R>(on_caller: bool, f: impl FnOnce() -> R) -> R {
    if on_caller {
        threads::on_caller(f)
    } else {
        f()
    }
}

/// The messages of workers `start .. start + b` (for `n_workers` in all) of `spec` on the
/// inputs `g_s − β·h_s`, `g_s` the split gradients [`autoencoder_split_grads`] would write
/// (same arguments) and `h_s` the rows of `H` (`(b, d)` float64, rows contiguous; without `H`,
/// `g_s`): `Spec.compress_shifted_rows` on those rows, bit for bit, without writing them; None
/// when an input is not finite. `on_caller` as for [`autoencoder_split_grads`].
#[pyfunction]
#[pyo3(signature = (spec, zwa, gram, dec, reg_d, reg_e, cs, rs, H, beta, start, n_workers, seed, round, *, on_caller = false))]
#[allow(clippy::too_many_arguments, non_snake_case)]
pub(super) fn autoencoder_shifted_messages<'py>(
    py: Python<'py>,
    spec: &PySpec,
    zwa: &Bound<'py, PyAny>,
    gram: &Bound<'py, PyAny>,
    dec: &Bound<'py, PyAny>,
    reg_d: &Bound<'py, PyAny>,
    reg_e: &Bound<'py, PyAny>,
    cs: &Bound<'py, PyAny>,
    rs: &Bound<'py, PyAny>,
    H: Option<&Bound<'py, PyAny>>,
    beta: f64,
    start: usize,
    n_workers: usize,
    seed: u64,
    round: u64,
    on_caller: bool,
) -> PyResult<Option<MessageArrays<'py>>> {
    #[allow(clippy::too_many_arguments)]
    fn go<'py, T: Real + numpy::Element, U: Real>(
        py: Python<'py>,
        spec: &Spec,
        zwa: PyReadonlyArray3<'_, T>,
        gram: PyReadonlyArray3<'_, T>,
        c: &Coefs<'_>,
        h: Option<ArrayView2<'_, U>>,
        args: (f64, usize, usize, u64, u64, bool),
    ) -> PyResult<Option<MessageArrays<'py>>> {
        let (beta, start, n, seed, round, on_caller) = args;
        let block = block(&zwa, &gram, c)?;
        let m = py.detach(|| where_run(on_caller, || autoencoder::shifted_messages(spec, &block, h, beta, start, n, seed, round)))?;
        Ok(m.map(|m| message_arrays(py, m)))
    }
    let (products, coefs) = autoencoder_args(zwa, gram, dec, reg_d, reg_e, cs, rs)?;
    // the estimators in float64, or in float32 (a float32 problem's EF21 state)
    let h = H.map(|h| arr2(h, "H")).transpose().map_err(|_| PyTypeError::new_err("H must be a 2-D float64 or float32 numpy array or None"))?;
    let args = (beta, start, n_workers, seed, round, on_caller);
    match (products, h) {
        (Products::F64(a, g), None) => go(py, &spec.0, a, g, &coefs, None::<ArrayView2<'_, f64>>, args),
        (Products::F32(a, g), None) => go(py, &spec.0, a, g, &coefs, None::<ArrayView2<'_, f64>>, args),
        (Products::F64(a, g), Some(Arr2::F64(h))) => go(py, &spec.0, a, g, &coefs, Some(h.as_array()), args),
        (Products::F32(a, g), Some(Arr2::F64(h))) => go(py, &spec.0, a, g, &coefs, Some(h.as_array()), args),
        (Products::F64(a, g), Some(Arr2::F32(h))) => go(py, &spec.0, a, g, &coefs, Some(h.as_array()), args),
        (Products::F32(a, g), Some(Arr2::F32(h))) => go(py, &spec.0, a, g, &coefs, Some(h.as_array()), args),
    }
}
