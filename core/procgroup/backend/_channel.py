"""DataChannel: the base every backend is built on, with one contract for an op;
SubChannel: a group riding on its parent's transport (new_group's default).

A backend implements each op once, in one of two forms:

- ``do_<op>(...)`` runs the op to completion on the caller's thread (sockets, shared
  memory, pygloo). ``async_op=True`` runs it on the channel's ordered thread.
- ``start_<op>(...) -> Work`` starts the op without blocking (MPI's nonblocking calls,
  NCCL streams). A blocking call is ``start_<op>(...).wait()``.

The most derived class that defines either form decides; a class may define both when
its blocking form is cheaper than start + wait (it is then used for blocking calls
only). Required: ``send`` and ``recv`` (any-source when ``src`` is None) in either
form. Every collective has a ``do_`` default here, built on point-to-point by
:mod:`procgroup.algorithms` on a private tag space, so a send/recv-only backend is
complete. ``do_close`` releases the transport; :meth:`close` calls it once.

Callers (the core, the algorithms) never call ``do_``/``start_`` themselves: they use
:meth:`send`/:meth:`recv`/:meth:`isend`/:meth:`irecv`, :meth:`run` (blocking) and
:meth:`start` (a Work), and :meth:`blocking` for the latency-critical fast path.

Arrays reaching a channel are already validated: NumPy arrays viewing the caller's
memory (C-contiguous, writable where the op writes), or device arrays when the backend
declared the ``cuda`` device. Ranks are the channel's own (0..size-1).
"""

from __future__ import annotations

import abc
import concurrent.futures
import copy
import itertools
import logging
import threading
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Mapping, Sequence

from ..algorithms import direct, ring, tree
from ..errors import ChannelClosedError, UnsupportedOperationError
from ..ops import ReduceOp
from . import _debug, _recorder, _uniform
from ._context import (
    COLLECTIVE_TAG_BASE,
    GROUP_P2P_TAG_BASE,
    GROUP_TAG_STRIDE,
    MAX_USER_TAG,
    OPS,
    POINT_TO_POINT,
    ChannelContext,
)
from ._control import ControlPlane
from ._survival import Decision, Survival
from ._work import FutureWork, MappedWork, OrderedExecutor, Work

if TYPE_CHECKING:
    from ..rendezvous import Store

log = logging.getLogger(__name__)

_P2P = frozenset(POINT_TO_POINT)


def fresh(exc: BaseException) -> BaseException:
    """A new instance of a stored error, so each raise gets its own traceback."""
    clone = copy.copy(exc)
    clone.__cause__ = exc.__cause__
    clone.__traceback__ = None
    return clone


def _forms(cls: type) -> dict[str, tuple[bool, bool]]:
    """op -> (has do_<op>, has start_<op>), from the most derived class defining either."""
    table = {}
    for op in OPS:
        table[op] = (False, False)
        for klass in cls.__mro__:
            do, start = f"do_{op}" in klass.__dict__, f"start_{op}" in klass.__dict__
            if do or start:
                table[op] = (do, start)
                break
    return table


