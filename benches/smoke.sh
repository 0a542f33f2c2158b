#!/usr/bin/env bash
# Every bench's smoke mode (`--smoke`: tiny sizes, seconds each), so that a bench that no longer
# runs fails CI. The numbers are not checked here (they stay out of the tests); a bench fails
# when it exits non-zero. Every benches/bench_*.py is run, so a new bench must have a smoke mode.
# Benches that need what the machine lacks (torch; root and tc for bench_network) say so and
# exit 0 (bench_ddp_compare's smoke run needs torch only: it skips its wall-clock stage, the one
# that needs root and tc). Runs them all, then exits 1 if any failed, naming them.
#
#   benches/smoke.sh                 # with `python`
#   PYTHON=/path/to/python benches/smoke.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
# one thread per BLAS/OpenMP pool unless set: the MPI benches start several processes
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
failed=()
start_all=$SECONDS
for bench in benches/bench_*.py; do
    echo "+ $PY $bench --smoke"
    start=$SECONDS
    if timeout 600 "$PY" "$bench" --smoke >"$log" 2>&1; then
        echo "  ok ($((SECONDS - start)) s)"
    else
        rc=$?
        echo "  FAILED (exit $rc, $((SECONDS - start)) s); its last lines:"
        tail -n 40 "$log" | sed 's/^/  | /'
        failed+=("$bench")
    fi
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "bench smoke runs failed: ${failed[*]}" >&2
    exit 1
fi
echo "every bench's smoke run passed in $((SECONDS - start_all)) s"
