"""The flight recorder: every rank keeps a bounded ring of its last operations.

Each op a caller starts on a :class:`~procgroup.backend.DataChannel` (the core's calls,
an algorithm's collectives; not the point-to-point steps inside a collective, whose tags
lie above the user tag space) writes one entry, either through :func:`wrap` or, on the
op layer's fast paths, by the op function itself (:func:`holds_entry`): the group, the
op's number on it (collectives and point-to-point counted apart, so the collective numbers
agree on every member), the op, root or peer, size and dtype, and its start time. The
entry is one tuple appended to a bounded deque and never written again, so the cost is a
counter, two attribute reads, one clock reading and one append per op (measured in
docs/debugging.md); anything that costs more (names, strings, line numbers, world ranks,
the state) is worked out only when the record is read. A blocking op's state is read from
the threads' stacks: an op whose frame still holds its entry is waiting, any other is
done. What only some ops get is a note beside the entry: a failure (its end time and
error), an issued op (its Work, weakly), and the caller's file and line (the first frame
outside procgroup and the backend packages), which are found only for an op that is
slow: one that has waited :data:`SLOW_S` (:func:`waiting`), fails, or is still running
when the record is read; an op that completed sooner has none.

:func:`snapshot` returns the entries as dicts; :func:`dump` adds the stacks of every
thread (so a rank stuck outside procgroup shows where). A rank publishes its dump
through the job's Store when another rank asks (:class:`Responder`, one thread blocked
in a Store get), which is how a rank whose op timed out names the culprit without
procgroup-run (:func:`gather`); procgroup-run asks by signal instead (docs/debugging.md).

``PROCGROUP_FLIGHT_RECORDER``: the ring's size (default 1024 entries); 0 turns it off.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import os
import socket
import sys
import threading
import time
import traceback
import weakref
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

from ..errors import CommTimeoutError, PeerError, ProcGroupError
from ._context import MAX_USER_TAG, POINT_TO_POINT

if TYPE_CHECKING:
    from ._channel import DataChannel

log = logging.getLogger(__name__)

ENV_RING = "PROCGROUP_FLIGHT_RECORDER"
#: set by procgroup-run: where a rank writes its dump when signalled or when it fails
ENV_DIR = "PROCGROUP_FLIGHT_DIR"
DEFAULT_RING = 1024
#: a published dump keeps the newest entries of each group only (a Store value stays small)
PUBLISHED_PER_GROUP = 64
#: how long a rank whose op failed waits for the others' dumps through the Store
GATHER_SECONDS = 1.5
#: how long a PeerError waits for the departed rank's reason (sent before its goodbye)
DEPARTURE_WAIT_S = 0.3

_P2P = frozenset(POINT_TO_POINT)
#: An entry is a tuple written once, when the op starts: (spec, seq, peer, nbytes, dtype,
#: t0), where spec is (GroupInfo, op), fixed per call site, and t0 a perf_counter_ns
#: reading. Nothing on an entry changes afterwards: a blocking op's state is read from the
#: threads' stacks (an op whose frame still holds its entry is waiting; any other is done),
#: and what only some ops get (a failure, an issued op's Work, the caller of a slow op) is
#: a note beside it (:func:`_note`).
_SPEC, _SEQ, _PEER, _NBYTES, _DTYPE, _T0 = range(6)
#: a note's fields (a list): the state; the caller's code and instruction offset (None
#: until named; the offset is made a line number when read); the end time (a failure's);
#: the error text, or an issued op's Work (weakly)
_N_STATE, _N_CODE, _N_LASTI, _N_T1, _N_EXTRA = range(5)
STARTED, DONE, FAILED, ISSUED = 0, 1, 2, 3
#: an entry's "caller" field when it names none (file, line and function are then None)
CALLER_OMITTED = "omitted: the op completed without waiting"
_STATE_NAMES = {STARTED: "waiting", DONE: "done", FAILED: "failed", ISSUED: "issued"}

#: op -> (index of the array that gives size and dtype, index of the root/peer); the
#: arguments as a channel takes them (procgroup.backend._channel)
_ARGS: dict[str, tuple[int | None, int | None]] = {
    "send": (0, 1), "recv": (0, 1),
    "broadcast": (0, 1), "all_reduce": (0, None), "reduce": (0, 1),
    "all_gather": (1, None), "gather": (0, 2), "scatter": (0, 2),
    "reduce_scatter": (0, None), "all_to_all": (1, None), "barrier": (None, None),
}


def _ring_size() -> int:
    raw = os.environ.get(ENV_RING, "")
    try:
        return max(0, int(raw)) if raw.strip() else DEFAULT_RING
    except ValueError:
        log.warning("%s=%r is not an integer: using %d", ENV_RING, raw, DEFAULT_RING)
        return DEFAULT_RING


def _taken(counter: Any) -> int:
    """How many numbers an ``itertools.count(1)`` has given (its repr is ``count(N)``)."""
    return int(repr(counter)[6:-1]) - 1


class GroupInfo:
    """What the record says of one channel: names and world ranks, and its op counters
    (``itertools.count`` objects: one C call per op gives the next number, atomically)."""

    __slots__ = ("key", "group_id", "backend", "ranks", "rank", "coll_seq", "p2p_seq", "__weakref__")

    def __init__(self, key: str, group_id: int, backend: str, ranks: tuple[int, ...], rank: int) -> None:
        self.key = key
        self.group_id = group_id
        self.backend = backend
        self.ranks = ranks  # world rank of each channel rank
        self.rank = rank  # this process's channel rank
        self.coll_seq = itertools.count(1)  # numbers the collectives started on the channel
        self.p2p_seq = itertools.count(1)  # numbers its point-to-point calls

    @property
    def coll(self) -> int:
        """Collectives started on the channel."""
        return _taken(self.coll_seq)

    @property
    def p2p(self) -> int:
        """Point-to-point calls started on the channel."""
        return _taken(self.p2p_seq)

    def world(self, rank: Any) -> Any:
        return self.ranks[rank] if isinstance(rank, int) and 0 <= rank < len(self.ranks) else rank


# ------------------------------------------------------------------ the caller's frame
_own_dirs: list[str] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep]
#: inside procgroup but callers in their own right: the benchmark's timing loops (their
#: line is the caller's line)
_CALLER_DIRS = (os.sep + "procgroup" + os.sep + "bench" + os.sep,)


#: source file name -> True when it is procgroup's or a backend's (its frames are walked
#: past). Keyed by the file name, not the code object: a str caches its hash, while hashing
#: a code object walks its bytecode and constants on every lookup
_OWN_FILES: dict[str, bool] = {}


def _classify(name: str) -> bool:
    """Whether source file ``name`` is procgroup's own; the verdict is remembered."""
    own = (any(name.startswith(d) for d in _own_dirs) and not any(c in name for c in _CALLER_DIRS)) or (
        name.startswith("<frozen") or os.sep + "concurrent" + os.sep in name or name.endswith(os.sep + "threading.py"))
    _OWN_FILES[name] = own
    return own


