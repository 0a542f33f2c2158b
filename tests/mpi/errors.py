"""Argument errors of the MPI drivers on one process (``python errors.py``): prints one line
``name|ExceptionType|message`` per bad call."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

import permk
import permk.distributed as pd


class NoConstants:
    n, d, workers = 2, 4, range(2)
    x0 = np.zeros(4)

    def local_grad(self, i: int, x: np.ndarray) -> np.ndarray:
        return x - i


class SumsItself(NoConstants):
    """A local problem that also sums its workers' gradients itself (``local_grad_sum``, of
    ``size`` values): counts the per-worker gradients asked of it."""

    def __init__(self, size: int = 4) -> None:
        self.size, self.asked = size, 0

    def local_grad(self, i: int, x: np.ndarray) -> np.ndarray:
        self.asked += 1
        return x - i

    def local_grad_sum(self, x: np.ndarray) -> np.ndarray:
        return (2 * x - 1)[: self.size]


def main() -> None:
    q = permk.Quadratic.synthetic(n=2, d=6, lam=1e-3, noise_scale=0.1, seed=0)
    v = pd.LocalView(q)
    calls: dict[str, Callable[[], Any]] = {
        "global_problem": lambda: print(f"global_problem_same|{np.array_equal(pd.marina(q, permk.PermK(), rounds=3, seed=0).x, pd.marina(v, permk.PermK(), rounds=3, seed=0).x)}|", flush=True),
        "not_a_problem": lambda: pd.marina(object(), permk.PermK(), rounds=3, seed=0),
        "mode": lambda: pd.marina(v, permk.PermK(), rounds=3, seed=0, mode="ring"),  # type: ignore[arg-type]
        "reduce": lambda: pd.marina(v, permk.PermK(), rounds=3, seed=0, reduce="tree"),  # type: ignore[arg-type]
        "path": lambda: pd.marina(v, permk.GroupPermK([[0], [1]]), rounds=3, seed=0, path="rust"),
        "topk_marina": lambda: pd.marina(v, permk.TopK(2), rounds=3, seed=0),
        "permk_ef21": lambda: pd.ef21(v, permk.PermK(), rounds=3, seed=0),
        "rounds": lambda: pd.marina(v, permk.PermK(), rounds=0, seed=0),
        "seed": lambda: pd.marina(v, permk.PermK(), rounds=3, seed=None),  # type: ignore[arg-type]
        "no_constants": lambda: pd.marina(NoConstants(), permk.PermK(), rounds=3, seed=0),
        "state": lambda: pd.marina(v, permk.PermK(), rounds=3, seed=0, state="nope"),  # type: ignore[arg-type]
        "x0": lambda: pd.marina(v, permk.PermK(), rounds=3, seed=0, x0=np.zeros(5)),
        "ef21_state_rows": lambda: pd.ef21(v, permk.TopK(2), rounds=3, seed=0, state=permk.EF21State(
            x=np.zeros(6), g=np.zeros(6), G=np.zeros((3, 6)), round=0, seed=0)),
        "resume_seed": lambda: pd.marina(v, permk.PermK(), rounds=3, seed=1, state=permk.MarinaState(x=q.x0, g=q.grad(q.x0), seed=2)),
        "participation": lambda: pd.run(permk.dasha, v, permk.PermK(), rounds=3, seed=0, participation=3),
        "not_held": lambda: pd.LocalView(q, workers=[1]).local_grad(0, q.x0),
        "not_contiguous": lambda: pd.LocalView(permk.Quadratic.synthetic(n=4, d=6, lam=1e-3, noise_scale=0.1), workers=[0, 2]),
        "grad_sum_shape": lambda: pd.marina(SumsItself(3), permk.PermK(), rounds=3, seed=0, gamma=0.1, p=1.0),
    }
    for name, call in calls.items():
        try:
            call()
            print(f"{name}|no error|", flush=True)
        except Exception as e:
            print(f"{name}|{type(e).__name__}|{e}", flush=True)
    # a run that works on one process, resumed from its state: the same as one long run
    a = pd.marina(v, permk.PermK(), rounds=10, seed=3)
    b = pd.marina(v, permk.PermK(), rounds=6, seed=3)
    b = pd.marina(v, permk.PermK(), rounds=4, seed=3, state=b.state)
    print(f"resume|{np.array_equal(a.x, b.x)}|")
    # full rounds (p = 1) with reduce="allreduce" send the problem's own sum, never asking for the
    # workers' gradients; reduce="ordered" sums the workers' gradients in worker order: the same up to rounding
    summed, ordered = SumsItself(), SumsItself()
    xa = pd.marina(summed, permk.PermK(), rounds=4, seed=0, gamma=0.1, p=1.0).x
    xo = pd.marina(ordered, permk.PermK(), rounds=4, seed=0, gamma=0.1, p=1.0, reduce="ordered").x
    print(f"grad_sum_used|{summed.asked == 0 and ordered.asked > 0 and np.allclose(xa, xo, rtol=1e-12, atol=1e-14)}|")
    s = permk.ef21(q, permk.TopK(2), rounds=5, seed=0)
    e = pd.ef21(v, permk.TopK(2), rounds=3, seed=0, state=s.state, reduce="ordered")
    print(f"ef21_resume_from_simulator|{e.state.round == 8 and e.state.G.shape == (2, 6)}|")
    # DASHA-PP's rows G and H of all workers, resumed on MPI: the simulator's uninterrupted run
    kw: dict[str, Any] = dict(seed=0, participation=1, reduce="ordered")
    s = permk.dasha(q, permk.PermK(), rounds=5, seed=0, participation=1)
    m = pd.run(permk.dasha, v, permk.PermK(), rounds=3, state=s.state, **kw)
    whole = permk.dasha(q, permk.PermK(), rounds=8, seed=0, participation=1)
    same = m.state.round == 8 and m.state.H.shape == (2, 6) and np.allclose(m.x, whole.x, rtol=1e-12, atol=1e-14)
    print(f"dasha_pp_resume_from_simulator|{same}|")


if __name__ == "__main__":
    main()
