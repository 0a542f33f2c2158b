"""Figures of the experiments, rebuilt from the result files alone (``permk plot DIR``).

The layout is the paper's: one panel per cell (quadratic: rows = number of workers n, columns =
noise scale s, with the resulting ``L±`` in the panel's title; autoencoder: rows = λ, columns =
p̂), the x-axis the bits sent per worker, the y-axis ``‖∇f(x^t)‖²`` on a log scale, a dotted
line at the target ``tol·‖∇f(x⁰)‖²`` that sets the cell's bits budget (the x range; see
:mod:`permk.experiments.search`). Everything a reader needs is written on the figure: the run's
own ``d``, ``n`` and λ (taken from the records, never assumed), the methods as ``MARINA + PermK``
(:attr:`Spec.label <permk.experiments.specs.Spec.label>`, from the method's and the
compressor's names), and each step as ``γ = 8 × theory`` (the autoencoder's legends also give
γ itself).

An experiment whose records describe their own figure (a ``"figure"`` entry: the problem line
of the title, each panel's title, how to read the panels; ``permk classify``) is drawn with that
text; when it asks for ``oracle_axis``, ``<experiment>_best_oracle_calls`` draws the same best
runs against the gradient-oracle calls per worker (the runs' ``oracle_calls``).

``<experiment>_best`` has one curve per method (its best step,
:func:`permk.experiments.search.best_runs`); ``<experiment>_steps_<METHOD-COMPRESSOR>_vs_<first>``
has every non-diverged step of one method and of the grid's first method (the appendix's full
grids), one file per method–compressor pair. Figures are PNG, and PDF on request. Colours and
line styles follow the order of the methods in the grid (PermK blue, EF21 green, RandK red by
default), so any ``METHOD-COMPRESSOR`` the experiments run is drawn without a table to edit.
Only :class:`matplotlib.figure.Figure` is used (the Agg canvas; no pyplot, no display), imported
when a figure is drawn.

:func:`complexity_plot` draws the predicted communication of the methods against ``L±``
(``permk complexity --plot``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .results import iter_result_files, read_json, read_records
from .grid import is_writer
from .search import best_runs, cell_budget
from .specs import METHODS, Spec

__all__ = ["plot_experiment", "plot_grid", "experiment_figures", "load_experiment", "complexity_plot", "DPI"]

#: (colour, colour map, line style) of the methods, in the order they appear in a grid.
STYLES = [("tab:blue", "Blues", "-"), ("tab:green", "Greens", "-."), ("tab:red", "Reds", "--"),
          ("tab:purple", "Purples", ":"), ("tab:orange", "Oranges", (0, (5, 1))), ("tab:brown", "YlOrBr", (0, (3, 1, 1, 1))),
          ("tab:gray", "Greys", (0, (1, 1)))]

#: Resolution of the PNG files (the figures are sized in inches for it: ~1000 px wide for 2
#: columns of panels).
DPI = 100


def load_experiment(root: str | Path) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """The config (``config.json``, if any) and the run records of an experiment directory,
    grouped by cell id."""
    root = Path(root)
    cfg: dict[str, Any] = {}
    if (root / "config.json").exists():
        cfg = read_json(root / "config.json")
    cells: dict[str, list[dict[str, Any]]] = defaultdict(list)
    files = list(iter_result_files(root))
    if not files:
        raise FileNotFoundError(f"no result files (*.jsonl) under {root}: run `permk quadratic|autoencoder|classify --out ...` first")
    for f in files:
        for r in read_records(f):
            if r.get("kind") == "run":
                cells[r["cell"]["id"]].append(r)
    return cfg, dict(cells)


def _budget_factor(cfg: dict[str, Any], recs: Sequence[dict[str, Any]]) -> float:
    if recs:
        return float(recs[0]["options"]["budget_factor"])
    return float(cfg.get("options", {}).get("budget_factor", 2.0))


def _is_quadratic(rec: dict[str, Any]) -> bool:
    return str(rec["experiment"]).startswith("quadratic")


def method_label(key: str, fallback: str | None = None) -> str:
    """The legend name of ``METHOD-COMPRESSOR`` (``"MARINA + PermK"``: :attr:`Spec.label`); a
    key no catalog knows (e.g. a plugin's, not loaded) keeps ``fallback`` (the label in its records)."""
    try:
        return Spec.parse(key).label
    except ValueError:
        return fallback or key


def step_label(rec: dict[str, Any]) -> str:
    """The step of a run in words: ``γ = 8 × theory`` (the theory's step for the method and
    cell, times the run's multiplier); the autoencoder's also gives γ itself, and a step the user
    set with ``--gamma`` reads ``γ = 0.005 (0.5 × --gamma)``."""
    mult = float(rec["multiplier"])
    gamma = float(rec["params"]["gamma"])
    if _is_quadratic(rec):
        return f"γ = {mult:g} × theory"
    if str(rec.get("constants", {}).get("how", "")).startswith("user"):
        return f"γ = {gamma:.2g} ({mult:g} × --gamma)"
    return f"γ = {mult:g} × theory = {gamma:.2g}"


def _panel_title(rec: dict[str, Any]) -> str:
    c = rec["cell"]
    if "figure" in rec:  # an experiment that describes its own panels (permk classify)
        return str(rec["figure"]["panel"])
    if _is_quadratic(rec):
        return f"n = {c['n']:,} workers, noise scale s = {c['noise_scale']:g}, L± = {rec['constants']['L_pm']:.2g}"
    return f"λ = {c['lam']:g}, p̂ = {c['p_hat']:g}"


def _data_name(source: str) -> str:
    """A short name of the data an autoencoder run read: the parenthesised description the
    loader gives, else the file's folder and name."""
    if source.endswith(")") and " (" in source:
        return source[source.rindex(" (") + 2 : -1]
    return "/".join(Path(source).parts[-2:])


def _dims(recs: Sequence[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """The distinct dimensions d and numbers of workers n of the runs (from their records)."""
    ds = sorted({int(r["params"].get("d", r["cell"].get("d", 0))) for r in recs})
    ns = sorted({int(r["cell"]["n"]) for r in recs})
    return ds, ns


def _caption(what: str, cells: dict[str, list[dict[str, Any]]], factor: float) -> tuple[str, str]:
    """The figure's title (what it shows, on which problem, with the run's own d, n and λ) and
    the caption under it (how to read the panels and the x range)."""
    recs = [x for rs in cells.values() for x in rs]
    rec = recs[0]
    ds, ns = _dims(recs)
    d_txt = ", ".join(f"{d:,}" for d in ds)
    target = f"‖∇f‖² ≤ {float(rec['options']['tol']):g}·‖∇f(x⁰)‖² (dotted line)"
    reached = [any(x["summary"].get("reached_target") and not x["summary"].get("diverged") for x in rs) for rs in cells.values()]
    opts = rec.get("options", {})
    if opts.get("horizon", "budget") == "rounds":
        budget = "x axis up to the most bits any run sent: every run has a fixed number of rounds (the authors' protocol)."
        if opts.get("best", "budget") == "last90":
            budget += " Best step: the smallest mean log₁₀‖∇f‖² over the last 90% of the rounds."
    elif not any(reached):
        budget = f"x axis up to the most bits any run sent: no run reached {target}."
    else:
        budget = (f"x axis up to {factor:g} × the fewest bits any run needed to reach {target}, "
                  "or to the end of the longest run where that comes first"
                  + ("." if all(reached) else "; in panels where none reached it, the most bits any run sent."))
    if "figure" in rec:
        head, how = f"{what}\n{rec['figure']['problem']}", str(rec["figure"]["how"])
    elif _is_quadratic(rec):
        lams = sorted({float(r["cell"]["lam"]) for r in recs})
        pl = ", step sizes of the PL theorems" if str(rec["experiment"]).endswith("-pl") else ""
        head = f"{what}\nsynthetic quadratics, d = {d_txt}, λ = {', '.join(f'{v:g}' for v in lams)}{pl}"
        how = ("Panels: n workers whose functions differ by noise scale s (L± = square root of their Hessian variance; "
               "0: identical workers). γ: step size, a multiple of the theory's for the method and panel.")
    else:
        c = rec["constants"]
        data = _data_name(str(c.get("data", "")))
        head = (f"{what}\nlinear autoencoder on {int(c.get('n_images', 0)):,} images ({data}), "
                f"n = {', '.join(f'{n:,}' for n in ns)} workers, d = {d_txt}")
        how = ("Panels: λ = regularisation, p̂ = probability that a worker holds the shared data split (1: identical workers). "
               "γ: step size, a multiple of the theory's (from estimated smoothness constants).")
    return head, f"{how} {budget}"


def _power_of_ten(v: float, _pos: Any = None) -> str:
    """A log axis's tick label as ``10⁻⁴`` in plain text (matplotlib's default typesets each
    one with mathtext, a third of the cost of drawing a figure)."""
    if v <= 0 or not math.isfinite(v):
        return ""
    e = math.log10(v)
    if abs(e - round(e)) > 1e-9:
        return ""
    return "10" + str(int(round(e))).translate(_SUPERSCRIPT)


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


#: The x axes a figure can have: the curve's array and the axis label.
X_AXES = {"bits": ("bits", "bits sent per worker"), "oracle_calls": ("oracle_calls", "gradient-oracle calls per worker (sample gradients)")}


def _curve(rec: dict[str, Any], budget: float, x: str = "bits") -> tuple[np.ndarray, np.ndarray]:
    """The part of a run's curve within the cell's bits budget, against the x axis ``x``
    (:data:`X_AXES`)."""
    b = np.asarray(rec["curve"]["bits"], dtype=float)
    g = np.asarray(rec["curve"]["grad_norm_sq"], dtype=float)
    keep = b <= budget * (1 + 1e-9)
    # keep the first point past the budget so the curve reaches the right edge
    past = np.nonzero(~keep)[0]
    if len(past):
        keep[past[0]] = True
    return np.asarray(rec["curve"][X_AXES[x][0]], dtype=float)[keep], g[keep]


def _grid(cells: dict[str, list[dict[str, Any]]]) -> tuple[int, int, dict[str, tuple[int, int]]]:
    pos = {cid: (int(recs[0]["cell"]["row"]), int(recs[0]["cell"]["col"])) for cid, recs in cells.items() if recs}
    rows = sorted({p[0] for p in pos.values()})
    cols = sorted({p[1] for p in pos.values()})
    remap = {cid: (rows.index(r), cols.index(c)) for cid, (r, c) in pos.items()}
    return len(rows), len(cols), remap


#: The figures' layout, in inches: a panel's size, the room above a panel (its title) and under
#: it (tick labels and x label; its legend adds a line per curve), the margins.
PANEL_W, PANEL_H, TITLE_H, XLABEL_H, LINE_H = 3.8, 2.0, 0.32, 0.42, 0.155
LEFT, RIGHT, GAP_W = 0.75, 0.25, 0.6


def _figure(cells: dict[str, list[dict[str, Any]]], cfg: dict[str, Any], methods: Sequence[str], best_only: bool, what: str,
            styles: dict[str, tuple[Any, ...]], axis: str = "bits") -> Any:
    import textwrap

    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter, FuncFormatter, NullLocator

    nr, nc, pos = _grid(cells)
    head, caption = _caption(what, cells, _budget_factor(cfg, [x for recs in cells.values() for x in recs]))
    # fixed margins computed here, not by tight_layout (which draws the figure once more)
    width = LEFT + RIGHT + nc * PANEL_W + (nc - 1) * GAP_W
    # a one-panel figure is narrow: its title lines wrap, as the caption does
    head = "\n".join(textwrap.fill(line, width=int(width * 72 / (0.56 * 10))) for line in head.split("\n"))
    caption_lines = textwrap.wrap(caption, width=int(width * 72 / (0.56 * 8)))
    top = 0.2 + 0.2 * (head.count("\n") + 1) + LINE_H * 1.05 * len(caption_lines) + 0.1
    entries = max(len(methods) if best_only else sum(1 for x in recs if x["method"] in methods) + 1 for recs in cells.values())
    below = XLABEL_H + LINE_H * entries + 0.2
    height = top + nr * (TITLE_H + PANEL_H + below)
    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(left=LEFT / width, right=1 - RIGHT / width, top=1 - (top + TITLE_H) / height, bottom=below / height,
                        wspace=GAP_W / PANEL_W, hspace=(below + TITLE_H) / PANEL_H)
    axes = fig.subplots(nr, nc, squeeze=False)
    for ax in axes.flat:  # a cell the grid left out (``--quick``) stays an empty, labelled space
        ax.set_axis_off()
        ax.text(0.5, 0.5, "left out of this grid", ha="center", va="center", fontsize=9, color="0.5", transform=ax.transAxes)
    for cid, recs in cells.items():
        r, c = pos[cid]
        ax = axes[r][c]
        ax.texts[0].remove()
        ax.set_axis_on()
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
            base, cmap_name, ls = styles[m]
            cmap = matplotlib.colormaps[cmap_name]
            name = method_label(m, mine[0].get("label"))
            for k, rec in enumerate(mine):
                b, g = _curve(rec, budget, axis)
                color = base if best_only or len(mine) == 1 else cmap(0.95 - 0.5 * k / max(1, len(mine) - 1))
                # steps: a round's bits are paid before its ‖∇f‖² is seen (MARINA's full-gradient
                # rounds show as long flat steps of d floats)
                ax.plot(b, g, linestyle=ls, color=color, lw=1.4 if best_only else 1.0, label=f"{name}, {step_label(rec)}",
                        drawstyle="steps-post")
        target = float(recs[0]["options"]["tol"]) * float(recs[0]["summary"]["grad_norm_sq_0"] or 0.0)
        if target > 0:
            ax.axhline(target, color="0.35", lw=0.8, linestyle=(0, (1, 2)), zorder=0)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(_power_of_ten))
        # major ticks only: minor log ticks (up to ~80 per axis) multiply the cost of laying out
        # and drawing a figure ~3x and carry no labels here
        ax.yaxis.set_minor_locator(NullLocator())
        # the budget, or the end of the longest run drawn where that comes first (no empty stretch)
        if axis == "bits":
            reach = max((float(r["summary"]["bits_sent"]) for r in chosen), default=budget)
            shown = min(budget, reach) if reach > 0 else budget
        else:
            shown = max((float(_curve(r, budget, axis)[0][-1]) for r in chosen), default=0.0)
        if shown > 0 and math.isfinite(shown):
            ax.set_xlim(0, shown)
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 20k, 1.5M bits: no offset text to miss
        ax.set_title(_panel_title(recs[0]), fontsize=9, y=1.0, pad=5)  # a fixed place: no layout pass to find one
        ax.tick_params(labelsize=8)
        ax.set_xlabel(X_AXES[axis][1], fontsize=8, labelpad=2)
        if c == 0:
            ax.set_ylabel("‖∇f(xᵗ)‖²", fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
        # under the panel, so that it never covers a curve
        ax.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -XLABEL_H / PANEL_H), frameon=False, borderaxespad=0.0,
                  handlelength=2.5, labelspacing=0.3,
                  title=f"{n_div} diverged step{'s' if n_div > 1 else ''} not drawn" if not best_only and n_div else None,
                  title_fontsize=7.5)
    fig.suptitle(head, x=0.5, y=1 - 0.12 / height, ha="center", va="top", fontsize=10)
    fig.text(0.5, 1 - (0.2 + 0.2 * (head.count("\n") + 1)) / height, "\n".join(caption_lines), ha="center", va="top", fontsize=8,
             color="0.25", linespacing=1.3)
    return fig


def experiment_figures(root: str | Path, *, every_step: bool = True) -> list[tuple[str, Any]]:
    """The figures of the experiment in ``root`` (a directory written by ``permk quadratic`` /
    ``permk autoencoder``), not yet written: ``(file stem, matplotlib Figure)`` pairs, the best
    steps first, then (with ``every_step``) one every-step figure per method other than the
    grid's first, against the first."""
    cfg, cells = load_experiment(root)
    name = str(next(iter(cells.values()))[0]["experiment"])
    seen = {r["method"] for recs in cells.values() for r in recs}
    order = [m for m in [*cfg.get("methods", []), *METHODS] if m in seen]
    present = list(dict.fromkeys(order + sorted(seen - set(order))))
    styles = {m: STYLES[k % len(STYLES)] for k, m in enumerate(present)}
    labels = {m: method_label(m) for m in present}
    out = [(f"{name}_best", _figure(cells, cfg, present, True, "The best step of each method", styles))]
    if all("oracle_calls" in r["curve"] and r.get("figure", {}).get("oracle_axis") for recs in cells.values() for r in recs):
        out.append((f"{name}_best_oracle_calls", _figure(cells, cfg, present, True, "The best step of each method (best by bits), "
                                                         "against gradient-oracle calls", styles, axis="oracle_calls")))
    if every_step:
        first = present[0]
        for m in present[1:]:
            what = f"Every step of {labels[first]} and {labels[m]} (diverged ones omitted)"
            out.append((f"{name}_steps_{m}_vs_{first}", _figure(cells, cfg, [first, m], False, what, styles)))
    return out


def plot_grid(root: Path, *, plot: bool, mpi: bool) -> Path:
    """A finished grid's figures (:func:`plot_experiment`), drawn when ``plot`` is set and by the
    process that writes (MPI rank 0); returns the experiment directory ``root``."""
    if plot and is_writer(mpi):
        plot_experiment(root)
    return root


def plot_experiment(root: str | Path, out: str | Path | None = None, *, pdf: bool = False, every_step: bool = True) -> list[Path]:
    """Draw the figures of the experiment in ``root`` (:func:`experiment_figures`) into ``out``
    (default ``root/figures``) as PNG (at :data:`DPI`), and as PDF too with ``pdf``; returns the
    files written."""
    root = Path(root)
    outdir = Path(out) if out is not None else root / "figures"
    outdir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for stem, fig in experiment_figures(root, every_step=every_step):
        for ext in ("png", "pdf") if pdf else ("png",):
            p = outdir / f"{stem}.{ext}"
            fig.savefig(p, dpi=DPI if ext == "png" else None)
            written.append(p)
    return written


def complexity_plot(
    n: int,
    d: int,
    L_minus: float,
    L_plus: float,
    eps: float,
    delta0: float,
    L_pm_grid: Sequence[float],
    out_path: str | Path,
    *,
    mu: float | None = None,
) -> Path:
    """Plot predicted floats per worker to reach ε against ``L_±`` for MARINA+PermK (optimal
    ``p``), MARINA+RandK and EF21+TopK (optimal ``K``; they do not depend on ``L_±``) at the
    given ``(n, d)`` (:func:`permk.theory.complexity`); values of ``L_±`` that the lemma
    bounding the Hessian variance by ``L_−`` and ``L_+`` excludes (``L_±² < L_+² − L_−²`` or ``L_± > L_+``) are shaded. Written with
    matplotlib's Agg canvas (no display needed); returns the path."""
    from matplotlib.figure import Figure

    import permk
    from permk.theory import complexity

    grid = np.asarray(L_pm_grid, dtype=np.float64)
    if grid.ndim != 1 or grid.size == 0 or not np.isfinite(grid).all() or (grid < 0).any():
        raise ValueError("L_pm_grid must be a non-empty 1-D sequence of non-negative finite numbers")
    grid = np.unique(grid)
    kw = dict(n=n, d=d, L_minus=L_minus, L_plus=L_plus, eps=eps, delta0=delta0, mu=mu)
    perm = [complexity(permk.marina, permk.PermK, L_pm=float(v), **kw).floats for v in grid]  # type: ignore[arg-type]
    rand = complexity(permk.marina, permk.RandK, L_pm=L_plus, **kw)  # type: ignore[arg-type]
    top = complexity(permk.ef21, permk.TopK, L_pm=L_plus, **kw)  # type: ignore[arg-type]
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.add_subplot()
    ax.plot(grid, perm, "o-", label="MARINA + PermK (optimal p)")
    ax.plot(grid, np.full(grid.size, rand.floats), "--", label=f"MARINA + RandK (K={rand.K}, optimal p)")
    ax.plot(grid, np.full(grid.size, top.floats), ":", label=f"EF21 + TopK (K={top.K})")
    low = math.sqrt(max(L_plus**2 - L_minus**2, 0.0))
    if grid[0] < low:
        ax.axvspan(grid[0], low, color="0.88", label="excluded by Lemma: L±² ≥ L+² − L−²")
    if grid[-1] > L_plus:
        ax.axvspan(L_plus, grid[-1], color="0.75", label="excluded by Lemma: L± ≤ L+")
    positive = grid[grid > 0]
    if (grid == 0).any():
        ax.set_xscale("symlog", linthresh=float(positive[0]) if positive.size else 1.0)
    else:
        ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("L± (square root of the Hessian variance)")
    ax.set_ylabel("floats per worker to reach ε")
    regime = f"PL, μ={mu:g}" if mu is not None else "nonconvex"
    ax.set_title(f"n={n}, d={d}, L−={L_minus:g}, L+={L_plus:g}, ε={eps:g}, Δ⁰={delta0:g} ({regime})", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    out = Path(out_path)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    return out
