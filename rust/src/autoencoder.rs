//! The linear autoencoder's split gradients from a block's products: the last pass of
//! `LinearAutoencoder`'s gradient blocks (python/permk/problems/autoencoder.py), which
//! finishes each split's gradient row from the block's product, its Gram matrix and `D`, on the
//! pool's threads: into the rows of an array ([`split_grads`]), or, for the error-feedback
//! exchange, into a worker's buffer where its estimator is subtracted and the row compressed at
//! once ([`shifted_messages`]: the gradients are never written out).
//!
//! For split `s` of a block (`d = 2 d_f d_e` coordinates: `D` row-major, then `E` row-major),
//! with `c = cs[s]` (the data term's `2c/m_s`, times a multiplicity) and `r = rs[s]` (the
//! regulariser's multiplicity, 1 without one):
//!
//! - `row[j·d_e + k] = c·((D Z_sᵀZ_s)[j, k] − zwa[s, k, j]) + r·reg_d[j, k]` (`∇_D`:
//!   `zwa[s, :d_e]` holds `Z_sᵀ A_s`; `(D Z_sᵀZ_s)[j, k] = Σ_l dec[j, l]·gram[s, l, k]`, summed
//!   over `l = 0, 1, …` in that order, `D` = `dec` and `Z_sᵀZ_s` = `gram[s]`);
//! - `row[d_f d_e + k·d_f + j] = c·zwa[s, d_e + k, j] + r·reg_e[k, j]` (`∇_E`: `zwa[s, d_e:]`
//!   holds `W_sᵀ A_s`);
//!
//! in f64 (the products and Gram matrices, float64 or float32, converted first), each value
//! independently of the others: nothing depends on the thread count. The products come in the
//! layout BLAS writes fastest (`[Z_s W_s]ᵀ A_s`, rows of `d_f`), so `∇_E` is written along rows
//! and `∇_D` through a transpose. `D Z_sᵀZ_s` (`d_e` multiply-adds per value) is computed here,
//! in the pass, rather than by BLAS into a buffer read back: its inner dimension `d_e` is too
//! small for BLAS to run near its peak, and the pass needs its values once.

use ndarray::{ArrayView2, ArrayView3, ArrayViewMut2};
use rayon::prelude::*;

use crate::compress::{self, Messages, Shift, Spec};
use crate::error::{CoreError, Result};
use crate::real::Real;
use crate::threads;

/// Blocks of at least this many output values are written on the pool's threads (when it has
/// more than one), one split per task.
pub const PAR_MIN: usize = 1 << 16;
/// The side of the transpose's tiles (`∇_D`'s values of TILE consecutive `j` and `k`).
const TILE: usize = 16;

/// A block of `b` splits' products and the coefficients that finish their gradients (see the
/// module's documentation), checked.
pub struct Block<'a, T> {
    zwa: &'a [T],
    gram: &'a [T],
    dec: &'a [f64],
    reg_d: &'a [f64],
    reg_e: &'a [f64],
    cs: &'a [f64],
    rs: &'a [f64],
    b: usize,
    d_f: usize,
    d_e: usize,
}

fn contiguous<'a, T, D: ndarray::Dimension>(a: &ndarray::ArrayView<'a, T, D>, name: &str) -> Result<&'a [T]> {
    a.to_slice().ok_or_else(|| CoreError::invalid(name, "must be C-contiguous"))
}

