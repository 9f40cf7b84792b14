#!/usr/bin/env bash
# Usage: scripts/find-python.sh VERSION [WHY]
# Print the path of a CPython VERSION (X.Y, e.g. 3.13) interpreter that can make venvs,
# or explain how to get one and fail. WHY, when given, is printed in that explanation.
#
# Looked for, in this order (the first that really is CPython X.Y wins):
#   $PROCGROUP_PYTHON_X_Y (e.g. PROCGROUP_PYTHON_3_13), then $PROCGROUP_PYTHON when it is X.Y,
#   pythonX.Y on PATH (a pyenv shim counts when pyenv can run it),
#   pyenv's versions ($(pyenv root)/versions/X.Y*, then ~/.pyenv/versions/X.Y*),
#   /usr/local/bin and /usr/bin.
set -euo pipefail
if [ $# -lt 1 ] || ! [[ "$1" =~ ^3\.[0-9]+$ ]]; then
  echo "usage: $0 VERSION [WHY]   (VERSION like 3.13)" >&2
  exit 2
fi
ver=$1
why=${2:-}
major=${ver%%.*}
minor=${ver#*.}
var="PROCGROUP_PYTHON_${major}_${minor}"

candidates=()
if [ -n "${!var:-}" ]; then
  candidates+=("${!var}")
  "${!var}" -c "import sys; sys.exit(sys.version_info[:2] != ($major, $minor))" 2>/dev/null \
    || echo "warning: $var=${!var} is not a working CPython $ver; looking elsewhere" >&2
fi
[ -n "${PROCGROUP_PYTHON:-}" ] && candidates+=("$PROCGROUP_PYTHON")
candidates+=("python$ver")
if command -v pyenv >/dev/null 2>&1; then
  root=$(pyenv root 2>/dev/null || true)
  if [ -n "$root" ]; then
    for d in "$root"/versions/"$ver" "$root"/versions/"$ver".*; do
      [ -x "$d/bin/python$ver" ] && candidates+=("$d/bin/python$ver")
    done
  fi
fi
for d in "$HOME"/.pyenv/versions/"$ver" "$HOME"/.pyenv/versions/"$ver".*; do
  [ -x "$d/bin/python$ver" ] && candidates+=("$d/bin/python$ver")
done
for d in /usr/local/bin /usr/bin; do
  [ -x "$d/python$ver" ] && candidates+=("$d/python$ver")
done

for c in "${candidates[@]}"; do
  p=$(command -v "$c" 2>/dev/null || true)
  [ -n "$p" ] || continue
  # the right version, CPython, and able to create a venv with pip in it
  if "$p" -c "
import sys, platform
ok = sys.version_info[:2] == ($major, $minor) and platform.python_implementation() == 'CPython'
if ok:
    import venv, ensurepip
sys.exit(0 if ok else 1)" >/dev/null 2>&1; then
    echo "$p"
    exit 0
  fi
done

{
  echo "error: no CPython $ver interpreter found (looked at \$$var, PATH, pyenv, /usr/local/bin, /usr/bin)."
  [ -n "$why" ] && echo "$why"
  cat <<MSG
Install one, e.g.
    pyenv install $ver                      (then re-run; pyenv's versions are found automatically)
    apt-get install python$ver python$ver-venv   (where your distribution has it)
or point $var at a CPython $ver interpreter.
MSG
} >&2
exit 1
