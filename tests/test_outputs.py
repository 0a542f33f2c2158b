"""What the experiments write and where: one run per output directory at a time (a lock that a
killed run does not leave behind), clear errors for an output directory that cannot be made or
written, atomic checkpoints, ``PERMK_THREADS`` read by every permk process and refused by every
command when it is not a positive integer, and progress output fit for a log file."""

from __future__ import annotations

import gzip
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import permk
from permk.experiments.results import LOCK_FILE, DirectoryInUseError, hold_directory, read_records

from conftest import run_cli

#: A grid of two cells that takes a few seconds.
SMALL = ["--quick", "--n", "10", "--noise-scales", "0", "0.8", "--max-multipliers", "2", "--rounds", "400", "--no-plot"]


def _keys(root: Path) -> list[str]:
    return [r["key"] for f in sorted((root / "runs").glob("*.jsonl")) for r in read_records(f)]


def _wait_for_line(proc: subprocess.Popen[str], text: str, timeout: float = 240) -> None:
    """Read ``proc``'s stdout until a line contains ``text`` (the process must print it)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if text in line:
            return
        if not line and proc.poll() is not None:
            break
    proc.kill()
    pytest.fail(f"the process never printed {text!r} (exit {proc.poll()}): {proc.stderr.read() if proc.stderr else ''}")


# ---------------------------------------------------------------------------------------------
# one run per output directory
# ---------------------------------------------------------------------------------------------


def test_a_directory_is_held_by_one_holder_at_a_time(tmp_path: Path) -> None:
    with hold_directory(tmp_path / "exp") as lock:
        assert lock == tmp_path / "exp" / LOCK_FILE
        assert lock.read_text().startswith(f"process {os.getpid()} (started ")
        with pytest.raises(DirectoryInUseError, match=rf"exp is in use by process {os.getpid()} \(started .*choose another --out"):
            with hold_directory(tmp_path / "exp"):
                pass  # pragma: no cover - refused
    with hold_directory(tmp_path / "exp"):  # released: taken again
        pass


def test_the_cli_refuses_a_directory_in_use_and_names_the_holder(tmp_path: Path) -> None:
    with hold_directory(tmp_path / "quadratic"):
        r = run_cli("quadratic", *SMALL, "--no-progress", "--out", str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert f"permk quadratic: error: {tmp_path / 'quadratic'} is in use by process {os.getpid()} (started " in r.stderr
    assert not (tmp_path / "quadratic" / "runs").exists()  # refused before anything was written


# A run that holds its directory after its grid (with --jobs 2: the pool's processes wrote the
# records while their parent held the lock) until it is killed.
_RUN_THEN_WAIT = """
import sys, time
import permk.experiments.grid as runner
from permk.cli import main

pool = runner.run_pool

def run_then_wait(*args, **kwargs):
    out = pool(*args, **kwargs)
    print("grid done", flush=True)
    time.sleep(600)
    return out