impl<'a, T: Real> Block<'a, T> {
    /// `zwa` `(b, 2 d_e, d_f)`, `gram` `(b, d_e, d_e)`, `dec`, `reg_d` `(d_f, d_e)`, `reg_e`
    /// `(d_e, d_f)`, `cs`, `rs` `b` values each; all C-contiguous.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        zwa: ArrayView3<'a, T>,
        gram: ArrayView3<'a, T>,
        dec: ArrayView2<'a, f64>,
        reg_d: ArrayView2<'a, f64>,
        reg_e: ArrayView2<'a, f64>,
        cs: &'a [f64],
        rs: &'a [f64],
    ) -> Result<Self> {
        let (b, two_de, d_f) = zwa.dim();
        if two_de % 2 != 0 || two_de == 0 {
            return Err(CoreError::invalid("zwa", format!("must have shape (b, 2 d_e, d_f), got {:?}", zwa.dim())));
        }
        let d_e = two_de / 2;
        if gram.dim() != (b, d_e, d_e) {
            return Err(CoreError::invalid("gram", format!("must have shape (b, d_e, d_e) = ({b}, {d_e}, {d_e}), got {:?}", gram.dim())));
        }
        if dec.dim() != (d_f, d_e) {
            return Err(CoreError::invalid("dec", format!("must have shape (d_f, d_e) = ({d_f}, {d_e}), got {:?}", dec.dim())));
        }
        if reg_d.dim() != (d_f, d_e) {
            return Err(CoreError::invalid("reg_d", format!("must have shape (d_f, d_e) = ({d_f}, {d_e}), got {:?}", reg_d.dim())));
        }
        if reg_e.dim() != (d_e, d_f) {
            return Err(CoreError::invalid("reg_e", format!("must have shape (d_e, d_f) = ({d_e}, {d_f}), got {:?}", reg_e.dim())));
        }
        for (name, v) in [("cs", cs), ("rs", rs)] {
            if v.len() != b {
                return Err(CoreError::invalid(name, format!("must have one value per split ({b}), got {}", v.len())));
            }
        }
        Ok(Block {
            zwa: contiguous(&zwa, "zwa")?,
            gram: contiguous(&gram, "gram")?,
            dec: contiguous(&dec, "dec")?,
            reg_d: contiguous(&reg_d, "reg_d")?,
            reg_e: contiguous(&reg_e, "reg_e")?,
            cs,
            rs,
            b,
            d_f,
            d_e,
        })
    }

    /// The number of splits.
    pub fn splits(&self) -> usize {
        self.b
    }

    /// The gradients' dimension `2 d_f d_e`.
    pub fn d(&self) -> usize {
        2 * self.d_f * self.d_e
    }

    /// Writes split `s`'s gradient row `g` into `out` (`d` values), or `g − β·h` given a row
    /// `h` of `d` values; compiled for AVX2 when the CPU has it (detected at run time: the same
    /// values at every vector width, as Rust never contracts `a·b + c` into a fused
    /// multiply-add and a transpose only moves values).
    #[inline]
    fn fill<U: Real>(&self, s: usize, out: &mut [f64], h: Option<&[U]>, shift: Shift) {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU supports AVX2 (checked just above).
                return unsafe { fill_avx2(self, s, out, h, shift, Avx2(())) };
            }
        }
        self.fill_shifted(s, out, h, shift, Portable)
    }

    #[inline(always)]
    fn fill_shifted<U: Real, X: Transpose>(&self, s: usize, out: &mut [f64], h: Option<&[U]>, shift: Shift, x: X) {
        match h {
            None => self.fill_row(s, out, None::<&[U]>, |v, _| v, x),
            Some(h) if shift.is_one() => self.fill_row(s, out, Some(h), |v, y: U| v - y.f64(), x),
            Some(h) => self.fill_row(s, out, Some(h), |v, y: U| shift.apply_mixed(v, y), x),
        }
    }

    /// Writes split `s`'s gradient row `g` into `out`, or `op(g, h)` value by value with a row
    /// `h` (subtracted as each part is written, while the row is in L1).
    #[inline(always)]
    fn fill_row<U: Real, F: Fn(f64, U) -> f64 + Copy, X: Transpose>(&self, s: usize, out: &mut [f64], h: Option<&[U]>, op: F, x: X) {
        let (d_f, d_e) = (self.d_f, self.d_e);
        let k1 = d_f * d_e;
        let (c, r) = (self.cs[s], self.rs[s]);
        let za = &self.zwa[s * 2 * k1..][..k1];
        let wa = &self.zwa[s * 2 * k1 + k1..][..k1];
        let gram = &self.gram[s * d_e * d_e..][..d_e * d_e];
        let dec = self.dec;
        // (D Z_sᵀZ_s)[j, k], the sum in order of l
        let dg = |j: usize, k: usize| (0..d_e).fold(0.0, |acc, l| acc + dec[j * d_e + l] * gram[l * d_e + k].f64());
        let (od, oe) = out.split_at_mut(k1);
        // ∇_E along rows
        match h {
            None => oe.iter_mut().zip(wa).zip(self.reg_e).for_each(|((o, &x), &re)| *o = c * x.f64() + r * re),
            Some(h) => {
                let v = wa.iter().zip(self.reg_e).map(|(&x, &re)| c * x.f64() + r * re);
                oe.iter_mut().zip(v).zip(&h[k1..]).for_each(|((o, v), &y)| *o = op(v, y))
            }
        }
        // ∇_D through a TILE × TILE tile on the stack (rows j, columns k): the transpose of `za`
        // (a whole tile read along its rows into `rows`, then transposed; a partial one at the
        // edges read value by value), then c (D Z_sᵀZ_s − zaᵀ) with D Z_sᵀZ_s along the tile's rows
        // (two rows at a time: 2 × TILE independent sums), written along rows of ∇_D
        let mut rows: Tile = [[0.0; TILE]; TILE];
        let mut tile: Tile = [[0.0; TILE]; TILE];
        for j0 in (0..d_f).step_by(TILE) {
            let w = (d_f - j0).min(TILE);
            for k0 in (0..d_e).step_by(TILE) {
                let ht = (d_e - k0).min(TILE);
                if w == TILE && ht == TILE {
                    for (kk, row) in rows.iter_mut().enumerate() {
                        row.iter_mut().zip(&za[(k0 + kk) * d_f + j0..][..TILE]).for_each(|(v, &z)| *v = z.f64());
                    }
                    x.transpose(&rows, &mut tile);
                    for t in (0..TILE).step_by(2) {
                        let mut acc = [[0.0f64; TILE]; 2];
                        for l in 0..d_e {
                            let gl = &gram[l * d_e + k0..][..TILE];
                            for (q, a) in acc.iter_mut().enumerate() {
                                let dj = dec[(j0 + t + q) * d_e + l];
                                a.iter_mut().zip(gl).for_each(|(a, &g)| *a += dj * g.f64());
                            }
                        }
                        for (q, a) in acc.iter().enumerate() {
                            tile[t + q].iter_mut().zip(a).for_each(|(v, &g)| *v = c * (g - *v));
                        }
                    }
                } else {
                    for (t, row) in tile[..w].iter_mut().enumerate() {
                        for (kk, v) in row[..ht].iter_mut().enumerate() {
                            *v = c * (dg(j0 + t, k0 + kk) - za[(k0 + kk) * d_f + j0 + t].f64());
                        }
                    }
                }
                for (t, row) in tile[..w].iter().enumerate() {
                    let at = (j0 + t) * d_e + k0;
                    let o = &mut od[at..][..ht];
                    for ((o, &v), &rd) in o.iter_mut().zip(&row[..ht]).zip(&self.reg_d[at..][..ht]) {
                        *o = v + r * rd;
                    }
                    if let Some(h) = h {
                        o.iter_mut().zip(&h[at..][..ht]).for_each(|(o, &y)| *o = op(*o, y));
                    }
                }
            }
        }
    }
}