def add_own_package(module_name: str) -> None:
    """Count a backend's package as procgroup's own: its frames are never the caller."""
    mod = sys.modules.get(module_name.split(".")[0])
    path = getattr(mod, "__file__", None)
    if path:
        d = os.path.dirname(os.path.abspath(path)) + os.sep
        if d not in _own_dirs:
            _own_dirs.append(d)
            _OWN_FILES.clear()


_getframe = sys._getframe
_ns = time.perf_counter_ns
#: ids of the code objects whose frames hold the entry of the op they record in the local
#: ``entry``: wrap's wrappers (below) and the op layer's fast paths (:func:`holds_entry`).
#: Ids, not the code objects: hashing a code object walks its bytecode on every lookup,
#: and these live as long as their functions, which are never freed
_HOLDERS: set[int] = set()


def holds_entry(fn: Callable[..., Any]) -> None:
    """``fn`` writes entries itself (an op layer's fast path): while it runs, its local
    ``entry`` (an entry tuple) is an op in progress, found there by :func:`waiting` and by
    the readers of the record. ``fn`` must call :func:`failed` when its op raises."""
    _HOLDERS.add(id(fn.__code__))


#: Held while a note is made or the notes are pruned: a prune reads the ring, then drops the
#: notes not in it, so a note made between the two by another thread (its entry appended
#: after the read) would be dropped and its op read as done
_NOTES_LOCK = threading.Lock()


