"""A public call takes only public options, and a subclass of a package method runs its own code.

* every catalog method refuses an option it does not have (an internal switch such as the old
  ``step=`` among them) with a TypeError naming it, before anything runs, in the simulator and
  through the MPI driver's validation;
* a subclass of every package method class, with an ``update`` of its own, runs that ``update``
  (DASHA's ``estimator`` option resolves to the subclass itself, not to the package's DASHA);
* a method whose ``parameters`` does not return the typed :class:`permk.methods.MethodParams`
  is refused by name.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import permk
from permk.methods import catalog as method_catalog
from permk.methods.driver import prepare

sys.path.insert(0, str(Path(__file__).resolve().parent / "mpi"))
from mpi_cases import example_compressor, example_problem, run_options  # noqa: E402

#: Package method classes (one per catalog entry), and the names a subclass of each gets.
PACKAGE = {name: type(m) for name, m in method_catalog().items() if type(m).__module__.startswith("permk.")}


@pytest.mark.parametrize("name", sorted(PACKAGE))
@pytest.mark.parametrize("option", ["step", "backend", "comm", "nonsense"])
def test_an_unknown_or_internal_option_is_a_type_error_naming_it(name: str, option: str) -> None:
    method = method_catalog()[name]
    q, c = example_problem(method, 6, 12), example_compressor(method, 6, 12)
    with pytest.raises(TypeError, match=rf"does not take these options \({option}\).*unexpected keyword argument '{option}'"):
        permk.run(method, q, c, rounds=2, seed=0, gamma=0.1, **run_options(method), **{option: 0.1})
    with pytest.raises(TypeError, match=option):
        prepare(method, q, c, n=6, d=12, rounds=2, seed=0, gamma=0.1, **run_options(method), **{option: 0.1})


def test_marina_with_a_step_keyword_is_refused_not_run_with_the_theory_step() -> None:
    """``step=0.1`` (the user meant a step size) once ran silently with the theory's step, and
    ``step=0`` ended in ``KeyError: 'gamma'``: both are TypeErrors naming the option now."""
    q = permk.Quadratic.synthetic(n=4, d=8, lam=1e-2, noise_scale=0.1, seed=0)
    for value in (0.1, 0, True, False):
        with pytest.raises(TypeError, match=r"\(step\).*gamma"):
            permk.marina(q, permk.PermK(), rounds=10, seed=1, step=value)


@pytest.mark.parametrize("name", sorted(PACKAGE))
def test_a_subclass_of_every_method_runs_its_own_update(name: str) -> None:
    base = PACKAGE[name]
    calls: list[int] = []

    class Mine(base):  # type: ignore[misc, valid-type]
        def update(self, state: Any, backend: Any, compressor: Any, params: Any) -> Any:
            calls.append(state.round)
            return super().update(state, backend, compressor, params)

    Mine.name = f"mine_{name}"
    mine = Mine()
    method = method_catalog()[name]
    q, c = example_problem(method, 6, 12), example_compressor(method, 6, 12)
    res = permk.run(mine, q, c, rounds=3, seed=1, gamma=0.05, **run_options(method))
    ref = permk.run(method, q, c, rounds=3, seed=1, gamma=0.05, **run_options(method))
    assert calls == [0, 1, 2] and res.method == f"mine_{name}"
    assert np.array_equal(res.x, ref.x)  # the same arithmetic: only the update was wrapped


def test_dasha_gradient_estimator_of_a_subclass_is_the_subclass() -> None:
    class MyDasha(permk.methods.Dasha):
        name = "mydasha"
        seen = 0

        def update(self, state: Any, backend: Any, compressor: Any, params: Any) -> Any:
            MyDasha.seen += 1
            return super().update(state, backend, compressor, params)

    q = permk.Quadratic.synthetic(n=4, d=8, lam=1e-2, noise_scale=0.1, seed=0)
    m = MyDasha()
    assert m.resolve({"estimator": "gradient"})[0] is m and m.resolve({})[0] is m
    m(q, permk.PermK(), rounds=4, seed=0, estimator="gradient")
    assert MyDasha.seen == 4
    assert m.resolve({"estimator": "page"})[0] is permk.dasha_page  # another method: the package's DASHA-PAGE


def test_parameters_must_return_the_typed_params() -> None:
    class Untyped(permk.methods.Marina):
        name = "untyped"

        def parameters(self, compressor: Any, n: int, d: int, *, float_bits: int = 32, problem: Any = None) -> Any:  # type: ignore[override]
            return {"bits": {"compressed": 1.0, "expected": 1.0}}

    q = permk.Quadratic.synthetic(n=4, d=8, lam=1e-2, noise_scale=0.1, seed=0)
    with pytest.raises(TypeError, match=r"Untyped.parameters must return a permk.methods.MethodParams .* got dict"):
        Untyped()(q, permk.PermK(), rounds=2, seed=0, gamma=0.1)
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'bits'"):
        permk.methods.MarinaParams(p=0.5, A=1.0, B=1.0)  # type: ignore[call-arg]
