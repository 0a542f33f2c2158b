"""What the shared code knows of a method comes from the method's and the compressor's declared
attributes: a state's ``arrays`` (divergence, resume, save/load, MPI digests), a method's
``label``, ``takes_compressor`` and ``theory`` (its ``table_rows``), its experiments' protocol
(``starts``, ``collapses_identical_workers``, ``rounds_factor``: :mod:`permk.experiments.protocols`),
and a compressor's capabilities. A method defined here, outside the package, gets all of it with
no change to the package."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest

import permk
import permk.exchanges as ex
from permk.transport import Simulator
from permk.compressors import Capabilities
from permk.methods import catalog as method_catalog

sys.path.insert(0, str(Path(__file__).resolve().parent / "mpi"))
from mpi_cases import METHODS, LocalMomentum, MomentumState, example_compressor, example_options, example_problem, local_momentum, run_options  # noqa: E402


def _quadratic(n: int = 4, d: int = 10) -> permk.SyntheticQuadratic:
    return permk.Quadratic.synthetic(n=n, d=d, lam=1e-3, noise_scale=0.3, seed=1)


# ---------------------------------------------------------------------------------------------
# a state lists its arrays
# ---------------------------------------------------------------------------------------------
def test_the_package_states_list_their_arrays() -> None:
    assert permk.MarinaState.arrays == {"x": "shared", "g": "shared"}
    assert permk.EF21State.arrays == {"x": "shared", "g": "shared", "G": "per_worker"}
    assert permk.DCGDState.arrays == {"x": "shared"}
    assert permk.EF21State.shared_arrays() == ("x", "g") and permk.EF21State.per_worker_arrays() == ("G",)
    for method in method_catalog().values():
        names = set(method.state_type.field_names())
        assert set(method.state_type.arrays) <= names and method.state_type.arrays["x"] == "shared"


def test_a_state_declaring_an_unknown_field_or_kind_is_refused() -> None:
    with pytest.raises(TypeError, match="'y', which is not a field"):
        @dataclass(frozen=True, eq=False)
        class Bad(permk.State):
            x: np.ndarray
            round: int = 0
            seed: int = 0
            bits: float = 0.0
            arrays: ClassVar[dict[str, str]] = {"x": "shared", "y": "shared"}
    with pytest.raises(TypeError, match="must be one of"):
        @dataclass(frozen=True, eq=False)
        class Worse(permk.State):
            x: np.ndarray
            round: int = 0
            seed: int = 0
            bits: float = 0.0
            arrays: ClassVar[dict[str, str]] = {"x": "per_process"}


def test_a_user_method_with_a_per_worker_state_runs_resumes_and_saves(tmp_path: Path) -> None:
    q = _quadratic()
    full = local_momentum(q, permk.Identity(), rounds=30, seed=2, gamma=0.2)
    assert isinstance(full.state, MomentumState) and full.state.M.shape == (4, 10)
    assert full.grad_norm_sq[-1] < 1e-2 * full.grad_norm_sq[0] and full.diverged_at is None
    first = local_momentum(q, permk.Identity(), rounds=11, seed=2, gamma=0.2)
    permk.save_state(first.state, tmp_path / "s")
    state = permk.load_state(tmp_path / "s.npz")
    assert type(state) is MomentumState and state == first.state
    rest = local_momentum(q, permk.Identity(), rounds=19, seed=2, gamma=0.2, state=state)
    assert np.array_equal(rest.x, full.x) and np.array_equal(rest.state.M, full.state.M)
    assert state == first.state  # the run copied the resumed arrays: the caller's are untouched
    # resume checks, from the declaration: shared (d,), per-worker n rows of length d
    for bad, match in [(dict(m=np.zeros(9)), r"state.m must have shape \(10,\)"),
                       (dict(M=np.zeros((3, 10))), r"state.M must hold all 4 rows"),
                       (dict(M=np.zeros((4, 9))), r"state.M must hold all 4 rows .* got shape \(4, 9\)")]:
        wrong = MomentumState(**{**{k: getattr(state, k) for k in state.field_names()}, **bad})
        with pytest.raises(ValueError, match=match):
            local_momentum(q, permk.Identity(), rounds=1, seed=2, gamma=0.2, state=wrong)


def test_held_by_cuts_per_worker_arrays_to_the_held_rows() -> None:
    s = local_momentum(_quadratic(), permk.Identity(), rounds=3, seed=0, gamma=0.1).state
    held = s.held_by(SimpleNamespace(n=4, d=10, workers=range(1, 3)))  # type: ignore[arg-type]
    assert np.array_equal(held.M, s.M[1:3]) and np.array_equal(held.m, s.m) and held.M is not s.M
    again = held.held_by(SimpleNamespace(n=4, d=10, workers=range(1, 3)))  # type: ignore[arg-type]
    assert np.array_equal(again.M, held.M)


def test_load_state_checks_the_declared_shapes(tmp_path: Path) -> None:
    s = local_momentum(_quadratic(), permk.Identity(), rounds=2, seed=0, gamma=0.1).state
    fields = {k: getattr(s, k) for k in s.field_names()}
    for bad, match in [(dict(m=np.zeros(3)), "shared array 'm' must have shape"),
                       (dict(M=np.zeros(10)), "per_worker array 'M' must have shape"),
                       (dict(M=np.zeros((4, 3))), "per_worker array 'M' must have shape")]:
        np.savez(tmp_path / "bad.npz", __kind__="MomentumState", **{**fields, **bad})
        with pytest.raises(ValueError, match=match):
            permk.load_state(tmp_path / "bad.npz")


@dataclass(frozen=True, eq=False)
class ShiftState(permk.State):
    """A state whose second shared array is neither ``g`` nor the iterate."""

    x: np.ndarray
    v: np.ndarray
    round: int = 0
    seed: int = 0
    bits: float = 0.0

    arrays: ClassVar[dict[str, str]] = {"x": "shared", "v": "shared"}


class BlowsUp(LocalMomentum):
    """Gradient steps whose aggregate ``v`` becomes infinite at round 3 while ``x`` stays finite."""

    name = "blows_up"
    state_type = ShiftState

    def init(self, x0: np.ndarray, backend: Any, compressor: Any, params: dict[str, Any], *, seed: int) -> ShiftState:
        return ShiftState(x=x0, v=ex.mean_grad(backend, x0), seed=seed)

    def update(self, state: Any, backend: Any, compressor: Any, params: dict[str, Any]) -> tuple[ShiftState, permk.RoundInfo]:
        v = ex.mean_grad(backend, state.x)
        x = state.x - 1e-3 * v
        if state.round == 2:
            x, v = state.x, np.full_like(v, np.inf)
        return ShiftState(x=x, v=v, round=state.round + 1, seed=state.seed), permk.RoundInfo(0.0)


def test_the_driver_stops_on_any_non_finite_shared_array() -> None:
    res = BlowsUp()(_quadratic(), permk.Identity(), rounds=10, seed=0, gamma=0.1)
    assert res.diverged_at == 3 and np.isfinite(res.x).all()
    s = res.state
    assert not s.finite() and ShiftState(x=s.x, v=np.zeros(10)).finite()


def test_mpi_digests_cover_every_shared_array_and_no_per_worker_one() -> None:
    from permk.distributed.launch import shared_digest

    s = local_momentum(_quadratic(), permk.Identity(), rounds=2, seed=0, gamma=0.1).state
    fields = {k: getattr(s, k) for k in s.field_names()}
    assert shared_digest(s) == shared_digest(MomentumState(**{**fields, "M": s.M[:2] + 1.0}))
    assert shared_digest(s) != shared_digest(MomentumState(**{**fields, "m": s.m + 1e-16 * np.abs(s.m).max()}))
    assert shared_digest(s) != shared_digest(MomentumState(**{**fields, "round": 3}))


# ---------------------------------------------------------------------------------------------
# the method's and the compressor's attributes, not their names
# ---------------------------------------------------------------------------------------------
def test_gd_takes_a_lossless_compressor_by_its_capability() -> None:
    q = _quadratic()
    with pytest.raises(ValueError, match="must be None or Identity"):
        permk.gd(q, permk.PermK(), rounds=2, seed=0)

    class Whole(permk.Compressor):
        """A user's identity, not derived from permk.Identity: lossless by its capabilities."""

        capabilities = Capabilities(fixed_size=True, deterministic=True, lossless=True)

        def floats_per_worker(self, n: int, d: int) -> int:
            return d

        def ab_constants(self, n: int, d: int) -> tuple[float, float]:
            return (0.0, 0.0)

        def compress(self, x: Any, *, worker: int, n_workers: int, seed: int, round: int) -> permk.Message:
            return permk.Message(worker, n_workers, x.size, np.arange(x.size), np.array(x, dtype=np.float64))

    assert np.array_equal(permk.gd(q, Whole(), rounds=5, seed=0).x, permk.gd(q, rounds=5, seed=0).x)


