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
from typing import Any, NamedTuple, Sequence

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


def _panel_title(rec: dict[str, Any], short: bool = False) -> str:
    """A panel's title: its cell (``short``: in symbols only, for a grid of many columns)."""
    c = rec["cell"]
    if "figure" in rec:  # an experiment that describes its own panels (permk classify)
        return str(rec["figure"]["panel"])
    if _is_quadratic(rec):
        if short:
            return f"n = {c['n']:,}, s = {c['noise_scale']:g}, L± = {rec['constants']['L_pm']:.2g}"
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


def _caption(what: str, cells: dict[str, list[dict[str, Any]]], factor: float, axis: str = "bits",
             drawn: Sequence[dict[str, Any]] = ()) -> tuple[str, str]:
    """The figure's title (what it shows, on which problem, with the run's own d, n and λ) and
    the caption under it (how to read the panels, the x range, and the flat steps of the runs
    that send whole vectors in some rounds, among the runs ``drawn``)."""
    recs = [x for rs in cells.values() for x in rs]
    rec = recs[0]
    ds, ns = _dims(recs)
    d_txt = ", ".join(f"{d:,}" for d in ds)
    target = f"‖∇f‖² ≤ {float(rec['options']['tol']):g}·‖∇f(x⁰)‖² (dotted line)"
    reached = [any(x["summary"].get("reached_target") and not x["summary"].get("diverged") for x in rs) for rs in cells.values()]
    opts = rec.get("options", {})
    if axis != "bits":
        budget = "The runs are those of the figure against bits (each method's best step there), each up to its last round."
    elif opts.get("horizon", "budget") == "rounds":
        budget = "x axis up to the most bits any run sent: every run has a fixed number of rounds (the authors' protocol)."
        if opts.get("best", "budget") == "last90":
            budget += " Best step: the smallest mean log₁₀‖∇f‖² over the last 90% of the rounds."
    elif not any(reached):
        budget = f"x axis up to the most bits any run sent: no run reached {target}."
    else:
        budget = (f"x axis up to {factor:g} × the fewest bits any run needed to reach {target}, "
                  "or to the end of the longest run where that comes first"
                  + ("." if all(reached) else "; in panels where none reached it, the most bits any run sent."))
        if any(uncompressed(x) for x in drawn) and not all(uncompressed(x) for x in drawn):
            budget += " Runs that send whole vectors every round do not stretch it: they are cut at its end."
    if axis == "bits" and any(full_vector_rounds(x) for x in drawn):
        budget += (" Flat steps: rounds in which every worker sends its whole vector, d values (MARINA's full-gradient "
                   "rounds, each round with probability p), paid before the next ‖∇f‖² is drawn.")
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
               "γ: step size, a multiple of the theory's (from estimated smoothness constants). The rise in the first "
               "rounds is the landscape's, not the steps': the iterates pass a saddle point of the nonconvex f "
               "(gradient descent at its theory step 1/L− rises there too).")
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


#: The x axes a figure can have: the curve's array, the axis label, and whether the axis is
#: logarithmic (oracle calls: a minibatch method makes ``b`` calls a round, a full-gradient one
#: every sample of its shard, orders of magnitude apart).
X_AXES = {"bits": ("bits", "bits sent per worker", False),
          "oracle_calls": ("oracle_calls", "gradient-oracle calls per worker (sample gradients, log scale)", True)}


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


def _full_vector_bits(rec: dict[str, Any]) -> float:
    """The bits of one worker's whole vector, ``d`` values (0 when the record does not say)."""
    p = rec.get("params", {})
    return float(p.get("d", rec["cell"].get("d", 0)) or 0) * float(p.get("float_bits", rec.get("options", {}).get("float_bits", 32)))


def uncompressed(rec: dict[str, Any]) -> bool:
    """Whether a run sent whole vectors every round (SGD, GD, a method with Identity): its bits
    grow ``d`` values a round, far past the compressed methods' in a figure against bits."""
    full = _full_vector_bits(rec)
    rounds = int(rec["summary"].get("rounds_run", 0))
    return full > 0 and rounds > 0 and float(rec["summary"]["bits_sent"]) >= 0.999 * rounds * full


