"""FileStore: a Store in one file on a (shared) filesystem, guarded by fcntl locks.

The file is an append-only log of set/delete records, so a writer never rewrites what
another process may be reading; each process replays only the bytes it has not seen.

Every opener records itself (host, pid, time) in the file, so a file left behind by a
job that died can be told from one whose ranks are still arriving
(:meth:`FileStore.leftover`). A file:// rendezvous removes the path once every rank has
arrived (:meth:`FileStore.arrived`, the 2017 behaviour): the ranks keep using the file
through their open descriptors, and the next job on the same path starts afresh even
when this one's ranks never close their store (``os._exit``).
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import struct
import threading
import time
from contextlib import contextmanager
from collections.abc import Iterator, Sequence

from procgroup.errors import InvalidArgumentError, StoreError, StoreTimeoutError

from ._store import (
    DEFAULT_TIMEOUT,
    Store,
    check_key,
    check_keys,
    check_timeout,
    compare_set_value,
    parse_counter,
    to_bytes,
)

logger = logging.getLogger(__name__)

_LEN = struct.Struct("!Q")
_SET, _DEL = b"S", b"D"
#: Bookkeeping keys live under this prefix and are hidden from num_keys().
_HIDDEN = "\x00procgroup/"
_USERS = _HIDDEN + "users"
_CLOSED = _HIDDEN + "closed"
_JOB = _HIDDEN + "job"  # "<job id> <created, epoch s> <rendezvous timeout s>", set by the first opener
_OWNER = _HIDDEN + "owner/"  # + "<host>/<pid>" -> epoch s of opening
_ARRIVED = _HIDDEN + "arrived"  # ranks whose rendezvous completed (see arrived())
_OPENED = _HIDDEN + "opened"  # FileStores ever opened on this file


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


class FileStore(Store):
    """Multi-process Store in the file ``path`` (created if missing).

    With ``world_size`` the file is deleted when that many users have closed it and
    none is still open; without it, when the last open user closes it (a path that by
    then names another job's file is left alone). ``fresh``: this process created it.
    """

    _closed = True

    def __init__(
        self, path: str, world_size: int | None = None, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise InvalidArgumentError(f"FileStore: path must be a non-empty str, got {path!r}")
        if world_size is not None and (
            isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1
        ):
            raise InvalidArgumentError(
                f"FileStore: world_size must be a positive int or None, got {world_size!r}"
            )
        self.path = os.path.abspath(os.fspath(path))
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            raise InvalidArgumentError(
                f"FileStore: directory {directory!r} (of path {self.path!r}) does not exist"
            )
        self.timeout = check_timeout(timeout, DEFAULT_TIMEOUT)
        self.world_size = world_size
        self._tlock = threading.RLock()
        self._data: dict[str, bytes] = {}
        self._offset = 0
        self._fd = self._open_live()
        self._me = f"{socket.gethostname()}/{os.getpid()}"
        try:
            self._refresh()
            self.fresh = _JOB not in self._data  # this process created the file
            if self.fresh:
                self._append(_SET, _JOB, f"{os.urandom(6).hex()} {time.time():.3f} {self.timeout:g}".encode())
            # judged under the same lock as the open: what happens after it (a rendezvous
            # that completes, a rank that exits) happens with this process in the file
            self._leftover = None if self.fresh else self._judge_leftover()
            self._append(_SET, _OWNER + self._me, f"{time.time():.3f}".encode())
            self._append_counter(_USERS, 1)
            self._append_counter(_OPENED, 1)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._closed = False

    # ---------------------------------------------------------------- job life
    def job_id(self) -> str:
        """The random id the file's first opener gave it."""
        with self._locked(False):
            return self._data.get(_JOB, b"?").decode(errors="replace").split(" ")[0]

    def leftover(self) -> str | None:
        """Why this file looked left over from an earlier job that is gone when this
        process opened it, or None.

        Asked by a process that opened it to join a rendezvous: the file's rendezvous had
        already completed (every rank that opened it before had arrived, and the last one
        did not remove it), or every process that opened it before ran on this host and
        had exited, or its rendezvous deadline (creation time + the creator's timeout) had
        passed. Judged at the open, under the file's lock, so ranks of another group name
        that finish meanwhile do not make a live file look left over.
        """
        return self._leftover

    def _judge_leftover(self) -> str | None:
        """:meth:`leftover`'s verdict; the caller holds the file's lock, before its own entries."""
        data = self._data
        job = data.get(_JOB, b"").decode(errors="replace").split(" ")
        owners = [k[len(_OWNER):] for k in data if k.startswith(_OWNER) and k[len(_OWNER):] != self._me]
        arrived = parse_counter(_ARRIVED, data[_ARRIVED]) if _ARRIVED in data else 0
        opened = parse_counter(_OPENED, data[_OPENED]) if _OPENED in data else 0
        if not owners or opened == 0:
            return None
        job_id = job[0] if job and job[0] else "?"
        try:
            created, limit = float(job[1]), float(job[2])
        except (IndexError, ValueError):
            created, limit = time.time(), float("inf")
        age = time.time() - created
        host = socket.gethostname()
        pids = sorted(int(o.split("/")[-1]) for o in owners if o.rsplit("/", 1)[0] == host)
        remote = sorted({o.rsplit("/", 1)[0] for o in owners if o.rsplit("/", 1)[0] != host})
        what = (f"job {job_id}, created {age:.1f}s ago, opened before by pid(s) {pids}"
                + (f" and processes on {remote}" if remote else ""))
        if arrived >= opened:
            why = f"its rendezvous completed ({arrived} rank(s) arrived) but the file was not removed"
        elif not remote and not any(_pid_alive(p) for p in pids):
            why = "every process that opened it has exited"
        elif age > limit:
            why = f"its rendezvous deadline ({limit:g}s after creation) has passed"
        else:
            return None
        return (f"{self.path} is left over from an earlier job ({what}): {why}. Delete it "
                f"(rm {self.path}) if that job is gone, or give this job another path")

    def arrived(self) -> bool:
        """Count this rank as arrived (its rendezvous complete); when every process that
        opened the file has arrived, remove the path (the 2017 behaviour; with several
        group names on one file, once all of them have). The ranks keep the file through
        their descriptors. True if this call removed it."""
        with self._locked(True):
            count = self._append_counter(_ARRIVED, 1)
            opened = parse_counter(_OPENED, self._data[_OPENED])
            if count < opened:
                return False
            return self._unlink_if_ours("every rank arrived")

    def _unlink_if_ours(self, why: str) -> bool:
        """Remove the path if it still names this file (a new job may own the path now)."""
        try:
            st, mine = os.stat(self.path), os.fstat(self._fd)
            if (st.st_dev, st.st_ino) != (mine.st_dev, mine.st_ino):
                return False
            os.unlink(self.path)
        except FileNotFoundError:
            return False
        logger.debug("FileStore: removed %s (%s)", self.path, why)
        return True

    def _open_live(self) -> int:
        """Open the file and lock it exclusively, retrying if a closer just unlinked it."""
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
            except OSError as exc:
                raise StoreError(f"FileStore: cannot open {self.path!r}: {exc}") from exc
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_nlink > 0:
                return fd  # still locked; the caller unlocks
            os.close(fd)  # deleted by the last user of a previous job: make a new one

    # ---------------------------------------------------------------- file log
    @contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        with self._tlock:
            self._check_open(self._closed)
            fcntl.flock(self._fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                self._refresh()
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _refresh(self) -> None:
        """Replay records appended since the last read."""
        size = os.fstat(self._fd).st_size
        if size <= self._offset:
            return
        buf = os.pread(self._fd, size - self._offset, self._offset)
        pos = 0
        while True:
            rec = self._parse(buf, pos)
            if rec is None:
                break
            kind, key, value, pos = rec
            if kind == _SET:
                self._data[key] = value  # type: ignore[assignment]  # a _SET record always carries a value
            else:
                self._data.pop(key, None)
        self._offset += pos

    @staticmethod
    def _parse(buf: bytes, pos: int) -> tuple[bytes, str, bytes | None, int] | None:
        if pos >= len(buf):
            return None
        kind = buf[pos : pos + 1]
        if kind not in (_SET, _DEL):
            raise StoreError(f"FileStore: file is corrupt (record kind {kind!r})")
        p = pos + 1
        fields: list[bytes] = []
        for _ in range(2 if kind == _SET else 1):
            if p + _LEN.size > len(buf):
                return None
            (n,) = _LEN.unpack_from(buf, p)
            p += _LEN.size
            if p + n > len(buf):
                return None
            fields.append(buf[p : p + n])
            p += n
        return kind, fields[0].decode(), fields[1] if kind == _SET else None, p

    def _append(self, kind: bytes, key: str, value: bytes | None = None) -> None:
        kb = key.encode()
        rec = [kind, _LEN.pack(len(kb)), kb]
        if value is not None:
            rec += [_LEN.pack(len(value)), value]
        data = b"".join(rec)
        written = 0
        while written < len(data):
            written += os.write(self._fd, data[written:])
        # Apply locally; _offset moves past the record on the next refresh.
        self._refresh()

    def _append_counter(self, key: str, amount: int) -> int:
        self._refresh()
        old = self._data.get(key)
        value = (parse_counter(key, old) if old is not None else 0) + amount
        self._append(_SET, key, str(value).encode("ascii"))
        return value

    # ---------------------------------------------------------------- Store API
    def set(self, key: str, value: bytes | str) -> None:
        key, raw = check_key(key), to_bytes(value)
        with self._locked(True):
            self._append(_SET, key, raw)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        key = check_key(key)
        deadline = time.monotonic() + check_timeout(timeout, self.timeout)
        while True:
            self.wait([key], max(deadline - time.monotonic(), 0.0))
            with self._locked(False):
                if key in self._data:
                    return self._data[key]
            # deleted between wait and read: wait again with what is left of the budget

    def add(self, key: str, amount: int = 1) -> int:
        key = check_key(key)
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise InvalidArgumentError(f"Store.add: amount must be int, got {amount!r}")
        with self._locked(True):
            return self._append_counter(key, amount)

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        keys = check_keys(keys)
        t = check_timeout(timeout, self.timeout)
        deadline = time.monotonic() + t
        delay = 0.001
        while True:
            with self._locked(False):
                missing = [k for k in keys if k not in self._data]
            if not missing:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise StoreTimeoutError(
                    f"FileStore({self.path}): timed out after {t:g}s waiting for keys "
                    f"{missing}",
                    op="wait",
                )
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)

    def check(self, keys: Sequence[str]) -> bool:
        keys = check_keys(keys)
        with self._locked(False):
            return all(k in self._data for k in keys)

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        key = check_key(key)
        exp, des = to_bytes(expected, "expected"), to_bytes(desired, "desired")
        with self._locked(True):
            value, changed = compare_set_value(self._data.get(key), exp, des)
            if changed:
                self._append(_SET, key, value)
            return value

    def delete_key(self, key: str) -> bool:
        key = check_key(key)
        with self._locked(True):
            if key not in self._data:
                return False
            self._append(_DEL, key)
            return True

    def num_keys(self) -> int:
        with self._locked(False):
            return sum(1 for k in self._data if not k.startswith(_HIDDEN))

    def close(self) -> None:
        """Close; the last user (see class doc) deletes the file."""
        if self._closed:
            return
        with self._tlock:
            if self._closed:
                return
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
                self._refresh()
                users = self._append_counter(_USERS, -1)
                closed = self._append_counter(_CLOSED, 1)
                if users <= 0 and (self.world_size is None or closed >= self.world_size):
                    self._unlink_if_ours("last user")
            finally:
                self._closed = True
                os.close(self._fd)  # also releases the lock

    def __repr__(self) -> str:
        return f"FileStore({self.path!r})"
