"""The problems the methods solve, ``f = (1/n) Σ_i f_i`` on ``R^d`` (eq. (1) of the paper), and
the data they are built from. One module per concept:

* :mod:`~permk.problems.base` — the contracts: :class:`Problem` (what every method needs, and
  the optional capabilities it uses when present) and :class:`FiniteSumProblem` (minibatch
  oracles, for VR-MARINA, DASHA-PAGE/MVR and SGD);
* :mod:`~permk.problems.quadratic` — :class:`Quadratic` from user matrices and the paper's
  synthetic generator :class:`SyntheticQuadratic` (Algorithm 1: native oracles, exact
  constants);
* :mod:`~permk.problems.finite_sum` — the machinery of the finite-sum problems: the minibatch
  sampling (:func:`minibatch_indices`), the data held as worker blocks
  (:class:`LinearFiniteSum`), one MPI process's part (:class:`HeldShards`);
* :mod:`~permk.problems.classification` — the authors' nonconvex tasks
  :class:`NonconvexSigmoid`, :class:`NonconvexMultiClass`, :class:`NonconvexLogistic`;
* :mod:`~permk.problems.autoencoder` — the linear autoencoder of the MNIST experiment
  (:class:`LinearAutoencoder`);
* :mod:`~permk.problems.datasets` — every reader and loader (LibSVM, IDX, MNIST images,
  Fashion-MNIST, heart_scale), label encodings and the workers' shards; nothing is downloaded.

The problems sit below the methods, the transports and the experiments: nothing here imports
them.

>>> import numpy as np
>>> from permk.problems import NonconvexSigmoid, Quadratic
>>> Quadratic.synthetic(4, 8, lam=0.1, noise_scale=0.0).L_pm
0.0
>>> NonconvexSigmoid(np.eye(4), [1, -1, 1, -1], n=2, seed=0).sample_counts.tolist()
[2, 2]
"""

from .autoencoder import GroupedAutoencoder as GroupedAutoencoder, LinearAutoencoder as LinearAutoencoder
from .autoencoder import estimate_constants as estimate_constants
from .base import FiniteSumProblem as FiniteSumProblem, Problem as Problem
from .classification import MULTICLASS_CURVATURE as MULTICLASS_CURVATURE, SIGMOID_CURVATURE as SIGMOID_CURVATURE
from .classification import NonconvexLogistic as NonconvexLogistic, NonconvexMultiClass as NonconvexMultiClass
from .classification import NonconvexSigmoid as NonconvexSigmoid
from .datasets import DEBIAN_FASHION_MNIST as DEBIAN_FASHION_MNIST, DEBIAN_HEART_SCALE as DEBIAN_HEART_SCALE
from .datasets import FASHION_MNIST_CLASSES as FASHION_MNIST_CLASSES, HOW_TO_PROVIDE as HOW_TO_PROVIDE
from .datasets import DataNotFoundError as DataNotFoundError, IdxError as IdxError, Images as Images, LabelledData as LabelledData
from .datasets import binary_labels as binary_labels, class_labels as class_labels, shard_indices as shard_indices
from .datasets import load_fashion_mnist as load_fashion_mnist, load_heart_scale as load_heart_scale, load_images as load_images
from .datasets import read_idx as read_idx, read_libsvm as read_libsvm, sklearn_svmlight_sample as sklearn_svmlight_sample
from .finite_sum import HELD_CONSTANTS as HELD_CONSTANTS, MINIBATCH_TAG as MINIBATCH_TAG, HeldShards as HeldShards
from .finite_sum import LinearFiniteSum as LinearFiniteSum, minibatch_indices as minibatch_indices
from .quadratic import Quadratic as Quadratic, SyntheticQuadratic as SyntheticQuadratic

__all__ = [
    # the contracts (base)
    "Problem",
    "FiniteSumProblem",
    # quadratic
    "Quadratic",
    "SyntheticQuadratic",
    # finite_sum
    "LinearFiniteSum",
    "HeldShards",
    "HELD_CONSTANTS",
    "minibatch_indices",
    "MINIBATCH_TAG",
    # classification
    "NonconvexSigmoid",
    "NonconvexMultiClass",
    "NonconvexLogistic",
    "SIGMOID_CURVATURE",
    "MULTICLASS_CURVATURE",
    # autoencoder
    "LinearAutoencoder",
    "GroupedAutoencoder",
    "estimate_constants",
    # datasets
    "LabelledData",
    "Images",
    "IdxError",
    "DataNotFoundError",
    "read_libsvm",
    "read_idx",
    "load_images",
    "load_fashion_mnist",
    "load_heart_scale",
    "DEBIAN_HEART_SCALE",
    "DEBIAN_FASHION_MNIST",
    "HOW_TO_PROVIDE",
    "binary_labels",
    "class_labels",
    "shard_indices",
    "FASHION_MNIST_CLASSES",
    "sklearn_svmlight_sample",
]
