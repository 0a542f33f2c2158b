//! The one error type of the core; the PyO3 glue maps it to Python exceptions (one
//! `From<CoreError> for PyErr`): invalid arguments and non-finite data to `ValueError`, wrong
//! types to `TypeError`, memory to `MemoryError`, thread-pool and internal failures to
//! `RuntimeError`.

use std::fmt;

#[derive(Debug, Clone, PartialEq)]
pub enum CoreError {
    /// An argument outside its domain (maps to `ValueError`). `name` is the argument's name.
    InvalidArgument { name: String, message: String },
    /// An argument of the wrong kind, e.g. a float where an integer is needed (maps to `TypeError`).
    WrongType { name: String, message: String },
    /// A NaN or infinity in a value the kernel reads or produces (maps to `ValueError`).
    NonFinite { what: &'static str, worker: usize, coord: usize },
    /// An allocation the machine cannot hold: estimated before allocating (above the physical
    /// memory), an overflowing size, or a failed allocation (maps to `MemoryError`). `what`
    /// names the array with its shape and data type; `bytes` is its size; `note` says more.
    Memory { what: String, bytes: u128, note: String },
    /// The thread pool could not be started (maps to `RuntimeError`).
    Threads(String),
    /// A failure of the core itself: a background thread that could not start or panicked
    /// (maps to `RuntimeError`). The message says what failed.
    Internal(String),
}

impl CoreError {
    /// `Ok(v)` when `v` is finite, else an [`CoreError::InvalidArgument`] naming it: the one
    /// check of a scalar coefficient (`alpha`, `beta`, `coef`, ...) that may be any finite
    /// real, made before anything is written.
    pub fn finite(name: &str, v: f64) -> Result<f64> {
        if v.is_finite() {
            Ok(v)
        } else {
            Err(CoreError::invalid(name, format!("must be finite, got {v}")))
        }
    }

    /// `Ok(())` when every entry of `values` is finite, else an [`CoreError::InvalidArgument`]
    /// naming `name` and the first entry that is not: [`Self::finite`] for an array.
    pub fn all_finite(name: &str, values: &[f64]) -> Result<()> {
        match values.iter().position(|v| !v.is_finite()) {
            None => Ok(()),
            Some(i) => Err(CoreError::invalid(name, format!("must be finite, got {} at index {i}", values[i]))),
        }
    }

    pub fn invalid(name: impl Into<String>, message: impl Into<String>) -> Self {
        CoreError::InvalidArgument { name: name.into(), message: message.into() }
    }

    pub fn wrong_type(name: impl Into<String>, message: impl Into<String>) -> Self {
        CoreError::WrongType { name: name.into(), message: message.into() }
    }
}

/// A byte count as numpy writes it in its `MemoryError`s: three significant digits and a
/// binary unit (`745 GiB`, `7.45 MiB`, `12 bytes`).
pub fn format_bytes(bytes: u128) -> String {
    const UNITS: [&str; 9] = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut unit = ((127 - bytes.leading_zeros()) / 10) as usize;
    let mut value = bytes as f64 / (1u128 << (10 * unit)) as f64;
    if value.round() >= 1024.0 && unit + 1 < UNITS.len() {
        unit += 1;
        value /= 1024.0;
    }
    if unit >= UNITS.len() {
        return format!("{bytes} bytes");
    }
    let digits = if value >= 99.95 {
        0
    } else if value >= 9.995 {
        1
    } else {
        2
    };
    let mut s = format!("{value:.digits$}");
    if s.contains('.') {
        s = s.trim_end_matches('0').trim_end_matches('.').to_string();
    }
    format!("{s} {}", UNITS[unit])
}

impl fmt::Display for CoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CoreError::InvalidArgument { name, message } | CoreError::WrongType { name, message } => {
                write!(f, "{name}: {message}")
            }
            CoreError::NonFinite { what, worker, coord } => write!(
                f,
                "non-finite value (NaN or inf) in {what} at worker {worker}, coordinate {coord}"
            ),
            CoreError::Memory { what, bytes, note } => {
                write!(f, "Unable to allocate {} for {what}{note}", format_bytes(*bytes))
            }
            CoreError::Threads(message) => write!(f, "could not start the thread pool: {message}"),
            CoreError::Internal(message) => write!(f, "{message}"),
        }
    }
}

impl std::error::Error for CoreError {}

pub type Result<T> = std::result::Result<T, CoreError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_written_like_numpy() {
        assert_eq!(format_bytes(12), "12 bytes");
        assert_eq!(format_bytes(1024), "1 KiB");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(800_000_000_000), "745 GiB");
        assert_eq!(format_bytes(8_000_000), "7.63 MiB");
        assert_eq!(format_bytes((1 << 20) - 1), "1 MiB");
        assert_eq!(format_bytes(u128::MAX), format!("{} bytes", u128::MAX));
    }

    #[test]
    fn finite_names_the_scalar() {
        assert_eq!(CoreError::finite("alpha", -2.5), Ok(-2.5));
        for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let e = CoreError::finite("alpha", v).unwrap_err();
            assert!(matches!(&e, CoreError::InvalidArgument { name, .. } if name == "alpha"), "{e:?}");
            assert!(e.to_string().starts_with("alpha: must be finite, got "), "{e}");
        }
        assert_eq!(CoreError::all_finite("rhs", &[1.0, -2.0]), Ok(()));
        assert_eq!(CoreError::all_finite("rhs", &[1.0, f64::NAN, f64::INFINITY]).unwrap_err().to_string(), "rhs: must be finite, got NaN at index 1");
    }
}
