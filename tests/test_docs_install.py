"""scripts/docs.sh's own venv (.venv-docs) is installed idempotently: an install that
failed is redone, backends included, by the next run, and a finished one is not repeated.
Run on a copy of the script in a scratch tree, with a stand-in Python that records what
it is asked to do (no network, no Sphinx)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$FAKE_LOG"
if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; exit 0; fi
if [ "$1 $2" = "-m pip" ] && [ -f "$FAIL_PIP" ]; then rm "$FAIL_PIP"; exit 1; fi
exit 0
"""


def test_a_failed_docs_install_is_redone(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "docs.sh", tmp_path / "scripts" / "docs.sh")
    fake = tmp_path / "fake-python"
    fake.write_text(_FAKE_PYTHON)
    fake.chmod(0o755)
    (tmp_path / "scripts" / "find-python.sh").write_text(f'echo "{fake}"\n')
    (tmp_path / "backends" / "tcp").mkdir(parents=True)
    (tmp_path / "backends" / "tcp" / "pyproject.toml").write_text("")
    log, fail = tmp_path / "calls.log", tmp_path / "fail-pip"
    env = {**os.environ, "FAKE_LOG": str(log), "FAIL_PIP": str(fail), "PROCGROUP_DOCS_OUT": str(tmp_path / "out")}
    env.pop("PROCGROUP_DOCS_PYTHON", None)

    def run() -> tuple[int, list[str]]:
        log.write_text("")
        done = subprocess.run(["bash", str(tmp_path / "scripts" / "docs.sh")], env=env, capture_output=True,
                              text=True, timeout=60)
        return done.returncode, [line for line in log.read_text().splitlines() if "pip install" in line]

    fail.write_text("")
    code, installs = run()
    assert code != 0 and len(installs) == 1, (code, installs)
    assert not (tmp_path / ".venv-docs" / ".procgroup-installed").exists()
    code, installs = run()  # the venv exists now; the install (with the backends) runs again
    assert code == 0 and len(installs) == 1 and "-e backends/tcp" in installs[0], (code, installs)
    assert (tmp_path / ".venv-docs" / ".procgroup-installed").exists()
    code, installs = run()
    assert code == 0 and installs == [], (code, installs)
