#!/usr/bin/env bash
# Usage: scripts/gpu-wheels.sh
# Run HERE, with network, before a GPU window: download into .gpu-wheels/ (gitignored, a
# few MB) the wheels scripts/gpu-check.sh needs on a GPU machine that has no network:
# CPython 3.12 manylinux x86-64 wheels of what such a machine lacks: pytest-timeout and
# setuptools (the editable installs build with it). procgroup's own runtime dependencies
# (NumPy, pluggy) are there already. The folder travels with the checkout: name it in the device run's carry list.
# PROCGROUP_GPU_PYTHON_VERSION (default 3.12) picks the target Python.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.gpu-wheels
ver=${PROCGROUP_GPU_PYTHON_VERSION:-3.12}
py=${PROCGROUP_PYTHON:-}
if [ -z "$py" ]; then
  for cand in .venv313/bin/python .venv/bin/python python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -m pip --version >/dev/null 2>&1; then py=$cand; break; fi
  done
fi
[ -n "$py" ] || { echo "scripts/gpu-wheels.sh: no Python with pip found (set PROCGROUP_PYTHON)" >&2; exit 1; }
rm -rf "$dest.tmp"
mkdir -p "$dest.tmp"
# --only-binary with --python-version/--platform: wheels for the GPU machine, whatever
# this machine runs; their dependencies come along
"$py" -m pip download -q --disable-pip-version-check --only-binary=:all: \
  --python-version "$ver" --implementation cp --abi "cp${ver/./}" \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d "$dest.tmp" "pytest-timeout>=2" "setuptools>=77" 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "scripts/gpu-wheels.sh: $(ls "$dest" | wc -l) wheels, $(du -sh "$dest" | cut -f1), in $dest for CPython $ver:"
ls "$dest" | sed 's/^/  /'
