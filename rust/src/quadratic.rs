//! The synthetic quadratic of the paper's Algorithm 1 ("Quadratic optimization task
//! generation"): `f_i(x) = ½ xᵀA_i x − xᵀb_i` with `A_i = a_i T + c I`, `T = tridiag(−1, 2, −1)`
//! and `b_i = β_i e_1`. It stores `O(n)` numbers; every oracle costs `O(1)` per coordinate.

use ndarray::{Array1, Array2, ArrayView1, ArrayViewMut1, ArrayViewMut2};
use rayon::prelude::*;

use crate::compress::{self, RoundPlan, Spec};
use crate::error::{CoreError, Result};
use crate::rng;

#[derive(Clone, Debug)]
pub struct Tridiagonal {
    /// `a_i = ν_i^s / 4`.
    pub a: Vec<f64>,
    /// The shift `c = λ − λ_min((1/n) Σ a_i T)`.
    pub c: f64,
    /// `β_i = (ν_i^s / 4)(−1 + ν_i^b)`: `b_i = β_i e_1`.
    pub beta: Vec<f64>,
    a_mean: f64,
    beta_mean: f64,
}

/// `(T x)_j = 2 x_j − x_{j−1} − x_{j+1}` (zero outside `0..d`).
#[inline]
fn t_at(x: &[f64], j: usize) -> f64 {
    let mut v = 2.0 * x[j];
    if j > 0 {
        v -= x[j - 1];
    }
    if j + 1 < x.len() {
        v -= x[j + 1];
    }
    v
}

fn contiguous<'a>(x: &'a ArrayView1<f64>, buf: &'a mut Vec<f64>) -> &'a [f64] {
    match x.as_slice() {
        Some(s) => s,
        None => {
            *buf = x.to_vec();
            buf
        }
    }
}

impl Tridiagonal {
    pub fn new(a: Vec<f64>, c: f64, beta: Vec<f64>) -> Result<Self> {
        if a.is_empty() || a.len() != beta.len() {
            return Err(CoreError::invalid("a", "a and beta must be non-empty and of equal length n"));
        }
        if a.iter().chain(beta.iter()).chain(std::iter::once(&c)).any(|v| !v.is_finite()) {
            return Err(CoreError::invalid("a", "the coefficients must be finite"));
        }
        let n = a.len() as f64;
        let a_mean = a.iter().sum::<f64>() / n;
        let beta_mean = beta.iter().sum::<f64>() / n;
        Ok(Tridiagonal { a, c, beta, a_mean, beta_mean })
    }

    pub fn n(&self) -> usize {
        self.a.len()
    }

    /// `f(x) = ½ xᵀ(ā T + c I)x − β̄ x_1`.
    pub fn loss(&self, x: ArrayView1<f64>) -> f64 {
        let mut buf = Vec::new();
        let x = contiguous(&x, &mut buf);
        let quad: f64 = (0..x.len()).map(|j| x[j] * (self.a_mean * t_at(x, j) + self.c * x[j])).sum();
        0.5 * quad - self.beta_mean * x[0]
    }

    /// `∇f(x) = (ā T + c I)x − β̄ e_1`.
    pub fn grad(&self, x: ArrayView1<f64>) -> Array1<f64> {
        let mut buf = Vec::new();
        let x = contiguous(&x, &mut buf);
        let mut g: Array1<f64> = (0..x.len()).map(|j| self.a_mean * t_at(x, j) + self.c * x[j]).collect();
        g[0] -= self.beta_mean;
        g
    }

    /// The `(n, d)` local gradients `∇f_i(x) = (a_i T + c I)x − β_i e_1`.
    pub fn local_grads(&self, x: ArrayView1<f64>) -> Array2<f64> {
        let mut buf = Vec::new();
        let x = contiguous(&x, &mut buf);
        let d = x.len();
        let tx: Vec<f64> = (0..d).map(|j| t_at(x, j)).collect();
        let mut out = Array2::<f64>::zeros((self.n(), d));
        for (i, mut row) in out.rows_mut().into_iter().enumerate() {
            let r = row.as_slice_mut().expect("fresh array");
            for j in 0..d {
                r[j] = self.a[i] * tx[j] + self.c * x[j];
            }
            r[0] -= self.beta[i];
        }
        out
    }

