#!/usr/bin/env bash
# Create .venv-bench (CPython 3.11) for `procgroup-bench --compare torch`.
#
# Why a second venv: torch 2.13 (CPU) is available here for CPython 3.11 only, while
# pygloo (the gloo backend and the raw-pygloo comparison) has wheels for 3.8-3.10 only,
# so the dev venv (.venv, 3.10) cannot hold torch. This venv gets procgroup (editable),
# the tcp backend, the mpi backend when present (it brings mpich, so mpiexec works and
# raw mpi4py comparisons run too), numpy, matplotlib and torch==2.13.0. Safe to re-run.
#
# Override the interpreter with PROCGROUP_BENCH_PYTHON=/path/to/python3.11.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python311() {
  local candidates=() c p
  [ -n "${PROCGROUP_BENCH_PYTHON:-}" ] && candidates+=("$PROCGROUP_BENCH_PYTHON")
  if command -v pyenv >/dev/null 2>&1; then
    local root
    root=$(pyenv root)
    for d in "$root"/versions/3.11*; do
      [ -x "$d/bin/python3.11" ] && candidates+=("$d/bin/python3.11")
    done
  fi
  for d in "$HOME"/.pyenv/versions/3.11*; do
    [ -x "$d/bin/python3.11" ] && candidates+=("$d/bin/python3.11")
  done
  candidates+=(python3.11 /usr/local/bin/python3.11 /usr/bin/python3.11)
  for c in "${candidates[@]}"; do
    p=$(command -v "$c" 2>/dev/null || true)
    if [ -n "$p" ] && "$p" -c 'import sys, venv; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

if ! py=$(find_python311); then
  cat >&2 <<'MSG'
error: no CPython 3.11 interpreter found.
.venv-bench needs CPython 3.11 because the torch 2.13 CPU wheel used by
`procgroup-bench --compare torch` exists for CPython 3.11 only. Install one, e.g.
    pyenv install 3.11            (pyenv's versions are found automatically)
    apt-get install python3.11 python3.11-venv
or point PROCGROUP_BENCH_PYTHON at a 3.11 interpreter, then re-run this script.
Everything except `--compare torch` also works from the dev venv (.venv).
MSG
  exit 1
fi

if [ ! -x .venv-bench/bin/python ]; then
  "$py" -m venv .venv-bench
fi
pip=(.venv-bench/bin/python -m pip)
"${pip[@]}" install -q --upgrade pip
"${pip[@]}" install -q -e ".[test]" -e backends/tcp numpy matplotlib "torch==2.13.0"
# The mpi backend brings the mpich wheel (mpiexec) and mpi4py: raw-mpi4py comparisons.
if [ -f backends/mpi/pyproject.toml ]; then
  "${pip[@]}" install -q -e "backends/mpi[mpich]"
fi
echo "procgroup bench environment ready: $(.venv-bench/bin/python --version) in .venv-bench"
echo "try: .venv-bench/bin/procgroup-bench -np 2 --backend tcp --compare torch --max-bytes 1M"
