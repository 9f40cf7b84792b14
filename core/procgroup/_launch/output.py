"""Per-rank output pumps: copy a rank's stdout/stderr lines to the launcher's, prefixed.

Why threads that read whole lines: lines of different ranks must never interleave within
a line, and a rank's stdout and stderr must stay apart (stdout to the launcher's stdout,
stderr to its stderr). Each destination stream has one lock; a line is written and
flushed under it, so the launcher's output is line-buffered whatever it is connected to.
"""

from __future__ import annotations

import logging
import threading
from typing import BinaryIO

logger = logging.getLogger(__name__)

_CHUNK = 64 * 1024  # longest piece read at once; longer lines continue without a new prefix


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


class Pump:
    """Copies one pipe of one rank to a shared destination and optionally a log file."""

    def __init__(
        self,
        source: BinaryIO,
        dest: LockedStream,
        prefix: bytes,
        log_path: str | None = None,
    ) -> None:
        self._source = source
        self._dest = dest
        self._prefix = prefix
        # closed by the pump thread when the rank's output ends
        self._log = open(log_path, "wb") if log_path else None  # noqa: SIM115
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"pump{prefix!r}")
        self._thread.start()

    def _run(self) -> None:
        at_line_start = True
        try:
            while True:
                chunk = self._source.readline(_CHUNK)
                if not chunk:
                    break
                if self._log is not None:
                    self._log.write(chunk)
                    self._log.flush()
                out = (self._prefix if at_line_start else b"") + chunk
                at_line_start = chunk.endswith(b"\n")
                self._dest.write(out)
            if not at_line_start:
                self._dest.write(b"\n")
        except (OSError, ValueError) as err:
            logger.debug("pump %r stopped: %s", self._prefix, err)
        finally:
            try:
                self._source.close()
            except OSError:
                pass
            if self._log is not None:
                self._log.close()

    def join(self, timeout: float) -> bool:
        """Wait for the rank's end of output; False if still open (a leftover child holds it)."""
        self._thread.join(timeout)
        return not self._thread.is_alive()
