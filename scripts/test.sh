#!/usr/bin/env bash
# Install the development environment (CPython 3.10 venv in .venv) and run every test.
# Extra arguments go to pytest, e.g. scripts/test.sh tests/test_backend_tcp.py -x
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-dev.sh
# the multi-host tests build network namespaces with iproute2 (skipped, with a reason, without it)
if ! command -v ip >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq iproute2) >/dev/null 2>&1 || echo "note: could not install iproute2"
fi
exec .venv/bin/python -m pytest "$@"
