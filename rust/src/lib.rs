//! permk's Rust core: shared randomness, the paper's compressors and the quadratic kernels.
//!
//! The core is pure Rust on `ndarray` views (`cargo test --no-default-features`); the PyO3
//! glue lives in `py.rs` behind the default `python` feature.

pub mod compress;
pub mod error;
pub mod quadratic;
pub mod rng;

#[cfg(feature = "python")]
mod py;
