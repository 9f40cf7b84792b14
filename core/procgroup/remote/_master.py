"""The master side: one link per node, command batches, replies, the current node/stream.

Commands are appended to the node's pending batch and sent by a flusher thread as soon as
it gets to run (a loop of async ops therefore goes out in batches of hundreds), or at
once by the caller's thread when it needs an answer (every sync point flushes first) or
when the batch reaches :data:`MAX_BATCH`. Frees of garbage-collected arrays are queued
lock-free by the collector and travel at the end of the next batch.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import pickle
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _lifecycle, _ops
from ..errors import (
    BackendUnavailableError,
    CommTimeoutError,
    InvalidArgumentError,
    NotInitializedError,
    ProcGroupError,
    RemoteError,
)
from . import _protocol as P
from ._protocol import Command, ErrorInfo
from ._worker import post_array, recv_array, recv_posted

log = logging.getLogger(__name__)

MAX_BATCH = 512
#: a command whose arrays total at most this many bytes may run on the worker's
#: dispatching thread when its stream is idle (no thread hand-off)
SMALL_BYTES = 64 << 10
#: remote.send of at most this many bytes travels inside the command itself
INLINE_SEND = 2048


def remote_error(errors: list[ErrorInfo]) -> RemoteError:
    e = errors[0]
    more = f" (and {len(errors) - 1} more failed operation(s) on that node)" if len(errors) > 1 else ""
    text = (f"node {e.node} (rank {e.rank}): {e.op} failed: {e.exc_type}: {e.message}{more}")
    if e.traceback:
        text += f"\n\nTraceback on node {e.node} (rank {e.rank}):\n{e.traceback.rstrip()}"
    return RemoteError(text, node=e.node, rank=e.rank, op=e.op, exc_type=e.exc_type,
                       remote_traceback=e.traceback, errors=[x.as_tuple() for x in errors])


class NodeLink:
    """The master's connection to one node (world rank node + 1)."""

    def __init__(self, master: Master, node: int, info: dict[str, Any]) -> None:
        self.master = master
        self.node = node
        self.rank = node + 1
        self.info = info
        self.lock = threading.Lock()
        self.pending: list[tuple[Any, ...]] = []
        self.frees: collections.deque[int] = collections.deque()
        self.buf = np.empty(P.FRAME, np.uint8)
        self.next_stream = itertools.count(1)
        self.failure: BaseException | None = None

    def issue(self, cmd: tuple[Any, ...]) -> None:
        with self.lock:
            self.pending.append(cmd)
            n = len(self.pending)
            if n >= MAX_BATCH:
                self._flush_locked()
        if n == 1:
            self.master.wake.set()

    def issue_now(self, cmd: tuple[Any, ...]) -> None:
        """Issue and send at once, without the flusher (the caller waits for an answer
        next, or the command is on a transfer's critical path)."""
        with self.lock:
            self._drain_frees()  # frees of arrays dropped so far come before the request
            self.pending.append(cmd)
            self._flush_locked()

    def flush(self) -> None:
        with self.lock:
            self._flush_locked()

    def _drain_frees(self) -> None:
        """Queue a free of the arrays garbage-collected so far (after the pending commands,
        which were issued while those arrays were alive)."""
        frees = self.frees
        if frees:
            ids = []
            try:
                while True:
                    ids.append(frees.popleft())
            except IndexError:
                pass
            self.pending.append((Command.FREE.value, tuple(ids)))

    def _flush_locked(self) -> None:
        if self.failure is not None:
            raise ProcGroupError(f"node {self.node} (rank {self.rank}) cannot be reached: {self.failure}") \
                from self.failure
        self._drain_frees()
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        try:
            P.send_payload(self.master.channel, self.buf, self.rank, P.CMD_TAG, P.FrameKind.COMMANDS, P.dumps(batch))
        except ProcGroupError as exc:
            self.failure = exc
            raise

    # ------------------------------------------------------------ requests with a reply
    def request(self, build: Callable[[int], tuple[Any, ...]], what: str) -> Any:
        """Issue the command ``build(tag)`` and return the worker's pickled answer."""
        tag = P.reply_tag(next(self.master.tags))
        self.issue_now(build(tag))
        return self.wait_value(tag, what)

    def wait_value(self, tag: int, what: str, timeout: float | None = None) -> Any:
        buf = self.master.scratch()
        try:
            if timeout is None:
                kind, payload = P.recv_payload(self.master.channel, buf, self.rank, tag)
            else:
                work = self.master.channel.irecv(buf, self.rank, tag)
                work.wait(timeout)
                kind, n = P.HEADER.unpack_from(buf, 0)
                payload = buf[P.HEADER.size:P.HEADER.size + n].tobytes()
        except CommTimeoutError as exc:
            raise CommTimeoutError(f"{what}: node {self.node} (rank {self.rank}) did not answer: {exc}",
                                   op=what, ranks=[self.rank]) from None
        value = pickle.loads(payload)
        if kind == P.FrameKind.ERRORS:
            raise remote_error([ErrorInfo(*t) for t in value])
        return value

    def get_array(self, build: Callable[[int, bool], tuple[Any, ...]], shape: tuple[int, ...], dtype: np.dtype,
                  what: str) -> np.ndarray:
        """Issue ``build(tag, posted)`` and receive the array it sends back. A large one
        goes posted (its receive posted before the command leaves, :mod:`._protocol`);
        otherwise, or when that allocation fails here, it is allocated only once the
        worker said the data is coming, so a failed array costs no allocation here."""
        tag = P.reply_tag(next(self.master.tags))
        channel = self.master.channel
        out = work = None
        if P.posts(channel, math.prod(shape) * dtype.itemsize):
            try:
                out = np.empty(shape, dtype)
            except MemoryError:
                out = None  # the worker's answer decides (its array may have failed anyway)
            else:
                work = post_array(channel, self.rank, tag, out)
        try:
            self.issue_now(build(tag, work is not None))
            if out is not None:
                got = recv_posted(channel, self.master.scratch(), self.rank, tag, out, work)
            else:
                got = recv_array(channel, self.master.scratch(), self.rank, tag, shape, dtype)
        except BaseException as exc:
            if work is not None:
                work.cancel()  # nothing may land in ``out`` after this
            if isinstance(exc, CommTimeoutError):
                raise CommTimeoutError(f"{what}: node {self.node} (rank {self.rank}) did not answer: {exc}",
                                       op=what, ranks=[self.rank]) from None
            raise
        if isinstance(got, list):
            raise remote_error(got)
        return got

    def check_device(self, device: int) -> None:
        if device < 0:
            return
        gpus = int(self.info.get("gpus") or 0)
        if gpus == 0:
            why = self.info.get("cupy_error") or "CuPy sees no GPU"
            raise BackendUnavailableError(
                f"device={device}: node {self.node} (rank {self.rank}, host {self.info.get('host')}) has no CUDA "
                f"GPU for procgroup.remote ({why}); use device=-1 (the worker's memory)")
        if device >= gpus:
            raise InvalidArgumentError(f"device={device}: node {self.node} has {gpus} GPU(s) (devices 0..{gpus - 1})")


