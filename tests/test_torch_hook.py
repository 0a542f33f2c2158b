"""permk.torch.comm_hook: the DDP hook's average is compressor.aggregate's, bit for bit, on gloo
with 2 and 4 localhost processes; the bytes each rank sends are the theory's; argument errors."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="permk.torch needs PyTorch (pip install 'permk[torch]')")
dist = pytest.importorskip("torch.distributed", reason="this PyTorch build has no torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("this PyTorch build has no gloo backend", allow_module_level=True)

import permk  # noqa: E402
import permk.torch as pt  # noqa: E402
from permk.torch.hook import bucket_seed  # noqa: E402

WORKER = Path(__file__).with_name("ddp_hook_worker.py")
FEATURES = Path(__file__).with_name("ddp_features_worker.py")


def run_ranks(world: int, tmp: Path, worker: Path = WORKER) -> list[Any]:
    """Run a worker script on ``world`` processes; every rank's records."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(worker), str(tmp / "store"), str(r), str(world), str(tmp / f"r{r}.json")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    return [json.loads((tmp / f"r{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def ranks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, list[list[dict[str, Any]]]]:
    return request.param, run_ranks(request.param, tmp_path_factory.mktemp(f"ddp{request.param}"))


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def features(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, list[dict[str, Any]]]:
    """ddp_features_worker.py's records (dtypes, shifted, resume, sharded) of every rank."""
    return request.param, run_ranks(request.param, tmp_path_factory.mktemp(f"features{request.param}"), FEATURES)


def test_half_precision_is_the_recipe_rounded_to_the_dtype(features: tuple[int, list[dict[str, Any]]]) -> None:
    """bfloat16 and float16 buckets: each exchange is the compressor's recipe with every operation
    rounded to the dtype (bit for bit), within (n + 2)/2 ulps of the magnitudes summed of
    compressor.aggregate of the same values in float64, and sends half the bytes of float32."""
    n, per_rank = features
    for result in per_rank:
        recs = result["dtypes"]
        assert {(r["case"], r["dtype"]) for r in recs} == {(c, t) for c in ("PermK", f"BlockPermK({n})", "RandK(3)")
                                                            for t in ("torch.bfloat16", "torch.float16")}
        assert all(r["equal"] for r in recs), [r for r in recs if not r["equal"]][:3]
        assert all(r["close"] for r in recs) and all(r["itemsize"] == 2 for r in recs)


def test_shifted_hooks_are_the_simulators_exchanges(features: tuple[int, list[dict[str, Any]]]) -> None:
    """The DIANA-shifted and EF21 hooks (float64): every exchange's mean, the estimate h̄ + mean, this
    rank's shift and the mirror equal permk.exchanges.shifted / error_feedback run by the simulator
    on all ranks' gradients, bit for bit, step after step (DDP's rebuild resets both sides)."""
    _, per_rank = features
    for result in per_rank:
        recs = [r for r in result["shifted"] if "mean" in r]
        assert {r["case"] for r in recs} == {"diana PermK", "diana RandK(3)", "ef21 TopK(3)", "ef21 PermK"}
        assert all(r["mean"] and r["estimate"] and r["h"] and r["hbar"] for r in recs), [r for r in recs if not r["mean"]][:3]
        assert sum(r["nonzero"] for r in recs) > len(recs) // 2
        for r in (r for r in result["shifted"] if "resets" in r):
            assert r["resets"] == r["buckets"] + 1  # every bucket's first round, and the rebuilt bucket 0


def test_a_checkpoint_resumes_at_the_right_round(features: tuple[int, list[dict[str, Any]]]) -> None:
    """A DIANA hook's state saved after two steps (state_dict through torch.save, and pickle) and
    loaded into a new DDP model continues the run bit for bit: same rounds, same outputs."""
    _, per_rank = features
    for result in per_rank:
        for r in result["resume"]:
            assert r["rounds"] and r["count"] == [4, 4] and all(r["same_calls"]) and all(r["outputs"]), r


