"""Two-level collectives: inside a host, then between hosts, then inside a host again.

For a channel whose ranks sit on several hosts with several ranks on some of them. The
ranks of one host talk to each other over the channel's point-to-point calls (a backend
with shared memory between same-host ranks makes those cheap); only *leaders* talk
between hosts, each over a view of the channel (:class:`Members`) that the backend's own
flat algorithm runs on (``inter_*`` callables: the backend picks that algorithm by size).

- all_reduce cuts the array into ``slices`` (at most the fewest ranks any host has); on
  every host, local rank k leads slice k: it reduces the host's contributions to it, runs
  the between-host all_reduce of that slice with the k-th ranks of the other hosts, and
  sends the result back to its host. Every leader works at once, so every core and the
  host's link are busy; each slice travels in pieces of ``piece_bytes`` so a leader's
  between-host work on one piece overlaps its host's traffic for the next.
- broadcast and reduce pipeline pieces through one leader per host (the root on its own
  host); all_gather, gather, scatter, reduce_scatter, all_to_all and barrier gather a
  host's part at its leader (its first rank; the root on the root's host), exchange
  between leaders, and hand the results back.

Every element of a reduction is computed once, by one rank, in a fixed order (a host's
contributions in local-rank order, hosts in host order, or the flat algorithm's own
fixed order) and then copied: every rank gets the same bits.

Matching rule: all messages of one collective carry its one tag, and a transport matches
them per (source, tag) in order. So for every ordered pair of ranks, the sender sends in
exactly the order the receiver posts its receives; each function keeps to one such
order (stated where it is not obvious). Every receive that can be posted early is posted
before any rank blocks, and every send that needs nothing is started before any wait:
no rank waits on a rank that waits on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidArgumentError
from ..ops import ReduceOp, finish_average, reduce_into
from .direct import barrier as flat_barrier
from .pipelined import ring_chunk_order
from .ring import chunk_bounds

if TYPE_CHECKING:
    from ..backend import DataChannel, Work

__all__ = [
    "Members",
    "Topology",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "barrier",
    "broadcast",
    "gather",
    "reduce",
    "reduce_scatter",
    "scatter",
    "sliced_ring_all_reduce",
]

#: The between-host step of all_reduce and reduce: (view, array, op, tag) -> None.
InterReduce = Callable[[Any, np.ndarray, ReduceOp, int], None]
#: The between-host step of broadcast and reduce: (view, array, root, tag) -> None,
#: and (view, array, root, op, tag) -> None.
InterRooted = Callable[[Any, np.ndarray, int, int], None]
InterRootedReduce = Callable[[Any, np.ndarray, int, ReduceOp, int], None]


@dataclass(frozen=True)
class Topology:
    """Which channel ranks share a host. ``hosts``: each host's ranks in ascending order,
    hosts ordered by their lowest rank; ``host_of[rank]``: that rank's host index."""

    hosts: tuple[tuple[int, ...], ...]
    host_of: tuple[int, ...]

    @classmethod
    def from_labels(cls, labels: Sequence[str]) -> Topology:
        """The topology of ranks whose host is ``labels[rank]`` (any string naming a host)."""
        index: dict[str, int] = {}
        hosts: list[list[int]] = []
        host_of = []
        for rank, label in enumerate(labels):
            h = index.setdefault(label, len(hosts))
            if h == len(hosts):
                hosts.append([])
            hosts[h].append(rank)
            host_of.append(h)
        return cls(tuple(tuple(h) for h in hosts), tuple(host_of))

    def subset(self, ranks: Sequence[int]) -> Topology:
        """The topology of a group whose rank i is ``ranks[i]`` of this one."""
        return Topology.from_labels([str(self.host_of[r]) for r in ranks])

    @property
    def two_level(self) -> bool:
        """Several hosts, and several ranks on at least one: where two levels pay."""
        return len(self.hosts) > 1 and max(len(h) for h in self.hosts) > 1

    @property
    def min_per_host(self) -> int:
        return min(len(h) for h in self.hosts)

    def shape(self) -> str:
        """``4x2`` for 4 hosts of 2 ranks, ``3x(2,3,1)`` when they differ."""
        counts = [len(h) for h in self.hosts]
        same = all(c == counts[0] for c in counts)
        return f"{len(counts)}x{counts[0]}" if same else f"{len(counts)}x({','.join(map(str, counts))})"

    def leader(self, host: int, root: int | None = None) -> int:
        """A host's leader: the root on the root's host, else the host's first rank."""
        if root is not None and self.host_of[root] == host:
            return root
        return self.hosts[host][0]

    def leaders(self, root: int | None = None) -> list[int]:
        return [self.leader(h, root) for h in range(len(self.hosts))]