    /// `∇f_{rows[k]}(x)[cols[k]]` for every `k`: `O(1)` each.
    pub fn local_grad_coords(&self, x: ArrayView1<f64>, rows: &[i64], cols: &[i64]) -> Result<Array1<f64>> {
        let mut buf = Vec::new();
        let x = contiguous(&x, &mut buf);
        let (n, d) = (self.n() as i64, x.len() as i64);
        if rows.len() != cols.len() {
            return Err(CoreError::invalid("rows", "rows and cols must have the same length"));
        }
        rows.iter()
            .zip(cols)
            .map(|(&i, &j)| {
                if !(0..n).contains(&i) {
                    return Err(CoreError::invalid("rows", format!("worker {i} is outside [0, {n})")));
                }
                if !(0..d).contains(&j) {
                    return Err(CoreError::invalid("cols", format!("coordinate {j} is outside [0, {d})")));
                }
                let (i, j) = (i as usize, j as usize);
                let v = self.a[i] * t_at(x, j) + self.c * x[j];
                Ok(if j == 0 { v - self.beta[i] } else { v })
            })
            .collect()
    }

    /// `(1/n) Σ_i C_i(∇f_i(x_new) − ∇f_i(x_old))` for a sparsifier without quantizer, evaluating
    /// only the sent coordinates: `(∇f_i(x_new) − ∇f_i(x_old))_j = a_i (Tδ)_j + c δ_j`,
    /// `δ = x_new − x_old`. Summed in worker order, then divided by `n`, like `aggregate`.
    pub fn compressed_mean_diff(&self, plan: &RoundPlan, x_new: &[f64], x_old: &[f64]) -> Array1<f64> {
        let d = x_new.len();
        let delta: Vec<f64> = x_new.iter().zip(x_old).map(|(a, b)| a - b).collect();
        // (Tδ)_j and c·δ_j once per coordinate: a worker's value is then a_i·(Tδ)_j + (cδ)_j
        let t_delta: Vec<f64> = (0..d).map(|j| t_at(&delta, j)).collect();
        let c_delta: Vec<f64> = delta.iter().map(|v| self.c * v).collect();
        let mut out = vec![0.0f64; d];
        if let RoundPlan::Blocks { pi, slot_block, offsets_b, coords_b, scale } = plan {
            // the block compressors (PermK for n > d): the loop of the general case below with the
            // plan's indirections resolved inline (same values, same order)
            for (i, &s) in pi.iter().enumerate() {
                let b = slot_block[s as usize];
                if b == compress::IDLE {
                    continue;
                }
                let ai = self.a[i];
                for &j in &coords_b[offsets_b[b as usize]..offsets_b[b as usize + 1]] {
                    let j = j as usize;
                    out[j] += scale * (ai * t_delta[j] + c_delta[j]);
                }
            }
            let n = self.n() as f64;
            return out.into_iter().map(|v| v / n).collect();
        }
        for i in 0..self.n() {
            let (coords, scale) = plan.worker(i);
            let ai = self.a[i];
            let mut one = |j: usize| {
                let v = ai * t_delta[j] + c_delta[j];
                out[j] += if scale == 1.0 { v } else { scale * v };
            };
            match coords {
                None => (0..d).for_each(&mut one),
                Some(c) => c.iter().for_each(|&j| one(j as usize)),
            }
        }
        let n = self.n() as f64;
        out.into_iter().map(|v| v / n).collect()
    }

