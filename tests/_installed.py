"""What scripts/setup-dev.sh installs is asserted, not skipped: a missing piece is a
broken setup, and a skipped test would hide it. A test skips only for what cannot be
installed on this Python (pygloo has wheels for CPython 3.8-3.10 on x86-64 Linux only)
or what the user chose to leave out (PROCGROUP_DEV_TORCH=0: no torch), saying which.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys

import pytest

PYGLOO_WHEELS = sys.platform.startswith("linux") and platform.machine() == "x86_64" and sys.version_info < (3, 11)
TORCH_LEFT_OUT = os.environ.get("PROCGROUP_DEV_TORCH", "1") == "0"


def why_no_gloo_engine(engine: str) -> str | None:
    """None when gloo engine ``engine`` (pygloo or torch) is installed, else why it may be
    absent here; AssertionError when the setup should have installed it."""
    if importlib.util.find_spec(engine) is not None:
        return None
    if engine == "pygloo":
        assert not PYGLOO_WHEELS, "scripts/setup-dev.sh installs procgroup-gloo with pygloo on CPython 3.10"
        return (f"pygloo has wheels only for CPython 3.8-3.10 on x86-64 Linux, this is "
                f"{platform.python_implementation()} {platform.python_version()} on {sys.platform} {platform.machine()}")
    assert TORCH_LEFT_OUT, "scripts/setup-dev.sh installs procgroup-gloo[torch] on every leg (PROCGROUP_DEV_TORCH=0 to skip)"
    return "torch was left out (PROCGROUP_DEV_TORCH=0)"


def gloo_engine_env(engine: str) -> dict[str, str]:
    """The environment that picks gloo engine ``engine``; skips, saying why, where it cannot be installed."""
    why = why_no_gloo_engine(engine)
    if why:
        pytest.skip(f"gloo engine {engine}: {why}")
    return {"PROCGROUP_GLOO_ENGINE": engine}


def require_mpi() -> None:
    """The mpi backend with an mpiexec to start it: scripts/setup-dev.sh installs
    procgroup-mpi[mpich] (mpi4py and MPICH's mpiexec) on every leg, so nothing here skips."""
    for module in ("mpi4py", "procgroup_mpi"):
        assert importlib.util.find_spec(module) is not None, (
            f"{module} is missing: scripts/setup-dev.sh installs procgroup-mpi[mpich] on every leg")
    from procgroup._launch.mpi import find_mpiexec

    find_mpiexec()  # InvalidArgumentError naming what was looked for, when there is none


def require_gloo() -> None:
    """The gloo backend on either engine; skips only when neither can be here."""
    whys = [why_no_gloo_engine(e) for e in ("pygloo", "torch")]
    if all(whys):
        pytest.skip("the gloo backend has no engine here: " + "; ".join(f"{w}" for w in whys))
