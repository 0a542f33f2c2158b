//! The PyO3 glue: argument conversion, dtype dispatch, GIL release and error mapping only.
//! Every computation lives in the pure-Rust modules; a new sparsifier needs nothing here
//! (`Spec(name, **params)` goes through [`Spec::from_name`]).
//!
//! One file per concept of the core: [`spec`] (a compressor and its kernels), [`round`] (one
//! round's plan, used natively), [`random`] (the shared streams), [`tridiagonal`] (the synthetic
//! quadratic's oracles), [`linear_autoencoder`] (the linear autoencoder's kernels); this file holds the
//! module, the error mapping and the argument helpers they share.

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

mod linear_autoencoder;
mod random;
mod round;
mod spec;
mod tridiagonal;

use self::tridiagonal::PyTridiagonal;
use self::round::{PyPendingRound, PyRound};
use self::spec::PySpec;

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

/// An int64 index array (`name`: worker or row indices) as `usize`s: a ValueError naming it for
/// a negative entry (the core checks the upper bounds), a MemoryError when the copy cannot be
/// allocated.
fn indices(a: &PyReadonlyArray1<'_, i64>, name: &str) -> PyResult<Vec<usize>> {
    let a = a.as_array();
    let mut out = mem::vec::<usize>(name, a.len())?;
    for &v in a {
        out.push(usize::try_from(v).map_err(|_| CoreError::invalid(name, format!("must be non-negative, got {v}")))?);
    }
    Ok(out)
}

/// `a` as a writeable float64 array of 2 dimensions, updated in place (`why`), or a TypeError
/// naming it.
fn writeable_f64_2d<'py>(a: &Bound<'py, PyAny>, name: &str, why: &str) -> PyResult<PyReadwriteArray2<'py, f64>> {
    a.extract::<PyReadwriteArray2<'py, f64>>()
        .map_err(|_| PyTypeError::new_err(format!("{name}: must be a writeable float64 numpy array of 2 dimensions ({why}), got {}", type_name(a))))
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

#[pymodule]
#[pyo3(name = "_core")]
fn core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<PySpec>()?;
    m.add_class::<PyTridiagonal>()?;
    m.add_class::<PyRound>()?;
    m.add_class::<PyPendingRound>()?;
    m.add_function(wrap_pyfunction!(round::permk_plan_from_permutations, m)?)?;
    m.add_function(wrap_pyfunction!(round::block_plan_from_permutation, m)?)?;
    m.add_function(wrap_pyfunction!(random::coin, m)?)?;
    m.add_function(wrap_pyfunction!(random::permutation, m)?)?;
    m.add_function(wrap_pyfunction!(linear_autoencoder::row_dots, m)?)?;
    m.add_function(wrap_pyfunction!(linear_autoencoder::autoencoder_split_grads, m)?)?;
    m.add_function(wrap_pyfunction!(linear_autoencoder::autoencoder_shifted_messages, m)?)?;
    m.add_function(wrap_pyfunction!(random::numpy_permutation_head, m)?)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(get_num_threads, m)?)?;
    Ok(())
}
