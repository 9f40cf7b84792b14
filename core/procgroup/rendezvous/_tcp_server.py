"""The TCPStore server: one daemon thread, selectors, serving every client.

Blocking ``get``/``wait`` are parked server-side and answered as soon as the keys
appear or their deadline passes, so clients never poll.

Every connection first runs the job-token handshake (:class:`procgroup._auth.ServerHandshake`,
purpose ``b"store"``) as a small state machine: until it succeeds the server reads only
the fixed-size handshake reply, and a connection that does not finish it within
:attr:`StoreServer.handshake_timeout` is dropped. After it, requests are parsed by a
bounded :class:`._wire.FrameReader`; anything a client sends that breaks the protocol
(unknown op, wrong field count, bad timeout, undecodable key) closes that one
connection with one log line, and the server and every other client go on.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import math
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

from procgroup import _auth
from procgroup._settings import MAX_TIMEOUT_S
from procgroup.errors import StoreError

from . import _wire
from ._store import compare_set_value
from ._wire import Op, Status

logger = logging.getLogger(__name__)

PURPOSE = b"store"
#: The longest the selector sleeps at once (epoll overflows near 2.1e6 s).
MAX_SELECT_S = 60.0
#: Fields per request kind: (fewest, most); None: no upper bound but MAX_FIELDS.
_ARITY = {
    _wire.Op.SET: (2, 2), _wire.Op.GET: (2, 2), _wire.Op.ADD: (2, 2), _wire.Op.WAIT: (1, None),
    _wire.Op.CHECK: (0, None), _wire.Op.COMPARE_SET: (3, 3), _wire.Op.DELETE: (1, 1),
    _wire.Op.NUM_KEYS: (0, 0), _wire.Op.HELLO: (0, 0), _wire.Op.WAIT_WORKERS: (2, 2),
    _wire.Op.PING: (0, 0),
}


class _Violation(Exception):
    """A request that breaks the protocol: the connection is closed."""


@dataclass
class _Conn:
    sock: socket.socket
    peer: str
    handshake: _auth.ServerHandshake | None  # None once authenticated
    hs_deadline: float
    reader: _wire.FrameReader
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)
    waiting: _Waiter | None = None
    held: int = 0  # bytes of values this connection put in the store and still there
    closing: bool = False  # refused: close once the verdict is sent
    queue: list = field(default_factory=list)  # parsed requests behind a blocking one


@dataclass
class _Waiter:
    conn: _Conn
    keys: list[str]
    deadline: float
    reply_value: bool  # GET answers with the value, WAIT with an empty OK
    workers: int = 0  # > 0: a WAIT_WORKERS waiter


def _listen(host: str | None, port: int) -> tuple[socket.socket, str | None]:
    """A listening socket on ``host``'s address when it is one of this machine's
    (loopback stays loopback), else on every interface; returns (socket, bound address)."""
    candidates: list[tuple[socket.AddressFamily, str]] = []
    if host:
        literal = True
        try:
            ipaddress.ip_address(host.split("%")[0])
        except ValueError:
            literal = False
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror:
            infos = []
        for family, _, _, _, sa in infos:
            ip = str(sa[0])
            # a host name that resolves to loopback here (Debian's 127.0.1.1 line) may
            # mean another address on the other hosts: then listen everywhere
            if not literal and host != "localhost" and ipaddress.ip_address(ip.split("%")[0]).is_loopback:
                continue
            if (family, ip) not in candidates:
                candidates.append((family, ip))
    for address_family, ip in candidates:
        try:
            sock = socket.create_server((ip, port), family=address_family, backlog=1024)
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                continue  # not an address of this machine
            raise
        return sock, ip
    if host:
        logger.debug("TCPStore: %r is not an address of this host; listening on every interface", host)
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=1024), None
    return socket.create_server(("", port), backlog=1024), None


class StoreServer:
    """Serves the key space on ``port`` (0: a free one), to clients holding ``key``.

    ``host``: the address the job reaches the store at; when it is this machine's, the
    server listens there only (else on every interface).
    """

    #: Seconds an unauthenticated connection gets to finish the handshake.
    handshake_timeout: float = _auth.HANDSHAKE_TIMEOUT_S

    def __init__(self, port: int, key: bytes | None = None, host: str | None = None) -> None:
        try:
            self._lsock, self.bound = _listen(host, port)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise StoreError(
                    f"TCPStore: cannot listen on port {port}: it is in use; a different job "
                    f"holds this port (or another program does): give this job its own "
                    f"MASTER_PORT"
                ) from exc
            raise StoreError(f"TCPStore: cannot listen on port {port}: {exc}") from exc
        self.key = key if key is not None else _auth.job_key(None)
        self.max_value = _wire.max_value_bytes()
        self.max_client = _wire.max_client_bytes()
        self.port: int = self._lsock.getsockname()[1]
        self.family = self._lsock.family
        self._lsock.setblocking(False)
        self._data: dict[str, bytes] = {}
        self._owner: dict[str, _Conn] = {}  # key -> the connection whose value it holds
        self._pending: list[_Conn] = []  # connections still in the handshake
        self._waiters: list[_Waiter] = []
        self._hellos = 0
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._lsock, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._stopping = False
        self._live = 0  # client connections open now
        self._idle = threading.Condition()
        self._thread = threading.Thread(
            target=self._run, name=f"procgroup-TCPStore-{self.port}", daemon=True
        )
        self._thread.start()
        logger.debug("TCPStore server listening on %s port %d", self.bound or "every interface", self.port)

    # ---------------------------------------------------------------- lifecycle
    def stop(self) -> None:
        """Stop serving; every client connection is closed (clients get StoreError)."""
        if self._stopping:
            return
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no client is connected (or ``timeout``); True if idle."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._live > 0:
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping:
                    return False
                self._idle.wait(left)
            return True

    def _run(self) -> None:
        try:
            while not self._stopping:
                events = self._sel.select(self._next_timeout())
                for key, mask in events:
                    if key.data is None:
                        self._accept()
                    elif key.data == "wake":
                        self._wake_r.recv(4096)
                    else:
                        self._service_safely(key.data, mask)
                self._expire()
        except Exception:
            logger.exception("TCPStore server on port %d crashed", self.port)
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        for key in list(self._sel.get_map().values()):
            try:
                key.fileobj.close()  # type: ignore[union-attr]  # every registered object is a socket
            except OSError:
                pass
        self._sel.close()
        self._wake_w.close()
        logger.debug("TCPStore server on port %d stopped", self.port)

    # ---------------------------------------------------------------- sockets
    def _accept(self) -> None:
        while True:
            try:
                sock, addr = self._lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: log and keep serving the others
                logger.warning("TCPStore accept failed: %s", exc)
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hs = _auth.ServerHandshake(self.key, PURPOSE)
            conn = _Conn(sock, f"{addr[0]}:{addr[1]}", hs, time.monotonic() + self.handshake_timeout,
                         _wire.FrameReader(self.max_value))
            self._sel.register(sock, selectors.EVENT_READ, conn)
            self._pending.append(conn)
            with self._idle:
                self._live += 1
            conn.outbuf += hs.greeting()
            self._flush(conn)

    def _drop(self, conn: _Conn) -> None:
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            return  # already dropped
        conn.sock.close()
        if conn in self._pending:
            self._pending.remove(conn)
        with self._idle:
            self._live -= 1
            self._idle.notify_all()
        if conn.waiting is not None:
            if conn.waiting in self._waiters:
                self._waiters.remove(conn.waiting)
            conn.waiting = None
        conn.queue.clear()

    def _service_safely(self, conn: _Conn, mask: int) -> None:
        try:
            self._service(conn, mask)
        except Exception:
            logger.exception("TCPStore: request from %s failed; closing that connection", conn.peer)
            self._drop(conn)

    def _service(self, conn: _Conn, mask: int) -> None:
        if mask & selectors.EVENT_READ:
            # before the handshake: read the fixed-size reply and not a byte more
            want = _auth.REPLY_BYTES - len(conn.inbuf) if conn.handshake is not None else 1 << 20
            try:
                chunk = conn.sock.recv(want) if want > 0 and not conn.closing else None
            except (BlockingIOError, InterruptedError):
                chunk = None
            except OSError:
                self._drop(conn)
                return
            if chunk == b"":
                if conn.handshake is not None and not conn.closing:
                    logger.info("TCPStore: %s closed the connection before authenticating", conn.peer)
                self._drop(conn)
                return
            if chunk:
                if conn.handshake is not None:
                    conn.inbuf += chunk
                    self._authenticate(conn)
                else:
                    self._receive(conn, chunk)
        if mask & selectors.EVENT_WRITE and conn.sock.fileno() >= 0:
            self._flush(conn)

    def _authenticate(self, conn: _Conn) -> None:
        assert conn.handshake is not None
        if len(conn.inbuf) < _auth.REPLY_BYTES:
            return
        ok, answer = conn.handshake.verdict(bytes(conn.inbuf))
        conn.inbuf.clear()
        conn.handshake = None
        if conn in self._pending:
            self._pending.remove(conn)
        if not ok:
            logger.warning("TCPStore: refused a connection from %s: it does not hold this job's "
                           "token (another job, or a stranger)", conn.peer)
            conn.closing = True
        conn.outbuf += answer
        self._flush(conn)

    def _receive(self, conn: _Conn, chunk: bytes) -> None:
        try:
            conn.queue.extend(conn.reader.feed(chunk))
        except _wire.FrameError as exc:
            self._violation(conn, str(exc))
            return
        if conn.waiting is not None and len(conn.queue) > 64:
            self._violation(conn, f"{len(conn.queue)} requests sent behind a blocking one")
            return
        self._process(conn)

    def _violation(self, conn: _Conn, why: str) -> None:
        logger.warning("TCPStore: closing the connection from %s: %s", conn.peer, why)
        self._drop(conn)

    def _send(self, conn: _Conn, code: int, fields: list[bytes]) -> None:
        conn.outbuf += _wire.encode(code, fields)
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        if conn.sock.fileno() < 0:
            return
        try:
            while conn.outbuf:
                n = conn.sock.send(conn.outbuf)
                del conn.outbuf[:n]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._drop(conn)
            return
        if conn.closing and not conn.outbuf:
            try:
                conn.sock.shutdown(socket.SHUT_WR)  # the refusal reaches the peer before EOF
            except OSError:
                pass
            self._drop(conn)
            return
        if conn.closing:
            want = selectors.EVENT_WRITE
        else:
            want = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbuf else 0)
        self._sel.modify(conn.sock, want, conn)

    # ---------------------------------------------------------------- requests
    def _process(self, conn: _Conn) -> None:
        while conn.waiting is None and conn.queue and conn.sock.fileno() >= 0:
            code, fields, error = conn.queue.pop(0)
            if error is not None:
                self._send(conn, Status.ERROR, [f"limit: {error}".encode()])
                continue
            try:
                self._handle(conn, code, fields)
            except _Violation as exc:
                self._violation(conn, str(exc))
                return
            except (ValueError, IndexError, UnicodeDecodeError) as exc:
                self._violation(conn, f"malformed {Op(code).name} request: {exc}")
                return

    @staticmethod
    def _timeout(raw: bytes) -> float:
        if len(raw) != _wire.DOUBLE.size:
            raise _Violation(f"a timeout field of {len(raw)} bytes (expected {_wire.DOUBLE.size})")
        (t,) = _wire.DOUBLE.unpack(raw)
        if not (math.isfinite(t) and 0 <= t <= MAX_TIMEOUT_S):
            raise _Violation(f"bad timeout {t!r} s (must be finite, in 0..{MAX_TIMEOUT_S:g})")
        return t

    @staticmethod
    def _number(raw: bytes, what: str) -> int:
        if not 0 < len(raw) <= 24:
            raise _Violation(f"a {what} field of {len(raw)} bytes")
        return int(raw.decode("ascii"))

    def _store(self, conn: _Conn, key: str, value: bytes) -> bool:
        """Put ``value``, charging it to ``conn``; False (and an error reply) over its cap."""
        old_owner = self._owner.get(key)
        old = len(self._data[key]) if key in self._data else 0
        refund = old if old_owner is conn else 0
        if conn.held - refund + len(value) > self.max_client:
            self._send(conn, Status.ERROR, [(
                f"limit: this client would hold {conn.held - refund + len(value)} bytes of values "
                f"in the store, over {_wire.ENV_MAX_CLIENT}={self.max_client}").encode()])
            return False
        if old_owner is not None:
            old_owner.held -= old
        self._data[key] = value
        self._owner[key] = conn
        conn.held += len(value)
        return True

    def _forget(self, key: str) -> None:
        owner = self._owner.pop(key, None)
        value = self._data.pop(key, None)
        if owner is not None and value is not None:
            owner.held -= len(value)

    def _handle(self, conn: _Conn, code: int, f: list[bytes]) -> None:
        op = Op(code)
        fewest, most = _ARITY[op]
        if len(f) < fewest or (most is not None and len(f) > most):
            raise _Violation(f"a {op.name} request with {len(f)} fields")
        if op is Op.SET:
            if not self._store(conn, f[0].decode(), f[1]):
                return
            self._send(conn, Status.OK, [])
            self._changed()
        elif op is Op.GET or op is Op.WAIT:
            timeout = self._timeout(f[1] if op is Op.GET else f[0])
            keys = [f[0].decode()] if op is Op.GET else [k.decode() for k in f[1:]]
            w = _Waiter(conn, keys, time.monotonic() + timeout, op is Op.GET)
            if not self._try_answer(w):
                conn.waiting = w
                self._waiters.append(w)
        elif op is Op.ADD:
            key = f[0].decode()
            amount = self._number(f[1], "amount")
            old = self._data.get(key)
            try:
                start = int(old.decode("ascii")) if old is not None else 0
            except ValueError:
                held = old[:40] if old is not None else b""
                self._send(conn, Status.ERROR, [
                    f"Store.add: key {key!r} holds {held!r}, which is not an integer "
                    "counter".encode()
                ])
                return
            new = str(start + amount).encode("ascii")
            if not self._store(conn, key, new):
                return
            self._send(conn, Status.OK, [new])
            self._changed()
        elif op is Op.CHECK:
            ok = all(k.decode() in self._data for k in f)
            self._send(conn, Status.OK, [b"1" if ok else b"0"])
        elif op is Op.COMPARE_SET:
            key = f[0].decode()
            stored, changed = compare_set_value(self._data.get(key), f[1], f[2])
            if changed and not self._store(conn, key, stored):
                return
            self._send(conn, Status.OK, [stored])
            if changed:
                self._changed()
        elif op is Op.DELETE:
            key = f[0].decode()
            existed = key in self._data
            self._forget(key)
            self._send(conn, Status.OK, [b"1" if existed else b"0"])
        elif op is Op.NUM_KEYS:
            self._send(conn, Status.OK, [str(len(self._data)).encode()])
        elif op is Op.HELLO:
            self._hellos += 1
            self._send(conn, Status.OK, [])
            self._changed()
        elif op is Op.WAIT_WORKERS:
            timeout = self._timeout(f[1])
            workers = self._number(f[0], "worker count")
            if workers < 1:
                raise _Violation(f"WAIT_WORKERS for {workers} workers")
            w = _Waiter(conn, [], time.monotonic() + timeout, False, workers=workers)
            if not self._try_answer(w):
                conn.waiting = w
                self._waiters.append(w)
        elif op is Op.PING:
            self._send(conn, Status.OK, [])

    def _try_answer(self, w: _Waiter) -> bool:
        if w.workers:
            if self._hellos < w.workers:
                return False
            self._send(w.conn, Status.OK, [str(self._hellos).encode()])
            return True
        if not all(k in self._data for k in w.keys):
            return False
        self._send(w.conn, Status.OK, [self._data[w.keys[0]]] if w.reply_value else [])
        return True

    def _resume(self, w: _Waiter) -> None:
        if w in self._waiters:
            self._waiters.remove(w)
        w.conn.waiting = None
        self._process(w.conn)  # requests that queued behind the blocking one

    def _changed(self) -> None:
        for w in list(self._waiters):
            if w in self._waiters and self._try_answer(w):
                self._resume(w)

    def _next_timeout(self) -> float:
        deadlines = [w.deadline for w in self._waiters] + [c.hs_deadline for c in self._pending]
        if not deadlines:
            return MAX_SELECT_S
        return min(MAX_SELECT_S, max(0.0, min(deadlines) - time.monotonic()))

    def _expire(self) -> None:
        now = time.monotonic()
        for conn in [c for c in self._pending if c.hs_deadline <= now]:
            logger.warning("TCPStore: dropped a connection from %s that did not authenticate "
                           "within %gs", conn.peer, self.handshake_timeout)
            self._drop(conn)
        for w in list(self._waiters):
            if w in self._waiters and w.deadline <= now:
                if w.workers:
                    fields = [str(self._hellos).encode()]
                else:
                    fields = [k.encode() for k in w.keys if k not in self._data]
                self._send(w.conn, Status.TIMEOUT, fields)
                self._resume(w)