def _note(entry: tuple[Any, ...]) -> list[Any]:
    """The note beside ``entry`` (made on first use: an op that is slow, failed or issued)."""
    notes = RECORDER.notes
    key = (entry[_SPEC], entry[_SEQ])
    note = notes.get(key)
    if note is None:
        with _NOTES_LOCK:
            if len(notes) >= 2 * RECORDER.size + 64:
                _prune_notes()
            note = notes.setdefault(key, [STARTED, None, None, 0, None])
    return note


def _prune_notes() -> None:
    """Drop the notes of entries the ring no longer holds (under ``_NOTES_LOCK``)."""
    kept = {(e[_SPEC], e[_SEQ]) for e in RECORDER.entries()}
    notes = RECORDER.notes
    for key in [k for k in list(notes) if k not in kept]:
        notes.pop(key, None)


def _resolve(entry: tuple[Any, ...], wrapper_frame: Any) -> None:
    """Note as ``entry``'s caller the first frame outward of ``wrapper_frame`` (the frame
    that records the op) that is not procgroup's or a backend's (the outermost when all are)."""
    note = _note(entry)
    if note[_N_CODE] is not None:
        return
    f = wrapper_frame.f_back
    if f is None:
        return
    while f.f_back is not None:
        name = f.f_code.co_filename
        own = _OWN_FILES.get(name)
        if not (own or (own is None and _classify(name))):
            break
        f = f.f_back
    note[_N_LASTI] = f.f_lasti  # before the code: a reader that sees the code sees the line
    note[_N_CODE] = f.f_code


def _entry_of(frame: Any) -> tuple[Any, ...] | None:
    """The entry held by ``frame`` when it is one that records an op (a holder)."""
    if id(frame.f_code) not in _HOLDERS:
        return None
    try:
        entry = frame.f_locals.get("entry")
    except Exception:  # noqa: BLE001 - a frame finishing meanwhile: nothing to name
        return None
    return entry if type(entry) is tuple and len(entry) == 6 else None


#: A wait calls :func:`waiting` once it has lasted this long, never sooner: the stack walk
#: must not delay a wait's first yield of the core, which on a host with more ranks than
#: cores is what lets the awaited peer run.
SLOW_S = 0.01


def waiting() -> None:
    """The calling thread's op has waited :data:`SLOW_S` (procgroup.backend.poll and the
    backends' own slow paths call this once per wait): name its caller now, walking this
    thread's own stack, so a dump taken while it waits shows where it was called."""
    if RECORDER.size == 0:
        return
    f: Any = _getframe(1)
    while f is not None:
        entry = _entry_of(f)
        if entry is not None:
            _resolve(entry, f)
            return
        f = f.f_back


def _running() -> set[tuple[Any, int]]:
    """The ops some thread is inside now (read from the threads' stacks), as (spec, seq)
    keys; their callers are named on the way (for a dump taken while an op waits without
    having passed through :func:`waiting`: a backend whose wait does not call it)."""
    found = set()
    for top in sys._current_frames().values():
        f: Any = top
        while f is not None:
            entry = _entry_of(f)
            if entry is not None:
                found.add((entry[_SPEC], entry[_SEQ]))
                try:
                    _resolve(entry, f)
                except Exception:  # noqa: BLE001 - best effort: the stack moved on
                    pass
            f = f.f_back
    return found


