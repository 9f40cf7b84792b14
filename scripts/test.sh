#!/usr/bin/env bash
# Install the development environment and run every test, once per Python leg:
#   3.13 (.venv313): the newest supported CPython; the gloo tests run on the torch engine
#   3.10 (.venv):    the pygloo leg: the gloo tests run on both engines (pygloo and torch)
# Each leg runs the whole suite (how long that takes: docs/install.md, "The test legs").
# Extra arguments go to pytest on every leg, e.g. scripts/test.sh tests/test_backend_tcp.py -x
# PROCGROUP_TEST_PYTHONS picks the legs, e.g. PROCGROUP_TEST_PYTHONS=3.10 scripts/test.sh
# A failing leg does not stop the next one; the exit status is non-zero when any leg failed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/pythons.sh
read -r -a versions <<<"${PROCGROUP_TEST_PYTHONS:-$PROCGROUP_DEFAULT_PYTHONS}"
[ ${#versions[@]} -gt 0 ] || { echo "error: PROCGROUP_TEST_PYTHONS is empty" >&2; exit 2; }
bash scripts/setup-dev.sh "${versions[@]}"
# the multi-host tests build network namespaces with iproute2, tests/test_slurm.py starts a
# real Slurm (slurm-wlm, munge) on them; without these packages those tests skip with a reason
missing_pkgs=()
command -v ip >/dev/null 2>&1 || missing_pkgs+=(iproute2)
{ command -v slurmd || [ -x /usr/sbin/slurmd ]; } >/dev/null 2>&1 || missing_pkgs+=(slurm-wlm)
{ command -v munged || [ -x /usr/sbin/munged ]; } >/dev/null 2>&1 || missing_pkgs+=(munge)
if [ ${#missing_pkgs[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing_pkgs[@]}") >/dev/null 2>&1 || echo "note: could not install ${missing_pkgs[*]}"
fi
# as root with apt the packages can always be installed: there a missing Slurm is a broken
# setup, and tests/test_slurm.py fails instead of skipping
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  export PROCGROUP_TEST_REQUIRE_SLURM=${PROCGROUP_TEST_REQUIRE_SLURM:-1}
fi

logdir=$(mktemp -d)
trap 'rm -rf "$logdir"' EXIT
summary=()
failed=0
for ver in "${versions[@]}"; do
  venv=$(procgroup_venv "$ver")
  echo "=== procgroup tests on $("$venv/bin/python" --version) ($venv)"
  start=$SECONDS
  rc=0
  "$venv/bin/python" -m pytest "$@" 2>&1 | tee "$logdir/$ver.log" || rc=$?
  # pytest's last line: "==== 410 passed, 12 skipped in 250.31s (0:04:10) ====" (no "=" with -q)
  result=$(grep -E '(passed|failed|skipped|deselected|error|errors|no tests ran).* in [0-9.]+s' "$logdir/$ver.log" \
    | tail -n 1 | sed -E 's/^=+ //; s/ =+$//' || true)
  summary+=("CPython $ver ($venv): ${result:-no pytest summary} -> exit $rc, $((SECONDS - start)) s")
  [ "$rc" = 0 ] || failed=1
done
echo "=== summary"
printf '%s\n' "${summary[@]}"
exit "$failed"
