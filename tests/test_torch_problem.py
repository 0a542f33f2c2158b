"""Torch models as permk problems (:mod:`permk.torch.problem`): the oracles against plain
autograd and finite differences, the methods training a network, reproducibility, MPI, errors."""

from __future__ import annotations

import copy
import subprocess
import sys
from typing import Any, Iterator

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="permk.torch needs PyTorch: pip install 'permk[torch]'")

import permk  # noqa: E402
from permk.problems import minibatch_indices  # noqa: E402
from permk.problems import DEBIAN_FASHION_MNIST  # noqa: E402
from permk.torch import LocalModuleProblem, ModuleProblem, two_layer_network  # noqa: E402

F = torch.nn.functional
needs_fashion = pytest.mark.skipif(not DEBIAN_FASHION_MNIST.is_dir(), reason="Debian's dataset-fashion-mnist is not installed")


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """One torch thread: the test machine's cores are shared (results do not depend on it)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def net(dtype: Any = torch.float64, seed: int = 0, features: int = 6, hidden: int = 5, classes: int = 3) -> Any:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(features, hidden, dtype=dtype), torch.nn.Sigmoid(),
                                   torch.nn.Linear(hidden, classes, dtype=dtype))


def shards(sizes: list[int], seed: int = 0, features: int = 6, classes: int = 3) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((m, features)), rng.integers(0, classes, m)) for m in sizes]


def plain_grads(module: Any, loss: Any, data: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each worker's gradient and loss by a plain autograd loop on a copy of the module."""
    m = copy.deepcopy(module)
    dtype = next(m.parameters()).dtype
    torch.nn.utils.vector_to_parameters(torch.from_numpy(x).to(dtype), m.parameters())
    rows, values = [], []
    for X, y in data:
        m.zero_grad()
        value = loss(m(torch.as_tensor(X).to(dtype)), torch.as_tensor(y))
        value.backward()
        rows.append(torch.nn.utils.parameters_to_vector([p.grad for p in m.parameters()]).double().numpy())
        values.append(float(value.detach()))
    return np.stack(rows), np.array(values)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("sizes", [[7, 7, 7], [8, 7, 9, 7]], ids=["equal", "ragged"])
def test_local_grads_and_losses_equal_a_plain_autograd_loop(dtype: Any, sizes: list[int]) -> None:
    module, data = net(dtype), shards(sizes)
    p = ModuleProblem(module, F.cross_entropy, data)
    assert (p.n, p.d) == (len(sizes), 6 * 5 + 5 + 5 * 3 + 3)
    assert p.sample_counts.tolist() == sizes
    x = p.x0 + 0.3 * np.random.default_rng(1).standard_normal(p.d)
    G = p.local_grads(x)
    assert G.shape == (p.n, p.d) and G.dtype == np.float64
    ref, ref_losses = plain_grads(module, F.cross_entropy, data, x)
    tol = 1e-14 if dtype == torch.float64 else 1e-6
    assert np.abs(G - ref).max() <= tol * np.abs(ref).max()
    assert np.allclose(p.local_losses(x), ref_losses, rtol=tol, atol=0)
    # exactly: the worker-order means, and the kept rows of the last point
    acc = np.zeros(p.d)
    for row in G:
        acc += row
    assert np.array_equal(p.grad(x), acc / p.n)
    losses = p.local_losses(x)
    assert p.loss(x) == float(sum(losses.tolist(), 0.0) / p.n)
    assert np.array_equal(p.local_grads(x, workers=[2, 0]), G[[2, 0]])
    assert np.array_equal(p.local_grad(1, x), G[1])
    assert p.local_loss(1, x) == losses[1]


def test_finite_differences_in_float64() -> None:
    p = ModuleProblem(net(), F.cross_entropy, shards([6, 5, 6]))
    rng = np.random.default_rng(2)
    x = p.x0 + 0.5 * rng.standard_normal(p.d)
    h = 1e-5
    for _ in range(3):
        v = rng.standard_normal(p.d)
        fd = (p.loss(x + h * v) - p.loss(x - h * v)) / (2 * h)
        assert abs(fd - p.grad(x) @ v) <= 1e-8 * (1 + abs(fd))
        fd_i = (p.local_losses(x + h * v) - p.local_losses(x - h * v)) / (2 * h)
        assert np.allclose(fd_i, p.local_grads(x) @ v, rtol=1e-7, atol=1e-9)


