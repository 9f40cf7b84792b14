#!/usr/bin/env bash
# Usage: scripts/gpu-check.sh
# Every GPU check in one call, for a machine with a CUDA GPU that may be at hand only
# briefly and without network (docs/backends/nccl.md, "GPU check"). In under 8 minutes:
#   1. a venv (.venv-gpu) over the machine's own packages (CuPy, NCCL, NumPy, mpi4py,
#      pluggy, pytest), procgroup and its backends installed editable with --no-deps, and
#      whatever else is missing from .gpu-wheels/ (made here beforehand by
#      scripts/gpu-wheels.sh, carried with the checkout; nothing is downloaded);
#   2. the GPU tests: every test marked gpu, the nccl backend's and CUDA staging tests, the
#      nccl survival tests, and master-worker's .cuda();
#   3. the benchmark: procgroup's nccl against raw CuPy NCCL on this GPU
#      (procgroup-bench -B nccl --compare raw, and scripts/gpu_bench_nccl.py).
# Without a GPU it says so and exits 0 (PROCGROUP_GPU_CHECK_FORCE=1 runs every step anyway,
# the tests then skip with their reasons: a rehearsal of the script itself).
# Results go to gpu-check-out/ (and $OUT when set): the logs, the bench table, a summary.
# Python: $PROCGROUP_GPU_PYTHON, else python3.12, else python3.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
out=gpu-check-out
rm -rf "$out"
mkdir -p "$out"
summary=()
note() { echo "gpu-check: $*"; summary+=("$*"); }
finish() {
  printf '%s\n' "${summary[@]}" >"$out/summary.txt"
  if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then cp -r "$out"/. "$OUT"/ 2>/dev/null || true; fi
  echo "=== gpu-check summary ($((SECONDS - start)) s; logs in $out/)"
  printf '  %s\n' "${summary[@]}"
  exit "$1"
}

# ------------------------------------------------------------------ is there a GPU?
gpus=""
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
fi
if [ -z "$gpus" ] || [ "$gpus" = 0 ]; then
  if [ "${PROCGROUP_GPU_CHECK_FORCE:-0}" != 1 ]; then
    note "no GPU here (no nvidia-smi on PATH, or it lists no GPU): nothing to check; run this on a machine with a CUDA GPU"
    finish 0
  fi
  note "no GPU here; PROCGROUP_GPU_CHECK_FORCE=1: rehearsing every step (the GPU tests skip)"
else
  note "$gpus GPU(s): $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
fi

# ------------------------------------------------------------------ install, offline
py=${PROCGROUP_GPU_PYTHON:-}
[ -n "$py" ] || py=$(command -v python3.12 || command -v python3 || true)
[ -n "$py" ] || { note "no python3 found (set PROCGROUP_GPU_PYTHON)"; finish 1; }
venv=.venv-gpu
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv --system-site-packages "$venv" >"$out/install.log" 2>&1 || { note "venv failed (see install.log)"; finish 1; }
fi
vpy=$venv/bin/python
pipi=("$vpy" -m pip install -q --disable-pip-version-check --no-index --no-warn-script-location)
wheels=()
[ -d .gpu-wheels ] && wheels=(--find-links .gpu-wheels)
{
  # what the machine lacks, from the carried wheels only (installed ones are kept)
  missing=()
  "$vpy" -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 77)" 2>/dev/null \
    || missing+=("setuptools>=77")
  for mod_req in "pytest_timeout:pytest-timeout>=2" "pytest:pytest>=7" "pluggy:pluggy>=1.3" \
                 "numpy:numpy>=1.23"; do
    "$vpy" -c "import ${mod_req%%:*}" 2>/dev/null || missing+=("${mod_req#*:}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "from .gpu-wheels: ${missing[*]}"
    "${pipi[@]}" "${wheels[@]}" "${missing[@]}"
  fi
  # procgroup and every backend that is here, editable, with no dependency resolution
  pkgs=(-e .)
  for b in tcp nccl mpi gloo; do [ -f "backends/$b/pyproject.toml" ] && pkgs+=(-e "backends/$b"); done
  "${pipi[@]}" --no-deps --no-build-isolation "${pkgs[@]}"
} >>"$out/install.log" 2>&1
if ! "$vpy" -c "import procgroup, procgroup_tcp, procgroup_nccl, pytest_timeout" >>"$out/install.log" 2>&1; then
  tail -20 "$out/install.log"
  note "install failed (see install.log; did scripts/gpu-wheels.sh run here and .gpu-wheels travel?)"
  finish 1
