"""A plain-text progress bar on stderr (no dependency): redrawn in place on a terminal,
a line every tenth of the way otherwise (CI logs)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Counts steps of a sweep; ``step(label)`` after each one."""

    def __init__(self, total: int, *, enabled: bool = True, stream: TextIO | None = None, width: int = 28) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.start = time.monotonic()
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_tenth = -1

    def step(self, label: str) -> None:
        self.done = min(self.done + 1, self.total)
        if not self.enabled:
            return
        frac = self.done / self.total
        filled = int(frac * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.monotonic() - self.start
        text = f"[{bar}] {self.done}/{self.total} {elapsed:6.1f}s  {label}"
        if self._tty:
            self.stream.write("\r\033[K" + text)
            if self.done == self.total:
                self.stream.write("\n")
        else:
            tenth = int(frac * 10)
            if tenth == self._last_tenth and self.done != self.total:
                return
            self._last_tenth = tenth
            self.stream.write(text + "\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        """A message that must not be overwritten by the bar."""
        if self._tty and self.enabled and 0 < self.done < self.total:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self.stream.flush()
