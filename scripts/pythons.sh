# Sourced by scripts/setup-dev.sh and scripts/test.sh: the Python versions of the
# development environment and the venv each lives in. Not meant to be run.

# The default legs: the newest supported CPython first, then the pygloo leg.
PROCGROUP_DEFAULT_PYTHONS="3.13 3.10"

# procgroup_venv X.Y: the venv directory of that version.
procgroup_venv() {
  case "$1" in
    3.10) echo .venv ;;            # the historical dev venv; docs and bench scripts use it
    *) echo ".venv${1//./}" ;;     # 3.13 -> .venv313
  esac
}

# procgroup_python_why X.Y: why the development environment wants that version.
procgroup_python_why() {
  case "$1" in
    3.10) echo "CPython 3.10 is the pygloo leg: pygloo (one of the gloo backend's engines) publishes wheels only for CPython 3.8-3.10." ;;
    3.13) echo "CPython 3.13 is the default leg: the newest CPython procgroup supports." ;;
    *) echo "CPython $1 was asked for (arguments or PROCGROUP_TEST_PYTHONS)." ;;
  esac
}
