"""The DataChannel contract every backend implements, and the Work handle of async ops.

A DataChannel is one communicator: ``size`` ranks joined over one transport. Its ranks
are the group's ranks (0..size-1), never global ones; the core translates. A plugin
must implement :meth:`DataChannel.send`, :meth:`DataChannel.recv` (any-source when
``src`` is None) and :meth:`DataChannel.close`; every collective has a default here,
built on send/recv by :mod:`procgroup.algorithms` on a private tag space, so a
send/recv-only plugin is complete. A backend overrides what it does better.

Arrays reaching a channel are already validated: NumPy arrays viewing the caller's
memory (C-contiguous, writable where the op writes), or device arrays when the backend
declared the ``cuda`` device. Tags are 64-bit non-negative ints: users get
``[0, 2**31)``, collectives use ``COLLECTIVE_TAG_BASE`` and above.
"""

from __future__ import annotations

import abc
import concurrent.futures
import itertools
import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from .errors import ChannelClosedError, CommTimeoutError
from .ops import ReduceOp

if TYPE_CHECKING:
    from .rendezvous import Store

log = logging.getLogger(__name__)

#: User tags must stay below this; collectives and subgroups use the space above.
MAX_USER_TAG = 2**31
COLLECTIVE_TAG_BASE = 2**40
_GROUP_TAG_STRIDE = 2**24

#: Every collective a DataChannel offers; the capability table iterates over these.
COLLECTIVES = (
    "broadcast",
    "all_reduce",
    "reduce",
    "all_gather",
    "gather",
    "scatter",
    "reduce_scatter",
    "all_to_all",
    "barrier",
)
POINT_TO_POINT = ("send", "recv", "isend", "irecv")
ALL_OPS = POINT_TO_POINT + COLLECTIVES


@dataclass(frozen=True)
class ChannelContext:
    """What a backend gets at construction: who it is, who the peers are, how to meet."""

    rank: int
    size: int
    store: "Store"  # a PrefixStore private to this channel
    timeout: float  # seconds; every blocking call of the channel honours it
    master_addr: str | None = None  # where rank 0 of the world is reached (interface choice)
    global_ranks: tuple[int, ...] = ()  # world rank of each channel rank, for messages
    group_id: int = 0  # 0 for the world; distinct per group, the same on every member
    options: Mapping[str, Any] = field(default_factory=dict)

    def global_rank(self, rank: int) -> int:
        """The world rank of channel rank ``rank`` (for error messages)."""
        return self.global_ranks[rank] if self.global_ranks else rank


class Work:
    """Handle of an operation started with ``async_op=True`` (or isend/irecv).

    ``wait()`` blocks until the op is done and re-raises its error; with a ``timeout`` it
    raises :class:`~procgroup.errors.CommTimeoutError` when the op is still running.
    """

    op: str = "op"

    def is_completed(self) -> bool:
        """True once the op finished, successfully or not; never blocks."""
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done; re-raise the op's error. Returns True like torch's Work."""
        raise NotImplementedError

    def exception(self) -> BaseException | None:
        """The op's error once it completed, else None."""
        return None

    def result(self) -> Any:
        """The op's value after :meth:`wait` (irecv: the sender's rank)."""
        return None

    def is_success(self) -> bool:
        return self.is_completed() and self.exception() is None

    def source_rank(self) -> int:
        """For irecv: the rank the message came from."""
        self.wait()
        return int(self.result())


class CompletedWork(Work):
    """A Work that is already done (world size 1, empty arrays, ...)."""

    def __init__(self, op: str, value: Any = None) -> None:
        self.op = op
        self._value = value

    def is_completed(self) -> bool:
        return True

    def wait(self, timeout: float | None = None) -> bool:
        return True

    def result(self) -> Any:
        return self._value