def test_x_is_the_parameters_in_module_order_and_the_module_is_left_alone() -> None:
    module = net()
    before = torch.nn.utils.parameters_to_vector(module.parameters()).detach().clone()
    p = ModuleProblem(module, F.cross_entropy, shards([4, 4]))
    assert np.array_equal(p.x0, before.numpy())
    x = np.zeros(p.d)
    x[-3:] = [0.5, -1.0, 2.0]  # the last parameter: the output layer's bias, the logits of every sample
    p.local_grads(x)
    assert torch.equal(torch.nn.utils.parameters_to_vector(module.parameters()), before)
    logp = np.array([0.5, -1.0, 2.0]) - np.log(np.exp([0.5, -1.0, 2.0]).sum())
    labels = np.concatenate([y for _, y in shards([4, 4])])
    assert abs(p.loss(x) - (-logp[labels[:4]].mean() - logp[labels[4:]].mean()) / 2) < 1e-15


def test_minibatch_oracles_draw_minibatch_indices_and_match_plain_autograd() -> None:
    module, data = net(), shards([9, 8, 9])
    p = ModuleProblem(module, F.cross_entropy, data)
    x, y = p.x0, p.x0 + 0.1
    idx = minibatch_indices(p.sample_counts, 4, seed=3, round=5, workers=[0, 1, 2])
    ref, _ = plain_grads(module, F.cross_entropy, [(X[i], t[i]) for (X, t), i in zip(data, idx)], x)
    M = p.minibatch_grads(x, 4, seed=3, round=5)
    assert np.abs(M - ref).max() <= 1e-14 * np.abs(ref).max()
    gx, gy = p.minibatch_grads_pair(x, y, 4, seed=3, round=5)
    assert np.array_equal(gx, M) and np.array_equal(gy, p.minibatch_grads(y, 4, seed=3, round=5))
    assert not np.array_equal(M, p.minibatch_grads(x, 4, seed=3, round=6))  # another round, other samples
    sub = p.minibatch_grads(x, 4, seed=3, round=5, workers=[1])
    assert np.allclose(sub, M[[1]], rtol=1e-13, atol=1e-16)
    assert p.minibatch_grads(x, 4, seed=3, round=5, workers=[]).shape == (0, p.d)
    assert isinstance(p, permk.FiniteSumProblem) and isinstance(p, permk.Problem)


def small_task(n: int = 4, dtype: Any = torch.float32) -> ModuleProblem:
    """A small two-layer classification task: three Gaussian classes in 10 dimensions."""
    rng = np.random.default_rng(0)
    centers = 2.0 * rng.standard_normal((3, 10))
    y = rng.integers(0, 3, 60 * n)
    X = centers[y] + rng.standard_normal((y.size, 10))
    parts = np.array_split(np.arange(y.size), n)
    return ModuleProblem(net(dtype, features=10, hidden=16), F.cross_entropy, [(X[s], y[s]) for s in parts])


