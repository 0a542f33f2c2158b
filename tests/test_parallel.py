"""Threads per process (permk.parallel): when permk starts several processes — a pool of cells,
MPI ranks on one machine — each gets ``cores // processes`` threads for the Rust kernels and
BLAS, so that processes × threads never exceed the cores; ``--threads`` / ``PERMK_THREADS``
set it by hand; on a busy machine the experiments take the free cores."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from threadpoolctl import threadpool_info

import permk.parallel as par
from permk import _core
from permk.experiments.grid import run_pool

from conftest import MPI_DIR, MPIEXEC


def test_threads_per_process_divides_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(par.ENV, raising=False)
    monkeypatch.setattr(par, "cores", lambda: 8)
    assert [par.threads_per_process(k) for k in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]
    monkeypatch.setenv(par.ENV, "3")
    assert par.threads_per_process(16) == 3
    for bad in ("0", "-2", "two", "1.5"):
        monkeypatch.setenv(par.ENV, bad)
        with pytest.raises(ValueError, match="PERMK_THREADS"):
            par.threads_per_process(1)
    with pytest.raises(ValueError):
        par.threads_per_process(0)


def _threads() -> tuple[int, set[int], str | None]:
    return _core.get_num_threads(), {int(p["num_threads"]) for p in threadpool_info() if p["user_api"] == "blas"}, \
        os.environ.get("OPENBLAS_NUM_THREADS")


def test_each_process_of_a_pool_gets_its_share_of_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(par.ENV, raising=False)
    got = run_pool(_threads, [()] * 2, jobs=2, desc="threads", total=2, progress=False)
    share = max(1, par.cores() // 2)
    for rust, blas, env in got:
        assert rust == share and blas == {share} and env == str(share)  # blas: every BLAS pool (numpy's OpenBLAS at least)
    monkeypatch.setenv(par.ENV, "3")
    assert {g[0] for g in run_pool(_threads, [()] * 2, jobs=2, desc="threads", total=2, progress=False)} == {3}


def test_limit_threads_sets_the_rust_pool_and_blas() -> None:
    before = _core.get_num_threads()
    try:
        assert par.limit_threads(1) == 1
        rust, blas, _ = _threads()
        assert rust == 1 and blas == {1}
        with pytest.raises(ValueError):
            par.limit_threads(0)
    finally:
        par.limit_threads(before)


def test_a_busy_machine_gets_the_free_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(par.ENV, raising=False)
    monkeypatch.setattr(par, "cores", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (2.0, 2.0, 2.0))
    busy = par.busy_threads(1, threads_fixed=False)
    assert busy is not None and busy[0] == 1 and "load average 2.0 on 2 cores" in busy[1] and "instead of 2" in busy[1]
    assert par.busy_threads(1, threads_fixed=True) is None  # the user chose
    assert par.busy_threads(2, threads_fixed=False) is None  # one thread per process already
    monkeypatch.setenv(par.ENV, "2")
    assert par.busy_threads(1, threads_fixed=False) is None
    monkeypatch.delenv(par.ENV)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.0, 2.0, 2.0))
    assert par.busy_threads(1, threads_fixed=False) is None  # half the cores free
    monkeypatch.setattr(par, "cores", lambda: 16)
    monkeypatch.setattr(os, "getloadavg", lambda: (12.5, 2.0, 2.0))
    # 16 cores, 12 of them busy: the 4 free ones shared by the processes
    assert [(par.busy_threads(k, threads_fixed=False) or (None,))[0] for k in (1, 2, 4, 16)] == [4, 2, 1, None]


def test_the_cli_takes_the_free_cores_on_a_busy_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from permk.cli import main

    monkeypatch.delenv(par.ENV, raising=False)
    monkeypatch.setattr(par, "cores", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0, 3.0, 3.0))
    before = _core.get_num_threads()
    try:
        assert main(["quadratic", "--quick", "--n", "10", "--noise-scales", "0", "--no-plot", "--no-progress", "--out", str(tmp_path)]) == 0
        assert _core.get_num_threads() == 1 and os.environ[par.ENV] == "1"
        assert "the machine is busy (load average 3.0 on 2 cores): 1 thread(s) per process instead of 2" in capsys.readouterr().err
    finally:
        monkeypatch.delenv(par.ENV, raising=False)
        par.limit_threads(before)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks,fixed", [(4, None), (1, None), (2, "3")])
def test_mpi_ranks_on_one_machine_share_its_cores(ranks: int, fixed: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k not in (par.ENV, "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    if fixed:
        env[par.ENV] = fixed
    proc = subprocess.run([str(MPIEXEC), "-n", str(ranks), sys.executable, str(MPI_DIR / "threads.py")], capture_output=True,
                          text=True, timeout=240, env=env, cwd=MPI_DIR, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    want = int(fixed) if fixed else max(1, par.cores() // ranks)
    lines = [list(map(int, line.split())) for line in proc.stdout.splitlines()]
    assert sorted(v[0] for v in lines) == list(range(ranks))
    assert all(v[1] == want and set(v[2:]) == {want} for v in lines), lines  # Rust pool, then every BLAS pool


def test_the_permk_command_lets_openblas_idle_threads_sleep(tmp_path: Path) -> None:
    """The ``permk`` command (argv[0] named permk, numpy not yet loaded) sets
    OPENBLAS_THREAD_TIMEOUT=4 unless it is set; ``import permk`` in a program changes nothing."""
    from permk._blas import command_setting

    assert command_setting("/usr/bin/permk", False) and not command_setting("/usr/bin/permk", True)
    assert not command_setting("script.py", False) and not command_setting("", False)
    base = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    fake = tmp_path / "permk"  # a script named as the command
    fake.write_text("import os, permk\nprint(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))\n")
    for env, want in (({}, "4"), ({"OPENBLAS_THREAD_TIMEOUT": "9"}, "9")):
        out = subprocess.run([sys.executable, str(fake)], env={**base, **env}, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == want
    out = subprocess.run([sys.executable, "-c", "import os, permk; print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))"], env=base,
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None"