runner.run_pool = run_then_wait
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_second_run_is_refused_while_the_first_runs_and_not_after_it_is_killed(tmp_path: Path) -> None:
    args = ["quadratic", *SMALL, "--no-progress", "--out", str(tmp_path)]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    first = subprocess.Popen([sys.executable, "-c", _RUN_THEN_WAIT, *args, "--jobs", "2"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        _wait_for_line(first, "grid done")
        keys = _keys(tmp_path / "quadratic")
        assert len(keys) > 0 and len(set(keys)) == len(keys)
        second = run_cli(*args, "--resume")
        assert second.returncode == 2, second.stderr
        assert f"permk quadratic: error: {tmp_path / 'quadratic'} is in use by process {first.pid} (started " in second.stderr
    finally:
        first.kill()
        first.communicate()
    assert _keys(tmp_path / "quadratic") == keys  # the refused run wrote nothing
    # killed: the kernel released the lock with the process, so a new run takes the directory
    third = run_cli(*args, "--resume")
    assert third.returncode == 0, third.stderr
    assert _keys(tmp_path / "quadratic") == keys
    # and after a run that ended normally, too
    fourth = run_cli(*args, "--resume")
    assert fourth.returncode == 0, fourth.stderr
    assert _keys(tmp_path / "quadratic") == keys


def _children(pid: int) -> set[int]:
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


_POOL_THAT_SLEEPS = """
import time
from permk.experiments.grid import run_pool

print("pool", flush=True)
run_pool(time.sleep, [(600,), (600,)], jobs=2, desc="sleep", total=2, progress=False)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux's")
def test_the_pool_processes_end_when_their_parent_is_killed() -> None:
    """Else they would go on appending records after the killed run's lock is gone."""
    parent = subprocess.Popen([sys.executable, "-c", _POOL_THAT_SLEEPS], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        _wait_for_line(parent, "pool")
        deadline = time.monotonic() + 120
        workers: set[int] = set()
        while time.monotonic() < deadline:
            # the two pool processes (the resource tracker is the third child and ends by itself)
            workers = {p for p in _children(parent.pid) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()}
            if len(workers) == 2:
                break
            time.sleep(0.2)
        assert len(workers) == 2
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.communicate()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() and _alive(p) for p in workers):
        time.sleep(0.2)
    assert not any(Path(f"/proc/{p}").exists() and _alive(p) for p in workers)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for init to reap it does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


# ---------------------------------------------------------------------------------------------
# output directories that cannot be made or written
# ---------------------------------------------------------------------------------------------


def _idx_images(path: Path, n: int) -> None:
    X = (np.random.default_rng(0).random((n, 8, 8)) * 255).astype(np.uint8)
    path.write_bytes(gzip.compress(bytes([0, 0, 8, 3]) + struct.pack(">3I", n, 8, 8) + X.tobytes()))


def _experiment(cmd: str, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """The arguments (a tiny grid) and environment of ``permk quadratic`` / ``autoencoder``."""
    if cmd == "quadratic":
        return ["quadratic", *SMALL, "--no-progress"], {}
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    _idx_images(data / "train-images-idx3-ubyte.gz", 60)
    return ["autoencoder", "--workers", "5", "--p-hat", "0", "--lam", "0.001", "--encoding", "2", "--rounds", "20",
            "--max-multipliers", "1", "--no-progress", "--no-plot"], {"PERMK_DATA": str(data)}


@pytest.mark.parametrize("cmd", ["quadratic", "autoencoder"])
def test_an_output_directory_that_cannot_be_made_is_an_error_line(cmd: str, tmp_path: Path) -> None:
    args, env = _experiment(cmd, tmp_path)
    (tmp_path / "file").write_text("x")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / cmd).write_text("x")  # the experiment directory's name is a file's
    for out, why in [(tmp_path / "file" / "b", "Not a directory"), (tmp_path / "taken", "File exists"),
                     (Path("/proc/permk-cannot-be-made"), "No such file or directory")]:
        r = run_cli(*args, "--out", str(out), env=env)
        assert r.returncode == 2, r.stderr
        assert f"permk {cmd}: error: cannot create the experiment directory {out / cmd} (" in r.stderr and why in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_output_directory_is_an_error_line(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        r = run_cli("quadratic", *SMALL, "--no-progress", "--out", str(ro))
    finally:
        ro.chmod(0o755)
    assert r.returncode == 2 and "permk quadratic: error: " in r.stderr and "Permission denied" in r.stderr, r.stderr


def test_plot_figures_that_cannot_be_written_is_an_error_line(tmp_path: Path) -> None:
    r = run_cli("quadratic", *SMALL, "--no-progress", "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    (tmp_path / "file").write_text("x")
    r = run_cli("plot", str(tmp_path / "out"), "--figures", str(tmp_path / "file" / "figs"))
    assert r.returncode == 2 and f"permk plot: error: {tmp_path / 'file' / 'figs'}: Not a directory" in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------------
# atomic checkpoints
# ---------------------------------------------------------------------------------------------


def _two_states() -> tuple[permk.MarinaState, permk.MarinaState]:
    q = permk.Quadratic.synthetic(4, 6, lam=1e-2, noise_scale=0.1, seed=0)
    r = permk.marina(q, permk.PermK(), rounds=3, seed=0)
    return r.state, permk.marina(q, permk.PermK(), rounds=2, seed=0, state=r.state).state


def test_save_state_keeps_numpys_file_names(tmp_path: Path) -> None:
    s, _ = _two_states()
    permk.save_state(s, tmp_path / "a")  # numpy appends .npz
    permk.save_state(s, str(tmp_path / "b.npz"))
    with open(tmp_path / "c.npz", "wb") as fh:  # an open file is written in place
        permk.save_state(s, fh)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npz", "b.npz", "c.npz"]
    for name in ("a.npz", "b.npz", "c.npz"):
        assert permk.load_state(tmp_path / name).round == s.round


def test_save_state_through_a_symlink_replaces_its_target_and_names_a_missing_directory(tmp_path: Path) -> None:
    old, new = _two_states()
    permk.save_state(old, tmp_path / "real.npz")
    (tmp_path / "link.npz").symlink_to(tmp_path / "real.npz")
    permk.save_state(new, tmp_path / "link.npz")
    assert (tmp_path / "link.npz").is_symlink() and permk.load_state(tmp_path / "real.npz").round == new.round
    with pytest.raises(FileNotFoundError, match=r"No such file or directory: '.*nowhere/ck\.npz'"):
        permk.save_state(new, tmp_path / "nowhere" / "ck")


def test_a_failed_save_leaves_the_old_checkpoint_whole_and_no_temporary_file(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    old, new = _two_states()
    path = tmp_path / "ck.npz"
    permk.save_state(old, path)
    before = path.read_bytes()
    savez = np.savez

    def half_then_fail(file, *args, **kwargs):  # type: ignore[no-untyped-def]
        savez(file, *args, **kwargs)
        file.truncate(100)  # a partial write on disk, then the failure
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", half_then_fail)
    with pytest.raises(OSError, match="No space left"):
        permk.save_state(new, path)
    monkeypatch.undo()
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["ck.npz"]
    assert permk.load_state(path).round == old.round
    permk.save_state(new, path)
    assert permk.load_state(path).round == new.round and [p.name for p in tmp_path.iterdir()] == ["ck.npz"]


_KILLED_WHILE_SAVING = """
import os, signal, sys
import numpy as np
import permk

q = permk.Quadratic.synthetic(4, 6, lam=1e-2, noise_scale=0.1, seed=0)
state = permk.marina(q, permk.PermK(), rounds=7, seed=0).state
savez = np.savez

def half_then_killed(file, *args, **kwargs):
    savez(file, *args, **kwargs)
    file.truncate(100)
    file.flush()
    os.kill(os.getpid(), signal.SIGKILL)

np.savez = half_then_killed
permk.save_state(state, sys.argv[1])
"""


def test_a_process_killed_while_it_saves_leaves_the_old_checkpoint_whole(tmp_path: Path) -> None:
    old, _ = _two_states()
    path = tmp_path / "ck.npz"
    permk.save_state(old, path)
    before = path.read_bytes()
    r = subprocess.run([sys.executable, "-c", _KILLED_WHILE_SAVING, str(path)], capture_output=True, timeout=120)
    assert r.returncode == -signal.SIGKILL
    assert path.read_bytes() == before and permk.load_state(path).round == old.round
    assert [p.name for p in tmp_path.iterdir() if p.name != "ck.npz"] != []  # the killed write's temporary file


# ---------------------------------------------------------------------------------------------
# PERMK_THREADS
# ---------------------------------------------------------------------------------------------

BAD_THREADS = ["abc", "0", "-3", "1.5", "5000"]


@pytest.mark.parametrize("value", BAD_THREADS)
def test_a_bad_permk_threads_is_refused_by_the_demo(value: str) -> None:
    r = run_cli("demo", "--rounds", "10", env={"PERMK_THREADS": value})
    assert r.returncode == 2 and r.stdout == ""
    assert f"permk demo: error: PERMK_THREADS must be a positive integer (at most 1024), got {value!r}" in r.stderr, r.stderr


@pytest.mark.parametrize("args", [["complexity", "--n", "10", "--d", "100", "--L-minus", "1", "--L-plus", "1", "--L-pm", "1",
                                   "--eps", "1e-3", "--delta0", "1"], ["plot", "nowhere"], ["quadratic", *SMALL],
                                  ["autoencoder", "--quick"]], ids=lambda a: a[0])
def test_a_bad_permk_threads_is_refused_by_every_command(args: list[str], tmp_path: Path) -> None:
    extra = ["--out", str(tmp_path)] if args[0] in ("quadratic", "autoencoder") else []
    r = run_cli(*args, *extra, env={"PERMK_THREADS": "abc"})
    assert r.returncode == 2 and f"permk {args[0]}: error: PERMK_THREADS must be a positive integer" in r.stderr, r.stderr
    assert not any(tmp_path.iterdir())


_THREADS_OF_A_SCRIPT = ("import permk, threadpoolctl; print(permk._core.get_num_threads(), "
                        "sorted({p['num_threads'] for p in threadpoolctl.threadpool_info() if p['user_api'] == 'blas'}))")


def test_a_plain_import_applies_permk_threads() -> None:
    r = subprocess.run([sys.executable, "-c", _THREADS_OF_A_SCRIPT], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PERMK_THREADS": "1"})
    assert r.returncode == 0 and r.stdout.split(maxsplit=1) == ["1", "[1]\n"], r.stdout + r.stderr


@pytest.mark.parametrize("value", BAD_THREADS)
def test_a_plain_import_warns_of_a_bad_permk_threads_and_keeps_the_default(value: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RAYON_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    default = subprocess.run([sys.executable, "-c", _THREADS_OF_A_SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    r = subprocess.run([sys.executable, "-c", _THREADS_OF_A_SCRIPT], capture_output=True, text=True, timeout=120,
                       env={**env, "PERMK_THREADS": value})
    assert r.returncode == 0 and r.stdout == default.stdout, r.stderr
    assert f"RuntimeWarning: PERMK_THREADS must be a positive integer (at most 1024), got {value!r}" in r.stderr
    strict = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", "import permk"], capture_output=True, text=True,
                            timeout=120, env={**env, "PERMK_THREADS": value})
    assert strict.returncode != 0 and "PERMK_THREADS" in strict.stderr


# ---------------------------------------------------------------------------------------------
# progress bars in a log file
# ---------------------------------------------------------------------------------------------


def test_progress_to_a_pipe_has_no_nested_bars(tmp_path: Path) -> None:
    r = run_cli("quadratic", *SMALL, "--out", str(tmp_path))  # stderr is a pipe
    assert r.returncode == 0, r.stderr
    assert "quadratic: 100%" in r.stderr  # the grid's bar, drawn in place
    assert "\x1b[A" not in r.stderr
