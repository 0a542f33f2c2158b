//! Dot products of selected rows of two matrices (the linear autoencoder's coordinate oracle):
//! `out[i] = Σ_t x[ix[i], t] · y[iy[i], t]`, each product and sum in f64, in a fixed order
//! (four partial sums over `t ≡ 0, 1, 2, 3 (mod 4)`, then `(s0 + s1) + (s2 + s3)`, then the
//! tail), in chunks of fixed size on the pool's threads: results never depend on the thread
//! count. Only the selected rows are read, in place (no gathered copies).

use ndarray::ArrayView2;
use rayon::prelude::*;

use crate::error::{CoreError, Result};
use crate::kernels::prefetch;
use crate::real::Real;
use crate::{mem, threads};

/// Outputs per task; inputs of at least two chunks run on the pool's threads.
const CHUNK: usize = 2048;
/// How many rows ahead the loop prefetches.
const AHEAD: usize = 8;

/// Prefetches every cache line of `row` (a row of the images is 60 values: 4 or 8 lines, of
/// which a prefetch of its first line alone brings one or two).
#[inline(always)]
fn prefetch_row<T>(row: &[T]) {
    let bytes = std::mem::size_of_val(row);
    let p = row.as_ptr() as *const u8;
    for off in (0..bytes).step_by(64) {
        prefetch(p.wrapping_add(off));
    }
    if bytes > 0 {
        prefetch(p.wrapping_add(bytes - 1));
    }
}

#[inline]
fn dot<T: Real>(a: &[T], b: &[T]) -> f64 {
    let n4 = a.len() / 4 * 4;
    let mut s = [0.0f64; 4];
    for t in (0..n4).step_by(4) {
        for u in 0..4 {
            s[u] += a[t + u].f64() * b[t + u].f64();
        }
    }
    let mut tail = 0.0f64;
    for t in n4..a.len() {
        tail += a[t].f64() * b[t].f64();
    }
    ((s[0] + s[1]) + (s[2] + s[3])) + tail
}

fn rows_of(idx: &[i64], rows: usize, name: &str) -> Result<Vec<usize>> {
    idx.iter()
        .map(|&r| {
            usize::try_from(r)
                .ok()
                .filter(|&r| r < rows)
                .ok_or_else(|| CoreError::invalid(name, format!("row {r} is outside range({rows})")))
        })
        .collect()
}

/// `out[i] = Σ_t x[ix[i], t] · y[iy[i], t]` for matrices with contiguous rows of one length.
pub fn row_dots<T: Real>(x: ArrayView2<T>, ix: &[i64], y: ArrayView2<T>, iy: &[i64]) -> Result<Vec<f64>> {
    if ix.len() != iy.len() {
        return Err(CoreError::invalid("iy", format!("must have the length of ix ({}), got {}", ix.len(), iy.len())));
    }
    let len = x.ncols();
    if y.ncols() != len {
        return Err(CoreError::invalid("y", format!("rows must have the length of x's ({len}), got {}", y.ncols())));
    }
    let xs = x.as_slice().ok_or_else(|| CoreError::invalid("x", "must be C-contiguous"))?;
    let ys = y.as_slice().ok_or_else(|| CoreError::invalid("y", "must be C-contiguous"))?;
    let rx = rows_of(ix, x.nrows(), "ix")?;
    let ry = rows_of(iy, y.nrows(), "iy")?;
    let n = rx.len();
    let mut out = mem::filled("the dot products", n, 0.0f64)?;
    let work = |(c, chunk): (usize, &mut [f64])| {
        let lo = c * CHUNK;
        for (k, o) in chunk.iter_mut().enumerate() {
            let i = lo + k;
            if i + AHEAD < n {
                prefetch_row(&xs[rx[i + AHEAD] * len..][..len]);
                prefetch_row(&ys[ry[i + AHEAD] * len..][..len]);
            }
            *o = dot(&xs[rx[i] * len..][..len], &ys[ry[i] * len..][..len]);
        }
    };
    if n >= 2 * CHUNK {
        threads::install(|| out.par_chunks_mut(CHUNK).enumerate().for_each(work))?;
    } else {
        out.chunks_mut(CHUNK).enumerate().for_each(work);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;

    #[test]
    fn row_dots_are_the_dot_products_of_the_rows() {
        // quarter-integers: every product and sum is exact, whatever the order
        let x = Array2::from_shape_fn((7, 11), |(i, j)| (i * 11 + j) as f64 * 0.5 - 3.0);
        let y = Array2::from_shape_fn((5, 11), |(i, j)| ((i + 2) * (j + 1)) as f64 * 0.25);
        let ix: Vec<i64> = (0..5000).map(|i| (i * 3 % 7) as i64).collect();
        let iy: Vec<i64> = (0..5000).map(|i| (i * 2 % 5) as i64).collect();
        let got = row_dots(x.view(), &ix, y.view(), &iy).unwrap();
        for (i, g) in got.iter().enumerate() {
            let want: f64 = (0..11).map(|t| x[[ix[i] as usize, t]] * y[[iy[i] as usize, t]]).sum();
            assert_eq!(*g, want);
        }
        let xf = x.mapv(|v| v as f32);
        let yf = y.mapv(|v| v as f32);
        assert_eq!(row_dots(xf.view(), &ix, yf.view(), &iy).unwrap(), got);
        assert!(row_dots(x.view(), &[7], y.view(), &[0]).is_err());
        assert!(row_dots(x.view(), &[-1], y.view(), &[0]).is_err());
        assert!(row_dots(x.view(), &[0, 1], y.view(), &[0]).is_err());
    }
}