@pytest.mark.parametrize("name", ["marina", "ef21", "gd", "vr_marina", "sgd"])
def test_the_methods_decrease_the_loss_and_the_gradient(name: str) -> None:
    p = small_task()
    method = getattr(permk, name)
    opts: dict[str, Any] = {"rounds": 80, "seed": 1, "gamma": 0.5}
    if name in ("vr_marina", "sgd"):
        opts["batch_size"] = 8
    comp = {"marina": permk.PermK(), "ef21": permk.TopK(p.d // 4), "vr_marina": permk.PermK()}.get(name)
    res = method(p, rounds=opts.pop("rounds"), **opts) if comp is None else method(p, comp, rounds=opts.pop("rounds"), **opts)
    assert np.isfinite(res.x).all()
    assert p.loss(res.x) < 0.1 * p.loss(p.x0), (name, p.loss(p.x0), p.loss(res.x))
    if name not in ("vr_marina", "sgd"):  # the stochastic methods' ‖∇f‖² is noisy
        assert res.grad_norm_sq[-1] < 0.02 * res.grad_norm_sq[0], (name, res.grad_norm_sq[[0, -1]])


def test_a_run_is_bit_reproducible_and_does_not_depend_on_torch_threads() -> None:
    runs = []
    for threads in (1, 2, 1):
        torch.set_num_threads(threads)
        runs.append(permk.marina(small_task(), permk.PermK(), rounds=25, seed=4, gamma=0.5))
    torch.set_num_threads(1)
    for r in runs[1:]:
        assert np.array_equal(r.x, runs[0].x) and np.array_equal(r.grad_norm_sq, runs[0].grad_norm_sq)
    other = permk.marina(small_task(), permk.PermK(), rounds=25, seed=5, gamma=0.5)
    assert not np.array_equal(other.x, runs[0].x)


def test_a_local_problem_holds_its_workers_only() -> None:
    module, data = net(), shards([5, 6, 5, 6])
    full = ModuleProblem(module, F.cross_entropy, data)
    local = LocalModuleProblem(module, F.cross_entropy, data[2:], n=4, workers=range(2, 4), sample_counts=[5, 6, 5, 6])
    assert not hasattr(full, "workers") and not hasattr(local, "grad")
    x = full.x0 + 0.2
    assert local.local_grads(x).shape == (2, full.d)
    assert np.allclose(local.local_grads(x), full.local_grads(x)[2:], rtol=1e-13, atol=1e-16)
    assert np.allclose(local.minibatch_grads(x, 3, seed=0, round=1, workers=[3]),
                       full.minibatch_grads(x, 3, seed=0, round=1, workers=[3]), rtol=1e-13, atol=1e-16)
    with pytest.raises(ValueError, match="workers"):
        local.minibatch_grads(x, 3, seed=0, round=1, workers=[1])
    # the launch check's digest: shared by the ranks of one problem, differs for other data
    other = LocalModuleProblem(module, F.cross_entropy, data[:2], n=4, workers=range(0, 2), sample_counts=[5, 6, 5, 6])
    assert other.fingerprint() == local.fingerprint()
    assert ModuleProblem(net(), F.cross_entropy, shards([5, 6, 5, 6])).fingerprint() == full.fingerprint()
    assert ModuleProblem(net(), F.cross_entropy, shards([5, 6, 5, 6], seed=1)).fingerprint() != full.fingerprint()
    assert ModuleProblem(net(), F.mse_loss, [(X, np.eye(3)[y]) for X, y in data]).fingerprint() != full.fingerprint()


@pytest.mark.mpi
def test_on_mpi_the_methods_match_the_simulator() -> None:
    from conftest import MPI_DIR, MPIEXEC

    out = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, str(MPI_DIR / "torch_run.py")],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("ok ")


@needs_fashion
def test_the_two_layer_network_on_fashion_mnist() -> None:
    before = torch.random.get_rng_state()
    p = two_layer_network(4, samples=80, seed=3)
    assert torch.equal(torch.random.get_rng_state(), before)  # the global generator is untouched
    assert isinstance(p, ModuleProblem) and p.d == 784 * 32 + 32 + 32 * 10 + 10 == 25450
    assert p.dtype == np.float32 and p.sample_counts.tolist() == [20] * 4
    # PyTorch's nn.Linear init: every weight and bias within ±1/sqrt(fan_in)
    W1, b1 = p.x0[: 784 * 32], p.x0[784 * 32 : 784 * 32 + 32]
    W2 = p.x0[784 * 32 + 32 : -10]
    assert np.abs(np.r_[W1, b1]).max() <= 1 / np.sqrt(784) and np.abs(W2).max() <= 1 / np.sqrt(32)
    assert np.abs(W2).max() > 0.9 / np.sqrt(32)
    assert np.array_equal(two_layer_network(4, samples=80, seed=3).x0, p.x0)
    assert not np.array_equal(two_layer_network(4, samples=80, seed=4).x0, p.x0)
    assert two_layer_network(4, samples=80, p_hat=0.5).sample_counts.tolist() == [16] * 4  # 80 = 5 parts, one held out
    assert abs(p.loss(p.x0) - np.log(10)) < 0.3  # near-uniform predictions at the start
    p64 = two_layer_network(4, samples=80, seed=3, dtype=np.float64)
    local = two_layer_network(4, samples=80, seed=3, dtype=np.float64, workers=range(1, 3))
    assert isinstance(local, LocalModuleProblem) and local.fingerprint() != p64.fingerprint()
    assert np.allclose(local.local_grads(p64.x0), p64.local_grads(p64.x0)[1:3], rtol=1e-12, atol=1e-15)
    res = permk.marina(p, permk.PermK(), rounds=20, seed=1, gamma=1.0)
    assert p.loss(res.x) < p.loss(p.x0) - 0.3


def test_argument_errors_name_the_argument() -> None:
    data = shards([4, 4])
    with pytest.raises(TypeError, match="module"):
        ModuleProblem(lambda X: X, F.cross_entropy, data)
    with pytest.raises(TypeError, match="loss"):
        ModuleProblem(net(), "cross_entropy", data)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one"):
        ModuleProblem(net(), F.cross_entropy, [])
    with pytest.raises(TypeError, match=r"shards\[1\]"):
        ModuleProblem(net(), F.cross_entropy, [data[0], data[1][0]])
    with pytest.raises(ValueError, match=r"shards\[0\] holds 4 inputs but 3 targets"):
        ModuleProblem(net(), F.cross_entropy, [(data[0][0], data[0][1][:3])])
    with pytest.raises(ValueError, match=r"shards\[1\] inputs"):
        ModuleProblem(net(), F.cross_entropy, [data[0], (np.ones((4, 5)), data[1][1])])
    with pytest.raises(ValueError, match=r"shards\[1\] inputs must be finite"):
        ModuleProblem(net(), F.cross_entropy, [data[0], (np.full((4, 6), np.nan), data[1][1])])
    with pytest.raises(TypeError, match="float32 or all torch.float64"):
        ModuleProblem(net(torch.float16), F.cross_entropy, data)
    mixed = net()
    mixed[2].bias.data = mixed[2].bias.data.float()
    with pytest.raises(TypeError, match="float32 or all torch.float64"):
        ModuleProblem(mixed, F.cross_entropy, data)
    with pytest.raises(ValueError, match="scalar"):
        ModuleProblem(net(), lambda out, y: F.cross_entropy(out, y, reduction="none"), data)
    p = ModuleProblem(net(), F.cross_entropy, data)
    with pytest.raises(ValueError, match="x"):
        p.local_grads(np.zeros(p.d + 1))
    with pytest.raises(ValueError, match="workers"):
        p.local_grads(p.x0, workers=[2])
    with pytest.raises(ValueError, match="batch_size"):
        p.minibatch_grads(p.x0, 0, seed=0, round=0)
    with pytest.raises(ValueError, match="workers"):
        LocalModuleProblem(net(), F.cross_entropy, data, n=2, workers=range(1, 3), sample_counts=[4, 4])
    with pytest.raises(ValueError, match="sample_counts"):
        LocalModuleProblem(net(), F.cross_entropy, data, n=2, workers=range(0, 2), sample_counts=[4])
    with pytest.raises(ValueError, match="sample_counts says"):
        LocalModuleProblem(net(), F.cross_entropy, data, n=2, workers=range(0, 2), sample_counts=[4, 5])
    with pytest.raises(ValueError, match="shards"):
        LocalModuleProblem(net(), F.cross_entropy, data, n=3, workers=range(0, 1), sample_counts=[4, 4, 4])
    with pytest.raises(ValueError, match="dtype"):
        two_layer_network(2, samples=10, dtype=np.float16)
    with pytest.raises(ValueError, match="gamma"):
        permk.marina(p, permk.PermK(), rounds=2, seed=0)  # no smoothness constants: the step is the user's
