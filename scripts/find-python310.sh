#!/usr/bin/env bash
# Print the path of a CPython 3.10 interpreter, or explain how to get one and fail.
# Kept for existing callers: it is scripts/find-python.sh 3.10 (which also honours
# PROCGROUP_PYTHON_3_10 and, as before, PROCGROUP_PYTHON).
set -euo pipefail
exec bash "$(dirname "$0")/find-python.sh" 3.10 \
  "CPython 3.10 is the pygloo leg: pygloo (the gloo backend) publishes wheels only for CPython 3.8-3.10."
