//! The one error type of the core; the PyO3 glue maps it to Python exceptions.

use std::fmt;

#[derive(Debug, Clone, PartialEq)]
pub enum CoreError {
    /// An argument outside its domain (maps to `ValueError`).
    InvalidArgument { name: &'static str, message: String },
    /// A NaN or infinity in a value the kernel reads or produces (maps to `ValueError`).
    NonFinite { what: &'static str, worker: usize, coord: usize },
}

impl CoreError {
    pub fn invalid(name: &'static str, message: impl Into<String>) -> Self {
        CoreError::InvalidArgument { name, message: message.into() }
    }
}

impl fmt::Display for CoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CoreError::InvalidArgument { name, message } => write!(f, "{name}: {message}"),
            CoreError::NonFinite { what, worker, coord } => write!(
                f,
                "non-finite value (NaN or inf) in {what} at worker {worker}, coordinate {coord}"
            ),
        }
    }
}

impl std::error::Error for CoreError {}

pub type Result<T> = std::result::Result<T, CoreError>;
