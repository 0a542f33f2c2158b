//! The PyO3 glue: argument conversion, dtype dispatch, GIL release and error mapping only.
//! Every computation lives in the pure-Rust modules; a new sparsifier needs nothing here
//! (`Spec(name, **params)` goes through [`Spec::from_name`]).

use numpy::ndarray::{ArrayView, ArrayView1, ArrayView2, Dimension};
use numpy::{
    IntoPyArray, PyArray1, PyArray2, PyArrayDescrMethods, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyReadonlyArray3, PyReadwriteArray1, PyReadwriteArray2,
    PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString};

use crate::compress::{self, CsrArrays, Messages, Real, Spec};
use crate::error::CoreError;
use crate::params::{Params, Value};
use crate::plan::Ranges;
use crate::round::{Divisor, PendingRound, Round};
use crate::sparsify::{blockpermk, permk};
use crate::{autoencoder, mem, quadratic, rng, rowdots, threads};

use std::borrow::Cow;
use std::sync::Arc;

impl From<CoreError> for PyErr {
    fn from(e: CoreError) -> PyErr {
        let message = e.to_string();
        match e {
            CoreError::InvalidArgument { .. } | CoreError::NonFinite { .. } => PyValueError::new_err(message),
            CoreError::WrongType { .. } => PyTypeError::new_err(message),
            CoreError::Memory { .. } => PyMemoryError::new_err(message),
            CoreError::Threads(_) | CoreError::Internal(_) => PyRuntimeError::new_err(message),
        }
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

/// One `**params` value: an int, a float, a list of ints or a string (`None` is absent).
fn param_value(key: &str, v: &Bound<'_, PyAny>) -> PyResult<Option<Value>> {
    if v.is_none() {
        return Ok(None);
    }
    if v.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!("{key}: must be an int, a float, a list of ints or a str, got a bool")));
    }
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(Some(Value::Str(s.to_str()?.to_owned())));
    }
    if let Ok(i) = v.extract::<i64>() {
        return Ok(Some(Value::Int(i)));
    }
    if v.is_instance_of::<PyInt>() || v.call_method0("__index__").is_ok() {
        return Err(PyValueError::new_err(format!("{key}: the integer {v} is out of range")));
    }
    if v.is_instance_of::<PyFloat>() {
        return Ok(Some(Value::Float(v.extract::<f64>()?)));
    }
    if let Ok(list) = v.extract::<Vec<i64>>() {
        return Ok(Some(Value::Ints(list)));
    }
    Err(PyTypeError::new_err(format!("{key}: must be an int, a float, a list of ints or a str, got {}", type_name(v))))
}

type PlanArrays<'py> = (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<f64>>);

fn plan_arrays(py: Python<'_>, p: CsrArrays) -> PlanArrays<'_> {
    (p.offsets.into_pyarray(py), p.coords.into_pyarray(py), p.scales.into_pyarray(py))
}

type FeedbackArrays<'py> = (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>, Bound<'py, PyAny>, bool);

type MessageArrays<'py> = (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>, Bound<'py, PyAny>);