    /// One round of MARINA (Algorithm "MARINA") in place: `x ← x − γ g`; the shared coin of
    /// `(seed, round)`; on heads `g ← ∇f(x)`, on tails `g ← g + (1/n) Σ_i C_i(∇f_i(x) − ∇f_i(x_old))`.
    /// Returns the coin. `spec` must be a sparsifier with shared coordinates and no quantizer.
    #[allow(clippy::too_many_arguments)]
    pub fn marina_round(
        &self,
        spec: &Spec,
        mut x: ArrayViewMut1<f64>,
        mut g: ArrayViewMut1<f64>,
        gamma: f64,
        p: f64,
        seed: u64,
        round: u64,
    ) -> Result<bool> {
        let d = x.len();
        if g.len() != d {
            return Err(CoreError::invalid("g", "x and g must have the same length"));
        }
        if !spec.has_shared_coordinates() || spec.quantizer != compress::Quantizer::None {
            return Err(CoreError::invalid("compressor", "the fused round needs a sparsifier with shared coordinates and no quantizer"));
        }
        let x_old: Vec<f64> = x.to_vec();
        x.zip_mut_with(&g, |xi, gi| *xi -= gamma * gi);
        let heads = rng::coin(seed, round, p);
        if heads {
            g.assign(&self.grad(x.view()));
        } else {
            let plan = compress::round_plan::<f64>(spec, self.n(), d, seed, round, None)?;
            let x_new = x.to_vec();
            let m = self.compressed_mean_diff(&plan, &x_new, &x_old);
            g.zip_mut_with(&m, |gi, mi| *gi += mi);
        }
        Ok(heads)
    }
}

// ---------------------------------------------------------------------------------------------
// Fused EF21 + TopK round (issue 5: makes the paper's full EF21 grid feasible at n = 10^4).
// ---------------------------------------------------------------------------------------------

/// `n·d` at least this large runs the workers of [`Tridiagonal::ef21_topk_round`] on rayon.
const EF21_PAR_MIN: usize = 1 << 16;

/// Worker `i`'s TopK message in one EF21 round: `(coordinate, value)` pairs, or the first
/// non-finite coordinate.
enum Ef21Msg {
    Top1(u32, f64),
    TopK(Vec<(u32, f64)>),
    NonFinite,
}

