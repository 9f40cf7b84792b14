"""Every Store method on every Store: TCPStore and FileStore shared by real processes,
HashStore shared by threads, PrefixStore over each of them.

One battery (``_peer_body``) runs concurrently in the test process and in two peers
(spawned processes, or threads for HashStore); the test then checks what they wrote to
each other, and runs the single-process checks (timeouts, errors) on the same store.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import threading
from collections.abc import Callable

import pytest

from procgroup.errors import InvalidArgumentError, StoreError, StoreTimeoutError
from procgroup.rendezvous import FileStore, HashStore, PrefixStore, Store, TCPStore

pytestmark = pytest.mark.timeout(180)

SAFE = 60.0  # timeout for waits that must succeed (the machine may be loaded)
SHORT = 0.5  # timeout for waits that must fail
N_PEERS = 2
N_ADDS = 50
CTX = mp.get_context("spawn")


# ---------------------------------------------------------------------- the battery
def _peer_body(store: Store, name: str) -> None:
    """What every participant does, the test process included."""
    store.set(f"hello/{name}", f"from {name}")
    for _ in range(N_ADDS):
        store.add("counter", 1)
    # exactly one participant wins the swap from "missing"; everyone sees the winner
    now = store.compare_set("cas", b"", name.encode())
    store.set(f"cas_seen/{name}", now)
    # wait for the test process, then answer it
    store.wait(["go"], SAFE)
    store.set(f"echo/{name}", store.get("go", SAFE) + b"/" + name.encode())


def _open(kind: str, arg: object, prefix: str | None) -> Store:
    if kind == "tcp":
        store: Store = TCPStore("127.0.0.1", int(arg), timeout=SAFE)  # type: ignore[arg-type]  # arg is the port, an object in the shared fixture
    elif kind == "file":
        store = FileStore(str(arg), timeout=SAFE)
    else:
        raise ValueError(kind)
    return PrefixStore(prefix, store, owns_store=True) if prefix else store


def _peer_process(kind: str, arg: object, prefix: str | None, name: str, out: mp.Queue) -> None:
    try:
        store = _open(kind, arg, prefix)
        _peer_body(store, name)
        store.wait(["bye"], SAFE)  # keep the connection until the test is done reading
        store.close()
        out.put((name, "ok"))
    except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails with it
        out.put((name, f"{type(exc).__name__}: {exc}"))


class _Setup:
    """A store under test plus a way to start peers that share it."""

    def __init__(self, kind: str, prefixed: bool, tmp_path) -> None:
        self.kind, self.prefix = kind, ("job/a" if prefixed else None)
        self.path = str(tmp_path / "store.bin")
        self.extra: list[Store] = []
        if kind == "tcp":
            self.base: Store = TCPStore("127.0.0.1", 0, is_master=True, timeout=SAFE)
            self.arg: object = self.base.port  # type: ignore[attr-defined]  # base is a TCPStore here
        elif kind == "file":
            self.base = FileStore(self.path, timeout=SAFE)
            self.arg = self.path
        else:
            self.base = HashStore(timeout=SAFE)
            self.arg = None
        self.store = PrefixStore(self.prefix, self.base) if self.prefix else self.base

    def start_peers(self) -> Callable[[], list[str]]:
        names = [f"peer{i}" for i in range(N_PEERS)]
        if self.kind == "hash":
            results: queue.Queue[tuple[str, str]] = queue.Queue()

            def run(name: str) -> None:
                try:
                    _peer_body(self.store, name)
                    results.put((name, "ok"))
                except BaseException as exc:  # noqa: BLE001 - reported to the test
                    results.put((name, f"{type(exc).__name__}: {exc}"))

            threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in names]
            for t in threads:
                t.start()
            return lambda: [results.get(timeout=SAFE)[1] for _ in names]
        out = CTX.Queue()
        procs = [
            CTX.Process(target=_peer_process, args=(self.kind, self.arg, self.prefix, n, out),
                        daemon=True)
            for n in names
        ]
        for p in procs:
            p.start()

        def collect() -> list[str]:
            got = [out.get(timeout=SAFE)[1] for _ in names]
            for p in procs:
                p.join(SAFE)
            return got

        return collect


@pytest.mark.parametrize("prefixed", [False, True], ids=["plain", "prefixed"])
@pytest.mark.parametrize("kind", ["tcp", "file", "hash"])
def test_store_shared_by_peers(kind: str, prefixed: bool, tmp_path) -> None:
    setup = _Setup(kind, prefixed, tmp_path)
    store = setup.store
    collect = setup.start_peers()
    _peer_body_parent = threading.Thread(target=_peer_body, args=(store, "main"), daemon=True)
    _peer_body_parent.start()
    names = ["main"] + [f"peer{i}" for i in range(N_PEERS)]

    # get() waits until the peers have set their keys
    for n in names[1:]:
        assert store.get(f"hello/{n}", SAFE) == f"from {n}".encode()
    store.wait([f"cas_seen/{n}" for n in names], SAFE)
    # every participant saw the same compare_set winner, and it is one of them
    seen = {store.get(f"cas_seen/{n}") for n in names}
    assert len(seen) == 1
    winner = seen.pop()
    assert winner.decode() in names
    assert store.get("cas") == winner
    # all adds landed (atomic across processes)
    assert store.add("counter", 0) == N_ADDS * len(names)

    store.set("go", "ping")  # str values are stored UTF-8 encoded
    for n in names:
        assert store.get(f"echo/{n}", SAFE) == f"ping/{n}".encode()
    assert store.check([f"echo/{n}" for n in names])

    store.set("bye", b"")
    assert collect() == ["ok"] * N_PEERS
    _peer_body_parent.join(SAFE)

    _single_process_checks(store, kind)
    store.close()
    store.close()  # idempotent
    if prefixed:
        setup.base.close()
    with pytest.raises(StoreError):
        setup.base.get("go", SHORT)


def _single_process_checks(store: Store, kind: str) -> None:
    """Semantics that need no peer, on a store that peers have used."""
    # compare_set, torch semantics
    assert store.compare_set("cs", b"x", b"y") == b"x"  # missing, expected != "": no set
    assert not store.check(["cs"])
    assert store.compare_set("cs", "", "v1") == b"v1"  # missing and expected "": set
    assert store.compare_set("cs", b"nope", b"v2") == b"v1"  # mismatch: current value
    assert store.compare_set("cs", b"v1", b"v2") == b"v2"  # match: swapped
    # add on a missing key starts from 0; negative amounts work
    assert store.add("fresh") == 1
    assert store.add("fresh", -3) == -2
    store.set("notint", b"abc")
    with pytest.raises(InvalidArgumentError, match="not an integer"):
        store.add("notint", 1)
    # delete_key / num_keys / check
    before = store.num_keys()
    store.set("tmp", b"\x00\xff binary")
    assert store.get("tmp") == b"\x00\xff binary"
    assert store.num_keys() == before + 1
    assert store.delete_key("tmp") is True
    assert store.delete_key("tmp") is False
    assert store.num_keys() == before
    assert store.check(["cs", "fresh"]) and not store.check(["cs", "tmp"])
    # a value of several MiB round-trips
    big = os.urandom(3 << 20)
    store.set("big", big)
    assert store.get("big") == big
    # timeouts: explicit, and the settable default
    with pytest.raises(StoreTimeoutError, match="missing-key"):
        store.get("missing-key", timeout=SHORT)
    with pytest.raises(StoreTimeoutError, match=r"k2") as info:
        store.wait(["cs", "k2"], timeout=SHORT)
    assert "'cs'" not in str(info.value)  # only the missing keys are named
    old = store.timeout
    store.timeout = SHORT
    with pytest.raises(StoreTimeoutError, match="still-missing"):
        store.wait(["still-missing"])
    store.timeout = old
    # bad input
    with pytest.raises(InvalidArgumentError, match="key must be str"):
        store.set(3, b"x")  # type: ignore[arg-type]  # a bad argument on purpose
    with pytest.raises(InvalidArgumentError, match="bytes or str"):
        store.set("k", 3)  # type: ignore[arg-type]  # a bad argument on purpose
    with pytest.raises(InvalidArgumentError, match="sequence of str"):
        store.wait("cs", SHORT)  # type: ignore[arg-type]  # a bad argument on purpose
    with pytest.raises(InvalidArgumentError, match="timeout"):
        store.get("cs", timeout=-1)


# ---------------------------------------------------------------------- TCPStore
def _host_master(out: mp.Queue) -> None:
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=SAFE)
    store.set("alive", b"1")
    out.put(store.port)
    threading.Event().wait(SAFE)  # until the test kills this process


def test_tcpstore_server_death_and_limits(tmp_path) -> None:
    # the server process is killed while a client is blocked in get(): StoreError
    out = CTX.Queue()
    proc = CTX.Process(target=_host_master, args=(out,), daemon=True)
    proc.start()
    port = out.get(timeout=SAFE)
    client = TCPStore("127.0.0.1", port, timeout=SAFE)
    assert client.get("alive") == b"1"
    errors: queue.Queue[BaseException | None] = queue.Queue()

    def blocked_get() -> None:
        try:
            client.get("never", timeout=SAFE)
            errors.put(None)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.put(exc)

    t = threading.Thread(target=blocked_get, daemon=True)
    t.start()
    proc.kill()
    proc.join(SAFE)
    exc = errors.get(timeout=SAFE)
    assert isinstance(exc, StoreError) and "lost the connection" in str(exc)
    with pytest.raises(StoreError):
        client.set("x", b"1")
    client.close()

    # the master closing (in-process) while a client waits: StoreError too
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=SAFE)
    master.close_grace = 0
    other = TCPStore("127.0.0.1", master.port, timeout=SAFE)
    t = threading.Thread(target=blocked_get, daemon=True)
    client = other
    t.start()
    master.close()
    assert isinstance(errors.get(timeout=SAFE), StoreError)
    other.close()

    # a master waiting for workers that never come; a client with no server
    with pytest.raises(StoreTimeoutError, match="1 of 2 connected"):
        TCPStore("127.0.0.1", 0, world_size=2, is_master=True, timeout=SHORT)
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    dead_port = free.getsockname()[1]
    free.close()
    with pytest.raises(StoreTimeoutError, match=f"127.0.0.1:{dead_port}"):
        TCPStore("127.0.0.1", dead_port, timeout=SHORT)
    for bad, msg in [
        (dict(host="h", port=70000), "port"),
        (dict(host="h", port=0), "real port"),
        (dict(host="", port=5), "host"),
        (dict(host="h", port=5, world_size=0), "world_size"),
    ]:
        with pytest.raises(InvalidArgumentError, match=msg):
            TCPStore(**bad)  # type: ignore[arg-type]  # bad arguments on purpose


def test_tcpstore_many_clients() -> None:
    """The one server thread serves many clients; blocked gets do not stall the others."""
    n = 40
    master = TCPStore("127.0.0.1", 0, world_size=n + 1, is_master=True, timeout=SAFE,
                      wait_for_workers=False)
    clients = [TCPStore("127.0.0.1", master.port, timeout=SAFE) for _ in range(n)]
    results: queue.Queue[bytes | BaseException] = queue.Queue()

    def waiter(c: TCPStore, i: int) -> None:
        try:
            c.set(f"in/{i}", b"")
            results.put(c.get("release", SAFE) + str(i).encode())
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            results.put(exc)

    threads = [threading.Thread(target=waiter, args=(c, i), daemon=True)
               for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    # while all n clients are parked in get(), the master is still served
    master.wait([f"in/{i}" for i in range(n)], SAFE)
    master.set("release", b"r")
    got = sorted(results.get(timeout=SAFE) for _ in range(n))  # type: ignore[type-var]  # bytes, or the exception the assert shows
    assert got == sorted(b"r" + str(i).encode() for i in range(n))
    for c in clients:
        c.close()
    master.close()


# ---------------------------------------------------------------------- FileStore
def test_filestore_lifetime_and_threads(tmp_path) -> None:
    path = str(tmp_path / "fs")
    a, b = FileStore(path, world_size=2, timeout=SAFE), FileStore(path, world_size=2)
    # one FileStore object shared by threads
    threads = [threading.Thread(target=lambda: [a.add("n") for _ in range(50)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(SAFE)
    assert b.add("n", 0) == 200
    assert b.num_keys() == 1  # bookkeeping keys are hidden
    a.close()
    assert os.path.exists(path)  # one of world_size=2 users still open
    b.close()
    assert not os.path.exists(path)  # the last of 2 users removed it
    # without world_size: removed when the last open user closes
    c = FileStore(path)
    c.set("k", b"v")
    d = FileStore(path)
    assert d.get("k", SAFE) == b"v"
    c.close()
    assert os.path.exists(path)
    d.close()
    assert not os.path.exists(path)
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        FileStore(str(tmp_path / "no" / "such" / "dir"))
    with pytest.raises(StoreError, match="closed"):
        d.get("k", SHORT)


def test_prefixstore_isolation() -> None:
    base = HashStore(timeout=SAFE)
    a, b = PrefixStore("a", base), PrefixStore("b", base)
    a.set("k", b"1")
    b.set("k", b"2")
    assert (a.get("k"), b.get("k"), base.get("a/k")) == (b"1", b"2", b"1")
    assert not a.check(["only-b"]) and b.add("only-b") == 1 and not a.check(["only-b"])
    with pytest.raises(StoreTimeoutError, match="prefix 'a'"):
        a.get("only-b", SHORT)
    a.close()  # does not own base
    assert b.get("k") == b"2"
    with pytest.raises(StoreError):
        a.get("k")
    with pytest.raises(InvalidArgumentError, match="procgroup Store"):
        PrefixStore("x", object())  # type: ignore[arg-type]  # a bad argument on purpose