class FutureWork(Work):
    """A Work backed by a ``concurrent.futures.Future`` (thread-run ops)."""

    def __init__(self, op: str, future: concurrent.futures.Future[Any]) -> None:
        self.op = op
        self._future = future

    def is_completed(self) -> bool:
        return self._future.done()

    def wait(self, timeout: float | None = None) -> bool:
        # not future.result(timeout): on 3.11+ its TimeoutError would also catch the op's
        # own CommTimeoutError (a TimeoutError subclass) and hide its message
        done, _ = concurrent.futures.wait([self._future], timeout=timeout)
        if not done:
            raise CommTimeoutError(f"{self.op} not finished after Work.wait(timeout={timeout})", op=self.op)
        if self._future.cancelled():
            raise ChannelClosedError(f"{self.op} was cancelled: the group was destroyed before it ran")
        self._future.result()
        return True

    def exception(self) -> BaseException | None:
        if not self._future.done():
            return None
        if self._future.cancelled():
            return ChannelClosedError(f"{self.op} was cancelled: the group was destroyed before it ran")
        return self._future.exception()

    def result(self) -> Any:
        if not self._future.done() or self._future.cancelled():
            return None
        return self._future.result()


class OrderedExecutor:
    """One worker thread per channel, so async ops run in the order they were issued.

    Every rank issues collectives in the same order; running them one at a time in that
    order keeps the ranks matched whatever the transport.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=self._name)
            self._pending += 1
        fut = self._pool.submit(fn)
        fut.add_done_callback(self._done)
        return fut

    def _done(self, _: Any) -> None:
        with self._lock:
            self._pending -= 1

    @property
    def busy(self) -> bool:
        return self._pending > 0

    def shutdown(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


class DataChannel(abc.ABC):
    """One communicator over one transport. Subclass it to write a backend.

    Required: :meth:`send`, :meth:`recv`, :meth:`close`. Optional overrides: any
    collective, :meth:`isend`/:meth:`irecv` (default: run the blocking call on a helper
    thread), :meth:`submit` (native non-blocking collectives) and :meth:`new_group`.
    """

    #: The backend's name, set by the registry from the plugin's spec.
    backend_name: str = ""
    #: Devices this instance takes directly, when it knows better than its BackendSpec
    #: (e.g. a CUDA-aware MPI adds "cuda"); None means the spec's ``devices``.
    devices: tuple[str, ...] | None = None
    #: True when the transport itself keeps blocking collectives after earlier async ones
    #: (MPI does): ``run`` is then the op itself, and the API may call the op directly.
    native_order: bool = False

    @classmethod
    def discover_world(cls) -> tuple[int, int] | None:
        """(rank, size) when the backend finds its peers itself (mpi under mpiexec).

        Called only when init_process_group got no init_method; None means "use the
        init method" (env:// by default).
        """
        return None

    @classmethod
    def discover_store(cls, rank: int, size: int, timeout: float) -> "Store":
        """After :meth:`discover_world`: a Store every rank shares (collective).

        It lets groups on other backends (``new_group(backend="tcp")``) meet. The default
        is a process-local HashStore, enough for a world of one.
        """
        from .rendezvous import HashStore

        return HashStore()

    def __init__(self, ctx: ChannelContext) -> None:
        self.ctx = ctx
        self.rank = ctx.rank
        self.size = ctx.size
        self.timeout = ctx.timeout
        self._collective_seq = itertools.count()
        self._p2p_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._executor = OrderedExecutor(f"procgroup-{self.backend_name or 'channel'}-g{ctx.group_id}")
        self._closed = False

    # ----------------------------------------------------------- required: point to point
    @abc.abstractmethod
    def send(self, array: Any, dst: int, tag: int = 0) -> None:
        """Send ``array`` to channel rank ``dst``; returns when the buffer may be reused."""

    @abc.abstractmethod
    def recv(self, array: Any, src: int | None = None, tag: int = 0) -> int:
        """Receive into ``array`` from ``src`` (any rank when None); return the sender."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release sockets/communicators; pending calls must fail, not hang. Idempotent."""

    # ------------------------------------------------------------ optional: async p2p
    def isend(self, array: Any, dst: int, tag: int = 0) -> Work:
        """Non-blocking send; the default runs :meth:`send` on a helper thread."""
        return FutureWork("isend", self._p2p_executor().submit(self.send, array, dst, tag))

    def irecv(self, array: Any, src: int | None = None, tag: int = 0) -> Work:
        """Non-blocking recv; ``Work.result()`` is the sender's rank."""
        return FutureWork("irecv", self._p2p_executor().submit(self.recv, array, src, tag))

    def _p2p_executor(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._p2p_pool is None:
            self._p2p_pool = concurrent.futures.ThreadPoolExecutor(
                max(4, 2 * self.size), thread_name_prefix="procgroup-p2p"
            )
        return self._p2p_pool

    # ------------------------------------------------------------- collectives
    def next_collective_tag(self) -> int:
        """A tag no user message and no other collective of any group can carry."""
        seq = next(self._collective_seq) % _GROUP_TAG_STRIDE
        return COLLECTIVE_TAG_BASE + self.ctx.group_id * _GROUP_TAG_STRIDE + seq

    def broadcast(self, array: Any, src: int) -> None:
        from .algorithms import tree

        tree.broadcast(self, array, src, self.next_collective_tag())

    def all_reduce(self, array: Any, op: ReduceOp) -> None:
        from .algorithms import ring

        ring.all_reduce(self, array, op, self.next_collective_tag())

    def reduce(self, array: Any, dst: int, op: ReduceOp) -> None:
        from .algorithms import tree

        tree.reduce(self, array, dst, op, self.next_collective_tag())

    def all_gather(self, output_list: Sequence[Any], array: Any) -> None:
        from .algorithms import ring

        ring.all_gather(self, output_list, array, self.next_collective_tag())

    def gather(self, array: Any, gather_list: Sequence[Any] | None, dst: int) -> None:
        from .algorithms import direct

        direct.gather(self, array, gather_list, dst, self.next_collective_tag())

    def scatter(self, array: Any, scatter_list: Sequence[Any] | None, src: int) -> None:
        from .algorithms import direct

        direct.scatter(self, array, scatter_list, src, self.next_collective_tag())

    def reduce_scatter(self, output: Any, input_list: Sequence[Any], op: ReduceOp) -> None:
        from .algorithms import ring

        ring.reduce_scatter(self, output, input_list, op, self.next_collective_tag())

    def all_to_all(self, output_list: Sequence[Any], input_list: Sequence[Any]) -> None:
        from .algorithms import direct

        direct.all_to_all(self, output_list, input_list, self.next_collective_tag())

    def barrier(self) -> None:
        from .algorithms import direct

        direct.barrier(self, self.next_collective_tag())

    # ------------------------------------------------------------- async collectives
    def submit(self, op: str, *args: Any) -> Work:
        """Start collective ``op`` without blocking; default: the channel's ordered thread.

        Backends with native non-blocking collectives (MPI's Iallreduce, NCCL streams)
        override this for the ops they have and call ``super().submit`` for the rest.
        """
        return FutureWork(op, self._executor.submit(lambda: getattr(self, op)(*args)))

    def run(self, op: str, *args: Any) -> None:
        """Run collective ``op`` now, after any async ones still queued (keeps the order)."""
        if self._executor.busy:
            self.submit(op, *args).wait()
        else:
            getattr(self, op)(*args)

    # ------------------------------------------------------------- groups
    def new_group(self, ranks: Sequence[int], ctx: ChannelContext) -> "DataChannel":
        """A channel over ``ranks`` (this channel's ranks), called by those members only.

        The default reuses this channel's transport with translated ranks and a tag space
        of its own; a backend with native communicators (MPI, NCCL, gloo) overrides it.
        """
        from .groups import SubChannel

        return SubChannel(self, ranks, ctx)

    def shutdown_threads(self) -> None:
        """Stop the helper threads the base class started; call from close()."""
        self._executor.shutdown()
        if self._p2p_pool is not None:
            self._p2p_pool.shutdown(wait=False, cancel_futures=True)
            self._p2p_pool = None

    def check_open(self) -> None:
        if self._closed:
            raise ChannelClosedError(f"the {self.backend_name or 'procgroup'} channel is closed")


def overridden_ops(cls: type[DataChannel]) -> set[str]:
    """The ops ``cls`` implements itself rather than inheriting the generic default."""
    return {op for op in ALL_OPS if getattr(cls, op, None) is not getattr(DataChannel, op, None)}


__all__ = [
    "ALL_OPS",
    "COLLECTIVES",
    "COLLECTIVE_TAG_BASE",
    "ChannelContext",
    "CompletedWork",
    "DataChannel",
    "FutureWork",
    "MAX_USER_TAG",
    "OrderedExecutor",
    "POINT_TO_POINT",
    "Work",
    "overridden_ops",
]
