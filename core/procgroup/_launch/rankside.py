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

Besides the error file, the bootstrap keeps a *status file* (``PROCGROUP_STATUS_FILE``):
its pid at start, and the exit code with the time at the moment ``sys.exit(n)`` is raised
(or the script returns). Why: a rank that calls ``sys.exit(3)`` still runs its atexit
teardown afterwards (closing its connections), so its peers may fail and be seen dead
*before* it; the recorded time lets the launcher blame the rank that failed first. With
``--backend mpi`` the ranks are mpiexec's children, not the launcher's, so the status file
is also how the launcher learns their pids and exit codes, and named pipes
(``PROCGROUP_STDOUT_FIFO``/``PROCGROUP_STDERR_FIFO``) carry their output; their paths
contain ``{rank}``, filled in here from the MPI launcher's rank variable.
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
TORCH_ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"  # torch's @record writes here (same path)
STATUS_FILE_ENV = "PROCGROUP_STATUS_FILE"
STDOUT_FIFO_ENV = "PROCGROUP_STDOUT_FIFO"
STDERR_FIFO_ENV = "PROCGROUP_STDERR_FIFO"
MPI_LAUNCH_ENV = "PROCGROUP_MPI_LAUNCH"  # "1": started by mpiexec for procgroup-run
LAUNCHER_PID_ENV = "PROCGROUP_LAUNCHER_PID"
# (rank, size) variables of the MPI launchers, as in procgroup.rendezvous's env://
MPI_RANK_VARS = (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                 ("PMIX_RANK", None))
_TEMPLATED = (ERROR_FILE_ENV, TORCH_ERROR_FILE_ENV, STATUS_FILE_ENV, STDOUT_FIFO_ENV, STDERR_FIFO_ENV)
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


def read_json(path: str) -> dict[str, Any] | None:
    """A JSON object from ``path``; None when it is missing, torn or not an object."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_error_file(path: str) -> dict[str, Any] | None:
    """The record a rank wrote, or None when it wrote none (or it cannot be read).

    torch's ``@record`` format (``{"message": {"message": ..., "extraInfo": {"py_callstack":
    ..., "timestamp": ...}}}``, written to TORCHELASTIC_ERROR_FILE, the same path) is read
    as well and returned in this module's shape.
    """
    data = read_json(path)
    if data is None or "traceback" in data:
        return data
    msg = data.get("message")
    if isinstance(msg, dict):  # torch.distributed.elastic's error file
        extra: dict[str, Any] = msg["extraInfo"] if isinstance(msg.get("extraInfo"), dict) else {}
        text = str(msg.get("message", ""))
        exc_type, _, message = text.partition(": ")
        try:
            when: float | None = float(extra["timestamp"])
        except (KeyError, TypeError, ValueError):
            when = None
        return {"exc_type": exc_type or "Exception", "message": message or text,
                "traceback": str(extra.get("py_callstack") or text), "time": when}
    return data


def write_status(path: str | None, **fields: Any) -> None:
    """Record this rank's pid (at start) or exit code and time (at exit), atomically."""
    if not path:
        return
    record = {"pid": os.getpid(), **fields}
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.replace(tmp, path)
    except OSError as err:
        logger.debug("cannot write status file %s: %s", path, err)


def read_status(path: str) -> dict[str, Any] | None:
    """The rank's status record: {"pid"} while it runs, {"pid", "exitcode", "time"} at exit."""
    return read_json(path)


