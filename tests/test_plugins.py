"""The plugin contract: discovery through real entry points, and a send/recv-only channel.

Discovery tests run ``python -S`` in a private site folder that holds only the
packages procgroup needs (symlinked) plus the fake distributions each test writes, so
importlib.metadata sees exactly the plugins a test installs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import procgroup
import procgroup.errors
from procgroup.errors import BackendNotFoundError, PluginError
from procgroup.plugins import backends, get_backend_spec, register_backend, unregister_backend
from procgroup.testing import ConformanceSuite

from procgroup.testing import minimal_channel

REPO = Path(__file__).resolve().parents[1]
NEEDED = ["numpy", "numpy.libs", "pluggy"]


def _site_packages() -> Path:
    import numpy

    return Path(numpy.__file__).resolve().parents[1]


@pytest.fixture()
def isolated_site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    src = _site_packages()
    for name in NEEDED:
        if (src / name).exists():
            (site / name).symlink_to(src / name)
    (site / "procgroup").symlink_to(REPO / "core" / "procgroup")
    return site


def add_dist(site: Path, dist: str, entry_points: dict[str, str], modules: dict[str, str]) -> None:
    """Write a minimal installed distribution: dist-info with entry points, plus modules."""
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    eps = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text(f"[procgroup]\n{eps}")
    for name, code in modules.items():
        (site / f"{name}.py").write_text(textwrap.dedent(code))


def run_isolated(site: Path, code: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(site))
    return subprocess.run([sys.executable, "-S", "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=120)


def test_entry_point_plugin_is_discovered_and_listed(isolated_site: Path) -> None:
    add_dist(isolated_site, "storechan-plugin", {"storechan": "storechan_mod"},
             {"storechan_mod": (REPO / "core" / "procgroup" / "testing" / "minimal_channel.py").read_text()})
    proc = run_isolated(isolated_site, """
        import procgroup.plugins as p
        print(sorted(p.backends()))
        print(p.backends()['storechan'].distribution)
        from procgroup.__main__ import main; main(['info'])
    """)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "['storechan']"
    assert lines[1] == "storechan-plugin"
    assert "storechan cpu" in proc.stdout and "generic" in proc.stdout


def test_unknown_and_missing_backend_errors(isolated_site: Path) -> None:
    add_dist(isolated_site, "storechan-plugin", {"storechan": "storechan_mod"},
             {"storechan_mod": (REPO / "core" / "procgroup" / "testing" / "minimal_channel.py").read_text()})
    proc = run_isolated(isolated_site, """
        import procgroup
        for name in ("tcp", "nosuch"):
            try:
                procgroup.init_process_group(name, "tcp://127.0.0.1:1", rank=0, world_size=1)
            except procgroup.errors.BackendNotFoundError as exc:
                print(exc)
    """)
    assert proc.returncode == 0, proc.stderr
    missing, unknown = proc.stdout.splitlines()
    assert "pip install procgroup-tcp" in missing and "storechan" in missing
    assert "unknown backend 'nosuch'" in unknown and "choose one of: storechan" in unknown


def test_misspelled_backend_gets_did_you_mean() -> None:
    with pytest.raises(BackendNotFoundError, match="did you mean 'tcp'"):
        get_backend_spec("tpc")


def test_broken_plugin_is_logged_and_skipped(isolated_site: Path) -> None:
    add_dist(isolated_site, "broken-plugin", {"broken": "broken_mod"},
             {"broken_mod": "raise ImportError('libfoo.so: cannot open shared object file')\n"})
    add_dist(isolated_site, "storechan-plugin", {"storechan": "storechan_mod"},
             {"storechan_mod": (REPO / "core" / "procgroup" / "testing" / "minimal_channel.py").read_text()})
    proc = run_isolated(isolated_site, """
        import procgroup.plugins as p
        print(sorted(p.backends()))
        try:
            p.get_backend_spec("broken")
        except p.BackendUnavailableError as exc:
            print(exc)
    """)
    assert proc.returncode == 0, proc.stderr
    listed, asked = proc.stdout.strip().splitlines()
    assert listed == "['storechan']"
    assert "broken" in proc.stderr and "libfoo.so" in proc.stderr and "skipped" in proc.stderr
    # asking for it names the distribution, the entry point and the import error
    assert "broken-plugin" in asked and "broken = broken_mod" in asked and "libfoo.so" in asked


def test_two_plugins_claiming_one_name_is_an_error(isolated_site: Path) -> None:
    code = (REPO / "core" / "procgroup" / "testing" / "minimal_channel.py").read_text()
    add_dist(isolated_site, "first-plugin", {"storechan": "first_mod"}, {"first_mod": code})
    add_dist(isolated_site, "second-plugin", {"other": "second_mod"}, {"second_mod": code})
    add_dist(isolated_site, "third-plugin", {"third": "third_mod"},
             {"third_mod": code.replace('name="storechan"', 'name="other"')})
    proc = run_isolated(isolated_site, """
        import procgroup.plugins as p
        print(sorted(p.backends()))  # the contested name costs only itself
        try:
            p.get_backend_spec("storechan")
        except p.PluginError as exc:
            print(exc)
    """)
    assert proc.returncode == 0, proc.stderr
    listed, asked = proc.stdout.strip().splitlines()
    assert listed == "['other']"
    assert "storechan" in asked and "first-plugin" in asked and "second-plugin" in asked


def test_runtime_registration_rules() -> None:
    with pytest.raises(PluginError, match="not a procgroup.DataChannel"):
        register_backend("oops", dict)
    with pytest.raises(PluginError, match="already provided"):
        register_backend("tcp", minimal_channel.StoreChannel)
    register_backend("storechan", minimal_channel.StoreChannel)
    try:
        assert get_backend_spec("storechan").loader() is minimal_channel.StoreChannel
        assert "storechan" in backends()
    finally:
        unregister_backend("storechan")
    with pytest.raises(BackendNotFoundError, match="choose one of"):
        get_backend_spec("storechan")


def test_use_before_init_is_a_clear_error() -> None:
    import numpy as np

    assert not procgroup.is_initialized()
    with pytest.raises(procgroup.errors.NotInitializedError, match="init_process_group"):
        procgroup.all_reduce(np.zeros(3))


class TestSendRecvOnlyChannel(ConformanceSuite):
    """A ~30-line channel with send/recv only passes every collective of the suite."""

    backend = "storechan"
    world_sizes = (1, 2, 3)
    unsupported = {"peer_death_raises_on_survivors": "a channel over Store keys cannot see a peer die: "
                   "its survivors time out (CommTimeoutError), they get no PeerError"}
    init_method = "tcp"
    setup = staticmethod(minimal_channel.register)
