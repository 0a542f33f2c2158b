"""A problem wrapper that counts every gradient-oracle call by worker and point, and the rules
the methods' rounds are checked against (tests/test_oracle_calls.py, tests/mpi/oracle_calls.py).

:class:`CountingProblem` wraps a problem (and its native kernel) and logs, for every oracle call,
each worker it evaluates, the point (by the bytes of ``x``), the mode — ``"whole"`` (a whole
local gradient: ``local_grads``, ``local_grad``, blocks, a problem's own messages, a held
workers' sum, the global ``grad`` as every worker's gradient, the kernel's whole rows and EF21
step, DASHA-PP's participants), ``"coords"`` (some coordinates: ``local_grad_coords``, the kernel's round values and
means) or ``"minibatch"`` — and the samples (``b`` per minibatch gradient). It sees every path:
dense rows, the coordinate oracle, the native kernel, and, wrapped before
:class:`permk.distributed.LocalView`, MPI.

:func:`counted_rounds` runs a method's rounds one by one on a backend (no metrics: only the
rounds' own evaluations) and returns, per round, the evaluations by worker and point tag
(``"new"`` = ``x^{t+1}``, ``"old"`` = ``x^t``) and the reported :class:`permk.RoundInfo`.
:func:`algorithm` states each method's round: the points each worker's update reads, those it
kept from an earlier round, and what the round counts; :func:`check_round` checks a round's
evaluations against it.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from dataclasses import replace
from typing import Any, Callable, Iterator

import numpy as np

from permk.compressors.participation import participants

COUNTED_PROBLEM = ("grad", "local_grads", "local_grad", "local_grad_coords", "local_grad_blocks", "local_message_blocks",
                   "local_grad_sum", "minibatch_grads", "minibatch_grads_pair")


def key(x: Any) -> str:
    """A point's key: the digest of its float64 bytes."""
    return hashlib.sha1(np.ascontiguousarray(x, dtype=np.float64).tobytes()).hexdigest()


