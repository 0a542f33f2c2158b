//! permk's Rust core: shared randomness, the paper's compressors and the quadratic kernels.
//!
//! The core is pure Rust on `ndarray` views (`cargo test --no-default-features`); the PyO3
//! glue lives in `py/` (one file per concept, shared helpers in `py/mod.rs`) behind the default
//! `python` feature.
//!
//! - [`sparsify`]: the sparsifiers, one type per file, each implementing
//!   [`sparsify::Sparsify`], listed once in the registry of `sparsify/mod.rs`;
//! - [`compress`]: [`compress::Spec`] (sparsifier ∘ quantizer) and its entry points;
//! - [`balanced`]: PermK's default sampler, a uniformly random balanced assignment drawn in
//!   coordinate order;
//! - [`plan`]: assignments and plans; [`kernels`]: the aggregation kernels;
//! - [`round`]: one round's plan computed once (or ahead, on a background thread) and used
//!   natively: the held workers' values and the average from them;
//! - [`quadratic`]: the synthetic quadratic's oracles and fused method steps;
//! - [`rowdots`]: dot products of selected rows (the linear autoencoder's coordinates);
//! - [`autoencoder`]: the linear autoencoder's split gradients from a block's products;
//! - [`rng`]: the pinned random streams; [`numpy_rng`]: numpy's `default_rng(...).permutation`
//!   natively (partial participation's draw); [`mem`]: the memory guard; [`threads`]: the pool;
//!   [`params`]: compressor parameters; [`error`]: the one error type.

pub mod autoencoder;
pub mod balanced;
pub mod compress;
pub mod error;
pub mod kernels;
pub mod mem;
pub mod numpy_rng;
pub mod params;
pub mod plan;
pub mod quadratic;
pub mod real;
pub mod rng;
pub mod rowdots;
pub mod round;
pub mod sparsify;
pub mod threads;

#[cfg(feature = "python")]
mod py;
