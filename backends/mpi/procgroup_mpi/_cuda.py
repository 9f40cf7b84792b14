"""Is the loaded MPI CUDA-aware? Then CuPy arrays go to MPI as device pointers.

MPICH (4+) and Open MPI both export ``MPIX_Query_cuda_support()``; it answers whether
the library was built with CUDA *and* it is enabled at run time. mpi4py loads libmpi
itself, so the symbol is looked up in the libmpi mapped into this process. The option
``cuda_aware`` or ``PROCGROUP_MPI_CUDA_AWARE=1|0`` overrides the answer (e.g. an MPI
without the query).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Mapping
from typing import Any

from procgroup.backend import env_flag, setting

log = logging.getLogger(__name__)

ENV_CUDA_AWARE = "PROCGROUP_MPI_CUDA_AWARE"
OPTION_CUDA_AWARE = "cuda_aware"


def _loaded_libmpi() -> list[str]:
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            return sorted({line.split()[-1] for line in maps if "libmpi" in line and ".so" in line})
    except OSError:
        return []


def _query() -> bool:
    """MPIX_Query_cuda_support() of the loaded libmpi; False when no library answers."""
    for path in _loaded_libmpi():
        try:
            query = ctypes.CDLL(path).MPIX_Query_cuda_support
        except (OSError, AttributeError):
            continue
        query.restype = ctypes.c_int
        try:
            answer = bool(query())
        except Exception:
            log.debug("MPIX_Query_cuda_support failed in %s", path, exc_info=True)
            continue
        log.debug("%s: MPIX_Query_cuda_support() = %s", path, answer)
        return answer
    return False


def cuda_aware(options: Mapping[str, Any] | None = None) -> bool:
    """True when device pointers may be passed to MPI calls."""
    forced, _ = setting(OPTION_CUDA_AWARE, ENV_CUDA_AWARE, "", options)
    if forced:
        return env_flag(ENV_CUDA_AWARE, False, name=OPTION_CUDA_AWARE, options=options)
    return _query()


__all__ = ["ENV_CUDA_AWARE", "OPTION_CUDA_AWARE", "cuda_aware"]
