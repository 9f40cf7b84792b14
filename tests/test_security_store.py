"""The store and rendezvous against strangers: tokens, impostors, fuzzed frames, caps.

Real sockets and real processes, no mocks. Every blocking call has a timeout; no test
asserts on how long something took. The fuzzing uses a seeded generator, so a failure
replays exactly (the seed is in the test id).
"""

from __future__ import annotations

import logging
import math
import os
import random
import signal
import socket
import stat
import struct
import tempfile
import threading
import time

import pytest
from procgroup import _auth
from procgroup.errors import (
    AuthenticationError,
    InvalidArgumentError,
    ProcGroupError,
    RendezvousError,
    StoreError,
)
from procgroup.rendezvous import TCPStore, _wire, rendezvous
from procgroup.rendezvous._tcp_server import PURPOSE
from procgroup.rendezvous._wire import Op, Status

TOKEN = "s3cret-token-of-this-job"
KEY = _auth.job_key(TOKEN)
IO_TIMEOUT = 30.0  # bound on every blocking socket call of a test


# ------------------------------------------------------------------------ helpers
@pytest.fixture
def server():
    """A job's store (master) holding TOKEN; yields it, checks it survived, closes it."""
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=60, job_key=KEY)
    store.close_grace = 0
    yield store
    assert store._server is not None and store._server._thread.is_alive(), "the store server died"
    store.close()


def raw_connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT)
    sock.settimeout(IO_TIMEOUT)
    return sock


def authed(port: int, key: bytes = KEY) -> socket.socket:
    """A raw connection that passed the handshake (a member speaking frames by hand)."""
    sock = raw_connect(port)
    _auth.client_handshake(sock, key, PURPOSE, "test store", IO_TIMEOUT)
    sock.settimeout(IO_TIMEOUT)
    return sock


def recv_upto(sock: socket.socket, n: int) -> bytes:
    """Up to ``n`` bytes, fewer when the peer closes first (the tests look at what came;
    procgroup's own reader is ``procgroup.backend.recv_exact``)."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def closed_by_peer(sock: socket.socket) -> bool:
    """True when the server closed ``sock`` (EOF or reset), reading what is left."""
    try:
        while True:
            chunk = sock.recv(1 << 16)
            if not chunk:
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def request(sock: socket.socket, op: int, fields: list[bytes]) -> tuple[int, list[bytes]]:
    sock.sendall(_wire.encode(op, fields))
    return _wire.recv_message(sock)


def still_serves(port: int) -> None:
    """A good client of the job can still do everything (the server and others go on)."""
    c = TCPStore("127.0.0.1", port, timeout=IO_TIMEOUT, job_key=KEY)
    try:
        c.set("health", b"ok")
        assert c.get("health", timeout=IO_TIMEOUT) == b"ok"
        assert c.add("health/n", 1) >= 1
    finally:
        c.close()


# ------------------------------------------------------------------------ strangers
def test_client_without_token_is_refused_and_job_goes_on(server, caplog):
    member = TCPStore("127.0.0.1", server.port, timeout=IO_TIMEOUT, job_key=KEY)
    member.set("k", b"v")
    with caplog.at_level(logging.WARNING, logger="procgroup.rendezvous._tcp_server"):
        with pytest.raises(AuthenticationError, match="different job holds this port|wrong PROCGROUP_JOB_TOKEN"):
            TCPStore("127.0.0.1", server.port, timeout=IO_TIMEOUT)  # no token
        with pytest.raises(AuthenticationError):
            TCPStore("127.0.0.1", server.port, timeout=IO_TIMEOUT, token="a wrong token")
    refusals = [r for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(refusals) == 2  # one log line per stranger
    assert member.get("k", timeout=IO_TIMEOUT) == b"v"  # the job is unaffected
    member.close()
    still_serves(server.port)


def test_raw_frames_before_the_handshake_are_not_requests(server):
    """An impostor speaking the store protocol straight away gets a refusal, nothing set."""
    sock = raw_connect(server.port)
    greeting = recv_upto(sock, _auth.GREETING_BYTES)
    assert greeting.startswith(_auth.MAGIC)
    frame = _wire.encode(Op.SET, [b"procgroup/default/pwned", b"x" * 100])
    sock.sendall(frame)
    verdict = recv_upto(sock, _auth.VERDICT_BYTES)
    assert verdict[:1] == b"\0"
    assert closed_by_peer(sock)
    sock.close()
    assert not server.check(["procgroup/default/pwned"])
    still_serves(server.port)


def test_replayed_handshake_fails(server):
    """Record a member's handshake reply; sending it on a new connection must fail."""
    sock = raw_connect(server.port)
    hs = _auth.ClientHandshake(KEY, PURPOSE, "store")
    reply = hs.reply(recv_upto(sock, _auth.GREETING_BYTES))
    sock.sendall(reply)
    hs.check(recv_upto(sock, _auth.VERDICT_BYTES))  # the genuine one passes
    assert request(sock, Op.PING, [])[0] == Status.OK
    sock.close()
    for _ in range(3):
        replay = raw_connect(server.port)
        recv_upto(replay, _auth.GREETING_BYTES)  # a fresh nonce: the recorded reply is stale
        replay.sendall(reply)
        assert recv_upto(replay, _auth.VERDICT_BYTES)[:1] == b"\0"
        assert closed_by_peer(replay)
        replay.close()
    still_serves(server.port)


