//! The float types the kernels accept.

use num_traits::Float;

pub trait Real: Float + crate::mem::Zeroed + Send + Sync + std::fmt::Debug + std::ops::AddAssign + 'static {
    fn of(x: f64) -> Self;
    fn f64(self) -> f64;
    /// The magnitude as an integer key, ordered like `|x|` for finite `x` (the bits with the
    /// sign cleared); `>= Self::NON_FINITE_KEY` exactly for NaN and ±inf.
    fn magnitude_key(self) -> u64;
    /// The non-negative value whose [`Real::magnitude_key`] is `key`, for `key <=
    /// NON_FINITE_KEY + 1` (that one is a NaN, which compares false with everything).
    fn of_magnitude_key(key: u64) -> Self;
    const NON_FINITE_KEY: u64;
}

impl Real for f64 {
    #[inline]
    fn of(x: f64) -> Self {
        x
    }
    #[inline]
    fn f64(self) -> f64 {
        self
    }
    #[inline]
    fn magnitude_key(self) -> u64 {
        self.to_bits() & 0x7FFF_FFFF_FFFF_FFFF
    }
    #[inline]
    fn of_magnitude_key(key: u64) -> Self {
        f64::from_bits(key)
    }
    const NON_FINITE_KEY: u64 = 0x7FF0_0000_0000_0000;
}

impl Real for f32 {
    #[inline]
    fn of(x: f64) -> Self {
        x as f32
    }
    #[inline]
    fn f64(self) -> f64 {
        self as f64
    }
    #[inline]
    fn magnitude_key(self) -> u64 {
        (self.to_bits() & 0x7FFF_FFFF) as u64
    }
    #[inline]
    fn of_magnitude_key(key: u64) -> Self {
        f32::from_bits(key as u32)
    }
    const NON_FINITE_KEY: u64 = 0x7F80_0000;
}
