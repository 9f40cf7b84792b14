#!/usr/bin/env bash
# Install procgroup with its backends (CPython 3.13 venv in .venv313, see
# scripts/setup-dev.sh) and run the 4-rank demo on the default tcp backend: every
# collective once, each rank printing what it got.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-dev.sh 3.13
exec .venv313/bin/procgroup-run --nproc-per-node 4 examples/demo.py "$@"
