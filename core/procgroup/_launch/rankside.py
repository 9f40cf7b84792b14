"""The rank side of ``procgroup-run``: run the user's script, record an uncaught exception.

Why: with many ranks, an uncaught traceback is printed among interleaved output of every
rank and drowned by the follow-up errors of the survivors. The launcher therefore sets
``PROCGROUP_ERROR_FILE`` for each rank; the excepthook installed here writes the traceback
as JSON to that file and only a one-line note to stderr, and the launcher prints the
traceback once, with its rank, in its failure summary.

This module uses the standard library only and no relative imports: the launcher runs it
*by path* as the bootstrap of every rank (``python .../rankside.py script.py args`` or
``... -m module args``), which keeps rank start-up cheap and independent of the rest of
procgroup. ``procgroup.init_process_group`` calls :func:`install_error_handler` too, for
ranks started by other means with ``PROCGROUP_ERROR_FILE`` set; installing twice is a no-op.
"""

from __future__ import annotations

import json
import logging
import os
import runpy
import signal
import sys
import time
import traceback
from types import TracebackType
from typing import Any

logger = logging.getLogger(__name__)

ERROR_FILE_ENV = "PROCGROUP_ERROR_FILE"
LAUNCHER_PID_ENV = "PROCGROUP_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1
_MARKER = "_procgroup_error_handler"
_OWN_FILES = {os.path.abspath(__file__), os.path.abspath(runpy.__file__)}
# From 3.11 on runpy is a frozen module: its frames carry the file name "<frozen runpy>"
# (unless ``-X frozen_modules=off``), not runpy.__file__. Take the name from runpy's own
# code, which is right on every version and either way.
_OWN_CODE_NAMES = {runpy.run_path.__code__.co_filename, runpy.run_module.__code__.co_filename}


def _is_own(filename: str) -> bool:
    """True for a frame of this bootstrap or of runpy."""
    return filename in _OWN_CODE_NAMES or os.path.abspath(filename) in _OWN_FILES


def _trim(tb: TracebackType | None) -> TracebackType | None:
    """Drop the leading frames of the bootstrap and runpy, so the traceback starts in user code."""
    while tb is not None and _is_own(tb.tb_frame.f_code.co_filename):
        if tb.tb_next is None:
            break
        tb = tb.tb_next
    return tb


def write_error_file(
    path: str, exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> None:
    """Write one uncaught exception as JSON (atomically: temp file, then rename)."""
    record: dict[str, Any] = {
        "rank": os.environ.get("RANK"),
        "local_rank": os.environ.get("LOCAL_RANK"),
        "pid": os.getpid(),
        "time": time.time(),
        "exc_type": exc_type.__qualname__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc_type, exc, _trim(tb))),
    }
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def read_error_file(path: str) -> dict[str, Any] | None:
    """The record a rank wrote, or None when it wrote none (or it cannot be read)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def install_error_handler() -> bool:
    """Install the error-file excepthook when ``PROCGROUP_ERROR_FILE`` is set.

    Returns True when a handler (this call's or an earlier one) is active. Idempotent, and
    cheap enough to call from ``init_process_group`` on every rank.
    """
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        return False
    if getattr(sys.excepthook, _MARKER, False):
        return True
    previous = sys.excepthook

    def hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if issubclass(exc_type, KeyboardInterrupt):
            previous(exc_type, exc, tb)
            return
        try:
            write_error_file(path, exc_type, exc, tb)
        except OSError as err:  # cannot record it: print it the usual way instead
            logger.debug("cannot write error file %s: %s", path, err)
            previous(exc_type, exc, tb)
            return
        first = str(exc).splitlines()[0] if str(exc) else ""
        sys.stderr.write(
            f"{exc_type.__qualname__}: {first} "
            f"(uncaught; traceback in the launcher's failure summary)\n"
        )
        sys.stderr.flush()

    setattr(hook, _MARKER, True)
    sys.excepthook = hook
    return True


def die_with_launcher() -> None:
    """Ask Linux to SIGKILL this rank when the launcher dies (even by SIGKILL).

    Why here and not in a ``preexec_fn``: the launcher has output threads running while it
    starts ranks, and ``preexec_fn`` is unsafe with threads. Setting it after exec leaves a
    window in which the launcher may already be gone, hence the parent-pid check after it.
    """
    expected = os.environ.get(LAUNCHER_PID_ENV)
    if not expected or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            logger.debug("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
            return
    except (OSError, AttributeError) as err:
        logger.debug("no prctl here: %s", err)
        return
    if str(os.getppid()) != expected:  # the launcher died before prctl took effect
        os._exit(128 + int(signal.SIGKILL))


def _usage() -> None:
    sys.stderr.write("usage: rankside.py (SCRIPT | -m MODULE) [ARGS...]\n")
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> None:
    """Bootstrap of one rank: install the handler, then run the script or module as __main__."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        _usage()
    die_with_launcher()
    install_error_handler()
    if args[0] == "-m":
        if len(args) < 2:
            _usage()
        module = args[1]
        sys.argv = [module, *args[2:]]  # runpy replaces argv[0] with the module's file
        sys.path[0] = os.getcwd()  # what ``python -m`` puts first
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script = args[0]
        sys.argv = [script, *args[1:]]
        sys.path[0] = os.path.dirname(os.path.realpath(script))  # what ``python script`` does
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
