//! The linear autoencoder's split gradients from a block's products: the last pass of
//! `LinearAutoencoder`'s gradient blocks (python/permk/experiments/autoencoder.py), which
//! writes each split's gradient row from the block's two products, on the pool's threads.
//!
//! For split `s` of a block (`d = 2 d_f d_e` coordinates: `D` row-major, then `E` row-major):
//!
//! - `out[s, j·d_e + k] = dg[j, s, k] − azw[s, j, k]` (`∇_D`: `dg` holds
//!   `D (2c/m_s) Z_sᵀZ_s + ∇_D reg`, `azw[s, :, :d_e]` holds `A_sᵀ (2c/m_s) Z_s`), in `T`;
//! - `out[s, d_f d_e + k·d_f + j] = azw[s, j, d_e + k] + r_kj` (`∇_E`: `azw[s, :, d_e:]` holds
//!   `A_sᵀ (2c/m_s) W_s`), with `r_kj = reg_e[k, j]` added in `T`, or, with a multiplicity
//!   `reg_mult`, `reg_mult[s]·reg_e[k, j]` added in f64;
//!
//! each value computed in exactly the order numpy's `subtract`/`add` would (the same bits as
//! those two passes), independently of the others: nothing depends on the thread count.

use ndarray::{ArrayView2, ArrayView3, ArrayViewMut2};
use rayon::prelude::*;

use crate::error::{CoreError, Result};
use crate::real::Real;
use crate::threads;

/// Blocks of at least this many output values are written on the pool's threads, one split
/// per task.
pub const PAR_MIN: usize = 1 << 16;
/// The width of the transpose's tiles (`∇_E`'s values of one `k` for TILE consecutive `j`).
const TILE: usize = 16;