# ------------------------------------------------------------------ the ring
class Recorder:
    """The process's ring of entries (one per process: every channel writes to it)."""

    def __init__(self) -> None:
        self.size = 0
        self.ring: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=0)
        #: (spec, seq) -> note, for the entries that have one (_note)
        self.notes: dict[tuple[Any, int], list[Any]] = {}
        self.configured = False
        self.world_rank: int | None = None
        self.groups: weakref.WeakSet[GroupInfo] = weakref.WeakSet()
        #: what this rank knows of the job's first failure and of departures, world ranks
        self.first_failure: str | None = None
        self.departures: dict[int, str] = {}
        self.responder: Responder | None = None

    def configure(self) -> None:
        """Size the ring from $PROCGROUP_FLIGHT_RECORDER, once: at the first channel (so a
        process may set the variable after importing procgroup, before init)."""
        if not self.configured:
            self.size = _ring_size()
            self.ring = collections.deque(maxlen=self.size)
            self.configured = True

    def entries(self) -> list[tuple[Any, ...]]:
        """The entries, oldest first (a copy: the ring goes on changing)."""
        while True:
            try:
                return list(self.ring)
            except RuntimeError:  # another thread appended meanwhile: read again
                continue

    @property
    def recorded(self) -> int:
        """Ops recorded since the start (the ring keeps the newest ``size``)."""
        return sum(g.coll + g.p2p for g in self.groups)


RECORDER = Recorder()


def wrap(channel: DataChannel, op: str, fn: Callable[..., Any], started: bool = False) -> Callable[..., Any]:
    """``fn`` (the blocking callable of ``op``, or its ``start`` when ``started``) writing
    one ring entry per call.

    This is on the path of every op, so it does only what is cheap at call time: the
    group's op number, the peer or root, size and dtype read from the array (never the
    array kept: the ring must not hold the caller's memory) and one clock reading, in one
    tuple appended to the ring; a completed op writes nothing more (its frame is gone, so
    it reads as done). The caller is not looked up: a blocking op's caller is named only
    when the op turns out to be slow, by its own thread (:func:`waiting`, from a wait's
    slow path; the failure path; a dump taken while it runs, from the threads' stacks), so
    an op that completed without waiting has none. An issued op (``started``) names its
    caller at once: once its start returns, no stack leads to it.
    """
    rec = RECORDER
    if rec.size == 0:
        return fn
    info = channel._flight_info
    append = rec.ring.append
    array_at, peer_at = _ARGS.get(op, (None, None))
    spec = (info, op)
    wrapper: Any  # one of the three below

    if op in _P2P:
        seqs = info.p2p_seq  # numbered from 1: "the 5th all_reduce" is #5

        def call_p2p(array: Any, peer: Any = None, tag: int = 0) -> Any:
            if tag >= MAX_USER_TAG:  # a step of a collective, a group's translated call
                return fn(array, peer, tag)
            try:
                nbytes = array.nbytes
                dtype = array.dtype
            except AttributeError:
                nbytes, dtype = -1, None
            entry = (spec, next(seqs), peer, nbytes, dtype, _ns())
            append(entry)
            if started:
                _issued(entry, _getframe())
            try:
                result = fn(array, peer, tag)
            except BaseException as exc:
                failed(channel, entry, exc)
                raise
            if started:
                _track(entry, result)
            return result

        wrapper = call_p2p
    elif op == "all_reduce" and not started:
        # all_reduce: (array, op), the latency-critical one (reduce_scatter's three
        # arguments take the general wrapper below)
        seqs = info.coll_seq

        def call_reduce(array: Any, reduce_op: Any) -> Any:
            try:
                nbytes = array.nbytes
                dtype = array.dtype
            except AttributeError:
                nbytes, dtype = _list_shape(array)
            entry = (spec, next(seqs), None, nbytes, dtype, _ns())
            append(entry)
            try:
                return fn(array, reduce_op)
            except BaseException as exc:
                failed(channel, entry, exc)
                raise

        wrapper = call_reduce
    else:
        seqs = info.coll_seq

        def call(*args: Any) -> Any:
            if array_at is not None and array_at < len(args):
                x = args[array_at]
                try:
                    nbytes = x.nbytes
                    dtype = x.dtype
                except AttributeError:
                    nbytes, dtype = _list_shape(x)
            else:
                nbytes, dtype = 0, None
            peer = args[peer_at] if peer_at is not None and peer_at < len(args) else None
            entry = (spec, next(seqs), peer, nbytes, dtype, _ns())
            append(entry)
            if started:
                _issued(entry, _getframe())
            try:
                result = fn(*args)
            except BaseException as exc:
                failed(channel, entry, exc)
                raise
            if started:
                _track(entry, result)
            return result

        wrapper = call
    _HOLDERS.add(id(wrapper.__code__))
    return wrapper


