"""Cross-memory attach: copy straight out of another process's memory (Linux, via libc).

``process_vm_readv`` lets the receiver of a large shared-memory message read it from
the sender's buffer into its own posted buffer: one copy, no staging. The kernel allows
it only where ptrace would be allowed (same user, Yama's ptrace_scope, no seccomp rule
against it), so each pair tests it once at set-up (:func:`probe` and :func:`check_probe`)
and falls back to a copy through the shared ring when it fails.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import sys

import numpy as np

#: one syscall moves at most this much (the kernel caps a single transfer near 2 GiB)
_MAX_CALL_BYTES = 1 << 30
PROBE_BYTES = 16


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _load() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]  # private in typeshed, real at run time
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.process_vm_readv
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(_IoVec),
        ctypes.c_ulong,
        ctypes.POINTER(_IoVec),
        ctypes.c_ulong,
        ctypes.c_ulong,
    ]
    return fn


_readv = _load()


def available() -> bool:
    """libc has process_vm_readv (whether the kernel allows it is found by :func:`check_probe`)."""
    return _readv is not None


def address_of(view: memoryview) -> int:
    """The address of a contiguous buffer's first byte (read-only buffers too)."""
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data) if view.nbytes else 0


def read_from(pid: int, remote_addr: int, view: memoryview) -> None:
    """Fill ``view`` with ``view.nbytes`` bytes at ``remote_addr`` in process ``pid``.

    OSError when the kernel refuses (the process is gone: ESRCH; the range is not
    mapped there: EFAULT; not permitted: EPERM).
    """
    if _readv is None:
        raise OSError(errno.ENOSYS, "process_vm_readv is not available")
    total = view.nbytes
    if total == 0:
        return
    local = address_of(view)
    done = 0
    while done < total:
        n = min(total - done, _MAX_CALL_BYTES)
        liov = _IoVec(local + done, n)
        riov = _IoVec(remote_addr + done, n)
        got = _readv(pid, ctypes.byref(liov), 1, ctypes.byref(riov), 1, 0)
        if got < 0:
            err = ctypes.get_errno()
            if err == errno.EINTR:
                continue
            raise OSError(err, f"process_vm_readv from pid {pid}: {os.strerror(err)}")
        if got == 0:
            raise OSError(errno.EFAULT, f"process_vm_readv from pid {pid} made no progress")
        done += got


class Probe:
    """A few random bytes at a known address, for a peer to test that it can read us."""

    def __init__(self) -> None:
        self.data = os.urandom(PROBE_BYTES)
        self._buf = ctypes.create_string_buffer(self.data, PROBE_BYTES)
        self.address = ctypes.addressof(self._buf)


def check_probe(pid: int, address: int, expected: bytes) -> bool:
    """True when this process can read ``expected`` at ``address`` in process ``pid``."""
    if _readv is None or len(expected) != PROBE_BYTES:
        return False
    out = bytearray(PROBE_BYTES)
    try:
        read_from(pid, address, memoryview(out))
    except OSError:
        return False
    return bytes(out) == expected


__all__ = ["PROBE_BYTES", "Probe", "address_of", "available", "check_probe", "read_from"]
