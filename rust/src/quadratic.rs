//! The synthetic quadratic of the paper's Algorithm 1 ("Quadratic optimization task
//! generation"): `f_i(x) = ½ xᵀA_i x − xᵀb_i` with `A_i = a_i T + c I`, `T = tridiag(−1, 2, −1)`
//! and `b_i = β_i e_1`. It stores `O(n)` numbers; every oracle costs `O(1)` per coordinate.

use ndarray::{Array1, Array2, ArrayView1, ArrayViewMut1};

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
        let mut out = vec![0.0f64; d];
        for i in 0..self.n() {
            let (coords, scale) = plan.worker(i);
            let ai = self.a[i];
            let mut one = |j: usize| {
                let v = ai * t_at(&delta, j) + self.c * delta[j];
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