def _list_shape(x: Any) -> tuple[int, Any]:
    if isinstance(x, (list, tuple)) and x:
        return sum(int(getattr(a, "nbytes", 0)) for a in x), getattr(x[0], "dtype", None)
    return -1, None


def _issued(entry: tuple[Any, ...], wrapper_frame: Any) -> None:
    """An issued op (a start): marked so, its caller named at once (see :func:`wrap`)."""
    _note(entry)[_N_STATE] = ISSUED
    _resolve(entry, wrapper_frame)


def _track(entry: tuple[Any, ...], work: Any) -> None:
    """An issued op's Work, weakly: the record asks it whether it completed."""
    note = _note(entry)
    try:
        note[_N_EXTRA] = weakref.ref(work)
    except TypeError:
        note[_N_STATE] = DONE  # a Work that cannot be referenced weakly is a completed one


def failed(channel: DataChannel, entry: tuple[Any, ...], exc: BaseException) -> None:
    """The op of ``entry`` raised ``exc`` (called by the frame that recorded it): note the
    failure, name the caller, and add to a procgroup error what the record knows."""
    try:  # the caller, from the recording frame (the one that called this), before the error is explained
        _resolve(entry, _getframe(1))
    except Exception:  # noqa: BLE001 - the record is best effort: the op's own error is what counts
        pass
    note = _note(entry)
    note[_N_T1] = _ns()
    note[_N_EXTRA] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    note[_N_STATE] = FAILED  # last: a reader that sees the state sees its time and error
    if isinstance(exc, ProcGroupError) and not getattr(exc, "_flight_seen", False):
        try:
            exc._flight_seen = True  # type: ignore[attr-defined]  # a mark: explained once, however often re-raised
            explain(channel, entry, exc)
        except Exception:  # the report is best effort: the op's own error is what counts
            log.debug("flight recorder: could not explain %s", exc, exc_info=True)


# ------------------------------------------------------------------ reading the record
def _entry_dict(e: tuple[Any, ...], wall: int, running: set[tuple[Any, int]]) -> dict[str, Any]:
    """One entry as the record gives it (``wall``: time_ns() - perf_counter_ns(), to make
    the entry's clock readings wall-clock seconds; ``running``: the keys of the ops some
    thread is inside, from :func:`_running`)."""
    spec = e[_SPEC]
    info: GroupInfo = spec[0]
    op = spec[1]
    key = (spec, e[_SEQ])
    note = RECORDER.notes.get(key)
    state, code, lasti, t1, extra = note if note is not None else (STARTED, None, None, 0, None)
    if state == STARTED:  # a blocking op: waiting while a frame holds it, else done
        state = STARTED if key in running else DONE
    elif state == ISSUED:
        work = extra() if callable(extra) else None
        if work is not None:
            try:
                if work.is_completed():
                    state = FAILED if work.exception() is not None else DONE
            except Exception:  # noqa: BLE001 - a broken Work reads as still issued
                pass
        elif extra is not None:  # the Work is gone: it completed
            state = DONE
        extra = None
    dtype = e[_DTYPE]
    line = _line(code, lasti) if code is not None and lasti is not None else None
    d = {
        "group": info.key, "group_id": info.group_id, "backend": info.backend, "group_ranks": list(info.ranks),
        "seq": e[_SEQ], "op": op, "kind": "p2p" if op in _P2P else "collective",
        "peer": info.world(e[_PEER]), "bytes": int(e[_NBYTES]) if e[_NBYTES] is not None else -1,
        "dtype": str(getattr(dtype, "name", dtype)) if dtype is not None else None,
        "state": _STATE_NAMES[state],
        "start": round((e[_T0] + wall) / 1e9, 6), "end": round((t1 + wall) / 1e9, 6) if t1 else None,
        "file": code.co_filename if code is not None else None, "line": line,
        "function": code.co_name if code is not None else None,
    }
    if code is None:
        d["caller"] = CALLER_OMITTED
    if isinstance(extra, str):
        d["error"] = extra
    return d


