"""The tcp backend's shared-memory point-to-point (procgroup_tcp._p2p), with real ranks.

Ranks on one host exchange messages through rings in /dev/shm: small ones inside the
ring, large ones by a rendezvous copy out of the sender's memory (process_vm_readv) or,
with PROCGROUP_TCP_SHM_CMA=0 (a kernel that forbids it), streamed through the ring.
These tests check each path's data, the matcher's rules across shm and socket peers,
dead and departed peers, mismatches, and that nothing is left in /dev/shm.
"""

from __future__ import annotations

import glob
import os
import tempfile
import threading
import time
from typing import Any

import numpy as np
import pytest

from procgroup.testing import spawn

EAGER = 128 * 1024  # procgroup_tcp._p2p.EAGER_BYTES (read in the ranks, checked there)
SIZES = [0, 1, 8, EAGER - 1, EAGER, EAGER + 1, 1 << 20, 64 << 20]


def _links() -> dict[int, bool]:
    """This rank's shared-memory peers (world ranks) -> whether large messages use the rendezvous copy."""
    import procgroup as pg

    ch: Any = pg.group_channel(pg.group.WORLD)
    return {ch.ctx.global_rank(r): link.cma for r, link in ch._shm_out.items()}


def _pattern(nbytes: int, seed: int) -> np.ndarray:
    return ((np.arange(nbytes, dtype=np.uint64) * 2654435761 + seed) % 251).astype(np.uint8)


# ------------------------------------------------------------------ the ring itself
def test_ring_records_of_every_length_land_at_every_offset() -> None:
    """Records of lengths that leave 8 to 48 bytes before the ring's end (less than a
    header: no room for a PAD there) are written and read back intact, wrap after wrap."""
    import random

    from procgroup_tcp._ring import CTRL_BYTES, K_EAGER, RingReader, RingWriter

    capacity = 4096
    buf = memoryview(bytearray(CTRL_BYTES + capacity))
    writer, reader = RingWriter(buf, 0, capacity), RingReader(buf, 0, capacity)
    rng = random.Random(5)
    tails = set()
    for i in range(5000):
        n = rng.choice([0, 1, 7, 8, 9, 40, 100, 333, 1000, 1500])  # at most a third of the ring
        payload = bytes([i % 251]) * n
        need = writer.free_for(n)
        assert need, f"record {i} of {n} bytes does not fit in an empty ring"
        writer.write(K_EAGER, b"B", i, n, bytes(32), payload, need)
        tails.add(capacity - (writer._tail % capacity or capacity))
        assert reader.has_record()
        kind, _, tag, nbytes, _, at, length = reader.next()
        assert (kind, tag, nbytes, length) == (K_EAGER, i, n, n) and bytes(reader.data[at : at + length]) == payload
        reader.consume(at, length)
        assert not reader.has_record() and reader.head == writer._tail
    assert 0 in tails and len(tails) > 100  # many offsets, the end of the ring among them


# ------------------------------------------------------------------ every size, every path
def _ring_exchange(rank: int, size: int) -> dict[str, Any]:
    """Each rank sends every size to the next rank and receives from the previous one."""
    import procgroup as pg
    from procgroup_tcp import _p2p

    assert _p2p.EAGER_BYTES == EAGER
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    ok = {}
    for nbytes in SIZES:
        out = _pattern(nbytes, rank)
        into = np.empty(nbytes, dtype=np.uint8)
        work = pg.irecv(into, prv)
        pg.send(out, nxt)
        work.wait()
        ok[nbytes] = bool(np.array_equal(into, _pattern(nbytes, prv)))
    # a dtype other than bytes, blocking both ways, and the sender's rank from any source
    arr = np.full(3000, rank, dtype=np.float64)
    got = np.empty(3000, dtype=np.float64)
    if rank == 0:
        pg.send(arr, 1)
    elif rank == 1:
        src = pg.recv(got, None)
        ok["float64"] = src == 0 and bool((got == 0).all())
    return {"ok": ok, "links": _links(), "pid": os.getpid(),
            "leftover": glob.glob(f"/dev/shm/procgroup-p2p-{os.getpid()}-*")}