impl Tridiagonal {
    /// One EF21 round with TopK(`k`) in place, without ever forming the `(n, d)` local gradients:
    /// `x ← x − γ g`; worker `i` computes `r_i = ∇f_i(x) − G_i` row by row on the fly, sends
    /// `c_i = TopK_k(r_i)` (largest magnitudes, ties: lower index), and sets `G_i ← G_i + c_i`;
    /// `g ← g + (1/n) Σ_i c_i` (summed in worker order, then divided by `n`). Bit for bit the
    /// dense round `ef21_update(local_grads, TopK.compress_all, C.sum(0)/n)`. Workers run on rayon
    /// when `n·d` is large; the reduction is sequential, so the result does not depend on the
    /// number of threads. A non-finite residual sets `g` to NaN (the driver reports divergence).
    pub fn ef21_topk_round(
        &self,
        mut x: ArrayViewMut1<f64>,
        mut g: ArrayViewMut1<f64>,
        mut gmat: ArrayViewMut2<f64>,
        gamma: f64,
        k: usize,
    ) -> Result<()> {
        let d = x.len();
        let n = self.n();
        if g.len() != d {
            return Err(CoreError::invalid("g", "x and g must have the same length"));
        }
        if gmat.dim() != (n, d) {
            return Err(CoreError::invalid("G", format!("G must have shape ({n}, {d}), got {:?}", gmat.dim())));
        }
        if k == 0 || k > d {
            return Err(CoreError::invalid("k", format!("k must be in [1, d = {d}], got {k}")));
        }
        x.zip_mut_with(&g, |xi, gi| *xi -= gamma * gi);
        let mut buf = Vec::new();
        let xs = contiguous(&x.view(), &mut buf).to_vec();
        let tx: Vec<f64> = (0..d).map(|j| t_at(&xs, j)).collect();
        let cx: Vec<f64> = xs.iter().map(|&v| self.c * v).collect();
        let rows = gmat
            .as_slice_mut()
            .ok_or_else(|| CoreError::invalid("G", "G must be C-contiguous"))?;
        let worker = |i: usize, row: &mut [f64]| -> Ef21Msg {
            let (ai, bi) = (self.a[i], self.beta[i]);
            let r_at = |j: usize, gij: f64| {
                let v = ai * tx[j] + cx[j];
                (if j == 0 { v - bi } else { v }) - gij
            };
            if k == 1 {
                // Pass 1: the largest |r_j| (8 independent lanes, so it vectorizes) and a NaN
                // probe (r·0 is NaN iff r is not finite); pass 2: its first index.
                let r0 = r_at(0, row[0]);
                let (mut lanes, mut probe) = ([0.0f64; 8], [0.0f64; 8]);
                let (tx1, cx1, g1) = (&tx[1..], &cx[1..], &row[1..]);
                let mut tail_best = 0.0f64;
                let mut tail_probe = 0.0f64;
                let chunks = g1.len() / 8;
                for ((gc, tc), cc) in g1.chunks_exact(8).zip(tx1.chunks_exact(8)).zip(cx1.chunks_exact(8)) {
                    let gc: &[f64; 8] = gc.try_into().expect("chunk of 8");
                    let tc: &[f64; 8] = tc.try_into().expect("chunk of 8");
                    let cc: &[f64; 8] = cc.try_into().expect("chunk of 8");
                    for l in 0..8 {
                        let r = (ai * tc[l] + cc[l]) - gc[l];
                        let m = r.abs();
                        lanes[l] = if m > lanes[l] { m } else { lanes[l] };
                        probe[l] += r * 0.0;
                    }
                }
                for j in chunks * 8..g1.len() {
                    let r = (ai * tx1[j] + cx1[j]) - g1[j];
                    tail_best = if r.abs() > tail_best { r.abs() } else { tail_best };
                    tail_probe += r * 0.0;
                }
                let best = lanes.iter().fold(tail_best.max(r0.abs()), |m, &v| if v > m { v } else { m });
                let nan = probe.iter().sum::<f64>() + tail_probe + r0 * 0.0;
                if !nan.is_finite() || !best.is_finite() {
                    return Ef21Msg::NonFinite;
                }
                let (bj, bv) = if r0.abs() == best {
                    (0, r0)
                } else {
                    (1..d).map(|j| (j, r_at(j, row[j]))).find(|(_, r)| r.abs() == best).expect("the maximum is attained")
                };
                row[bj] += bv;
                Ef21Msg::Top1(bj as u32, bv)
            } else {
                let mut keyed: Vec<(f64, u32, f64)> = Vec::with_capacity(d);
                for (j, gij) in row.iter().enumerate() {
                    let r = r_at(j, *gij);
                    if !r.is_finite() {
                        return Ef21Msg::NonFinite;
                    }
                    keyed.push((r.abs(), j as u32, r));
                }
                if k < d {
                    keyed.select_nth_unstable_by(k - 1, |a, b| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1)));
                }
                let sel: Vec<(u32, f64)> = keyed[..k].iter().map(|&(_, j, r)| (j, r)).collect();
                for &(j, r) in &sel {
                    row[j as usize] += r;
                }
                Ef21Msg::TopK(sel)
            }
        };
        let msgs: Vec<Ef21Msg> = if n >= 2 && n * d >= EF21_PAR_MIN {
            rows.par_chunks_mut(d).enumerate().map(|(i, row)| worker(i, row)).collect()
        } else {
            rows.chunks_mut(d).enumerate().map(|(i, row)| worker(i, row)).collect()
        };
        let mut acc = vec![0.0f64; d];
        for m in &msgs {
            match m {
                Ef21Msg::Top1(j, v) => acc[*j as usize] += v,
                Ef21Msg::TopK(sel) => sel.iter().for_each(|&(j, v)| acc[j as usize] += v),
                Ef21Msg::NonFinite => {
                    g.fill(f64::NAN);
                    return Ok(());
                }
            }
        }
        let nf = n as f64;
        g.zip_mut_with(&Array1::from(acc), |gi, ai| *gi += ai / nf);
        Ok(())
    }
}

