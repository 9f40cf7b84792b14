#!/usr/bin/env bash
# Usage: scripts/docs.sh [SPHINX ARGS...]
# Build the documentation site (Sphinx + MyST: the guides of docs/ and the API reference
# generated from the docstrings) into build/docs/html, warnings as errors. Open
# build/docs/html/index.html ($PROCGROUP_DOCS_OUT replaces build/docs).
#
# Python: $PROCGROUP_DOCS_PYTHON, else .venv313's (scripts/setup-dev.sh), else a venv of
# its own, .venv-docs, with procgroup and its backends installed editable. The docs extra
# (sphinx, myst-parser, furo: docs dependencies only, never runtime ones) is installed
# there when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${PROCGROUP_DOCS_OUT:-build/docs}
py=${PROCGROUP_DOCS_PYTHON:-}
if [ -z "$py" ]; then
  if [ -x .venv313/bin/python ]; then
    py=.venv313/bin/python
  else
    # the marker is written only after a whole install succeeded, so a failed or
    # interrupted one is redone by the next run (the venv itself may already exist)
    if [ ! -f .venv-docs/.procgroup-installed ]; then
      if [ ! -x .venv-docs/bin/python ]; then
        base=$(bash scripts/find-python.sh 3.13 "The documentation builds on CPython 3.13 (PROCGROUP_DOCS_PYTHON picks another).")
        "$base" -m venv .venv-docs
      fi
      extras=()
      for b in tcp mpi gloo nccl; do [ -f "backends/$b/pyproject.toml" ] && extras+=(-e "backends/$b"); done
      .venv-docs/bin/python -m pip install -q --disable-pip-version-check -e ".[docs]" "${extras[@]}" \
        >.venv-docs/install.log 2>&1 || { cat .venv-docs/install.log >&2; exit 1; }
      touch .venv-docs/.procgroup-installed
    fi
    py=.venv-docs/bin/python
  fi
fi
if ! "$py" -c "import sphinx, myst_parser, furo" 2>/dev/null; then
  echo "scripts/docs.sh: installing the docs extra into $("$py" -c 'import sys; print(sys.prefix)')" >&2
  "$py" -m pip install -q --disable-pip-version-check -e ".[docs]"
fi
# -W --keep-going: every warning is an error, and all of them are reported at once;
# -E: read every file again (a docstring edited in the sources is seen)
exec "$py" -m sphinx -b html -W --keep-going -E -q -d "$out/doctrees" docs "$out/html" "$@"