def test_spec_label_rounds_options_and_pruning_come_from_the_method() -> None:
    from permk.experiments.protocols import SearchOptions
    from permk.experiments.specs import Spec

    assert Spec.parse("marina-permk").label == "MARINA + PermK" and Spec.parse("ef21-topk").label == "EF21 + TopK"
    mine = Spec(key="local_momentum-identity", method=local_momentum, compressor_class=permk.Identity)
    assert mine.label == "Local momentum + Identity"
    authors = SearchOptions(horizon="rounds", max_rounds=100, ef21_init="compressed")
    assert authors.rounds_for(Spec.parse("ef21-topk")) == 200 and authors.rounds_for(Spec.parse("marina-permk")) == 100
    assert authors.rounds_for(mine) == 100 and SearchOptions(max_rounds=100).rounds_for(Spec.parse("ef21-topk")) == 100
    assert authors.method_options(Spec.parse("ef21-topk")) == {"init": "compressed"}
    assert authors.method_options(Spec.parse("marina-permk")) == {} and authors.method_options(mine) == {}
    # pruning by default: the methods whose state keeps per-worker arrays
    default = SearchOptions()
    assert default.prunes(Spec.parse("ef21-topk")) and default.prunes(mine)
    assert not default.prunes(Spec.parse("marina-permk")) and not default.prunes(Spec.parse("dcgd-randk"))
    assert SearchOptions(prune=("marina-permk",)).prunes(Spec.parse("marina-permk")) and not SearchOptions(prune=()).prunes(mine)
    # collapsing identical workers: a method that says so, with a deterministic compressor
    assert Spec.parse("ef21-topk").identical_workers_collapse(permk.TopK(2))
    assert not Spec.parse("ef21-randk").identical_workers_collapse(permk.RandK(2))
    assert not Spec.parse("marina-identity").identical_workers_collapse(permk.Identity())


