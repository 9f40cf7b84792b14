"""The architecture as a test: import-linter's contracts in .importlinter must hold.

Layers of the core (each imports only downward), no import circles in the core or any
backend, backends independent of each other and built on procgroup.backend and public
names only, the core never importing a backend. See docs/architecture.md.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("procgroup", "procgroup_tcp", "procgroup_mpi", "procgroup_gloo", "procgroup_nccl")


def test_import_contracts_hold() -> None:
    missing = [p for p in PACKAGES if importlib.util.find_spec(p) is None]
    assert not missing, f"scripts/setup-dev.sh installs every backend on every leg; missing: {missing}"
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "import-linter is part of the test extra (pip install -e '.[test]')"
    proc = subprocess.run([exe, "--config", str(REPO / ".importlinter"), "--no-cache", "--no-logo"], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout
