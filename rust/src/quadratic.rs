//! The synthetic quadratic of the paper's Algorithm 1 ("Quadratic optimization task
//! generation"): `f_i(x) = ½ xᵀA_i x − xᵀb_i` with `A_i = a_i T + c I`, `T = tridiag(−1, 2, −1)`
//! and `b_i = β_i e_1`. It stores `O(n)` numbers; every oracle costs `O(1)` per coordinate.
//!
//! Every method validates all its arguments and estimates its memory before computing; the
//! in-place one ([`Tridiagonal::error_feedback`]) computes into buffers and writes its outputs
//! last. The kernel holds no method: MARINA, EF21 and the others are defined once in Python
//! (`permk.methods`) over these exchanges; whole rounds appear only in the tests, as references.

use ndarray::{Array1, Array2, ArrayView1, ArrayView2, ArrayViewMut2};
use rayon::prelude::*;

use crate::compress::{self, Assignment, Messages, Quantizer, RoundPlan, Spec, TopK};
use crate::error::{CoreError, Result};
use crate::kernels::{self, Affine};
use crate::mem::{self, Need};
use crate::plan::{with_owner, Blocks, Label, IDLE};
use crate::round::{with_post, Divisor, Emit, Keep, Post, Round, Seg};
use crate::threads;

/// The shift of the round's values ([`Tridiagonal::round_values_shifted`]): worker `i`'s
/// `h_i` is row `i − row0` of `h`, subtracted times `beta`.
#[derive(Clone, Copy)]
struct ShiftRows<'a> {
    h: ArrayView2<'a, f64>,
    row0: usize,
    beta: f64,
}

impl ShiftRows<'_> {
    /// Prefetches `h_ij` (worker `i`'s row), when worker `i` is held.
    #[inline(always)]
    fn ahead(&self, i: usize, j: usize) {
        let r = i.wrapping_sub(self.row0);
        if r < self.h.nrows() && j < self.h.ncols() {
            let s = self.h.strides();
            kernels::prefetch(self.h.as_ptr().wrapping_offset(r as isize * s[0] + j as isize * s[1]));
        }
    }
}

/// The shift of [`Tridiagonal::round_mean`]: the rows `h` from worker `row0`, times `beta`,
/// updated by `alpha` when given.
pub struct MeanShift<'a> {
    pub h: ArrayViewMut2<'a, f64>,
    pub row0: usize,
    pub beta: f64,
    pub alpha: Option<f64>,
}

/// DASHA-PP's estimator step ([`Tridiagonal::dasha_pp_values`]): `b`, the participation
/// probability `p = s/n` and the weight `w = (b − a)/a` of `h_i` in the rows `G`.
#[derive(Clone, Copy, Debug)]
pub struct PPStep {
    pub b: f64,
    pub p: f64,
    pub w: f64,
}

/// The inputs of a round's values: the points `x`, `y` (optional, times `coef`) and the shift.
struct Terms<'a, 'h> {
    x: ArrayView1<'a, f64>,
    y: Option<ArrayView1<'a, f64>>,
    coef: f64,
    shift: Option<ShiftRows<'h>>,
}

/// The plan values of [`Tridiagonal::round_values`], then `post`'s ([`crate::round::Post`]):
/// `scale_i · ((∇f_i(x)_j − coef·∇f_i(y)_j) − β h_ij)`, the terms present.
struct GradValues<'a, 'h, P> {
    f: &'a Tridiagonal,
    x: &'a [f64],
    y: Option<&'a [f64]>,
    coef: f64,
    h: Option<ShiftRows<'h>>,
    post: P,
}

impl<P> GradValues<'_, '_, P> {
    /// `∇f_i(x)_j` as [`Tridiagonal::local_grad_coords`] computes it.
    #[inline(always)]
    fn g(&self, x: &[f64], i: usize, j: usize) -> f64 {
        self.f.grad_coord(x, i, j)
    }

    /// `(∇f_i(x)_j − coef·∇f_i(y)_j) − β h_ij` (the terms present), before the scale: the
    /// order of every path (`permk.exchanges`).
    #[inline(always)]
    fn raw(&self, i: usize, j: usize) -> f64 {
        let v = match self.y {
            None => self.g(self.x, i, j),
            Some(y) => self.g(self.x, i, j) - self.coef * self.g(y, i, j),
        };
        match &self.h {
            None => v,
            Some(s) => v - s.beta * s.h[[i - s.row0, j]],
        }
    }

    /// [`Self::raw`] of worker `i` on the coordinates `lo..hi` into `out`: the interior
    /// `1 <= j < d − 1` without branches (`(2x_j − x_{j−1}) − x_{j+1}`, the order of
    /// [`t_at`]), the ends through [`Self::raw`].
    fn raw_range(&self, i: usize, lo: usize, hi: usize, out: &mut [f64]) {
        let d = self.x.len();
        let a = lo.max(1).min(hi);
        let b = hi.min(d.saturating_sub(1)).max(a);
        for j in (lo..a).chain(b..hi) {
            out[j - lo] = self.raw(i, j);
        }
        if a == b {
            return;
        }
        let (ai, c, coef) = (self.f.a[i], self.f.c, self.coef);
        let g = |l: &[f64], m: &[f64], r: &[f64], k: usize| ai * (2.0 * m[k] - l[k] - r[k]) + c * m[k];
        let o = &mut out[a - lo..b - lo];
        let len = o.len();
        // slices of the output's length: the loops below index them without bounds checks
        let (xl, xm, xr) = (&self.x[a - 1..b - 1][..len], &self.x[a..b][..len], &self.x[a + 1..b + 1][..len]);
        match self.y {
            None => o.iter_mut().enumerate().for_each(|(k, o)| *o = g(xl, xm, xr, k)),
            Some(y) => {
                let (yl, ym, yr) = (&y[a - 1..b - 1][..len], &y[a..b][..len], &y[a + 1..b + 1][..len]);
                o.iter_mut().enumerate().for_each(|(k, o)| *o = g(xl, xm, xr, k) - coef * g(yl, ym, yr, k));
            }
        }
        if let Some(s) = &self.h {
            let row = s.h.row(i - s.row0);
            let beta = s.beta;
            match row.as_slice() {
                Some(r) => o.iter_mut().zip(&r[a..b]).for_each(|(o, &h)| *o -= beta * h),
                None => o.iter_mut().zip(a..b).for_each(|(o, j)| *o -= beta * row[j]),
            }
        }
    }
}

/// `∇f_i(x)_j` from the precomputed `tx = T x` and `cx = c x` (`ai`, `bi`: worker `i`'s `a_i`,
/// `β_i`): the same bits as [`Tridiagonal::grad_coord`].
#[inline(always)]
fn grad_at(ai: f64, bi: f64, tx: &[f64], cx: &[f64], j: usize) -> f64 {
    let v = ai * tx[j] + cx[j];
    if j == 0 {
        v - bi
    } else {
        v
    }
}

/// `∇f_i(x)_j − g` ([`grad_at`] minus `g`).
#[inline(always)]
fn residual_at(ai: f64, bi: f64, tx: &[f64], cx: &[f64], j: usize, g: f64) -> f64 {
    grad_at(ai, bi, tx, cx, j) - g
}

impl<P: Post<f64>> Emit<f64> for GradValues<'_, '_, P> {
    #[inline(always)]
    fn one(&self, i: usize, j: usize, scale: f64) -> f64 {
        self.post.apply(self.raw(i, j) * scale)
    }

    /// The shift's entry `h_ij` is read at random (a worker's row at its coordinate): fetched
    /// ahead.
    #[inline(always)]
    fn ahead(&self, i: usize, j: usize) {
        if let Some(s) = &self.h {
            s.ahead(i, j);
        }
    }

    /// [`GradValues::raw_range`], then the scale and `post`.
    fn range(&self, i: usize, lo: usize, hi: usize, scale: f64, out: &mut [f64]) {
        self.raw_range(i, lo, hi, out);
        let p = self.post;
        out.iter_mut().for_each(|o| *o = p.apply(*o * scale));
    }
}

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

/// `x` as a slice: borrowed when contiguous, else copied (fallibly) into `buf`.
fn contiguous<'a>(x: &'a ArrayView1<f64>, buf: &'a mut Vec<f64>, name: &str) -> Result<&'a [f64]> {
    match x.as_slice() {
        Some(s) => Ok(s),
        None => {
            *buf = mem::collect(name, x.len(), x.iter().copied())?;
            Ok(buf)
        }
    }
}

/// Fails unless the vector `name` has at least one coordinate.
fn nonempty(name: &str, d: usize) -> Result<()> {
    if d == 0 {
        return Err(CoreError::invalid(name, "must have at least one coordinate"));
    }
    Ok(())
}

/// `n·d` at least this large runs the workers of the EF21 steps on the pool's threads.
const EF21_PAR_MIN: usize = 1 << 16;

/// One worker's EF21 message, computed before `G` is touched.
enum WorkerMsg {
    Top1(u32, f64),
    Sparse(Vec<(u32, f64)>),
    NonFinite,
}

impl WorkerMsg {
    fn len(&self) -> usize {
        match self {
            WorkerMsg::Top1(..) => 1,
            WorkerMsg::Sparse(v) => v.len(),
            WorkerMsg::NonFinite => 0,
        }
    }

    fn for_each(&self, mut f: impl FnMut(usize, f64)) {
        match self {
            WorkerMsg::Top1(j, v) => f(*j as usize, *v),
            WorkerMsg::Sparse(s) => s.iter().for_each(|&(j, v)| f(j as usize, v)),
            WorkerMsg::NonFinite => {}
        }
    }
}

/// The messages of an EF21 worker step ([`Tridiagonal::error_feedback`]) and whether every
/// residual was finite (when not, the messages are empty and `G` is unchanged).
#[derive(Clone, Debug, PartialEq)]
pub struct Feedback {
    pub messages: Messages<f64>,
    pub finite: bool,
}

impl Tridiagonal {
    pub fn new(a: Vec<f64>, c: f64, beta: Vec<f64>) -> Result<Self> {
        if a.is_empty() || a.len() != beta.len() {
            return Err(CoreError::invalid("a", "a and beta must be non-empty and of equal length n"));
        }
        CoreError::all_finite("a", &a)?;
        CoreError::all_finite("beta", &beta)?;
        CoreError::finite("c", c)?;
        let n = a.len() as f64;
        let a_mean = a.iter().sum::<f64>() / n;
        let beta_mean = beta.iter().sum::<f64>() / n;
        Ok(Tridiagonal { a, c, beta, a_mean, beta_mean })
    }

    pub fn n(&self) -> usize {
        self.a.len()
    }

    /// `ā = (1/n) Σ a_i`.
    pub fn a_mean(&self) -> f64 {
        self.a_mean
    }

    /// `f(x) = ½ xᵀ(ā T + c I)x − β̄ x_1`.
    pub fn loss(&self, x: ArrayView1<f64>) -> Result<f64> {
        nonempty("x", x.len())?;
        Need::new().array::<f64>("a copy of x", &[x.len()]).check()?;
        let mut buf = Vec::new();
        let x = contiguous(&x, &mut buf, "a copy of x")?;
        let quad: f64 = (0..x.len()).map(|j| x[j] * (self.a_mean * t_at(x, j) + self.c * x[j])).sum();
        Ok(0.5 * quad - self.beta_mean * x[0])
    }

    /// `∇f(x) = (ā T + c I)x − β̄ e_1`.
    pub fn grad(&self, x: ArrayView1<f64>) -> Result<Array1<f64>> {
        nonempty("x", x.len())?;
        Need::new().array::<f64>("the gradient", &[x.len()]).array::<f64>("a copy of x", &[x.len()]).check()?;
        let mut buf = Vec::new();
        let x = contiguous(&x, &mut buf, "a copy of x")?;
        Ok(Array1::from(self.grad_of(x)?))
    }

