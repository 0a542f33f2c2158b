"""A compressor or a method defined outside the package: what a compressor must define and what it
gets (``compress`` or ``plan``), and how outside code joins the catalogs (``permk.register``,
the ``permk.plugins`` entry points, ``PERMK_PLUGINS``, ``permk --plugin``) and the generic tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import permk
from permk import registry
from permk.compressors import COMPRESSORS
from permk.methods import METHODS

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def clean_registry() -> Iterator[None]:
    """The registrations a test makes are undone after it."""
    before = {cat: list(cat.registered().values()) for cat in (COMPRESSORS, METHODS)}
    yield
    for cat, held in before.items():
        for obj in cat.registered().values():
            if all(obj is not h for h in held):
                cat.remove(obj)


# -- two minimal compressors: one defines compress, the other plan -----------------------------
@dataclass(frozen=True)
class OneCoordinate(permk.Compressor):
    """Worker i sends one coordinate drawn from (seed, round, i), scaled by d: independent
    RandK with k = 1, defined by ``compress`` alone."""

    def floats_per_worker(self, n: int, d: int) -> int:
        return 1

    def omega(self, n: int, d: int) -> float:
        return d - 1.0

    def ab_constants(self, n: int, d: int) -> tuple[float, float]:
        return ((d - 1.0) / n, 0.0)

    def compress(self, x: Any, *, worker: int, n_workers: int, seed: int, round: int) -> permk.Message:
        x = np.asarray(x, dtype=np.float64)
        j = int(np.random.default_rng([seed, round, worker]).integers(x.size))
        return permk.Message(worker, n_workers, x.size, np.array([j]), np.array([x.size * x[j]]))


@dataclass(frozen=True)
class ShiftedBlocks(permk.Compressor):
    """n contiguous blocks; in round t worker i sends block (i + s_t) mod n scaled by n, with s_t
    drawn from (seed, t): a correlated compressor with PermK's (A, B) = (1, 1), defined by
    ``plan`` alone (n ≤ d)."""

    def check(self, n: int, d: int) -> None:
        super().check(n, d)
        if n > d:
            raise ValueError(f"ShiftedBlocks needs n <= d, got n={n}, d={d}")

    def floats_per_worker(self, n: int, d: int) -> int:
        return -(-d // n)

    def ab_constants(self, n: int, d: int) -> tuple[float, float]:
        return (1.0, 1.0)

    def plan(self, n: int, d: int, *, seed: int, round: int) -> permk.Plan:
        shift = int(np.random.default_rng([seed, round]).integers(n))
        bounds = np.arange(n + 1) * d // n
        blocks = (np.arange(n) + shift) % n
        coords = np.concatenate([np.arange(bounds[b], bounds[b + 1]) for b in blocks])
        offsets = np.concatenate([[0], np.cumsum(np.diff(bounds)[blocks])])
        return permk.Plan(offsets, coords, np.full(n, float(n)))


@pytest.mark.parametrize("cls", [OneCoordinate, ShiftedBlocks])
def test_a_compressor_gets_every_call_from_the_one_it_defines(cls: type[permk.Compressor]) -> None:
    c = cls()
    assert c.capabilities.shared_plan == (cls is ShiftedBlocks)
    rng = np.random.default_rng(0)
    for dtype in (np.float64, np.float32):
        A = rng.standard_normal((5, 13)).astype(dtype)
        msgs = [c.compress(A[i], worker=i, n_workers=5, seed=3, round=7) for i in range(5)]
        dense = np.stack([m.to_dense() for m in msgs])
        np.testing.assert_array_equal(c.compress_all(A, seed=3, round=7), dense)
        np.testing.assert_array_equal(c.aggregate(A, seed=3, round=7), permk.aggregate_messages(msgs))
        rows = c.compress_rows(A[2:4], start=2, n_workers=5, seed=3, round=7)
        np.testing.assert_array_equal(rows.dense(13), dense[2:4])
    if c.capabilities.shared_plan:  # the round of its plan: what the fused paths and MPI use
        r = c.round(5, 13, seed=3, round=7)
        np.testing.assert_array_equal(r.mean(r.gather(A.astype(np.float64), 0, divide=None)), c.aggregate(A.astype(np.float64), seed=3, round=7))


@pytest.mark.parametrize("cls,path", [(OneCoordinate, "dense"), (ShiftedBlocks, "fused")])
def test_a_minimal_compressor_runs_in_marina_and_estimate_ab(cls: type[permk.Compressor], path: str) -> None:
    q = permk.Quadratic.synthetic(n=6, d=24, lam=1e-2, noise_scale=0.2, seed=0)
    res = permk.marina(q, cls(), rounds=400, seed=1)
    assert res.params.path == path and res.diverged_at is None
    assert res.grad_norm_sq[-1] < 1e-3 * res.grad_norm_sq[0]
    est = permk.theory.estimate_ab(cls(), n=4, d=12, trials=1500, seed=3)
    assert est.consistent, est


def test_a_compressor_defining_neither_call_cannot_be_made() -> None:
    class Nothing(permk.Compressor):
        def floats_per_worker(self, n: int, d: int) -> int:
            return 1

    with pytest.raises(TypeError, match="defines compress .* or plan"):
        Nothing()
    with pytest.raises(TypeError, match="neither compress nor plan"):
        permk.register(Nothing)


def test_a_plans_answer_is_checked() -> None:
    class BadPlan(permk.Compressor):
        def floats_per_worker(self, n: int, d: int) -> int:
            return 1

        def plan(self, n: int, d: int, *, seed: int, round: int) -> Any:
            return permk.Plan(np.arange(n + 1), np.full(n, d), np.ones(n))  # coordinate d: outside [0, d)

    with pytest.raises(ValueError, match=r"BadPlan.plan returned coords outside \[0, d\)"):
        BadPlan().aggregate(np.ones((3, 4)), seed=0, round=0)


# -- permk.register -----------------------------------------------------------------------
def test_register_adds_to_the_catalogs(clean_registry: None) -> None:
    from permk.experiments.specs import Spec, available_specs

    assert permk.register(ShiftedBlocks) is ShiftedBlocks
    assert permk.register(ShiftedBlocks) is ShiftedBlocks  # twice: harmless
    assert permk.compressors.catalog()["shiftedblocks"] is ShiftedBlocks
    assert "marina-shiftedblocks" in available_specs(4, 12)
    assert Spec.parse("marina-shiftedblocks").compressor(4, 12) == ShiftedBlocks()

    class Twice(permk.methods.Marina):
        name = "twice"

    twice = Twice()
    permk.register(twice)
    assert permk.methods.catalog()["twice"] is twice and "twice-permk" in available_specs()
    permk.registry.unregister(twice)
    assert "twice" not in permk.methods.catalog()


@pytest.mark.parametrize("obj,error,match", [
    (permk.PermK, ValueError, "compressor name 'permk' is the package's own"),
    (permk.marina, ValueError, "method name 'marina' is the package's own"),
    (permk.PermK(), TypeError, "registered as its class"),
    (permk.methods.Marina, TypeError, "registered as its object"),
    (len, TypeError, "expected a compressor class"),
    (permk.Compressor, TypeError, "cannot be instantiated"),
])
def test_register_refuses(obj: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        permk.register(obj)


def test_register_refuses_a_taken_or_bad_name(clean_registry: None) -> None:
    permk.register(ShiftedBlocks)

    class ShiftedBlocksToo(ShiftedBlocks):
        pass

    with pytest.raises(ValueError, match="already registered"):
        permk.register(ShiftedBlocksToo, name="shiftedblocks")
    with pytest.raises(ValueError, match="no '-'"):
        permk.register(ShiftedBlocksToo, name="shifted-blocks")
    with pytest.raises(ValueError, match="the package's own"):
        permk.register(ShiftedBlocksToo, name="randk")


# -- plugins -------------------------------------------------------------------------------
PLUGIN = textwrap.dedent('''
    import numpy as np
    import permk


    class PlugBlocks(permk.Compressor):
        """Every worker sends k = ⌈d/2⌉ cyclically contiguous coordinates from a start drawn
        from (seed, round, worker), scaled by d/k (a plugin's compressor)."""

        ab_exact = True  # a testing hook: its variance is exactly (d/k − 1)‖a_i‖²

        def floats_per_worker(self, n, d):
            return -(-d // 2)

        def omega(self, n, d):
            return d / self.floats_per_worker(n, d) - 1.0

        def ab_constants(self, n, d):
            return (self.omega(n, d) / n, 0.0)

        def plan(self, n, d, *, seed, round):
            k = self.floats_per_worker(n, d)
            starts = np.random.default_rng([seed, round]).integers(d, size=n)
            coords = (starts[:, None] + np.arange(k)) % d
            return permk.Plan(np.arange(n + 1) * k, coords.ravel(), np.full(n, d / k))
''')



def _python(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    e = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=e, cwd=tmp_path)


def test_plugins_from_an_entry_point_and_from_the_environment(tmp_path: Path) -> None:
    """Entry points of ``permk.plugins`` naming a registrable object or a module that registers
    on import, and a module of ``PERMK_PLUGINS``, are loaded when a catalog is first read."""
    (tmp_path / "plugmod.py").write_text(PLUGIN)
    (tmp_path / "envmod.py").write_text(PLUGIN.replace("PlugBlocks", "EnvBlocks") + "\npermk.register(EnvBlocks)\n")
    dist = tmp_path / "permk_plug-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: permk-plug\nVersion: 1.0\n")
    (tmp_path / "epmod.py").write_text(PLUGIN.replace("PlugBlocks", "EpBlocks") + "\npermk.register(EpBlocks)\n")
    (dist / "entry_points.txt").write_text("[permk.plugins]\nplugblocks = plugmod:PlugBlocks\nepmod = epmod\n")
    code = "import permk; print(sorted(set(permk.compressors.catalog()) & {'plugblocks', 'envblocks', 'epblocks'}))"
    out = _python(code, tmp_path, PERMK_PLUGINS="envmod")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['envblocks', 'epblocks', 'plugblocks']"
    # import permk alone loads no plugin: the catalogs load them when first read
    out = _python("import sys, permk; print('plugmod' in sys.modules, 'envmod' in sys.modules)", tmp_path, PERMK_PLUGINS="envmod")
    assert out.stdout.strip() == "False False", out.stderr
    # nor does import permk.distributed; its star-import offers the plugins' shorthands too
    code = ("import sys, permk.distributed; print('envmod' in sys.modules)\n"
            "from permk.distributed import *; print('envmod' in sys.modules, callable(envdcgd))")
    method = "\n\nclass EnvDCGD(permk.methods.DCGD):\n    name = 'envdcgd'\n\n\npermk.register(EnvDCGD())\n"
    (tmp_path / "envmod.py").write_text(PLUGIN.replace("PlugBlocks", "EnvBlocks") + "\npermk.register(EnvBlocks)\n" + method)
    out = _python(code, tmp_path, PERMK_PLUGINS="envmod")
    assert out.stdout.split() == ["False", "True", "True"], out.stderr


def test_a_broken_plugin_is_a_warning_naming_it(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("raise RuntimeError('no luck')\n")
    code = ("import warnings, permk\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    cat = permk.compressors.catalog()\n"
            "print('permk' in cat, [str(x.message) for x in w if x.category is permk.registry.PluginWarning])\n")
    out = _python(code, tmp_path, PERMK_PLUGINS="broken,missing_module_xyz")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("True [")
    assert "module 'broken' of PERMK_PLUGINS failed to load: RuntimeError: no luck" in out.stdout
    assert "module 'missing_module_xyz' of PERMK_PLUGINS failed to load: ModuleNotFoundError" in out.stdout


def test_load_plugins_warns_and_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_loaded", False)
    monkeypatch.setenv(registry.ENV_VAR, "permk_no_such_plugin_module")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        registry.load_plugins()
        registry.load_plugins()  # once
    assert [str(x.message) for x in w if x.category is registry.PluginWarning] == [
        "permk plugin module 'permk_no_such_plugin_module' of PERMK_PLUGINS failed to load: "
        "ModuleNotFoundError: No module named 'permk_no_such_plugin_module'"]


def test_the_cli_sees_a_plugin(tmp_path: Path) -> None:
    """``permk --plugin MODULE``: the module's compressor is selectable in ``--methods`` and its
    runs are written (also by the processes of ``--jobs 2``, which read ``PERMK_PLUGINS``)."""
    from conftest import final_grad_norms, run_cli

    (tmp_path / "clip.py").write_text(PLUGIN.replace("PlugBlocks", "CliBlocks") + "\npermk.register(CliBlocks)\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "out"
    r = run_cli("--plugin", "clip", "quadratic", "--quick", "--n", "4", "8", "--d", "16", "--noise-scales", "0.1",
                "--rounds", "200", "--jobs", "2", "--methods", "marina-cliblocks", "--no-plot", "--no-progress",
                "--out", str(out), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    keys = final_grad_norms(out / "quadratic")
    assert keys and all("|marina-cliblocks|" in k for k in keys) and {k.split("|")[0] for k in keys} == {"n4_s0.1", "n8_s0.1"}
    bad = run_cli("quadratic", "--methods", "marina-cliblocks", env=env)
    assert bad.returncode == 2 and "unknown or unsuitable method 'marina-cliblocks'" in bad.stderr
    bad = run_cli("--plugin", "no_such_plugin_xyz", "quadratic")
    assert bad.returncode == 2 and "--plugin no_such_plugin_xyz: ModuleNotFoundError" in bad.stderr


# -- issue 33, item 10: a plugin whose own code raises is named, never a traceback ---------------
class NoDefault(permk.Compressor):
    """A plugin compressor whose ``default`` raises RuntimeError."""

    def floats_per_worker(self, n: int, d: int) -> int:
        return d

    @classmethod
    def default(cls, n: int, d: int) -> permk.Compressor:
        raise RuntimeError("no default here")

    def plan(self, n: int, d: int, *, seed: int, round: int) -> permk.Plan:
        return permk.Plan(np.arange(n + 1) * d, np.tile(np.arange(d), n), np.ones(n))


class BadParams(permk.methods.DCGD):
    """A plugin method whose ``parameters`` raise ZeroDivisionError."""

    name = "badparams"

    def parameters(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
        raise ZeroDivisionError("oops")


def test_a_raising_plugin_is_named_and_left_out_of_the_specs() -> None:
    from permk.experiments.specs import PluginError, Spec, available_specs, spec_survey

    bad = BadParams()
    permk.register(NoDefault)
    permk.register(bad)
    try:
        with pytest.warns(permk.registry.PluginWarning) as w:
            specs = available_specs()
        messages = sorted(str(x.message) for x in w)
        assert messages == [
            "permk plugin compressor 'nodefault' (test_registry.NoDefault) failed: NoDefault.default(10, 100) raised "
            "RuntimeError: no default here; its methods are left out",
            "permk plugin method 'badparams' (test_registry.BadParams) failed: badparams-permk's parameters and step at "
            "n=10, d=100 raised ZeroDivisionError: oops; its methods are left out"], messages
        assert "marina-permk" in specs and not any("nodefault" in s or s.startswith("badparams") for s in specs)
        _, broken = spec_survey()
        assert set(broken) == {"compressor nodefault", "method badparams"}
        with pytest.raises(PluginError, match=r"^the plugin compressor 'nodefault' \(test_registry\.NoDefault\): "
                                              r"NoDefault\.default\(4, 8\) raised RuntimeError: no default here$"):
            Spec.parse("marina-nodefault").compressor(4, 8)
    finally:
        permk.registry.unregister(NoDefault)
        permk.registry.unregister(bad)
    assert spec_survey()[1] == {}


BROKEN_PLUGINS = textwrap.dedent('''
    import numpy as np
    import permk


    class Boom(permk.Compressor):
        """default() raises: every --methods check meets it."""

        def floats_per_worker(self, n, d):
            return d

        @classmethod
        def default(cls, n, d):
            raise RuntimeError("no default here")

        def plan(self, n, d, *, seed, round):
            return permk.Plan(np.arange(n + 1) * d, np.tile(np.arange(d), n), np.ones(n))


    class Late(permk.Compressor):
        """Fine until a run's round 3, whose plan raises KeyError."""

        def floats_per_worker(self, n, d):
            return 1

        def ab_constants(self, n, d):
            return (float(d - 1) / n, 0.0)

        def plan(self, n, d, *, seed, round):
            if round == 3:
                raise KeyError("round three")
            return permk.Plan(np.arange(n + 1), np.zeros(n, dtype=np.int64), np.full(n, float(d)))


    permk.register(Boom)
    permk.register(Late)
''')


def test_the_cli_names_a_raising_plugin_and_exits_2(tmp_path: Path) -> None:
    """A plugin's default() raising RuntimeError: asking for its method is a one-line error
    naming it (exit 2), asking for another method runs with a warning naming it; a plugin
    raising KeyError mid-run is a one-line error naming it (exit 2). Never a traceback."""
    from conftest import run_cli

    (tmp_path / "brokenplug.py").write_text(BROKEN_PLUGINS)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    common = ["quadratic", "--quick", "--n", "4", "--d", "8", "--noise-scales", "0.5", "--rounds", "20", "--max-multipliers", "1",
              "--no-plot", "--no-progress", "--threads", "1"]
    named = "the plugin compressor 'boom' (brokenplug.Boom) failed: Boom.default(10, 100) raised RuntimeError: no default here"
    for how in (["--plugin", "brokenplug"], []):
        e = env if how else {**env, "PERMK_PLUGINS": "brokenplug"}
        r = run_cli(*how, *common, "--methods", "marina-boom", "--out", str(tmp_path / "a"), env=e)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip().splitlines()[-1] == f"permk quadratic: error: argument --methods: 'marina-boom': {named}"
        r = run_cli(*how, *common, "--methods", "marina-permk", "--out", str(tmp_path / f"b{len(how)}"), env=e)
        assert r.returncode == 0, r.stderr
        assert r.stderr.count(f"permk: warning: {named}; its methods are left out") == 1
    for jobs in ("1", "2"):
        r = run_cli("--plugin", "brokenplug", *common, "--jobs", jobs, "--methods", "marina-late", "--out", str(tmp_path / f"c{jobs}"), env=env)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip().splitlines()[-1] == ("permk quadratic: error: the plugin compressor 'late' (brokenplug.Late): "
                                                     "the run of marina-late raised KeyError: 'round three'")


@pytest.mark.slow
def test_the_generic_tests_run_on_registered_objects(tmp_path: Path) -> None:
    """With ``PERMK_PLUGINS`` naming a module that registers a compressor and a method, the
    generic tests collect both and they pass them (the compressor tests can fail: see the
    mutation checks of test_compressors)."""
    method = "\n\nclass GenDCGD(permk.methods.DCGD):\n    name = 'gendcgd'\n\n\npermk.register(GenDCGD())\n"
    (tmp_path / "genplug.py").write_text(PLUGIN.replace("PlugBlocks", "GenBlocks") + "\npermk.register(GenBlocks)\n" + method)
    env = {**os.environ, "PERMK_PLUGINS": "genplug",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    tests = [str(ROOT / "tests" / f) for f in ("test_compressors.py", "test_api_robustness.py", "test_architecture.py")]
    out = subprocess.run([sys.executable, "-m", "pytest", *tests, "-v", "-p", "no:cacheprovider", "-k", "genblocks or gendcgd"],
                         capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    passed = [line for line in out.stdout.splitlines() if " PASSED" in line]
    assert sum("genblocks" in line for line in passed) >= 15, out.stdout[-3000:]
    assert any("test_every_update_returns_a_state_and_its_round[gendcgd]" in line for line in passed), out.stdout[-3000:]
