"""Per-rank output pumps: copy a rank's stdout/stderr lines to the launcher's, prefixed.

Why threads that read whole lines: lines of different ranks must never interleave within
a line, and a rank's stdout and stderr must stay apart (stdout to the launcher's stdout,
stderr to its stderr). Each destination stream has one lock; a line is written and
flushed under it, so the launcher's output is line-buffered whatever it is connected to.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import BinaryIO

logger = logging.getLogger(__name__)

_CHUNK = 64 * 1024  # longest piece read at once; longer lines continue without a new prefix
TAIL_LINES = 20  # lines of a rank's output kept for the failure summary


class Tail:
    """The last lines a rank wrote (stdout and stderr in arrival order), for the summary."""

    def __init__(self, lines: int = TAIL_LINES) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=lines)
        self._lock = threading.Lock()

    def add(self, chunk: bytes) -> None:
        text = chunk.decode("utf-8", "replace").rstrip("\n")
        with self._lock:
            self._lines.append(text)

    def lines(self) -> list[str]:
        with self._lock:
            return list(self._lines)



class LockedStream:
    """A binary destination shared by many pumps; one whole write+flush at a time."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self._lock:
            try:
                self._stream.write(data)
                self._stream.flush()
            except (OSError, ValueError):  # launcher's stdout closed (e.g. `| head`)
                pass


Source = BinaryIO | Callable[[], BinaryIO]


class Pump:
    """Copies one pipe of one rank to a shared destination and optionally a log file.

    ``dest`` None keeps the lines off the console (``--redirects``, ``--local-ranks-filter``);
    ``source`` may be a callable that opens it (a named pipe, opened in the pump's thread
    because opening blocks until the rank opens its end).
    """

    def __init__(
        self,
        source: Source,
        dest: LockedStream | None,
        prefix: bytes,
        log_path: str | None = None,
        tail: Tail | None = None,
    ) -> None:
        self._source = source
        self._dest = dest
        self._prefix = prefix
        self._tail = tail
        # closed by the pump thread when the rank's output ends
        self._log = open(log_path, "wb") if log_path else None  # noqa: SIM115 - the pump thread closes it
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"pump{prefix!r}")
        self._thread.start()

    def _run(self) -> None:
        at_line_start = True
        source: BinaryIO | None = None
        try:
            source = self._source() if callable(self._source) else self._source
            while True:
                chunk = source.readline(_CHUNK)
                if not chunk:
                    break
                if self._log is not None:
                    self._log.write(chunk)
                    self._log.flush()
                if self._tail is not None:
                    self._tail.add(chunk)
                out = (self._prefix if at_line_start else b"") + chunk
                at_line_start = chunk.endswith(b"\n")
                if not at_line_start and len(chunk) < _CHUNK:
                    # readline stops short of a newline only at the end of the output:
                    # the newline goes in the same write, or another rank's line would
                    # be glued to this one
                    out += b"\n"
                    at_line_start = True
                if self._dest is not None:
                    self._dest.write(out)
            if not at_line_start and self._dest is not None:
                self._dest.write(b"\n")
        except (OSError, ValueError) as err:
            logger.debug("pump %r stopped: %s", self._prefix, err)
        finally:
            try:
                if source is not None:
                    source.close()
            except OSError:
                pass
            if self._log is not None:
                self._log.close()

    def join(self, timeout: float) -> bool:
        """Wait for the rank's end of output; False if still open (a leftover child holds it)."""
        self._thread.join(timeout)
        return not self._thread.is_alive()