    fn grad_of(&self, x: &[f64]) -> Result<Vec<f64>> {
        let mut g = mem::collect("the gradient", x.len(), (0..x.len()).map(|j| self.a_mean * t_at(x, j) + self.c * x[j]))?;
        g[0] -= self.beta_mean;
        Ok(g)
    }

    /// Rows `start..stop` of the `(n, d)` local gradients `∇f_i(x) = (a_i T + c I)x − β_i e_1`.
    pub fn local_grads(&self, x: ArrayView1<f64>, start: usize, stop: usize) -> Result<Array2<f64>> {
        let n = self.n();
        if stop > n {
            return Err(CoreError::invalid("stop", format!("stop = {stop} exceeds n = {n}")));
        }
        if start > stop {
            return Err(CoreError::invalid("start", format!("start = {start} exceeds stop = {stop}")));
        }
        self.grad_rows(x, start..stop)
    }

    /// The local gradients of the workers `rows` (each `< n`), one row each in that order: the
    /// rows of [`Self::local_grads`], bit for bit (partial participation evaluates only the
    /// round's participants).
    pub fn local_grads_rows(&self, x: ArrayView1<f64>, rows: &[usize]) -> Result<Array2<f64>> {
        let n = self.n();
        if let Some(&i) = rows.iter().find(|&&i| i >= n) {
            return Err(CoreError::invalid("rows", format!("worker {i} is outside [0, {n})")));
        }
        self.grad_rows(x, rows.iter().copied())
    }

    fn grad_rows(&self, x: ArrayView1<f64>, workers: impl ExactSizeIterator<Item = usize>) -> Result<Array2<f64>> {
        let d = x.len();
        nonempty("x", d)?;
        let rows = workers.len();
        Need::new()
            .array::<f64>("the local gradients", &[rows, d])
            .array::<f64>("T x and c x", &[2, d])
            .array::<f64>("a copy of x", &[d])
            .check()?;
        let mut buf = Vec::new();
        let x = contiguous(&x, &mut buf, "a copy of x")?;
        let (tx, cx) = self.tx_cx(x)?;
        let mut out = mem::zeros::<f64>("the local gradients", &[rows, d])?;
        for (row, i) in out.chunks_mut(d).zip(workers) {
            self.grad_row_into(i, &tx, &cx, row);
        }
        Array2::from_shape_vec((rows, d), out).map_err(|e| CoreError::invalid("x", e.to_string()))
    }

    /// Worker `i`'s whole gradient `∇f_i(x)` into `row` from `tx = T x` and `cx = c x`
    /// ([`Self::tx_cx`]): `a_i (T x)_j + c x_j`, then `− β_i` at `j = 0` — the bits of
    /// [`Self::grad_coord`] at every coordinate.
    fn grad_row_into(&self, i: usize, tx: &[f64], cx: &[f64], row: &mut [f64]) {
        let ai = self.a[i];
        for ((o, &t), &c) in row.iter_mut().zip(tx).zip(cx) {
            *o = ai * t + c;
        }
        row[0] -= self.beta[i];
    }

    /// `∇f_i(x)_j = a_i (T x)_j + c x_j − β_i [j = 0]`, in `O(1)`.
    #[inline(always)]
    fn grad_coord(&self, x: &[f64], i: usize, j: usize) -> f64 {
        let v = self.a[i] * t_at(x, j) + self.c * x[j];
        if j == 0 {
            v - self.beta[i]
        } else {
            v
        }
    }

    /// `∇f_{rows[k]}(x)[cols[k]]` for every `k`: `O(1)` each.
    pub fn local_grad_coords(&self, x: ArrayView1<f64>, rows: ArrayView1<i64>, cols: ArrayView1<i64>) -> Result<Array1<f64>> {
        nonempty("x", x.len())?;
        if rows.len() != cols.len() {
            return Err(CoreError::invalid("rows", format!("rows and cols must have the same length, got {} and {}", rows.len(), cols.len())));
        }
        Need::new().array::<f64>("the gradient coordinates", &[rows.len()]).array::<f64>("a copy of x", &[x.len()]).check()?;
        let mut buf = Vec::new();
        let x = contiguous(&x, &mut buf, "a copy of x")?;
        let (n, d) = (self.n() as i64, x.len() as i64);
        let mut out = mem::vec("the gradient coordinates", rows.len())?;
        for (&i, &j) in rows.iter().zip(cols.iter()) {
            if !(0..n).contains(&i) {
                return Err(CoreError::invalid("rows", format!("worker {i} is outside [0, {n})")));
            }
            if !(0..d).contains(&j) {
                return Err(CoreError::invalid("cols", format!("coordinate {j} is outside [0, {d})")));
            }
            out.push(self.grad_coord(x, i as usize, j as usize));
        }
        Ok(Array1::from(out))
    }

    /// The values of workers `start..stop` of `round` in plan order:
    /// `scale_i · (∇f_i(x)_j − ∇f_i(y)_j)` (`scale_i · ∇f_i(x)_j` without `y`), each gradient
    /// coordinate computed exactly as [`Self::local_grad_coords`] computes it, the difference
    /// first, then one multiplication by the scale: bit for bit numpy's
    /// `(local_grad_coords(x, rows, cols) − local_grad_coords(y, rows, cols)) * scales[rows]`.
    pub fn round_values(&self, round: &Round, x: ArrayView1<f64>, y: Option<ArrayView1<f64>>, start: usize, stop: usize) -> Result<Vec<f64>> {
        self.round_values_to(round, x, y, start, stop, None, None)
    }

    /// [`Tridiagonal::round_values`], each value `v` then `(v + 0) / k` (two IEEE operations,
    /// in the same pass) when `divide` is `Some(k)`.
    pub fn round_values_div(&self, round: &Round, x: ArrayView1<f64>, y: Option<ArrayView1<f64>>, start: usize, stop: usize, divide: Option<Divisor>) -> Result<Vec<f64>> {
        self.round_values_to(round, x, y, start, stop, divide, None)
    }

    /// [`Tridiagonal::round_values_div`] written into `out` (exactly the workers' number of
    /// values, else an error naming `out`; every argument is checked before anything is
    /// written).
    #[allow(clippy::too_many_arguments)]
    pub fn round_values_into(
        &self,
        round: &Round,
        x: ArrayView1<f64>,
        y: Option<ArrayView1<f64>>,
        start: usize,
        stop: usize,
        divide: Option<Divisor>,
        out: &mut [f64],
    ) -> Result<()> {
        self.round_values_to(round, x, y, start, stop, divide, Some(out)).map(drop)
    }

    /// The values into `out`, or a new array when `out` is `None` (returned; empty otherwise).
    #[allow(clippy::too_many_arguments)]
    fn round_values_to(
        &self,
        round: &Round,
        x: ArrayView1<f64>,
        y: Option<ArrayView1<f64>>,
        start: usize,
        stop: usize,
        divide: Option<Divisor>,
        out: Option<&mut [f64]>,
    ) -> Result<Vec<f64>> {
        let terms = Terms { x, y, coef: 1.0, shift: None };
        self.values_with(round, terms, start, stop, divide, out)
    }

    /// The values of workers `start..stop` of `round` in plan order with a shift:
    /// `scale_i · ((∇f_i(x)_j − coef·∇f_i(y)_j) − β h_ij)` (`y` and its term optional), `h_i`
    /// row `i − row0` of `h` (the held workers' rows, `row0` the first held worker), each
    /// operation in that order: bit for bit numpy's `((gx − coef·gy) − β·h) · scales[rows]` of
    /// the coordinate oracle's values (`permk.exchanges`' order; a coefficient or a `β` of 1
    /// multiplies exactly). `coef` and `beta` must be finite (an error naming them). `divide`
    /// and `out` as in [`Self::round_values_into`].
    #[allow(clippy::too_many_arguments)]
    pub fn round_values_shifted(
        &self,
        round: &Round,
        x: ArrayView1<f64>,
        y: Option<ArrayView1<f64>>,
        coef: f64,
        h: ArrayView2<f64>,
        row0: usize,
        beta: f64,
        start: usize,
        stop: usize,
        divide: Option<Divisor>,
        out: Option<&mut [f64]>,
    ) -> Result<Vec<f64>> {
        Self::check_shift(round, h.dim(), row0, beta, start, stop)?;
        let terms = Terms { x, y, coef, shift: Some(ShiftRows { h, row0, beta }) };
        self.values_with(round, terms, start, stop, divide, out)
    }

    /// Fails unless the `(rows, cols)` shift `h` holds `d` columns and the rows of workers
    /// `start..stop` from `row0`, and its factor `beta` is finite.
    fn check_shift(round: &Round, (rows, cols): (usize, usize), row0: usize, beta: f64, start: usize, stop: usize) -> Result<()> {
        CoreError::finite("beta", beta)?;
        let d = round.d();
        if cols != d {
            return Err(CoreError::invalid("H", format!("must have the round's d = {d} columns, got {cols}")));
        }
        round.check_workers(start, stop)?;
        if start < stop && (start < row0 || stop - row0 > rows) {
            return Err(CoreError::invalid(
                "H",
                format!("holds the rows of workers {row0}..{} (row0 = {row0}), not those of workers {start}..{stop}", row0 + rows),
            ));
        }
        Ok(())
    }

    /// [`Self::round_values_shifted`], then `h_ij += α·v` for every value `v` (before
    /// `divide`), in place: the shifted exchange's update (each worker's coordinates are
    /// distinct, so every entry is updated at most once), in one sequential pass. Every
    /// argument is checked before anything is written (`coef`, `beta` and `alpha` finite).
    #[allow(clippy::too_many_arguments)]
    pub fn round_values_update(
        &self,
        round: &Round,
        x: ArrayView1<f64>,
        y: Option<ArrayView1<f64>>,
        coef: f64,
        mut h: ArrayViewMut2<f64>,
        row0: usize,
        beta: f64,
        alpha: f64,
        start: usize,
        stop: usize,
        divide: Option<Divisor>,
        out: Option<&mut [f64]>,
    ) -> Result<Vec<f64>> {
        Self::check_shift(round, h.dim(), row0, beta, start, stop)?;
        CoreError::finite("alpha", alpha)?;
        let d = round.d();
        let (len, mut new, mut b1, mut b2) = (self.check_terms(round, &x, &y, coef, start, stop, out.is_some())?, Vec::new(), Vec::new(), Vec::new());
        if let Some(o) = &out {
            round.check_out_len(start, stop, o.len())?;
        }
        let x = contiguous(&x, &mut b1, "a copy of x")?;
        let y = match &y {
            Some(y) => Some(contiguous(y, &mut b2, "a copy of y")?),
            None => None,
        };
        let o: &mut [f64] = match out {
            Some(o) => o,
            None => {
                new = mem::zeros::<f64>("the round's values", &[len])?;
                &mut new
            }
        };
        let e = GradValues { f: self, x, y, coef, h: None, post: Keep };
        let (hp, strides, rows) = (h.as_ptr() as usize, (h.strides()[0], h.strides()[1]), h.nrows());
        let ahead = |i: usize, j: usize| {
            let r = i.wrapping_sub(row0);
            if r < rows && j < d {
                kernels::prefetch((hp as *const f64).wrapping_offset(r as isize * strides.0 + j as isize * strides.1));
            }
        };
        with_post!(divide, f64, post => round.visit_ahead(start, stop, ahead, |i, seg, pos| {
            let (s, r) = (round.scale_of(i), i - row0);
            let mut one = |j: usize, raw: f64, o: &mut f64| {
                let v = (raw - beta * h[[r, j]]) * s;
                h[[r, j]] += alpha * v;
                *o = post.apply(v);
            };
            match seg {
                Seg::One(j) => one(j, e.raw(i, j), &mut o[pos]),
                Seg::Range(a, b) => {
                    let seg = &mut o[pos..pos + (b - a)];
                    e.raw_range(i, a, b, seg);
                    seg.iter_mut().zip(a..b).for_each(|(o, j)| one(j, *o, o));
                }
                Seg::List(c) => c.iter().zip(o[pos..pos + c.len()].iter_mut()).for_each(|(&j, o)| one(j as usize, e.raw(i, j as usize), o)),
            }
        }))?;
        Ok(new)
    }

