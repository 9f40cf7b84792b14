#!/usr/bin/env bash
# Usage: scripts/demo.sh [DEMO ARGS...]
# The first run: install what the demo needs, the core and the tcp backend (with their
# dependencies: NumPy, pluggy; no torch, no other backend), into a venv of its own,
# .venv-demo, then run the 4-rank demo on the default tcp backend: every collective once,
# each rank printing what it got. The dev venvs (.venv313, .venv) are scripts/setup-dev.sh's.
#
# Quiet on purpose: the installer's output goes to .venv-demo/install.log and is shown only
# when the install fails. The install is editable (source edits take effect) and redone
# only when a pyproject.toml changed. Python: CPython 3.13, else 3.12, 3.11 or 3.10 (see
# scripts/find-python.sh; PROCGROUP_PYTHON=/path/to/python picks one).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-demo
stamp=$venv/procgroup-demo.stamp
want=$(cat pyproject.toml backends/tcp/pyproject.toml | cksum)

if [ ! -x "$venv/bin/procgroup-run" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  py=
  for ver in 3.13 3.12 3.11 3.10; do
    py=$(bash scripts/find-python.sh "$ver" 2>/dev/null) && break
  done
  # none found: let find-python explain how to get the default one
  [ -n "$py" ] || py=$(bash scripts/find-python.sh 3.13 "The demo runs on CPython 3.10 to 3.13.")
  echo "procgroup demo: installing the core and the tcp backend into $venv ($("$py" --version)) ..."
  rm -rf "$venv"
  "$py" -m venv "$venv"
  log=$venv/install.log
  pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check --no-warn-script-location --no-compile)
  # setuptools first, then the two editable installs build without an isolated build
  # env each (half the install time); --no-compile: imports compile what they use
  if ! { "${pip[@]}" "setuptools>=77" &&
         "${pip[@]}" --no-build-isolation -e . -e backends/tcp; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "procgroup demo: the install failed (the installer's messages are above, and in $log)" >&2
    exit 1
  fi
  echo "$want" >"$stamp"
fi
exec "$venv/bin/procgroup-run" --nproc-per-node 4 examples/demo.py "$@"