class Members:
    """A channel seen through a subset of its ranks (``ranks[i]`` is member i): what the
    flat algorithms need (rank, size, send, recv, isend, irecv) for the between-host step."""

    def __init__(self, ch: DataChannel, ranks: Sequence[int]) -> None:
        self.ch = ch
        self.ranks = tuple(ranks)
        self.rank = self.ranks.index(ch.rank)
        self.size = len(self.ranks)

    def send(self, array: Any, dst: int, tag: int = 0) -> None:
        self.ch.send(array, self.ranks[dst], tag)

    def recv(self, array: Any, src: int | None = None, tag: int = 0) -> int:
        if src is None:
            raise InvalidArgumentError("Members.recv: a between-host step names its source")
        self.ch.recv(array, self.ranks[src], tag)
        return src

    def isend(self, array: Any, dst: int, tag: int = 0) -> Work:
        return self.ch.isend(array, self.ranks[dst], tag)

    def irecv(self, array: Any, src: int | None = None, tag: int = 0) -> Work:
        if src is None:
            raise InvalidArgumentError("Members.irecv: a between-host step names its source")
        return self.ch.irecv(array, self.ranks[src], tag)


def _wait_all(works: Sequence[Work]) -> None:
    for work in works:
        work.wait()


def _pieces(flat: np.ndarray, piece_bytes: int) -> list[np.ndarray]:
    step = max(piece_bytes // max(flat.itemsize, 1), 1)
    return [flat[i : i + step] for i in range(0, flat.size, step)] or [flat]


def _level_op(op: ReduceOp) -> ReduceOp:
    """AVG sums on both levels and divides once, by the whole group's size, at the end."""
    return ReduceOp.SUM if op is ReduceOp.AVG else op


# ---------------------------------------------------------------------------- all_reduce
def all_reduce(
    ch: DataChannel,
    topo: Topology,
    array: np.ndarray,
    op: ReduceOp,
    tag: int,
    slices: int,
    piece_bytes: int,
    inter: InterReduce,
    scratch: Callable[[int], np.ndarray],
) -> None:
    """In place; see the module. ``slices`` (1 to ``topo.min_per_host``): how many local
    ranks lead a slice; ``scratch(nbytes)`` lends a uint8 buffer for what a leader
    receives from its host; ``inter`` runs the between-host all_reduce of one piece.

    Order per ordered pair on a host: the sender's contributions to the receiver's slice
    (piece by piece) come before the results of the sender's own slice, and every rank
    posts its receives in that order."""
    n, me = ch.size, ch.rank
    if n == 1 or array.size == 0:
        return
    slices = max(1, min(slices, topo.min_per_host))
    host = topo.host_of[me]
    local = topo.hosts[host]
    mine = local.index(me)
    flat = array.reshape(-1)
    bounds = chunk_bounds(flat.size, slices)
    parts = [_pieces(flat[bounds[k] : bounds[k + 1]], piece_bytes) for k in range(slices)]
    others = [r for r in local if r != me]
    level_op = _level_op(op)
    works: list[Work] = []
    landed: list[list[tuple[Work, np.ndarray]]] = []  # per piece of my slice, per local peer
    if mine < slices:  # a leader: its host's contributions to its slice land in scratch
        width = bounds[mine + 1] - bounds[mine]
        buf = scratch(len(others) * width * flat.itemsize)
        rows = [buf[j * width * flat.itemsize : (j + 1) * width * flat.itemsize].view(flat.dtype)
                for j in range(len(others))]
        row_parts = [_pieces(row, piece_bytes) for row in rows]
        landed = [[] for _ in parts[mine]]
        for j, src in enumerate(others):
            for p, part in enumerate(row_parts[j]):
                landed[p].append((ch.irecv(part, src, tag), part))
    for k in range(slices):  # my contributions to the other leaders' slices
        if k != mine:
            works.extend(ch.isend(part, local[k], tag) for part in parts[k])
    for k in range(slices):  # the results of the other slices, straight into place
        if k != mine:
            works.extend(ch.irecv(part, local[k], tag) for part in parts[k])
    if mine < slices:
        peers = Members(ch, [topo.hosts[h][mine] for h in range(len(topo.hosts))])
        for p, own in enumerate(parts[mine]):
            for work, part in landed[p]:  # local-rank order: one fixed order per host
                work.wait()
                reduce_into(level_op, own, part)
            inter(peers, own, level_op, tag)
            finish_average(op, own, n)
            works.extend(ch.isend(own, dst, tag) for dst in others)
    _wait_all(works)


#: The between-host ring of :func:`sliced_ring_all_reduce`: (view, array, op, tag, prepare,
#: finished) -> None, i.e. :func:`~procgroup.algorithms.pipelined.pipelined_ring_all_reduce`
#: with the backend's scratch and segment.
InterRing = Callable[[Any, np.ndarray, ReduceOp, int, Callable[[int], None], Callable[[int], None]], None]


def sliced_ring_all_reduce(
    ch: DataChannel,
    topo: Topology,
    array: np.ndarray,
    op: ReduceOp,
    tag: int,
    slices: int,
    ring: InterRing,
    scratch: Callable[[int], np.ndarray],
) -> None:
    """In place, as :func:`all_reduce` with ``slices`` leaders per host, but each leader's
    slice goes round one between-host ring whole (no pieces: one pipeline that fills and
    drains once) and its host's traffic rides on the ring's chunks: a chunk's host
    contributions are reduced into it just before the ring first reads it, and a chunk is
    sent to the host as soon as the ring has its final value. So only the first chunk's
    host stage comes before the ring, and only the last chunk's after it.

    The ring's chunks of slice k are ``chunk_bounds(slice, H)``; leader k is member
    ``host`` of its ring, so every rank of a host knows the order in which leader k needs
    the contributions and hands out results (``ring_chunk_order``). Order per ordered pair
    on a host: the sender's contributions to the receiver's slice (in the receiver's
    ring order) come before the results of the sender's own slice (in its ring order),
    and every rank posts its receives in that order."""
    n, me = ch.size, ch.rank
    if n == 1 or array.size == 0:
        return
    slices = max(1, min(slices, topo.min_per_host))
    nh = len(topo.hosts)
    host = topo.host_of[me]
    local = topo.hosts[host]
    mine = local.index(me)
    flat = array.reshape(-1)
    bounds = chunk_bounds(flat.size, slices)
    slice_of = [flat[bounds[k] : bounds[k + 1]] for k in range(slices)]
    first, final = ring_chunk_order(nh, host)  # the same for every leader of this host

    def chunks(view: np.ndarray) -> list[np.ndarray]:
        cb = chunk_bounds(view.size, nh)
        return [view[cb[i] : cb[i + 1]] for i in range(nh)]

    parts = [chunks(v) for v in slice_of]
    others = [r for r in local if r != me]
    level_op = _level_op(op)
    works: list[Work] = []
    landed: list[list[Work]] = []  # per chunk of my slice: one receive per local peer
    rows: list[list[np.ndarray]] = []  # per local peer: its contribution, chunk by chunk
    if mine < slices:
        width = slice_of[mine].size * flat.itemsize
        buf = scratch(len(others) * width)
        rows = [chunks(buf[j * width : (j + 1) * width].view(flat.dtype)) for j in range(len(others))]
        landed = [[] for _ in range(nh)]
        for j, src in enumerate(others):
            for i in first:
                landed[i].append(ch.irecv(rows[j][i], src, tag))
    for k in range(slices):  # my contributions to the other leaders' slices, in their order
        if k != mine:
            works.extend(ch.isend(parts[k][i], local[k], tag) for i in first)
    for k in range(slices):  # the results of the other slices, straight into place
        if k != mine:
            works.extend(ch.irecv(parts[k][i], local[k], tag) for i in final)
    if mine < slices:
        own = parts[mine]

        def prepare(i: int) -> None:
            for j, work in enumerate(landed[i]):  # one fixed order per host
                work.wait()
                reduce_into(level_op, own[i], rows[j][i])

        def hand_out(i: int) -> None:
            works.extend(ch.isend(own[i], dst, tag) for dst in others)

        peers = Members(ch, [topo.hosts[h][mine] for h in range(nh)])
        if op is ReduceOp.AVG:  # divided once, by the whole group, after the ring's last send
            ring(peers, slice_of[mine], level_op, tag, prepare, lambda i: None)
            finish_average(op, slice_of[mine], n)
            for i in final:
                hand_out(i)
        else:
            ring(peers, slice_of[mine], level_op, tag, prepare, hand_out)
    _wait_all(works)


# ---------------------------------------------------------------------------- broadcast, reduce
def broadcast(
    ch: DataChannel, topo: Topology, array: np.ndarray, src: int, tag: int, piece_bytes: int, inter: InterRooted
) -> None:
    """``src``'s array to every rank, piece by piece: between the leaders (``inter``), then
    from each leader to its host, while the next piece crosses between hosts."""
    me = ch.rank
    if ch.size == 1 or array.size == 0:
        return
    host = topo.host_of[me]
    lead = topo.leader(host, src)
    parts = _pieces(array.reshape(-1), piece_bytes)
    if me != lead:
        _wait_all([ch.irecv(part, lead, tag) for part in parts])
        return
    peers = Members(ch, topo.leaders(src))
    root = topo.host_of[src]
    others = [r for r in topo.hosts[host] if r != me]
    works: list[Work] = []
    for part in parts:
        inter(peers, part, root, tag)
        works.extend(ch.isend(part, dst, tag) for dst in others)
    _wait_all(works)


def reduce(
    ch: DataChannel,
    topo: Topology,
    array: np.ndarray,
    dst: int,
    op: ReduceOp,
    tag: int,
    piece_bytes: int,
    inter: InterRootedReduce,
    scratch: Callable[[int], np.ndarray],
) -> None:
    """The reduction of every rank's array into ``dst``'s; the others' arrays stay as they
    were. A leader reduces its host's pieces (local-rank order) into a copy of its own,
    then the leaders reduce toward ``dst`` (``inter``), piece by piece."""
    n, me = ch.size, ch.rank
    if n == 1 or array.size == 0:
        return
    host = topo.host_of[me]
    lead = topo.leader(host, dst)
    flat = array.reshape(-1)
    parts = _pieces(flat, piece_bytes)
    if me != lead:
        _wait_all([ch.isend(part, lead, tag) for part in parts])
        return
    others = [r for r in topo.hosts[host] if r != me]
    nbytes = flat.nbytes
    buf = scratch((len(others) + 1) * nbytes)
    acc = buf[:nbytes].view(flat.dtype)
    acc[...] = flat
    acc_parts = _pieces(acc, piece_bytes)
    incoming = []
    for j, src in enumerate(others):
        row = buf[(j + 1) * nbytes : (j + 2) * nbytes].view(flat.dtype)
        incoming.append([(ch.irecv(part, src, tag), part) for part in _pieces(row, piece_bytes)])
    peers = Members(ch, topo.leaders(dst))
    root = topo.host_of[dst]
    level_op = _level_op(op)
    for p, part in enumerate(acc_parts):
        for row_works in incoming:
            work, got = row_works[p]
            work.wait()
            reduce_into(level_op, part, got)
        inter(peers, part, root, level_op, tag)
        if me == dst:
            finish_average(op, part, n)
            parts[p][...] = part


# ---------------------------------------------------------------------------- barrier
def barrier(ch: DataChannel, topo: Topology, tag: int) -> None:
    """Each host's ranks check in with their leader, the leaders run a dissemination
    barrier, then each leader lets its host go: nobody leaves before everyone came."""
    me = ch.rank
    host = topo.host_of[me]
    lead = topo.leader(host)
    token = np.zeros(1, dtype=np.uint8)
    if me != lead:
        ch.send(token, lead, tag)
        ch.recv(token, lead, tag)
        return
    others = [r for r in topo.hosts[host] if r != me]
    slots = np.zeros(max(len(others), 1), dtype=np.uint8)
    _wait_all([ch.irecv(slots[j : j + 1], src, tag) for j, src in enumerate(others)])
    flat_barrier(Members(ch, topo.leaders()), tag)  # type: ignore[arg-type]  # a channel's p2p subset
    _wait_all([ch.isend(token, dst, tag) for dst in others])


# ---------------------------------------------------------------------------- gathers
def all_gather(ch: DataChannel, topo: Topology, output_list: Sequence[np.ndarray], array: np.ndarray,
               tag: int) -> None:
    """output_list[i] = rank i's array. A host's arrays gather at its leader; the leaders
    pass hosts' blocks around a ring; each leader hands every block to its host as it
    arrives. Leader -> rank order: its own host's arrays, then the hosts in ring-arrival
    order (host h, h-1, h-2, ...), each host's ranks ascending, skipping the receiver."""
    me = ch.rank
    outs = [o.reshape(-1) for o in output_list]
    if outs[me].size and outs[me].ctypes.data != array.ctypes.data:
        outs[me][...] = array.reshape(-1)
    host = topo.host_of[me]
    nh = len(topo.hosts)
    lead = topo.leader(host)
    arrival = [(host - s) % nh for s in range(nh)]
    if me != lead:
        works = [ch.isend(outs[me], lead, tag)]
        works.extend(ch.irecv(outs[r], lead, tag) for h in arrival for r in topo.hosts[h] if r != me)
        _wait_all(works)
        return
    others = [r for r in topo.hosts[host] if r != me]
    _wait_all([ch.irecv(outs[r], r, tag) for r in others])
    leaders = topo.leaders()
    right, left = leaders[(host + 1) % nh], leaders[(host - 1) % nh]
    down: list[Work] = []

    def hand_down(h: int) -> None:
        down.extend(ch.isend(outs[r], dst, tag) for r in topo.hosts[h] for dst in others if dst != r)

    hand_down(host)
    for s in range(nh - 1):
        send_h, recv_h = arrival[s], arrival[s + 1]
        recvs = [ch.irecv(outs[r], left, tag) for r in topo.hosts[recv_h]]
        sends = [ch.isend(outs[r], right, tag) for r in topo.hosts[send_h]]
        _wait_all(recvs)
        hand_down(recv_h)
        _wait_all(sends)
    _wait_all(down)


def gather(ch: DataChannel, topo: Topology, array: np.ndarray, gather_list: Sequence[np.ndarray] | None,
           dst: int, tag: int) -> None:
    """The root receives every rank's array; a host's arrays reach it through the host's
    leader, in rank order."""
    me = ch.rank
    host = topo.host_of[me]
    lead = topo.leader(host, dst)
    if me != lead:
        ch.send(array, lead, tag)
        return
    others = [r for r in topo.hosts[host] if r != me]
    if me == dst:
        if gather_list is None:
            raise InvalidArgumentError(f"gather: rank {dst} is the root and needs a gather_list")
        works = [ch.irecv(gather_list[r], r, tag) for r in others]
        for h in range(len(topo.hosts)):
            if h != host:
                works.extend(ch.irecv(gather_list[r], topo.leader(h, dst), tag) for r in topo.hosts[h])
        if gather_list[me].size and gather_list[me].ctypes.data != array.ctypes.data:
            gather_list[me].reshape(-1)[...] = array.reshape(-1)
        _wait_all(works)
        return
    temps = {r: np.empty_like(array) for r in others}
    recvs = {r: ch.irecv(temps[r], r, tag) for r in others}
    sends: list[Work] = []
    for r in topo.hosts[host]:
        if r == me:
            sends.append(ch.isend(array, dst, tag))
        else:
            recvs[r].wait()
            sends.append(ch.isend(temps[r], dst, tag))
    _wait_all(sends)


def scatter(ch: DataChannel, topo: Topology, array: np.ndarray, scatter_list: Sequence[np.ndarray] | None,
            src: int, tag: int) -> None:
    """The root sends scatter_list[r] to every rank r; a host's arrays go through the
    host's leader, in rank order."""
    me = ch.rank
    host = topo.host_of[me]
    lead = topo.leader(host, src)
    if me == src:
        if scatter_list is None:
            raise InvalidArgumentError(f"scatter: rank {src} is the root and needs a scatter_list")
        works = [ch.isend(scatter_list[r], r, tag) for r in topo.hosts[host] if r != me]
        for h in range(len(topo.hosts)):
            if h != host:
                works.extend(ch.isend(scatter_list[r], topo.leader(h, src), tag) for r in topo.hosts[h])
        if array.size and scatter_list[me].ctypes.data != array.ctypes.data:
            array.reshape(-1)[...] = scatter_list[me].reshape(-1)
        _wait_all(works)
        return
    if me != lead:
        ch.recv(array, lead, tag)
        return
    others = [r for r in topo.hosts[host] if r != me]
    temps = {r: np.empty_like(array) for r in others}
    recvs = [(r, ch.irecv(array if r == me else temps[r], src, tag)) for r in topo.hosts[host]]
    sends: list[Work] = []
    for r, work in recvs:
        work.wait()
        if r != me:
            sends.append(ch.isend(temps[r], r, tag))
    _wait_all(sends)


# ---------------------------------------------------------------------------- reduce_scatter
def reduce_scatter(ch: DataChannel, topo: Topology, output: np.ndarray, input_list: Sequence[np.ndarray],
                   op: ReduceOp, tag: int) -> None:
    """output = op over ranks of input_list[rank]; the inputs stay as they were.

    A host's inputs are reduced at its leader (local-rank order); each leader sends every
    other leader that host's ranks' blocks and reduces the blocks of its own ranks in host
    order, then hands each its result. Leader -> leader order: the receiving host's ranks
    ascending."""
    n, me = ch.size, ch.rank
    out = output.reshape(-1)
    ins = [a.reshape(-1) for a in input_list]
    host = topo.host_of[me]
    lead = topo.leader(host)
    if me != lead:
        works = [ch.isend(block, lead, tag) for block in ins]
        works.append(ch.irecv(out, lead, tag))
        _wait_all(works)
        return
    others = [r for r in topo.hosts[host] if r != me]
    level_op = _level_op(op)
    m = out.size
    acc = np.empty(n * m, dtype=out.dtype)
    blocks = [acc[i * m : (i + 1) * m] for i in range(n)]
    for i in range(n):
        blocks[i][...] = ins[i]
    temp = np.empty(n * m, dtype=out.dtype)
    temp_blocks = [temp[i * m : (i + 1) * m] for i in range(n)]
    for src in others:  # local-rank order
        _wait_all([ch.irecv(temp_blocks[i], src, tag) for i in range(n)])
        for i in range(n):
            reduce_into(level_op, blocks[i], temp_blocks[i])
    nh = len(topo.hosts)
    leaders = topo.leaders()
    mine = topo.hosts[host]
    partial = {h: np.empty(len(mine) * m, dtype=out.dtype) for h in range(nh) if h != host}
    recvs: list[Work] = []
    for h, buf in partial.items():
        recvs.extend(ch.irecv(buf[j * m : (j + 1) * m], leaders[h], tag) for j in range(len(mine)))
    sends: list[Work] = []
    for h in range(nh):
        if h != host:
            sends.extend(ch.isend(blocks[r], leaders[h], tag) for r in topo.hosts[h])
    _wait_all(recvs)
    final = np.empty(len(mine) * m, dtype=out.dtype)
    down: list[Work] = []
    for j, r in enumerate(mine):  # hosts in host order: one fixed order for every block
        res = final[j * m : (j + 1) * m]
        res[...] = partial[0][j * m : (j + 1) * m] if host != 0 else blocks[r]
        for h in range(1, nh):
            reduce_into(level_op, res, partial[h][j * m : (j + 1) * m] if h != host else blocks[r])
        finish_average(op, res, n)
        if r == me:
            out[...] = res
        else:
            down.append(ch.isend(res, r, tag))
    _wait_all(sends)
    _wait_all(down)


# ---------------------------------------------------------------------------- all_to_all
def all_to_all(ch: DataChannel, topo: Topology, output_list: Sequence[np.ndarray],
               input_list: Sequence[np.ndarray], tag: int) -> None:
    """output_list[s] = rank s's input_list[me]. Blocks within a host go directly; a block
    for another host goes through the sender's leader and the receiver's leader, so the
    hosts exchange one stream per pair of hosts.

    Orders: rank -> its leader: the block for the leader, then the blocks for other hosts'
    ranks ascending; leader -> rank: the leader's block, then other hosts' blocks for it by
    source rank; leader -> leader: (source on its host, destination on the other)
    ascending, source first."""
    me = ch.rank
    outs = [o.reshape(-1) for o in output_list]
    ins = [a.reshape(-1) for a in input_list]
    if outs[me].size and outs[me].ctypes.data != ins[me].ctypes.data:
        outs[me][...] = ins[me]
    host = topo.host_of[me]
    lead = topo.leader(host)
    local = topo.hosts[host]
    remote = [r for h, ranks in enumerate(topo.hosts) if h != host for r in ranks]
    works: list[Work] = []
    if me != lead:
        for r in local:  # the direct blocks, the leader's first
            if r != me:
                works.append(ch.irecv(outs[r], r, tag))
        works.extend(ch.irecv(outs[s], lead, tag) for s in remote)
        for r in local:
            if r != me:
                works.append(ch.isend(ins[r], r, tag))
        works.extend(ch.isend(ins[d], lead, tag) for d in remote)
        _wait_all(works)
        return
    others = [r for r in local if r != me]
    ups: dict[tuple[int, int], tuple[Work, np.ndarray]] = {}
    for r in others:
        works.append(ch.irecv(outs[r], r, tag))
        for d in remote:
            buf = np.empty_like(ins[d])
            ups[(r, d)] = (ch.irecv(buf, r, tag), buf)
    crossing: dict[tuple[int, int], tuple[Work, np.ndarray]] = {}
    for h, ranks in enumerate(topo.hosts):
        if h == host:
            continue
        for s in ranks:
            for d in local:
                buf = outs[s] if d == me else np.empty_like(ins[me])
                crossing[(s, d)] = (ch.irecv(buf, topo.leader(h), tag), buf)
    works.extend(ch.isend(ins[r], r, tag) for r in others)
    for h, ranks in enumerate(topo.hosts):
        if h == host:
            continue
        for s in local:
            for d in ranks:
                if s == me:
                    works.append(ch.isend(ins[d], topo.leader(h), tag))
                else:
                    work, buf = ups[(s, d)]
                    work.wait()
                    works.append(ch.isend(buf, topo.leader(h), tag))
    for s in remote:
        for d in local:
            work, buf = crossing[(s, d)]
            work.wait()
            if d != me:
                works.append(ch.isend(buf, d, tag))
    _wait_all(works)