def _line(code: Any, lasti: int) -> int | None:
    """The source line of instruction offset ``lasti`` in ``code`` (what f_lineno says)."""
    for start, end, line in code.co_lines():
        if start <= lasti < end:
            return int(line) if line is not None else None
    return None


def snapshot() -> list[dict[str, Any]]:
    """This rank's record: the ring's entries as dicts, oldest first (the ops still
    running named their callers first)."""
    entries = RECORDER.entries()  # before the stacks: an op that ends in between reads as done
    running = _running()
    wall = time.time_ns() - _ns()
    return [_entry_dict(e, wall, running) for e in entries]


def stacks(skip: int | None = None, frame: Any = None) -> list[dict[str, Any]]:
    """Every thread's stack, innermost frame last (``frame`` replaces the current thread's
    top, e.g. a signal handler's interrupted frame; ``skip``: a thread ident to leave out)."""
    names = {t.ident: (t.name, t.daemon) for t in threading.enumerate()}
    me = threading.get_ident()
    out = []
    for ident, top in sys._current_frames().items():
        if ident == skip:
            continue
        if ident == me and frame is not None:
            top = frame
        name, daemon = names.get(ident, (f"thread {ident}", True))
        frames = [{"file": fs.filename, "line": fs.lineno, "function": fs.name, "code": (fs.line or "").strip()}
                  for fs in traceback.extract_stack(top, limit=40)]
        out.append({"thread": name, "main": ident == threading.main_thread().ident, "daemon": daemon,
                    "frames": frames})
    return out


def dump(frame: Any = None, per_group: int | None = None, skip_thread: int | None = None) -> dict[str, Any]:
    """This rank's record and stacks, JSON-ready."""
    ops = snapshot()
    if per_group is not None:
        kept: dict[str, int] = {}
        picked = []
        for d in reversed(ops):
            k = kept.get(d["group"], 0)
            if k < per_group:
                kept[d["group"]] = k + 1
                picked.append(d)
        ops = picked[::-1]
    rec = RECORDER
    rank = rec.world_rank
    if rank is None:
        env = os.environ.get("RANK")
        rank = int(env) if env is not None and env.isdigit() else None
    return {
        "format": "procgroup-flight-1", "rank": rank, "pid": os.getpid(), "host": socket.gethostname(),
        "time": time.time(), "ring_size": rec.size, "ops_recorded": rec.recorded,
        "own_dirs": list(_own_dirs), "first_failure": rec.first_failure,
        "departures": {str(k): v for k, v in rec.departures.items()},
        "ops": ops, "stacks": stacks(skip=skip_thread, frame=frame),
    }


