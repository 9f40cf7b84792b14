"""Can the nccl backend run here? Answers with a reason, so listing never needs a GPU.

Checked in the order a user fixes things: CuPy installed, a CUDA device visible, the
NCCL library loadable. Only CuPy and the CUDA runtime are touched (no communicator).
"""

from __future__ import annotations

import logging
import os
import warnings

log = logging.getLogger(__name__)

INSTALL_HINT = ("pip install 'procgroup-nccl[cuda12]' (CUDA 12) or 'procgroup-nccl[cuda13]' (CUDA 13); "
                "'procgroup-nccl[cuda]' adds CUDA 12's NCCL and runtime wheels")
#: the NCCL runtime wheel of each CUDA major version (a system NCCL works too)
NCCL_HINT = "pip install nvidia-nccl-cu12 (CUDA 12, or 'procgroup-nccl[cuda]') or nvidia-nccl-cu13 (CUDA 13)"


def unavailable_reason() -> str | None:
    """None when NCCL can run in this process, else a short reason for the user.

    Note: asking the CUDA runtime for the device count initializes the CUDA driver in
    this process; start GPU workers with ``spawn``, not ``fork``, after calling it.
    """
    try:
        import cupy  # noqa: F401 - heavy import, only when asked
    except ImportError as exc:
        return f"cupy not installed ({exc}); install it with {INSTALL_HINT}"
    except Exception as exc:  # noqa: BLE001 - a broken CuPy install must not break listing
        return f"cupy failed to import ({type(exc).__name__}: {exc})"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return f"no CUDA device (CUDA_VISIBLE_DEVICES={visible!r} hides them all)"
    count, why = cuda_device_count()
    if count == 0:
        return f"no CUDA device ({why})" if why else "no CUDA device"
    reason = nccl_library_reason()
    if reason:
        return reason
    return None


def cuda_device_count() -> tuple[int, str]:
    """(number of CUDA devices, why it is 0 when the runtime says why)."""
    from cupy.cuda import runtime

    try:
        return int(runtime.getDeviceCount()), ""
    except Exception as exc:  # noqa: BLE001 - CUDARuntimeError: no driver, no device, ...
        return 0, str(exc)


def nccl_library_reason() -> str | None:
    """None when cupy.cuda.nccl loaded libnccl, else why not and how to get it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # CuPy warns when libnccl is missing; we say it
            from cupy.cuda import nccl
    except ImportError as exc:
        return f"CuPy has no NCCL support ({exc}); install it with {INSTALL_HINT}"
    if not getattr(nccl, "available", True):
        return f"the NCCL library (libnccl.so.2) was not found; install it with {NCCL_HINT}"
    return None


__all__ = ["INSTALL_HINT", "NCCL_HINT", "cuda_device_count", "nccl_library_reason", "unavailable_reason"]
