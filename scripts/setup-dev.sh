#!/usr/bin/env bash
# Create .venv (CPython 3.10) and install procgroup, every backend that can install here,
# and the test tools, all editable. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(scripts/find-python310.sh)
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test]" -e backends/tcp
# mpi brings the mpich wheel (a working mpiexec from pip alone); gloo needs pygloo
# (CPython 3.8-3.10 wheels); nccl brings cupy and the NCCL runtime wheels: without a GPU
# the backend is listed as unavailable, and its tests that need no GPU still run.
[ -f backends/mpi/pyproject.toml ] && .venv/bin/python -m pip install -q -e "backends/mpi[mpich]"
[ -f backends/gloo/pyproject.toml ] && .venv/bin/python -m pip install -q -e backends/gloo
[ -f backends/nccl/pyproject.toml ] && .venv/bin/python -m pip install -q -e "backends/nccl[cuda]"
echo "procgroup dev environment ready: $(.venv/bin/python --version) in .venv"