def full_vector_rounds(rec: dict[str, Any]) -> bool:
    """Whether a compressed run has rounds in which a worker sends its whole vector (MARINA's
    full-gradient rounds): its curve is flat across each (the round's bits are paid before its
    ``‖∇f‖²`` is drawn)."""
    full = _full_vector_bits(rec)
    if full <= 0 or uncompressed(rec):
        return False
    b = np.asarray(rec["curve"]["bits"], dtype=float)
    r = np.asarray(rec["curve"].get("round", np.arange(len(b))), dtype=float)
    db, dr = np.diff(b), np.maximum(np.diff(r), 1.0)
    if not len(db):
        return False
    rate = float(np.median(db / dr))  # a compressed round's bits (the curve's points may be rounds apart)
    return bool(np.any(db - (dr - 1) * rate >= 0.9 * full))


def _bits(v: float) -> str:
    """Bits in words: ``6.5 Mbit``, ``34 kbit``."""
    for unit, scale in (("Gbit", 1e9), ("Mbit", 1e6), ("kbit", 1e3)):
        if v >= scale:
            return f"{v / scale:.2g} {unit}" if v < 10 * scale else f"{v / scale:.0f} {unit}"
    return f"{v:.0f} bit"


def _grid(cells: dict[str, list[dict[str, Any]]]) -> tuple[int, int, dict[str, tuple[int, int]]]:
    pos = {cid: (int(recs[0]["cell"]["row"]), int(recs[0]["cell"]["col"])) for cid, recs in cells.items() if recs}
    rows = sorted({p[0] for p in pos.values()})
    cols = sorted({p[1] for p in pos.values()})
    remap = {cid: (rows.index(r), cols.index(c)) for cid, (r, c) in pos.items()}
    return len(rows), len(cols), remap


def _missing_cell(cfg: dict[str, Any], cells: dict[str, list[dict[str, Any]]], r: int, c: int) -> str:
    """What an empty panel says: which cell of the grid it is and why it was not run."""
    ns, scales = cfg.get("ns"), cfg.get("noise_scales")
    rows = sorted({int(recs[0]["cell"]["row"]) for recs in cells.values()})
    cols = sorted({int(recs[0]["cell"]["col"]) for recs in cells.values()})
    if ns and scales and rows[r] < len(ns) and cols[c] < len(scales):
        n, s = sorted(ns)[rows[r]], scales[cols[c]]
        skipped = f"n{n}_s{s:g}" in cfg.get("skip", ())
        why = ("the grid skips this cell, as --quick does;\n`permk quadratic` without --quick runs it" if skipped
               else "not in this grid's results")
        return f"n = {n:,}, s = {s:g}: not run\n({why})"
    return "this cell was not run\n(not in this grid's results)"


#: The figures' layout, in inches: a panel's size, the room above a panel (its title) and under
#: it (tick labels and x label; its legend adds a line per curve), the margins; a figure of one
#: column has its legend at the right of its panels (LEGEND_W), and a larger panel.
PANEL_W, PANEL_H, TITLE_H, XLABEL_H, LINE_H = 3.8, 2.0, 0.32, 0.42, 0.155
LEFT, RIGHT, GAP_W = 0.75, 0.25, 0.6
SOLO_W, SOLO_H, LEGEND_W = 4.6, 2.8, 3.4
#: The width, in inches, at which the figures' text has its nominal size: a wider figure (a grid
#: of many columns, shown scaled down to a page's width) has its text enlarged in proportion,
#: up to FONT_SCALE_MAX times, so that the ticks stay readable on the page.
READ_W, FONT_SCALE_MAX = 10.5, 1.5


def _wrap(label: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(label, width=width, break_on_hyphens=False, break_long_words=False, subsequent_indent="  "))


class _Series(NamedTuple):
    x: np.ndarray
    y: np.ndarray
    label: str
    color: Any
    style: Any
    width: float
    alpha: float = 1.0
    legend: bool = True