fn message_arrays<T: numpy::Element>(py: Python<'_>, m: Messages<T>) -> MessageArrays<'_> {
    (m.offsets.into_pyarray(py), m.indices.into_pyarray(py), m.values.into_pyarray(py).into_any())
}

/// A compressor specification (sparsifier ∘ quantizer) with the Rust kernels attached.
#[pyclass(frozen, module = "permk._core", name = "Spec")]
pub struct PySpec(Arc<Spec>);

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
        fn go<'py, T: Real + numpy::Element>(
            py: Python<'py>,
            spec: &Spec,
            g: ArrayView2<T>,
            rows: Option<&[usize]>,
            h: Option<ArrayView2<T>>,
            beta: f64,
            start: usize,
            n: usize,
            seed: u64,
            round: u64,
        ) -> PyResult<Option<MessageArrays<'py>>> {
            let m = py.detach(|| compress::compress_shifted_rows(spec, g, rows, h, beta, start, n, seed, round))?;
            Ok(m.map(|m| message_arrays(py, m)))
        }
        let rows = match &rows {
            None => None,
            Some(r) => {
                let r = r.as_array();
                let mut out = mem::vec::<usize>("rows", r.len())?;
                for &v in r {
                    out.push(usize::try_from(v).map_err(|_| CoreError::invalid("rows", format!("must be non-negative, got {v}")))?);
                }
                Some(out)
            }
        };
        let rows = rows.as_deref();
        let h = H.map(|h| arr2(h, "H")).transpose()?;
        match (arr2(G, "G")?, h) {
            (Arr2::F64(g), None) => go(py, &self.0, g.as_array(), rows, None, beta, start, n_workers, seed, round),
            (Arr2::F32(g), None) => go(py, &self.0, g.as_array(), rows, None, beta, start, n_workers, seed, round),
            (Arr2::F64(g), Some(Arr2::F64(h))) => go(py, &self.0, g.as_array(), rows, Some(h.as_array()), beta, start, n_workers, seed, round),
            (Arr2::F32(g), Some(Arr2::F32(h))) => go(py, &self.0, g.as_array(), rows, Some(h.as_array()), beta, start, n_workers, seed, round),
            _ => Err(PyTypeError::new_err("G and H must have the same dtype (float64 or float32)")),
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

fn ranges_arrays(py: Python<'_>, r: Option<Ranges>) -> Option<PlanArrays<'_>> {
    r.map(|Ranges { starts, stops, scales }| (starts.into_pyarray(py), stops.into_pyarray(py), scales.into_pyarray(py)))
}

/// A 1-D float64 array as a slice: borrowed when contiguous, else copied (memory checked).
fn slice_of<'a>(x: &'a ArrayView1<'a, f64>, name: &str) -> PyResult<Cow<'a, [f64]>> {
    if let Some(s) = x.as_slice() {
        return Ok(Cow::Borrowed(s));
    }
    let what = format!("a copy of {name}");
    crate::mem::Need::new().array::<f64>(&what, &[x.len()]).check()?;
    Ok(Cow::Owned(crate::mem::collect(&what, x.len(), x.iter().copied())?))
}

/// The name of `v`'s type, for messages.
fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
}

/// The `divide` option: `None`, or an int (`operator.index`) in `[1, 2**53]`: TypeError for
/// anything else than an int (a bool, a float), ValueError for an int out of range.
fn divisor(v: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Divisor>> {
    let Some(v) = v else { return Ok(None) };
    let not_int = || PyTypeError::new_err(format!("divide: must be an int (or None), got {}", type_name(v)));
    if v.is_instance_of::<PyBool>() {
        return Err(not_int());
    }
    let k = v.py().import("operator")?.call_method1("index", (v,)).map_err(|_| not_int())?;
    match k.extract::<i64>() {
        Ok(k) if k >= 1 => Ok(Some(Divisor::new(k as u64)?)),
        _ => Err(PyValueError::new_err(format!("divide: must be an integer in [1, 2**53], got {k}"))),
    }
}

/// The bytes `[lo, hi)` the elements of `v` span (`lo == hi` when it has none): the bounds
/// `np.may_share_memory` compares.
fn extent<T, D: Dimension>(v: &ArrayView<'_, T, D>) -> (usize, usize) {
    if v.is_empty() {
        return (0, 0);
    }
    let size = std::mem::size_of::<T>() as isize;
    let p = v.as_ptr() as isize;
    let (mut lo, mut hi) = (p, p + size);
    for (&n, &s) in v.shape().iter().zip(v.strides()) {
        let e = (n as isize - 1) * s * size;
        if e < 0 {
            lo += e;
        } else {
            hi += e;
        }
    }
    (lo as usize, hi as usize)
}

/// `out` (the argument of that name) borrowed for writing: a writeable C-contiguous 1-D numpy
/// array of `T` (`dtype` names it) whose memory does not overlap any of `inputs` (their byte
/// ranges, as `np.may_share_memory`). TypeError when it is not a numpy array, ValueError
/// otherwise; nothing is written here (its length is checked by the kernel, also before
/// writing).
fn out_array<'py, T: numpy::Element>(out: &Bound<'py, PyAny>, dtype: &str, inputs: &[(&str, (usize, usize))]) -> PyResult<PyReadwriteArray1<'py, T>> {
    let arr = out.cast::<PyUntypedArray>().map_err(|_| PyTypeError::new_err(format!("out: must be a numpy array (or None), got {}", type_name(out))))?;
    if arr.ndim() != 1 {
        return Err(PyValueError::new_err(format!("out: must be a 1-D array, got {} dimensions", arr.ndim())));
    }
    if !arr.dtype().is_equiv_to(&numpy::dtype::<T>(out.py())) {
        return Err(PyValueError::new_err(format!("out: must have dtype {dtype}, got {}", arr.dtype())));
    }
    if !arr.is_c_contiguous() {
        return Err(PyValueError::new_err("out: must be C-contiguous"));
    }
    if !out.getattr("flags")?.getattr("writeable")?.extract::<bool>()? {
        return Err(PyValueError::new_err("out: must be writeable"));
    }
    let typed = arr.cast::<PyArray1<T>>()?;
    let mine = {
        let p = typed.data() as usize;
        (p, p + typed.len() * std::mem::size_of::<T>())
    };
    for &(name, (lo, hi)) in inputs {
        if mine.0 < mine.1 && lo < hi && mine.0 < hi && lo < mine.1 {
            return Err(PyValueError::new_err(format!("out: must not share memory with {name}")));
        }
    }
    typed.try_readwrite().map_err(|e| PyValueError::new_err(format!("out: cannot be written: {e}")))
}