def exit_code_of(exc: SystemExit) -> int:
    """The process exit code Python derives from a SystemExit."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF if code >= 0 else (256 + code) & 0xFF
    return 1  # sys.exit("message"): printed to stderr, exit code 1


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
    if os.environ.get(MPI_LAUNCH_ENV) == "1":
        return  # under mpiexec our parent is its proxy: we die with it, it dies with mpiexec
    if str(os.getppid()) != expected:  # the launcher died before prctl took effect
        os._exit(128 + int(signal.SIGKILL))


FLIGHT_DIR_ENV = "PROCGROUP_FLIGHT_DIR"  # where a signalled rank writes its flight dump
FLIGHT_SIGNAL_ENV = "PROCGROUP_FLIGHT_SIGNAL"  # the signal that asks for it (default SIGUSR2)
_RECORDER_MODULE = "procgroup.backend._recorder"


def flight_signal() -> int:
    """The signal procgroup-run sends a rank to ask for its flight dump."""
    name = os.environ.get(FLIGHT_SIGNAL_ENV, "SIGUSR2")
    try:
        return int(signal.Signals[name])
    except KeyError:
        return int(signal.SIGUSR2)


def flight_files(directory: str, rank: str) -> tuple[str, str]:
    """(JSON dump, faulthandler text) paths of one rank in the launcher's flight directory."""
    return (os.path.join(directory, f"rank{rank}.flight.json"),
            os.path.join(directory, f"rank{rank}.stacks.txt"))


