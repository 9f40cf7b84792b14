"""The flight recorder from Python: this rank's record, a JSON dump, a live job report.

Every rank records its last operations (procgroup.backend._recorder, always on; its size
is ``PROCGROUP_FLIGHT_RECORDER``, 0 turns it off). docs/debugging.md explains the fields,
the culprit report and how procgroup-run and ``python -m procgroup flight`` use them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from ._flight_analysis import Report, analyse
from .backend import _recorder
from .errors import InvalidArgumentError

__all__ = ["analyse_flight_dumps", "dump_flight_record", "flight_record", "flight_report", "load_flight_dumps"]


def flight_record() -> list[dict[str, Any]]:
    """This rank's recorded ops, oldest first: one dict per op with ``group``, ``seq`` (the
    op's number on its group, from 1; collectives and point-to-point counted apart),
    ``op``, ``kind``, ``peer`` (root or peer, a world rank), ``bytes``, ``dtype``, ``state``
    (``issued``, ``waiting``, ``done`` or ``failed``), ``start``/``end`` (epoch seconds),
    ``file``/``line``/``function`` (the caller outside procgroup) and ``error``."""
    return _recorder.snapshot()


def dump_flight_record(path: str | os.PathLike[str] | None = None) -> str:
    """This rank's record and the stacks of all its threads, as JSON; also written to
    ``path`` when given (the format ``python -m procgroup flight`` reads)."""
    text = json.dumps(_recorder.dump(), indent=1)
    if path is not None:
        tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    return text


def flight_report(timeout: float = _recorder.GATHER_SECONDS) -> str:
    """The culprit report of the whole job now: every live rank's record is asked for
    through the job's Store (ranks that do not answer within ``timeout`` seconds count as
    giving no record). Not collective: any rank may call it at any time, e.g. from a
    watchdog thread. Needs a TCPStore rendezvous (env://, tcp://); elsewhere this rank's
    record alone is analysed."""
    dumps = list(_recorder.gather(timeout).values()) or [_recorder.dump()]
    return analyse(dumps).text()


def load_flight_dumps(paths: Iterable[str | os.PathLike[str]]) -> list[dict[str, Any]]:
    """Read saved dumps: JSON files (one rank's dump, or a list of them) or directories
    holding ``rank*.flight.json`` files (procgroup-run's flight directory)."""
    found: list[dict[str, Any]] = []
    for p in paths:
        p = os.fspath(p)
        files = ([os.path.join(p, n) for n in sorted(os.listdir(p)) if n.endswith(".flight.json")]
                 if os.path.isdir(p) else [p])
        for name in files:
            try:
                with open(name, encoding="utf-8") as f:
                    data = json.load(f)
            except (OSError, ValueError) as exc:
                raise InvalidArgumentError(f"cannot read flight dump {name}: {exc}") from exc
            items = data if isinstance(data, list) else [data]
            for item in items:
                if not (isinstance(item, Mapping) and isinstance(item.get("rank"), int)):
                    raise InvalidArgumentError(f"{name} is not a procgroup flight dump (no rank)")
                found.append(dict(item))
    return found


def analyse_flight_dumps(dumps: Iterable[Mapping[str, Any]], world_size: int | None = None) -> Report:
    """The culprit report of saved dumps (:func:`load_flight_dumps`); ``str(report.text())``
    is what procgroup-run prints."""
    return analyse(dumps, world_size=world_size)
