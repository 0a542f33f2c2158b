"""Figures of the experiments, rebuilt from the result files alone (``permk plot DIR``).

The layout is the paper's: one subplot per cell (quadratic: rows = n, columns = noise scale,
with the computed ``L±`` in the title; autoencoder: rows = λ, columns = p̂), the x-axis the bits
every worker has sent, the y-axis ``‖∇f(x^t)‖²`` on a log scale. ``*_best`` has one curve per
method (its best step, see :func:`permk.experiments.runner.best_runs`, multiplier or step in the
legend); ``*_randk_permk`` and ``*_topk_permk`` have every non-diverged step of two methods (the
appendix's full grids). Each figure is written as PNG and PDF.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .results import iter_result_files, read_records
from .runner import LABELS, METHODS, best_runs, cell_budget

__all__ = ["plot_experiment", "load_experiment"]

COLORS = {"marina-permk": "tab:blue", "marina-randk": "tab:red", "ef21-topk": "tab:green"}
CMAPS = {"marina-permk": "Blues", "marina-randk": "Reds", "ef21-topk": "Greens"}


def load_experiment(root: str | Path) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """The config (``config.json``, if any) and the run records of an experiment directory,
    grouped by cell id."""
    import json

    root = Path(root)
    cfg: dict[str, Any] = {}
    if (root / "config.json").exists():
        cfg = json.loads((root / "config.json").read_text())
    cells: dict[str, list[dict[str, Any]]] = defaultdict(list)
    files = list(iter_result_files(root))
    if not files:
        raise FileNotFoundError(f"no result files (*.jsonl) under {root}: run `permk quadratic --out ...` or `permk autoencoder --out ...` first")
    for f in files:
        for r in read_records(f):
            if r.get("kind") == "run":
                cells[r["cell"]["id"]].append(r)
    return cfg, dict(cells)


def _budget_factor(cfg: dict[str, Any], recs: Sequence[dict[str, Any]]) -> float:
    if recs:
        return float(recs[0]["options"]["budget_factor"])
    return float(cfg.get("options", {}).get("budget_factor", 2.0))


def _title(rec: dict[str, Any]) -> str:
    c = rec["cell"]
    if rec["experiment"].startswith("quadratic"):
        return f"n={c['n']}, NS={c['noise_scale']:g}, $L_\\pm$={rec['constants']['L_pm']:.3g}"
    return f"λ={c['lam']:g}, $\\hat p$={c['p_hat']:g}"


def _label(rec: dict[str, Any]) -> str:
    if rec["experiment"].startswith("quadratic"):
        return f"{LABELS[rec['method']]} ×{rec['multiplier']:g}"
    return f"{LABELS[rec['method']]} γ={rec['params']['gamma']:.2g}"


def _curve(rec: dict[str, Any], budget: float) -> tuple[np.ndarray, np.ndarray]:
    b = np.asarray(rec["curve"]["bits"], dtype=float)
    g = np.asarray(rec["curve"]["grad_norm_sq"], dtype=float)
    keep = b <= budget * (1 + 1e-9)
    # keep the first point past the budget so the curve reaches the right edge
    past = np.nonzero(~keep)[0]
    if len(past):
        keep[past[0]] = True
    return b[keep], g[keep]


def _grid(cells: dict[str, list[dict[str, Any]]]) -> tuple[int, int, dict[str, tuple[int, int]]]:
    pos = {cid: (int(recs[0]["cell"]["row"]), int(recs[0]["cell"]["col"])) for cid, recs in cells.items() if recs}
    rows = sorted({p[0] for p in pos.values()})
    cols = sorted({p[1] for p in pos.values()})
    remap = {cid: (rows.index(r), cols.index(c)) for cid, (r, c) in pos.items()}
    return len(rows), len(cols), remap


def _figure(cells: dict[str, list[dict[str, Any]]], cfg: dict[str, Any], methods: Sequence[str], best_only: bool, suptitle: str) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nr, nc, pos = _grid(cells)
    fig, axes = plt.subplots(nr, nc, figsize=(3.4 * nc, 2.7 * nr), squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    for cid, recs in cells.items():
        r, c = pos[cid]
        ax = axes[r][c]
        ax.set_visible(True)
        factor = _budget_factor(cfg, recs)
        budget = cell_budget(recs, factor)
        if best_only:
            best = best_runs(recs, factor)
            chosen = [best[m] for m in methods if m in best]
        else:
            chosen = [x for x in recs if x["method"] in methods and not x["summary"].get("diverged")]
        n_div = sum(1 for x in recs if x["method"] in methods and x["summary"].get("diverged"))
        for m in methods:
            mine = sorted([x for x in chosen if x["method"] == m], key=lambda x: -x["multiplier"])
            if not mine:
                continue
            cmap = matplotlib.colormaps[CMAPS[m]]
            for k, rec in enumerate(mine):
                b, g = _curve(rec, budget)
                color = COLORS[m] if best_only or len(mine) == 1 else cmap(0.95 - 0.6 * k / max(1, len(mine) - 1))
                ls = "-" if m == "marina-permk" else ("--" if m == "marina-randk" else "-.")
                # steps: a round's bits are paid before its ‖∇f‖² is seen (MARINA's full-gradient
                # rounds show as long flat steps of d floats)
                ax.plot(b, g, ls, color=color, lw=1.4 if best_only else 1.0, label=_label(rec), drawstyle="steps-post")
        ax.set_yscale("log")
        if budget > 0 and math.isfinite(budget):
            ax.set_xlim(0, budget)
        ax.set_title(_title(recs[0]), fontsize=8)
        ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
        ax.tick_params(labelsize=7)
        ax.xaxis.get_offset_text().set_fontsize(7)
        if r == nr - 1:
            ax.set_xlabel("#bits / n (sent by every worker)", fontsize=7)
        if c == 0:
            ax.set_ylabel(r"$\|\nabla f(x^t)\|^2$", fontsize=8)
        ax.legend(fontsize=5.5 if not best_only else 6.5, loc="upper right", framealpha=0.7)
        if not best_only and n_div:
            ax.text(0.02, 0.03, f"{n_div} diverged (omitted)", transform=ax.transAxes, fontsize=6, color="gray")
        ax.grid(True, which="major", alpha=0.3)
    fig.suptitle(suptitle, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return fig


def plot_experiment(root: str | Path, out: str | Path | None = None) -> list[Path]:
    """Draw every figure of the experiment in ``root`` (a directory written by ``permk
    quadratic`` / ``permk autoencoder``) into ``out`` (default ``root/figures``); returns the
    files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    root = Path(root)
    cfg, cells = load_experiment(root)
    any_rec = next(iter(cells.values()))[0]
    name = str(any_rec["experiment"])
    outdir = Path(out) if out is not None else root / "figures"
    outdir.mkdir(parents=True, exist_ok=True)
    present = [m for m in METHODS if any(r["method"] == m for recs in cells.values() for r in recs)]
    what = "synthetic quadratic tasks, d = 1000" if name.startswith("quadratic") else "the linear autoencoder (MNIST-format data)"
    pl = " under the PL condition" if name.endswith("-pl") else ""
    figs: list[tuple[str, list[str], bool, str]] = [
        ("best", present, True, f"Best step of each method on {what}{pl}"),
    ]
    if "marina-randk" in present and "marina-permk" in present:
        figs.append(("randk_permk", ["marina-permk", "marina-randk"], False, f"RandK and PermK, every step, on {what}{pl}"))
    if "ef21-topk" in present and "marina-permk" in present:
        figs.append(("topk_permk", ["marina-permk", "ef21-topk"], False, f"TopK (EF21) and PermK, every step, on {what}{pl}"))
    written: list[Path] = []
    for tag, methods, best_only, title in figs:
        fig = _figure(cells, cfg, methods, best_only, title)
        for ext in ("png", "pdf"):
            p = outdir / f"{name}_{tag}.{ext}"
            fig.savefig(p, dpi=110 if ext == "png" else None)
            written.append(p)
        plt.close(fig)
    return written