def install_flight_dump() -> bool:
    """Answer procgroup-run's dump signal: write the flight record and every thread's stack.

    Two writers, because a rank may be stuck where Python cannot run a handler: the
    faulthandler module writes the stacks of all threads from the signal itself (C level,
    at once, into ``rankN.stacks.txt``), then the Python handler writes the JSON dump
    (procgroup's flight record when procgroup is imported, the stacks alone otherwise) as
    soon as the main thread runs Python again. The launcher prefers the JSON.
    """
    directory = os.environ.get(FLIGHT_DIR_ENV)
    rank = os.environ.get("RANK", "")
    if not directory or not (rank.isascii() and rank.isdigit()):
        return False
    sig = flight_signal()
    json_path, text_path = flight_files(directory, rank)

    def handler(signum: int, frame: Any) -> None:
        recorder = sys.modules.get(_RECORDER_MODULE)
        try:
            if recorder is not None:
                recorder.write_dump(json_path, frame)
            else:
                _write_stacks_only(json_path, int(rank), frame)
        except Exception as err:  # noqa: BLE001 - a dump must never kill the rank
            logger.debug("flight dump failed: %s", err)

    try:
        signal.signal(sig, handler)
        import faulthandler

        stream = open(text_path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the C handler
        faulthandler.register(sig, file=stream, all_threads=True, chain=True)
    except (ValueError, OSError, RuntimeError) as err:  # not the main thread, no such signal
        logger.debug("no flight dump on signal %s: %s", sig, err)
        return False
    return True


def ignore_flight_signal() -> None:
    """Once the script is over: a dump signal arriving during the teardown (when the
    interpreter may have dropped Python handlers) must not kill the rank."""
    sig = flight_signal()
    try:
        import faulthandler

        faulthandler.unregister(sig)
        signal.signal(sig, signal.SIG_IGN)
    except (ValueError, OSError, RuntimeError):
        pass


def _write_stacks_only(path: str, rank: int, frame: Any) -> None:
    """The dump of a rank that has not imported procgroup: its threads' stacks."""
    import threading

    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    stacks = []
    for ident, top in sys._current_frames().items():
        if ident == threading.get_ident() and frame is not None:
            top = frame
        frames = [{"file": f.filename, "line": f.lineno, "function": f.name, "code": (f.line or "").strip()}
                  for f in traceback.extract_stack(top, limit=40)]
        stacks.append({"thread": names.get(ident, str(ident)), "main": ident == main, "frames": frames})
    record = {"format": "procgroup-flight-1", "rank": rank, "pid": os.getpid(), "time": time.time(),
              "ops": [], "stacks": stacks, "own_dirs": [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
                                                       + os.sep]}
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def _usage() -> None:
    sys.stderr.write("usage: rankside.py (SCRIPT | -m MODULE | --exec PROGRAM) [ARGS...]\n")
    raise SystemExit(2)


def adopt_mpi_rank() -> None:
    """Under mpiexec (``procgroup-run --backend mpi``): take RANK from the MPI launcher.

    mpiexec starts every rank with the same environment; the launcher's per-rank file paths
    contain ``{rank}``. A rank that finds no MPI rank variable, or a size other than the one
    the launcher asked for, was not started as one MPI world: it stops with a message
    (never run N worlds of size 1 silently).
    """
    if os.environ.get(MPI_LAUNCH_ENV) != "1":
        return
    expected = os.environ.get("WORLD_SIZE", "?")
    for rank_var, size_var in MPI_RANK_VARS:
        value = os.environ.get(rank_var)
        if value is None:
            continue
        size = os.environ.get(size_var) if size_var else None
        if size is not None and size != expected:
            sys.stderr.write(
                f"procgroup-run --backend mpi: mpiexec started this process as rank {value} of "
                f"{size} ({rank_var}/{size_var}), but the job has {expected} ranks; the mpiexec "
                f"used does not match the launcher's request\n"
            )
            raise SystemExit(2)
        rank = value
        break
    else:
        sys.stderr.write(
            "procgroup-run --backend mpi: this process was not started by an MPI launcher "
            f"(none of {', '.join(v for v, _ in MPI_RANK_VARS)} is set), so it would be an MPI "
            f"world of 1 instead of rank ? of {expected}; the mpiexec used is not the one of "
            "the MPI library mpi4py loads (set PROCGROUP_MPIEXEC to the right one)\n"
        )
        raise SystemExit(2)
    os.environ["RANK"] = os.environ["ROLE_RANK"] = rank
    node_offset = int(os.environ.get("GROUP_RANK", "0")) * int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    os.environ["LOCAL_RANK"] = str(int(rank) - node_offset)
    for var in _TEMPLATED:
        if var in os.environ:
            os.environ[var] = os.environ[var].replace("{rank}", rank)


def redirect_to_fifos() -> None:
    """Point fds 1 and 2 at the launcher's named pipes (ranks under mpiexec)."""
    for var, fd in ((STDOUT_FIFO_ENV, 1), (STDERR_FIFO_ENV, 2)):
        path = os.environ.pop(var, None)
        if path:
            target = os.open(path, os.O_WRONLY)  # blocks until the launcher's reader is there
            os.dup2(target, fd)
            os.close(target)


def _run_python(args: list[str]) -> None:
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


def main(argv: list[str] | None = None) -> None:
    """Bootstrap of one rank: install the handler, then run the script or module as __main__
    (or, with ``--exec``, replace this process by the program: ``--no-python``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or (args[0] in ("-m", "--exec", "--exec-mpiexec") and len(args) < 2):
        _usage()
    if args[0] == "--exec-mpiexec":  # the launcher's mpiexec: dies with the launcher too
        os.environ.pop(MPI_LAUNCH_ENV, None)
        die_with_launcher()
        os.environ[MPI_LAUNCH_ENV] = "1"  # for the ranks mpiexec starts
        os.execv(args[1], args[1:])
    die_with_launcher()
    adopt_mpi_rank()
    redirect_to_fifos()
    status = os.environ.get(STATUS_FILE_ENV)
    write_status(status, started=time.time())
    if args[0] == "--exec":
        sys.stdout.flush()
        try:
            os.execvp(args[1], args[1:])  # PR_SET_PDEATHSIG survives exec
        except OSError as err:
            sys.stderr.write(f"procgroup-run: cannot execute {args[1]!r}: {err.strerror}\n")
            write_status(status, exitcode=127, time=time.time())
            raise SystemExit(127) from None
    install_error_handler()
    dumps = install_flight_dump()
    try:
        _run_python(args)
    except SystemExit as exc:
        # recorded now, before the atexit teardown that lets the peers notice this rank
        write_status(status, exitcode=exit_code_of(exc), time=time.time())
        raise
    except BaseException as exc:
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
        write_status(status, exitcode=code, time=time.time(), raised=True)
        raise
    finally:
        if dumps:
            ignore_flight_signal()
    write_status(status, exitcode=0, time=time.time())


if __name__ == "__main__":
    main()