def test_handshake_for_another_purpose_fails(server):
    """A proof made for another kind of connection (a data channel) is no store proof."""
    sock = raw_connect(server.port)
    with pytest.raises(AuthenticationError):
        _auth.client_handshake(sock, KEY, b"tcp/g0", "store", IO_TIMEOUT)
    sock.close()
    still_serves(server.port)


def test_server_proof_is_checked_by_the_client():
    """A fake store that does not hold the token cannot pass itself off as the job's."""
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]

    def fake_server():
        conn, _ = lsock.accept()
        with conn:
            conn.settimeout(IO_TIMEOUT)
            conn.sendall(_auth.MAGIC + os.urandom(_auth.NONCE_BYTES))
            recv_upto(conn, _auth.REPLY_BYTES)
            conn.sendall(b"\1" + os.urandom(_auth.MAC_BYTES))  # "accepted", with a bogus proof
            recv_upto(conn, 1)

    t = threading.Thread(target=fake_server, daemon=True)
    t.start()
    with pytest.raises(AuthenticationError, match="could not prove"):
        TCPStore("127.0.0.1", port, timeout=IO_TIMEOUT, job_key=KEY)
    t.join(IO_TIMEOUT)
    lsock.close()


@pytest.mark.parametrize("behaviour", ["idle", "slow", "partial"])
def test_unauthenticated_connections_are_dropped_after_the_deadline(server, behaviour):
    server._server.handshake_timeout = 0.5
    sock = raw_connect(server.port)
    recv_upto(sock, _auth.GREETING_BYTES)
    if behaviour == "slow":
        sock.sendall(b"\1")
    elif behaviour == "partial":
        sock.sendall(b"\2" * (_auth.REPLY_BYTES - 1))
    assert closed_by_peer(sock)  # dropped by the server (bounded by IO_TIMEOUT)
    sock.close()
    still_serves(server.port)


def test_many_strangers_at_once(server):
    socks = []
    for i in range(50):
        s = raw_connect(server.port)
        s.sendall(os.urandom(i * 7))  # various prefixes of a reply, or more than one
        socks.append(s)
    still_serves(server.port)
    for s in socks:
        s.close()
    still_serves(server.port)


# ------------------------------------------------------------------------ two jobs
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_second_job_with_another_token_is_refused(server):
    with pytest.raises(AuthenticationError, match="a different job holds this port"):
        TCPStore("127.0.0.1", server.port, timeout=IO_TIMEOUT, token="job two")
    with pytest.raises(StoreError, match="a different job holds this port"):
        TCPStore("127.0.0.1", server.port, is_master=True, timeout=IO_TIMEOUT, token="job two")
    still_serves(server.port)


def _rdzv(results, key, url, rank, world_size, token=None, timeout=60):
    try:
        results[key] = rendezvous(url, rank=rank, world_size=world_size, timeout=timeout, token=token)
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        results[key] = exc