    /// `(1/n) Σ_i C_i(v_i − β h_i)` of a whole round in one call (the simulator: every worker
    /// here): the values of [`Self::round_values`] (no shift), [`Self::round_values_shifted`]
    /// (`shift` without `alpha`) or [`Self::round_values_update`] (with it: `h` updated in
    /// place), then [`Round::mean`] — bit for bit the values gathered and averaged.
    pub fn round_mean(&self, round: &Round, x: ArrayView1<f64>, y: Option<ArrayView1<f64>>, coef: f64, shift: Option<MeanShift<'_>>) -> Result<Vec<f64>> {
        let n = round.n();
        Need::new().array::<f64>("the average", &[round.d()]).check()?;
        let vals = match shift {
            None => self.values_with(round, Terms { x, y, coef, shift: None }, 0, n, None, None)?,
            Some(MeanShift { h, row0, beta, alpha: None }) => self.round_values_shifted(round, x, y, coef, h.view(), row0, beta, 0, n, None, None)?,
            Some(MeanShift { h, row0, beta, alpha: Some(alpha) }) => self.round_values_update(round, x, y, coef, h, row0, beta, alpha, 0, n, None, None)?,
        };
        round.mean(&vals)
    }

    /// Checks the round, `x`, `y`, `coef` (finite) and the memory of the values of workers
    /// `start..stop` (`len`: the number of values; `has_out`: written into a given array).
    #[allow(clippy::too_many_arguments)]
    fn check_terms(&self, round: &Round, x: &ArrayView1<f64>, y: &Option<ArrayView1<f64>>, coef: f64, start: usize, stop: usize, has_out: bool) -> Result<usize> {
        CoreError::finite("coef", coef)?;
        let d = round.d();
        if round.n() != self.n() {
            return Err(CoreError::invalid("round", format!("the round has {} workers but the problem has n = {}", round.n(), self.n())));
        }
        if x.len() != d {
            return Err(CoreError::invalid("x", format!("must have the round's d = {d} coordinates, got {}", x.len())));
        }
        if let Some(y) = y {
            if y.len() != d {
                return Err(CoreError::invalid("y", format!("must have the round's d = {d} coordinates, got {}", y.len())));
            }
        }
        let len = round.len_of(start, stop)?;
        Need::new()
            .array::<f64>("the round's values", &[if has_out { 0 } else { len }])
            .bytes("the workers' positions", round.values_scratch(start, stop))
            .array::<f64>("a copy of x", &[d])
            .array::<f64>("a copy of y", &[if y.is_some() { d } else { 0 }])
            .check()?;
        Ok(len)
    }

    /// The values of `terms` for workers `start..stop` (the checks, then [`Round::values`] or
    /// [`Round::values_into`], on the pool's threads for large rounds).
    fn values_with(&self, round: &Round, terms: Terms<'_, '_>, start: usize, stop: usize, divide: Option<Divisor>, out: Option<&mut [f64]>) -> Result<Vec<f64>> {
        let Terms { x, y, coef, shift } = terms;
        self.check_terms(round, &x, &y, coef, start, stop, out.is_some())?;
        if let Some(o) = &out {
            round.check_out_len(start, stop, o.len())?;
        }
        let (mut b1, mut b2) = (Vec::new(), Vec::new());
        let x = contiguous(&x, &mut b1, "a copy of x")?;
        let y = match &y {
            Some(y) => Some(contiguous(y, &mut b2, "a copy of y")?),
            None => None,
        };
        with_post!(divide, f64, post => {
            let e = GradValues { f: self, x, y, coef, h: shift, post };
            match out {
                Some(o) => round.values_into(start, stop, &e, o).map(|_| Vec::new()),
                None => round.values("the round's values", start, stop, &e),
            }
        })
    }

    /// The bytes of [`Self::mean_diff`]'s temporaries and output in dimension `d`.
    fn mean_diff_bytes(d: usize) -> u128 {
        8 * d as u128
    }

    /// `(1/n) Σ_i C_i(∇f_i(x_new) − ∇f_i(x_old))` on a plan, evaluating only the sent
    /// coordinates. The tests' reference (the pre-refactor path on a whole plan).
    #[cfg(test)]
    pub fn compressed_mean_diff_with_plan(&self, plan: &RoundPlan, x_new: &[f64], x_old: &[f64]) -> Result<Vec<f64>> {
        self.mean_diff(&Assignment::Plan(plan.clone()), x_new, x_old)
    }

    /// `(1/n) Σ_i C_i(∇f_i(x_new) − ∇f_i(x_old))` on an assignment, evaluating only the sent
    /// coordinates, in the documented order of every path: each gradient coordinate as
    /// [`Self::grad_coord`] computes it, their difference, then one multiplication by the scale
    /// (`scale_i · (∇f_i(x_new)_j − ∇f_i(x_old)_j)`), summed in worker order from 0, then
    /// divided by `n`: bit for bit `aggregate` of the local gradients' difference (not
    /// `a_i (Tδ)_j + c δ_j` on `δ = x_new − x_old`, which rounds differently). Owners (PermK for
    /// `d >= n`, CoordinateSampling) are read directly (one value per coordinate:
    /// `(0 + scale·v) / n`).
    fn mean_diff(&self, asg: &Assignment, x_new: &[f64], x_old: &[f64]) -> Result<Vec<f64>> {
        let d = x_new.len();
        let n = self.n() as f64;
        // each coordinate is sent by few workers: computed where it is sent, O(1) each
        let diff = |i: usize, j: usize| self.grad_coord(x_new, i, j) - self.grad_coord(x_old, i, j);
        let mut out = mem::zeros::<f64>("the compressed mean difference", &[d])?;
        match asg {
            Assignment::Owners { owner, scale, .. } => {
                let scale = *scale;
                with_owner!(owner, v => {
                    for (j, (o, &w)) in out.iter_mut().zip(v.iter()).enumerate() {
                        *o += scale * diff(w.idx(), j);
                    }
                });
            }
            Assignment::Plan(RoundPlan::Blocks { pi, slot_block, blocks, scale }) => {
                // the block compressors (PermK for n > d): the loop of the general case below
                // with the plan's indirections resolved inline (same values, same order)
                for (i, &s) in pi.iter().enumerate() {
                    let b = slot_block[s as usize];
                    if b == IDLE {
                        continue;
                    }
                    match blocks {
                        Blocks::Ranges(bounds) => {
                            let (lo, hi) = (bounds[b as usize], bounds[b as usize + 1]);
                            for (j, o) in (lo..hi).zip(out[lo..hi].iter_mut()) {
                                *o += scale * diff(i, j);
                            }
                        }
                        Blocks::Listed { offsets, coords } => {
                            for &j in &coords[offsets[b as usize]..offsets[b as usize + 1]] {
                                let j = j as usize;
                                out[j] += scale * diff(i, j);
                            }
                        }
                    }
                }
            }
            Assignment::Plan(plan) => {
                for i in 0..plan.n() {
                    let (coords, scale) = plan.worker(i);
                    coords.for_each(d, |j| {
                        out[j] += scale * diff(i, j);
                    });
                }
            }
        }
        out.iter_mut().for_each(|v| *v /= n);
        Ok(out)
    }

    /// Checks that `spec` has a shared plan (the fused MARINA steps need one).
    fn check_shared(spec: &Spec) -> Result<()> {
        if !spec.shared_plan() {
            return Err(CoreError::invalid(
                "compressor",
                "the fused round needs a sparsifier with shared coordinates and no quantizer",
            ));
        }
        Ok(())
    }

    /// `(1/n) Σ_i C_i(∇f_i(x_new) − ∇f_i(x_old))` for a spec with a shared plan (round
    /// `round`'s plan for `n` workers): MARINA's compressed rounds add it to `g`.
    pub fn compressed_mean_diff(&self, spec: &Spec, x_new: ArrayView1<f64>, x_old: ArrayView1<f64>, seed: u64, round: u64) -> Result<Array1<f64>> {
        let d = x_new.len();
        nonempty("x_new", d)?;
        if x_old.len() != d {
            return Err(CoreError::invalid("x_old", format!("x_new and x_old must have the same length, got {d} and {}", x_old.len())));
        }
        Self::check_shared(spec)?;
        spec.check(self.n(), d)?;
        let fp = spec.sparsifier.footprint(self.n(), d);
        Need::new().bytes("the round's plan", fp.assign).bytes("the difference's temporaries", Self::mean_diff_bytes(d) + 16 * d as u128).check()?;
        let (mut b1, mut b2) = (Vec::new(), Vec::new());
        let x_new = contiguous(&x_new, &mut b1, "a copy of x_new")?;
        let x_old = contiguous(&x_old, &mut b2, "a copy of x_old")?;
        let asg = spec.sparsifier.assign::<f64>(self.n(), d, seed, round, None)?;
        Ok(Array1::from(self.mean_diff(&asg, x_new, x_old)?))
    }

    /// EF21's worker step for workers `start .. start + m` at `x`: worker `i` computes
    /// `r_i = ∇f_i(x) − G_i` row by row on the fly (never the `(m, d)` local gradients), sends `c_i = C_i(r_i)` (the plan of `spec` for the kernel's
    /// `n` workers; worker index `start + row`) and sets `G_i ← G_i + c_i`. `G` is the
    /// C-contiguous `(m, d)` array of their estimators. Returns the messages in worker order.
    /// TopK without quantizer keeps the fused round's selection (bit for bit); any other spec
    /// compresses the residual row with its per-worker selection and [`compress::worker_message`]. Workers
    /// run on the pool's threads for large inputs; nothing depends on the thread count. A
    /// non-finite residual (or message) returns `finite = false` and leaves `G` unchanged.
    pub fn error_feedback(&self, spec: &Spec, x: ArrayView1<f64>, mut gmat: ArrayViewMut2<f64>, seed: u64, round: u64, start: usize) -> Result<Feedback> {
        let d = x.len();
        let n = self.n();
        nonempty("x", d)?;
        let (m, gd) = gmat.dim();
        if gd != d {
            return Err(CoreError::invalid("G", format!("G must have d = {d} columns (the length of x), got shape ({m}, {gd})")));
        }
        if start.checked_add(m).map_or(true, |stop| stop > n) {
            return Err(CoreError::invalid("start", format!("the workers start .. start + m = {start} .. {start} + {m} exceed n = {n}")));
        }
        if !gmat.is_standard_layout() {
            return Err(CoreError::invalid("G", "G must be C-contiguous"));
        }
        spec.check(n, d)?;
        Self::feedback_need(spec, n, d, m)?;
        let mut buf = Vec::new();
        let xs = contiguous(&x, &mut buf, "a copy of x")?;
        let (tx, cx) = self.tx_cx(xs)?;
        let rows = gmat.as_slice_mut().ok_or_else(|| CoreError::invalid("G", "G must be C-contiguous"))?;
        let Some(list) = self.feedback(spec, &tx, &cx, rows, m, d, seed, round, start)? else {
            let offsets = mem::filled("the messages' offsets", m + 1, 0i64)?;
            return Ok(Feedback { messages: Messages { offsets, indices: Vec::new(), values: Vec::new() }, finite: false });
        };
        let total = list.iter().map(WorkerMsg::len).sum();
        let mut out = Messages::with_capacity(m, total)?;
        for w in &list {
            w.for_each(|j, v| {
                out.indices.push(j as i64);
                out.values.push(v);
            });
            out.end_worker();
        }
        Ok(Feedback { messages: out, finite: true })
    }

