"""Issue 14 on the tcp data channel: strangers at the data port, fingerprints, hostile frames.

The mismatch matrix runs in real processes (2 ranks, shared memory and sockets). The
set-up and frame attacks drive real TcpChannels over real loopback sockets from threads
of this process (a HashStore stands in for the rendezvous), so an attacker can read a
rank's published address and speak the wire byte by byte.
"""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
from typing import Any

import numpy as np
import pytest

from procgroup.backend import ChannelContext, client_handshake, job_key
from procgroup.errors import AuthenticationError, MismatchError, PeerError, ProcGroupError
from procgroup.rendezvous import HashStore
from procgroup.testing import spawn
from procgroup_tcp import _wire
from procgroup_tcp._conn import _purpose
from procgroup_tcp.channel import TcpChannel

KEY = job_key("s3cret")
TIMEOUT = 8.0


# ------------------------------------------------------------------ helpers (in-process ranks)
def _ctx(rank: int, size: int, store: HashStore, key: bytes | None = KEY, timeout: float = TIMEOUT) -> ChannelContext:
    return ChannelContext(rank=rank, size=size, store=store, timeout=timeout, master_addr="127.0.0.1",
                          options={"shm": False}, job_key=key)


def _open_all(size: int, store: HashStore, *, delay: dict[int, float] | None = None,
              keys: dict[int, bytes] | None = None) -> list[Any]:
    """Build ``size`` TcpChannels on threads; each slot holds the channel or the exception."""
    out: list[Any] = [None] * size

    def run(r: int) -> None:
        time.sleep((delay or {}).get(r, 0.0))
        try:
            out[r] = TcpChannel(_ctx(r, size, store, (keys or {}).get(r, KEY)))
        except BaseException as exc:  # noqa: BLE001 - checked by the test
            out[r] = exc

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT * 2)
    return out


def _address(store: HashStore, rank: int) -> tuple[str, int, bytes]:
    host, port, nonce = store.get(f"tcp/addr/{rank}", timeout=TIMEOUT).decode().rsplit(":", 2)
    return host, int(port), bytes.fromhex(nonce)


def _close(channels: list[Any]) -> None:
    for ch in channels:
        if isinstance(ch, TcpChannel):
            ch.close()


