"""``permk classify`` end to end: records and figures, resume without new work, the figures'
two x axes, the projection of ``--estimate``, and one-line errors for bad data and arguments."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from permk.experiments.plotting import load_experiment
from permk.experiments.specs import Spec, available_specs

from conftest import run_cli

#: A small grid through the command line: 400 samples over 5 workers, 30 rounds, one step each.
SMALL = ["--samples", "400", "--n", "5", "--rounds", "30", "--max-multipliers", "1", "--batch-size", "4", "--no-progress", "--threads", "1"]


def _libsvm(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def _one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("permk classify: error: "), r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("classify")
    r = run_cli("classify", *SMALL, "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("projected: ")
    return out


def test_small_grid_writes_records_and_both_figures(small: Path) -> None:
    root = small / "classify"
    _, cells = load_experiment(root)
    recs = cells["equal"]
    assert {r["method"] for r in recs} == {"marina-permk", "marina-randk", "ef21-topk", "vr_marina-permk", "sgd"}
    for r in recs:
        calls = r["curve"]["oracle_calls"]
        assert len(calls) == len(r["curve"]["bits"]) and calls[0] == 0 and calls[-1] > 0
        assert r["constants"]["samples"] == 400 and r["cell"]["n"] == 5
    # a round of the stochastic methods costs b (SGD) or 2b (VR-MARINA's tails) sample gradients,
    # a full-gradient round a whole shard (80 samples)
    sgd = next(r for r in recs if r["method"] == "sgd")
    assert sgd["curve"]["oracle_calls"][1] == 4
    marina = next(r for r in recs if r["method"] == "marina-permk")
    assert marina["curve"]["oracle_calls"][1] == 80
    figs = {p.name for p in (root / "figures").glob("*.png")}
    assert figs >= {"classify_best.png", "classify_best_oracle_calls.png"}


def test_figures_read_without_the_paper(small: Path) -> None:
    """SGD, which sends whole vectors every round, does not stretch the bits axis (its curve is
    cut where the compressed methods' longest run ends, and its legend says so); the figure
    against oracle calls has a log axis (b calls a round against a whole shard) and says its
    runs are the bits figure's."""
    from permk.experiments.plotting import experiment_figures, uncompressed

    root = small / "classify"
    figs = dict(experiment_figures(root, every_step=False))
    bits = figs["classify_best"]
    (ax,) = [a for a in bits.axes if a.axison]
    recs = load_experiment(root)[1]["equal"]
    compressed = [r for r in recs if not uncompressed(r)]
    assert {r["method"] for r in recs if uncompressed(r)} == {"sgd"}
    assert ax.get_xlim()[1] <= max(float(r["summary"]["bits_sent"]) for r in compressed) * (1 + 1e-9)
    texts = {t.get_text().partition(",")[0]: " ".join(t.get_text().split()) for t in ax.get_legend().get_texts()}
    assert "whole vectors every round: cut here" in texts["SGD"] and "cut here" not in texts["MARINA + PermK"]
    calls = figs["classify_best_oracle_calls"]
    (ax,) = [a for a in calls.axes if a.axison]
    assert ax.get_xscale() == "log" and "log scale" in ax.get_xlabel()
    assert calls.get_suptitle().startswith("The same runs against gradient-oracle calls")


def test_noisy_curves_are_drawn_smoothed_over_their_points() -> None:
    import numpy as np

    from permk.experiments.plotting import _noisy, _smooth

    rng = np.random.default_rng(0)
    steady = np.geomspace(1.0, 1e-4, 200)
    assert not _noisy(steady) and not _noisy(steady[::-1])  # falling, or rising steadily (a diverging run)
    noisy = steady * np.exp(rng.normal(size=200))
    assert _noisy(noisy)
    smooth, w = _smooth(noisy)
    assert w == 10 and smooth.shape == noisy.shape and smooth[0] == noisy[0]
    assert np.allclose(smooth[w - 1], np.exp(np.mean(np.log(noisy[:w]))))  # a geometric mean of the last w points


def test_second_run_resumes_without_new_work(small: Path) -> None:
    runs = small / "classify" / "runs" / "equal.jsonl"
    before = runs.read_bytes()
    r = run_cli("classify", *SMALL, "--out", str(small), "--resume", "--no-plot")
    assert r.returncode == 0, r.stderr
    assert runs.read_bytes() == before
    assert json.loads((small / "classify" / "timing.json").read_text())["resumed"] is True
    again = run_cli("classify", *SMALL, "--out", str(small))  # without --resume: refused, nothing touched
    assert "already holds results" in _one_line_error(again) and runs.read_bytes() == before


@pytest.mark.slow
def test_quick_run(tmp_path: Path) -> None:
    r = run_cli("classify", "--quick", "--no-progress", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    root = tmp_path / "classify"
    assert (root / "figures" / "classify_best.png").exists() and (root / "figures" / "classify_best_oracle_calls.png").exists()
    recs = load_experiment(root)[1]["equal"]
    # 3 multipliers of each of the 5 methods, but EF21's scan stops at its first worse run (pruning)
    assert {r["method"] for r in recs} == set(Spec.parse(m).key for m in ("marina-permk", "marina-randk", "ef21-topk", "vr_marina-permk", "sgd"))
    assert 2 * 5 < len(recs) <= 3 * 5


def test_estimate_prints_a_projection_and_writes_nothing(tmp_path: Path) -> None:
    r = run_cli("classify", *SMALL, "--estimate", "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    assert "projected time of `permk classify`" in r.stdout and "grid: expected" in r.stdout
    assert "vr_marina-permk" in r.stdout and "sgd" in r.stdout
    assert not (tmp_path / "o").exists()


def test_missing_file(tmp_path: Path) -> None:
    line = _one_line_error(run_cli("classify", "--data", str(tmp_path / "nope.svm"), "--out", str(tmp_path / "o")))
    assert "nope.svm" in line and not (tmp_path / "o").exists()


def test_bad_libsvm_line_names_file_and_line(tmp_path: Path) -> None:
    f = _libsvm(tmp_path / "bad.svm", ["+1 1:0.5 3:1", "-1 2:x", "+1 1:1"])
    line = _one_line_error(run_cli("classify", "--data", str(f), "--out", str(tmp_path / "o")))
    assert f"{f}:2:" in line


def test_non_binary_labels_for_the_binary_task(tmp_path: Path) -> None:
    f = _libsvm(tmp_path / "three.svm", ["1 1:0.5", "2 2:1", "3 1:1 2:1"])
    line = _one_line_error(run_cli("classify", "--data", str(f), "--n", "1", "--out", str(tmp_path / "o")))
    assert str(f) in line and "two label values" in line


@pytest.mark.parametrize("task", ["binary", "multiclass"])
def test_a_single_label_value_is_refused(tmp_path: Path, task: str) -> None:
    """Issue 33, item 4: a file whose samples all carry one label is no classification task."""
    f = _libsvm(tmp_path / "one_label.svm", ["1 1:0.5", "1 2:1", "1 1:1 2:1", "1 2:0.25"])
    line = _one_line_error(run_cli("classify", "--quick", "--data", str(f), "--task", task, "--n", "2", "--out", str(tmp_path / "o")))
    assert str(f) in line and "two label values, got 1: [1.0]" in line and not (tmp_path / "o").exists()


def test_a_huge_index_is_a_one_line_file_line_error(tmp_path: Path) -> None:
    """Issue 33, item 5: no traceback, exit 2, FILE:LINE."""
    f = _libsvm(tmp_path / "big.svm", ["1 1:0.5", "-1 2:1", "1 99999999999999999999:1"])
    line = _one_line_error(run_cli("classify", "--quick", "--data", str(f), "--n", "2", "--out", str(tmp_path / "o")))
    assert f"{f}:3: the index 99999999999999999999" in line and "too large" in line


def test_huge_features_are_refused_naming_the_file(tmp_path: Path) -> None:
    """Issue 33, item 6: a value of 1e300 (finite, but its square is not) names the file."""
    f = _libsvm(tmp_path / "huge.svm", ["1 1:0.5", "-1 2:1", "1 1:1e300", "-1 1:1 2:2"])
    line = _one_line_error(run_cli("classify", "--quick", "--data", str(f), "--n", "2", "--out", str(tmp_path / "o")))
    assert f"{f}: the samples are too large for the smoothness constants" in line and "rescale the features" in line


def test_resume_refuses_a_changed_data_file(tmp_path: Path) -> None:
    """Issue 33, item 8: the grid's config holds a digest of the data read; after the file's
    features are rescaled, ``--resume`` refuses the grid (exit 2, one line naming the data),
    and with the file restored it resumes."""
    rows = [f"{'+1' if k % 2 else '-1'} 1:{(k % 7) / 7:.3f} 2:{(k % 5) / 5:.3f}" for k in range(24)]
    f = _libsvm(tmp_path / "toy.svm", rows)
    args = ["classify", "--data", str(f), "--n", "2", "--rounds", "5", "--max-multipliers", "1", "--batch-size", "2",
            "--no-progress", "--no-plot", "--threads", "1", "--methods", "marina-permk", "--out", str(tmp_path / "o")]
    assert run_cli(*args).returncode == 0
    runs = tmp_path / "o" / "classify" / "runs" / "equal.jsonl"
    done = runs.read_text()
    runs.write_text("")  # as if the grid had been cut short
    _libsvm(f, [r.replace(" 1:", " 1:1") for r in rows])  # the features rescaled, the path the same
    line = _one_line_error(run_cli(*args, "--resume"))
    assert "--resume:" in line and "the data (a digest of the samples it read) changed since the grid started" in line
    assert runs.read_text() == ""
    _libsvm(f, rows)
    r = run_cli(*args, "--resume")
    assert r.returncode == 0, r.stderr
    curve = lambda text: [json.loads(line)["curve"] for line in text.splitlines()]  # noqa: E731
    assert curve(runs.read_text()) == curve(done)  # the same run, bit for bit


def test_more_workers_than_samples(tmp_path: Path) -> None:
    f = _libsvm(tmp_path / "four.svm", ["+1 1:0.5", "-1 2:1", "+1 1:1", "-1 2:0.5"])
    line = _one_line_error(run_cli("classify", "--data", str(f), "--n", "5", "--out", str(tmp_path / "o")))
    assert "--n 5" in line and "4 samples" in line


def test_user_libsvm_file_runs(tmp_path: Path) -> None:
    rows = [f"{'+1' if k % 2 else '-1'} 1:{(k % 7) / 7:.3f} 2:{(k % 5) / 5:.3f} 3:{(k % 3) / 3:.3f}" for k in range(40)]
    f = _libsvm(tmp_path / "toy.svm", rows)
    r = run_cli("classify", "--data", str(f), "--n", "4", "--rounds", "10", "--max-multipliers", "1", "--batch-size", "2",
                "--no-progress", "--no-plot", "--methods", "marina-permk", "sgd", "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    _, cells = load_experiment(tmp_path / "o" / "classify")
    assert {x["method"] for x in cells["equal"]} == {"marina-permk", "sgd"}


def test_stochastic_methods_are_specs_and_refuse_a_quadratic(tmp_path: Path) -> None:
    assert {"vr_marina-permk", "sgd"} <= set(available_specs())
    assert Spec.parse("sgd").label == "SGD"
    with pytest.raises(ValueError, match="unknown method"):
        Spec.parse("sgd-permk")
    line = run_cli("quadratic", "--n", "10", "--noise-scales", "0", "--d", "20", "--rounds", "5", "--methods", "sgd",
                   "--no-progress", "--no-plot", "--out", str(tmp_path))
    assert line.returncode == 2 and "needs a finite-sum problem" in line.stderr


HEART = ["--data", "heart_scale", "--n", "6", "--rounds", "30", "--max-multipliers", "1", "--batch-size", "4", "--no-progress",
         "--threads", "1", "--no-plot"]
needs_heart_scale = pytest.mark.skipif(not Path("/usr/share/doc/liblinear-tools/examples/heart_scale").is_file(),
                                       reason="needs Debian's liblinear-tools (apt-get install liblinear-tools)")


def _runs(experiment: Path) -> dict[str, dict]:
    out = {}
    for f in sorted((experiment / "runs").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r.get("kind") == "run":
                out[r["key"]] = r
    return out


def _same_records(a: object, b: object, where: str, rel: float) -> None:
    """Equal records, their floats within ``rel`` (the constants and steps can differ in the last
    bit where BLAS sums in another order; ``‖∇f‖²`` sums the workers' gradients on MPI); ``b``
    may add the MPI run's own entries to ``params``."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) <= set(b), (where, set(a) ^ set(b))
        for k in a:
            if k not in ("seconds", "wall_time"):
                _same_records(a[k], b[k], f"{where}.{k}", rel)
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for x, y in zip(a, b):
            _same_records(x, y, where, rel)
    elif isinstance(a, float):
        assert isinstance(b, float) and b == pytest.approx(a, rel=rel, abs=0), where
    else:
        assert a == b, (where, a, b)


@needs_heart_scale
def test_heart_scale_by_name(tmp_path: Path) -> None:
    r = run_cli("classify", *HEART, "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    runs = _runs(tmp_path / "classify")
    assert len(runs) == 5
    for rec in runs.values():
        assert rec["constants"]["samples"] == 270 and rec["constants"]["data"].endswith("heart_scale (binary)")
        assert rec["figure"]["problem"].startswith("nonconvex sigmoid loss (1 − σ(y aᵀx))² on heart_scale: 270 samples")


@pytest.mark.mpi
@needs_heart_scale
def test_classify_on_mpi_equals_the_single_process_run(tmp_path: Path) -> None:
    """`mpiexec -n 2 permk classify --mpi`: each rank holds its block of workers' samples, rank 0
    writes, and every record is the single process's: the same runs, rounds, oracle calls and
    stops, every number within 1e-12 relative (measured: ≤ 2e-14 on ‖∇f‖², which the MPI backend
    sums over the workers' gradients and the single process over the samples in one product)."""
    from conftest import CLI, MPIEXEC

    grid = ["classify", *HEART, "--p-hat", "0", "0.5"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    mpi = subprocess.run([str(MPIEXEC), "-n", "2", *CLI, *grid, "--mpi", "--out", str(tmp_path / "mpi")], capture_output=True,
                         text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
    assert mpi.returncode == 0, mpi.stdout + mpi.stderr
    seq = run_cli(*grid, "--out", str(tmp_path / "seq"))
    assert seq.returncode == 0, seq.stderr
    a, b = _runs(tmp_path / "seq" / "classify"), _runs(tmp_path / "mpi" / "classify")
    assert len(a) == 10 and a.keys() == b.keys()
    for key in a:
        assert b[key]["params"]["backend"] == "mpi" and b[key]["params"]["n_procs"] == 2
        _same_records(a[key], b[key], key, rel=1e-12)