class _Local(threading.local):
    def __init__(self) -> None:
        self.node = 0
        self.streams: dict[int, list[int]] = {}  # node -> stack of stream ids
        self.buf: np.ndarray | None = None


class Master:
    def __init__(self, channel: Any, infos: list[dict[str, Any]], timeout: float, workers: tuple[int, ...]) -> None:
        self.channel = channel
        self.timeout = timeout
        self.links = [NodeLink(self, k, info) for k, info in enumerate(infos)]
        self.ids = itertools.count(1)
        self.tags = itertools.count()
        self.transfers = itertools.count()
        self.groups: set[tuple[int, ...]] = {workers} if workers else set()
        self.local = _Local()
        self.closed = False
        self.wake = threading.Event()
        self.flusher = threading.Thread(target=self._flush_loop, name="procgroup-master-flusher", daemon=True)
        self.flusher.start()

    def scratch(self) -> np.ndarray:
        b = self.local.buf
        if b is None:
            b = self.local.buf = np.empty(P.FRAME, np.uint8)
        return b

    def _flush_loop(self) -> None:
        while not self.closed:
            self.wake.wait(0.05)
            self.wake.clear()
            for link in self.links:
                if (link.pending or link.frees) and link.failure is None:
                    try:
                        link.flush()
                    except Exception:
                        log.debug("flushing node %d failed", link.node, exc_info=True)

    # ------------------------------------------------------------ current node and stream
    def link(self, node: int | None) -> NodeLink:
        if node is None:
            node = self.local.node
        if isinstance(node, bool) or not isinstance(node, (int, np.integer)):
            raise InvalidArgumentError(f"node must be an int, got {node!r}")
        if not 0 <= node < len(self.links):
            raise InvalidArgumentError(f"node {node} does not exist: this job has {len(self.links)} node(s) "
                                       f"(0..{len(self.links) - 1})")
        return self.links[int(node)]

    def stream_id(self, node: int) -> int:
        stack = self.local.streams.get(node)
        return stack[-1] if stack else 0

    def ensure_group(self, ranks: tuple[int, ...]) -> None:
        """Make the group of these worker ranks on every rank (collective: all workers too)."""
        if ranks in self.groups:
            return
        for link in self.links:
            link.issue((Command.NEW_GROUP.value, ranks))
            link.flush()
        _lifecycle.new_group(list(ranks))
        self.groups.add(ranks)

    # ------------------------------------------------------------ the end
    def shutdown(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.wake.set()
        self.flusher.join(2.0)
        tags = []
        for link in self.links:
            try:
                tag = P.reply_tag(next(self.tags))
                link.issue((Command.GOODBYE.value, tag))
                link.flush()
                tags.append((link, tag))
            except Exception as exc:  # noqa: BLE001 - a dead node cannot be told
                log.warning("procgroup master-worker: could not tell node %d to end: %s", link.node, exc)
        confirmed = 0
        for link, tag in tags:
            try:
                link.wait_value(tag, "destroy_process_group", timeout=min(self.timeout, 30.0))
                confirmed += 1
            except Exception as exc:  # noqa: BLE001 - logged; the other nodes are still waited for
                log.warning("procgroup master-worker: node %d did not confirm its end: %s", link.node, exc)
        if confirmed == len(self.links):
            try:
                _ops.barrier()  # the workers' last call too: everyone closes together
            except Exception as exc:  # noqa: BLE001 - logged; the master's teardown goes on
                log.warning("procgroup master-worker: the final barrier failed: %s", exc)


MASTER: Master | None = None


def master() -> Master:
    m = MASTER
    if m is None:
        raise NotInitializedError("procgroup.remote needs procgroup.init_master_worker() first (and runs on the "
                                  "master, rank 0)")
    return m


def teardown() -> None:
    """destroy_process_group's hook: end the workers before the channels close."""
    global MASTER
    m, MASTER = MASTER, None
    if m is not None:
        m.shutdown()


__all__ = [
    "INLINE_SEND",
    "MASTER",
    "MAX_BATCH",
    "SMALL_BYTES",
    "Master",
    "NodeLink",
    "master",
    "remote_error",
    "teardown",
]