def _works(channels: list[TcpChannel]) -> None:
    arrays = [np.full(4, r + 1.0) for r in range(len(channels))]
    threads = [threading.Thread(target=ch.run, args=("all_reduce", a, __import__("procgroup").ReduceOp.SUM))
               for ch, a in zip(channels, arrays)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    total = sum(range(1, len(channels) + 1))
    assert all(float(a[0]) == total for a in arrays), arrays


# ------------------------------------------------------------------ strangers at set-up
def _stranger(store: HashStore, how: str, result: dict[str, Any]) -> None:
    host, port, nonce = _address(store, 0)
    sock = socket.create_connection((host, port), timeout=TIMEOUT)
    try:
        if how == "silent":
            time.sleep(3.0)
        elif how == "garbage":
            sock.sendall(b"GET / HTTP/1.0\r\n\r\n" * 4)
            sock.recv(1024)
        elif how == "replay":  # a proof made for another nonce: what a recorder could replay
            greeting = sock.recv(40)
            sock.sendall(b"\0" * 32 + b"\1" * 32)
            result["verdict"] = sock.recv(33)
            del greeting
        else:
            try:
                client_handshake(sock, job_key(None) if how == "no token" else job_key("wrong"),
                                 _purpose(_ctx(1, 2, store), nonce), "rank 0", 5.0)
                result["admitted"] = True
            except AuthenticationError as exc:
                result["error"] = str(exc)
    except OSError:
        pass
    finally:
        sock.close()


@pytest.mark.parametrize("how", ["silent", "garbage", "no token", "wrong token", "replay"])
def test_stranger_at_the_data_port_during_setup(how: str) -> None:
    store = HashStore()
    result: dict[str, Any] = {}
    attacker = threading.Thread(target=_stranger, args=(store, how, result), daemon=True)
    attacker.start()
    # rank 1 comes late: the stranger is there first
    channels = _open_all(2, store, delay={1: 0.5})
    try:
        assert all(isinstance(ch, TcpChannel) for ch in channels), channels
        assert not result.get("admitted"), result
        if how in ("no token", "wrong token"):
            assert "refused" in result["error"], result
        if how == "replay":
            assert result.get("verdict", b"\0")[:1] != b"\1", result
        _works(channels)
    finally:
        _close(channels)
        attacker.join(TIMEOUT)


def test_rank_with_another_token_gets_no_seat() -> None:
    store = HashStore()
    channels = _open_all(2, store, keys={1: job_key("another job")})
    _close(channels)
    assert isinstance(channels[1], AuthenticationError), channels
    assert "refused" in str(channels[1])


def test_listener_is_closed_after_setup() -> None:
    store = HashStore()
    channels = _open_all(2, store)
    try:
        host, port, _ = _address(store, 0)
        with pytest.raises(OSError):
            socket.create_connection((host, port), timeout=2.0).close()
        _works(channels)
    finally:
        _close(channels)


# ------------------------------------------------------------------ hostile frames
def _seat_raw(store: HashStore) -> tuple[TcpChannel | BaseException, socket.socket]:
    """Rank 0 is a real channel; rank 1 is this raw socket, which holds the token."""
    out: list[Any] = [None]

    def build() -> None:
        try:
            out[0] = TcpChannel(_ctx(0, 2, store))
        except BaseException as exc:  # noqa: BLE001 - checked by the test
            out[0] = exc

    th = threading.Thread(target=build, daemon=True)
    th.start()
    host, port, nonce = _address(store, 0)
    store.set("tcp/addr/1", "127.0.0.1:1:" + "00" * 16)  # never dialled: rank 1 is above rank 0
    sock = socket.create_connection((host, port), timeout=TIMEOUT)
    client_handshake(sock, KEY, _purpose(_ctx(1, 2, store), nonce), "rank 0", 5.0)
    sock.sendall(_wire.pack_hello(1, 2, 0, nonce))
    th.join(TIMEOUT)
    return out[0], sock


def _recv_outcome(ch: TcpChannel, nbytes: int = 8, tag: int = 0) -> tuple[str, str, float]:
    start = time.monotonic()
    try:
        ch.recv(np.empty(nbytes, dtype=np.uint8), 1, tag)
        return "ok", "", time.monotonic() - start
    except ProcGroupError as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start


def test_unknown_kind_and_oversized_frames_name_the_peer() -> None:
    for frame in (_wire.pack_header(9, b"B", 0, 0, 8) + b"x" * 8,  # unknown kind
                  _wire.pack_header(_wire.KIND_DATA, b"B", 0, 0, 1 << 40)):  # far larger than the buffer
        store = HashStore()
        ch, sock = _seat_raw(store)
        assert isinstance(ch, TcpChannel), ch
        try:
            threading.Timer(0.2, sock.sendall, args=(frame,)).start()  # into a posted receive
            kind, msg, seconds = _recv_outcome(ch)
            assert kind == "PeerError" and "rank 1" in msg, (kind, msg)
            assert seconds < TIMEOUT / 2, seconds
        finally:
            ch.close()
            sock.close()


def _fuzz_frame(rng: random.Random, seq: int) -> tuple[bytes, bool]:
    """A frame and whether it is well formed (a valid user message of tag 0..3)."""
    nbytes = rng.choice([0, 1, 8, 64, 1000])
    choice = rng.random()
    if choice < 0.996:
        payload = rng.randbytes(nbytes)
        return _wire.pack_header(_wire.KIND_DATA, b"B", rng.randrange(4), seq, nbytes) + payload, True
    header = bytearray(_wire.pack_header(_wire.KIND_DATA, b"B", rng.randrange(4), seq, nbytes))
    corrupt = rng.randrange(5)
    if corrupt == 0:
        header[0] = rng.choice([0, 5, 77, 255])  # unknown kind
    elif corrupt == 1:
        header[2:4] = rng.randbytes(2)  # magic
    elif corrupt == 2:
        struct.pack_into("<Q", header, 16, seq + rng.randrange(1, 9))  # out of order
    elif corrupt == 3:
        struct.pack_into("<Q", header, 24, rng.choice([1 << 50, 1 << 63]))  # absurd size
    else:
        header[0] = _wire.KIND_MISMATCH  # a notice of the wrong size
    return bytes(header) + rng.randbytes(nbytes), False


def test_fuzzed_frames_are_received_intact_or_refused() -> None:
    rng = random.Random(14)
    frames = 0
    deadline = time.monotonic() + 40.0
    for _round in range(40):
        if time.monotonic() > deadline:
            break
        store = HashStore()
        ch, sock = _seat_raw(store)
        assert isinstance(ch, TcpChannel), ch
        try:
            sent: list[tuple[int, bytes]] = []
            stream = bytearray()
            seq = 0
            broken = False
            for _ in range(rng.randrange(50, 400)):
                frame, ok = _fuzz_frame(rng, seq)
                stream += frame
                frames += 1
                if not ok:
                    broken = True
                    break
                tag = struct.unpack_from("<Q", frame, 8)[0]
                sent.append((tag, frame[_wire.HEADER_SIZE:]))
                seq += 1
            sock.sendall(stream)
            for tag, payload in sent:  # a good frame arrives intact, or the bad one broke the channel
                buf = np.empty(len(payload), dtype=np.uint8)
                try:
                    ch.recv(buf, 1, tag)
                except PeerError as exc:
                    assert broken and "rank 1" in str(exc), exc
                    break
                assert buf.tobytes() == payload
            if broken:
                kind, msg, seconds = _recv_outcome(ch, 8, 99)
                assert kind == "PeerError" and "rank 1" in msg, (kind, msg)
        finally:
            ch.close()
            sock.close()
    assert frames >= 2000, frames


# ------------------------------------------------------------------ mismatch matrix (processes)
_CASES = {
    "op": (lambda pg, r: pg.all_reduce(np.ones(4, np.float32)),
           lambda pg, r: pg.all_gather([np.empty(4, np.float32) for _ in range(2)], np.ones(4, np.float32))),
    "small vs large": (lambda pg, r: pg.all_reduce(np.ones(4, np.float32)),
                       lambda pg, r: pg.all_reduce(np.ones(1 << 20, np.float32))),
    "0 vs non-0": (lambda pg, r: pg.all_reduce(np.ones(0, np.float32)),
                   lambda pg, r: pg.all_reduce(np.ones(4, np.float32))),
    "dtype": (lambda pg, r: pg.all_reduce(np.ones(4, np.float32)),
              lambda pg, r: pg.all_reduce(np.ones(4, np.int32))),
    "reduce op": (lambda pg, r: pg.all_reduce(np.ones(4, np.float32), op=pg.ReduceOp.SUM),
                  lambda pg, r: pg.all_reduce(np.ones(4, np.float32), op=pg.ReduceOp.MAX)),
    "root": (lambda pg, r: pg.broadcast(np.ones(4, np.float32), src=0),
             lambda pg, r: pg.broadcast(np.ones(4, np.float32), src=1)),
    "op vs broadcast": (lambda pg, r: pg.all_reduce(np.ones(4, np.float32)),
                        lambda pg, r: pg.broadcast(np.ones(4, np.float32), src=1)),
    # each rank thinks it is the root: over the sockets every rank only receives (the
    # waiting receivers' probes find it)
    "reduce root": (lambda pg, r: pg.reduce(np.ones(4, np.float32), dst=0),
                    lambda pg, r: pg.reduce(np.ones(4, np.float32), dst=1)),
    "gather root": (lambda pg, r: pg.gather(np.ones(3), [np.zeros(3), np.zeros(3)], dst=0),
                    lambda pg, r: pg.gather(np.ones(3), [np.zeros(3), np.zeros(3)], dst=1)),
}
#: over the sockets a rank whose part only sends raises at its next collective (docs/backends/tcp.md)
_SOCKET_CASES = ["op", "small vs large", "0 vs non-0", "dtype", "reduce op", "op vs broadcast", "root",
                 "reduce root", "gather root"]


def _mismatch_matrix(rank: int, size: int, names: list[str]) -> dict[str, Any]:
    import procgroup as pg

    out: dict[str, Any] = {}
    for name in names:
        start = time.monotonic()
        try:
            _CASES[name][rank](pg, rank)
            out[name] = ("ok", "")
        except MismatchError as exc:
            out[name] = ("MismatchError", str(exc), time.monotonic() - start)
        except ProcGroupError as exc:
            out[name] = (type(exc).__name__, str(exc), time.monotonic() - start)
        arr = np.ones(4)
        try:
            pg.all_reduce(arr)  # a rank whose part only sent learns of the mismatch here
        except MismatchError as exc:
            out[name + "/late"] = str(exc)
        arr = np.ones(4)
        pg.all_reduce(arr)  # the group stays usable
        out[name + "/after"] = float(arr[0])
    return out


@pytest.mark.parametrize("shm", ["1", "0"])
def test_mismatch_matrix(shm: str) -> None:
    names = list(_CASES) if shm == "1" else _SOCKET_CASES
    results = spawn(_mismatch_matrix, 2, args=(names,), timeout=20.0, env={"PROCGROUP_TCP_SHM": shm})
    for rank, out in enumerate(results):
        for name in names:
            kind, msg, *seconds = out[name]
            assert kind == "ok" or name + "/late" not in out, (rank, name, out)  # raised once
            if kind == "ok" and shm == "0" and name + "/late" in out:  # its part only sent
                kind, msg, seconds = "MismatchError", out[name + "/late"], [0.0]
            assert kind == "MismatchError", (rank, name, out[name])
            assert "rank 0" in msg and "rank 1" in msg, (rank, name, msg)
            assert seconds[0] < 5.0, (rank, name, seconds)
            assert out[name + "/after"] == 2.0, (rank, name, out)


# ------------------------------------------------------------------ dead peers
def _die_in_collective(rank: int, size: int) -> dict[str, Any]:
    import os

    import procgroup as pg

    pg.barrier()
    # the last rank dies only once every rank is past the barrier: a rank still in it
    # would fail there (its channel breaks at the death), not in the collective below
    if rank == size - 1:
        for r in range(size - 1):
            pg.recv(np.zeros(1), r, tag=77)
        os._exit(3)
    pg.send(np.ones(1), size - 1, tag=77)
    start = time.monotonic()
    try:
        for _ in range(200):
            pg.all_reduce(np.ones(1 << 16))
        return {"error": None}
    except ProcGroupError as exc:
        return {"error": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - start}


@pytest.mark.parametrize("shm", ["1", "0"])
def test_dead_rank_is_named(shm: str) -> None:
    results = spawn(_die_in_collective, 3, timeout=10.0, expect_dead=[2], env={"PROCGROUP_TCP_SHM": shm})
    for res in results[:2]:
        assert res["error"] == "PeerError" and "rank 2" in res["message"], res
        assert "rank 1 closed" not in res["message"] and "rank 0 closed" not in res["message"], res