@pytest.mark.parametrize("cma", ["1", "0"])
def test_every_size_on_both_large_message_paths(cma: str) -> None:
    results = spawn(_ring_exchange, 3, env={"PROCGROUP_TCP_SHM_CMA": cma}, timeout=30.0)
    for rank, res in enumerate(results):
        assert all(res["ok"].values()) and len(res["ok"]) >= len(SIZES), (rank, res["ok"])
        others = {r for r in range(3) if r != rank}
        assert set(res["links"]) == others, res["links"]
        assert all(v == (cma == "1") for v in res["links"].values()), res["links"]
        assert res["leftover"] == [], res["leftover"]  # unlinked as soon as every peer mapped it
    for res in results:
        assert glob.glob(f"/dev/shm/procgroup-p2p-{res['pid']}-*") == []


def _which_links(rank: int, size: int) -> dict[int, bool]:
    return _links()


@pytest.mark.parametrize("env", [{"PROCGROUP_TCP_SHM": "0"}, {"PROCGROUP_TCP_SHM_P2P": "0"}])
def test_switches_keep_point_to_point_on_the_sockets(env: dict[str, str]) -> None:
    assert spawn(_which_links, 2, env=env) == [{}, {}]


# ------------------------------------------------------------------ matching rules
def _mixed_any_source(rank: int, size: int, url: str) -> dict[str, Any]:
    """Rank 2 turns shared-memory p2p off: rank 0 hears rank 1 through shm, rank 2 over its socket."""
    import procgroup as pg

    if rank == 2:
        os.environ["PROCGROUP_TCP_SHM_P2P"] = "0"
    pg.init_process_group("tcp", url, rank=rank, world_size=size, timeout=30.0)
    try:
        links = _links()
        per_source = 200
        if rank == 0:
            seen: dict[int, list[int]] = {1: [], 2: []}
            buf = np.empty(2, dtype=np.int64)
            big = np.empty(EAGER * 2, dtype=np.int64)
            for _ in range(2 * per_source):
                src = pg.recv(buf, None, tag=5)
                assert buf[0] == src, (buf, src)
                seen[src].append(int(buf[1]))
            for _ in (1, 2):  # a rendezvous-sized message from each, any source
                who = pg.recv(big, None, tag=6)
                assert (big == who).all()
            return {"links": links, "order": {s: v == list(range(per_source)) for s, v in seen.items()}}
        msgs = [np.array([rank, i], dtype=np.int64) for i in range(per_source)]
        works = [pg.isend(m, 0, tag=5) for m in msgs]
        for w in works:
            w.wait()
        pg.send(np.full(EAGER * 2, rank, dtype=np.int64), 0, tag=6)
        return {"links": links}
    finally:
        pg.destroy_process_group()


def test_any_source_hears_shared_memory_and_socket_peers() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        results = spawn(_mixed_any_source, 3, args=(f"file://{tmp}/rv",), init=False, timeout=30.0)
    assert results[0]["links"] == {1: True} and results[1]["links"] == {0: True}, results
    assert results[2]["links"] == {}, results
    assert results[0]["order"] == {1: True, 2: True}, results[0]