/// Writes the split gradients of a block of `b` splits into the rows of `out` (`(b, d)`,
/// rows contiguous) from `azw` (`(b, d_f, 2 d_e)`), `dg` (`(d_f, b, d_e)`), `reg_e`
/// (`(d_e, d_f)`) and the splits' multiplicities `reg_mult` (`b` values) if any; see the
/// module's documentation.
pub fn split_grads<T: Real>(
    azw: ArrayView3<T>,
    dg: ArrayView3<T>,
    reg_e: ArrayView2<T>,
    reg_mult: Option<&[f64]>,
    mut out: ArrayViewMut2<f64>,
) -> Result<()> {
    let (b, d_f, two_de) = azw.dim();
    if two_de % 2 != 0 || two_de == 0 {
        return Err(CoreError::invalid("azw", format!("must have shape (b, d_f, 2 d_e), got {:?}", azw.dim())));
    }
    let d_e = two_de / 2;
    if dg.dim() != (d_f, b, d_e) {
        return Err(CoreError::invalid("dg", format!("must have shape (d_f, b, d_e) = ({d_f}, {b}, {d_e}), got {:?}", dg.dim())));
    }
    if reg_e.dim() != (d_e, d_f) {
        return Err(CoreError::invalid("reg_e", format!("must have shape (d_e, d_f) = ({d_e}, {d_f}), got {:?}", reg_e.dim())));
    }
    if let Some(r) = reg_mult {
        if r.len() != b {
            return Err(CoreError::invalid("reg_mult", format!("must have one value per split ({b}), got {}", r.len())));
        }
    }
    let k1 = d_f * d_e;
    if out.dim() != (b, 2 * k1) {
        return Err(CoreError::invalid("out", format!("must have shape (b, 2 d_f d_e) = ({b}, {}), got {:?}", 2 * k1, out.dim())));
    }
    let az = azw.as_slice().ok_or_else(|| CoreError::invalid("azw", "must be C-contiguous"))?;
    let dgs = dg.as_slice().ok_or_else(|| CoreError::invalid("dg", "must be C-contiguous"))?;
    let re = reg_e.as_slice().ok_or_else(|| CoreError::invalid("reg_e", "must be C-contiguous"))?;
    if b == 0 {
        return Ok(());
    }
    if out.strides()[1] != 1 || (b > 1 && out.strides()[0] != (2 * k1) as isize) {
        return Err(CoreError::invalid("out", "must be C-contiguous"));
    }
    let rows = out.as_slice_mut().ok_or_else(|| CoreError::invalid("out", "must be C-contiguous"))?;
    let write = |(s, row): (usize, &mut [f64])| {
        let a = &az[s * d_f * two_de..][..d_f * two_de];
        let (od, oe) = row.split_at_mut(k1);
        for j in 0..d_f {
            let (gd, ad) = (&dgs[(j * b + s) * d_e..][..d_e], &a[j * two_de..][..d_e]);
            for ((o, &x), &y) in od[j * d_e..][..d_e].iter_mut().zip(gd).zip(ad) {
                *o = (x - y).f64();
            }
        }
        // the transpose in tiles of TILE values of j: the tile's rows of `a` stay in L1, and each
        // k writes TILE consecutive values
        for j0 in (0..d_f).step_by(TILE) {
            let j1 = (j0 + TILE).min(d_f);
            for k in 0..d_e {
                let (o, r) = (&mut oe[k * d_f + j0..k * d_f + j1], &re[k * d_f + j0..k * d_f + j1]);
                match reg_mult {
                    None => o.iter_mut().zip(r).enumerate().for_each(|(t, (o, &r))| *o = (a[(j0 + t) * two_de + d_e + k] + r).f64()),
                    Some(m) => {
                        let ms = m[s];
                        o.iter_mut().zip(r).enumerate().for_each(|(t, (o, &r))| *o = a[(j0 + t) * two_de + d_e + k].f64() + ms * r.f64())
                    }
                }
            }
        }
    };
    if b >= 2 && b * 2 * k1 >= PAR_MIN {
        threads::install(|| rows.par_chunks_mut(2 * k1).enumerate().for_each(write))?;
    } else {
        rows.chunks_mut(2 * k1).enumerate().for_each(write);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array2, Array3};

    fn inputs(b: usize, d_f: usize, d_e: usize) -> (Array3<f64>, Array3<f64>, Array2<f64>) {
        let azw = Array3::from_shape_fn((b, d_f, 2 * d_e), |(s, j, k)| ((s * 31 + j * 7 + k * 3) % 17) as f64 * 0.25 - 2.0);
        let dg = Array3::from_shape_fn((d_f, b, d_e), |(j, s, k)| ((s * 5 + j * 11 + k) % 13) as f64 * 0.5 - 3.0);
        let re = Array2::from_shape_fn((d_e, d_f), |(k, j)| ((k * 3 + j) % 7) as f64 * 0.125);
        (azw, dg, re)
    }

    #[test]
    fn split_grads_are_the_formulas() {
        for (b, d_f, d_e) in [(1, 3, 2), (5, 7, 3), (3, 37, 4), (40, 64, 16)] {
            let (azw, dg, re) = inputs(b, d_f, d_e);
            let mult: Vec<f64> = (0..b).map(|s| 1.0 + s as f64).collect();
            for m in [None, Some(mult.as_slice())] {
                let mut out = Array2::from_elem((b, 2 * d_f * d_e), f64::NAN);
                split_grads(azw.view(), dg.view(), re.view(), m, out.view_mut()).unwrap();
                for s in 0..b {
                    for j in 0..d_f {
                        for k in 0..d_e {
                            assert_eq!(out[[s, j * d_e + k]], dg[[j, s, k]] - azw[[s, j, k]]);
                            let r = m.map_or(re[[k, j]], |m| m[s] * re[[k, j]]);
                            assert_eq!(out[[s, d_f * d_e + k * d_f + j]], azw[[s, j, d_e + k]] + r);
                        }
                    }
                }
                // the same bits on one thread and on three
                let _lock = crate::threads::TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
                let mut again = Array2::from_elem((b, 2 * d_f * d_e), f64::NAN);
                for k in [1, 3] {
                    crate::threads::set_num_threads(k).unwrap();
                    split_grads(azw.view(), dg.view(), re.view(), m, again.view_mut()).unwrap();
                    assert_eq!(again, out);
                }
            }
        }
    }

    #[test]
    fn float32_values_are_computed_in_float32() {
        let azw = Array3::from_shape_fn((1, 1, 2), |(_, _, k)| if k == 0 { 1.0f32 } else { 1e-8 });
        let dg = Array3::from_elem((1, 1, 1), 1.0f32 + f32::EPSILON);
        let re = Array2::from_elem((1, 1), 1.0f32);
        let mut out = Array2::zeros((1, 2));
        split_grads(azw.view(), dg.view(), re.view(), None, out.view_mut()).unwrap();
        assert_eq!(out[[0, 0]], f32::EPSILON as f64);
        assert_eq!(out[[0, 1]], 1.0); // 1 + 1e-8 rounds to 1 in float32
        split_grads(azw.view(), dg.view(), re.view(), Some(&[1.0]), out.view_mut()).unwrap();
        assert_eq!(out[[0, 1]], 1.0 + 1e-8f32 as f64); // with a multiplicity: added in f64
    }

    #[test]
    fn bad_shapes_are_errors() {
        let (azw, dg, re) = inputs(2, 3, 2);
        let mut out = Array2::zeros((2, 12));
        assert!(split_grads(azw.view(), dg.view(), re.view(), Some(&[1.0]), out.view_mut()).is_err());
        assert!(split_grads(azw.view(), dg.view(), re.t(), None, out.view_mut()).is_err());
        let mut short = Array2::zeros((2, 11));
        assert!(split_grads(azw.view(), dg.view(), re.view(), None, short.view_mut()).is_err());
        let mut wide = Array2::zeros((2, 24));
        assert!(split_grads(azw.view(), dg.view(), re.view(), None, wide.slice_mut(ndarray::s![.., ..12])).is_err());
        let odd = Array3::<f64>::zeros((2, 3, 3));
        assert!(split_grads(odd.view(), dg.view(), re.view(), None, out.view_mut()).is_err());
        assert!(split_grads(azw.view(), dg.view(), re.view(), None, out.view_mut()).is_ok());
    }
}
