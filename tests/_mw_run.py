"""The master-worker check scripts' runner (tests/mw_checks.py, tests/mw_cache_checks.py).

A script registers its checks with ``@checks.register``; ``checks.run(sys.argv[1:])``
runs those named (all by default), each isolated from the others' failures, and prints
one line, ``MW-RESULTS`` and a JSON object: check name -> None, or its traceback. The
tests read that line back with ``test_master_worker.results_of``.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable, Sequence

MARK = "MW-RESULTS "


class Checks:
    def __init__(self) -> None:
        self.found: dict[str, Callable[[], None]] = {}

    def register(self, fn: Callable[[], None]) -> Callable[[], None]:
        self.found[fn.__name__] = fn
        return fn

    def run(self, names: Sequence[str]) -> None:
        results: dict[str, str | None] = {}
        for name in names or list(self.found):
            try:
                self.found[name]()
                results[name] = None
            except BaseException:  # noqa: BLE001 - reported to the test
                results[name] = traceback.format_exc()
        print(MARK + json.dumps(results), flush=True)