def _many_isends(rank: int, size: int) -> dict[str, Any]:
    """Far more than a ring holds, mixed sizes and two tags, received late and in order."""
    import procgroup as pg

    sizes = [8, 100, EAGER, EAGER + 8, 300_000, 16]
    count = 600
    if rank == 0:
        arrays = [np.full(sizes[i % len(sizes)] // 8, i, dtype=np.int64) for i in range(count)]
        works = [pg.isend(a, 1, tag=i % 2) for i, a in enumerate(arrays)]
        for w in works:
            w.wait()
        return {"sent": count}
    time.sleep(0.3)  # the ring fills: later sends queue behind it
    bad = []
    # tag 1 first: every tag-0 message before it waits in the unexpected queue
    for tag in (1, 0):
        for i in range(tag, count, 2):
            buf = np.empty(sizes[i % len(sizes)] // 8, dtype=np.int64)
            pg.recv(buf, 0, tag=tag)
            if not (buf == i).all():
                bad.append(i)
    return {"bad": bad}


def test_order_is_kept_under_many_isends() -> None:
    results = spawn(_many_isends, 2, timeout=30.0)
    assert results[0] == {"sent": 600} and results[1] == {"bad": []}, results


def _crossing_sends(rank: int, size: int) -> dict[str, bool]:
    """Both ranks send large messages first (nobody has posted a receive), then receive."""
    import procgroup as pg

    peer = 1 - rank
    out = {}
    for nbytes in (EAGER * 4, 8 << 20):
        pg.send(_pattern(nbytes, rank), peer)
        into = np.empty(nbytes, dtype=np.uint8)
        pg.recv(into, peer)
        out[f"crossing {nbytes}"] = bool(np.array_equal(into, _pattern(nbytes, peer)))
    # a rank in a collective still takes in what a same-host peer sends it
    big = _pattern(4 << 20, 7)
    if rank == 0:
        pg.send(big, 1)
        pg.barrier()
    else:
        pg.barrier()
        into = np.empty_like(big)
        pg.recv(into, 0)
        out["send before barrier"] = bool(np.array_equal(into, big))
    return out


@pytest.mark.parametrize("cma", ["1", "0"])
def test_sends_that_cross_never_deadlock(cma: str) -> None:
    for res in spawn(_crossing_sends, 2, env={"PROCGROUP_TCP_SHM_CMA": cma}, timeout=30.0):
        assert res and all(res.values()), res


# ------------------------------------------------------------------ errors
def _size_errors(rank: int, size: int) -> dict[str, Any]:
    import procgroup as pg
    from procgroup.errors import InvalidArrayError, MismatchError, PeerError

    out: dict[str, Any] = {}
    for nbytes in (64, EAGER * 4):
        if rank == 0:
            pg.send(np.zeros(nbytes, dtype=np.uint8), 1)  # into a smaller buffer
            pg.send(np.zeros(nbytes // 2, dtype=np.uint8), 1)  # into a larger one
            pg.send(np.zeros(nbytes // 4, dtype=np.float32), 1)  # same size, another dtype
        else:
            for name, buf, exc_type in (("larger", np.empty(nbytes // 2, np.uint8), PeerError),
                                        ("smaller", np.empty(nbytes, np.uint8), InvalidArrayError),
                                        ("dtype", np.empty(nbytes, np.uint8), InvalidArrayError)):
                try:
                    pg.recv(buf, 0)
                    out[f"{name} {nbytes}"] = "no error"
                except exc_type as exc:
                    out[f"{name} {nbytes}"] = "rank 0" in str(exc)
    # a collective on a sub-group runs over p2p under its fingerprint: sizes that differ
    sub = pg.new_group([0, 1])
    for count in (4 + rank, 20_000 + rank):
        try:
            pg.all_reduce(np.ones(count, dtype=np.float32), group=sub)
            out[f"mismatch {count - rank}"] = "no error"
        except MismatchError as exc:
            out[f"mismatch {count - rank}"] = "rank 0" in str(exc) and "rank 1" in str(exc)
    arr = np.ones(4)
    pg.all_reduce(arr, group=sub)  # still usable
    out["after"] = float(arr[0]) == 2.0
    pg.barrier()
    return out


def test_size_dtype_and_fingerprint_mismatches_on_shared_memory() -> None:
    results = spawn(_size_errors, 2, timeout=20.0)
    assert all(v is True for v in results[1].values()) and len(results[1]) == 9, results[1]
    assert all(v is True for v in results[0].values()) and len(results[0]) == 3, results[0]


def _die_while_peer_waits(rank: int, size: int, nbytes: int) -> dict[str, Any]:
    """Rank 2 dies; rank 0 waits in a recv from it, rank 1 in a large send to it."""
    import procgroup as pg
    from procgroup.errors import ProcGroupError

    assert _links() == {r: True for r in range(size) if r != rank}
    pg.barrier()
    # rank 2 dies once every rank is past the barrier (a rank still in it would fail
    # there) and, after its go, reads nothing more: the large send below stays pending
    if rank == 2:
        for r in range(2):
            pg.recv(np.zeros(1), r, tag=77)
        for r in range(2):
            pg.send(np.ones(1), r, tag=78)
        time.sleep(0.3)
        os._exit(3)
    pg.send(np.ones(1), 2, tag=77)
    pg.recv(np.zeros(1), 2, tag=78)
    start = time.monotonic()
    try:
        if rank == 0:
            pg.recv(np.empty(nbytes, dtype=np.uint8), 2)
        else:
            pg.send(np.zeros(64 << 20, dtype=np.uint8), 2)
        return {"error": None}
    except ProcGroupError as exc:
        return {"error": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - start,
                "pid": os.getpid()}


@pytest.mark.parametrize("nbytes,cores", [(8, ""), (64 << 20, ""), (64 << 20, "3")])
def test_peer_death_during_a_shared_memory_wait_is_a_peer_error(nbytes: int, cores: str) -> None:
    # cores "3": each rank has a core, so the 64 MiB send is a split copy's, whose sender sleeps
    env = {"PROCGROUP_TCP_SHM_CORES": cores} if cores else None
    results = spawn(_die_while_peer_waits, 3, args=(nbytes,), timeout=15.0, expect_dead=[2], job_timeout=60.0,
                    env=env)
    for res in results[:2]:
        assert res["error"] == "PeerError" and "rank 2" in res["message"], res
        assert res["seconds"] < 15.0, res  # promptly: the socket saw it, not the timeout
        assert glob.glob(f"/dev/shm/procgroup-p2p-{res['pid']}-*") == []


def _leave_after_sending(rank: int, size: int) -> dict[str, Any]:
    """Rank 1 sends, then leaves at once: what it sent still arrives, then it is gone."""
    import procgroup as pg
    from procgroup.errors import PeerError

    if rank == 1:
        pg.send(np.arange(10, dtype=np.int32), 0)
        pg.isend(np.arange(5, dtype=np.int32), 0).wait()
        pg.destroy_process_group()  # the runner's own destroy is then a no-op
        return {}
    time.sleep(0.5)  # rank 1 is gone by now
    a, b = np.empty(10, dtype=np.int32), np.empty(5, dtype=np.int32)
    pg.recv(a, 1)
    pg.recv(b, 1)
    try:
        pg.recv(b, 1)
        left = "no error"
    except PeerError as exc:
        left = "has left" in str(exc)
    return {"data": bool((a == np.arange(10)).all() and (b == np.arange(5)).all()), "left": left}


def test_a_departed_peer_s_last_messages_still_arrive() -> None:
    results = spawn(_leave_after_sending, 2, timeout=15.0)
    assert results[0] == {"data": True, "left": True}, results


# ------------------------------------------------------------------ buffers let go
def _buffers_let_go(rank: int, size: int) -> dict[str, Any]:
    """Rank 0's large sends (send, and isend + wait) hold no reference to their buffer
    once they returned: a rendezvous job stays in its acknowledgement slot, its buffer
    must not (that held the last ACK_SLOTS large buffers of a link alive)."""
    import gc
    import weakref

    import procgroup as pg

    nbytes = 2 << 20
    if rank == 1:
        into = np.empty(nbytes, dtype=np.uint8)
        ok = True
        for seed in (1, 2):
            pg.recv(into, 0)
            ok = ok and bool(np.array_equal(into, _pattern(nbytes, seed)))
        return {"data": ok}
    released = {}
    for seed, how in ((1, "send"), (2, "isend")):
        buf = _pattern(nbytes, seed)
        ref = weakref.ref(buf)
        if how == "send":
            pg.send(buf, 1)
        else:
            pg.isend(buf, 1).wait()
        del buf
        gc.collect()
        released[how] = ref() is None
    return {"released": released, "links": _links()}


@pytest.mark.parametrize("cma", ["1", "0"])
def test_a_finished_send_holds_no_reference_to_its_buffer(cma: str) -> None:
    results = spawn(_buffers_let_go, 2, env={"PROCGROUP_TCP_SHM_CMA": cma}, timeout=30.0)
    assert results[1] == {"data": True}, results
    assert results[0]["released"] == {"send": True, "isend": True}, results
    assert results[0]["links"] == {1: cma == "1"}, results  # the path under test was taken


# ------------------------------------------------------------------ threads
def _threads(rank: int, size: int) -> bool:
    """Several threads send and receive on distinct tags at once (progress is shared)."""
    import procgroup as pg

    peer = 1 - rank
    errors: list[BaseException] = []

    def worker(tag: int) -> None:
        try:
            for i in range(50):
                n = (8, EAGER * 3, 1000)[i % 3]
                out = np.full(n, tag * 1000 + i, dtype=np.int64)
                into = np.empty(n, dtype=np.int64)
                w = pg.irecv(into, peer, tag=tag)
                pg.send(out, peer, tag=tag)
                w.wait()
                assert (into == tag * 1000 + i).all()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return not errors and not any(t.is_alive() for t in threads)


def test_threads_share_the_progress() -> None:
    assert spawn(_threads, 2, timeout=30.0) == [True, True]


# ------------------------------------------------------------------ the small messages' fast path
def test_one_call_eager_write_matches_the_two_step_write_and_refuses_a_full_ring() -> None:
    """RingWriter.put lays records out byte for byte as free_for + write do (pads at the
    ring's end included), refuses a record that does not fit, and the sender's "waiting
    for space" word reaches the reader."""
    import random

    from procgroup_tcp._ring import CTRL_BYTES, K_EAGER, RingReader, RingWriter

    capacity = 4096
    one, two = memoryview(bytearray(CTRL_BYTES + capacity)), memoryview(bytearray(CTRL_BYTES + capacity))
    put, classic, reader = RingWriter(one, 0, capacity), RingWriter(two, 0, capacity), RingReader(one, 0, capacity)
    rng = random.Random(11)
    for i in range(3000):
        payload = memoryview(bytes([i % 251]) * rng.choice([0, 1, 7, 8, 9, 40, 100, 333, 1000, 1500]))
        assert put.put(K_EAGER, b"B", i, bytes(32), payload)
        classic.write(K_EAGER, b"B", i, len(payload), bytes(32), payload, classic.free_for(len(payload)))
        assert one[CTRL_BYTES:] == two[CTRL_BYTES:] and put._tail == classic._tail, i
        assert reader.has_record()
        kind, _, tag, nbytes, _, at, n = reader.next()
        assert (kind, tag, nbytes, bytes(reader.data[at : at + n])) == (K_EAGER, i, len(payload), bytes(payload))
        reader.consume(at, n)
        two[:CTRL_BYTES] = one[:CTRL_BYTES]  # the classic writer sees the same head
    fill = memoryview(bytes(1000))
    while put.put(K_EAGER, b"B", 0, bytes(32), fill):
        pass
    assert put._tail - reader.head > capacity - 1100  # it stopped because the ring is full
    assert not reader.writer_waits()
    put.waiting(True)
    assert reader.writer_waits()
    put.waiting(False)
    assert not reader.writer_waits()


def test_small_writes_and_takes_match_the_general_records_and_leave_the_rest() -> None:
    """RingWriter.put_small lays records out byte for byte as put does (pads included);
    RingReader.take_small copies a record of the wanted tag, dtype and size into a NumPy
    array and consumes it, and leaves any other record (another tag, size or dtype, a
    pad) in the ring, untouched, for next() to read."""
    import random

    from procgroup_tcp._ring import CTRL_BYTES, HEADER_BYTES, K_EAGER, SMALL_BYTES, RingReader, RingWriter

    capacity = 1 << 14
    one, two = memoryview(bytearray(CTRL_BYTES + capacity)), memoryview(bytearray(CTRL_BYTES + capacity))
    small, general, reader = RingWriter(one, 0, capacity), RingWriter(two, 0, capacity), RingReader(one, 0, capacity)
    rng = random.Random(5)
    took = left = pads = 0
    for i in range(4000):
        nbytes = rng.choice([0, 4, 8, 12, 40, 100, 1000, SMALL_BYTES])
        payload = np.full(nbytes // 4, i, dtype=np.int32).tobytes()
        assert small.put_small(b"i", i, bytes(32), payload)
        assert general.put(K_EAGER, b"i", i, bytes(32), memoryview(payload))
        assert one[CTRL_BYTES:] == two[CTRL_BYTES:] and small._tail == general._tail, i
        into = np.zeros(nbytes // 4, dtype=np.int32)
        if i % 3 == 0:  # asks for something else: the record stays
            wrong = rng.choice([(i + 1, b"i", nbytes), (i, b"f", nbytes), (i, b"i", nbytes + 4)])
            assert reader.take_small(wrong[0], wrong[1], np.zeros(wrong[2] // 4, np.int32), wrong[2]) == 0
            kind, code, tag, got, _, at, n = reader.next()
            assert (kind, code, tag, got, bytes(reader.data[at : at + n])) == (K_EAGER, b"i", i, nbytes, payload)
            reader.consume(at, n)
            left += 1
        elif reader.take_small(i, b"i", into, nbytes) == 1:
            assert into.tobytes() == payload
            took += 1
        else:  # only a pad before it (the ring's end) sends it the general way
            assert reader.head % capacity + HEADER_BYTES + nbytes > capacity, i
            kind, code, tag, got, _, at, n = reader.next()  # skips the pad
            assert (kind, tag, bytes(reader.data[at : at + n])) == (K_EAGER, i, payload)
            reader.consume(at, n)
            pads += 1
        two[:CTRL_BYTES] = one[:CTRL_BYTES]  # the general writer sees the same head
    assert reader.take_small(0, b"i", np.zeros(2, np.int32), 8) == 0  # nothing left
    assert took > 2000 and left > 1000 and pads > 10
    assert small.put_small(b"i", 7, bytes(32), bytes(8))
    small.waiting(True)
    assert reader.take_small(7, b"i", np.zeros(2, np.int32), 8) == 2  # the sender waits for space
    small.waiting(False)


def test_a_waiting_small_take_gets_the_record_published_meanwhile_and_only_a_match() -> None:
    """RingReader.take_small with ``seconds`` polls the tail until a record is published
    (another thread writes it while the take waits) and takes it when it matches; one that
    does not match stays for next(); with nothing published it gives up after the time."""
    import threading
    import time

    from procgroup_tcp._ring import CTRL_BYTES, K_EAGER, RingReader, RingWriter

    capacity = 1 << 14
    buf = memoryview(bytearray(CTRL_BYTES + capacity))
    writer, reader = RingWriter(buf, 0, capacity), RingReader(buf, 0, capacity)

    def later(tag: int, payload: bytes) -> threading.Thread:
        def write() -> None:
            time.sleep(0.05)
            assert writer.put_small(b"i", tag, bytes(32), payload)

        thread = threading.Thread(target=write)
        thread.start()
        return thread

    for i in range(20):  # a few laps of records, the waits each time
        payload = np.arange(i, i + 4, dtype=np.int32).tobytes()
        thread = later(i, payload)
        into = np.zeros(4, dtype=np.int32)
        assert reader.take_small(i, b"i", into, 16, 10.0) == 1, i
        thread.join()
        assert into.tobytes() == payload and reader.head == writer._tail, i
    thread = later(99, bytes(16))  # another tag than the one awaited: left in the ring
    assert reader.take_small(98, b"i", np.zeros(4, dtype=np.int32), 16, 10.0) == 0
    thread.join()
    kind, code, tag, nbytes, _, at, n = reader.next()
    assert (kind, code, tag, nbytes) == (K_EAGER, b"i", 99, 16)
    reader.consume(at, n)
    start = time.perf_counter()
    assert reader.take_small(0, b"i", np.zeros(4, dtype=np.int32), 16, 0.05) == 0  # nothing comes
    assert time.perf_counter() - start >= 0.05


def _direct_receives(rank: int, size: int) -> dict[str, Any]:
    """Blocking receives from the same-host peer: taken from the ring directly when the
    message is next, else (another tag first, a message that comes after the spin, a
    message waiting behind a full ring) the general way, in order, nothing lost."""
    import procgroup as pg

    ch: Any = pg.group_channel(pg.group.WORLD)
    p2p = ch._p2p
    taken = {"direct": 0, "general": 0}
    real = p2p.recv_direct

    def counting(*args: Any) -> int:
        got = real(*args)
        taken["direct" if got >= 0 else "general"] += 1
        return got

    p2p.recv_direct = counting
    out: dict[str, Any] = {}
    small = np.empty(4, dtype=np.int32)
    if rank == 0:
        for i in range(200):
            pg.send(np.full(4, i, dtype=np.int32), 1)
            pg.recv(small, 1)
        for i in range(20):  # already in the ring when rank 1 receives them
            pg.send(np.full(4, i, dtype=np.int32), 1, tag=4)
        pg.send(np.full(4, 1, dtype=np.int32), 1, tag=1)  # tag 1 first, tag 2 wanted first
        pg.send(np.full(4, 2, dtype=np.int32), 1, tag=2)
        pg.recv(small, 1)  # rank 1 has taken both
        time.sleep(0.2)  # past any spin: rank 1 sleeps on its doorbell meanwhile
        pg.send(np.full(4, 3, dtype=np.int32), 1)
        works = [pg.isend(np.full(EAGER // 4, i, dtype=np.int32), 1, tag=3) for i in range(100)]  # 3 MiB: > a ring
        for w in works:
            w.wait()
        out["sent"] = True
    else:
        echoes = 0
        for i in range(200):
            pg.recv(small, 0)
            echoes += int((small == i).all())
            pg.send(small, 0)
        out["pingpong"] = echoes == 200
        # the spin before sleeping: the small messages' below the eager size, growing with the
        # size above it up to MAX_SPIN_S while each rank has a core, the short one otherwise
        from procgroup_tcp._p2p import MAX_SPIN_S, SPIN_S_PER_BYTE

        base = p2p.spin_for(EAGER)
        own = 2 <= (os.cpu_count() or 1)
        out["spin"] = (p2p.spin_for(0) == base and p2p.spin_for(EAGER + 1) >= base
                       and p2p.spin_for(1 << 40) == (MAX_SPIN_S if own else base)
                       and (not own or p2p.spin_for(4 << 20) == max(base, (4 << 20) * SPIN_S_PER_BYTE)))
        time.sleep(0.3)
        before = dict(taken)
        ready = [int(pg.recv(small, 0, tag=4) == 0 and (small == i).all()) for i in range(20)]
        out["direct"] = sum(ready) == 20 and taken["direct"] - before["direct"] == 20 == sum(taken.values()) - sum(
            before.values())
        got2 = np.empty(4, dtype=np.int32)
        got1 = np.empty(4, dtype=np.int32)
        pg.recv(got2, 0, tag=2)
        pg.recv(got1, 0, tag=1)
        out["tags"] = bool((got2 == 2).all() and (got1 == 1).all())
        pg.send(small, 0)
        pg.recv(small, 0)
        out["late"] = bool((small == 3).all())
        time.sleep(0.3)  # the sender fills the ring and waits for space
        big = np.empty(EAGER // 4, dtype=np.int32)
        order = []
        for _ in range(100):
            pg.recv(big, 0, tag=3)
            order.append(int(big[0]) if (big == big[0]).all() else -1)
        out["full ring"] = order == list(range(100))
    pg.barrier()
    return out


def test_blocking_receives_take_the_ring_directly_and_fall_back_in_order() -> None:
    results = spawn(_direct_receives, 2, timeout=30.0)
    assert results[0] == {"sent": True}, results[0]
    assert all(v is True for v in results[1].values()) and len(results[1]) == 6, results[1]


# ------------------------------------------------------------------ the streamed / one-copy boundary
def _one_core() -> None:
    """taskset to one core, before init: the host's ranks then outnumber their cores."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _random_bytes(nbytes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def _around_the_stream_limit(rank: int, size: int) -> dict[str, Any]:
    """Messages just below, at and just above STREAM_MAX_BYTES, around a ring of ``size``
    ranks (every rank sends and receives at once) and from every rank to rank 0 at once
    (two streams interleaved in its rings), one float64 message too; each checked byte for
    byte, and the path each send took (streamed through the ring, one process_vm_readv)
    recorded from the real send jobs."""
    import procgroup as pg
    from procgroup_tcp import _p2p

    limit = _p2p.STREAM_MAX_BYTES
    paths: list[tuple[int, str]] = []
    real_init = _p2p.SendJob.__init__

    def recording(job: Any, *args: Any) -> None:
        real_init(job, *args)
        paths.append((job.view.nbytes, "one copy" if job.rts else "streamed" if job.stream else "eager"))

    _p2p.SendJob.__init__ = recording  # type: ignore[method-assign]  # a spy: the real job runs
    reads: list[int] = []  # the bytes of each process_vm_readv copy (a split copy makes two)
    real_read = _p2p._cma.read_from

    def reading(pid: int, addr: int, view: memoryview) -> None:
        reads.append(view.nbytes)
        real_read(pid, addr, view)

    _p2p._cma.read_from = reading  # type: ignore[assignment]  # a spy: the real copy runs
    ch: Any = pg.group_channel(pg.group.WORLD)
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    bad = []
    for nbytes in (limit - 1, limit, limit + 1):
        into = np.empty(nbytes, dtype=np.uint8)
        work = pg.irecv(into, prv)
        pg.send(_random_bytes(nbytes, rank * 10 + nbytes % 7), nxt)
        work.wait()
        if not np.array_equal(into, _random_bytes(nbytes, prv * 10 + nbytes % 7)):
            bad.append(f"ring {nbytes}")
    for nbytes in (limit, limit + 1):
        if rank == 0:
            intos = {src: np.empty(nbytes, dtype=np.uint8) for src in range(1, size)}
            works = [pg.irecv(into, src, tag=5) for src, into in intos.items()]
            for w in works:
                w.wait()
            bad += [f"fan-in {nbytes} from {src}" for src, into in intos.items()
                    if not np.array_equal(into, _random_bytes(nbytes, src * 10 + 3))]
        else:
            pg.send(_random_bytes(nbytes, rank * 10 + 3), 0, tag=5)
    floats = _random_bytes(limit, 99 + rank).view(np.float64)  # any bit pattern, NaNs included
    into_f = np.empty(limit // 8, dtype=np.float64)
    work = pg.irecv(into_f, prv, tag=6)
    pg.send(floats, nxt, tag=6)
    work.wait()
    if not np.array_equal(into_f.view(np.uint8), _random_bytes(limit, 99 + prv)):
        bad.append("float64")
    pg.barrier()
    return {"bad": bad, "paths": sorted(set(paths)), "own_cores": ch._p2p.own_cores,
            "cores": _p2p.usable_cores(), "links": _links(), "reads": sorted(set(reads))}


@pytest.mark.parametrize(
    "case",
    [
        {"env": {"PROCGROUP_TCP_SHM_CORES": "3"}},  # a core each: streamed up to the limit
        {"setup": _one_core},  # three ranks on one core (taskset): one copy above the eager size
        {"env": {"PROCGROUP_TCP_SHM_CORES": "3", "PROCGROUP_TCP_SHM_CMA": "0"}},  # no cross-memory copy
        {"env": {"PROCGROUP_TCP_SHM_CORES": "3", "PROCGROUP_TCP_SHM_STREAM_MAX_BYTES": "0"}},  # never streamed
    ],
    ids=["a-core-each", "one-core", "no-cma", "no-stream"],
)
def test_sizes_around_the_stream_limit_take_their_path_and_arrive_intact(case: dict[str, Any]) -> None:
    from procgroup_tcp._p2p import STREAM_MAX_BYTES as limit

    results = spawn(_around_the_stream_limit, 3, env=case.get("env"), setup=case.get("setup"), timeout=60.0,
                    job_timeout=180.0)
    one_core = "setup" in case
    cma = case.get("env", {}).get("PROCGROUP_TCP_SHM_CMA") != "0"
    if case.get("env", {}).get("PROCGROUP_TCP_SHM_STREAM_MAX_BYTES") == "0":  # every size one split copy
        halves = {((n // 2) & ~4095, n - ((n // 2) & ~4095)) for n in (limit - 1, limit, limit + 1)}
        for res in results:
            assert res["bad"] == [] and {path for _, path in res["paths"]} == {"one copy"}, res
            assert res["reads"] == sorted({h for pair in halves for h in pair}), res["reads"]
        return
    for rank, res in enumerate(results):
        assert res["bad"] == [], (rank, res)
        assert res["own_cores"] is (not one_core) and res["cores"] == (1 if one_core else 3), res
        assert all(v is cma for v in res["links"].values()) and len(res["links"]) == 2, res
        if not cma:
            want = {"streamed"}
        else:
            want = {"one copy"} if one_core else {"streamed", "one copy"}
        assert {path for _, path in res["paths"]} == want, (rank, res["paths"])
        for nbytes, path in res["paths"]:  # the boundary itself: up to the limit streams
            assert path == ("streamed" if not cma or (not one_core and nbytes <= limit) else "one copy"), res
        if cma and one_core:  # one copy each, whole
            assert res["reads"] == [limit - 1, limit, limit + 1], res["reads"]
        elif cma:  # above the limit only, split in two at a page boundary, both halves read
            half = ((limit + 1) // 2) & ~4095
            assert res["reads"] == sorted({half, limit + 1 - half}), res["reads"]
        else:
            assert res["reads"] == [], res["reads"]


def test_the_core_count_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from procgroup.errors import InvalidArgumentError
    from procgroup_tcp._p2p import ENV_SHM_CORES, usable_cores

    monkeypatch.delenv(ENV_SHM_CORES, raising=False)
    assert usable_cores({"shm_cores": 6}) == 6
    assert usable_cores({}) == len(os.sched_getaffinity(0))
    monkeypatch.setenv(ENV_SHM_CORES, "3")
    assert usable_cores({}) == 3
    for bad in ("0", "-2", "two", "1.5", "\u00b2"):
        with pytest.raises(InvalidArgumentError, match="shm_cores"):
            usable_cores({"shm_cores": bad})
