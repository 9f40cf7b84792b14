"""The communicators of a channel: how they are made, and how tags are routed onto them.

The world channel duplicates ``COMM_WORLD``; a group's is ``Comm_create_group`` over
its members. Each channel owns:

- ``comm``: native collectives and user tags ``0..mask`` (``mask`` is the largest
  ``2**k - 1 <= MPI_TAG_UB``; MPICH: 2**29 - 1, Open MPI: 2**31 - 1);
- extra duplicates for the user tags above ``mask`` (tag ``t`` -> communicator
  ``t >> k``, tag ``t & mask``) so that all of ``[0, 2**31)`` is distinct; at most
  :data:`MAX_TAG_COMMS` of them, beyond that (an MPI with a tiny TAG_UB) tags fold;
- ``coll``: point-to-point traffic in procgroup's collective tag space (tags
  ``>= 2**40`` from the default algorithms) as tag ``(t - 2**40) & mask``; the
  sequence numbers only wrap after ``mask + 1`` collectives, long after they matched.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from mpi4py import MPI
from procgroup.backend import COLLECTIVE_TAG_BASE, MAX_USER_TAG, ChannelContext
from procgroup.errors import CommTimeoutError, InvalidArgumentError

from ._requests import translate, wait_all

log = logging.getLogger(__name__)

#: At most this many communicators carry user tags (see the module docstring).
MAX_TAG_COMMS = 8


def tag_ub() -> int:
    """MPI_TAG_UB, an attribute of COMM_WORLD (at least 32767 by the standard)."""
    value = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
    return int(value) if isinstance(value, int) else 32767


def members_arrived(ctx: ChannelContext) -> None:
    """Return once every member reached the group's creation, else time out naming who did not.

    ``MPI_Comm_create_group`` blocks until all members call it and has no timeout; a
    member that never comes would hang the others. The members count their arrivals in
    the group's Store, and one ``compare_set`` settles the outcome for all: "go" once the
    count is complete, "abort" when a member's deadline passed first. A member arriving
    after an abort raises too, so no member enters the MPI call alone.
    """
    store = ctx.store
    store.set(f"mpi/arrived/{ctx.rank}", b"1")
    count = store.add("mpi/arrivals", 1)
    deadline = time.monotonic() + ctx.timeout
    nap = 0.001
    while count < ctx.size and time.monotonic() < deadline:
        time.sleep(min(nap, max(deadline - time.monotonic(), 0.0)))
        nap = min(nap * 2, 0.05)
        count = store.add("mpi/arrivals", 0)
    verdict = store.compare_set("mpi/verdict", "", "go" if count >= ctx.size else "abort")
    if verdict != b"go":
        missing = [ctx.global_rank(r) for r in range(ctx.size) if not store.check([f"mpi/arrived/{r}"])]
        who = f"rank(s) {missing} did not" if missing else "a member arrived after another had given up and did not"
        raise CommTimeoutError(
            f"new_group: {who} create the group within {ctx.timeout:g}s", op="new_group", ranks=missing,
        )


def create_group(parent: Any, members: list[int], ctx: ChannelContext, tag: int) -> Any:
    """``Comm_create_group`` of ``parent`` over ``members``, once all of them arrived."""
    members_arrived(ctx)
    group = parent.Get_group().Incl(members)
    try:
        return parent.Create_group(group, tag=tag)
    except MPI.Exception as exc:
        raise translate(exc, "new_group") from None
    finally:
        group.Free()


def world_comm(ctx: ChannelContext) -> Any:
    """Duplicate COMM_WORLD, or make a communicator over ``ctx.global_ranks``.

    The rank and size the init method found must be MPI's: a mismatch (e.g. ranks
    started without mpiexec, each of them a world of 1) is an error, not a hang.
    """
    world = MPI.COMM_WORLD
    wrank, wsize = world.Get_rank(), world.Get_size()
    if ctx.size == wsize and ctx.rank == wrank:
        comm, req = world.Idup()
        wait_all([req], ctx.timeout, "MPI_Comm_idup of COMM_WORLD", "init_process_group")
        return comm
    members = list(ctx.global_ranks)
    if (ctx.group_id != 0 and len(members) == ctx.size and all(0 <= r < wsize for r in members)
            and members[ctx.rank] == wrank):
        return create_group(world, members, ctx, ctx.group_id % (tag_ub() + 1))
    raise InvalidArgumentError(
        f"the mpi backend was given rank {ctx.rank} of a world of {ctx.size}, but MPI says this process "
        f"is rank {wrank} of {wsize}; start the job with 'mpiexec -n {ctx.size} python ...' and call "
        f"init_process_group('mpi') (no init_method needed)"
    )


class TagRoutes:
    """The communicators of one channel, and which one (with which MPI tag) carries a tag."""

    def __init__(self, comm: Any, ctx: ChannelContext) -> None:
        self.comm = comm
        ub = tag_ub()
        self.bits = (ub + 1).bit_length() - 1
        self.mask = (1 << self.bits) - 1
        n_tag_comms = min(MAX_TAG_COMMS, -(-MAX_USER_TAG // (self.mask + 1)))
        dups = [comm.Idup() for _ in range(n_tag_comms)]  # extra user tag spaces + coll
        wait_all([r for _, r in dups], ctx.timeout, f"communicator setup (rank {ctx.rank})", "init_process_group")
        self.tag_comms = [comm] + [c for c, _ in dups[:-1]]
        self.coll = dups[-1][0]
        self.n_tag_comms = len(self.tag_comms)

    def route(self, tag: int) -> tuple[Any, int]:
        """(communicator, MPI tag) for a procgroup tag; see the module docstring."""
        if tag <= self.mask:
            return self.comm, tag
        if tag >= COLLECTIVE_TAG_BASE:
            return self.coll, (tag - COLLECTIVE_TAG_BASE) & self.mask
        return self.tag_comms[(tag >> self.bits) % self.n_tag_comms], tag & self.mask

    def free(self) -> None:
        """Free every communicator (pending requests stay with MPI)."""
        for comm in [*self.tag_comms, self.coll]:
            try:
                comm.Free()
            except MPI.Exception:
                log.debug("freeing a communicator failed", exc_info=True)


__all__ = ["MAX_TAG_COMMS", "TagRoutes", "create_group", "members_arrived", "tag_ub", "world_comm"]
