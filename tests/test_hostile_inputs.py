"""Regression tests of issue 33: hostile and edge inputs to the minibatch methods, the
classification problems and their data, the LibSVM reader, the MPI launch check, the registry's
plugins, partial participation and ``estimate_ab``'s bias test (one section per cause)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import permk


def _sigmoid(n: int = 4, m: int = 12, features: int = 5, seed: int = 0, **kw: Any) -> permk.NonconvexSigmoid:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n * m, features))
    y = np.tile([-1.0, 1.0], n * m // 2)
    return permk.NonconvexSigmoid(X, y, n=n, seed=0, **kw)


# -- cause 2: the minibatch oracles' answers are checked, naming the oracle ---------------------
def _none_entries(g: np.ndarray) -> np.ndarray:
    out = g.astype(object)
    out[0, 0] = None
    return out


#: what a broken oracle returns instead of its rows ``g``, the error, and the message's tail
_BAD_ROWS: dict[str, tuple[Callable[[np.ndarray], Any], type[Exception], str]] = {
    "complex": (lambda g: g + 1j, TypeError, r"must hold real numbers, got dtype complex128"),
    "None entries": (_none_entries, TypeError, r"must hold real numbers, got dtype object"),
    "a string": (lambda g: "gradients", TypeError, r"must hold real numbers, got dtype <U9"),
    "wrong shape": (lambda g: g[:, :-1], ValueError, r"must hold the 4 held workers' rows of length 6, got shape \(4, 5\)"),
}


class _BadMinibatch(permk.NonconvexSigmoid):
    """A finite-sum problem whose minibatch oracles answer ``bad(rows)`` (or ``bad_pair(pair)``)."""

    bad: Callable[[np.ndarray], Any] = staticmethod(lambda g: g)
    bad_pair: Callable[[tuple[np.ndarray, np.ndarray]], Any] | None = None

    def minibatch_grads(self, x: Any, batch_size: int, **kw: Any) -> Any:
        return self.bad(super().minibatch_grads(x, batch_size, **kw))

    def minibatch_grads_pair(self, x: Any, y: Any, batch_size: int, **kw: Any) -> Any:
        gx, gy = super().minibatch_grads_pair(x, y, batch_size, **kw)
        return self.bad_pair((gx, gy)) if self.bad_pair is not None else (self.bad(gx), gy)


def _bad_problem(**attrs: Any) -> _BadMinibatch:
    rng = np.random.default_rng(0)
    p = _BadMinibatch(rng.standard_normal((48, 5)), np.tile([-1.0, 1.0], 24), n=4, seed=0)
    for k, v in attrs.items():
        setattr(p, k, v)
    return p


_PAIR_METHODS = {
    "vr_marina": lambda p: permk.vr_marina(p, permk.PermK(), rounds=20, seed=1, batch_size=2, p=0.1),
    "dasha_page": lambda p: permk.dasha_page(p, permk.PermK(), rounds=20, seed=1, batch_size=2, p=0.1),
}


@pytest.mark.parametrize("case", sorted(_BAD_ROWS))
@pytest.mark.parametrize("method", sorted(_PAIR_METHODS))
def test_a_bad_minibatch_pair_answer_is_refused_naming_the_oracle(method: str, case: str) -> None:
    bad, exc, tail = _BAD_ROWS[case]
    with pytest.raises(exc, match=r"^problem\.minibatch_grads_pair\(x, y, \.\.\.\)\[0\] " + tail):
        _PAIR_METHODS[method](_bad_problem(bad=staticmethod(bad)))


@pytest.mark.parametrize("method", sorted(_PAIR_METHODS))
@pytest.mark.parametrize(("pair", "message"), [
    (lambda gg: gg[0], r"must return a pair \(gradients at x, gradients at y\), got ndarray$"),
    (lambda gg: (*gg, gg[0]), r"must return a pair \(gradients at x, gradients at y\), got tuple of 3$"),
    (lambda gg: [gg[0]], r"must return a pair \(gradients at x, gradients at y\), got list of 1$"),
    (lambda gg: None, r"must return a pair \(gradients at x, gradients at y\), got NoneType$"),
], ids=["an array", "a triple", "a singleton", "None"])
def test_a_minibatch_pair_answer_that_is_no_pair_is_refused(method: str, pair: Any, message: str) -> None:
    with pytest.raises(TypeError, match=r"^problem\.minibatch_grads_pair\(x, y, \.\.\.\) " + message):
        _PAIR_METHODS[method](_bad_problem(bad_pair=pair))


@pytest.mark.parametrize("case", sorted(_BAD_ROWS) + ["a pair"])
def test_a_bad_minibatch_answer_is_refused_naming_the_oracle(case: str) -> None:
    bad, exc, tail = _BAD_ROWS[case] if case != "a pair" else (
        lambda g: (g, g), ValueError, r"must hold the 4 held workers' rows of length 6, got shape \(2, 4, 6\)")
    p = _bad_problem(bad=staticmethod(bad))
    with pytest.raises(exc, match=r"^problem\.minibatch_grads\(x, \.\.\.\) " + tail):
        permk.sgd(p, rounds=5, seed=1, batch_size=2)
    with pytest.raises(exc, match=r"^problem\.minibatch_grads\(x, \.\.\.\) " + tail):  # its heads rounds
        permk.marina_stochastic(p, permk.PermK(), rounds=20, seed=1, batch_size=2, megabatch_size=4, p=0.9)


def test_a_well_formed_minibatch_problem_runs_as_the_plain_one() -> None:
    p = _bad_problem()
    plain = permk.NonconvexSigmoid(np.random.default_rng(0).standard_normal((48, 5)), np.tile([-1.0, 1.0], 24), n=4, seed=0)
    for run in (*_PAIR_METHODS.values(), lambda q: permk.sgd(q, rounds=20, seed=1, batch_size=2)):
        assert np.array_equal(run(p).x, run(plain).x)