/// Solves the symmetric tridiagonal system `(ā T + c I) x = rhs` (Thomas algorithm, `O(d)`).
pub fn solve_mean(a_mean: f64, c: f64, rhs: &[f64]) -> Vec<f64> {
    let d = rhs.len();
    let diag = 2.0 * a_mean + c;
    let off = -a_mean;
    let mut cp = vec![0.0; d];
    let mut dp = vec![0.0; d];
    cp[0] = off / diag;
    dp[0] = rhs[0] / diag;
    for j in 1..d {
        let m = diag - off * cp[j - 1];
        cp[j] = off / m;
        dp[j] = (rhs[j] - off * dp[j - 1]) / m;
    }
    let mut x = vec![0.0; d];
    x[d - 1] = dp[d - 1];
    for j in (0..d - 1).rev() {
        x[j] = dp[j] - cp[j] * x[j + 1];
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::{Quantizer, Sparsifier};
    use ndarray::arr1;

    fn problem() -> Tridiagonal {
        Tridiagonal::new(vec![0.25, 0.3, 0.2], 0.01, vec![-0.25, 0.1, -0.3]).unwrap()
    }

    #[test]
    fn gradients_are_consistent() {
        let q = problem();
        let x = arr1(&[1.0, -2.0, 0.5, 3.0]);
        let lg = q.local_grads(x.view());
        let g = q.grad(x.view());
        let mean = lg.mean_axis(ndarray::Axis(0)).unwrap();
        for j in 0..4 {
            assert!((g[j] - mean[j]).abs() < 1e-12);
        }
        let rows = [0i64, 2, 1];
        let cols = [0i64, 3, 1];
        let c = q.local_grad_coords(x.view(), &rows, &cols).unwrap();
        for k in 0..3 {
            assert_eq!(c[k], lg[[rows[k] as usize, cols[k] as usize]]);
        }
        // finite-difference check of the loss gradient
        let h = 1e-6;
        for j in 0..4 {
            let mut xp = x.clone();
            xp[j] += h;
            let mut xm = x.clone();
            xm[j] -= h;
            let fd = (q.loss(xp.view()) - q.loss(xm.view())) / (2.0 * h);
            assert!((fd - g[j]).abs() < 1e-6, "{fd} vs {}", g[j]);
        }
        assert!(q.local_grad_coords(x.view(), &[3], &[0]).is_err());
    }

    #[test]
    fn solve_mean_solves() {
        let rhs = [1.0, 0.0, -2.0, 0.5, 0.25];
        let x = solve_mean(0.25, 0.1, &rhs);
        for j in 0..5 {
            let tx = t_at(&x, j);
            assert!((0.25 * tx + 0.1 * x[j] - rhs[j]).abs() < 1e-12);
        }
    }

    #[test]
    fn ef21_topk_round_matches_dense() {
        let q = problem();
        let d = 7;
        let x0 = arr1(&[1.0, -2.0, 0.5, 3.0, 0.0, 1.5, -0.5]);
        for k in [1usize, 3] {
            let mut gm = q.local_grads(x0.view());
            let mut g = gm.mean_axis(ndarray::Axis(0)).unwrap();
            let mut x = x0.clone();
            for _ in 0..5 {
                // the dense reference
                let x_new = &x - &(0.3 * &g);
                let r = q.local_grads(x_new.view()) - &gm;
                let mut c = Array2::<f64>::zeros((3, d));
                for i in 0..3 {
                    let mut idx: Vec<usize> = (0..d).collect();
                    idx.sort_by(|&a, &b| r[[i, b]].abs().partial_cmp(&r[[i, a]].abs()).unwrap().then(a.cmp(&b)));
                    for &j in &idx[..k] {
                        c[[i, j]] = r[[i, j]];
                    }
                }
                let g_ref = &g + &(c.sum_axis(ndarray::Axis(0)) / 3.0);
                let gm_ref = &gm + &c;
                q.ef21_topk_round(x.view_mut(), g.view_mut(), gm.view_mut(), 0.3, k).unwrap();
                assert_eq!(x, x_new);
                for j in 0..d {
                    assert!((g[j] - g_ref[j]).abs() <= 1e-12 * (1.0 + g_ref[j].abs()));
                }
                assert_eq!(gm, gm_ref);
            }
        }
    }

    #[test]
    fn fused_diff_matches_dense_aggregate() {
        let q = problem();
        let spec = Spec::new(Sparsifier::PermK, Quantizer::None).unwrap();
        let x_old = arr1(&[1.0, -2.0, 0.5, 3.0, 0.0, 1.5]);
        let x_new = arr1(&[0.5, -1.0, 0.25, 2.0, 0.1, 1.0]);
        let plan = compress::round_plan::<f64>(&spec, 3, 6, 4, 9, None).unwrap();
        let fused = q.compressed_mean_diff(&plan, x_new.as_slice().unwrap(), x_old.as_slice().unwrap());
        let diff = q.local_grads(x_new.view()) - q.local_grads(x_old.view());
        let dense = compress::aggregate(&spec, diff.view(), 4, 9).unwrap();
        for j in 0..6 {
            assert!((fused[j] - dense[j]).abs() < 1e-12);
        }
    }
}