/// The borrowed `out` as a slice (C-contiguous: checked by [`out_array`]).
fn out_slice<'a, T: numpy::Element>(w: &'a mut PyReadwriteArray1<'_, T>) -> PyResult<&'a mut [T]> {
    w.as_slice_mut().map_err(|_| PyValueError::new_err("out: must be C-contiguous"))
}

/// One round's plan of a spec with a shared plan, computed once (`Spec.round`, `Spec.round_ahead`).
#[pyclass(frozen, module = "permk._core", name = "Round")]
pub struct PyRound(Round);

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
pub struct PyPendingRound(PendingRound);

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
fn permk_plan_from_permutations(py: Python<'_>, n: usize, d: usize, pi_d: Vec<u32>, pi_n: Vec<u32>) -> PyResult<PlanArrays<'_>> {
    let p = py.detach(|| permk::plan_from_permutations(n, d, &pi_d, &pi_n))?;
    Ok(plan_arrays(py, p))
}

/// The block permutation plan from an explicit permutation of the workers; `labels[j]` is the
/// block of coordinate `j` (PermK for `n > d` is `labels = range(d)`).
#[pyfunction]
fn block_plan_from_permutation(py: Python<'_>, labels: Vec<u32>, pi: Vec<u32>) -> PyResult<PlanArrays<'_>> {
    let p = py.detach(|| blockpermk::plan_from_permutation(labels, pi))?;
    Ok(plan_arrays(py, p))
}

/// MARINA's shared Bernoulli(p) coin of round `round`.
#[pyfunction]
fn coin(seed: u64, round: u64, p: f64) -> bool {
    rng::coin(seed, round, p)
}

/// A uniformly random permutation of range(n) shared by all workers: a pure function of
/// (seed, round).
#[pyfunction]
fn permutation(py: Python<'_>, seed: u64, round: u64, n: usize) -> PyResult<Bound<'_, PyArray1<i64>>> {
    let p = py.detach(|| rng::shared_permutation(seed, round, n))?;
    Ok(p.into_pyarray(py))
}

/// `out[i] = Σ_t x[ix[i], t] · y[iy[i], t]` (f64 products and sums, in a fixed order) for two
/// float64 or two float32 matrices with contiguous rows of one length.
#[pyfunction]
fn row_dots<'py>(
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
fn autoencoder_split_grads<'py>(
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
fn autoencoder_shifted_messages<'py>(
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
    fn go<'py, T: Real + numpy::Element>(
        py: Python<'py>,
        spec: &Spec,
        zwa: PyReadonlyArray3<'_, T>,
        gram: PyReadonlyArray3<'_, T>,
        c: &Coefs<'_>,
        h: Option<ArrayView2<'_, f64>>,
        args: (f64, usize, usize, u64, u64, bool),
    ) -> PyResult<Option<MessageArrays<'py>>> {
        let (beta, start, n, seed, round, on_caller) = args;
        let block = block(&zwa, &gram, c)?;
        let m = py.detach(|| where_run(on_caller, || autoencoder::shifted_messages(spec, &block, h, beta, start, n, seed, round)))?;
        Ok(m.map(|m| message_arrays(py, m)))
    }
    let (products, coefs) = autoencoder_args(zwa, gram, dec, reg_d, reg_e, cs, rs)?;
    let h =
        H.map(|h| h.extract::<PyReadonlyArray2<'py, f64>>().map_err(|_| PyTypeError::new_err("H must be a 2-D float64 numpy array or None"))).transpose()?;
    let hv = h.as_ref().map(|h| h.as_array());
    let args = (beta, start, n_workers, seed, round, on_caller);
    match products {
        Products::F64(a, g) => go(py, &spec.0, a, g, &coefs, hv, args),
        Products::F32(a, g) => go(py, &spec.0, a, g, &coefs, hv, args),
    }
}

/// Sets the number of threads of the core's pool.
#[pyfunction]
fn set_num_threads(py: Python<'_>, k: usize) -> PyResult<()> {
    Ok(py.detach(|| threads::set_num_threads(k))?)
}

/// The number of threads of the core's pool.
#[pyfunction]
fn get_num_threads(py: Python<'_>) -> PyResult<usize> {
    Ok(py.detach(threads::num_threads)?)
}

/// The synthetic quadratic's oracles (Algorithm 1): `A_i = a_i T + c I`, `b_i = beta_i e_1`.
#[pyclass(frozen, module = "permk._core", name = "Tridiagonal")]
pub struct PyTridiagonal(quadratic::Tridiagonal);

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

    /// The values of workers `start..stop` of `round` in plan order:
    /// `scale_i * (∇f_i(x)_j − ∇f_i(y)_j)` (`scale_i * ∇f_i(x)_j` when `y` is None);
    /// `divide`: each `(v + 0) / k`; `out`: written there and returned.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (round, x, y, start, stop, *, divide=None, out=None))]
    fn round_values<'py>(
        &self,
        py: Python<'py>,
        round: &PyRound,
        x: PyReadonlyArray1<'py, f64>,
        y: Option<PyReadonlyArray1<'py, f64>>,
        start: usize,
        stop: usize,
        divide: Option<&Bound<'py, PyAny>>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let divide = divisor(divide)?;
        let (x, y) = (x.as_array(), y.as_ref().map(|y| y.as_array()));
        let Some(out) = out else {
            return Ok(py.detach(|| self.0.round_values_div(&round.0, x, y, start, stop, divide))?.into_pyarray(py));
        };
        let mut inputs = vec![("x", extent(&x))];
        if let Some(y) = &y {
            inputs.push(("y", extent(y)));
        }
        let mut w = out_array::<f64>(out, "float64", &inputs)?;
        let o = out_slice(&mut w)?;
        py.detach(|| self.0.round_values_into(&round.0, x, y, start, stop, divide, o))?;
        Ok(out.cast::<PyArray1<f64>>()?.clone())
    }

    /// Solves `((1/n) Σ A_i) x = rhs` in `O(d)`.
    fn solve_mean<'py>(&self, py: Python<'py>, rhs: Vec<f64>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        Ok(py.detach(|| self.0.solve_mean(&rhs))?.into_pyarray(py))
    }
}

#[pymodule]
#[pyo3(name = "_core")]
fn core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<PySpec>()?;
    m.add_class::<PyTridiagonal>()?;
    m.add_class::<PyRound>()?;
    m.add_class::<PyPendingRound>()?;
    m.add_function(wrap_pyfunction!(permk_plan_from_permutations, m)?)?;
    m.add_function(wrap_pyfunction!(block_plan_from_permutation, m)?)?;
    m.add_function(wrap_pyfunction!(coin, m)?)?;
    m.add_function(wrap_pyfunction!(permutation, m)?)?;
    m.add_function(wrap_pyfunction!(row_dots, m)?)?;
    m.add_function(wrap_pyfunction!(autoencoder_split_grads, m)?)?;
    m.add_function(wrap_pyfunction!(autoencoder_shifted_messages, m)?)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(get_num_threads, m)?)?;
    Ok(())
}
