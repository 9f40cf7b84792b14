#!/usr/bin/env bash
# procgroup-bench on a simulated cluster: procgroup tcp (the socket path) against torch
# gloo, side by side in one job per cluster size (docs/benchmarking.md, "A simulated cluster").
#
#   sudo scripts/simcluster-bench.sh [OUTDIR]          # default OUTDIR: simcluster-bench-out
#
# Needs root (network namespaces), /dev/net/tun, iproute2 and a venv with torch: .venv313
# (torch 2.15, or 2.14.1 where a pip cap holds it back; scripts/setup-dev.sh) or .venv-bench (torch 2.13, scripts/setup-bench-venv.sh). It measures this checkout (PYTHONPATH
# points at its core/ and backends/). Environment overrides, with their defaults:
#   HOSTS="4 8"  RATE=1gbit  DELAY=0.1ms  OPS=all_reduce,broadcast  SIZES=8,64K,4M,64M
#   COMPARE=torch  ROUNDS=3  PY=.venv313/bin/python (else .venv-bench's)
# Each cluster size writes OUTDIR/simcluster-<N>hosts.{txt,json,csv}; the table is on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${1:-simcluster-bench-out}
HOSTS=${HOSTS:-4 8}
RATE=${RATE:-1gbit}
DELAY=${DELAY:-0.1ms}
OPS=${OPS:-all_reduce,broadcast}
SIZES=${SIZES:-8,64K,4M,64M}
COMPARE=${COMPARE:-torch}
ROUNDS=${ROUNDS:-3}
# the torch baseline is the newest torch that installs: .venv313's (scripts/setup-dev.sh
# puts the newest torch that installs there: 2.15, or 2.14.1 under a pip cap), else .venv-bench's torch 2.13 CPU
if [ -z "${PY:-}" ]; then
  for cand in "$ROOT/.venv313/bin/python" "$ROOT/.venv-bench/bin/python"; do
    if [ -x "$cand" ] && "$cand" -c 'import torch' >/dev/null 2>&1; then PY=$cand; break; fi
  done
fi
if [ -z "${PY:-}" ] || [ ! -x "$PY" ]; then
  echo "no venv with torch: run scripts/setup-dev.sh 3.13 (or set PY=/path/to/python with torch)" >&2
  exit 2
fi
if [ "$(id -u)" != 0 ]; then
  echo "the simulated cluster needs root (network namespaces): run with sudo" >&2
  exit 2
fi
export PYTHONPATH="$ROOT/core:$ROOT/backends/tcp:$ROOT/backends/mpi:$ROOT/backends/gloo:$ROOT/backends/nccl${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
compare=()
[ -n "$COMPARE" ] && compare=(--compare "$COMPARE")
for n in $HOSTS; do
  echo "# simulated cluster: $n hosts, $RATE links, $DELAY one-way delay; load: $(cut -d' ' -f1-3 /proc/loadavg)"
  "$PY" -m procgroup.testing.simcluster --hosts "$n" --rate "$RATE" --delay "$DELAY" -v -- \
    "$PY" -m procgroup.bench -B tcp "${compare[@]}" --op "$OPS" --sizes "$SIZES" --rounds "$ROUNDS" -q \
    --json "$OUT/simcluster-${n}hosts.json" --csv "$OUT/simcluster-${n}hosts.csv" \
    2>&1 | grep -v "hostname of the client socket cannot be retrieved" | tee "$OUT/simcluster-${n}hosts.txt"
done
