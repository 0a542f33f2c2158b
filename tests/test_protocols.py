"""The projected time of a grid (``--estimate`` and the first line of a run) and the two
protocols of the experiments: permk's (the paper's text) and the authors' code's (issue 19,
items 4 and 5)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from permk.cli import build_parser
from permk.experiments import autoencoder as ae_mod
from permk.experiments import quadratic as q_mod
from permk.experiments.quadratic import QuadraticGrid, quadratic_cell
from permk.experiments.plotting import load_experiment
from permk.experiments.protocols import protocol_of
from permk.experiments.results import read_records
from permk.experiments.estimate import Estimate, estimate_grid, format_estimate
from permk.experiments.protocols import SearchOptions
from permk.experiments.search import best_runs, cell_budget, score
from permk.experiments.specs import Spec, step_exponents

from conftest import run_cli

TINY = ["--n", "10", "--noise-scales", "0", "0.8", "--d", "40", "--rounds", "200"]


def _grid(**options: Any) -> QuadraticGrid:
    return QuadraticGrid(ns=(10,), noise_scales=(0.8,), d=40, options=SearchOptions(max_rounds=200, budget_factor=5.0, tol=1e-4, **options))


# ---------------------------------------------------------------------------------------------
# --estimate
# ---------------------------------------------------------------------------------------------
def test_estimate_prints_every_cell_and_method_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = run_cli("quadratic", *TINY, "--estimate", "--no-progress", "--out", str(out))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("projected time of `permk quadratic` (2 cells")
    assert lines[1].split()[:4] == ["cell", "method", "runs", "s/round"]
    rows = [ln.split() for ln in lines if ln.split()[:1] in (["n10_s0"], ["n10_s0.8"]) and "cell:" not in ln]
    assert sorted((x[0], x[1]) for x in rows) == sorted((c, m) for c in ("n10_s0", "n10_s0.8")
                                                          for m in ("marina-permk", "ef21-topk", "marina-randk"))
    for x in rows:
        assert int(x[2]) >= 1 and float(x[3]) > 0 and x[4] == "200" and int(x[6]) <= 200  # max / expected rounds per run
    assert sum("cell: set-up" in ln for ln in lines) == 2
    assert any(ln.startswith("grid: expected") and ", at most" in ln for ln in lines) and lines[-1].startswith("assumed:")
    assert not out.exists()


def test_estimate_of_fixed_round_counts_counts_ef21_twice(tmp_path: Path) -> None:
    r = run_cli("quadratic", *TINY, "--horizon", "rounds", "--estimate", "--no-progress", "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    rows = {(x[0], x[1]): x for x in (ln.split() for ln in r.stdout.splitlines()) if len(x) > 6 and x[0].startswith("n10_")
            and x[1] != "cell:"}
    assert len(rows) == 6
    for (cell, method), x in rows.items():
        want = str(200 * protocol_of(Spec.parse(method).method).rounds_factor)
        assert (x[4], x[6]) == (want, want), (cell, method)
    assert "every run goes its fixed rounds" in r.stdout


def test_estimate_bounds_the_runs_of_the_grid(tmp_path: Path) -> None:
    """The estimate runs each cell as the grid does (same steps, same runs): it counts every
    multiplier of the grid, and the pilot run is the grid's run at that step, so every run of
    the grid stops within the expected rounds (the cell's budget is at most the pilot's)."""
    grid = _grid(prune=())
    est = estimate_grid(quadratic_cell, grid.to_json(), grid.cells(), Estimate(pilot_seconds=30.0))
    assert est.cells[0]["bits_to_target"] is not None
    text = format_estimate(est, grid.options)
    assert "n10_s0.8" in text and "grid: expected" in text
    path = tmp_path / "runs.jsonl"
    quadratic_cell(grid.cells()[0], grid.to_json(), str(path), False)
    recs = read_records(path)
    for row in est.rows:
        mine = [x for x in recs if x["method"] == row["method"]]
        assert len(mine) == row["runs"] + row["diverged_in_probe"]
        assert 0 < row["expected_rounds"] <= row["max_rounds"] == 200
        assert row["seconds_max"] >= row["seconds_expected"] > 0
        finite = math.isfinite(row["budget_bits"])
        assert row["expected_rounds"] == (min(200, math.ceil(row["budget_bits"] / row["bits_per_round"])) if finite else 200)
        for x in mine:  # a run stops in the round its bits reach the budget (a round sends ≤ d floats)
            if not x["summary"]["diverged"]:
                assert x["summary"]["bits_sent"] < row["budget_bits"] + 32 * 40, (x["key"], row)


def test_the_expected_rounds_are_the_grids_within_a_factor_2(tmp_path: Path) -> None:
    """The expected figure is honest: the rounds it projects (each non-diverged run at its
    expected count) are within a factor 2 of the rounds the grid's runs make (a count, not a
    time: the seconds it multiplies them by are measured, the projection's only guess is the
    count). The pilot that diverges (EF21's largest step at n = 40, s = 0.8) hands its place to
    the next step; on these 4 cells the projection counts 1.5× the grid's rounds."""
    grid = QuadraticGrid(ns=(10, 40), noise_scales=(0.0, 0.8), d=40,
                         options=SearchOptions(max_rounds=400, budget_factor=5.0, tol=1e-4, prune=()))
    est = estimate_grid(quadratic_cell, grid.to_json(), grid.cells(), Estimate(pilot_seconds=60.0))
    projected = sum(row["runs"] * row["expected_rounds"] for row in est.rows)
    actual = 0
    for cell in grid.cells():
        path = tmp_path / f"{cell['id']}.jsonl"
        quadratic_cell(cell, grid.to_json(), str(path), False)
        actual += sum(x["summary"]["rounds_run"] for x in read_records(path) if not x["summary"]["diverged"])
    assert actual <= projected <= 2 * actual, (projected, actual)


def test_every_run_starts_with_its_projection(tmp_path: Path) -> None:
    r = run_cli("quadratic", *TINY, "--no-progress", "--no-plot", "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("projected: the first cell, n10_s0 (of 2), at most ") and "--estimate" in first


@pytest.mark.parametrize("bad", [["--best", "final"], ["--horizon", "bits"], ["--steps", "all"], ["--protocol", "mine"],
                                 ["--ef21-init", "zero"]])
def test_protocol_options_reject_unknown_values(bad: list[str], tmp_path: Path) -> None:
    r = run_cli("quadratic", *TINY, "--estimate", *bad, "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "invalid choice" in r.stderr and bad[0] in r.stderr


def test_search_options_are_checked() -> None:
    with pytest.raises(ValueError, match="best must be one of 'budget', 'last90'"):
        SearchOptions(best="final")
    with pytest.raises(ValueError, match="ef21_init must be one of"):
        SearchOptions(ef21_init="zero")


# ---------------------------------------------------------------------------------------------
# the two protocols
# ---------------------------------------------------------------------------------------------
def _args(*argv: str) -> Any:
    return build_parser().parse_args(list(argv))


def test_protocol_authors_sets_every_rule_and_single_options_override_it() -> None:
    q = q_mod.grid_from_args(_args("quadratic", "--protocol", "authors")).options
    assert (q.best, q.horizon, q.steps, q.ef21_init, q.max_rounds) == ("last90", "rounds", "authors", "compressed", 20000)
    a = ae_mod.grid_from_args(_args("autoencoder", "--protocol", "authors"))
    o = a.options
    assert (o.best, o.horizon, o.steps, o.ef21_init, o.max_rounds) == ("last90", "rounds", "authors", "full", 4000)
    assert (a.split, a.loss) == ("per-sample", "authors")
    mixed = ae_mod.grid_from_args(_args("autoencoder", "--protocol", "authors", "--best", "budget", "--rounds", "50",
                                        "--split", "per-worker"))
    assert (mixed.options.best, mixed.options.horizon, mixed.options.max_rounds, mixed.split, mixed.loss) == \
        ("budget", "rounds", 50, "per-worker", "authors")
    paper = q_mod.grid_from_args(_args("quadratic")).options
    assert (paper.best, paper.horizon, paper.steps, paper.ef21_init) == ("budget", "budget", "edge", "full")
    assert ae_mod.grid_from_args(_args("autoencoder", "--loss", "authors")).split == "per-worker"


def test_authors_step_ranges() -> None:
    o = SearchOptions(steps="authors")
    assert step_exponents("marina-permk", 1e-3, 1.0, o, q_mod.AUTHORS_STEPS) == list(range(19, -1, -1))
    assert step_exponents("ef21-topk", 1e-3, 1.0, o, q_mod.AUTHORS_STEPS) == list(range(22, 2, -1))  # ×8, as --top_k_factor 3
    assert step_exponents("ef21-topk", 1e-3, None, o, ae_mod.AUTHORS_STEPS, max_count=2) == [3, 2]
    assert step_exponents("marina-randk", 1e-3, None, o, ae_mod.AUTHORS_STEPS) == list(range(3, -6, -1))
    edge = step_exponents("marina-permk", 1e-3, 1.0, SearchOptions(), q_mod.AUTHORS_STEPS)
    assert edge == list(range(10, -1, -1))  # 2^10·1e-3 ≤ 2/L− < 2^11·1e-3


def _record(method: str, g: list[float], *, best: str = "budget", horizon: str = "budget", diverged: bool = False) -> dict[str, Any]:
    rounds = list(range(len(g)))
    return {"method": method, "options": {"best": best, "horizon": horizon},
            "summary": {"diverged": diverged, "reached_target": False, "bits_to_target": None, "bits_sent": 10.0 * rounds[-1]},
            "curve": {"round": rounds, "bits": [10.0 * r for r in rounds], "grad_norm_sq": g}}


def test_last90_ranks_by_the_mean_log_over_the_last_90_percent() -> None:
    # A ends lower; B is lower on average over rounds 1..10 (the last 90% of 0..10)
    a = [1.0] + [1e-2] * 9 + [1e-9]
    b = [1.0] + [1e-4] * 10
    assert score({}, {"round": list(range(11)), "bits": list(range(11)), "grad_norm_sq": a}, math.inf, "last90")[1] == \
        pytest.approx(np.mean(np.log10(a[1:])))
    for best, winner in (("budget", a), ("last90", b)):
        recs = [_record("marina-permk", a, best=best), _record("marina-permk", b, best=best)]
        assert best_runs(recs, 20.0)["marina-permk"]["curve"]["grad_norm_sq"] == winner
    # a non-finite value drops the run under last90, as in the authors' plot scripts
    c = [1.0] + [1e-8] * 5 + [float("nan")] + [1e-8] * 4
    recs = [_record("ef21-topk", c, best="last90"), _record("ef21-topk", a, best="last90")]
    assert best_runs(recs, 20.0)["ef21-topk"]["curve"]["grad_norm_sq"] == a


def test_fixed_round_counts_run_every_step_to_the_end(tmp_path: Path) -> None:
    grid = _grid(horizon="rounds", best="last90", ef21_init="compressed", prune=())
    path = tmp_path / "runs.jsonl"
    quadratic_cell(grid.cells()[0], grid.to_json(), str(path), False)
    recs = read_records(path)
    alive = [x for x in recs if not x["summary"]["diverged"]]
    assert {x["method"] for x in alive} == {"marina-permk", "ef21-topk", "marina-randk"}
    for x in alive:
        assert x["summary"]["rounds_run"] == (400 if x["method"] == "ef21-topk" else 200)
        assert x["summary"]["stopped_by"] == "max_rounds"
        assert x["options"]["best"] == "last90" and x["options"]["horizon"] == "rounds"
        if x["method"] == "ef21-topk":
            assert x["params"]["init"] == "compressed"
    assert cell_budget(recs, 5.0) == max(x["summary"]["bits_sent"] for x in recs)
    # the figures' best runs follow the recorded rule
    best = best_runs(recs, 5.0)
    for m, r in best.items():
        mine = [x for x in alive if x["method"] == m]
        assert r["key"] == min(mine, key=lambda x: score(x["summary"], x["curve"], math.inf, "last90"))["key"]


def test_autoencoder_cell_passes_the_protocols_problem_options(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []

    class Stop(Exception):
        pass

    def fake(*args: Any, **kw: Any) -> None:
        seen.append(kw)
        raise Stop

    monkeypatch.setattr(ae_mod, "LinearAutoencoder", fake)
    monkeypatch.setattr(ae_mod, "_images", lambda data, limit: (np.zeros((30, 4)), "test"))
    g = replace(ae_mod.QUICK_GRID, workers=5)
    for split, loss, want in (("per-worker", "paper", {"split": "per-worker", "loss": "paper"}),
                             ("per-sample", "authors", {"split": "per-sample", "loss": "authors"})):
        with pytest.raises(Stop):
            ae_mod.autoencoder_cell(replace(g, split=split, loss=loss).cells()[0], replace(g, split=split, loss=loss).to_json(), "x", False)
        assert {k: v for k, v in seen[-1].items() if k in ("split", "loss")} == want


def test_autoencoder_estimate_on_idx_data(tmp_path: Path) -> None:
    """``permk autoencoder --estimate``: every cell and method of the grid, nothing written."""
    from test_cli import idx_data

    d = idx_data(tmp_path, 120)
    out = tmp_path / "out"
    r = run_cli("autoencoder", "--workers", "6", "--p-hat", "0", "1", "--lam", "0.001", "--encoding", "3", "--rounds", "40",
                "--max-multipliers", "2", "--estimate", "--no-progress", "--out", str(out), env={"PERMK_DATA": str(d)})
    assert r.returncode == 0, r.stderr
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("lam0.001_p") and "cell:" not in ln]
    assert sorted((x[0], x[1]) for x in rows) == sorted((c, m) for c in ("lam0.001_p0", "lam0.001_p1")
                                                          for m in ("marina-permk", "ef21-topk", "marina-randk"))
    assert all(x[4] == "40" and 1 <= int(x[2]) <= 2 for x in rows)
    assert "grid: expected" in r.stdout and not out.exists()


def test_figures_of_the_authors_protocol_say_how_the_x_range_and_best_step_were_chosen(tmp_path: Path) -> None:
    from permk.experiments.plotting import experiment_figures
    from permk.experiments.quadratic import run_quadratic

    root = run_quadratic(_grid(horizon="rounds", best="last90", prune=()), tmp_path, progress=False, plot=False)
    fig = dict(experiment_figures(root, every_step=False))["quadratic_best"]
    caption = " ".join(" ".join(t.get_text().split()) for t in fig.texts)  # the lines joined
    assert "fixed number of rounds" in caption and "last 90%" in caption, caption
    assert "fewest bits" not in caption


def test_figures_end_the_x_axis_at_the_longest_run_when_the_budget_lies_beyond_it(tmp_path: Path) -> None:
    from permk.experiments.plotting import experiment_figures
    from permk.experiments.quadratic import run_quadratic

    grid = replace(_grid(), options=replace(_grid().options, budget_factor=1e6))  # a budget no run reaches
    root = run_quadratic(grid, tmp_path, progress=False, plot=False)
    recs = [x for rs in load_experiment(root)[1].values() for x in rs]
    longest = max(float(x["summary"]["bits_sent"]) for x in recs if not x["summary"]["diverged"])
    fig = dict(experiment_figures(root, every_step=False))["quadratic_best"]
    (ax,) = [a for a in fig.axes if a.axison]
    assert ax.get_xlim()[1] == pytest.approx(longest)
    assert "or to the end of the longest run" in " ".join(" ".join(t.get_text().split()) for t in fig.texts)