class Log:
    """The evaluations so far: ``(worker, point key, mode, size)``."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, str, str, int]] = []

    def add(self, workers: Any, x: Any, mode: str, size: int = 1) -> None:
        k = key(x)
        for w in np.atleast_1d(np.asarray(workers, dtype=np.int64)).tolist():
            self.entries.append((int(w), k, mode, int(size)))

    def take(self) -> list[tuple[int, str, str, int]]:
        out, self.entries = self.entries, []
        return out


def _with_values(r: Any, start: int, stop: int) -> np.ndarray:
    """The workers ``start..stop`` with values in round ``r``, and how many each."""
    off = np.asarray(r.offsets())
    sizes = np.diff(off[start : stop + 1])
    return np.arange(start, stop)[sizes > 0], sizes[sizes > 0]


class CountingKernel:
    """A native kernel (``permk._core.Tridiagonal``) whose oracle calls are logged."""

    def __init__(self, kernel: Any, log: Log, n: int) -> None:
        self._k, self._log, self._n = kernel, log, n

    def __getattr__(self, name: str) -> Any:
        return getattr(self._k, name)

    def local_grads(self, x: Any, start: int = 0, stop: int | None = None) -> Any:
        stop = self._n if stop is None else stop
        self._log.add(range(start, stop), x, "whole")
        return self._k.local_grads(x, start, stop)

    def local_grads_rows(self, x: Any, rows: Any) -> Any:
        self._log.add(rows, x, "whole")
        return self._k.local_grads_rows(x, rows)

    def local_grad_coords(self, x: Any, rows: Any, cols: Any) -> Any:
        for w, c in Counter(np.asarray(rows).tolist()).items():
            self._log.add(w, x, "coords", c)
        return self._k.local_grad_coords(x, rows, cols)

    def _round_points(self, r: Any, x: Any, y: Any, start: int, stop: int) -> None:
        who, sizes = _with_values(r, start, stop)
        for w, c in zip(who.tolist(), sizes.tolist()):
            self._log.add(w, x, "coords", c)
            if y is not None:
                self._log.add(w, y, "coords", c)

    def round_values(self, r: Any, x: Any, y: Any, start: int, stop: int, **kw: Any) -> Any:
        self._round_points(r, x, y, start, stop)
        return self._k.round_values(r, x, y, start, stop, **kw)

    def round_mean(self, r: Any, x: Any, y: Any, **kw: Any) -> Any:
        self._round_points(r, x, y, 0, self._n)
        return self._k.round_mean(r, x, y, **kw)

    def compressed_mean_diff(self, spec: Any, x: Any, y: Any, seed: int, round: int) -> Any:
        self._round_points(spec.round(self._n, len(x), seed, round), x, y, 0, self._n)
        return self._k.compressed_mean_diff(spec, x, y, seed, round)

    def dasha_pp_values(self, r: Any, x: Any, y: Any, start: int, stop: int, *, rows: Any, row0: int = 0, **kw: Any) -> Any:
        mine = [row0 + int(k) for k in np.asarray(rows).tolist() if start <= row0 + int(k) < stop]
        self._log.add(mine, x, "whole")
        self._log.add(mine, y, "whole")
        return self._k.dasha_pp_values(r, x, y, start, stop, rows=rows, row0=row0, **kw)

    def error_feedback(self, spec: Any, x: Any, G: Any, seed: int, round: int, start: int = 0) -> Any:
        self._log.add(range(start, start + len(G)), x, "whole")
        return self._k.error_feedback(spec, x, G, seed, round, start)


class CountingProblem:
    """``problem`` with every gradient-oracle call logged in ``log`` (see the module docstring);
    everything else (constants, ``x0``, ``loss``) passed through. It has exactly the oracles the
    problem has, so the transports choose the same paths."""

    def __init__(self, problem: Any, log: Log | None = None) -> None:
        self._p = problem
        self.log = Log() if log is None else log
        n = problem.n
        self.n, self.d = problem.n, problem.d
        ws = getattr(problem, "workers", None)
        self._held = range(n) if ws is None else range(ws.start, ws.stop)
        kernel = getattr(problem, "kernel", None)
        if kernel is not None:
            self.kernel = CountingKernel(kernel, self.log, n)
        for name in COUNTED_PROBLEM:
            if hasattr(problem, name):
                setattr(self, name, getattr(self, "_" + name))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in COUNTED_PROBLEM or name == "kernel":
            raise AttributeError(name)
        return getattr(self._p, name)

    def _grad(self, x: Any) -> Any:
        self.log.add(range(self.n), x, "whole")  # the global gradient: every worker's, averaged
        return self._p.grad(x)

    def _local_grads(self, x: Any, **kw: Any) -> Any:
        w = kw.get("workers")
        self.log.add(self._held if w is None else w, x, "whole")
        return self._p.local_grads(x, **kw)

    def _local_grad(self, i: int, x: Any) -> Any:
        self.log.add(i, x, "whole")
        return self._p.local_grad(i, x)

    def _local_grad_coords(self, x: Any, rows: Any, cols: Any) -> Any:
        for w, c in Counter(np.asarray(rows).tolist()).items():
            self.log.add(w, x, "coords", c)
        return self._p.local_grad_coords(x, rows, cols)

    def _local_grad_blocks(self, x: Any) -> Iterator[Any]:
        for lo, hi, G in self._p.local_grad_blocks(x):
            self.log.add(range(self._held.start + lo, self._held.start + hi), x, "whole")
            yield lo, hi, G

    def _local_message_blocks(self, x: Any, *args: Any, **kw: Any) -> Iterator[Any]:
        for lo, hi, m in self._p.local_message_blocks(x, *args, **kw):
            self.log.add(range(self._held.start + lo, self._held.start + hi), x, "whole")
            yield lo, hi, m

    def _local_grad_sum(self, x: Any) -> Any:
        self.log.add(self._held, x, "whole")
        return self._p.local_grad_sum(x)

    def _minibatch_grads(self, x: Any, b: int, **kw: Any) -> Any:
        self.log.add(kw["workers"], x, "minibatch", b)
        return self._p.minibatch_grads(x, b, **kw)

    def _minibatch_grads_pair(self, x: Any, y: Any, b: int, **kw: Any) -> Any:
        self.log.add(kw["workers"], x, "minibatch", b)
        self.log.add(kw["workers"], y, "minibatch", b)
        return self._p.minibatch_grads_pair(x, y, b, **kw)


def counted_rounds(method: Any, problem: CountingProblem, compressor: Any, backend: Any, *, rounds: int, seed: int,
                   gamma: float, **options: Any) -> tuple[Any, list[dict[str, Any]]]:
    """Run ``rounds`` rounds of ``method`` on ``backend`` (whose problem is, or wraps, the
    counting ``problem``) one update at a time; per round: ``evals`` (worker → Counter of
    ``(tag, mode)``, ``tag`` ``"new"``/``"old"``/a key), ``sizes`` (worker → Counter of
    ``(tag, mode)`` → coordinates or samples), ``info`` and the round's ``t``. Returns
    ``(params, rounds)``."""
    from permk.methods.driver import prepare, start

    method, options = method.resolve(options)
    prep = prepare(method, problem, compressor, n=backend.n, d=backend.d, rounds=rounds, seed=seed, gamma=gamma, **options)
    params = replace(prep.with_step(problem), path=method.path(backend, prep.sent, prep.own))
    state = start(method, backend, prep.sent, params, np.array(problem.x0, dtype=np.float64), seed)
    problem.log.take()  # the start's evaluations are not counted
    out = []
    for _ in range(rounds):
        old = state
        state, info = method.update(state, backend, prep.sent, params)
        tags = {key(old.x): "old", key(state.x): "new"}
        evals: dict[int, Counter[tuple[str, str]]] = defaultdict(Counter)
        sizes: dict[int, Counter[tuple[str, str]]] = defaultdict(Counter)
        for w, k, mode, size in problem.log.take():
            tag = tags.get(k, k)
            evals[w][(tag, mode)] += 1
            sizes[w][(tag, mode)] += size
        out.append({"t": old.round, "evals": dict(evals), "sizes": dict(sizes), "info": info})
    return params, out


def algorithm(name: str, options: dict[str, Any], *, t: int, coin: bool | None, n: int, seed: int,
              prev_coin: bool | None = None) -> tuple[dict[int, dict[str, str]], dict[int, set[str]], float, bool]:
    """Method ``name``'s round ``t`` as the algorithm states it: per worker, the points its
    update reads (``"new"``: ``x^{t+1}``, ``"old"``: ``x^t``) with the mode each is needed in
    (``"whole"``, ``"minibatch"``, or ``"message"``: the sent coordinates, whole gradients on the
    dense path), and those it kept from an earlier round; and the round's count of oracle calls
    (units of one full local gradient, or samples when the last item is True)."""
    s = options.get("participation")
    everyone = set(range(n))
    who = everyone if s is None else set(participants(n, s, seed=seed, round=t).tolist())
    # under partial participation a participant computes both points (the authors' nodes); one
    # that evaluated ∇f_i(x^t) in the round before (a participant then, a full round, the start)
    # may find it kept by its transport
    before = everyone if s is None or t == 0 or prev_coin else set(participants(n, s, seed=seed, round=t - 1).tolist())
    b = options.get("batch_size")

    def each(points: dict[str, str], kept: set[str] = set(), workers: set[int] = everyone) -> tuple[dict[int, dict[str, str]], dict[int, set[str]]]:
        return ({i: dict(points) if i in workers else {} for i in range(n)}, {i: set(kept) if i in workers else set() for i in range(n)})

    W, M, B = "whole", "message", "minibatch"
    if name == "gd":
        return (*each({"new": W}), 1.0, False)
    if name == "marina":
        if coin:
            return (*each({"new": W}), 1.0, False)
        if s is not None and s < n:  # a participant kept nothing from the rounds it sat out
            return each({"new": M, "old": M}, workers=who)[0], {i: {"old"} if i in who & before else set() for i in range(n)}, 2.0, False
        return (*each({"new": M, "old": M}, {"old"}), 1.0, False)
    if name == "ef21":  # TopK selects from the whole residual
        return (*each({"new": W}), 1.0, False)
    if name == "diana":
        return (*each({"new": M}), 1.0, False)
    if name == "dcgd":
        return (*each({"old": M}), 1.0, False)
    if name == "dcgd_shifted":  # round 0 reads ∇f_i(x⁰), which the start computed for the shifts
        return (*each({"old": M}, {"old"} if t == 0 else set()), 1.0, False)
    if name == "rand_diana":
        # the refresh takes the whole ∇f_i(x^t), kept from the round before; the message is at x^{t+1}
        return (*each({"new": M, "old": W}, {"old"}), 1.0, False) if coin else (*each({"new": M}), 1.0, False)
    if name == "dasha":
        if s is not None and s < n:
            return each({"new": W, "old": W}, workers=who)[0], {i: {"old"} if i in who & before else set() for i in range(n)}, 2.0, False
        if s is not None:  # DASHA-PP with s = n: every h_i is updated whole, ∇f_i(x^t) kept
            return (*each({"new": W, "old": W}, {"old"}), 1.0, False)
        return (*each({"new": M, "old": M}, {"old"}), 1.0, False)
    if name == "vr_marina":
        return (*each({"new": W}), 1.0, False) if coin else (*each({"new": B, "old": B}), 2.0 * b, True)
    if name == "marina_stochastic":
        return (*each({"new": B}), float(options["megabatch_size"]), True) if coin else (*each({"new": B, "old": B}), 2.0 * b, True)
    if name == "dasha_page":
        return (*each({"new": W}), 1.0, False) if coin else (*each({"new": B, "old": B}), 2.0 * b, True)
    if name == "dasha_mvr":
        return (*each({"new": B, "old": B}), 2.0 * b, True)
    if name == "sgd":
        return (*each({"old": B}), float(b), True)
    raise KeyError(name)


def check_round(name: str, options: dict[str, Any], path: str, rnd: dict[str, Any], *, n: int, seed: int, held: range,
                oracle_full: float, message_sizes: Callable[[int], np.ndarray] | None = None,
                prev: dict[str, Any] | None = None) -> None:
    """Round ``rnd`` of :func:`counted_rounds` (after ``prev``, the round before) against
    :func:`algorithm`, for the ``held`` workers: (a) every evaluation is at a point the worker's update reads; (b) every point it
    reads and did not keep is evaluated; (c) no worker evaluates a point twice in the round
    (whole or at coordinates: one call each); (d) the mode: whole gradients where the algorithm
    needs them, minibatches of the method's size, on the coordinate paths the sent coordinates
    only (as many as the worker sends: ``message_sizes(t)``); (e) the reported count is the
    algorithm's."""
    info = rnd["info"]
    reads, kept, count, samples = algorithm(name, options, t=rnd["t"], coin=info.coin, n=n, seed=seed,
                                            prev_coin=None if prev is None else prev["info"].coin)
    where = f"{name} {options} path={path} round {rnd['t']}"
    reported = oracle_full if info.oracle_calls is None else float(info.oracle_calls)
    want = count if samples else count * oracle_full
    assert reported == want, f"{where}: reported {reported} oracle calls, the algorithm's {want}"
    sizes = None if message_sizes is None else message_sizes(rnd["t"])
    for w in held:
        if sizes is not None and sizes[w] == 0:  # a worker that sends nothing reads no gradient for its message
            reads[w] = {tag: m for tag, m in reads[w].items() if m != "message"}
        got = rnd["evals"].get(w, Counter())
        points = {tag for tag, _ in got}
        assert points <= set(reads[w]), f"{where}: worker {w} evaluated {sorted(points - set(reads[w]))} (it reads {sorted(reads[w])})"
        missing = set(reads[w]) - kept[w] - points
        assert not missing, f"{where}: worker {w} did not evaluate {sorted(missing)}"
        twice = [k for k, c in got.items() if c > 1] + [p for p in points if sum(1 for tag, _ in got if tag == p) > 1]
        assert not twice, f"{where}: worker {w} evaluated {twice} more than once: {dict(got)}"
        for (tag, m), size in rnd["sizes"].get(w, {}).items():
            need = reads[w][tag]
            if need == "whole" or (need == "message" and path == "dense"):
                assert m == "whole", f"{where}: worker {w} evaluated {tag} as {m}, the algorithm needs it whole: {dict(got)}"
            elif need == "minibatch":
                assert m == "minibatch" and size == count / len(reads[w]), f"{where}: worker {w} {tag}: {m} of {size} samples"
            else:
                assert m == "coords", f"{where}: worker {w} evaluated whole gradients on the {path} path: {dict(got)}"
                if sizes is not None:
                    assert size == sizes[w], f"{where}: worker {w} evaluated {size} coordinates at {tag}, sends {sizes[w]}"