/// A TILE × TILE block of values, row by row.
type Tile = [[f64; TILE]; TILE];

/// How [`Block::fill`] transposes a whole tile (`dst[t][k] = src[k][t]`).
trait Transpose: Copy {
    fn transpose(self, src: &Tile, dst: &mut Tile);
}

/// Value by value.
#[derive(Clone, Copy)]
struct Portable;

impl Transpose for Portable {
    #[inline(always)]
    fn transpose(self, src: &Tile, dst: &mut Tile) {
        for (k, row) in src.iter().enumerate() {
            for (t, &v) in row.iter().enumerate() {
                dst[t][k] = v;
            }
        }
    }
}

/// In 4 × 4 blocks of AVX registers; made only where the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Avx2(());

#[cfg(target_arch = "x86_64")]
impl Transpose for Avx2 {
    #[inline(always)]
    fn transpose(self, src: &Tile, dst: &mut Tile) {
        // SAFETY: an `Avx2` exists only where the CPU supports AVX2 (see `Block::fill`).
        unsafe { transpose_avx2(src, dst) }
    }
}

/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
#[allow(unused_unsafe)] // the intrinsics are safe in a function with the feature from Rust 1.87 on
unsafe fn transpose_avx2(src: &Tile, dst: &mut Tile) {
    use std::arch::x86_64::{_mm256_loadu_pd, _mm256_permute2f128_pd, _mm256_storeu_pd, _mm256_unpackhi_pd, _mm256_unpacklo_pd};
    for a in (0..TILE).step_by(4) {
        for b in (0..TILE).step_by(4) {
            // rows a … a + 3 of `src`, columns b … b + 3 (in bounds: TILE is a multiple of 4)
            let r = [0, 1, 2, 3].map(|i| unsafe { _mm256_loadu_pd(src[a + i][b..].as_ptr()) });
            unsafe {
                let (t0, t1) = (_mm256_unpacklo_pd(r[0], r[1]), _mm256_unpackhi_pd(r[0], r[1]));
                let (t2, t3) = (_mm256_unpacklo_pd(r[2], r[3]), _mm256_unpackhi_pd(r[2], r[3]));
                _mm256_storeu_pd(dst[b][a..].as_mut_ptr(), _mm256_permute2f128_pd::<0x20>(t0, t2));
                _mm256_storeu_pd(dst[b + 1][a..].as_mut_ptr(), _mm256_permute2f128_pd::<0x20>(t1, t3));
                _mm256_storeu_pd(dst[b + 2][a..].as_mut_ptr(), _mm256_permute2f128_pd::<0x31>(t0, t2));
                _mm256_storeu_pd(dst[b + 3][a..].as_mut_ptr(), _mm256_permute2f128_pd::<0x31>(t1, t3));
            }
        }
    }
}

