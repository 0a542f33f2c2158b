"""The paper's experiments end to end: the synthetic quadratic grid (:mod:`.quadratic`), the
linear autoencoder on MNIST-format data (:mod:`.autoencoder`), the nonconvex classification tasks
(:mod:`.classify`), result files (:mod:`.results`) and figures (:mod:`.plotting`); the problems and
their data readers are :mod:`permk.problems`. What the experiments share: the methods they run and
their steps (:mod:`.specs`), the two protocols (:mod:`.protocols`: permk's and the authors', and
how each method is run), the per-cell search (:mod:`.search`), the grid of cells (:mod:`.grid`)
and the projected time (:mod:`.estimate`). The command line is ``permk`` (:mod:`permk.cli`);
everything here is also usable from Python::

    from permk.experiments import quadratic
    root = quadratic.run_quadratic(quadratic.QUICK_GRID, "permk-out", jobs=2)
"""

from .results import append_record as append_record, read_records as read_records
from .protocols import SearchOptions as SearchOptions
from .search import best_runs as best_runs
from .specs import METHODS as METHODS

__all__ = ["METHODS", "SearchOptions", "append_record", "best_runs", "read_records"]
