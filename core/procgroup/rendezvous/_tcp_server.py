"""The TCPStore server: one daemon thread, selectors, serving every client.

Blocking ``get``/``wait`` are parked server-side and answered as soon as the keys
appear or their deadline passes, so clients never poll.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

from procgroup.errors import StoreError

from . import _wire
from ._store import compare_set_value
from ._wire import Op, Status

logger = logging.getLogger(__name__)


@dataclass
class _Conn:
    sock: socket.socket
    peer: str
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)
    waiting: "_Waiter | None" = None


@dataclass
class _Waiter:
    conn: _Conn
    keys: list[str]
    deadline: float
    reply_value: bool  # GET answers with the value, WAIT with an empty OK
    workers: int = 0  # > 0: a WAIT_WORKERS waiter


class StoreServer:
    """Listens on ``port`` (0: a free one) on every interface and serves the key space."""

    def __init__(self, port: int) -> None:
        try:
            if socket.has_dualstack_ipv6():
                self._lsock = socket.create_server(
                    ("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=1024
                )
            else:
                self._lsock = socket.create_server(("", port), backlog=1024)
        except OSError as exc:
            raise StoreError(f"TCPStore: cannot listen on port {port}: {exc}") from exc
        self.port: int = self._lsock.getsockname()[1]
        self.family = self._lsock.family
        self._lsock.setblocking(False)
        self._data: dict[str, bytes] = {}
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
        logger.debug("TCPStore server listening on port %d", self.port)

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
                        self._service(key.data, mask)
                self._expire()
        except Exception:  # noqa: BLE001 - a server bug must not pass silently
            logger.exception("TCPStore server on port %d crashed", self.port)
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        for key in list(self._sel.get_map().values()):
            try:
                key.fileobj.close()  # type: ignore[union-attr]
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
            conn = _Conn(sock, f"{addr[0]}:{addr[1]}")
            self._sel.register(sock, selectors.EVENT_READ, conn)
            with self._idle:
                self._live += 1

    def _drop(self, conn: _Conn) -> None:
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            return  # already dropped
        conn.sock.close()
        with self._idle:
            self._live -= 1
            self._idle.notify_all()
        if conn.waiting is not None:
            self._waiters.remove(conn.waiting)
            conn.waiting = None

    def _service(self, conn: _Conn, mask: int) -> None:
        if mask & selectors.EVENT_READ:
            try:
                chunk = conn.sock.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                chunk = None
            except OSError:
                self._drop(conn)
                return
            if chunk == b"":
                self._drop(conn)
                return
            if chunk:
                conn.inbuf += chunk
                self._process(conn)
        if mask & selectors.EVENT_WRITE:
            self._flush(conn)

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
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbuf else 0)
        self._sel.modify(conn.sock, want, conn)

    # ---------------------------------------------------------------- requests
    def _process(self, conn: _Conn) -> None:
        while conn.waiting is None and conn.sock.fileno() >= 0:
            try:
                msg = _wire.try_decode(conn.inbuf)
            except ValueError as exc:
                logger.warning("TCPStore: malformed request from %s: %s", conn.peer, exc)
                self._drop(conn)
                return
            if msg is None:
                return
            code, fields, used = msg
            del conn.inbuf[:used]
            try:
                self._handle(conn, code, fields)
            except (ValueError, IndexError, UnicodeDecodeError) as exc:
                self._send(conn, Status.ERROR, [f"bad request: {exc}".encode()])

    def _handle(self, conn: _Conn, code: int, f: list[bytes]) -> None:
        op = Op(code)
        if op is Op.SET:
            self._data[f[0].decode()] = f[1]
            self._send(conn, Status.OK, [])
            self._changed()
        elif op is Op.GET or op is Op.WAIT:
            timeout = _wire.DOUBLE.unpack(f[1] if op is Op.GET else f[0])[0]
            keys = [f[0].decode()] if op is Op.GET else [k.decode() for k in f[1:]]
            w = _Waiter(conn, keys, time.monotonic() + timeout, op is Op.GET)
            if not self._try_answer(w):
                conn.waiting = w
                self._waiters.append(w)
        elif op is Op.ADD:
            key = f[0].decode()
            amount = int(f[1])  # a bad amount is a bad request (ValueError above)
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
            self._data[key] = new
            self._send(conn, Status.OK, [new])
            self._changed()
        elif op is Op.CHECK:
            ok = all(k.decode() in self._data for k in f)
            self._send(conn, Status.OK, [b"1" if ok else b"0"])
        elif op is Op.COMPARE_SET:
            key = f[0].decode()
            stored, changed = compare_set_value(self._data.get(key), f[1], f[2])
            if changed:
                self._data[key] = stored
            self._send(conn, Status.OK, [stored])
            if changed:
                self._changed()
        elif op is Op.DELETE:
            existed = self._data.pop(f[0].decode(), None) is not None
            self._send(conn, Status.OK, [b"1" if existed else b"0"])
        elif op is Op.NUM_KEYS:
            self._send(conn, Status.OK, [str(len(self._data)).encode()])
        elif op is Op.HELLO:
            self._hellos += 1
            self._send(conn, Status.OK, [])
            self._changed()
        elif op is Op.WAIT_WORKERS:
            timeout = _wire.DOUBLE.unpack(f[1])[0]
            w = _Waiter(conn, [], time.monotonic() + timeout, False, workers=int(f[0]))
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

    def _next_timeout(self) -> float | None:
        if not self._waiters:
            return None
        return max(0.0, min(w.deadline for w in self._waiters) - time.monotonic())

    def _expire(self) -> None:
        now = time.monotonic()
        for w in list(self._waiters):
            if w in self._waiters and w.deadline <= now:
                if w.workers:
                    fields = [str(self._hellos).encode()]
                else:
                    fields = [k.encode() for k in w.keys if k not in self._data]
                self._send(w.conn, Status.TIMEOUT, fields)
                self._resume(w)
