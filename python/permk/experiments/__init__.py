"""The paper's experiments end to end: the synthetic quadratic grid, the linear
autoencoder on MNIST-format data, the nonconvex classification tasks (:mod:`.classify`), result
files and figures (the problems and their data readers are :mod:`permk.problems`). The command line
is ``permk`` (:mod:`permk.cli`); everything here is also usable from Python::

    from permk.experiments import quadratic
    root = quadratic.run_quadratic(quadratic.QUICK_GRID, "permk-out", jobs=2)
"""

from .results import append_record as append_record, read_records as read_records
from .runner import METHODS as METHODS, SearchOptions as SearchOptions, best_runs as best_runs

__all__ = ["METHODS", "SearchOptions", "append_record", "best_runs", "read_records"]
