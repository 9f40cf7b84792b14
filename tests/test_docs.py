"""The documentation site builds (scripts/docs.sh: Sphinx, warnings as errors) and its API
reference holds every public name: each name of each documented module's ``__all__``
is an object of the generated pages (an anchor that cross-references reach), so a
public name added anywhere is covered, or this test says which one is missing."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: the modules whose public names the API reference documents (docs/api/)
MODULES = ("procgroup", "procgroup.errors", "procgroup.rendezvous", "procgroup.backend", "procgroup.remote",
           "procgroup.testing", "procgroup.utils", "procgroup.utils.comm")

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = [m for m in ("sphinx", "myst_parser", "furo") if importlib.util.find_spec(m) is None]
    assert not missing, f"{missing} missing: scripts/setup-dev.sh installs the docs extra (pip install -e '.[docs]')"
    out = tmp_path_factory.mktemp("docs")
    env = dict(os.environ, PROCGROUP_DOCS_PYTHON=sys.executable, PROCGROUP_DOCS_OUT=str(out))
    run = subprocess.run(["bash", str(ROOT / "scripts" / "docs.sh")], env=env, capture_output=True, text=True,
                         timeout=840, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, f"scripts/docs.sh failed (warnings are errors):\n{run.stdout[-5000:]}\n{run.stderr[-8000:]}"
    return out / "html"


def _anchors(html_dir: Path) -> set[str]:
    ids: set[str] = set()
    for page in html_dir.glob("*.html"):
        ids |= set(re.findall(r'id="([^"]+)"', page.read_text(encoding="utf-8")))
    return ids


def test_every_public_name_is_in_the_api_reference(site: Path) -> None:
    ids = _anchors(site / "api")
    missing = []
    for modname in MODULES:
        module = importlib.import_module(modname)
        assert f"module-{modname}" in ids, f"docs/api has no page for {modname}"
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            # a module re-exported by name is its own page
            found = f"module-{obj.__name__}" in ids if inspect.ismodule(obj) else f"{modname}.{name}" in ids
            if not found:
                missing.append(f"{modname}.{name}")
    assert not missing, f"public names missing from the API reference: {missing}"


def test_guides_search_and_cross_references(site: Path) -> None:
    guides = sorted(p.relative_to(ROOT / "docs").with_suffix(".html") for p in (ROOT / "docs").rglob("*.md")
                    if "_build" not in p.parts)
    absent = [str(g) for g in guides if not (site / g).is_file()]
    assert not absent, f"guides not built: {absent}"
    assert (site / "search.html").is_file() and (site / "searchindex.js").is_file()
    index = (site / "searchindex.js").read_text(encoding="utf-8")
    assert "init_process_group" in index and "all_reduce" in index
    # a docstring's :class:`~procgroup.errors.CommTimeoutError`-style role became a link
    # to the object's entry on its page
    page = (site / "api" / "backend.html").read_text(encoding="utf-8")
    assert re.search(r'<a class="reference internal" href="#procgroup\.backend\.Work"', page) or \
        re.search(r'href="[^"]*#procgroup\.backend\.Work"', page), "no cross-reference to procgroup.backend.Work"
