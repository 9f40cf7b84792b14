#!/usr/bin/env bash
# Install procgroup with the tcp backend (CPython 3.10 venv in .venv) and run the
# 4-rank demo: every collective once, each rank printing what it got.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-dev.sh
exec .venv/bin/procgroup-run --nproc-per-node 4 examples/demo.py "$@"
