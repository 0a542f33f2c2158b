"""Theory tools: step sizes, smoothness constants and Hessian variance, AB constants measured,
and the communication complexity of the methods.

* :mod:`permk.theory.steps` — the theorems' step sizes (MARINA: Theorems "AB", "AB-PL",
  "AB_group"; EF21; DIANA; the authors' RandDIANA and shifted DCGD; DASHA and DASHA-PP) and the
  :class:`Constants` they read from a problem;
* :mod:`permk.theory.smoothness` — ``L_−``, ``L_+``, ``L_±`` (Assumption "L+", Definition
  "Hessian variance") of any problem or group of workers: exact for quadratics, a lower
  estimate from pairs of points, or a local estimate at a point;
* :mod:`permk.theory.group` — the constants of appendix "Group Hessian Variance", and MARINA's
  variance constant of any compressor (:func:`variance_bound`);
* :mod:`permk.theory.ab` — the AB inequality (Assumption "AB inequality") measured for any
  compressor;
* :mod:`permk.theory.method` — :class:`MethodTheory`, what a method's theorems say of it (its
  step, the floats it sends per round), declared beside the method;
* :mod:`permk.theory.complexity` — rounds and floats per worker of any method, optimised, next
  to the paper's Tables (``permk complexity`` on the command line).

None of these import scipy.optimize or scipy.sparse.linalg before they need them.
"""

from .ab import ABEstimate as ABEstimate, ABInput as ABInput, estimate_ab as estimate_ab
from .complexity import (
    Complexity as Complexity,
    complexity as complexity,
    format_complexity_table as format_complexity_table,
    table_complexity as table_complexity,
)
from .method import MethodTheory as MethodTheory
from .group import GroupHessianVariance as GroupHessianVariance, group_hessian_variance as group_hessian_variance
from .group import Grouped as Grouped, variance_bound as variance_bound
from .smoothness import ExactConstants as ExactConstants, Smoothness as Smoothness, smoothness as smoothness
from .steps import (
    Constants as Constants,
    dasha_momentum as dasha_momentum,
    dasha_mvr_noise as dasha_mvr_noise,
    dasha_mvr_stepsize as dasha_mvr_stepsize,
    dasha_page_stepsize as dasha_page_stepsize,
    dasha_pp_stepsize as dasha_pp_stepsize,
    dasha_stepsize as dasha_stepsize,
    diana_stepsize as diana_stepsize,
    ef21_stepsize as ef21_stepsize,
    marina_stepsize as marina_stepsize,
    marina_variance_stepsize as marina_variance_stepsize,
    rand_diana_stepsize as rand_diana_stepsize,
    shifted_dcgd_stepsize as shifted_dcgd_stepsize,
)

__all__ = [
    "Constants",
    "marina_stepsize",
    "marina_variance_stepsize",
    "ef21_stepsize",
    "dasha_momentum",
    "dasha_stepsize",
    "dasha_pp_stepsize",
    "dasha_page_stepsize",
    "dasha_mvr_stepsize",
    "dasha_mvr_noise",
    "diana_stepsize",
    "rand_diana_stepsize",
    "shifted_dcgd_stepsize",
    "Smoothness",
    "ExactConstants",
    "smoothness",
    "GroupHessianVariance",
    "Grouped",
    "group_hessian_variance",
    "variance_bound",
    "ABInput",
    "ABEstimate",
    "estimate_ab",
    "MethodTheory",
    "Complexity",
    "complexity",
    "table_complexity",
    "format_complexity_table",
]
