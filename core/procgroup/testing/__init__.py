"""Test support for procgroup and its backends: real ranks, a conformance suite, a fake GPU.

- :func:`spawn` starts N real processes (or ``mpiexec -n N``), joins them in a group and
  returns each rank's result, re-raising a worker's exception with its rank.
- :class:`ConformanceSuite` is the pytest class every backend subclasses (it needs
  pytest: ``pip install 'procgroup[testing]'``; everything it runs ships in this package).
- :class:`FakeGpuArray` exposes ``__cuda_array_interface__`` over host memory, so CUDA
  code paths run without a GPU.
"""

from ._fake_gpu import FakeGpuArray
from ._spawn import WorkerError, mpiexec_command, spawn

__all__ = ["ConformanceSuite", "FakeGpuArray", "WorkerError", "mpiexec_command", "spawn"]


def __getattr__(name: str) -> object:
    # imported lazily: the suite needs pytest, spawn() and FakeGpuArray do not
    if name == "ConformanceSuite":
        try:
            from .conformance import ConformanceSuite
        except ModuleNotFoundError as exc:
            if exc.name != "pytest":
                raise
            raise ImportError(
                "procgroup.testing.ConformanceSuite runs under pytest, which is not installed: "
                "pip install 'procgroup[testing]'"
            ) from None
        return ConformanceSuite
    raise AttributeError(name)
