"""A rate-limited loopback for the benches that time communication (not a bench itself).

:class:`LimitedLoopback` makes a network namespace whose loopback sends at most a given rate,
through a token bucket (``tc qdisc ... tbf``), MTU 9000 and a burst above it::

    ip netns add NS; ip -n NS link set lo up; ip -n NS link set lo mtu 9000
    ip netns exec NS tc qdisc add dev lo root tbf rate 1gbit burst 512kb latency 100ms

Processes started with its ``prefix`` (``ip netns exec NS``) talk through that loopback: MPI
over libfabric's tcp provider, gloo over TCP. All of them share the one limiter (a shared link).
The burst must exceed the MTU (a smaller one drops every full packet and hangs the run). Every
namespace is removed when its ``with`` block ends; :func:`remove_live_namespaces` removes those
still alive (call it in a ``finally``) and :func:`on_signal`, installed for SIGTERM/SIGINT/SIGHUP,
turns a signal into ``SystemExit`` so the ``with`` blocks unwind. Needs root and iproute2
(:func:`unavailable` says why not). Used by ``bench_network.py`` and ``bench_ddp_compare.py``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
from typing import Any, Sequence

#: one BLAS/OpenMP thread per rank (the ranks share the machine's cores)
THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
#: the token bucket: a burst above the MTU (9000) and the queue's latency bound
TBF = ("burst", "512kb", "latency", "100ms")

_LIVE: set[str] = set()
_COUNTER = itertools.count()


def _sh(*cmd: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise subprocess.SubprocessError(f"{' '.join(cmd)}: {proc.stderr.strip() or proc.returncode}")


class LimitedLoopback:
    """A network namespace whose loopback sends at most ``rate`` (tc's syntax: ``100mbit``,
    ``1gbit``; None: no limit), MTU 9000; removed when the ``with`` block ends, whatever happens
    in it. ``prefix`` runs a command inside it."""

    def __init__(self, rate: str | None) -> None:
        self.rate = rate
        self.name = f"permk-bench-{os.getpid()}-{next(_COUNTER)}"

    def __enter__(self) -> "LimitedLoopback":
        _sh("ip", "netns", "add", self.name)
        _LIVE.add(self.name)
        try:
            _sh("ip", "-n", self.name, "link", "set", "lo", "up")
            _sh("ip", "-n", self.name, "link", "set", "lo", "mtu", "9000")
            if self.rate is not None:
                _sh(*self.prefix, "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", self.rate, *TBF)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self.name in _LIVE:
            subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)
            _LIVE.discard(self.name)

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]


def unavailable() -> str | None:
    """Why this machine cannot make a rate-limited namespace (None if it can): root, ``ip``,
    ``tc``, and one namespace with a token bucket really made and removed."""
    if os.geteuid() != 0:
        return "it needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    try:
        with LimitedLoopback("1gbit"):
            pass
    except (OSError, subprocess.SubprocessError) as exc:
        return f"a rate-limited network namespace cannot be made here: {exc}"
    return None


def remove_live_namespaces() -> None:
    """Remove every namespace this process made that is still alive."""
    for name in list(_LIVE):
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        _LIVE.discard(name)


def on_signal(signum: int, frame: Any) -> None:
    """A signal handler: ``SystemExit``, which unwinds the ``with`` blocks (they remove their namespaces)."""
    raise SystemExit(128 + signum)


def install_signal_handlers() -> None:
    """:func:`on_signal` for SIGTERM, SIGINT and SIGHUP."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)


def kill_groups(procs: Sequence[subprocess.Popen[Any]]) -> None:
    """Kill, by its group id, every process of ``procs`` (each started with
    ``start_new_session=True``) still running, with what it started, and reap it (its pipes
    drained), so nothing outlives its namespace."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.communicate()


def run_group(cmd: Sequence[str], *, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` in a process group of its own; on a timeout or an interruption the whole group
    (mpiexec and the ranks it started) is killed, by its id, so nothing outlives its namespace."""
    proc = subprocess.Popen(list(cmd), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        kill_groups([proc])
        raise
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)


def rate_bits(rate: str | None) -> float | None:
    """tc's rate syntax (``100mbit``, ``1gbit``, ``500kbit``) in bits per second."""
    if rate is None:
        return None
    for unit, f in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * f
    raise ValueError(f"rate {rate!r}: use tc's syntax, e.g. 100mbit or 1gbit")


def rate_label(rate: str | None) -> str:
    """``100mbit`` → ``100 Mbit/s``, ``1gbit`` → ``1 Gbit/s``, None → ``no limit``."""
    if rate is None:
        return "no limit"
    b = rate_bits(rate)
    assert b is not None
    return f"{b / 1e9:g} Gbit/s" if b >= 1e9 else f"{b / 1e6:g} Mbit/s"