def test_second_job_on_the_port_never_gets_a_seat_with_tokens():
    port = _free_port()
    url = f"tcp://127.0.0.1:{port}"
    results: dict = {}
    first = threading.Thread(target=_rdzv, args=(results, "a0", url, 0, 2, "job one"))
    first.start()
    # the second job's rank 1 arrives while the first job still waits for its own rank 1
    _rdzv(results, "b1", url, 1, 2, "job two", timeout=20)
    assert isinstance(results["b1"], AuthenticationError), results["b1"]
    assert "a different job holds this port" in str(results["b1"])
    _rdzv(results, "a1", url, 1, 2, "job one")
    first.join(IO_TIMEOUT)
    a0, a1 = results["a0"], results["a1"]
    assert not isinstance(a0, BaseException) and not isinstance(a1, BaseException), (a0, a1)
    assert a0.job_key == a1.job_key == _auth.job_key("job one")
    a1.store.close()
    a0.store.close()


def test_second_job_without_tokens_is_told_the_port_is_taken(monkeypatch):
    """No token on loopback: the rank claims catch the second job, with a clear message."""
    monkeypatch.delenv(_auth.ENV_TOKEN, raising=False)
    port = _free_port()
    url = f"tcp://127.0.0.1:{port}"
    results: dict = {}
    threads = [threading.Thread(target=_rdzv, args=(results, f"a{r}", url, r, 2)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(IO_TIMEOUT)
    _rdzv(results, "b0", url, 0, 2, timeout=10)
    _rdzv(results, "b1", url, 1, 2, timeout=10)
    _rdzv(results, "c1", url, 1, 3, timeout=10)
    assert isinstance(results["b0"], StoreError) and "a different job holds this port" in str(results["b0"])
    assert isinstance(results["b1"], RendezvousError) and "a different job holds this port" in str(results["b1"])
    assert isinstance(results["c1"], RendezvousError) and "a different job holds this port" in str(results["c1"])
    for r in range(2):
        results[f"a{r}"].store.close()


_SECOND_JOB = """
import sys
from procgroup.rendezvous import rendezvous
try:
    rendezvous(sys.argv[1], rank=1, world_size=2, timeout=20)
    print("SEATED")
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def test_second_job_without_tokens_is_told_apart_by_the_launcher_job_id(monkeypatch):
    """No token, but a launcher's job id (two Slurm jobs on one node, one port): the
    second job's rank, arriving before the first job's own rank 1, gets no seat."""
    import subprocess
    import sys

    monkeypatch.delenv(_auth.ENV_TOKEN, raising=False)
    for name in _auth.JOB_ID_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "101")
    url = f"tcp://127.0.0.1:{_free_port()}"
    results: dict = {}
    first = threading.Thread(target=_rdzv, args=(results, "a0", url, 0, 2))
    first.start()
    env = {**os.environ, "SLURM_JOB_ID": "202"}
    second = subprocess.run([sys.executable, "-c", _SECOND_JOB, url], env=env, capture_output=True,
                            text=True, timeout=60)
    assert second.stdout.startswith("AuthenticationError"), (second.stdout, second.stderr[-2000:])
    assert "a different job holds this port" in second.stdout and "SLURM_JOB_ID" in second.stdout
    _rdzv(results, "a1", url, 1, 2)
    first.join(IO_TIMEOUT)
    a0, a1 = results["a0"], results["a1"]
    assert not isinstance(a0, BaseException) and not isinstance(a1, BaseException), (a0, a1)
    assert a0.job_key == a1.job_key != _auth.job_key(None)
    a1.store.close()
    a0.store.close()


# ------------------------------------------------------------------------ bad timeouts
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1.0, 1e300, 2.2e9, -0.5])
def test_bad_timeouts_over_the_wire_close_only_that_client(server, value):
    bystander = TCPStore("127.0.0.1", server.port, timeout=IO_TIMEOUT, job_key=KEY)
    for op, fields in ((Op.GET, [b"k", struct.pack("!d", value)]),
                       (Op.WAIT, [struct.pack("!d", value), b"k"]),
                       (Op.WAIT_WORKERS, [b"2", struct.pack("!d", value)])):
        sock = authed(server.port)
        sock.sendall(_wire.encode(op, fields))
        assert closed_by_peer(sock)
        sock.close()
    bystander.set("after", b"1")
    assert bystander.get("after", timeout=IO_TIMEOUT) == b"1"
    bystander.close()
    still_serves(server.port)


def test_truncated_timeout_field_closes_only_that_client(server):
    """The 23-byte frame that used to kill the server (a 2-byte timeout field)."""
    sock = authed(server.port)
    sock.sendall(_wire.encode(Op.GET, [b"k", b"\x00\x01"]))
    assert closed_by_peer(sock)
    sock.close()
    still_serves(server.port)


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0, 1e10])
def test_bad_timeouts_at_the_api(server, value):
    with pytest.raises(ValueError):
        server.get("k", timeout=value)
    with pytest.raises(ValueError):
        server.wait(["k"], timeout=value)
    with pytest.raises(ValueError):
        rendezvous("tcp://127.0.0.1:1", rank=0, world_size=1, timeout=value)


def test_huge_legal_timeouts_work(server):
    """Timeouts past epoll's limit (~2.1e6 s) up to the maximum are accepted and served."""
    c = TCPStore("127.0.0.1", server.port, timeout=IO_TIMEOUT, job_key=KEY)
    got: dict = {}

    def waiter():
        try:
            got["v"] = c.get("late", timeout=5e8)
        except BaseException as exc:  # noqa: BLE001 - checked by the test
            got["v"] = exc

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    server.set("late", b"here")
    t.join(IO_TIMEOUT)
    assert got.get("v") == b"here"
    c.close()
    results: dict = {}
    port = _free_port()
    url = f"tcp://127.0.0.1:{port}"
    threads = [threading.Thread(target=_rdzv, args=(results, r, url, r, 2, TOKEN, 3e6)) for r in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(IO_TIMEOUT)
    assert all(not isinstance(results[r], BaseException) for r in range(2)), results
    for r in (1, 0):
        results[r].store.close()


# ------------------------------------------------------------------------ caps
def test_value_and_client_caps(monkeypatch):
    monkeypatch.setenv(_wire.ENV_MAX_VALUE, "1000")
    monkeypatch.setenv(_wire.ENV_MAX_CLIENT, "5000")
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=IO_TIMEOUT, job_key=KEY)
    master.close_grace = 0
    try:
        with pytest.raises(InvalidArgumentError, match=_wire.ENV_MAX_VALUE):
            master.set("big", b"x" * 1001)
        master.set("ok", b"x" * 1000)
        # a client that does not check (a raw member): the server answers with the limit
        sock = authed(master.port)
        code, reply = request(sock, Op.SET, [b"big", b"y" * 50_000])
        assert code == Status.ERROR and _wire.ENV_MAX_VALUE.encode() in reply[0]
        assert request(sock, Op.PING, [])[0] == Status.OK  # still in step
        for i in range(5):
            code, _ = request(sock, Op.SET, [f"k{i}".encode(), b"z" * 1000])
            assert code == Status.OK
        code, reply = request(sock, Op.SET, [b"k5", b"z" * 1000])
        assert code == Status.ERROR and _wire.ENV_MAX_CLIENT.encode() in reply[0]
        code, _ = request(sock, Op.SET, [b"k0", b"w" * 1000])  # overwriting its own: same total
        assert code == Status.OK
        code, _ = request(sock, Op.DELETE, [b"k1"])
        code, _ = request(sock, Op.SET, [b"k5", b"z" * 1000])  # room again after a delete
        assert code == Status.OK
        code, reply = request(sock, Op.COMPARE_SET, [b"new", b"", b"q" * 2000])
        assert code == Status.ERROR
        sock.close()
        c = TCPStore("127.0.0.1", master.port, timeout=IO_TIMEOUT, job_key=KEY)
        c.set("other", b"x" * 1000)  # another client has its own allowance
        with pytest.raises(InvalidArgumentError):
            c.set("other", b"x" * 1001)
        c.close()
    finally:
        master.close()


def test_field_count_and_key_length_are_bounded(server):
    sock = authed(server.port)
    sock.sendall(struct.pack("!BI", Op.CHECK, _wire.MAX_FIELDS + 1))
    assert closed_by_peer(sock)
    sock.close()
    sock = authed(server.port)
    code, reply = request(sock, Op.GET, [b"k" * (_wire.MAX_KEY_BYTES + 1), struct.pack("!d", 1.0)])
    assert code == Status.ERROR and b"key limit" in reply[0]
    sock.close()
    # a header that claims an enormous field: the server skips it, never holds it
    sock = authed(server.port)
    sock.sendall(struct.pack("!BI", Op.SET, 2) + struct.pack("!Q", 1) + b"k" + struct.pack("!Q", 1 << 62))
    sock.sendall(os.urandom(1 << 20))
    conn = [c for c in server._server._sel.get_map().values()
            if hasattr(c.data, "reader") and c.data.reader._skip]
    sock.close()
    assert all(c.data.reader.buffered < (2 << 20) for c in conn)
    still_serves(server.port)


# ------------------------------------------------------------------------ fuzz
def _frame(rng: random.Random, legal: bool) -> tuple[int, list[bytes]]:
    """A request; ``legal``: well-formed values only, else any of the hostile ones too."""
    key = rng.choice([b"a", b"b", b"procgroup/x", b"c" * 100]) + bytes(rng.randrange(3))
    good_t = [0.0, 0.001]
    bad_t = [math.nan, math.inf, -math.inf, -1.0, 1e12, 1e300, -0.0]
    t = struct.pack("!d", rng.choice(good_t if legal else good_t + bad_t))
    amounts = [b"1", b"-5", b"12"] + ([] if legal else [b"x", b"9" * 40, b"", b"1e3", b"\xff"])
    workers = [b"1"] if legal else [b"0", b"-3", b"abc", b"99999999999999999999999999"]
    if not legal:
        key = rng.choice([key, b"\xff\xfe", b""])
    op = rng.choice(list(Op))
    fields = {
        Op.SET: [key, os.urandom(rng.randrange(64))],
        Op.GET: [key, t],
        Op.ADD: [b"n/" + key, rng.choice(amounts)],
        Op.WAIT: [t] + [key] * rng.randrange(3),
        Op.CHECK: [key] * rng.randrange(4),
        Op.COMPARE_SET: [key, b"", os.urandom(8)],
        Op.DELETE: [key],
        Op.NUM_KEYS: [],
        Op.HELLO: [],
        Op.WAIT_WORKERS: [rng.choice(workers), t],
        Op.PING: [],
    }[op]
    return int(op), fields


def _mutate(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        kind = rng.randrange(6)
        if kind == 0 and data:  # flip bytes
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 1:  # truncate
            del data[rng.randrange(len(data) + 1):]
        elif kind == 2:  # random op code
            if data:
                data[0] = rng.randrange(256)
        elif kind == 3 and len(data) >= 5:  # field count
            data[1:5] = struct.pack("!I", rng.choice([0, 1, 2, 3, 255, 1 << 20, (1 << 32) - 1]))
        elif kind == 4 and len(data) >= 13:  # a field length
            data[5:13] = struct.pack("!Q", rng.choice([0, 7, 1 << 16, 1 << 40, (1 << 64) - 1]))
        else:  # random garbage appended
            data += os.urandom(rng.randrange(32))
    return bytes(data)


def _count_replies(data: bytes) -> int:
    buf, n = bytearray(data), 0
    while True:
        msg = _wire.try_decode(buf)
        if msg is None:
            return n
        del buf[:msg[2]]
        n += 1


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fuzzed_frames_never_kill_the_server(server, seed, caplog):
    """Thousands of frames from authenticated clients: each client sends a run of legal
    requests and then hostile ones (mutated, illegal values, garbage); the server answers
    the legal ones, closes the client at the first bad one, never hangs a client, and
    after each client still serves a good one. No frame crashes the server."""
    rng = random.Random(seed)
    sent = answered = 0
    caplog.set_level(logging.ERROR, logger="procgroup.rendezvous._tcp_server")
    for conn_no in range(400):
        sock = authed(server.port)
        legal = rng.randrange(0, 30)
        try:
            for i in range(legal + rng.randrange(1, 6)):
                code, fields = _frame(rng, legal=i < legal)
                data = _wire.encode(code, fields)
                if i >= legal and rng.random() < 0.6:
                    data = _mutate(rng, data)
                sent += 1
                sock.sendall(data)
        except OSError:
            pass  # the server closed this client: expected after a bad frame
        replies = b""
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # already closed by the server
        try:  # let the server read everything sent, then see it close its side
            while True:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                replies += chunk
        except ConnectionResetError:
            pass
        except TimeoutError:
            raise AssertionError("the server left a fuzzing client hanging") from None
        finally:
            sock.close()
        answered += _count_replies(replies)
        if conn_no % 20 == 0:
            still_serves(server.port)
    still_serves(server.port)
    assert sent > 5000 and answered > 1500, (sent, answered)  # replies behind a close may be lost to RST
    crashes = [r for r in caplog.records if "crashed" in r.getMessage() or "failed; closing" in r.getMessage()]
    assert not crashes, [r.getMessage() for r in crashes]


def test_fuzzed_handshake_bytes_never_admit(server):
    rng = random.Random(7)
    for _ in range(300):
        sock = raw_connect(server.port)
        recv_upto(sock, _auth.GREETING_BYTES)
        sock.sendall(bytes(rng.randrange(256) for _ in range(_auth.REPLY_BYTES)))
        verdict = recv_upto(sock, _auth.VERDICT_BYTES)
        assert verdict[:1] in (b"\0", b"")
        sock.close()
    still_serves(server.port)


# ------------------------------------------------------------------------ file://
def test_file_rendezvous_token_in_a_0600_file(monkeypatch):
    monkeypatch.delenv(_auth.ENV_TOKEN, raising=False)
    d = tempfile.mkdtemp()
    os.chmod(d, 0o755)  # a directory strangers can enter: only the file's mode protects it
    path = os.path.join(d, "rdzv")
    url = f"file://{path}"
    results: dict = {}
    # rank 0 waits for rank 1: the file exists until every rank has arrived
    first = threading.Thread(target=_rdzv, args=(results, 0, url, -1, 2))
    first.start()
    deadline = time.monotonic() + IO_TIMEOUT
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600

    # a stranger (another user) cannot read the file, so cannot join or learn the token
    if os.getuid() == 0:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 3
            try:
                signal.alarm(30)  # forked from a threaded process: never hang the suite
                os.setgid(65534)
                os.setuid(65534)
                try:
                    rendezvous(url, world_size=2, timeout=5)
                    code = 1
                except (StoreError, PermissionError, ProcGroupError):
                    code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    second = threading.Thread(target=_rdzv, args=(results, 1, url, -1, 2))
    second.start()
    for t in (first, second):
        t.join(IO_TIMEOUT)
    r0, r1 = results[0], results[1]
    assert not isinstance(r0, BaseException) and not isinstance(r1, BaseException), (r0, r1)
    assert r0.job_key == r1.job_key and r0.job_key != _auth.job_key(None)
    token = r0.store.get("rdzv/token")  # the ranks keep the file open after its removal
    assert _auth.job_key(token) == r0.job_key
    assert not os.path.exists(path), "removed once every rank arrived (the 2017 behaviour)"
    # an explicit token wins over the file's
    r0.store.close()
    r1.store.close()
    results.clear()
    threads = [threading.Thread(target=_rdzv, args=(results, r, url, r, 2, "given")) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(IO_TIMEOUT)
    assert results[0].job_key == results[1].job_key == _auth.job_key("given")
    for r in range(2):
        results[r].store.close()


def test_env_token_is_the_job_key(monkeypatch):
    monkeypatch.setenv(_auth.ENV_TOKEN, "from-env")
    port = _free_port()
    results: dict = {}
    url = f"tcp://127.0.0.1:{port}"
    threads = [threading.Thread(target=_rdzv, args=(results, r, url, r, 2)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(IO_TIMEOUT)
    assert results[0].job_key == results[1].job_key == _auth.job_key("from-env")
    with pytest.raises(AuthenticationError):
        TCPStore("127.0.0.1", port, timeout=IO_TIMEOUT, token="not-from-env")
    for r in (1, 0):
        results[r].store.close()


# ------------------------------------------------------------------------ bind address
def test_store_listens_only_where_asked():
    s = TCPStore("127.0.0.1", 0, is_master=True, timeout=IO_TIMEOUT, job_key=KEY)
    s.close_grace = 0
    try:
        assert s._server._lsock.getsockname()[0] == "127.0.0.1"
    finally:
        s.close()
    s = TCPStore("localhost", 0, is_master=True, timeout=IO_TIMEOUT, job_key=KEY)
    s.close_grace = 0
    try:
        assert s._server._lsock.getsockname()[0] in ("127.0.0.1", "::1")
    finally:
        s.close()
    # an address of another machine: every interface (the handshake guards it)
    s = TCPStore("192.0.2.1", 0, is_master=True, timeout=IO_TIMEOUT, job_key=KEY)
    s.close_grace = 0
    try:
        assert s._server.bound is None
        still_serves(s.port)
    finally:
        s.close()
