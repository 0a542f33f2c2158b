#!/usr/bin/env bash
# The GPU checks of permk's DDP hook (issue 36 item 2): tests/gpu/gpu_checks.py on the first CUDA
# device, within about 4 minutes; a PASS/FAIL summary at the end, and $OUT/gpu_checks.json when
# OUT is set. Exit status 0: passed (or skipped: no CUDA device); 1: a check failed; 2: permk
# cannot be imported.
#
#   bash tests/gpu/run_gpu_checks.sh [--quick] [--budget SECONDS]     # from anywhere
#
# Needs nothing to be built or fetched on the GPU machine: python3 (>= 3.11; PYTHON=... to pick
# another) with a CUDA build of torch, numpy, scipy, matplotlib, tqdm and threadpoolctl (the
# device image has them), and permk importable: installed, or this checkout's python/ folder with
# the native core built here (python/permk/_core.abi3.so, git-ignored: an abi3 x86-64 Linux build,
# which `pip install -e .` leaves there; carry it along).
set -u
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
if ! "$PY" -c "import permk._core, torch" 2>/tmp/permk_gpu_import.log; then
  echo "cannot import permk's native core or torch with $PY:"; tail -3 /tmp/permk_gpu_import.log
  echo "build it (pip install -e .) or carry python/permk/_core.abi3.so; == permk GPU checks: FAIL (not importable) =="
  exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi -L
exec timeout -k 5 235 "$PY" tests/gpu/gpu_checks.py "$@"