def write_dump(path: str, frame: Any = None) -> None:
    """Write :func:`dump` as JSON to ``path`` atomically (a reader never sees half of it)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(dump(frame=frame), f)
    os.replace(tmp, path)


def dump_path(directory: str, rank: Any) -> str:
    return os.path.join(directory, f"rank{rank}.flight.json")


# ------------------------------------------------------------------ channels register
def register(channel: DataChannel) -> GroupInfo:
    """The GroupInfo of a new channel (the core calls it from DataChannel.__init__)."""
    RECORDER.configure()
    ctx = channel.ctx
    ranks = tuple(ctx.global_ranks) if ctx.global_ranks else tuple(range(ctx.size))
    prefix = getattr(ctx.store, "prefix", None)
    key = prefix[3:] if isinstance(prefix, str) and prefix.startswith("pg/") else f"group{ctx.group_id}"
    if key.startswith("shrink") or not key:
        key = f"group{ctx.group_id}"
    info = GroupInfo(key, ctx.group_id, channel.backend_name or type(channel).__name__, ranks, ctx.rank)
    RECORDER.groups.add(info)
    add_own_package(type(channel).__module__)
    if ctx.group_id == 0 and ctx.size == len(ranks):
        RECORDER.world_rank = ranks[ctx.rank] if ctx.rank < len(ranks) else ctx.rank
        if ctx.size > 1 and RECORDER.size:
            _start_responder(channel)
    return info


# ------------------------------------------------------------------ gathering through the Store
_ASKS = "flight/asks"


def _store_of(channel: DataChannel) -> Any:
    """The channel's Store when a thread may block in it cheaply (a TCPStore), else None."""
    store = channel.ctx.store
    inner: Any = store
    for _ in range(8):
        if type(inner).__name__ == "TCPStore":
            return store
        inner = getattr(inner, "store", None)
        if inner is None:
            return None
    return None


class Responder:
    """A thread of each rank that answers other ranks' requests for its dump (Store keys
    ``flight/ask/N`` -> ``flight/rec/N/<rank>``); it ends when the Store closes."""

    def __init__(self, store: Any, rank: int, size: int) -> None:
        self.store = store
        self.rank = rank
        self.size = size
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name="procgroup-flight", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        n = 1
        while not self.stopped:
            try:
                self.store.get(f"flight/ask/{n}", timeout=3600.0)
            except CommTimeoutError:
                continue
            except Exception:  # noqa: BLE001 - the Store closed (destroy_process_group) or broke: done
                return
            if self.stopped:
                return
            try:
                body = json.dumps(dump(per_group=PUBLISHED_PER_GROUP, skip_thread=threading.get_ident()))
                self.store.set(f"flight/rec/{n}/{self.rank}", body)
            except Exception:
                log.debug("flight recorder: cannot publish dump %d", n, exc_info=True)
                return
            n += 1


def _start_responder(channel: DataChannel) -> None:
    store = _store_of(channel)
    if store is None:
        return
    old = RECORDER.responder
    if old is not None:
        old.stopped = True
    RECORDER.responder = Responder(store, channel.ctx.rank, channel.ctx.size)


def gather(timeout: float = GATHER_SECONDS) -> dict[int, dict[str, Any]]:
    """Every live rank's dump, asked through the Store (this rank's own included); ranks
    that do not answer within ``timeout`` are left out. Empty without a responder."""
    resp = RECORDER.responder
    if resp is None or resp.stopped:
        return {}
    store = resp.store
    n = int(store.add(_ASKS, 1))
    store.set(f"flight/ask/{n}", str(resp.rank))
    found: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    for r in range(resp.size):
        left = deadline - time.monotonic()
        try:
            raw = store.get(f"flight/rec/{n}/{r}", timeout=max(left, 0.05))
            data = json.loads(raw)
        except Exception:  # noqa: BLE001 - a rank that does not answer is left out
            continue
        if isinstance(data, dict):
            found[r] = data
    return found


