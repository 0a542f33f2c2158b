"""permk.problems.datasets: the LibSVM reader on good and hostile files, label encodings, the shards
(equal, and the authors' p̂ split, the same as the autoencoder's), Fashion-MNIST from Debian."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from permk.problems.datasets import (
    DEBIAN_FASHION_MNIST,
    DEBIAN_HEART_SCALE,
    binary_labels,
    class_labels,
    load_fashion_mnist,
    load_heart_scale,
    read_libsvm,
    shard_indices,
    sklearn_svmlight_sample,
)


def _write(tmp_path: Path, text: str, name: str = "data.svm") -> Path:
    f = tmp_path / name
    f.write_text(text, encoding="utf-8")
    return f


def test_read_libsvm_one_based_with_comments_and_qid(tmp_path: Path) -> None:
    f = _write(tmp_path, "# header\n+1 qid:3 1:0.5 3:-2 # trailing\n\n-1 2:1e3\n1\t 1:1\n")
    X, y, src = read_libsvm(f)
    assert src == str(f)
    np.testing.assert_array_equal(y, [1.0, -1.0, 1.0])
    np.testing.assert_array_equal(X.toarray(), [[0.5, 0, -2], [0, 1000, 0], [1, 0, 0]])
    assert X.format == "csr" and X.dtype == np.float64
    X32 = read_libsvm(f, dtype=np.float32, n_features=5).X
    assert X32.dtype == np.float32 and X32.shape == (3, 5)


def test_read_libsvm_zero_based(tmp_path: Path) -> None:
    f = _write(tmp_path, "0 0:1 2:2\n1 1:3\n")
    np.testing.assert_array_equal(read_libsvm(f).X.toarray(), [[1, 0, 2], [0, 3, 0]])  # auto: an index 0
    np.testing.assert_array_equal(read_libsvm(_write(tmp_path, "0 1:1\n", "b.svm"), zero_based=True).X.toarray(), [[0, 1]])
    with pytest.raises(ValueError, match="1-based"):
        read_libsvm(f, zero_based=False)


@pytest.mark.parametrize(
    ("text", "line", "what"),
    [
        ("1 1:2\n1 x:2\n", 2, "index 'x'"),
        ("1 1:2\n\n1 3\n", 3, "missing ':'"),
        ("1 1:abc\n", 1, "value 'abc'"),
        ("yes 1:1\n", 1, "label 'yes'"),
        ("1 3:1 2:1\n", 1, "increase strictly"),
        ("1 2:1 2:1\n", 1, "increase strictly"),
        ("1 -1:1\n", 1, "negative"),
        ("1 1:nan\n", 1, "not finite"),
        ("# c\n1 1:1\n1 9:1\n", 3, "beyond n_features=4"),
    ],
)
def test_read_libsvm_errors_name_the_file_and_line(tmp_path: Path, text: str, line: int, what: str) -> None:
    f = _write(tmp_path, text)
    with pytest.raises(ValueError) as e:
        read_libsvm(f, n_features=4)
    assert str(e.value).startswith(f"{f}:{line}: ") and what in str(e.value)


def test_read_libsvm_empty_and_missing(tmp_path: Path) -> None:
    for text in ("", "# only a comment\n\n"):
        with pytest.raises(ValueError, match="no samples"):
            read_libsvm(_write(tmp_path, text))
    with pytest.raises(FileNotFoundError, match="nope.svm"):
        read_libsvm(tmp_path / "nope.svm")
    with pytest.raises(ValueError, match="dtype"):
        read_libsvm(_write(tmp_path, "1 1:1\n"), dtype=np.int32)


def test_read_libsvm_on_sklearns_sample() -> None:
    f = sklearn_svmlight_sample()
    if f is None:
        pytest.skip("scikit-learn is not installed (its tests ship the svmlight sample file)")
    X, y, _ = read_libsvm(f)
    assert X.shape == (6, 21)
    np.testing.assert_array_equal(y, [1, 2, 3, 4, 1, 2])
    assert X[0, 2] == 2.5 and X[0, 10] == -5.2 and X[3, 1] == 1.234567890123456e10 and X[4].nnz == 0
    from sklearn.datasets import load_svmlight_file

    Xs, ys = load_svmlight_file(str(f))
    np.testing.assert_array_equal(X.toarray(), Xs.toarray())
    np.testing.assert_array_equal(y, ys)


@pytest.mark.skipif(not DEBIAN_HEART_SCALE.is_file(), reason="needs Debian's liblinear-tools (apt-get install liblinear-tools)")
def test_heart_scale_from_debians_liblinear_tools() -> None:
    X, y, source = load_heart_scale()
    assert source == str(DEBIAN_HEART_SCALE) and X.shape == (270, 13) and X.nnz == 3378
    assert (y == -1).sum() == 150 and (y == 1).sum() == 120
    assert X.min() == -1.0 and X.max() == 1.0
    # the file's first line: +1 1:0.708333 2:1 3:1 4:-0.320755 ... 12:1 13:-1 (no feature 11)
    assert y[0] == 1 and X[0, 0] == 0.708333 and X[0, 3] == -0.320755 and X[0, 10] == 0 and X[0, 12] == -1
    X32 = load_heart_scale(dtype=np.float32).X
    assert X32.dtype == np.float32


def test_heart_scale_missing_says_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="apt-get install liblinear-tools"):
        load_heart_scale(tmp_path / "heart_scale")
    f = _write(tmp_path, "+1 1:0.5 13:-1\n-1 2:1\n")
    X, y, _ = load_heart_scale(f)
    assert X.shape == (2, 13) and y.tolist() == [1.0, -1.0]


def test_label_encodings() -> None:
    np.testing.assert_array_equal(binary_labels([-1, 1, 1]), [-1, 1, 1])
    np.testing.assert_array_equal(binary_labels([0, 1]), [-1, 1])
    np.testing.assert_array_equal(binary_labels([2, 4, 4]), [-1, 1, 1])
    with pytest.raises(ValueError, match="two label values"):
        binary_labels([1, 2, 3])
    codes, classes = class_labels(np.array([5.0, 1.0, 5.0, 3.0]))
    np.testing.assert_array_equal(codes, [2, 0, 2, 1])
    np.testing.assert_array_equal(classes[codes], [5, 1, 5, 3])


def test_equal_shards() -> None:
    shards = shard_indices(10, 3, seed=0)
    assert [s.size for s in shards] == [4, 3, 3]
    np.testing.assert_array_equal(np.sort(np.concatenate(shards)), np.arange(10))
    assert [s.tolist() for s in shard_indices(10, 3, seed=0)] == [s.tolist() for s in shards]
    assert np.concatenate(shard_indices(10, 3, seed=0, shuffle=False)).tolist() == list(range(10))
    with pytest.raises(ValueError, match="non-empty shards"):
        shard_indices(2, 3, seed=0)


def test_p_hat_shards_are_the_authors_split() -> None:
    """Their split_with_controling_homogeneity: n + 1 parts of the shuffled samples, the first
    held out, each sample of worker i's part replaced by the held-out one at the same position
    with probability p̂ — the autoencoder's split="per-sample", index for index."""
    from permk.problems import LinearAutoencoder

    X = np.random.default_rng(0).random((23, 4))
    for p_hat in (0.0, 0.3, 1.0):
        shards = shard_indices(23, 4, seed=5, p_hat=p_hat)
        ae = LinearAutoencoder(X, 4, p_hat, 0.0, d_e=1, seed=5, split="per-sample")
        for i in range(4):
            np.testing.assert_array_equal(shards[i], ae.split_index[ae.worker_split[i]])
    parts = np.array_split(np.random.default_rng(5).permutation(23), 5)
    same = shard_indices(23, 4, seed=5, p_hat=1.0)
    for s in same:
        np.testing.assert_array_equal(s, parts[0][: s.size])
    with pytest.raises(ValueError, match="p_hat"):
        shard_indices(23, 4, seed=5, p_hat=1.5)
    # a Generator is advanced by exactly the draws of the split
    rng = np.random.default_rng(5)
    from_rng = shard_indices(23, 4, seed=rng, p_hat=0.3)
    assert [s.tolist() for s in from_rng] == [s.tolist() for s in shard_indices(23, 4, seed=5, p_hat=0.3)]
    ref = np.random.default_rng(5)
    ref.permutation(23)
    for part in np.array_split(np.arange(23), 5)[1:]:
        ref.random(part.size)
    assert rng.random() == ref.random()


@pytest.mark.skipif(not DEBIAN_FASHION_MNIST.is_dir(), reason="Debian's dataset-fashion-mnist is not installed")
def test_fashion_mnist_from_debian() -> None:
    from permk.problems import NonconvexMultiClass, NonconvexSigmoid

    ten = load_fashion_mnist(limit=300)
    assert ten.X.shape == (300, 784) and 0.0 <= ten.X.min() and ten.X.max() <= 1.0
    assert set(np.unique(ten.y).tolist()) <= set(range(10))
    assert NonconvexMultiClass(ten.X, ten.y, n=3, classes=10).d == 7850
    two = load_fashion_mnist(classes=(0, 6), limit=200, dtype=np.float32)
    assert two.X.dtype == np.float32 and set(np.unique(two.y).tolist()) == {-1.0, 1.0}
    assert "T-shirt/top (−1) vs Shirt (+1)" in two.source
    p = NonconvexSigmoid(two.X, two.y, n=4, dtype=np.float32)
    assert p.d == 785 and np.isfinite(p.grad(p.x0)).all()
    with pytest.raises(ValueError, match="different"):
        load_fashion_mnist(classes=(3, 3))