fi
note "installed in $((SECONDS - start)) s: $("$vpy" --version), cupy $("$vpy" -c 'import cupy; print(cupy.__version__)' 2>/dev/null || echo missing), nccl $("$vpy" -c 'from cupy.cuda import nccl; print(nccl.get_version())' 2>/dev/null || echo missing)"
"$vpy" -m procgroup info >"$out/procgroup-info.txt" 2>&1 || true

# ------------------------------------------------------------------ the GPU tests
failed=0
run_step() {  # name, seconds, command...
  local name=$1 limit=$2
  shift 2
  # the whole check stays under 8 minutes: a step that could run past 470 s is cut short
  local left=$((470 - (SECONDS - start)))
  if [ "$left" -lt 20 ]; then note "$name: not run (the 8-minute budget is spent)"; failed=1; return; fi
  [ "$limit" -le "$left" ] || limit=$left
  local t0=$SECONDS rc=0
  timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1 || rc=$?
  local last
  last=$(grep -E '(passed|failed|skipped|deselected|error|no tests ran).* in [0-9.]+s' "$out/$name.log" | tail -1 | sed -E 's/^=+ //; s/ =+$//')
  [ "$rc" = 124 ] && last="TIMED OUT after $limit s; $last"
  note "$name: ${last:-exit $rc} (exit $rc, $((SECONDS - t0)) s)"
  [ "$rc" = 0 ] || failed=1
}
export PROCGROUP_DEV_TORCH=${PROCGROUP_DEV_TORCH:-0}  # no torch there: gloo's torch engine skips, saying so
pytest=("$vpy" -m pytest -q -rs -p no:cacheprovider)
marked=$(grep -l "mark.gpu" tests/test_*.py | tr '\n' ' ')
# shellcheck disable=SC2086 # the file list splits on purpose
run_step gpu-marked 100 "${pytest[@]}" -m gpu $marked
run_step nccl-and-staging 140 "${pytest[@]}" tests/test_backend_nccl.py tests/test_cuda_staging.py tests/test_survive_nccl.py
run_step master-worker-cuda 70 "${pytest[@]}" tests/test_master_worker.py -k "test_tcp and cuda"

# ------------------------------------------------------------------ the benchmark
# procgroup-bench on CuPy buffers (a sweep with -B nccl), raw-nccl beside it (--compare
# raw); one GPU: one rank. Then the same comparison by a small script of its own, which
# depends on nothing but CuPy and procgroup (a cross-check of the first).
bench=("$venv/bin/procgroup-bench" -B nccl -np 1 --compare raw -o all_reduce,broadcast,all_gather,reduce_scatter
       -e 256M -q --json "$out/bench-nccl.json")
if [ -n "$gpus" ] && [ "$gpus" != 0 ]; then
  run_step bench-nccl 50 "${bench[@]}"
  run_step bench-nccl-direct 30 "$vpy" scripts/gpu_bench_nccl.py --max-bytes 256M
else
  run_step bench-nccl 50 "${bench[@]}" -e 1K
  run_step bench-nccl-direct 30 "$vpy" scripts/gpu_bench_nccl.py --dry-run
fi
note "figures: gpu-check-out/bench-nccl.log and bench-nccl-direct.log; copy the tables into docs/backends/nccl.md (GPU check)"
finish "$failed"
