"""TCPStore: a Store served by rank 0 over TCP; every rank (rank 0 too) is a client."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Sequence

from procgroup import _auth
from procgroup.errors import (
    AuthenticationError,
    InvalidArgumentError,
    StoreError,
    StoreTimeoutError,
)

from . import _wire
from ._store import (
    DEFAULT_TIMEOUT,
    Store,
    check_key,
    check_keys,
    check_timeout,
    to_bytes,
)
from ._tcp_server import PURPOSE, StoreServer
from ._wire import Op, Status

logger = logging.getLogger(__name__)

#: Extra seconds a client waits for the server's own timeout reply before giving up
#: on the connection (the server answers blocking calls at their deadline).
REPLY_GRACE = 10.0

#: Seconds the master's close() waits for the other ranks to disconnect first, so a
#: rank that finishes early does not cut off the others' last Store calls.
CLOSE_GRACE = 5.0


class TCPStore(Store):
    """Key-value store hosted by the ``is_master`` process, reached over TCP.

    The master binds ``port`` (``port=0``: a free port, see :attr:`port`) on the
    address ``host`` when that is one of this machine's (loopback stays loopback), else
    on every interface, and serves from a daemon thread until :meth:`close`. With
    ``world_size`` and ``wait_for_workers`` the master's constructor waits until that
    many clients (itself included) have connected.

    Every connection starts with the job-token handshake: ``job_key`` (the key of
    :func:`procgroup._auth.job_key`) or else ``token``, else $PROCGROUP_JOB_TOKEN (see
    docs/security.md). A process with another token gets AuthenticationError.
    """

    _closed = True
    #: Master only: seconds close() waits for the other clients to disconnect before it
    #: stops the server (0: stop at once, as torch.distributed does).
    close_grace: float = CLOSE_GRACE

    def __init__(
        self,
        host: str,
        port: int,
        world_size: int | None = None,
        is_master: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
        wait_for_workers: bool = True,
        *,
        token: str | bytes | None = None,
        job_key: bytes | None = None,
    ) -> None:
        if not isinstance(host, str) or (not host and not is_master):
            raise InvalidArgumentError(f"TCPStore: host must be a non-empty str, got {host!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise InvalidArgumentError(f"TCPStore: port must be an int in 0..65535, got {port!r}")
        if port == 0 and not is_master:
            raise InvalidArgumentError("TCPStore: a client needs the server's real port, got 0")
        if world_size is not None and (
            isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1
        ):
            raise InvalidArgumentError(
                f"TCPStore: world_size must be a positive int or None, got {world_size!r}"
            )
        self.timeout = check_timeout(timeout, DEFAULT_TIMEOUT)
        if job_key is not None:
            if not isinstance(job_key, bytes) or not job_key:
                raise InvalidArgumentError("TCPStore: job_key must be non-empty bytes")
            self.job_key = job_key
        else:
            self.job_key = _auth.resolve_token(token, host or None, where="TCPStore")
        self.max_value = _wire.max_value_bytes()
        self.host = host
        self.world_size = world_size
        self.is_master = is_master
        self._lock = threading.Lock()  # guards the pool below, never held during I/O
        self._idle: list[socket.socket] = []  # connections free for the next request
        self._all: set[socket.socket] = set()  # every open connection (close() ends all)
        self._lost: str | None = None  # why the server is considered gone
        self._server: StoreServer | None = None
        if is_master:
            self._server = StoreServer(port, self.job_key, host or None)
            port = self._server.port
            local = "::1" if self._server.family == socket.AF_INET6 and not socket.has_dualstack_ipv6() else "127.0.0.1"
            connect_host = self._server.bound or local
        else:
            connect_host = host
        self.port: int = port
        self._connect_host = connect_host
        try:
            sock = self._connect(connect_host, port, self.timeout, self.job_key)
            self._all.add(sock)
            self._idle.append(sock)
            self._closed = False
            self._request(Op.HELLO, [])
            if is_master and world_size is not None and wait_for_workers:
                self._wait_workers(world_size, self.timeout)
        except BaseException:
            self._close(0.0)
            raise

    # ---------------------------------------------------------------- transport
    @staticmethod
    def _authenticate(sock: socket.socket, key: bytes, host: str, port: int, timeout: float) -> None:
        """The job-token handshake on a new connection; closes ``sock`` when it fails."""
        peer = f"the TCPStore at {host}:{port}"
        try:
            _auth.client_handshake(sock, key, PURPOSE, peer, min(timeout, _auth.HANDSHAKE_TIMEOUT_S))
        except AuthenticationError:
            sock.close()
            raise
        except OSError as exc:
            sock.close()
            raise AuthenticationError(
                f"{peer} dropped the connection during the authentication handshake ({exc}): a "
                f"different job holds this port, or this process has the wrong {_auth.ENV_TOKEN}"
            ) from None
        sock.settimeout(None)

    @staticmethod
    def _connect(host: str, port: int, timeout: float, key: bytes) -> socket.socket:
        """Connect and authenticate, retrying while the server is not up yet, until ``timeout``."""
        deadline = time.monotonic() + timeout
        delay = 0.02
        last: OSError | None = None
        while True:
            left = deadline - time.monotonic()
            try:
                sock = socket.create_connection((host, port), timeout=max(0.1, min(left, 10.0)))
            except socket.gaierror as exc:
                raise StoreError(f"TCPStore: cannot resolve host {host!r}: {exc}") from exc
            except OSError as exc:
                last = exc
                if time.monotonic() + delay >= deadline:
                    raise StoreTimeoutError(
                        f"TCPStore: could not connect to {host}:{port} within {timeout:g}s "
                        f"(last error: {last})",
                        op="connect",
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            TCPStore._authenticate(sock, key, host, port, max(left, 1.0))
            logger.debug("TCPStore client connected to %s:%d", host, port)
            return sock

    def _checkout(self) -> socket.socket:
        """An idle connection, or a new one: a thread blocked in get() keeps its own."""
        with self._lock:
            self._check_open(self._closed)
            if self._lost is not None:
                raise StoreError(self._lost)
            if self._idle:
                return self._idle.pop()
        try:  # the server is known to be up: one attempt, no retry loop
            sock = socket.create_connection((self._connect_host, self.port), timeout=REPLY_GRACE)
        except OSError as exc:
            raise StoreError(
                f"TCPStore: cannot open another connection to {self.host}:{self.port}: {exc}"
            ) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._authenticate(sock, self.job_key, self._connect_host, self.port, REPLY_GRACE)
        with self._lock:
            if self._closed:
                sock.close()
                self._check_open(True)
            self._all.add(sock)
        return sock

    def _request(
        self, op: Op, fields: list[bytes], wait: float | None = None
    ) -> tuple[int, list[bytes]]:
        """Send one request and read its reply; ``wait``: the server-side deadline."""
        sock = self._checkout()
        try:
            sock.settimeout(wait + REPLY_GRACE if wait is not None else REPLY_GRACE * 6)
            sock.sendall(_wire.encode(op, fields))
            code, reply = _wire.recv_message(sock)
        except TimeoutError:
            self._lose(sock, f"TCPStore: server {self.host}:{self.port} did not answer "
                             f"{op.name} in time; connection dropped")
            raise StoreError(self._lost) from None
        except OSError as exc:  # ConnectionError, reset, EOF, closed by close()
            if self._closed:
                self._lose(sock, None)
                raise StoreError(f"TCPStore: closed during {op.name}") from None
            self._lose(sock, f"TCPStore: lost the connection to the server "
                             f"{self.host}:{self.port} during {op.name}: {exc}")
            raise StoreError(self._lost) from exc
        with self._lock:
            if self._closed:
                sock.close()
            else:
                self._idle.append(sock)
        if code == Status.ERROR:
            msg = reply[0].decode(errors="replace") if reply else "unknown error"
            if msg.startswith("Store.add"):
                raise InvalidArgumentError(msg)
            if msg.startswith("limit: "):
                raise InvalidArgumentError(f"TCPStore: {msg[7:]}")
            raise StoreError(f"TCPStore server: {msg}")
        return code, reply

    def _lose(self, sock: socket.socket, why: str | None) -> None:
        with self._lock:
            self._all.discard(sock)
            if why is not None and self._lost is None:
                self._lost = why
        sock.close()

    def _wait_workers(self, n: int, timeout: float) -> None:
        code, reply = self._request(
            Op.WAIT_WORKERS, [str(n).encode(), _wire.DOUBLE.pack(timeout)], wait=timeout
        )
        if code == Status.TIMEOUT:
            got = int(reply[0]) if reply else 0
            raise StoreTimeoutError(
                f"TCPStore: timed out after {timeout:g}s waiting for workers: "
                f"{got} of {n} connected",
                op="wait_for_workers",
            )

    # ---------------------------------------------------------------- Store API
    def _check_value(self, value: bytes, op: str) -> bytes:
        if len(value) > self.max_value:
            raise InvalidArgumentError(
                f"TCPStore.{op}: a value of {len(value)} bytes is over the store's limit "
                f"{_wire.ENV_MAX_VALUE}={self.max_value}")
        return value

    def set(self, key: str, value: bytes | str) -> None:
        self._request(Op.SET, [check_key(key).encode(), self._check_value(to_bytes(value), "set")])

    def get(self, key: str, timeout: float | None = None) -> bytes:
        key = check_key(key)
        t = check_timeout(timeout, self.timeout)
        code, reply = self._request(Op.GET, [key.encode(), _wire.DOUBLE.pack(t)], wait=t)
        if code == Status.TIMEOUT:
            raise StoreTimeoutError(
                f"TCPStore: timed out after {t:g}s waiting for key {key!r}", op="get"
            )
        return reply[0]

    def add(self, key: str, amount: int = 1) -> int:
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise InvalidArgumentError(f"Store.add: amount must be int, got {amount!r}")
        _, reply = self._request(Op.ADD, [check_key(key).encode(), str(amount).encode()])
        return int(reply[0])

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        keys = check_keys(keys)
        t = check_timeout(timeout, self.timeout)
        code, reply = self._request(
            Op.WAIT, [_wire.DOUBLE.pack(t)] + [k.encode() for k in keys], wait=t
        )
        if code == Status.TIMEOUT:
            missing = [k.decode() for k in reply]
            raise StoreTimeoutError(
                f"TCPStore: timed out after {t:g}s waiting for keys {missing}", op="wait"
            )

    def check(self, keys: Sequence[str]) -> bool:
        _, reply = self._request(Op.CHECK, [k.encode() for k in check_keys(keys)])
        return reply[0] == b"1"

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        fields = [check_key(key).encode(), self._check_value(to_bytes(expected, "expected"), "compare_set"),
                  self._check_value(to_bytes(desired, "desired"), "compare_set")]
        _, reply = self._request(Op.COMPARE_SET, fields)
        return reply[0]

    def delete_key(self, key: str) -> bool:
        _, reply = self._request(Op.DELETE, [check_key(key).encode()])
        return reply[0] == b"1"

    def num_keys(self) -> int:
        _, reply = self._request(Op.NUM_KEYS, [])
        return int(reply[0])

    def close(self) -> None:
        """Close the connection; on the master also stop the server (clients then fail).

        The master first waits up to :attr:`close_grace` seconds for the other clients
        to disconnect.
        """
        self._close(self.close_grace)

    def __del__(self) -> None:
        try:
            self._close(0.0)  # never block in a finaliser
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def _close(self, grace: float) -> None:
        lock = getattr(self, "_lock", None)
        if lock is None:
            return
        with lock:
            self._closed = True
            socks, self._all, self._idle = list(self._all), set(), []
        for sock in socks:  # wakes threads blocked in get()/wait(): they raise StoreError
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        server, self._server = self._server, None
        if server is not None:
            if grace > 0 and not server.wait_idle(grace):
                logger.warning(
                    "TCPStore: stopping the server on port %d while clients are still "
                    "connected (close_grace=%gs passed)", self.port, grace
                )
            server.stop()

    def __repr__(self) -> str:
        role = "master" if self.is_master else "client"
        return f"TCPStore({self.host!r}, {self.port}, {role})"