def test_available_specs_skip_the_methods_that_take_no_compressor() -> None:
    from permk.experiments.specs import available_specs

    specs = available_specs()
    assert {"marina-permk", "ef21-topk", "marina-randk"} <= set(specs)
    for name, method in method_catalog().items():
        if not method.takes_compressor:
            assert not any(s.startswith(f"{name}-") for s in specs), name


def test_complexity_rows_come_from_the_methods_table_rows() -> None:
    from permk.cli import complexity_rows
    from permk.theory import table_complexity
    from permk.theory.complexity import MARINA_PERMK

    rows = complexity_rows(100, 1000, 1.0, 1.1, 0.05, 1e-3, 1.0)
    expect = [(m.name, c.__name__) for m in method_catalog().values() if m.theory is not None for c in m.theory.table_rows]
    expect += [(m.name, "Identity") for m in method_catalog().values() if not m.takes_compressor and not m.needs_finite_sum]
    assert [(r.method, r.compressor.split("(")[0]) for r in rows] == expect
    assert expect[:3] == [("marina", "PermK"), ("marina", "RandK"), ("ef21", "TopK")] and ("gd", "Identity") in expect
    assert all(r.table is not None for r in rows[:3])

    class MineTheory(type(permk.marina.theory)):  # type: ignore[misc]
        table_rows = {permk.PermK: MARINA_PERMK}

    class Mine(LocalMomentum):
        theory = MineTheory()

    kw = dict(n=10, d=1000, L_minus=1.0, L_plus=1.0, L_pm=0.0, eps=1e-3, delta0=1.0)
    assert table_complexity(Mine(), permk.PermK(), **kw) == table_complexity(permk.marina, permk.PermK(), **kw)  # type: ignore[arg-type]
    assert table_complexity(local_momentum, permk.PermK(), **kw) is None  # type: ignore[arg-type]  # no theory
    assert table_complexity(permk.gd, permk.Identity(), **kw) is None  # type: ignore[arg-type]