    /// DASHA-PP's round for workers `start..stop` on the Rust path (the method is
    /// `permk.methods.DashaPP`): each participant (`rows`: strictly increasing indices of the
    /// held rows of `h` and `g`, worker `row0 + r`; those outside `start..stop` are left to the
    /// call for their workers) uses `new = ∇f_i(x_new)` and `old = ∇f_i(x_old)`, each coordinate
    /// formed where it is read from `T x` and `c x` at the two points (computed once for all
    /// participants; no row of gradients is written), and
    ///
    /// * sends its values of `round`: `v = ((new_j − coef·old_j) − beta·g_ij)·scale_i` at its
    ///   coordinates, `g_ij += v` — [`Self::round_values_update`] with `alpha = 1` gives them,
    ///   in plan order, `divide`d and written into `out` as there;
    /// * then (every participant's values first: their rows are disjoint, so the order changes
    ///   no bit) updates its estimators: `dh = ((new − old) − (h_i − old)·b)/p`, `h_i += dh`,
    ///   `g_i += dh·w` (DASHA-PP's `h_i^{t+1}` and its rows `G = g + w h`).
    ///
    /// Bit for bit the dense path's steps on [`Self::local_grads_rows`]. Every worker of
    /// `start..stop` with values must be a participant; `p` must be in `(0, 1]` and `coef`,
    /// `beta`, `b`, `w` finite; every argument is checked before anything is written.
    #[allow(clippy::too_many_arguments)]
    pub fn dasha_pp_values(
        &self,
        round: &Round,
        x_new: ArrayView1<f64>,
        x_old: ArrayView1<f64>,
        mut h: ArrayViewMut2<f64>,
        mut g: ArrayViewMut2<f64>,
        rows: &[usize],
        row0: usize,
        coef: f64,
        beta: f64,
        step: PPStep,
        start: usize,
        stop: usize,
        divide: Option<Divisor>,
        out: Option<&mut [f64]>,
    ) -> Result<Vec<f64>> {
        let rd = round.d();
        for (name, v) in [("x_new", &x_new), ("x_old", &x_old)] {
            if v.len() != rd {
                return Err(CoreError::invalid(name, format!("must have the round's d = {rd} coordinates, got {}", v.len())));
            }
        }
        Self::check_shift(round, g.dim(), row0, beta, start, stop)?;
        let (m, d) = g.dim();
        if h.dim() != (m, d) {
            return Err(CoreError::invalid("H", format!("H must have the shape of G, {:?}, got {:?}", (m, d), h.dim())));
        }
        let hs = h.as_slice_mut().ok_or_else(|| CoreError::invalid("H", "H must be C-contiguous"))?;
        let gs = g.as_slice_mut().ok_or_else(|| CoreError::invalid("G", "G must be C-contiguous"))?;
        if let Some(w) = rows.windows(2).find(|w| w[1] <= w[0]) {
            return Err(CoreError::invalid("rows", format!("must be strictly increasing, got {} after {}", w[1], w[0])));
        }
        if let Some(&r) = rows.last() {
            if r >= m {
                return Err(CoreError::invalid("rows", format!("row {r} is not one of the {m} held rows")));
            }
        }
        let PPStep { b, p, w } = step;
        if !(p > 0.0 && p <= 1.0) {
            return Err(CoreError::invalid("p", format!("must be in (0, 1], got {p}")));
        }
        CoreError::finite("b", b)?;
        CoreError::finite("w", w)?;
        let off = round.offsets();
        let mine: Vec<usize> = rows.iter().copied().filter(|&r| (start..stop).contains(&(row0 + r))).collect();
        let mut next = mine.iter().peekable();
        for i in start..stop {
            let sends = off[i + 1] > off[i];
            let listed = next.next_if(|&&r| row0 + r == i).is_some();
            if sends && !listed {
                return Err(CoreError::invalid("rows", format!("worker {i} has values in the round but is not a participant")));
            }
        }
        Need::new().bytes("T x and c x at both points and copies of the points", 6 * 8 * d as u128).check()?;
        let (mut b1, mut b2) = (Vec::new(), Vec::new());
        let (xn, xo) = (contiguous(&x_new, &mut b1, "a copy of x_new")?, contiguous(&x_old, &mut b2, "a copy of x_old")?);
        let ((tn, cn), (to, co)) = (self.tx_cx(xn)?, self.tx_cx(xo)?);
        // the values, G_ij += v (round_values_update checks the rest, out among them, before it
        // writes); then each participant's estimators, on rows disjoint from the others'
        let gv = ArrayViewMut2::from_shape((m, d), &mut *gs).map_err(|e| CoreError::invalid("G", e.to_string()))?;
        let values = self.round_values_update(round, x_new, Some(x_old), coef, gv, row0, beta, 1.0, start, stop, divide, out)?;
        for &r in &mine {
            let i = row0 + r;
            let (ai, bi) = (self.a[i], self.beta[i]);
            let (hr, gr) = (&mut hs[r * d..(r + 1) * d], &mut gs[r * d..(r + 1) * d]);
            // coordinate 0 (the −β_i) apart, the others in one pass, the gradients formed on the fly
            kernels::pp_step(&mut hr[0], &mut gr[0], grad_at(ai, bi, &tn, &cn, 0), grad_at(ai, bi, &to, &co, 0), b, w, |v| v / p);
            let (new_i, old_i) = (Affine { a: ai, t: &tn[1..], c: &cn[1..] }, Affine { a: ai, t: &to[1..], c: &co[1..] });
            kernels::pp_estimators_affine(&mut hr[1..], &mut gr[1..], new_i, old_i, b, p, w);
        }
        Ok(values)
    }

    /// The memory of an EF21 step for `m` workers.
    fn feedback_need(spec: &Spec, n: usize, d: usize, m: usize) -> Result<()> {
        let fp = spec.sparsifier.footprint(n, d);
        let threads = threads::num_threads()? as u128;
        Need::new()
            .bytes("T x and c x", 3 * 8 * d as u128)
            .bytes("the workers' buffers", threads * 24 * d as u128)
            .bytes("the round's plan", compress::rows_plan_bytes(spec, &fp, m))
            .bytes("the messages", 2 * compress::messages_bytes::<f64>(&fp, m))
            .check()
    }

    /// `(T x)_j` and `c x_j` for every coordinate.
    fn tx_cx(&self, x: &[f64]) -> Result<(Vec<f64>, Vec<f64>)> {
        let d = x.len();
        let tx = mem::collect("T x", d, (0..d).map(|j| t_at(x, j)))?;
        let cx = mem::collect("c x", d, x.iter().map(|&v| self.c * v))?;
        Ok((tx, cx))
    }

    /// The EF21 step on validated arguments: every worker's message first (`G` read only),
    /// then, when all are finite, `G_i += c_i`. `None` when a residual is not finite (`G`
    /// unchanged).
    #[allow(clippy::too_many_arguments)]
    fn feedback(&self, spec: &Spec, tx: &[f64], cx: &[f64], rows: &mut [f64], m: usize, d: usize, seed: u64, round: u64, start: usize) -> Result<Option<Vec<WorkerMsg>>> {
        let n = self.n();
        let parallel = m >= 2 && m * d >= EF21_PAR_MIN;
        let msgs: Vec<Result<WorkerMsg>> = match (&spec.sparsifier, spec.quantizer) {
            (compress::Sparsifier::TopK(TopK { k }), Quantizer::None) => {
                let k = *k;
                let worker = |r: usize, row: &[f64]| self.topk_worker(tx, cx, start + r, row, k);
                if parallel {
                    threads::install(|| rows.par_chunks(d).enumerate().map(|(r, row)| worker(r, row)).collect())?
                } else {
                    rows.chunks(d).enumerate().map(|(r, row)| worker(r, row)).collect()
                }
            }
            _ => {
                let plan = compress::rows_plan::<f64>(spec, n, d, seed, round, start, m)?;
                let worker = |buf: &mut Result<Vec<f64>>, r: usize, row: &[f64]| -> Result<WorkerMsg> {
                    let buf = buf.as_mut().map_err(|e| e.clone())?;
                    self.generic_worker(spec, plan.as_ref(), tx, cx, buf, r, row, seed, round, start)
                };
                let init = || mem::vec::<f64>("the residual", d);
                if parallel {
                    threads::install(|| rows.par_chunks(d).enumerate().map_init(init, |buf, (r, row)| worker(buf, r, row)).collect())?
                } else {
                    let mut buf = init();
                    rows.chunks(d).enumerate().map(|(r, row)| worker(&mut buf, r, row)).collect()
                }
            }
        };
        // the first error in worker order, whatever the thread count
        let mut list = mem::vec::<WorkerMsg>("the messages", m)?;
        for msg in msgs {
            list.push(msg?);
        }
        if list.iter().any(|w| matches!(w, WorkerMsg::NonFinite)) {
            return Ok(None);
        }
        // every message is known and finite: G_i += c_i (O(m·k), sequential)
        rows.chunks_mut(d).zip(&list).for_each(|(row, w)| w.for_each(|j, v| row[j] += v));
        Ok(Some(list))
    }

    /// The fused round's TopK(`k`) selection of worker `i` on `r = ∇f_i(x) − G_i` (`row` is
    /// `G_i`), message sorted by coordinate.
    fn topk_worker(&self, tx: &[f64], cx: &[f64], i: usize, row: &[f64], k: usize) -> Result<WorkerMsg> {
        let d = row.len();
        let (ai, bi) = (self.a[i], self.beta[i]);
        let r_at = |j: usize, gij: f64| residual_at(ai, bi, tx, cx, j, gij);
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
                let (Ok(gc), Ok(tc), Ok(cc)) = (<&[f64; 8]>::try_from(gc), <&[f64; 8]>::try_from(tc), <&[f64; 8]>::try_from(cc)) else {
                    continue; // chunks_exact(8) yields exactly 8
                };
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
                return Ok(WorkerMsg::NonFinite);
            }
            let found = if r0.abs() == best { Some((0, r0)) } else { (1..d).map(|j| (j, r_at(j, row[j]))).find(|(_, r)| r.abs() == best) };
            // the maximum of finite values is attained
            return Ok(found.map_or(WorkerMsg::NonFinite, |(bj, bv)| WorkerMsg::Top1(bj as u32, bv)));
        }
        let mut keyed: Vec<(f64, u32, f64)> = mem::vec("TopK's residual", d)?;
        for (j, gij) in row.iter().enumerate() {
            let r = r_at(j, *gij);
            if !r.is_finite() {
                return Ok(WorkerMsg::NonFinite);
            }
            keyed.push((r.abs(), j as u32, r));
        }
        if k < d {
            keyed.select_nth_unstable_by(k - 1, |a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal).then(a.1.cmp(&b.1)));
        }
        keyed.truncate(k);
        let mut sel = mem::collect("TopK's message", k, keyed.iter().map(|&(_, j, r)| (j, r)))?;
        sel.sort_unstable_by_key(|p| p.0);
        Ok(WorkerMsg::Sparse(sel))
    }

    /// Any other spec: the residual row into `buf`, then the spec's selection and
    /// [`compress::worker_message`] (a non-finite residual or message is `NonFinite`).
    #[allow(clippy::too_many_arguments)]
    fn generic_worker(
        &self,
        spec: &Spec,
        plan: Option<&RoundPlan>,
        tx: &[f64],
        cx: &[f64],
        buf: &mut Vec<f64>,
        r: usize,
        row: &[f64],
        seed: u64,
        round: u64,
        start: usize,
    ) -> Result<WorkerMsg> {
        let (n, i) = (self.n(), start + r);
        let (ai, bi) = (self.a[i], self.beta[i]);
        buf.clear();
        buf.extend(row.iter().enumerate().map(|(j, &gij)| residual_at(ai, bi, tx, cx, j, gij)));
        if !kernels::all_finite(buf) {
            return Ok(WorkerMsg::NonFinite);
        }
        let msg = compress::worker_message(spec, plan, ArrayView1::from(buf.as_slice()), r, i, n, seed, round)?;
        Ok(msg.map_or(WorkerMsg::NonFinite, WorkerMsg::Sparse))
    }

    /// Solves `((1/n) Σ A_i) x = rhs` in `O(d)` (with the stored `ā`).
    pub fn solve_mean(&self, rhs: &[f64]) -> Result<Vec<f64>> {
        solve_mean(self.a_mean, self.c, rhs)
    }
}