#: A curve whose ``‖∇f‖²`` turns (from falling to rising or back) between more than this share of
#: its consecutive points is drawn as its running geometric mean (:func:`_smooth`), every point
#: faint behind it.
NOISY = 0.3


def _noisy(y: np.ndarray) -> bool:
    """Whether a curve goes up and down (minibatch SGD's ``‖∇f(xᵗ)‖²``), not steadily down or up."""
    d = np.diff(np.log10(np.maximum(y, np.finfo(float).tiny)))
    sign = np.sign(d[np.abs(d) > 1e-12])
    return len(sign) >= 20 and float(np.mean(sign[1:] != sign[:-1])) > NOISY


def _smooth(y: np.ndarray) -> tuple[np.ndarray, int]:
    """The running geometric mean of ``y`` over its last ``w`` points (fewer at the start) and
    ``w``: a twentieth of the curve, at least 5 points."""
    w = max(5, len(y) // 20)
    logs = np.log10(np.maximum(y, np.finfo(float).tiny))
    c = np.concatenate(([0.0], np.cumsum(logs)))
    i = np.arange(1, len(y) + 1)
    lo = np.maximum(0, i - w)
    return 10 ** ((c[i] - c[lo]) / (i - lo)), w


class _Panel(NamedTuple):
    recs: list[dict[str, Any]]
    runs: list[dict[str, Any]]  # the runs drawn
    series: list[_Series]
    shown: float  # the x axis' end
    low: float  # the x axis' start (a log axis: the smallest positive x drawn)
    n_div: int


def _panel(recs: list[dict[str, Any]], cfg: dict[str, Any], methods: Sequence[str], best_only: bool,
           styles: dict[str, tuple[Any, ...]], axis: str) -> _Panel:
    """What one panel draws: its curves with their legend labels, and its x range."""
    import matplotlib

    factor = _budget_factor(cfg, recs)
    budget = cell_budget(recs, factor)
    if best_only:
        best = best_runs(recs, factor)
        chosen = [best[m] for m in methods if m in best]
    else:
        chosen = [x for x in recs if x["method"] in methods and not x["summary"].get("diverged")]
    n_div = sum(1 for x in recs if x["method"] in methods and x["summary"].get("diverged"))
    # the x range: the budget, or the end of the longest run drawn where that comes first (no
    # empty stretch); runs that send whole vectors every round (SGD) do not stretch it when
    # compressed runs are drawn: they are cut at its end, and their legend says so
    compressed = [x for x in chosen if not uncompressed(x)] or chosen
    curves = {id(x): _curve(x, budget, axis) for x in chosen}
    if axis == "bits":
        reach = max((float(x["summary"]["bits_sent"]) for x in compressed), default=budget)
        shown = min(budget, reach) if reach > 0 else budget
    else:
        shown = max((float(curves[id(x)][0][-1]) for x in chosen), default=0.0)
    low = min((float(np.min(curves[id(x)][0], where=curves[id(x)][0] > 0, initial=np.inf)) for x in chosen), default=np.inf)
    series: list[_Series] = []
    for m in methods:
        mine = sorted([x for x in chosen if x["method"] == m], key=lambda x: -x["multiplier"])
        if not mine:
            continue
        base, cmap_name, ls = styles[m]
        cmap = matplotlib.colormaps[cmap_name]
        name = method_label(m, mine[0].get("label"))
        for j, rec in enumerate(mine):
            b, g = curves[id(rec)]
            color = base if best_only or len(mine) == 1 else cmap(0.95 - 0.5 * j / max(1, len(mine) - 1))
            label = f"{name}, {step_label(rec)}"
            notes = []
            same = next((t for t in series if t.legend and len(t.x) == len(b) and np.array_equal(t.x, b) and np.array_equal(t.y, g)),
                        None)
            if same is not None:
                notes.append(f"the same iterates as {same.label.partition(',')[0] if best_only else same.label}: drawn over it")
            end = float(rec["summary"]["bits_sent"])
            if axis == "bits" and uncompressed(rec) and end > shown * (1 + 1e-9):
                notes.append(f"whole vectors every round: cut here, runs on to {_bits(min(end, budget))}")
            elif axis == "bits" and full_vector_rounds(rec) and _full_vector_bits(rec) >= 0.1 * shown:
                notes.append("flat steps: its full-gradient rounds")
            if axis == "bits" and rec["summary"].get("stopped_by") == "max_rounds" and end < 0.97 * shown:
                notes.append(f"its {int(rec['summary']['rounds_run']):,} rounds end here")
            style, lw = ((0, (4, 3)) if same is not None else ls), (1.6 if best_only else 1.0) * (1.0 if same is None else 1.2)
            if _noisy(g):  # every point faint, their running geometric mean on top
                series.append(_Series(b, g, "", color, "-", 0.6, alpha=0.3, legend=False))
                g, w = _smooth(g)
                notes.append(f"smoothed over {w} points, each point faint")
            full = f"{label} ({'; '.join(notes)})" if notes else label
            series.append(_Series(b, g, full, color, style, lw))
    return _Panel(recs, chosen, series, shown, low, n_div)


def _figure(cells: dict[str, list[dict[str, Any]]], cfg: dict[str, Any], methods: Sequence[str], best_only: bool, what: str,
            styles: dict[str, tuple[Any, ...]], axis: str = "bits") -> Any:
    import textwrap

    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter, FuncFormatter, MaxNLocator, NullLocator

    nr, nc, pos = _grid(cells)
    panels = {cid: _panel(recs, cfg, methods, best_only, styles, axis) for cid, recs in cells.items()}
    head, caption = _caption(what, cells, _budget_factor(cfg, [x for recs in cells.values() for x in recs]), axis,
                             [x for p in panels.values() for x in p.runs])
    side = nc == 1  # one column: the legend at the right of the panel
    panel_w, panel_h = (SOLO_W, SOLO_H) if side else (PANEL_W, PANEL_H)
    width0 = LEFT + RIGHT + nc * panel_w + (nc - 1) * GAP_W + (LEGEND_W if side else 0.0)
    k = min(FONT_SCALE_MAX, max(1.0, width0 / READ_W))  # the text's scale (a wide grid's)
    title_h, xlabel_h, line_h, gap_w, legend_w = TITLE_H * k, XLABEL_H * k, LINE_H * k, GAP_W * k, LEGEND_W * k
    width = LEFT * k + RIGHT + nc * panel_w + (nc - 1) * gap_w + (legend_w if side else 0.0)
    # the legend's labels wrap at its width
    chars = int(((LEGEND_W if side else panel_w) - 0.55 * k) * 72 / (0.5 * 7.5 * k))
    labels = {cid: [_wrap(t.label, chars) if t.legend else "_nolegend_" for t in p.series] for cid, p in panels.items()}
    lines = max((sum(lab.count("\n") + 1 for lab in labs if lab != "_nolegend_") + (1 if panels[cid].n_div and not best_only else 0)
                 for cid, labs in labels.items()), default=1)
    # fixed margins computed here, not by tight_layout (which draws the figure once more); the
    # title's and caption's lines wrap at the figure's width, never inside a word or a file name
    head = "\n".join(textwrap.fill(line, width=int(width * 72 / (0.56 * 10 * k)), break_on_hyphens=False, break_long_words=False)
                     for line in head.split("\n"))
    caption_lines = textwrap.wrap(caption, width=int(width * 72 / (0.56 * 8 * k)), break_on_hyphens=False, break_long_words=False)
    top = 0.2 * k + 0.2 * k * (head.count("\n") + 1) + line_h * 1.05 * len(caption_lines) + 0.1 * k
    below = xlabel_h + 0.2 * k + (0.0 if side else line_h * lines)
    if side:
        panel_h = max(panel_h, line_h * lines * 1.1)
    height = top + nr * (title_h + panel_h + below)
    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(left=LEFT * k / width, right=1 - (RIGHT + (legend_w if side else 0.0)) / width,
                        top=1 - (top + title_h) / height, bottom=below / height,
                        wspace=gap_w / panel_w, hspace=(below + title_h) / panel_h)
    axes = fig.subplots(nr, nc, squeeze=False)
    for r, row in enumerate(axes):  # a cell the grid left out stays an empty space that says which and why
        for c, ax in enumerate(row):
            ax.set_axis_off()
            ax.text(0.5, 0.5, _missing_cell(cfg, cells, r, c), ha="center", va="center", fontsize=8.5 * k, color="0.4",
                    transform=ax.transAxes, linespacing=1.4)
    log_x = X_AXES[axis][2]
    for cid, p in panels.items():
        r, c = pos[cid]
        ax = axes[r][c]
        ax.texts[0].remove()
        ax.set_axis_on()
        for t, label in zip(p.series, labels[cid]):
            keep = t.x > 0 if log_x else slice(None)
            # steps: a round's bits are paid before its ‖∇f‖² is seen (MARINA's full-gradient
            # rounds show as long flat steps of d values)
            ax.plot(t.x[keep], t.y[keep], linestyle=t.style, color=t.color, lw=t.width, alpha=t.alpha, label=label,
                    drawstyle="steps-post")
        target = float(p.recs[0]["options"]["tol"]) * float(p.recs[0]["summary"]["grad_norm_sq_0"] or 0.0)
        if target > 0:
            ax.axhline(target, color="0.35", lw=0.8, linestyle=(0, (1, 2)), zorder=0)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(_power_of_ten))
        # major ticks only: minor log ticks (up to ~80 per axis) multiply the cost of laying out
        # and drawing a figure ~3x and carry no labels here
        ax.yaxis.set_minor_locator(NullLocator())
        if log_x:
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(FuncFormatter(_power_of_ten))
            ax.xaxis.set_minor_locator(NullLocator())
            if 0 < p.low < p.shown < math.inf:
                ax.set_xlim(p.low, p.shown)
        else:
            if p.shown > 0 and math.isfinite(p.shown):
                ax.set_xlim(0, p.shown)
            ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 20k, 1.5M bits: no offset text to miss
            ax.xaxis.set_major_locator(MaxNLocator(5 if side or nc <= 2 else 4 if k == 1 else 3))
        # a fixed place: no layout pass to find one
        ax.set_title(_panel_title(p.recs[0], short=k > 1 or nc >= 4), fontsize=9 * k, y=1.0, pad=5 * k)
        ax.tick_params(labelsize=8 * k)
        ax.set_xlabel(X_AXES[axis][1], fontsize=8 * k, labelpad=2)
        if c == 0:
            ax.set_ylabel("‖∇f(xᵗ)‖²", fontsize=9 * k)
        ax.grid(True, which="major", alpha=0.3)
        title = f"{p.n_div} diverged step{'s' if p.n_div > 1 else ''} not drawn" if not best_only and p.n_div else None
        if side:  # at the right of the panel
            ax.legend(fontsize=7.5 * k, loc="upper left", bbox_to_anchor=(1.03, 1.0), frameon=False, borderaxespad=0.0,
                      handlelength=2.5, labelspacing=0.5, title=title, title_fontsize=7.5 * k, alignment="left")
        else:  # under the panel, so that it never covers a curve
            ax.legend(fontsize=7.5 * k, loc="upper center", bbox_to_anchor=(0.5, -xlabel_h / panel_h), frameon=False,
                      borderaxespad=0.0, handlelength=2.5, labelspacing=0.3, title=title, title_fontsize=7.5 * k)
    fig.suptitle(head, x=0.5, y=1 - 0.12 * k / height, ha="center", va="top", fontsize=10 * k)
    fig.text(0.5, 1 - (0.2 * k + 0.2 * k * (head.count("\n") + 1)) / height, "\n".join(caption_lines), ha="center", va="top",
             fontsize=8 * k, color="0.25", linespacing=1.3)
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
        out.append((f"{name}_best_oracle_calls", _figure(cells, cfg, present, True, "The same runs against gradient-oracle calls",
                                                         styles, axis="oracle_calls")))
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