def test_every_catalog_method_has_a_test_example_and_an_mpi_case_entry() -> None:
    assert METHODS == method_catalog()
    for method in method_catalog().values():
        c = example_compressor(method, 6, 12)
        q = example_problem(method, 6, 12)
        method.parameters(c, 6, 12, **example_options(method, q))  # the method accepts it
        assert c.capabilities.lossless == (not method.takes_compressor)
        res = permk.run(method, q, c, rounds=3, seed=1, gamma=0.05, **run_options(method))
        assert res.state.round == 3


def test_a_state_of_the_simulator_runs_on_a_backend_of_fewer_rows() -> None:
    q = _quadratic()
    s = permk.ef21(q, permk.TopK(2), rounds=4, seed=0).state
    cut = s.held_by(Simulator(q))
    assert np.array_equal(cut.G, s.G) and cut.G is not s.G


# ---------------------------------------------------------------------------------------------
# the permk.distributed shorthands
# ---------------------------------------------------------------------------------------------
def test_every_catalog_method_has_its_distributed_shorthand() -> None:
    import inspect

    import permk.distributed as pd

    for name, method in method_catalog().items():
        fn = getattr(pd, name)
        assert name in pd.__all__ and name in dir(pd) and fn.__name__ == name
        assert fn.__doc__.startswith(f"{method.label} on MPI") and f"``permk.{name}``" in fn.__doc__
        params = list(inspect.signature(fn).parameters)
        assert params[:2] == (["problem", "compressor"] if method.takes_compressor else ["problem", "rounds"])
    assert "compressor" not in inspect.signature(pd.gd).parameters
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        pd.nope  # noqa: B018


def test_a_method_added_to_the_catalog_gets_a_shorthand(monkeypatch: pytest.MonkeyPatch) -> None:
    import permk.distributed as pd
    import permk.distributed.driver

    calls: list[tuple[Any, ...]] = []
    permk.register(local_momentum)
    monkeypatch.setattr(permk.distributed.driver, "run", lambda *a, **kw: calls.append((*a, kw)))
    try:
        q = _quadratic()
        pd.local_momentum(q, rounds=3, seed=1, gamma=0.1)  # takes no compressor: runs with the identity
        pd.ef21(q, permk.TopK(2), rounds=2, seed=0)
        (m1, p1, c1, kw1), (m2, p2, c2, kw2) = calls
        assert m1 is local_momentum and p1 is q and isinstance(c1, permk.Identity) and kw1 == dict(rounds=3, seed=1, gamma=0.1)
        assert m2 is permk.ef21 and isinstance(c2, permk.TopK) and kw2 == dict(rounds=2, seed=0)
    finally:
        permk.registry.unregister(local_momentum)
        vars(pd).pop("local_momentum", None)
