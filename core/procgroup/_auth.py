"""The job token and the mutual handshake every procgroup connection starts with.

Both sides prove they hold the job's secret without sending it: HMAC-SHA256 over fresh
nonces from both ends and the connection's ``purpose`` (e.g. ``b"store"``,
``b"tcp/g0"``), so a proof cannot be replayed on another connection or another kind of
connection. Until the handshake succeeds a peer can make this process read only the
fixed-size frames below (40, 64 and 33 bytes) and nothing else.

::

    server -> client   MAGIC (8) + server nonce (32)
    client -> server   client nonce (32) + HMAC(key, "client" | purpose | ns | nc)
    server -> client   status (1: 1 accepted, 0 refused) + HMAC(key, "server" | purpose | nc | ns)

The message-level classes (:class:`ServerHandshake`, :class:`ClientHandshake`) serve
event loops (the store server); :func:`server_handshake` / :func:`client_handshake`
run them on a blocking socket with a deadline.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import socket
import threading
import time

from .errors import AuthenticationError, InvalidArgumentError

log = logging.getLogger(__name__)

ENV_TOKEN = "PROCGROUP_JOB_TOKEN"
ENV_REQUIRE_TOKEN = "PROCGROUP_REQUIRE_TOKEN"
MAGIC = b"PGAUTH1\0"
NONCE_BYTES = 32
MAC_BYTES = 32
GREETING_BYTES = len(MAGIC) + NONCE_BYTES
REPLY_BYTES = NONCE_BYTES + MAC_BYTES
VERDICT_BYTES = 1 + MAC_BYTES
#: An unauthenticated peer gets this long to finish the handshake.
HANDSHAKE_TIMEOUT_S = 10.0
#: Tokens longer than this are refused (they are read from env and files).
MAX_TOKEN_BYTES = 4096

#: Launchers' job ids, first found wins. Without a token, the key is made from the one the
#: launcher set, so a second job that reaches this job's port (two Slurm jobs on one node,
#: both on the default MASTER_PORT) is refused at the handshake instead of taking a seat.
#: This tells jobs apart; it is no secret (anyone who knows the id can present it).
JOB_ID_VARS = ("SLURM_JOB_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "FLUX_JOB_ID", "LSB_JOBID",
               "PBS_JOBID", "TORCHELASTIC_RUN_ID")

_warned = threading.Event()


def job_key(token: str | bytes | None) -> bytes:
    """The HMAC key of a job token (an empty token gives the key of "no token")."""
    raw = token.encode() if isinstance(token, str) else (token or b"")
    if len(raw) > MAX_TOKEN_BYTES:
        raise InvalidArgumentError(f"the job token is {len(raw)} bytes long; at most {MAX_TOKEN_BYTES} are allowed")
    return hashlib.sha256(b"procgroup job token\0" + raw).digest()


def launcher_job_id() -> str | None:
    """``NAME=value`` of the first of :data:`JOB_ID_VARS` set in this process, or None."""
    for name in JOB_ID_VARS:
        value = os.environ.get(name, "").strip()
        if value and value.lower() != "none":  # torchrun's default rendezvous id is "none"
            return f"{name}={value}"
    return None


def new_token() -> str:
    """A fresh random job token (what procgroup-run and file:// make)."""
    return os.urandom(24).hex()


def _is_loopback(host: str | None) -> bool:
    if not host or host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def resolve_token(token: str | bytes | None, master_addr: str | None, *, where: str) -> bytes:
    """The job's key: from ``token`` (an argument), else $PROCGROUP_JOB_TOKEN.

    With neither, a loopback master just works; any other address works with one warning
    per process saying how to set a token, or fails when $PROCGROUP_REQUIRE_TOKEN=1. The
    key is then the launcher's job id's (:func:`launcher_job_id`), if it set one.
    """
    if token is None:
        token = os.environ.get(ENV_TOKEN) or None
    if token:
        return job_key(token)
    if not _is_loopback(master_addr):
        required = os.environ.get(ENV_REQUIRE_TOKEN, "").strip().lower() in ("1", "true", "yes", "on")
        advice = (f"set the same secret in {ENV_TOKEN} on every rank (procgroup-run makes one for its "
                  f"workers), or pass token=...")
        if required:
            raise AuthenticationError(f"{where}: no job token, and {ENV_REQUIRE_TOKEN}=1 requires one; {advice}")
        if not _warned.is_set():
            _warned.set()
            log.warning("%s: no job token: any process that reaches %s can join this job; %s",
                        where, master_addr, advice)
    identity = launcher_job_id()
    if identity is None:
        return job_key(None)
    log.debug("%s: no job token: this job is told apart from others by %s", where, identity)
    return hashlib.sha256(b"procgroup launcher job id\0" + identity.encode()).digest()


def _mac(key: bytes, side: bytes, purpose: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(key, side + b"\0" + purpose + b"\0" + first + second, hashlib.sha256).digest()


class ServerHandshake:
    """The accepting side, one message at a time (for event loops)."""

    def __init__(self, key: bytes, purpose: bytes) -> None:
        self._key = key
        self._purpose = purpose
        self._nonce = os.urandom(NONCE_BYTES)

    def greeting(self) -> bytes:
        return MAGIC + self._nonce

    def verdict(self, reply: bytes) -> tuple[bool, bytes]:
        """(accepted, the bytes to send back) for the client's ``REPLY_BYTES`` reply."""
        if len(reply) != REPLY_BYTES:
            return False, b"\0" * VERDICT_BYTES
        client_nonce, mac = reply[:NONCE_BYTES], reply[NONCE_BYTES:]
        ok = hmac.compare_digest(mac, _mac(self._key, b"client", self._purpose, self._nonce, client_nonce))
        if not ok:
            return False, b"\0" * VERDICT_BYTES
        return True, b"\1" + _mac(self._key, b"server", self._purpose, client_nonce, self._nonce)


class ClientHandshake:
    """The connecting side, one message at a time."""

    def __init__(self, key: bytes, purpose: bytes, peer: str) -> None:
        self._key = key
        self._purpose = purpose
        self._peer = peer
        self._nonce = os.urandom(NONCE_BYTES)
        self._server_nonce = b""

    def reply(self, greeting: bytes) -> bytes:
        if len(greeting) != GREETING_BYTES or not greeting.startswith(MAGIC):
            raise AuthenticationError(f"{self._peer} is not a procgroup endpoint (bad greeting)")
        self._server_nonce = greeting[len(MAGIC):]
        return self._nonce + _mac(self._key, b"client", self._purpose, self._server_nonce, self._nonce)

    def check(self, verdict: bytes) -> None:
        if len(verdict) != VERDICT_BYTES or verdict[:1] != b"\1":
            raise AuthenticationError(
                f"{self._peer} refused this process's job token: a different job holds this port, or "
                f"this process has the wrong {ENV_TOKEN} (every rank of a job needs the same one; without "
                f"one, the same launcher job id: {', '.join(JOB_ID_VARS)})")
        expected = _mac(self._key, b"server", self._purpose, self._nonce, self._server_nonce)
        if not hmac.compare_digest(verdict[1:], expected):
            raise AuthenticationError(f"{self._peer} could not prove it holds the job token: not this job's peer")


class ClosedEarly(ConnectionError):
    """The peer closed the connection before the bytes asked for came (``recv_exact``)."""


def recv_exact(sock: socket.socket, size: int, deadline: float | None = None, peer: str = "the peer") -> bytes:
    """Read exactly ``size`` bytes from a blocking socket: the one such reader of procgroup
    (the store protocol, the handshakes, tcp's hello). ClosedEarly on EOF; with a
    ``deadline`` (time.monotonic()), TimeoutError once it passes (the socket's timeout is
    set to what is left before each read); without one, the socket's own timeout applies."""
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{peer} sent {got} of {size} bytes in time")
            sock.settimeout(left)
        try:
            n = sock.recv_into(view[got:], size - got)
        except TimeoutError:
            if deadline is None:
                raise
            continue
        if n == 0:
            raise ClosedEarly(f"{peer} closed the connection after {got} of {size} bytes")
        got += n
    return bytes(buf)


def _recv_exact(sock: socket.socket, n: int, deadline: float, peer: str) -> bytes:
    """``recv_exact`` within the handshake's deadline, its failures as AuthenticationError."""
    try:
        return recv_exact(sock, n, deadline, peer)
    except TimeoutError:
        raise AuthenticationError(f"{peer}: the authentication handshake did not finish in time") from None
    except ClosedEarly:
        raise AuthenticationError(f"{peer} closed the connection during the authentication handshake") from None


def client_handshake(sock: socket.socket, key: bytes, purpose: bytes, peer: str,
                     timeout: float = HANDSHAKE_TIMEOUT_S) -> None:
    """Prove the token to the server at the other end of ``sock`` and check its proof."""
    deadline = time.monotonic() + timeout
    hs = ClientHandshake(key, purpose, peer)
    sock.sendall(hs.reply(_recv_exact(sock, GREETING_BYTES, deadline, peer)))
    hs.check(_recv_exact(sock, VERDICT_BYTES, deadline, peer))


def server_handshake(sock: socket.socket, key: bytes, purpose: bytes, peer: str,
                     timeout: float = HANDSHAKE_TIMEOUT_S) -> None:
    """Check the client's proof; AuthenticationError (after telling it so) when it fails."""
    deadline = time.monotonic() + timeout
    hs = ServerHandshake(key, purpose)
    sock.sendall(hs.greeting())
    ok, answer = hs.verdict(_recv_exact(sock, REPLY_BYTES, deadline, peer))
    try:
        sock.sendall(answer)
    except OSError:
        pass
    if not ok:
        raise AuthenticationError(f"{peer} did not prove it holds the job token; connection refused")


__all__ = [
    "ClientHandshake",
    "ENV_REQUIRE_TOKEN",
    "ENV_TOKEN",
    "JOB_ID_VARS",
    "GREETING_BYTES",
    "HANDSHAKE_TIMEOUT_S",
    "REPLY_BYTES",
    "ServerHandshake",
    "VERDICT_BYTES",
    "client_handshake",
    "job_key",
    "new_token",
    "resolve_token",
    "server_handshake",
]