class DataChannel(abc.ABC):  # noqa: B024 - send/recv are required in either of two forms (do_/start_), checked in __init__
    """One communicator over one transport. Subclass it to write a backend."""

    #: The backend's name, set by the registry from the plugin's spec.
    backend_name: str = ""
    #: Devices this instance takes directly, when it knows better than its BackendSpec
    #: (e.g. a CUDA-aware MPI adds "cuda"); None means the spec's ``devices``.
    devices: tuple[str, ...] | None = None
    #: How to start ranks so that discover_world agrees ("{size}" is filled in), for errors.
    launch_hint: str = ""
    #: op -> (do form, start form); computed once per class.
    _forms: dict[str, tuple[bool, bool]] = {}

    #: True when some collective runs on the ordered thread when started (a do_ form only)
    _queues: bool = True
    #: True when the transport itself checks that ranks agree on every op (tcp's frames):
    #: PROCGROUP_DEBUG=DETAIL then adds no fingerprint exchange (procgroup.backend._debug).
    checks_agreement: bool = False
    #: True when ``start_recv``'s Work can be withdrawn with ``Work.cancel()`` until a
    #: message matches it (tcp's matcher, MPI_Cancel). A caller that posts a receive
    #: before it knows whether the message will come (master-worker's copies) asks this.
    cancels_recv: bool = False
    #: The PROCGROUP_DEBUG=DETAIL checker, None when off: run/start/blocking test only this.
    _agreement: _debug.Agreement | None = None
    #: Why this backend cannot shrink, when it cannot although it has a control plane
    #: (docs/plugins.md, "Surviving a death"); "" when it can.
    shrink_unsupported: str = ""
    #: PROCGROUP_UNIFORM_FAILURE: every collective ends with the survivors' agreement
    #: (procgroup.backend._uniform); the core then runs collectives through run_uniform
    uniform_failure: bool = False
    #: with uniform_failure: the number of the next collective on this channel
    uniform_seq: int = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._forms = _forms(cls)
        cls._queues = any(not cls._forms[op][1] for op in OPS if op not in _P2P)

    @classmethod
    def discover_world(cls) -> tuple[int, int] | None:
        """(rank, size) when the backend's own launcher decides them (mpi under mpiexec).

        Asked at every init_process_group: an answer wins over the init method's ranks
        (as in the 2017 module, where MPI ignored init_method for ranks); the init method
        may still provide the Store. A rank, size, URL parameter or RANK/WORLD_SIZE that
        contradicts it is an error quoting :attr:`launch_hint`. None: the init method decides.
        """
        return None

    @classmethod
    def discover_store(cls, rank: int, size: int, timeout: float) -> Store:
        """After :meth:`discover_world`: a Store every rank shares (collective).

        The default is a process-local HashStore, enough for a world of one.
        """
        from ..rendezvous import HashStore

        return HashStore()

    @classmethod
    def check_settings(cls, options: Mapping[str, Any] | None) -> None:
        """Refuse, before the rendezvous, a setting this backend cannot honour (a refusal
        after it would leave the other ranks waiting): PROCGROUP_UNIFORM_FAILURE without
        a control plane."""
        if _uniform.wanted(options) and cls.do_control_send is DataChannel.do_control_send:
            raise _uniform.refusal(cls)

    def __init__(self, ctx: ChannelContext) -> None:
        for op in POINT_TO_POINT:
            if self._forms.get(op, (False, False)) == (False, False):
                raise TypeError(f"{type(self).__name__} must implement do_{op} or start_{op}")
        self.ctx = ctx
        self.rank = ctx.rank
        self.size = ctx.size
        self.timeout = ctx.timeout
        self._collective_seq = itertools.count()
        self._p2p_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._executor = OrderedExecutor(f"procgroup-{self.backend_name or 'channel'}-g{ctx.group_id}")
        self._closed = False
        self._failure: BaseException | None = None
        self._state_lock = threading.Lock()
        #: the control plane: deaths, revoke, the agreement, routing (procgroup.backend._control)
        self.control = ControlPlane(self)
        self._agreement = _debug.for_channel(self)
        if _uniform.wanted(ctx.options):
            if not self.survives:
                raise _uniform.refusal(self)
            self.uniform_failure = True
        #: the flight recorder's view of this channel (procgroup.backend._recorder); every
        #: op a caller starts passes once through blocking() or start(), which record it
        self._flight_info = _recorder.register(self)
        self._run_cache: dict[str, Callable[..., Any]] = {}
        self._start_cache: dict[str, Callable[..., Any]] = {}
        # the caller-facing p2p calls, bound once: they are on every message's path
        self.send = self.blocking("send")  # type: ignore[method-assign]  # bound once per channel
        self.recv = self.blocking("recv")  # type: ignore[method-assign]  # bound once per channel

    # ------------------------------------------------------------ the caller's side
    def send(self, array: Any, dst: int, tag: int = 0) -> None:
        """Send ``array`` to channel rank ``dst``; returns when the buffer may be reused."""
        self.run("send", array, dst, tag)

    def recv(self, array: Any, src: int | None = None, tag: int = 0) -> int:
        """Receive into ``array`` from ``src`` (any rank when None); returns the sender."""
        return int(self.run("recv", array, src, tag))

    def isend(self, array: Any, dst: int, tag: int = 0) -> Work:
        """Start a send; the Work completes when the buffer may be reused."""
        return self.start("send", array, dst, tag)

    def irecv(self, array: Any, src: int | None = None, tag: int = 0) -> Work:
        """Start a receive; ``Work.result()`` is the sender's rank."""
        return self.start("recv", array, src, tag)

    def run(self, op: str, *args: Any) -> Any:
        """Run ``op`` to completion (after the collectives still queued on the thread)."""
        fn = self._run_cache.get(op)
        if fn is None:
            fn = self._run_cache[op] = self.blocking(op)
        return fn(*args)

    def run_uniform(self, op: str, *args: Any) -> None:
        """Run collective ``op`` so that it fails on every survivor or on none
        (``uniform_failure``; procgroup.backend._uniform)."""
        self.control.run_uniform(op, args)

    def start(self, op: str, *args: Any) -> Work:
        """Start ``op`` and return its Work without waiting for it."""
        fn = self._start_cache.get(op)
        if fn is None:
            fn = self._start_cache[op] = _recorder.wrap(self, op, self._starter(op), started=True)
        return fn(*args)

    def _starter(self, op: str) -> Callable[..., Work]:
        """The callable behind :meth:`start` for ``op`` (unrecorded)."""
        agreement = self._agreement if op not in _P2P else None
        has_do, has_start = self._forms[op]

        def start_op(*args: Any) -> Work:
            if agreement is not None:
                agreement.check(op, args)
            if has_start:
                return getattr(self, f"start_{op}")(*args)
            fn = getattr(self, f"do_{op}")
            if op in _P2P:
                return FutureWork(op, self._p2p_executor().submit(fn, *args))
            return FutureWork(op, self._executor.submit(fn, *args))

        return start_op

    def blocking(self, op: str, *, unchecked: bool = False, recorded: bool = True) -> Callable[..., Any]:
        """The fastest callable that runs ``op`` to completion; the core caches it for
        small messages (its cost is the fixed cost of every blocking call, the flight
        recorder's entry included). With PROCGROUP_DEBUG=DETAIL a collective's callable
        checks first (unless ``unchecked``). ``recorded=False``: without the flight
        recorder's entry, for a caller that writes it itself (``_recorder.holds_entry``)."""
        fn = self._blocking(op, unchecked)
        return _recorder.wrap(self, op, fn) if recorded else fn

    def _blocking(self, op: str, unchecked: bool) -> Callable[..., Any]:
        """The callable behind :meth:`blocking` (unrecorded)."""
        if self._agreement is not None and not unchecked and op not in _P2P:
            return self._agreement.checked(op, self._blocking(op, True))
        has_do, has_start = self._forms[op]
        if has_do:
            fn = getattr(self, f"do_{op}")
            if op in _P2P or not self._queues:  # nothing can be queued ahead of it
                return fn
            executor = self._executor
            starter = getattr(self, f"start_{op}") if has_start else None

            def run_in_order(*args: Any) -> Any:
                if executor.busy:  # async collectives still queued: keep the order
                    # what start() does, without its check (blocking's callable checked)
                    work = starter(*args) if starter is not None else FutureWork(op, executor.submit(fn, *args))
                    work.wait()
                    return work.result()
                return fn(*args)

            return run_in_order
        starter = getattr(self, f"start_{op}")

        def start_and_wait(*args: Any) -> Any:
            work = starter(*args)
            work.wait()
            return work.result()

        return start_and_wait

    def implements(self, op: str) -> bool:
        """True when this backend implements ``op`` itself (not the generic default)."""
        return implemented_ops(type(self)).__contains__(op)

    # ------------------------------------------------------------ collectives on p2p
    def next_collective_tag(self) -> int:
        """A tag no user message and no other collective of any group can carry."""
        seq = next(self._collective_seq) % GROUP_TAG_STRIDE
        return COLLECTIVE_TAG_BASE + self.ctx.group_id * GROUP_TAG_STRIDE + seq

    def do_broadcast(self, array: Any, src: int) -> None:
        tree.broadcast(self, array, src, self.next_collective_tag())

    def do_all_reduce(self, array: Any, op: ReduceOp) -> None:
        ring.all_reduce(self, array, op, self.next_collective_tag())

    def do_reduce(self, array: Any, dst: int, op: ReduceOp) -> None:
        tree.reduce(self, array, dst, op, self.next_collective_tag())

    def do_all_gather(self, output_list: Sequence[Any], array: Any) -> None:
        ring.all_gather(self, output_list, array, self.next_collective_tag())

    def do_gather(self, array: Any, gather_list: Sequence[Any] | None, dst: int) -> None:
        direct.gather(self, array, gather_list, dst, self.next_collective_tag())

    def do_scatter(self, array: Any, scatter_list: Sequence[Any] | None, src: int) -> None:
        direct.scatter(self, array, scatter_list, src, self.next_collective_tag())

    def do_reduce_scatter(self, output: Any, input_list: Sequence[Any], op: ReduceOp) -> None:
        ring.reduce_scatter(self, output, input_list, op, self.next_collective_tag())

    def do_all_to_all(self, output_list: Sequence[Any], input_list: Sequence[Any]) -> None:
        direct.all_to_all(self, output_list, input_list, self.next_collective_tag())

    def do_barrier(self) -> None:
        direct.barrier(self, self.next_collective_tag())

    # ------------------------------------------------------------ groups
    def new_group(self, ranks: Sequence[int], ctx: ChannelContext) -> DataChannel:
        """A channel over ``ranks`` (this channel's ranks), called by those members only.

        The default reuses this channel's transport with translated ranks and a tag space
        of its own; a backend with native communicators (MPI, NCCL, gloo) overrides it.
        """
        return SubChannel(self, ranks, ctx)

    # ------------------------------------------------------------ health and teardown
    @property
    def failure(self) -> BaseException | None:
        """The error that broke the channel (a peer died), or None while it is healthy."""
        return self._failure

    @property
    def closed(self) -> bool:
        return self._closed

    def fail(self, exc: BaseException) -> bool:
        """Break the channel: every later call raises a copy of ``exc``. True the first time."""
        with self._state_lock:
            if self._closed or self._failure is not None:
                return False
            self._failure = exc
        log.error("procgroup %s: %s", self.backend_name or "channel", exc)
        return True

    def clear_failure(self) -> None:
        """Forget the recorded failure once the backend has healed itself (nccl builds a new
        communicator after _clear_group_cache); ranks must agree that it has."""
        with self._state_lock:
            self._failure = None

    def check_usable(self) -> None:
        """Raise ChannelClosedError after close(), or the error that broke the channel."""
        if self._closed:
            raise ChannelClosedError(
                f"the {self.backend_name or 'procgroup'} channel is closed (destroy_process_group was called)")
        if self._failure is not None:
            raise fresh(self._failure)

    def close(self) -> None:
        """Release the transport once (``do_close``); pending calls fail, never hang."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
        self.control.close()  # what this rank owes the others goes out first
        self._say_why_leaving()
        try:
            self.do_close()
        finally:
            if self._agreement is not None:
                self._agreement.close()
            self._executor.shutdown()
            if self._p2p_pool is not None:
                self._p2p_pool.shutdown(wait=False, cancel_futures=True)
                self._p2p_pool = None

    def do_close(self) -> None:
        """Release sockets/communicators; pending calls must fail, not hang."""

    def _say_why_leaving(self) -> None:
        """A rank that leaves because something failed tells each live member why
        (ControlPlane.say_why_leaving); the world's channels only, not a sub-group's."""
        if not isinstance(self, SubChannel):
            self.control.say_why_leaving()

    # ------------------------------------------------------------ surviving a death
    # A backend that implements do_control_send, calls control_received for what
    # arrives and peer_died for each death it sees gets revoke, agree and shrink. The
    # mechanism is the channel's ControlPlane (``self.control``, procgroup.backend._control);
    # the methods below are the contract and delegate to it (docs/fault-tolerance.md,
    # docs/plugins.md).
    def do_control_send(self, dst: int, payload: bytes) -> None:
        """Hook: send a small control message to ``dst``; it must still go out after the
        channel failed or was revoked, as long as ``dst`` lives. Best effort."""
        if self.shrink_unsupported:
            raise UnsupportedOperationError(self.shrink_unsupported)
        raise UnsupportedOperationError(
            f"the {self.backend_name or 'this'} backend cannot survive a death: it has no control plane "
            f"(DataChannel.do_control_send; docs/plugins.md)")

    @property
    def survives(self) -> bool:
        """True when this channel has a control plane (revoke, agree and shrink work)."""
        return type(self).do_control_send is not DataChannel.do_control_send

    @property
    def _survival(self) -> Survival | None:
        """The agreement's state if it was started (kept for backends that read it)."""
        return self.control.started

    @property
    def _children(self) -> dict[int, tuple[DataChannel, dict[int, int]]]:
        """The channels this one carries directly, by control id (kept for backends that
        read it; ``release_control`` is the way to stop carrying one)."""
        return self.control.children

    def survival(self) -> Survival:
        """This channel's fault-tolerance state (created on first use)."""
        if not self.survives:
            self.do_control_send(0, b"")  # raises the clear error
        return self.control.survival

    def control_received(self, src: int, payload: bytes) -> None:
        """Called by the backend (any thread) with a control message from ``src``; raises
        PeerError when it is malformed (the backend then closes that connection)."""
        self.control.received(src, payload)

    def peer_died(self, rank: int, exc: BaseException | None = None) -> bool:
        """Called by the backend when it knows channel rank ``rank`` is dead: record it,
        tell the channels carried by this one that hold it, then break the channel with
        ``exc`` (pending calls fail). True the first time this rank is reported."""
        return self.control.died(rank, exc)

    def peer_suspected(self, rank: int) -> None:
        """Called by the backend just before it reports ``rank`` dead because the rank went
        silent (a heartbeat deadline), not because its connection closed: it may be alive
        behind a cut link, so a shrink that drops it needs a quorum (docs/fault-tolerance.md)."""
        self.control.suspect(rank)

    @property
    def control_id(self) -> int:
        """What this channel's control messages carry to reach it: its group id."""
        return self.ctx.group_id

    def carry_control(self, child: DataChannel, index: dict[int, int]) -> None:
        """Route ``child``'s control messages and deaths through this channel (``index``:
        this channel's rank -> the child's); a channel riding on this one calls it. Its
        close stops the routing."""
        self.control.carry(child, index)

    def release_control(self, child: DataChannel) -> None:
        """Stop routing ``child``'s control messages (``close`` does it for every channel)."""
        self.control.release(child)

    def interrupt(self, exc: BaseException) -> bool:
        """Hook: break the channel with ``exc`` and wake every pending call. The base
        breaks it only; a backend whose pending calls would not notice overrides it."""
        return self.fail(exc)

    def fail_peer(self, rank: int, exc: BaseException) -> None:
        """Hook: channel rank ``rank`` died; fail what involves it. The default breaks the
        whole channel (``interrupt``); a backend that can scope a failure as MPI's ULFM
        does (tcp: the dead peer's sends and receives, the collectives of groups holding
        it, unacknowledged any-source receives) overrides it."""
        self.interrupt(exc)

    def failed_ranks(self) -> tuple[int, ...]:
        """The channel ranks known dead (from the control plane, else from the failure)."""
        return self.control.failed_ranks()

    def revoke(self) -> None:
        """Fail every pending and later call of every live member (collective in effect,
        local in call): members hear it over the control plane."""
        self.survival().revoke()

    def agree(self, flag: bool, timeout: float, extra: Callable[[], bytes] | None = None) -> Decision:
        """The same Decision on every live member (AND of ``flag``), surviving deaths."""
        return self.survival().agree(flag, timeout, extra)

    def do_shrink(self, ctx: ChannelContext) -> DataChannel:
        """Hook: a channel of this backend among the survivors that ``ctx`` describes (a
        new Store, new ranks). The default builds a new instance of the class; a backend
        with state to carry over, or none to build, overrides it."""
        if self.shrink_unsupported:
            raise UnsupportedOperationError(self.shrink_unsupported)
        self.survival()  # the control plane is needed to agree first
        return type(self)(ctx)

    def _p2p_executor(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._p2p_pool is None:
            self._p2p_pool = concurrent.futures.ThreadPoolExecutor(
                max(4, 2 * self.size), thread_name_prefix="procgroup-p2p"
            )
        return self._p2p_pool

class SubChannel(DataChannel):
    """Ranks are translated to the parent's. The group's collectives get their own tag
    space from ``ctx.group_id``, and so do its users' tags, so traffic of different
    groups never mixes on shared connections and an any-source receive only hears members.
    """

    def __init__(self, parent: DataChannel, ranks: Sequence[int], ctx: ChannelContext) -> None:
        self.backend_name = parent.backend_name
        self.devices = parent.devices
        self._parent = parent  # before the base's checks, which ask ``survives``
        super().__init__(ctx)
        self._ranks = tuple(ranks)
        self._index = {r: i for i, r in enumerate(self._ranks)}
        self._user_tag_base = GROUP_P2P_TAG_BASE + ctx.group_id * MAX_USER_TAG
        parent.carry_control(self, self._index)  # control messages and deaths reach it

    @property
    def survives(self) -> bool:
        return self._parent.survives

    @property
    def cancels_recv(self) -> bool:  # type: ignore[override]  # the parent's answer, read through
        return self._parent.cancels_recv

    def do_control_send(self, dst: int, payload: bytes) -> None:
        self._parent.do_control_send(self._ranks[dst], payload)

    def do_shrink(self, ctx: ChannelContext) -> DataChannel:
        """A new channel of the transport's own class among the survivors."""
        root: DataChannel = self
        while isinstance(root, SubChannel):
            root = root._parent
        if root.shrink_unsupported:
            raise UnsupportedOperationError(root.shrink_unsupported)
        return type(root)(ctx)

    def do_close(self) -> None:
        """Nothing of its own to release: the transport is the parent's."""

    def _tag(self, tag: int) -> int:
        return tag if tag >= MAX_USER_TAG else self._user_tag_base + tag

    def _src(self, src: int | None) -> int | None:
        return None if src is None else self._ranks[src]

    @property
    def failure(self) -> BaseException | None:
        return self._failure or self._parent.failure

    def do_send(self, array: Any, dst: int, tag: int = 0) -> None:
        if self._failure is not None:
            self.check_usable()
        self._parent.send(array, self._ranks[dst], self._tag(tag))

    def start_send(self, array: Any, dst: int, tag: int = 0) -> Work:
        if self._failure is not None:
            self.check_usable()
        return self._parent.isend(array, self._ranks[dst], self._tag(tag))

    def do_recv(self, array: Any, src: int | None = None, tag: int = 0) -> int:
        if self._failure is not None:
            self.check_usable()
        return self._index[self._parent.recv(array, self._src(src), self._tag(tag))]

    def start_recv(self, array: Any, src: int | None = None, tag: int = 0) -> Work:
        if self._failure is not None:
            self.check_usable()
        return MappedWork(self._parent.irecv(array, self._src(src), self._tag(tag)), self._index.__getitem__)



def implemented_ops(cls: type[DataChannel]) -> set[str]:
    """The public ops ``cls`` implements itself rather than inheriting the generic default."""
    mine = set()
    for op in OPS:
        for klass in cls.__mro__:
            if klass is DataChannel:
                break
            if f"do_{op}" in klass.__dict__ or f"start_{op}" in klass.__dict__:
                mine.add(op)
                break
    for op, started in (("send", "isend"), ("recv", "irecv")):
        if op in mine and cls._forms[op][1]:  # a native nonblocking form, not a thread
            mine.add(started)
    return mine


__all__ = ["DataChannel", "SubChannel", "fresh", "implemented_ops"]
