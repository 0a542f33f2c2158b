"""The ``permk`` command line: subcommands, help, the demo, the autoencoder end to end on a
tiny grid, and clear errors."""

from __future__ import annotations

import gzip
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from permk.cli import build_parser, main

from conftest import run_cli

def test_help_lists_subcommands() -> None:
    r = run_cli("--help")
    assert r.returncode == 0
    for cmd in ("quadratic", "autoencoder", "plot", "demo"):
        assert cmd in r.stdout
    r = run_cli("quadratic", "--help")
    assert r.returncode == 0 and "--quick" in r.stdout and "--resume" in r.stdout and "--jobs" in r.stdout


def test_console_script_is_declared() -> None:
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group="console_scripts") if ep.name == "permk"]
    assert eps and eps[0].value == "permk.cli:main"


def test_every_subcommand_is_in_the_parser() -> None:
    names = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert {"quadratic", "autoencoder", "plot", "demo", "complexity"} <= set(names)


def test_version() -> None:
    import permk

    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"permk {permk.__version__}"


def test_demo_matches_ab_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--n", "5", "--d", "20", "--rounds", "3000"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^(\w+)\s+(PermK|RandK\(k=\d+\))\s+\S+\s+\S+\s+(\S+)\s+(\S+)\s+(\S+)$", out, flags=re.M)
    assert len(rows) == 6
    for inputs, comp, measured, se, bound in rows:
        m, s, b = float(measured), float(se), float(bound)
        assert abs(m - b) <= 5 * s + 1e-9 * max(1.0, b), (inputs, comp, m, s, b)
        if inputs == "identical" and comp == "PermK":
            assert m < 1e-20 and abs(b) < 1e-9


def test_demo_runs_from_the_shell() -> None:
    r = run_cli("demo", timeout=120)  # the timeout catches a hang; its speed is measured in the README
    assert r.returncode == 0 and "PermK" in r.stdout and "RandK" in r.stdout


def test_bad_arguments_exit_2() -> None:
    assert run_cli("quadratic", "--n", "0").returncode == 2
    assert run_cli("frobnicate").returncode == 2