# ------------------------------------------------------------------ explaining a failure
def explain(channel: DataChannel, entry: tuple[Any, ...], exc: ProcGroupError) -> None:
    """Add to a failed op's error what the record knows: the first failure of the job for
    a PeerError, the culprit for a timeout (from every live rank's dump)."""
    from .. import _flight_analysis as analysis

    rec = RECORDER
    notes = []
    if isinstance(exc, PeerError):
        info = channel._flight_info
        blamed = [info.world(r) for r in (exc.ranks or ())]
        # a departing rank's reason goes out before its goodbye, but the goodbye may be
        # seen first on another path (shared memory): give the reason a moment to land.
        # Only for a goodbye (``departed``): a rank that crashed or went silent sends no
        # reason, and waiting for one would only delay every survivor's detection.
        # Not under procgroup-run (which sets ENV_DIR): the launcher names the root cause
        # from every rank's status, and stops the job as soon as one rank fails, so a
        # wait here would only lose this rank's own error to the launcher's SIGTERM.
        departed = getattr(exc, "departed", False)
        wait = DEPARTURE_WAIT_S if departed and not os.environ.get(ENV_DIR) else 0.0
        deadline = time.monotonic() + wait
        while blamed and not any(r in rec.departures for r in blamed) and time.monotonic() < deadline:
            time.sleep(0.01)
        mine = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        why = [f"rank {r} left because: {rec.departures[r].split('; first failure: ')[0]}"
               for r in blamed if r in rec.departures]
        first = rec.first_failure
        if first is None:
            rec.first_failure = first = f"{mine}" + (f" ({why[0]})" if why else "")
        elif not any(first.startswith(f"rank {r} left:") for r in blamed) or not why:
            notes.append(f"first failure in the job: {first}")
        notes.extend(why)
    elif isinstance(exc, CommTimeoutError):
        dumps = gather()
        if dumps:
            report = analysis.analyse(list(dumps.values()), world_size=None)
            text = report.summary()
            if text:
                notes.append(text)
                log.error("procgroup flight recorder, as seen by rank %s:\n%s", rec.world_rank, report.text())
    directory = os.environ.get(ENV_DIR)
    if directory:
        try:
            write_dump(dump_path(directory, rec.world_rank), None)
        except OSError:
            pass
    if notes and exc.args and isinstance(exc.args[0], str):
        exc.args = (exc.args[0] + "\n  " + "\n  ".join(notes),) + exc.args[1:]


def departure_reason(channel: DataChannel) -> str | None:
    """Why this rank is leaving, when it leaves because something failed: its channel's
    failure, else the exception the interpreter is exiting with."""
    failure = channel.failure
    rec = RECORDER
    if failure is not None:
        text = str(failure).splitlines()[0] if str(failure) else type(failure).__name__
        if rec.first_failure and rec.first_failure not in text:
            text += f"; first failure: {rec.first_failure}"
        return text
    last = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if last is not None and not isinstance(last, (KeyboardInterrupt, SystemExit)):
        tb = traceback.extract_tb(last.__traceback__)
        theirs = [f for f in tb if not any(f.filename.startswith(d) for d in _own_dirs)] or tb
        where = f" at {os.path.basename(theirs[-1].filename)}:{theirs[-1].lineno}" if theirs else ""
        text = f"it raised {type(last).__name__}: {str(last).splitlines()[0] if str(last) else ''}{where}"
        return text if rec.first_failure is None else f"{text}; first failure: {rec.first_failure}"
    return None


def departed(rank: int, reason: str) -> None:
    """A peer (world ``rank``) said why it leaves: kept for the errors its departure causes.
    Its reason carries the first failure it knew of, which becomes this rank's too."""
    rec = RECORDER
    reason = reason[:1000]
    rec.departures[rank] = reason
    if rec.first_failure is None:
        marker = "; first failure: "
        rec.first_failure = reason.split(marker, 1)[1] if marker in reason else f"rank {rank} left: {reason}"


__all__ = ["CALLER_OMITTED", "ENV_DIR", "ENV_RING", "RECORDER", "GroupInfo", "Recorder", "departed", "departure_reason", "dump",
           "dump_path", "failed", "gather", "holds_entry", "register", "snapshot", "stacks", "waiting", "wrap",
           "write_dump"]
