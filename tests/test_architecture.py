"""The structure of the package: the import graph has no cycle (counting imports inside
functions), no module imports another's underscore names, ``import permk`` stays light, every
method is one definition with the same ``update`` shape, and every caller finds compressors
and methods through the package (no tables to edit)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import permk
from permk.methods import catalog as method_catalog

sys.path.insert(0, str(Path(__file__).resolve().parent / "mpi"))
from mpi_cases import example_compressor, example_problem, run_options  # noqa: E402

PKG = Path(permk.__file__).resolve().parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of every import in the file, at any depth (functions included)."""
    mod = _module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [a.name for a in node.names]
            if target.startswith("permk") and not node.module and node.level:
                # "from . import theory": the names are modules
                out += [(f"{target}.{n}", []) for n in names]
            else:
                out.append((target, names))
    return out


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        for target, _ in _imports(path):
            # permk's Python modules only (permk._core is the compiled core, below everything)
            if target in files and target != mod:
                graph[mod].add(target)
    return graph


def test_the_import_graph_has_no_cycle() -> None:
    graph = _graph()
    assert "permk.methods" in graph and "permk.theory.steps" in graph
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                pytest.fail("import cycle: " + " -> ".join(stack[stack.index(t):] + [t]))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_layers() -> None:
    """theory sits below the methods; the compressors and problems below both."""
    graph = _graph()

    def reaches(a: str, b: str) -> bool:
        seen, todo = set(), [a]
        while todo:
            m = todo.pop()
            if m == b:
                return True
            if m not in seen:
                seen.add(m)
                todo += graph.get(m, ())
        return False

    for low in ("permk.theory.steps", "permk.theory.smoothness", "permk.theory.complexity", "permk.compressors", "permk.problems"):
        assert not reaches(low, "permk.methods"), low
    assert not reaches("permk.methods", "permk.distributed")
    assert not reaches("permk.methods", "permk.experiments.search")
    assert reaches("permk.methods", "permk.theory.steps")


def test_the_problems_sit_below_the_methods_transports_and_experiments() -> None:
    """Nothing under ``permk.problems`` imports (even through another module) the methods, the
    MPI transport or the experiments: the experiments use the problems, never the other way."""
    graph = _graph()
    problems = sorted(m for m in graph if m == "permk.problems" or m.startswith("permk.problems."))
    assert {"permk.problems", "permk.problems.base", "permk.problems.quadratic", "permk.problems.finite_sum",
            "permk.problems.classification", "permk.problems.autoencoder", "permk.problems.datasets"} <= set(problems)
    above = ("permk.experiments", "permk.methods", "permk.distributed")
    bad = []
    for start in problems:
        seen, todo = set(), [start]
        while todo:
            m = todo.pop()
            if m in seen:
                continue
            seen.add(m)
            if any(m == a or m.startswith(a + ".") for a in above):
                bad.append(f"{start} reaches {m}")
            todo += graph.get(m, ())
    assert bad == []


def test_no_module_imports_another_modules_underscore_names() -> None:
    bad = []
    for path in PKG.rglob("*.py"):
        mod = _module_name(path)
        for target, names in _imports(path):
            if target.startswith("permk") and target != mod:
                bad += [f"{mod}: from {target} import {n}" for n in names if n.startswith("_") and not (n.startswith("__") and n.endswith("__"))]
    assert bad == []


def test_import_permk_is_light() -> None:
    code = ("import sys, permk; heavy = ['scipy.optimize', 'scipy.sparse.linalg', 'matplotlib', 'mpi4py', 'tqdm', 'torch'];"
            "print([m for m in heavy if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", sorted(method_catalog()))
def test_every_update_returns_a_state_and_its_round(name: str) -> None:
    method = method_catalog()[name]
    q = example_problem(method, 6, 12)
    comp = example_compressor(method, 6, 12)
    res = permk.run(method, q, comp, rounds=3, seed=1, gamma=0.05, **run_options(method))
    assert isinstance(res.state, method.state_type) and res.state.round == 3
    from permk.transport import Simulator
    from permk.methods.driver import setup

    backend = Simulator(q)
    params = setup(method, q, comp, n=6, d=12, rounds=1, seed=1, gamma=0.05, **run_options(method))
    state = method.init(q.x0.copy(), backend, comp, params, seed=1)
    new, info = method.update(state, backend, comp, params)
    assert isinstance(new, permk.State) and isinstance(info, permk.RoundInfo)
    assert new.bits == state.bits + info.bits and new.round == state.round + 1
    assert (info.coin is not None) == method.has_coin
    # the update is pure: the state it was given is unchanged, and equal states compare equal
    assert state == method.init(q.x0.copy(), backend, comp, params, seed=1)
    assert new != state and not (new == state)


def test_states_and_messages_compare_without_raising() -> None:
    a = permk.MarinaState(x=np.ones(3), g=np.zeros(3), round=2, seed=1)
    b = permk.MarinaState(x=np.ones(3), g=np.zeros(3), round=2, seed=1)
    assert a == b and not (a != b)
    assert a != permk.MarinaState(x=np.ones(3), g=np.ones(3), round=2, seed=1)
    assert a != permk.EF21State(x=np.ones(3), g=np.zeros(3), G=np.zeros((1, 3)), round=2, seed=1)
    m = permk.PermK().compress(np.arange(4.0), worker=0, n_workers=2, seed=0, round=0)
    assert m == permk.PermK().compress(np.arange(4.0), worker=0, n_workers=2, seed=0, round=0)
    assert m != permk.PermK().compress(np.arange(4.0), worker=1, n_workers=2, seed=0, round=0)


def test_conventions() -> None:
    """(n, d) order everywhere; seed required by every driver; keyword-only complexity constants."""
    import inspect

    for c in (permk.PermK(), permk.RandK(2), permk.BlockPermK(2)):
        assert list(inspect.signature(c.omega).parameters)[:2] == ["n", "d"]
        assert list(inspect.signature(c.ab_constants).parameters)[:2] == ["n", "d"]
    q = permk.Quadratic.synthetic(4, 8, 1e-2, 0.1)
    for call in (lambda: permk.gd(q, rounds=2), lambda: permk.ef21(q, permk.TopK(2), rounds=2),
                 lambda: permk.marina(q, permk.PermK(), rounds=2), lambda: permk.dcgd(q, permk.PermK(), rounds=2, gamma=0.1)):
        with pytest.raises(TypeError, match="seed"):
            call()  # type: ignore[call-arg]
    params = inspect.signature(permk.theory.complexity).parameters
    assert all(params[k].kind is inspect.Parameter.KEYWORD_ONLY for k in ("n", "d", "L_minus", "L_plus", "L_pm", "eps", "delta0", "mu"))


def test_the_problem_kernel_exports_oracles_and_exchanges_not_method_rounds() -> None:
    """The methods are defined once, in Python; the native problem kernel exports the oracles and
    the exchanges' arithmetic (whole MARINA and EF21 rounds live in its Rust tests only)."""
    from permk import _core

    public = {m for m in dir(_core.Tridiagonal) if not m.startswith("_")}
    assert not {m for m in public if m.endswith("_round")}, public
    assert {"loss", "grad", "local_grads", "local_grad_coords", "compressed_mean_diff", "error_feedback", "round_values"} <= public