def test_plot_of_missing_dir(tmp_path: Path) -> None:
    r = run_cli("plot", str(tmp_path / "nothing"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = run_cli("plot", str(tmp_path))
    assert r.returncode == 2 and "no experiment directories" in r.stderr


def test_autoencoder_missing_data_says_how_to_provide_it(tmp_path: Path) -> None:
    r = run_cli("autoencoder", "--data", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert r.returncode == 2
    assert "nope" in r.stderr and "--data" in r.stderr and "dataset-fashion-mnist" in r.stderr
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "train-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8bnot really gzip")
    r = run_cli("autoencoder", "--data", str(tmp_path / "bad"), "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "train-images-idx3-ubyte.gz: corrupt gzip" in r.stderr


def idx_data(tmp_path: Path, n: int, seed: int = 0) -> Path:
    """A directory ``tmp_path/data`` holding ``n`` random 8×8 images as an IDX training file."""
    d = tmp_path / "data"
    d.mkdir()
    X = (np.random.default_rng(seed).random((n, 8, 8)) * 255).astype(np.uint8)
    raw = bytes([0, 0, 8, 3]) + struct.pack(">3I", n, 8, 8) + X.tobytes()
    (d / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(raw))
    return d


def test_autoencoder_resume_refuses_changed_images(tmp_path: Path) -> None:
    """Issue 33, item 8: the grid's config holds a digest of the images read; other images
    under the same path are refused by ``--resume``."""
    d = idx_data(tmp_path, 20)
    args = ["autoencoder", "--data", str(d), "--workers", "2", "--p-hat", "1", "--lam", "0.001", "--encoding", "2", "--rounds", "3",
            "--max-multipliers", "1", "--methods", "marina-permk", "--gamma", "0.01", "--no-progress", "--no-plot",
            "--out", str(tmp_path / "o")]
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    (d / "train-images-idx3-ubyte.gz").unlink()
    d.rmdir()
    idx_data(tmp_path, 20, seed=1)
    for f in (tmp_path / "o" / "autoencoder" / "runs").glob("*.jsonl"):
        f.write_text("")
    r = run_cli(*args, "--resume")
    assert r.returncode == 2 and "the data (a digest of the samples it read) changed since the grid started" in r.stderr, r.stderr


@pytest.mark.slow
def test_autoencoder_end_to_end_on_idx_data(tmp_path: Path) -> None:
    """A tiny grid on IDX data given by $PERMK_DATA: files, constants, figures."""
    d = idx_data(tmp_path, 200)
    out = tmp_path / "out"
    r = run_cli("autoencoder", "--workers", "10", "--p-hat", "0", "1", "--lam", "0.001", "--encoding", "3", "--rounds", "60",
                "--max-multipliers", "2", "--jobs", "2", "--no-progress", "--out", str(out), env={"PERMK_DATA": str(d)})
    assert r.returncode == 0, r.stderr
    root = out / "autoencoder"
    files = sorted((root / "runs").glob("*.jsonl"))
    assert [f.stem for f in files] == ["lam0.001_p0", "lam0.001_p1"]
    from permk.experiments.results import read_records

    recs = read_records(files[0])
    assert {x["method"] for x in recs} == {"marina-permk", "marina-randk", "ef21-topk"}
    c = recs[0]["constants"]
    assert c["data"].endswith("train-images-idx3-ubyte.gz") and c["n_images"] == 200 and c["L_minus"] > 0 and "power iteration" in c["how"]
    assert all(x["params"]["gamma"] > 0 and x["summary"]["grad_norm_sq_0"] > 0 for x in recs)
    assert sorted(f.name for f in (root / "figures").iterdir()) == [
        "autoencoder_best.png", "autoencoder_steps_ef21-topk_vs_marina-permk.png", "autoencoder_steps_marina-randk_vs_marina-permk.png"]
    assert (root / "figures" / "autoencoder_best.png").stat().st_size > 10_000
    # the figures say what ran: 200 images of 8×8 pixels, 10 workers, d = 2·64·3, and each γ
    from permk.experiments.plotting import experiment_figures

    for _, fig in experiment_figures(root):
        assert "linear autoencoder on 200 images (data/train-images-idx3-ubyte.gz), n = 10 workers, d = 384" in fig.get_suptitle()
        panels = [ax for ax in fig.axes if ax.axison]
        assert sorted(ax.get_title() for ax in panels) == ["λ = 0.001, p̂ = 0", "λ = 0.001, p̂ = 1"]
        for ax in panels:
            for t in ax.get_legend().get_texts():
                # (a note in parentheses where the curve needs one: a run that ends before the axis does)
                assert re.fullmatch(r"(MARINA|EF21) \+ (PermK|RandK|TopK), γ = \d+ × theory = [\d.e-]+( \(.*\))?", t.get_text(),
                                    flags=re.S), t.get_text()


@pytest.mark.parametrize("constants, names", [
    (["--L-minus", "1", "--L-plus", "1", "--L-pm", "1", "--eps", "1e-320", "--delta0", "1e308"], "rounds .*beyond float64 .*eps = "),
    (["--L-minus", "1e308", "--L-plus", "1e308", "--L-pm", "1e308", "--eps", "1", "--delta0", "1"], "L_plus = 1e\\+308"),
    (["--L-minus", "1e-320", "--L-plus", "1e-320", "--L-pm", "1e-320", "--eps", "1", "--delta0", "1"], "L_minus = 9.99989e-321"),
])
def test_complexity_beyond_float64_is_a_usage_error(constants: list[str], names: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Rounds or steps beyond float64: exit 2 with one line naming the values (it was a traceback,
    OverflowError, or a table with step inf and 0 rounds)."""
    assert main(["complexity", "--n", "3", "--d", "5", *constants]) == 2
    out = capsys.readouterr()
    assert out.out == "" and re.search(f"^permk complexity: error: .*{names}", out.err), out.err


def test_demo_seed_is_checked_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["demo", "--seed", "-1"])
    assert e.value.code == 2
    assert "argument --seed: must be a non-negative integer, got -1" in capsys.readouterr().err
