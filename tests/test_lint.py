"""The tree passes ruff and mypy as configured in pyproject.toml, and every suppression says why.

The tools come from the test extra (scripts/setup-dev.sh installs it); each test runs the
executable of the interpreter running the suite, so each venv checks the tree with its own
packages, and skips, saying so, where the tool is not installed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Where the project's own Python lives (ruff's and mypy's scope is set in pyproject.toml).
SOURCE_DIRS = ("core", "backends", "tests", "bench", "examples", "scripts")


def _tool(name: str) -> str:
    path = Path(sys.executable).parent / name
    # the test extra lists ruff and mypy, so a missing one is a broken setup, not a skip
    assert path.exists(), (f"{name} is not installed in {Path(sys.executable).parent.parent} "
                           "(pip install -e '.[test]', as scripts/setup-dev.sh does)")
    return str(path)


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, NO_COLOR="1")
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def test_ruff_check_passes() -> None:
    done = _run([_tool("ruff"), "check", "--no-fix", "--output-format", "concise", "."], timeout=120)
    assert done.returncode == 0, f"ruff check found problems:\n{done.stdout}{done.stderr}"


@pytest.mark.timeout(600)  # a cold cache on a loaded 2-core machine takes minutes
def test_mypy_passes() -> None:
    # one cache per interpreter: the two venvs have different packages installed
    cache = ROOT / ".mypy_cache" / f"py{sys.version_info[0]}{sys.version_info[1]}"
    done = _run([_tool("mypy"), "--cache-dir", str(cache)], timeout=540)
    assert done.returncode == 0, f"mypy found problems:\n{done.stdout}{done.stderr}"


#: `noqa: CODE[, CODE] - reason` (or `(reason)`) and `type: ignore[code]  # reason`: the
#: reason is what a reader needs to judge whether the suppression still holds.
_NOQA = re.compile(r"#\s*noqa\b(?P<rest>.*)$", re.IGNORECASE)
_NOQA_WITH_REASON = re.compile(r"^:\s*[A-Z]+[0-9]+(\s*,\s*[A-Z]+[0-9]+)*\s+(-|#|\()\s*\S")
_IGNORE = re.compile(r"#\s*type:\s*ignore\b(?P<rest>.*)$")
_IGNORE_WITH_REASON = re.compile(r"^\[[a-z0-9_, -]+\]\s*#\s*\S")


def _python_files() -> list[Path]:
    files: list[Path] = []
    for top in SOURCE_DIRS:
        for path in sorted((ROOT / top).rglob("*.py")):
            skipped = any(part.startswith(".") or part in ("build", "__pycache__") for part in path.parts)
            if not skipped and path != Path(__file__).resolve():  # this file spells the patterns out
                files.append(path)
    return files


def test_every_suppression_gives_its_codes_and_reason() -> None:
    bare: list[str] = []
    for path in _python_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            noqa, ignore = _NOQA.search(line), _IGNORE.search(line)
            if noqa and not _NOQA_WITH_REASON.match(noqa["rest"]):
                bare.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
            if ignore and not _IGNORE_WITH_REASON.match(ignore["rest"]):
                bare.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not bare, (
        "suppressions without codes or reason (write `# noqa: CODE - why` or "
        "`# type: ignore[code]  # why`):\n" + "\n".join(bare)
    )