def test_sharded_exchange(features: tuple[int, list[dict[str, Any]]]) -> None:
    """ShardedOptimizer: every rank's shard of the mean is compressor.aggregate restricted to the
    shard (float32 and float64, bit for bit); a training run with SGD and momentum has DDP's
    trajectory with the unsharded hook, bit for bit; the bytes of gradient values that leave a rank
    are about 1/n of the reduce-scatter's ((n − 1)/n · d values)."""
    n, per_rank = features
    for rank, result in enumerate(per_rank):
        recs = result["sharded"]
        assert all(r["equal"] for r in recs if r["kind"] == "shard")
        assert all(all(r["same"]) and r["moved"] for r in recs if r["kind"] == "trajectory")
        for r in (r for r in recs if r["kind"] == "bytes"):
            d, item, rs = r["d"], r["itemsize"], r["reduce_scatter"]
            steps = rs // ((n - 1) * -(-d // n) * item)
            assert rs == steps * (n - 1) * -(-d // n) * item  # (n − 1)/n · d values per step, padded shards
            if r["case"] in ("PermK", f"BlockPermK({n})"):  # d/n values per rank, minus the part of its own shard
                assert r["exchanged"] <= steps * -(-d // n) * item
                assert r["exchanged"] <= rs / (n - 1) * 1.1


def test_marina_helper(features: tuple[int, list[dict[str, Any]]]) -> None:
    """permk.torch.Marina: the coin is MARINA's; on tails the compressed mean is compressor.aggregate
    of every rank's ∇f_B(x^{t+1}) − ∇f_B(x^t), bit for bit, and g^{t+1} = g^t + that mean."""
    _, per_rank = features
    for result in per_rank:
        *rounds, summary = result["marina"]
        assert summary["round"] == len(rounds) and summary["p"] == 0.3
        assert {r["heads"] for r in rounds} == {True, False}
        assert rounds[-1]["coin_count"] == sum(r["heads"] for r in rounds)
        assert all(r["mean"] and r.get("g", True) for r in rounds if not r["heads"])
        assert all(map(math.isfinite, summary["losses"]))


def test_hook_equals_aggregate_bit_for_bit(ranks: tuple[int, list[list[dict[str, Any]]]]) -> None:
    n, per_rank = ranks
    for recs in per_rank:
        names = ("PermK", f"BlockPermK({n})", "RandK(3)") + (("BlockPermK(2)",) if n == 4 else ())
        assert {(r["case"], r["dtype"]) for r in recs} == {(c, t) for c in names for t in ("torch.float32", "torch.float64")}
        assert all(r["equal"] for r in recs), [r for r in recs if not r["equal"]][:3]
        assert all(r["grads_equal"] for r in recs)  # DDP left the average in the parameters' gradients
        assert all(r["seed_ok"] for r in recs)
        assert any(r["d"] % n for r in recs) and any(r["d"] % n == 0 for r in recs)
        assert len({r["index"] for r in recs}) >= 4  # several buckets


def test_comparison_detects_a_wrong_round(ranks: tuple[int, list[list[dict[str, Any]]]]) -> None:
    """The equality above is not vacuous: the aggregate of the next round differs for every case."""
    _, per_rank = ranks
    for recs in per_rank:
        differs: dict[tuple[str, str], bool] = defaultdict(bool)
        for r in recs:
            differs[r["case"], r["dtype"]] |= r["other_round_differs"]
        assert all(differs.values()), differs


def test_rounds_count_per_bucket(ranks: tuple[int, list[list[dict[str, Any]]]]) -> None:
    _, per_rank = ranks
    for recs in per_rank:
        rounds: dict[tuple[str, str, int], list[int]] = defaultdict(list)
        for r in recs:
            rounds[r["case"], r["dtype"], r["index"]].append(r["round"])
            assert r["round"] <= r["step"]
        for seq in rounds.values():
            assert seq == list(range(len(seq)))


def test_bytes_are_the_theory(ranks: tuple[int, list[list[dict[str, Any]]]]) -> None:
    n, per_rank = ranks
    for recs in per_rank:
        for r in recs:
            assert r["sent"] == r["plan_count"] * r["itemsize"]
            assert r["padded"] == r["floats_per_worker"] * r["itemsize"]
            if r["case"] == "RandK(3)" or r["d"] % n == 0 and r["case"] != "BlockPermK(2)":
                assert r["sent"] == r["floats_per_worker"] * r["itemsize"]
    for exchanged in zip(*per_rank):  # the same exchange on every rank
        r0 = exchanged[0]
        assert len({(r["case"], r["dtype"], r["index"], r["round"], r["d"]) for r in exchanged}) == 1
        if r0["disjoint"]:  # every coordinate sent by exactly one rank
            assert r0["case"] in ("PermK", f"BlockPermK({n})")
            assert sum(r["sent"] for r in exchanged) == r0["d"] * r0["itemsize"]
        elif r0["case"] == "BlockPermK(2)":  # every coordinate sent by two ranks
            assert sum(r["sent"] for r in exchanged) == 2 * r0["d"] * r0["itemsize"]


def test_bucket_seed_is_a_pure_function() -> None:
    assert bucket_seed(5, 0) == bucket_seed(5, 0)
    assert len({bucket_seed(s, b) for s in (0, 1) for b in range(4)}) == 8
    with pytest.raises(ValueError, match="seed"):
        bucket_seed(-1, 0)


def _exchange(rounds: list[Any], xs: list[Any], n: int) -> list[Any]:
    """Every rank's packed values in its padded slot (the pad repeating its last value, as the
    transport sends), gathered, then placed by each rank: the means, one per rank."""
    width = rounds[0].width
    slots = []
    for rank, (r, x) in enumerate(zip(rounds, xs)):
        k = int(r.counts[rank])
        send = torch.full((width,), float("nan"), dtype=x.dtype)
        r.gather(x.view(1, -1), rank, divide=n, out=send[:k])
        if 0 < k < width:
            send[k:] = send[k - 1]
        slots.append(send)
    recv = torch.cat(slots)
    outs = []
    for r, x in zip(rounds, xs):
        out = torch.full_like(x, float("nan"))
        outs.append(r.place(recv, out))
    return outs


@pytest.mark.parametrize("n,d", [(4, 10), (4, 1001), (3, 7), (2, 70_001), (5, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_native_placement_is_the_torch_path(n: int, d: int, dtype: Any) -> None:
    """A CPU float32/float64 PermK round (and a disjoint shared-seed RandK one) is packed and placed
    by the native round (placement "native", no coordinate tensors formed): every rank's mean is the
    torch path's bit for bit, and compressor.aggregate's; its coordinates are the plan's on request.
    bfloat16 buckets keep the torch path."""
    from permk.transport.ddp import device_round

    gen = torch.Generator().manual_seed(d)
    xs = [torch.randn(d, generator=gen, dtype=torch.float64).mul_(3.0).to(dtype) for _ in range(n)]
    xs[0][::3] = -0.0
    for comp in (permk.PermK(), permk.RandK(3)):
        for rnd_no in range(3):
            rnd = comp.round(n, d, seed=7, round=rnd_no)
            native = [device_round(rnd, rank, torch.device("cpu"), dtype=dtype) for rank in range(n)]
            plain = [device_round(rnd, rank, torch.device("cpu")) for rank in range(n)]
            if not rnd.disjoint or rnd.ranges() is not None:  # summed, or ranges: the torch path's own forms
                assert native[0].placement != "native"
                continue
            assert [r.placement for r in native] == ["native"] * n and native[0]._coords is None
            got, want = _exchange(native, xs, n), _exchange(plain, xs, n)
            agg = comp.aggregate(torch.stack(xs).numpy(), seed=7, round=rnd_no)
            for g, w in zip(got, want):
                assert g.dtype == dtype and torch.equal(g.view(torch.uint8), w.view(torch.uint8))
                if dtype == torch.float64:
                    assert np.array_equal(g.numpy().view(np.uint64), agg.view(np.uint64))
            for rank, r in enumerate(native):  # the coordinates, formed on request, are the plan's
                assert torch.equal(r.coords(rank, rank + 1), plain[rank].coords(rank, rank + 1))
                assert torch.equal(r.coords(0, n), torch.as_tensor(rnd.coords(0, n)))
    assert device_round(permk.PermK().round(n, d, seed=7, round=0), 0, torch.device("cpu"), dtype=torch.bfloat16).placement != "native"


def test_a_deferred_planner_starts_the_next_round_when_told() -> None:
    """Planner(defer=True): taking round r starts nothing; start_next() starts round r + 1 once,
    which the next take uses; the rounds are the compressor's either way."""
    from concurrent.futures import ThreadPoolExecutor

    from permk.transport.ddp import Planner

    comp = permk.PermK()
    with ThreadPoolExecutor(max_workers=1) as ex:
        for defer in (True, False):
            p = Planner(comp, 4, 1, 1001, 5, torch.device("cpu"), ex, "a bucket", dtype=torch.float32, defer=defer)
            r0 = p.take(0)
            assert (p._ahead is None) == defer
            p.start_next()
            p.start_next()  # once
            assert p._ahead is not None and p._ahead[0] == 1
            ahead = p._ahead[1]
            r1 = p.take(1)
            assert ahead.done() and ahead.result() is r1
            for r, k in ((r0, 0), (r1, 1)):
                assert r.placement == "native"
                assert torch.equal(r.coords(0, 4), torch.as_tensor(comp.round(4, 1001, seed=5, round=k).coords(0, 4)))
            p.take(7)  # out of order: computed now
            assert p._ahead is None or p._ahead[0] == 8


@pytest.fixture
def one_rank() -> Iterator[None]:
    """A gloo group of one process (this one)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def backward(compressor: permk.compressors.base.Compressor, dtype: Any) -> pt.HookState:
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 3).to(dtype))
    state, hook = pt.comm_hook(compressor, seed=0)
    model.register_comm_hook(state, hook)
    model(torch.ones(2, 4, dtype=dtype)).sum().backward()
    return state


def test_one_rank_returns_at_once(one_rank: None) -> None:
    """A world of one rank sends nothing and returns the gradient itself (rounds still count)."""
    state = backward(permk.PermK(), torch.float32)
    assert state.n == 1 and state.rank == 0 and state.rounds == {0: 1}
    assert state.bytes_sent == state.bytes_padded == 0 and state.bytes_sent_per_bucket() == {0: 0}
    assert not state._buckets[0].planner._ahead  # no plan computed


def test_the_record_is_bounded_and_the_totals_count_every_exchange(one_rank: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pt.hook, "CALLS_KEPT", 2)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 3))
    state, hook = pt.comm_hook(permk.PermK(), seed=0)
    model.register_comm_hook(state, hook)
    for _ in range(5):
        model(torch.ones(2, 4)).sum().backward()
    assert [c.round for c in state.calls] == [3, 4] and state.rounds == {0: 5} and len(state.totals) == 1


class FakeBucket:
    """What the hook reads of a GradBucket, for a dtype DDP itself would not hand over."""

    def __init__(self, buf: Any) -> None:
        self.buf = buf

    def buffer(self) -> Any:
        return self.buf

    def index(self) -> int:
        return 0


@pytest.mark.parametrize("dtype", ["int32", "complex64"])
def test_unsupported_dtype(one_rank: None, dtype: str) -> None:
    state, hook = pt.comm_hook(permk.PermK(), seed=0)
    with pytest.raises(TypeError, match=f"torch.{dtype}"):
        hook(state, FakeBucket(torch.zeros(4, dtype=getattr(torch, dtype))))  # type: ignore[arg-type]


def test_world_size_not_matching(one_rank: None) -> None:
    with pytest.raises(ValueError, match=r"BlockPermK\(m=2\) does not fit the world size 1"):
        backward(permk.BlockPermK(2), torch.float32)


@pytest.mark.parametrize("compressor", [permk.TopK(2), permk.QSGD(4)], ids=["TopK", "QSGD"])
def test_no_shared_plan(compressor: permk.compressors.base.Compressor) -> None:
    with pytest.raises(ValueError, match="no shared plan"):
        pt.comm_hook(compressor, seed=0)


def test_argument_errors() -> None:
    with pytest.raises(TypeError, match="compressor"):
        pt.comm_hook("PermK", seed=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="seed"):
        pt.comm_hook(permk.PermK(), seed=None)  # type: ignore[arg-type]
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="not initialised"):
            pt.comm_hook(permk.PermK(), seed=0)


def test_shift_arguments(one_rank: None) -> None:
    with pytest.raises(ValueError, match="shift"):
        pt.comm_hook(permk.PermK(), seed=0, shift="ef22")
    with pytest.raises(ValueError, match="alpha"):
        pt.comm_hook(permk.PermK(), seed=0, alpha=0.5)
    with pytest.raises(ValueError, match="alpha"):
        pt.comm_hook(permk.PermK(), seed=0, shift="diana", alpha=1.5)
    with pytest.raises(ValueError, match="no shared plan"):
        pt.comm_hook(permk.TopK(2), seed=0, shift="diana")
    state, _ = pt.comm_hook(permk.TopK(2), seed=0, shift="ef21")
    assert state.shift == "ef21" and state._alpha(10) == 1.0
    assert pt.comm_hook(permk.PermK(), seed=0, shift="diana")[0]._alpha(10) == 1.0  # ω = n − 1 = 0: α = 1/(ω + 1)


def test_state_dict_round_trip_and_mismatches(one_rank: None) -> None:
    """state_dict holds plain numbers and CPU tensors; load_state_dict refuses another compressor,
    seed or shift, naming the field; a pickled state drops its process group and buffers."""
    import pickle

    state, hook = pt.comm_hook(permk.PermK(), seed=3, shift="diana")
    state.rounds, state.totals = {0: 5, 2: 4}, {0: [10, 12]}
    layout = (4, "torch.float32", ((4,),))
    state.shifts = {0: {layout: pt.hook.BucketShift(layout, torch.arange(4.0), torch.ones(4))}}
    sd = state.state_dict()
    assert sd["rounds"] == {0: 5, 2: 4} and sd["compressor"] == permk.PermK().fingerprint()
    other, _ = pt.comm_hook(permk.PermK(), seed=3, shift="diana")
    other.load_state_dict(sd)
    assert other.rounds == state.rounds and other.totals == state.totals
    assert torch.equal(other.shifts[0][layout].h, torch.arange(4.0)) and other.shifts[0][layout].fresh
    for kw, field in (({"compressor": permk.RandK(2)}, "compressor"), ({"seed": 4}, "seed"), ({"shift": None}, "shift")):
        args = {"compressor": permk.PermK(), "seed": 3, "shift": "diana", **kw}
        wrong, _ = pt.comm_hook(args.pop("compressor"), **args)
        with pytest.raises(ValueError, match=field):
            wrong.load_state_dict(sd)
    copy = pickle.loads(pickle.dumps(state))
    assert copy.process_group is None and copy._buckets == {} and copy.rounds == state.rounds
    assert torch.equal(copy.shifts[0][layout].hbar, torch.ones(4))


@pytest.mark.slow
def test_the_example_trains(tmp_path: Path) -> None:
    """examples/ddp_fashion_mnist.py --quick end to end on 2 ranks: the figure, and sane numbers."""
    from permk.problems.datasets import DataNotFoundError, load_fashion_mnist

    try:
        load_fashion_mnist(limit=1)
    except DataNotFoundError:
        pytest.skip("no Fashion-MNIST (apt-get install dataset-fashion-mnist, or set PERMK_DATA)")
    script = Path(__file__).resolve().parents[1] / "examples" / "ddp_fashion_mnist.py"
    fig, out = tmp_path / "ddp.png", tmp_path / "ddp.json"
    proc = subprocess.run([sys.executable, str(script), "--quick", "--figure", str(fig), "--json", str(out)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| PermK |" in proc.stdout and fig.stat().st_size > 20_000
    results = {r["method"]: r for r in json.loads(out.read_text())["results"]}
    assert set(results) == {"all-reduce", "fp16", "PermK", "BlockPermK"}
    d = results["PermK"]["d"]
    assert d == 784 * 32 + 32 + 32 * 10 + 10
    steps = results["PermK"]["rows"][-1]["step"]
    per_step = {m: r["rows"][-1]["bytes_sent"] / steps for m, r in results.items()}
    assert per_step == {"all-reduce": 4 * d, "fp16": 2 * d, "PermK": 4 * d / 2, "BlockPermK": 4 * d / 2}
    for r in results.values():
        first, last = r["rows"][0], r["rows"][-1]
        assert first["train_loss"] > 2.0 and last["train_loss"] < first["train_loss"] - 0.5, r["method"]
        assert last["test_acc"] > 0.45 and 0 < r["step_ms"] < 1e3, r["method"]
