#!/usr/bin/env bash
# Usage: scripts/setup-dev.sh [VERSION...]
# Create the development venvs and install procgroup, every backend that can install
# there, and the test tools, all editable. Safe to re-run.
#
# Versions (X.Y): the arguments, else $PROCGROUP_TEST_PYTHONS, else "3.13 3.10":
#   3.13 -> .venv313  the newest CPython procgroup supports: the default environment
#   3.10 -> .venv     the pygloo leg: pygloo (a gloo engine) has CPython 3.8-3.10 wheels only
#   X.Y  -> .venvXY   any other version
# Each interpreter is found by scripts/find-python.sh (PATH, then pyenv; override with
# PROCGROUP_PYTHON_3_13=/path/to/python3.13 and so on); a missing one is an error that
# says how to get it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/pythons.sh
versions=("$@")
[ ${#versions[@]} -gt 0 ] || read -r -a versions <<<"${PROCGROUP_TEST_PYTHONS:-$PROCGROUP_DEFAULT_PYTHONS}"

# Find every interpreter first, so a missing one is reported before anything is installed.
declare -A pys=()
for ver in "${versions[@]}"; do
  pys[$ver]=$(bash scripts/find-python.sh "$ver" "$(procgroup_python_why "$ver")")
done

for ver in "${versions[@]}"; do
  venv=$(procgroup_venv "$ver")
  py=${pys[$ver]}
  if [ -x "$venv/bin/python" ] && ! "$venv/bin/python" -c \
      "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$ver'.split('.'))))" 2>/dev/null; then
    echo "error: $venv exists but is not CPython $ver; remove it and re-run" >&2
    exit 1
  fi
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  pip=("$venv/bin/python" -m pip)
  "${pip[@]}" install -q --upgrade pip
  "${pip[@]}" install -q -e ".[test,docs]" -e backends/tcp
  # mpi brings the mpich wheel (a working mpiexec from pip alone). gloo has two engines:
  # pygloo, a dependency only where it has wheels (CPython 3.8-3.10, x86-64 Linux), and
  # torch's ProcessGroupGloo (the [torch] extra, every version): with both, the gloo tests
  # run on each engine. torch installs as the CUDA build (about 5 GB, 2 minutes here, see
  # docs/install.md); PROCGROUP_DEV_TORCH=0 leaves it out (then gloo runs on pygloo alone,
  # and on 3.11+ its tests skip, saying why).
  # nccl brings cupy and the NCCL runtime wheels: without a GPU the backend is listed as
  # unavailable, and its tests that need no GPU still run.
  [ -f backends/mpi/pyproject.toml ] && "${pip[@]}" install -q -e "backends/mpi[mpich]"
  if [ -f backends/gloo/pyproject.toml ]; then
    if [ "${PROCGROUP_DEV_TORCH:-1}" = 0 ]; then
      "${pip[@]}" install -q -e backends/gloo
    else
      "${pip[@]}" install -q -e "backends/gloo[torch]"
    fi
  fi
  [ -f backends/nccl/pyproject.toml ] && "${pip[@]}" install -q -e "backends/nccl[cuda]"
  engines=$("$venv/bin/python" -c '
import importlib.util as u
found = [m for m in ("pygloo", "torch") if u.find_spec(m)]
print("gloo engines: " + (", ".join(found) or "none"))' 2>/dev/null || echo "gloo engines: unknown")
  echo "procgroup dev environment ready: $("$venv/bin/python" --version) in $venv ($engines)"
done