/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fill_avx2<T: Real, U: Real>(block: &Block<'_, T>, s: usize, out: &mut [f64], h: Option<&[U]>, shift: Shift, x: Avx2) {
    block.fill_shifted(s, out, h, shift, x)
}

/// Writes the block's split gradients into the rows of `out` (`(b, d)`, rows contiguous).
pub fn split_grads<T: Real>(block: &Block<'_, T>, mut out: ArrayViewMut2<f64>) -> Result<()> {
    let (b, d) = (block.splits(), block.d());
    if out.dim() != (b, d) {
        return Err(CoreError::invalid("out", format!("must have shape (b, 2 d_f d_e) = ({b}, {d}), got {:?}", out.dim())));
    }
    if b == 0 {
        return Ok(());
    }
    let rows = out.as_slice_mut().ok_or_else(|| CoreError::invalid("out", "must be C-contiguous"))?;
    let write = |(s, row): (usize, &mut [f64])| block.fill(s, row, None::<&[f64]>, Shift::ONE);
    if threads::spread(b, b * d, PAR_MIN)? {
        threads::install(|| rows.par_chunks_mut(d).enumerate().for_each(write))?;
    } else {
        rows.chunks_mut(d).enumerate().for_each(write);
    }
    Ok(())
}

/// The messages of workers `start .. start + b` (one per split of the block, for `n` workers in
/// all) whose inputs are the split gradients `g_s − β·h_s` (`h` `(b, d)`, or `g_s` without it):
/// bit for bit [`compress::compress_shifted_rows`] on the rows [`split_grads`] writes, without
/// writing them: each row is finished, shifted, checked and compressed in a worker's buffer.
/// `None` when an input is not finite.
#[allow(clippy::too_many_arguments)]
pub fn shifted_messages<T: Real, U: Real>(
    spec: &Spec,
    block: &Block<'_, T>,
    h: Option<ArrayView2<U>>,
    beta: f64,
    start: usize,
    n: usize,
    seed: u64,
    round: u64,
) -> Result<Option<Messages<f64>>> {
    let (b, d) = (block.splits(), block.d());
    let shift = Shift::new(beta)?;
    let h = match h {
        None => None,
        Some(h) if h.dim() != (b, d) => return Err(CoreError::invalid("H", format!("must have shape (b, 2 d_f d_e) = ({b}, {d}), got {:?}", h.dim()))),
        Some(h) if h.strides()[1] != 1 => return Err(CoreError::invalid("H", "must have contiguous rows")),
        Some(h) => Some(h),
    };
    compress::compress_filled_rows(spec, b, d, start, n, seed, round, |s, buf: &mut [f64]| {
        block.fill(s, buf, h.as_ref().and_then(|h| h.row(s).to_slice()), shift)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::{compress_shifted_rows, Quantizer, RandK, TopK};
    use ndarray::{s, Array2, Array3, ArrayView2};

    type Inputs = (Array3<f64>, Array3<f64>, Array2<f64>, Array2<f64>, Array2<f64>);

    /// Products, Gram matrices and D with values of many magnitudes (so that the order of a sum
    /// shows in its bits), and the regulariser's gradients.
    fn inputs(b: usize, d_f: usize, d_e: usize) -> Inputs {
        let zwa = Array3::from_shape_fn((b, 2 * d_e, d_f), |(s, k, j)| ((s * 31 + j * 7 + k * 3) % 17) as f64 * 0.25 - 2.0);
        let gram = Array3::from_shape_fn((b, d_e, d_e), |(s, l, k)| ((s * 5 + l * 11 + k) % 13) as f64 * 0.1 - 0.7);
        let dec = Array2::from_shape_fn((d_f, d_e), |(j, l)| ((j * 3 + l * 7) % 19) as f64 * 10f64.powi((l % 5) as i32 - 2) / 3.0);
        let rd = Array2::from_shape_fn((d_f, d_e), |(j, k)| ((k * 5 + j) % 11) as f64 * 0.375);
        let re = Array2::from_shape_fn((d_e, d_f), |(k, j)| ((k * 3 + j) % 7) as f64 * 0.125);
        (zwa, gram, dec, rd, re)
    }

    fn coefs(b: usize) -> (Vec<f64>, Vec<f64>) {
        ((0..b).map(|s| 0.1 + s as f64 / 3.0).collect(), (0..b).map(|s| 1.0 + s as f64).collect())
    }

    /// The module's formulas, value by value.
    fn formulas(inp: &Inputs, cs: &[f64], rs: &[f64]) -> Array2<f64> {
        let (zwa, gram, dec, rd, re) = inp;
        let (b, two_de, d_f) = zwa.dim();
        let d_e = two_de / 2;
        Array2::from_shape_fn((b, 2 * d_f * d_e), |(s, i)| {
            if i < d_f * d_e {
                let (j, k) = (i / d_e, i % d_e);
                let mut dg = 0.0;
                for l in 0..d_e {
                    dg += dec[[j, l]] * gram[[s, l, k]];
                }
                cs[s] * (dg - zwa[[s, k, j]]) + rs[s] * rd[[j, k]]
            } else {
                let (k, j) = ((i - d_f * d_e) / d_f, (i - d_f * d_e) % d_f);
                cs[s] * zwa[[s, d_e + k, j]] + rs[s] * re[[k, j]]
            }
        })
    }

    fn block<'a>(inp: &'a Inputs, cs: &'a [f64], rs: &'a [f64]) -> Block<'a, f64> {
        Block::new(inp.0.view(), inp.1.view(), inp.2.view(), inp.3.view(), inp.4.view(), cs, rs).unwrap()
    }

    #[test]
    fn split_grads_are_the_formulas() {
        for (b, d_f, d_e) in [(1, 3, 2), (5, 7, 3), (3, 37, 4), (40, 64, 16)] {
            let inp = inputs(b, d_f, d_e);
            let (cs, rs) = coefs(b);
            let want = formulas(&inp, &cs, &rs);
            let mut out = Array2::from_elem((b, 2 * d_f * d_e), f64::NAN);
            split_grads(&block(&inp, &cs, &rs), out.view_mut()).unwrap();
            assert_eq!(out, want);
            // the same bits on one thread and on three
            let _lock = crate::threads::TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
            let mut again = Array2::from_elem((b, 2 * d_f * d_e), f64::NAN);
            for k in [1, 3] {
                crate::threads::set_num_threads(k).unwrap();
                split_grads(&block(&inp, &cs, &rs), again.view_mut()).unwrap();
                assert_eq!(again, out);
            }
        }
    }

    #[test]
    fn the_portable_fill_writes_the_same_bits() {
        // whole tiles and partial ones at both edges; with and without a shifted row
        for (b, d_f, d_e) in [(2, 64, 16), (2, 37, 20), (1, 16, 32)] {
            let inp = inputs(b, d_f, d_e);
            let (cs, rs) = coefs(b);
            let blk = block(&inp, &cs, &rs);
            let d = blk.d();
            let h: Vec<f64> = (0..d).map(|i| (i % 23) as f64 * 0.5 - 4.0).collect();
            for s in 0..b {
                for (hh, shift) in [(None, Shift::ONE), (Some(&h[..]), Shift::ONE), (Some(&h[..]), Shift::new(0.3).unwrap())] {
                    let (mut fast, mut portable) = (vec![f64::NAN; d], vec![f64::NAN; d]);
                    blk.fill(s, &mut fast, hh, shift);
                    blk.fill_shifted(s, &mut portable, hh, shift, Portable);
                    assert_eq!(fast.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), portable.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
                }
            }
            let mut src: Tile = [[0.0; TILE]; TILE];
            src.iter_mut().flatten().enumerate().for_each(|(i, v)| *v = i as f64);
            let mut dst: Tile = [[f64::NAN; TILE]; TILE];
            Portable.transpose(&src, &mut dst);
            assert!((0..TILE).all(|t| (0..TILE).all(|k| dst[t][k] == src[k][t])));
        }
    }

    #[test]
    fn float32_products_are_finished_in_float64() {
        let zwa = Array3::from_shape_fn((1, 2, 1), |(_, k, _)| if k == 0 { 1.0f32 } else { 1e-8 });
        let gram = Array3::from_elem((1, 1, 1), 1.0f32 + f32::EPSILON);
        let (dec, rd, re) = (Array2::from_elem((1, 1), 1.0), Array2::from_elem((1, 1), 0.0), Array2::from_elem((1, 1), 1.0));
        let mut out = Array2::zeros((1, 2));
        split_grads(&Block::new(zwa.view(), gram.view(), dec.view(), rd.view(), re.view(), &[1.0], &[1.0]).unwrap(), out.view_mut()).unwrap();
        assert_eq!(out[[0, 0]], f32::EPSILON as f64);
        assert_eq!(out[[0, 1]], 1.0 + 1e-8f32 as f64); // 1 + 1e-8 would round to 1 in float32
    }

    #[test]
    fn shifted_messages_are_the_compressed_shifted_rows() {
        let _lock = crate::threads::TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let specs = [
            Spec::new(TopK { k: 5 }, Quantizer::None).unwrap(),
            Spec::new(RandK { k: 9 }, Quantizer::None).unwrap(),
            Spec::new(TopK { k: 3 }, Quantizer::Natural).unwrap(),
        ];
        for (b, d_f, d_e) in [(3, 7, 2), (12, 300, 16)] {
            let inp = inputs(b, d_f, d_e);
            let (cs, rs) = coefs(b);
            let g = formulas(&inp, &cs, &rs);
            let h = g.mapv(|v| 0.7 * v + 0.01);
            for sp in &specs {
                for (start, n) in [(0, b), (4, b + 9)] {
                    for beta in [1.0, 0.3] {
                        let want = compress_shifted_rows(sp, g.view(), None, Some(h.view()), beta, start, n, 5, 2).unwrap();
                        assert!(want.is_some());
                        for k in [1, 3] {
                            crate::threads::set_num_threads(k).unwrap();
                            let got = shifted_messages(sp, &block(&inp, &cs, &rs), Some(h.view()), beta, start, n, 5, 2).unwrap();
                            assert_eq!(got, want, "{sp:?} beta={beta} start={start}");
                        }
                    }
                    // float32 estimators (EF21's state of a float32 problem): h·β in float32, then subtracted in float64
                    let h32 = h.mapv(|v| v as f32);
                    for beta in [1.0, 0.3] {
                        let v = Array2::from_shape_fn(g.dim(), |(i, j)| g[[i, j]] - if beta == 1.0 { h32[[i, j]] as f64 } else { (h32[[i, j]] * beta as f32) as f64 });
                        let want = compress_shifted_rows(sp, v.view(), None, None::<ArrayView2<f64>>, 1.0, start, n, 5, 2).unwrap();
                        assert_eq!(compress_shifted_rows(sp, g.view(), None, Some(h32.view()), beta, start, n, 5, 2).unwrap(), want);
                        assert_eq!(shifted_messages(sp, &block(&inp, &cs, &rs), Some(h32.view()), beta, start, n, 5, 2).unwrap(), want, "{sp:?} f32 h");
                    }
                    let want = compress_shifted_rows(sp, g.view(), None, None::<ArrayView2<f64>>, 1.0, start, n, 5, 2).unwrap();
                    assert_eq!(shifted_messages(sp, &block(&inp, &cs, &rs), None::<ArrayView2<f64>>, 1.0, start, n, 5, 2).unwrap(), want);
                }
            }
        }
    }

    #[test]
    fn shifted_messages_report_non_finite_inputs() {
        let sp = Spec::new(TopK { k: 2 }, Quantizer::None).unwrap();
        let (b, d_f, d_e) = (4, 9, 2);
        for (s, j, k) in [(0, 0, 0), (3, 8, 3), (2, 4, 1)] {
            for bad in [f64::NAN, f64::INFINITY] {
                let mut inp = inputs(b, d_f, d_e);
                inp.0[[s, k, j]] = bad; // a value of Z_sᵀA_s or W_sᵀA_s, wherever it is
                let (cs, rs) = coefs(b);
                assert_eq!(shifted_messages(&sp, &block(&inp, &cs, &rs), None::<ArrayView2<f64>>, 1.0, 0, b, 0, 0).unwrap(), None);
            }
        }
        let inp = inputs(b, d_f, d_e);
        let (cs, rs) = coefs(b);
        let mut h = Array2::zeros((b, 2 * d_f * d_e));
        h[[1, 30]] = f64::NAN;
        assert_eq!(shifted_messages(&sp, &block(&inp, &cs, &rs), Some(h.view()), 1.0, 0, b, 0, 0).unwrap(), None);
        h[[1, 30]] = 0.0;
        assert!(shifted_messages(&sp, &block(&inp, &cs, &rs), Some(h.view()), 1.0, 0, b, 0, 0).unwrap().is_some());
        // bad arguments
        assert!(shifted_messages(&sp, &block(&inp, &cs, &rs), Some(h.view()), f64::NAN, 0, b, 0, 0).is_err());
        assert!(shifted_messages(&sp, &block(&inp, &cs, &rs), Some(h.slice(s![..3, ..])), 1.0, 0, b, 0, 0).is_err());
        assert!(shifted_messages(&sp, &block(&inp, &cs, &rs), Some(h.slice(s![.., ..;2])), 1.0, 0, b, 0, 0).is_err());
        assert!(shifted_messages(&sp, &block(&inp, &cs, &rs), None::<ArrayView2<f64>>, 1.0, 1, b, 0, 0).is_err());
        // beyond n
    }

    #[test]
    fn bad_shapes_are_errors() {
        let (zwa, gram, dec, rd, re) = inputs(2, 3, 2);
        let (cs, rs) = coefs(2);
        type V2<'a> = ArrayView2<'a, f64>;
        let new = |a: ArrayView3<'_, f64>, g: ArrayView3<'_, f64>, m: V2<'_>, d: V2<'_>, e: V2<'_>, c: &[f64], r: &[f64]| {
            Block::new(a, g, m, d, e, c, r).is_err()
        };
        assert!(!new(zwa.view(), gram.view(), dec.view(), rd.view(), re.view(), &cs, &rs));
        assert!(new(zwa.view(), gram.view(), dec.view(), rd.view(), re.view(), &cs, &rs[..1]));
        assert!(new(zwa.view(), gram.view(), dec.view(), rd.view(), re.view(), &cs[..1], &rs));
        assert!(new(zwa.view(), gram.view(), dec.view(), rd.view(), re.t(), &cs, &rs));
        assert!(new(zwa.view(), gram.view(), dec.view(), re.view(), re.view(), &cs, &rs));
        assert!(new(zwa.view(), gram.view(), dec.view(), rd.view(), rd.t(), &cs, &rs)); // reg_e's shape, not contiguous
        assert!(new(zwa.view(), gram.slice(s![.., .., ..1]), dec.view(), rd.view(), re.view(), &cs, &rs));
        assert!(new(zwa.view(), gram.view(), re.view(), rd.view(), re.view(), &cs, &rs));
        let odd = Array3::<f64>::zeros((2, 3, 3));
        assert!(new(odd.view(), gram.view(), dec.view(), rd.view(), re.view(), &cs, &rs));
        let inp = (zwa, gram, dec, rd, re);
        let b = block(&inp, &cs, &rs);
        let mut short = Array2::zeros((2, 11));
        assert!(split_grads(&b, short.view_mut()).is_err());
        let mut wide = Array2::zeros((2, 24));
        assert!(split_grads(&b, wide.slice_mut(s![.., ..12])).is_err());
        let mut out = Array2::zeros((2, 12));
        assert!(split_grads(&b, out.view_mut()).is_ok());
    }
}