/// Solves the symmetric tridiagonal system `(ā T + c I) x = rhs` (Thomas algorithm, `O(d)`).
/// `rhs` must be finite (an error naming it); a zero pivot (the matrix is singular, e.g. `ā =
/// c = 0`, or it is indefinite with a singular leading block, which this solver without
/// pivoting cannot solve) or a solution that overflows is an error naming `solve_mean`.
pub fn solve_mean(a_mean: f64, c: f64, rhs: &[f64]) -> Result<Vec<f64>> {
    let d = rhs.len();
    nonempty("rhs", d)?;
    CoreError::all_finite("rhs", rhs)?;
    Need::new().array::<f64>("the solution", &[d]).bytes("the solver's temporaries", 16 * d as u128).check()?;
    let singular = |j: usize| {
        CoreError::invalid(
            "solve_mean",
            format!(
                "the mean matrix ā T + c I (ā = {a_mean:?}, c = {c:?}, d = {d}) has a zero pivot at row {j}: it is singular (or indefinite with a singular leading block, which this O(d) solver without pivoting cannot solve)"
            ),
        )
    };
    let diag = 2.0 * a_mean + c;
    let off = -a_mean;
    if diag == 0.0 {
        return Err(singular(0));
    }
    let mut cp = mem::filled("the solver's temporaries", d, 0.0)?;
    let mut dp = mem::filled("the solver's temporaries", d, 0.0)?;
    cp[0] = off / diag;
    dp[0] = rhs[0] / diag;
    for j in 1..d {
        let m = diag - off * cp[j - 1];
        if m == 0.0 {
            return Err(singular(j));
        }
        cp[j] = off / m;
        dp[j] = (rhs[j] - off * dp[j - 1]) / m;
    }
    let mut x = mem::filled("the solution", d, 0.0)?;
    x[d - 1] = dp[d - 1];
    for j in (0..d - 1).rev() {
        x[j] = dp[j] - cp[j] * x[j + 1];
    }
    if let Some(j) = x.iter().position(|v| !v.is_finite()) {
        return Err(CoreError::invalid(
            "solve_mean",
            format!("the solution of the mean system (ā = {a_mean:?}, c = {c:?}) overflows at coordinate {j}: the matrix is singular or nearly so (or rhs too large)"),
        ));
    }
    Ok(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::{BlockPermK, CoordinateSampling, Identity, Partition, PermK, RandK, Sparsifier};
    use crate::rng;
    use ndarray::ArrayViewMut1;
    use ndarray::{arr1, s, Array2};

    /// The reference rounds of the tests: the methods themselves are defined once, in Python
    /// (`permk.methods`), over the kernel's exchanges; these check the exchanges against whole
    /// rounds computed in place.
    /// One round of MARINA (Algorithm "MARINA") in place: `x ← x − γ g`; the shared coin of
    /// `(seed, round)`; on heads `g ← ∇f(x)`, on tails `g ← g + (1/n) Σ_i C_i(∇f_i(x) − ∇f_i(x_old))`.
    /// Returns the coin. `spec` must have a shared plan. Everything is validated and computed
    /// before `x` and `g` are written.
    #[allow(clippy::too_many_arguments)]
    fn marina_round(
        q: &Tridiagonal,
        spec: &Spec,
        mut x: ArrayViewMut1<f64>,
        mut g: ArrayViewMut1<f64>,
        gamma: f64,
        p: f64,
        seed: u64,
        round: u64,
    ) -> Result<bool> {
        let d = x.len();
        nonempty("x", d)?;
        if g.len() != d {
            return Err(CoreError::invalid("g", "x and g must have the same length"));
        }
        Tridiagonal::check_shared(spec)?;
        spec.check(q.n(), d)?;
        let fp = spec.sparsifier.footprint(q.n(), d);
        Need::new().bytes("the round's plan", fp.assign).bytes("the round's temporaries", Tridiagonal::mean_diff_bytes(d) + 24 * d as u128).check()?;
        let heads = rng::coin(seed, round, p)?;
        let (mut bx, mut bg) = (Vec::new(), Vec::new());
        let (xv, gv) = (x.view(), g.view());
        let x_old = contiguous(&xv, &mut bx, "a copy of x")?;
        let g_old = contiguous(&gv, &mut bg, "a copy of g")?;
        let x_new = mem::collect("the new x", d, x_old.iter().zip(g_old).map(|(&xi, &gi)| xi - gamma * gi))?;
        let g_new = if heads {
            q.grad_of(&x_new)?
        } else {
            let asg = spec.sparsifier.assign::<f64>(q.n(), d, seed, round, None)?;
            let mut m = q.mean_diff(&asg, &x_new, x_old)?;
            for (mi, &gi) in m.iter_mut().zip(g_old) {
                let sum = gi + *mi; // g + m, in this order (as before)
                *mi = sum;
            }
            m
        };
        drop((bx, bg));
        match x.as_slice_mut() {
            Some(s) => s.copy_from_slice(&x_new),
            None => x.iter_mut().zip(&x_new).for_each(|(xi, &v)| *xi = v),
        }
        match g.as_slice_mut() {
            Some(s) => s.copy_from_slice(&g_new),
            None => g.iter_mut().zip(&g_new).for_each(|(gi, &v)| *gi = v),
        }
        Ok(heads)
    }

    /// One EF21 round with TopK(`k`) in place, without ever forming the `(n, d)` local gradients:
    /// `x ← x − γ g`; worker `i` computes `r_i = ∇f_i(x) − G_i` row by row on the fly, sends
    /// `c_i = TopK_k(r_i)` (largest magnitudes, ties: lower index), and sets `G_i ← G_i + c_i`;
    /// `g ← g + (1/n) Σ_i c_i` (summed in worker order, then divided by `n`). Bit for bit the
    /// dense round `ef21_update(local_grads, TopK.compress_all, C.sum(0)/n)`. Everything is
    /// validated before anything is written. A non-finite residual sets `g` to NaN (the driver
    /// reports divergence) and leaves `G` unchanged (`x` takes its step).
    fn ef21_topk_round(
        q: &Tridiagonal,
        mut x: ArrayViewMut1<f64>,
        mut g: ArrayViewMut1<f64>,
        mut gmat: ArrayViewMut2<f64>,
        gamma: f64,
        k: usize,
    ) -> Result<()> {
        let d = x.len();
        let n = q.n();
        nonempty("x", d)?;
        if g.len() != d {
            return Err(CoreError::invalid("g", "x and g must have the same length"));
        }
        if gmat.dim() != (n, d) {
            return Err(CoreError::invalid("G", format!("G must have shape ({n}, {d}), got {:?}", gmat.dim())));
        }
        if k == 0 || k > d {
            return Err(CoreError::invalid("k", format!("k must be in [1, d = {d}], got {k}")));
        }
        if !gmat.is_standard_layout() {
            return Err(CoreError::invalid("G", "G must be C-contiguous"));
        }
        let spec = Spec::new(TopK { k }, Quantizer::None)?;
        spec.check(n, d)?;
        Tridiagonal::feedback_need(&spec, n, d, n)?;
        Need::new().bytes("the round's vectors", 16 * d as u128).check()?;
        let x_new = mem::collect("the new x", d, x.iter().zip(g.iter()).map(|(&xi, &gi)| xi - gamma * gi))?;
        let (tx, cx) = q.tx_cx(&x_new)?;
        let mut acc = mem::zeros::<f64>("the messages' sum", &[d])?;
        let rows = gmat.as_slice_mut().ok_or_else(|| CoreError::invalid("G", "G must be C-contiguous"))?;
        let list = q.feedback(&spec, &tx, &cx, rows, n, d, 0, 0, 0)?;
        x.iter_mut().zip(&x_new).for_each(|(xi, &v)| *xi = v);
        let Some(list) = list else {
            g.fill(f64::NAN);
            return Ok(());
        };
        // summed in worker order (and message order within a worker)
        for w in &list {
            w.for_each(|j, v| acc[j] += v);
        }
        let nf = n as f64;
        g.iter_mut().zip(&acc).for_each(|(gi, &ai)| *gi += ai / nf);
        Ok(())
    }

    fn problem() -> Tridiagonal {
        Tridiagonal::new(vec![0.25, 0.3, 0.2], 0.01, vec![-0.25, 0.1, -0.3]).unwrap()
    }

    /// n workers with varied coefficients.
    fn problem_n(n: usize) -> Tridiagonal {
        let a = (0..n).map(|i| 0.2 + 0.1 * ((i * 7) % 5) as f64).collect();
        let beta = (0..n).map(|i| -0.3 + 0.05 * ((i * 3) % 7) as f64).collect();
        Tridiagonal::new(a, 0.01, beta).unwrap()
    }

    fn vector(d: usize, salt: usize) -> Array1<f64> {
        Array1::from_shape_fn(d, |j| ((j * 7919 + salt * 104729) % 1009) as f64 / 97.0 - 5.0)
    }

    fn spec(s: impl Into<Sparsifier>) -> Spec {
        Spec::new(s, Quantizer::None).unwrap()
    }

    fn shared_specs() -> Vec<Spec> {
        vec![
            spec(PermK::default()),
            spec(PermK::SHUFFLE),
            spec(RandK { k: 2 }),
            spec(Identity),
            spec(BlockPermK { partition: Partition::Contiguous { m: 2 } }),
            spec(BlockPermK { partition: Partition::labels(vec![1, 0, 1, 0, 1, 1, 0]).unwrap() }),
            spec(CoordinateSampling),
        ]
    }

    #[test]
    fn round_values_are_local_grad_coords_arithmetic() {
        let mut specs = shared_specs();
        specs.push(spec(BlockPermK { partition: Partition::Contiguous { m: 1 } }));
        for (n, d) in [(3, 7), (7, 3), (4, 10), (1, 5), (5, 5), (6, 1), (12, 4), (4, 20_000), (3, 300_000)] {
            let q = problem_n(n);
            let (x, y) = (vector(d, 1), vector(d, 2));
            for sp in &specs {
                if sp.check(n, d).is_err() {
                    continue;
                }
                let r = Round::new(sp, n, d, 7, 3).unwrap();
                for (lo, hi) in [(0, n), (n / 2, n), (0, n / 2), (n - 1, n)] {
                    let rows = ndarray::Array1::from(r.rows(lo, hi).unwrap());
                    let cols = ndarray::Array1::from(r.coords(lo, hi).unwrap());
                    let scales = r.scales().unwrap();
                    let gx = q.local_grad_coords(x.view(), rows.view(), cols.view()).unwrap();
                    let gy = q.local_grad_coords(y.view(), rows.view(), cols.view()).unwrap();
                    let diff: Vec<u64> = (0..rows.len()).map(|t| ((gx[t] - gy[t]) * scales[rows[t] as usize]).to_bits()).collect();
                    let one: Vec<u64> = (0..rows.len()).map(|t| (gx[t] * scales[rows[t] as usize]).to_bits()).collect();
                    let got = |y: Option<ArrayView1<f64>>| -> Vec<u64> { q.round_values(&r, x.view(), y, lo, hi).unwrap().iter().map(|v| v.to_bits()).collect() };
                    assert_eq!(got(Some(y.view())), diff, "{sp:?} n={n} d={d} {lo}..{hi}");
                    assert_eq!(got(None), one, "{sp:?} n={n} d={d} {lo}..{hi}");
                    // divided (`(v + 0) / k`, two operations) and into a buffer of garbage
                    for k in [1u64, 2, 3, n as u64, 8, 1 << 53] {
                        let div = Some(Divisor::new(k).unwrap());
                        let want = |b: &[u64]| -> Vec<u64> { b.iter().map(|&v| ((f64::from_bits(v) + 0.0) / k as f64).to_bits()).collect() };
                        let new: Vec<u64> = q.round_values_div(&r, x.view(), Some(y.view()), lo, hi, div).unwrap().iter().map(|v| v.to_bits()).collect();
                        assert_eq!(new, want(&diff), "{sp:?} n={n} d={d} {lo}..{hi} k={k}");
                        let mut out = vec![f64::NAN; diff.len()];
                        q.round_values_into(&r, x.view(), None, lo, hi, div, &mut out).unwrap();
                        assert_eq!(out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want(&one), "{sp:?} n={n} d={d} {lo}..{hi} k={k}");
                    }
                    let mut out = vec![f64::NAN; diff.len()];
                    q.round_values_into(&r, x.view(), Some(y.view()), lo, hi, None, &mut out).unwrap();
                    assert_eq!(out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), diff);
                    // strided x and y: the same values
                    let xs = ndarray::concatenate![ndarray::Axis(0), x.view(), x.view()];
                    let xs = xs.slice(s![..;2]);
                    let v = q.round_values(&r, if d > 1 { x.view() } else { xs }, Some(y.view()), lo, hi).unwrap();
                    assert_eq!(v.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), diff);
                }
                if d == 5 && n == 5 {
                    let err = |e: CoreError| match e {
                        CoreError::InvalidArgument { name, .. } => name,
                        other => panic!("{other:?}"),
                    };
                    assert_eq!(err(q.round_values(&r, vector(4, 1).view(), None, 0, n).unwrap_err()), "x");
                    assert_eq!(err(q.round_values(&r, x.view(), Some(vector(6, 1).view()), 0, n).unwrap_err()), "y");
                    assert_eq!(err(q.round_values(&r, x.view(), None, 3, 2).unwrap_err()), "start");
                    assert_eq!(err(q.round_values(&r, x.view(), None, 0, n + 1).unwrap_err()), "stop");
                    assert_eq!(err(problem_n(4).round_values(&r, x.view(), None, 0, 1).unwrap_err()), "round");
                    // a wrong output length, after the other arguments; nothing written
                    let len = r.offsets()[n];
                    for m in [0, len - 1, len + 1] {
                        let mut out = vec![7.0; m];
                        assert_eq!(err(q.round_values_into(&r, x.view(), Some(y.view()), 0, n, None, &mut out).unwrap_err()), "out");
                        assert!(out.iter().all(|&v| v == 7.0));
                    }
                    let mut out = vec![7.0; len];
                    assert_eq!(err(q.round_values_into(&r, vector(4, 1).view(), None, 0, n, None, &mut out[..1]).unwrap_err()), "x");
                    assert_eq!(err(q.round_values_into(&r, x.view(), None, 0, n + 1, None, &mut out).unwrap_err()), "stop");
                    assert!(out.iter().all(|&v| v == 7.0));
                }
            }
        }
    }

    #[test]
    fn dasha_pp_values_are_the_shifted_values_then_numpys_estimator_steps() {
        let mut specs = shared_specs();
        specs.push(spec(BlockPermK { partition: Partition::Contiguous { m: 1 } }));
        // p not a power of two (the division), a power of two (the exact reciprocal), and 1
        let steps = [PPStep { b: 0.3, p: 0.6, w: 1.7 }, PPStep { b: 1.0 / 3.0, p: 0.5, w: 0.7 }, PPStep { b: 1.0, p: 1.0, w: 0.25 }];
        for ((n, d), step) in [(5, 7), (6, 1), (9, 2), (4, 300), (7, 40), (3, 1001)].into_iter().zip(steps.iter().cycle().copied()) {
            let (coef, beta) = (1.0 - step.b, 0.25);
            let q = problem_n(n);
            let (xn, xo) = (vector(d, 1), vector(d, 2));
            let h0 = Array2::from_shape_fn((n, d), |(r, j)| ((r * 31 + j * 7) % 13) as f64 * 0.37 - 2.0);
            let g0 = Array2::from_shape_fn((n, d), |(r, j)| ((r * 17 + j * 5) % 11) as f64 * 0.21 - 1.0);
            let who: Vec<usize> = (0..n).filter(|i| i % 2 == 0 || *i == n - 1).collect();
            for sp in &specs {
                if sp.check(n, d).is_err() {
                    continue;
                }
                // the participants' round (partial participation restricts a round to them)
                let r = Round::new(sp, n, d, 7, 3).unwrap().restricted(&who, n as f64 / who.len() as f64).unwrap();
                for (lo, hi, row0) in [(0, n, 0), (1, n, 1), (n / 2, n, n / 2)] {
                    let rows: Vec<usize> = who.iter().filter(|&&i| i >= row0).map(|&i| i - row0).collect();
                    let (hs, gs) = (h0.slice(s![row0.., ..]).to_owned(), g0.slice(s![row0.., ..]).to_owned());
                    let (mut h, mut g) = (hs.clone(), gs.clone());
                    let got = q.dasha_pp_values(&r, xn.view(), xo.view(), h.view_mut(), g.view_mut(), &rows, row0, coef, beta, step, lo, hi, None, None).unwrap();
                    // the reference: the shifted exchange's values (G updated), then numpy's
                    // estimator steps on the rows of local_grads_rows
                    let (mut hw, mut gw) = (hs.clone(), gs.clone());
                    let want = q.round_values_update(&r, xn.view(), Some(xo.view()), coef, gw.view_mut(), row0, beta, 1.0, lo, hi, None, None).unwrap();
                    let bits = |v: &[f64]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{sp:?} n={n} d={d} {lo}..{hi}");
                    let mine: Vec<usize> = rows.iter().copied().filter(|&r| (lo..hi).contains(&(r + row0))).collect();
                    let workers: Vec<usize> = mine.iter().map(|r| r + row0).collect();
                    let (new, old) = (q.local_grads_rows(xn.view(), &workers).unwrap(), q.local_grads_rows(xo.view(), &workers).unwrap());
                    for (k, &rr) in mine.iter().enumerate() {
                        for j in 0..d {
                            let mut dh = new[[k, j]] - old[[k, j]];
                            dh -= (hw[[rr, j]] - old[[k, j]]) * step.b;
                            dh /= step.p;
                            hw[[rr, j]] += dh;
                            gw[[rr, j]] += dh * step.w;
                        }
                    }
                    assert_eq!(bits(h.as_slice().unwrap()), bits(hw.as_slice().unwrap()), "{sp:?} n={n} d={d} {lo}..{hi}");
                    assert_eq!(bits(g.as_slice().unwrap()), bits(gw.as_slice().unwrap()), "{sp:?} n={n} d={d} {lo}..{hi}");
                    // divided and into a buffer: the same values, (v + 0)/k
                    let k = Divisor::new(n as u64).unwrap();
                    let (mut h2, mut g2) = (hs.clone(), gs.clone());
                    let mut out = vec![f64::NAN; got.len()];
                    q.dasha_pp_values(&r, xn.view(), xo.view(), h2.view_mut(), g2.view_mut(), &rows, row0, coef, beta, step, lo, hi, Some(k), Some(&mut out)).unwrap();
                    let div: Vec<u64> = got.iter().map(|&v| ((v + 0.0) / n as f64).to_bits()).collect();
                    assert_eq!(bits(&out), div);
                    assert_eq!(h2, h);
                    assert_eq!(g2, g);
                }
            }
        }
        // bad arguments: an error naming them, nothing written
        let (n, d) = (4, 6);
        let q = problem_n(n);
        let r = Round::new(&spec(PermK::default()), n, d, 1, 2).unwrap().restricted(&[0, 2], 2.0).unwrap();
        let x = vector(d, 1);
        let err = |e: CoreError| match e {
            CoreError::InvalidArgument { name, .. } => name,
            other => panic!("{other:?}"),
        };
        let (mut h, mut g) = (Array2::<f64>::ones((n, d)), Array2::<f64>::ones((n, d)));
        let mut bad = Array2::<f64>::ones((n, d + 1));
        let mut call_with = |xo: ArrayView1<f64>, wide: bool, rows: &[usize], (coef, beta, step): (f64, f64, PPStep), out: Option<&mut [f64]>| {
            let hv = if wide { bad.view_mut() } else { h.view_mut() };
            q.dasha_pp_values(&r, x.view(), xo, hv, g.view_mut(), rows, 0, coef, beta, step, 0, n, None, out).unwrap_err()
        };
        // the scalars: p in (0, 1], the others finite
        for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let step = PPStep { b: 0.5, p: 0.5, w: 1.0 };
            assert_eq!(err(call_with(x.view(), false, &[0, 2], (v, 0.1, step), None)), "coef");
            assert_eq!(err(call_with(x.view(), false, &[0, 2], (0.5, v, step), None)), "beta");
            assert_eq!(err(call_with(x.view(), false, &[0, 2], (0.5, 0.1, PPStep { b: v, ..step }), None)), "b");
            assert_eq!(err(call_with(x.view(), false, &[0, 2], (0.5, 0.1, PPStep { p: v, ..step }), None)), "p");
            assert_eq!(err(call_with(x.view(), false, &[0, 2], (0.5, 0.1, PPStep { w: v, ..step }), None)), "w");
        }
        let mut call = |xo: ArrayView1<f64>, wide: bool, rows: &[usize], p: f64, out: Option<&mut [f64]>| call_with(xo, wide, rows, (0.5, 0.1, PPStep { b: 0.5, p, w: 1.0 }), out);
        assert_eq!(err(call(vector(d - 1, 2).view(), false, &[0, 2], 0.5, None)), "x_old");
        assert_eq!(err(call(x.view(), true, &[0, 2], 0.5, None)), "H");
        assert_eq!(err(call(x.view(), false, &[2, 0], 0.5, None)), "rows");
        assert_eq!(err(call(x.view(), false, &[0, 2, 4], 0.5, None)), "rows");
        assert_eq!(err(call(x.view(), false, &[0], 0.5, None)), "rows"); // worker 2 sends but is not listed
        assert_eq!(err(call(x.view(), false, &[0, 2], 1.5, None)), "p");
        let mut short = vec![0.0; 1];
        assert_eq!(err(call(x.view(), false, &[0, 2], 0.5, Some(&mut short))), "out");
        assert!(h.iter().chain(g.iter()).all(|&v| v == 1.0));
    }

    #[test]
    fn shifted_round_values_are_the_exchanges_arithmetic() {
        let mut specs = shared_specs();
        specs.push(spec(BlockPermK { partition: Partition::Contiguous { m: 1 } }));
        for (n, d) in [(3, 7), (7, 3), (4, 10), (1, 5), (5, 5), (12, 4), (4, 5_000)] {
            let q = problem_n(n);
            let (x, y) = (vector(d, 1), vector(d, 2));
            for sp in &specs {
                if sp.check(n, d).is_err() {
                    continue;
                }
                let r = Round::new(sp, n, d, 7, 3).unwrap();
                for (lo, hi) in [(0, n), (n / 2, n), (n - 1, n)] {
                    // the held workers' rows lo..hi of a shift (row0 = lo)
                    let h0 = Array2::from_shape_fn((hi - lo, d), |(i, j)| ((i * 31 + j * 7) % 13) as f64 * 0.37 - 2.0);
                    let rows = ndarray::Array1::from(r.rows(lo, hi).unwrap());
                    let cols = ndarray::Array1::from(r.coords(lo, hi).unwrap());
                    let scales = r.scales().unwrap();
                    let gx = q.local_grad_coords(x.view(), rows.view(), cols.view()).unwrap();
                    let gy = q.local_grad_coords(y.view(), rows.view(), cols.view()).unwrap();
                    for (coef, beta, with_y) in [(1.0, 1.0, true), (0.25, 0.5, true), (1.0, 0.3, false)] {
                        // numpy's ((gx − coef·gy) − β·h) · scales[rows]
                        let want: Vec<f64> = (0..rows.len())
                            .map(|t| {
                                let (i, j) = (rows[t] as usize, cols[t] as usize);
                                let v = if with_y { gx[t] - coef * gy[t] } else { gx[t] };
                                (v - beta * h0[[i - lo, j]]) * scales[i]
                            })
                            .collect();
                        let yv = if with_y { Some(y.view()) } else { None };
                        let got = q.round_values_shifted(&r, x.view(), yv, coef, h0.view(), lo, beta, lo, hi, None, None).unwrap();
                        assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{sp:?} n={n} d={d}");
                        // the update: h += α v at the values' coordinates, the values divided after
                        for (alpha, k) in [(1.0, None), (0.5, Some(3u64)), (0.5, Some(4u64))] {
                            let mut h = h0.clone();
                            let div = k.map(|k| Divisor::new(k).unwrap());
                            let mut out = vec![f64::NAN; want.len()];
                            q.round_values_update(&r, x.view(), yv, coef, h.view_mut(), lo, beta, alpha, lo, hi, div, Some(&mut out)).unwrap();
                            let mut h_want = h0.clone();
                            for t in 0..rows.len() {
                                h_want[[rows[t] as usize - lo, cols[t] as usize]] += alpha * want[t];
                            }
                            assert_eq!(h.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), h_want.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
                            let vals: Vec<u64> = want.iter().map(|&v| k.map_or(v, |k| (v + 0.0) / k as f64).to_bits()).collect();
                            assert_eq!(out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), vals, "{sp:?} n={n} d={d} k={k:?}");
                        }
                    }
                    // a shift without the held rows, or of the wrong width: errors, nothing written
                    let err = |e: CoreError| match e {
                        CoreError::InvalidArgument { name, .. } => name,
                        other => panic!("{other:?}"),
                    };
                    let mut bad = Array2::<f64>::zeros((hi - lo, d + 1));
                    assert_eq!(err(q.round_values_update(&r, x.view(), None, 1.0, bad.view_mut(), lo, 1.0, 1.0, lo, hi, None, None).unwrap_err()), "H");
                    if lo > 0 {
                        let mut h = h0.clone();
                        assert_eq!(err(q.round_values_update(&r, x.view(), None, 1.0, h.view_mut(), lo, 1.0, 1.0, lo - 1, hi, None, None).unwrap_err()), "H");
                        assert_eq!(h, h0);
                    }
                }
            }
        }
    }

    #[test]
    fn non_finite_coefficients_are_refused_before_anything_is_written() {
        let (n, d) = (3, 5);
        let q = problem_n(n);
        let r = Round::new(&spec(PermK::default()), n, d, 0, 0).unwrap();
        let (x, y) = (vector(d, 1), vector(d, 2));
        let name = |e: CoreError| match e {
            CoreError::InvalidArgument { name, .. } => name,
            other => panic!("{other:?}"),
        };
        for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let mut h = Array2::<f64>::ones((n, d));
            let mut out = vec![7.0; r.len_of(0, n).unwrap()];
            // shifted: coef and beta; the update: alpha too; into out or not
            assert_eq!(name(q.round_values_shifted(&r, x.view(), Some(y.view()), v, h.view(), 0, 1.0, 0, n, None, None).unwrap_err()), "coef");
            assert_eq!(name(q.round_values_shifted(&r, x.view(), Some(y.view()), 1.0, h.view(), 0, v, 0, n, None, Some(&mut out)).unwrap_err()), "beta");
            for (coef, beta, alpha, want) in [(v, 1.0, 1.0, "coef"), (1.0, v, 1.0, "beta"), (1.0, 1.0, v, "alpha")] {
                let e = q.round_values_update(&r, x.view(), Some(y.view()), coef, h.view_mut(), 0, beta, alpha, 0, n, None, Some(&mut out)).unwrap_err();
                assert_eq!(name(e), want);
                let e = q.round_values_update(&r, x.view(), Some(y.view()), coef, h.view_mut(), 0, beta, alpha, 0, n, None, None).unwrap_err();
                assert_eq!(name(e), want);
                let shift = MeanShift { h: h.view_mut(), row0: 0, beta, alpha: Some(alpha) };
                assert_eq!(name(q.round_mean(&r, x.view(), Some(y.view()), coef, Some(shift)).unwrap_err()), want);
            }
            assert_eq!(name(q.round_mean(&r, x.view(), Some(y.view()), v, None).unwrap_err()), "coef");
            let shift = MeanShift { h: h.view_mut(), row0: 0, beta: v, alpha: None };
            assert_eq!(name(q.round_mean(&r, x.view(), Some(y.view()), 1.0, Some(shift)).unwrap_err()), "beta");
            assert!(h.iter().all(|&e| e == 1.0), "v = {v}");
            assert!(out.iter().all(|&e| e == 7.0), "v = {v}");
            // the problem's own coefficients, each named
            assert_eq!(name(Tridiagonal::new(vec![0.25, v], 0.1, vec![0.0, 0.0]).unwrap_err()), "a");
            assert_eq!(name(Tridiagonal::new(vec![0.25, 0.5], v, vec![0.0, 0.0]).unwrap_err()), "c");
            assert_eq!(name(Tridiagonal::new(vec![0.25, 0.5], 0.1, vec![v, 0.0]).unwrap_err()), "beta");
            assert_eq!(name(q.solve_mean(&[1.0, v, 0.0]).unwrap_err()), "rhs");
        }
    }

    #[test]
    fn a_singular_mean_system_is_refused() {
        // ā = c = 0: the zero matrix (it used to return NaNs)
        let q = Tridiagonal::new(vec![1.0, -1.0], 0.0, vec![1.0, 2.0]).unwrap();
        let e = q.solve_mean(&[1.0, 2.0, 3.0]).unwrap_err();
        assert!(matches!(&e, CoreError::InvalidArgument { name, .. } if name == "solve_mean"), "{e:?}");
        assert!(e.to_string().contains("singular"), "{e}");
        // a zero pivot past the first row: ā = 1, c = −1 (2ā + c = 1, then 1 − 1/1 = 0); this d = 3
        // matrix is not singular, but its leading 2 × 2 block is and the solver does not pivot
        let e = solve_mean(1.0, -1.0, &[1.0, 0.0, 0.0]).unwrap_err();
        assert!(e.to_string().contains("zero pivot at row 1"), "{e}");
        // an overflowing solution
        let e = solve_mean(1e-300, 0.0, &[1e300, 0.0]).unwrap_err();
        assert!(e.to_string().contains("overflows"), "{e}");
        // a nonsingular system is solved as before (solve_mean_solves checks the values)
        assert!(solve_mean(0.25, 0.1, &[1.0, 2.0]).is_ok());
    }

    #[test]
    fn local_grads_rows_are_the_rows_of_local_grads() {
        let q = problem_n(6);
        let x = vector(9, 3);
        let all = q.local_grads(x.view(), 0, 6).unwrap();
        let some = q.local_grads_rows(x.view(), &[4, 1, 1, 5]).unwrap();
        for (k, &i) in [4usize, 1, 1, 5].iter().enumerate() {
            assert_eq!(some.row(k).iter().map(|v| v.to_bits()).collect::<Vec<_>>(), all.row(i).iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        }
        assert!(matches!(q.local_grads_rows(x.view(), &[6]), Err(CoreError::InvalidArgument { name, .. }) if name == "rows"));
    }

    #[test]
    fn gradients_are_consistent() {
        let q = problem();
        let x = arr1(&[1.0, -2.0, 0.5, 3.0]);
        let lg = q.local_grads(x.view(), 0, 3).unwrap();
        let g = q.grad(x.view()).unwrap();
        let mean = lg.mean_axis(ndarray::Axis(0)).unwrap();
        for j in 0..4 {
            assert!((g[j] - mean[j]).abs() < 1e-12);
        }
        let rows = arr1(&[0i64, 2, 1]);
        let cols = arr1(&[0i64, 3, 1]);
        let c = q.local_grad_coords(x.view(), rows.view(), cols.view()).unwrap();
        for k in 0..3 {
            assert_eq!(c[k], lg[[rows[k] as usize, cols[k] as usize]]);
        }
        // rows start..stop are those rows of all local gradients
        assert_eq!(q.local_grads(x.view(), 1, 3).unwrap(), lg.slice(s![1..3, ..]));
        assert_eq!(q.local_grads(x.view(), 2, 2).unwrap().dim(), (0, 4));
        // finite-difference check of the loss gradient
        let h = 1e-6;
        for j in 0..4 {
            let mut xp = x.clone();
            xp[j] += h;
            let mut xm = x.clone();
            xm[j] -= h;
            let fd = (q.loss(xp.view()).unwrap() - q.loss(xm.view()).unwrap()) / (2.0 * h);
            assert!((fd - g[j]).abs() < 1e-6, "{fd} vs {}", g[j]);
        }
        // strided x is read like a contiguous one
        let wide = arr1(&[1.0, 9.0, -2.0, 9.0, 0.5, 9.0, 3.0, 9.0]);
        assert_eq!(q.grad(wide.slice(s![..;2])).unwrap(), g);
        assert_eq!(q.loss(wide.slice(s![..;2])).unwrap(), q.loss(x.view()).unwrap());
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let q = problem();
        let empty = Array1::<f64>::zeros(0);
        let name = |e: CoreError| match e {
            CoreError::InvalidArgument { name, .. } => name,
            other => panic!("{other:?}"),
        };
        assert_eq!(name(q.loss(empty.view()).unwrap_err()), "x");
        assert_eq!(name(q.grad(empty.view()).unwrap_err()), "x");
        assert_eq!(name(q.local_grads(empty.view(), 0, 3).unwrap_err()), "x");
        assert_eq!(name(q.solve_mean(&[]).unwrap_err()), "rhs");
        let x = arr1(&[1.0, 2.0]);
        assert_eq!(name(q.local_grads(x.view(), 0, 4).unwrap_err()), "stop");
        assert_eq!(name(q.local_grads(x.view(), 3, 2).unwrap_err()), "start");
        assert_eq!(name(q.local_grad_coords(x.view(), arr1(&[3]).view(), arr1(&[0]).view()).unwrap_err()), "rows");
        assert_eq!(name(q.local_grad_coords(x.view(), arr1(&[0]).view(), arr1(&[-1]).view()).unwrap_err()), "cols");
        assert_eq!(name(q.local_grad_coords(x.view(), arr1(&[0, 1]).view(), arr1(&[0]).view()).unwrap_err()), "rows");
        assert_eq!(name(q.compressed_mean_diff(&spec(PermK::default()), x.view(), arr1(&[1.0]).view(), 0, 0).unwrap_err()), "x_old");
        assert_eq!(name(q.compressed_mean_diff(&spec(crate::compress::TopK { k: 1 }), x.view(), x.view(), 0, 0).unwrap_err()), "compressor");
        assert!(Tridiagonal::new(vec![], 0.0, vec![]).is_err());
        assert!(Tridiagonal::new(vec![f64::NAN], 0.0, vec![0.0]).is_err());
        // sizes are checked before allocating: 10^5 workers × 10^6 coordinates
        let big = Tridiagonal::new(vec![0.25; 100_000], 0.1, vec![0.0; 100_000]).unwrap();
        let x = Array1::<f64>::zeros(1_000_000);
        let e = big.local_grads(x.view(), 0, 100_000).unwrap_err();
        assert!(matches!(e, CoreError::Memory { .. }));
        assert!(e.to_string().contains("the local gradients with shape (100000, 1000000) and data type float64"), "{e}");
    }

    #[test]
    fn solve_mean_solves() {
        let rhs = [1.0, 0.0, -2.0, 0.5, 0.25];
        let x = solve_mean(0.25, 0.1, &rhs).unwrap();
        for j in 0..5 {
            let tx = t_at(&x, j);
            assert!((0.25 * tx + 0.1 * x[j] - rhs[j]).abs() < 1e-12);
        }
        // the method uses the stored mean of the a_i (the glue used to recompute it)
        let q = problem();
        let mean = q.a.iter().sum::<f64>() / q.n() as f64;
        assert_eq!(q.solve_mean(&rhs).unwrap(), solve_mean(mean, q.c, &rhs).unwrap());
    }

    #[test]
    fn ef21_topk_round_matches_dense() {
        let q = problem();
        let d = 7;
        let x0 = arr1(&[1.0, -2.0, 0.5, 3.0, 0.0, 1.5, -0.5]);
        for k in [1usize, 3] {
            let mut gm = q.local_grads(x0.view(), 0, 3).unwrap();
            let mut g = gm.mean_axis(ndarray::Axis(0)).unwrap();
            let mut x = x0.clone();
            for _ in 0..5 {
                // the dense reference
                let x_new = &x - &(0.3 * &g);
                let r = q.local_grads(x_new.view(), 0, 3).unwrap() - &gm;
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
                ef21_topk_round(&q, x.view_mut(), g.view_mut(), gm.view_mut(), 0.3, k).unwrap();
                assert_eq!(x, x_new);
                for j in 0..d {
                    assert!((g[j] - g_ref[j]).abs() <= 1e-12 * (1.0 + g_ref[j].abs()));
                }
                assert_eq!(gm, gm_ref);
            }
        }
    }

    /// The reference: marina's tail on the per-worker CSR plan (the pre-refactor code path).
    fn tail_reference(q: &Tridiagonal, sp: &Spec, x_new: &[f64], x_old: &[f64], seed: u64, round: u64) -> Vec<f64> {
        let plan = compress::round_plan::<f64>(sp, q.n(), x_new.len(), seed, round, None).unwrap();
        q.compressed_mean_diff_with_plan(&plan, x_new, x_old).unwrap()
    }

    #[test]
    fn compressed_mean_diff_is_marinas_tail_bit_for_bit() {
        for (n, d) in [(3, 7), (5, 3), (4, 4), (11, 2), (6, 50)] {
            let q = problem_n(n);
            let (x0, g0) = (vector(d, 1), vector(d, 2));
            for sp in &shared_specs() {
                if sp.check(n, d).is_err() {
                    continue;
                }
                for round in 0..3 {
                    let (mut x, mut g) = (x0.clone(), g0.clone());
                    // p = 0: always tails
                    let heads = marina_round(&q, sp, x.view_mut(), g.view_mut(), 0.1, 0.0, 5, round).unwrap();
                    assert!(!heads);
                    let x_new = &x0 - &(0.1 * &g0);
                    assert_eq!(x, x_new);
                    let cmd = q.compressed_mean_diff(sp, x_new.view(), x0.view(), 5, round).unwrap();
                    for j in 0..d {
                        assert_eq!(g[j].to_bits(), (g0[j] + cmd[j]).to_bits(), "{sp:?} n={n} d={d}");
                    }
                    let reference = tail_reference(&q, sp, x_new.as_slice().unwrap(), x0.as_slice().unwrap(), 5, round);
                    assert!(cmd.iter().zip(&reference).all(|(a, b)| a.to_bits() == b.to_bits()), "{sp:?}");
                    // and it is the aggregate of the local gradient differences, bit for bit
                    let diff = q.local_grads(x_new.view(), 0, n).unwrap() - q.local_grads(x0.view(), 0, n).unwrap();
                    let dense = compress::aggregate(sp, diff.view(), 5, round).unwrap();
                    for j in 0..d {
                        assert_eq!(cmd[j], dense[j], "{sp:?} n={n} d={d} j={j}");
                    }
                }
            }
        }
        // heads: g is the gradient at the new x
        let q = problem_n(4);
        let (mut x, mut g) = (vector(6, 1), vector(6, 2));
        assert!(marina_round(&q, &spec(PermK::default()), x.view_mut(), g.view_mut(), 0.1, 1.0, 0, 0).unwrap());
        assert_eq!(g, q.grad(x.view()).unwrap());
    }

    #[test]
    fn in_place_kernels_validate_before_writing() {
        let q = problem_n(3);
        let (x0, g0) = (vector(5, 1), vector(5, 2));
        let (mut x, mut g) = (x0.clone(), g0.clone());
        let topk = spec(crate::compress::TopK { k: 1 });
        assert!(marina_round(&q, &topk, x.view_mut(), g.view_mut(), 0.1, 0.0, 0, 0).is_err());
        assert!(marina_round(&q, &spec(BlockPermK { partition: Partition::Contiguous { m: 4 } }), x.view_mut(), g.view_mut(), 0.1, 0.0, 0, 0).is_err());
        assert!(marina_round(&q, &spec(RandK { k: 9 }), x.view_mut(), g.view_mut(), 0.1, 0.0, 0, 0).is_err());
        let mut short = g0.slice(s![..4]).to_owned();
        assert!(marina_round(&q, &spec(PermK::default()), x.view_mut(), short.view_mut(), 0.1, 0.0, 0, 0).is_err());
        assert_eq!((&x, &g), (&x0, &g0));
        // EF21: wrong shapes, k, or a non-contiguous G change nothing
        let mut gm = Array2::<f64>::ones((3, 10));
        let gm0 = gm.clone();
        assert!(ef21_topk_round(&q, x.view_mut(), g.view_mut(), gm.slice_mut(s![.., ..;2]), 0.1, 1).is_err());
        assert!(ef21_topk_round(&q, x.view_mut(), g.view_mut(), gm.slice_mut(s![.., ..5]), 0.1, 1).is_err());
        assert!(ef21_topk_round(&q, x.view_mut(), g.view_mut(), gm.slice_mut(s![.., ..5]), 0.1, 0).is_err());
        assert!(ef21_topk_round(&q, x.view_mut(), g.view_mut(), gm.slice_mut(s![..2, ..5]), 0.1, 1).is_err());
        assert!(q.error_feedback(&topk, x.view(), gm.slice_mut(s![.., ..;2]), 0, 0, 0).is_err());
        assert!(q.error_feedback(&topk, x.view(), gm.slice_mut(s![.., ..4]), 0, 0, 0).is_err());
        assert!(q.error_feedback(&topk, x.view(), gm.slice_mut(s![..2, ..5]), 0, 0, 2).is_err());
        assert!(q.error_feedback(&spec(RandK { k: 6 }), x.view(), gm.slice_mut(s![..2, ..5]), 0, 0, 0).is_err());
        assert_eq!((&x, &g, &gm), (&x0, &g0, &gm0));
    }

    #[test]
    fn error_feedback_is_the_fused_ef21_round_bit_for_bit() {
        for (n, d, k) in [(3, 7, 1), (3, 7, 3), (4, 1, 1), (9, 40_000, 1), (9, 40_000, 17), (2, 5, 5)] {
            let q = problem_n(n);
            let x0 = vector(d, 3);
            let mut gm = q.local_grads(x0.view(), 0, n).unwrap();
            gm.mapv_inplace(|v| v * 0.9);
            let g0 = vector(d, 4);
            let sp = spec(crate::compress::TopK { k });
            // the fused round
            let (mut x1, mut g1, mut gm1) = (x0.clone(), g0.clone(), gm.clone());
            ef21_topk_round(&q, x1.view_mut(), g1.view_mut(), gm1.view_mut(), 0.2, k).unwrap();
            // the worker step at x - γ g, in two pieces
            let x_new = &x0 - &(0.2 * &g0);
            assert_eq!(x1, x_new);
            let mut gm2 = gm.clone();
            let cut = n / 2;
            let fa = q.error_feedback(&sp, x_new.view(), gm2.slice_mut(s![..cut, ..]), 0, 0, 0).unwrap();
            let fb = q.error_feedback(&sp, x_new.view(), gm2.slice_mut(s![cut.., ..]), 0, 0, cut).unwrap();
            assert!(fa.finite && fb.finite);
            assert_eq!(gm2, gm1);
            let mut acc = vec![0.0f64; d];
            for f in [&fa, &fb] {
                assert_eq!(f.messages.offsets.len(), f.messages.offsets.len());
                for (&j, &v) in f.messages.indices.iter().zip(&f.messages.values) {
                    acc[j as usize] += v;
                }
            }
            for j in 0..d {
                assert_eq!((g0[j] + acc[j] / n as f64).to_bits(), g1[j].to_bits());
            }
            // each message is TopK's compress of the residual (sorted, bit for bit)
            let r = q.local_grads(x_new.view(), 0, n).unwrap() - &gm;
            for i in 0..cut {
                let (idx, val) = compress::compress(&sp, r.row(i), i, n, 0, 0).unwrap();
                let (lo, hi) = (fa.messages.offsets[i] as usize, fa.messages.offsets[i + 1] as usize);
                assert_eq!(fa.messages.indices[lo..hi], idx[..]);
                assert!(fa.messages.values[lo..hi].iter().zip(&val).all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
    }

    #[test]
    fn error_feedback_compresses_the_residual_with_any_spec() {
        let (n, d) = (5, 7);
        let q = problem_n(n);
        let x = vector(d, 5);
        let gm = q.local_grads(vector(d, 6).view(), 0, n).unwrap();
        let mut specs = shared_specs();
        specs.push(Spec::new(PermK::default(), Quantizer::Qsgd { s: 3 }).unwrap());
        specs.push(Spec::new(crate::compress::TopK { k: 3 }, Quantizer::Natural).unwrap());
        for sp in &specs {
            let mut g2 = gm.clone();
            let f = q.error_feedback(sp, x.view(), g2.slice_mut(s![1.., ..]), 4, 7, 1).unwrap();
            assert!(f.finite);
            let r = q.local_grads(x.view(), 0, n).unwrap() - &gm;
            let mut expect = gm.clone();
            for w in 1..n {
                let (idx, val) = compress::compress(sp, r.row(w), w, n, 4, 7).unwrap();
                let (lo, hi) = (f.messages.offsets[w - 1] as usize, f.messages.offsets[w] as usize);
                assert_eq!(f.messages.indices[lo..hi], idx[..], "{sp:?}");
                assert!(f.messages.values[lo..hi].iter().zip(&val).all(|(a, b)| a.to_bits() == b.to_bits()));
                for (&j, &v) in idx.iter().zip(&val) {
                    expect[[w, j as usize]] += v;
                }
            }
            assert_eq!(g2, expect, "{sp:?}");
        }
    }

    #[test]
    fn non_finite_residuals_leave_g_unchanged() {
        let (n, d) = (4, 9);
        let q = problem_n(n);
        let x = vector(d, 1);
        let mut gm = q.local_grads(x.view(), 0, n).unwrap();
        gm[[2, 5]] = f64::NAN;
        for sp in [spec(crate::compress::TopK { k: 1 }), spec(crate::compress::TopK { k: 3 }), spec(PermK::default()), Spec::new(PermK::default(), Quantizer::Qsgd { s: 2 }).unwrap()] {
            let before = gm.clone();
            let f = q.error_feedback(&sp, x.view(), gm.view_mut(), 0, 0, 0).unwrap();
            assert!(!f.finite);
            assert!(f.messages.indices.is_empty() && f.messages.offsets == vec![0; n + 1]);
            assert!(gm.iter().zip(&before).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
        // the fused round reports it as g = NaN, G unchanged
        let (mut x1, mut g1) = (x.clone(), vector(d, 2));
        let before = gm.clone();
        ef21_topk_round(&q, x1.view_mut(), g1.view_mut(), gm.view_mut(), 0.1, 2).unwrap();
        assert!(g1.iter().all(|v| v.is_nan()));
        assert!(gm.iter().zip(&before).all(|(a, b)| a.to_bits() == b.to_bits()));
    }

    #[test]
    fn ef21_steps_do_not_depend_on_the_thread_count() {
        let (n, d) = (8, 20_000);
        let q = problem_n(n);
        let x = vector(d, 1);
        let gm = q.local_grads(vector(d, 2).view(), 0, n).unwrap();
        let run = |sp: &Spec| {
            let mut g = gm.clone();
            let f = q.error_feedback(sp, x.view(), g.view_mut(), 3, 3, 0).unwrap();
            (f, g)
        };
        let specs = [spec(crate::compress::TopK { k: 1 }), spec(crate::compress::TopK { k: 40 }), spec(PermK::default()), spec(RandK { k: 100 })];
        let _lock = crate::threads::TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        crate::threads::set_num_threads(1).unwrap();
        let one: Vec<_> = specs.iter().map(run).collect();
        crate::threads::set_num_threads(3).unwrap();
        let three: Vec<_> = specs.iter().map(run).collect();
        assert!(one == three);
    }
}
