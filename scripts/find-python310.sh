#!/usr/bin/env bash
# Print the path of a CPython 3.10 interpreter, or explain how to get one and fail.
# pygloo (the gloo backend) publishes wheels for CPython 3.8-3.10 only, so the
# development environment is pinned to 3.10.
set -euo pipefail
candidates=()
[ -n "${PROCGROUP_PYTHON:-}" ] && candidates+=("$PROCGROUP_PYTHON")
candidates+=(python3.10)
if command -v pyenv >/dev/null 2>&1; then
  root=$(pyenv root)
  for d in "$root"/versions/3.10*; do [ -x "$d/bin/python3.10" ] && candidates+=("$d/bin/python3.10"); done
fi
for d in "$HOME"/.pyenv/versions/3.10* /usr/local/bin /usr/bin; do
  [ -x "$d/python3.10" ] && candidates+=("$d/python3.10")
  [ -x "$d/bin/python3.10" ] && candidates+=("$d/bin/python3.10")
done
for c in "${candidates[@]}"; do
  p=$(command -v "$c" 2>/dev/null || true)
  if [ -n "$p" ] && "$p" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null; then
    echo "$p"; exit 0
  fi
done
cat >&2 <<'MSG'
error: no CPython 3.10 interpreter found.
procgroup's development environment needs CPython 3.10 because pygloo (the gloo backend)
publishes wheels only for CPython 3.8-3.10. Install one, e.g.
    pyenv install 3.10            (then re-run; pyenv's versions are found automatically)
    apt-get install python3.10    (where your distribution has it)
or point PROCGROUP_PYTHON at a 3.10 interpreter.
MSG
exit 1
