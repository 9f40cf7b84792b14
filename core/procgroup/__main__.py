"""``python -m procgroup info``: versions, installed backends and the live capability table.

The table is generated from the installed plugins: for each backend, each op and each
device it says ``native`` (the backend implements it), ``generic`` (the core's algorithm
on the backend's send/recv), ``staged`` (CUDA arrays copied through host memory) or ``-``.
"""

from __future__ import annotations

import argparse
import platform
import sys
from typing import Any
from collections.abc import Sequence

from . import __version__
from .backend import ALL_OPS, BackendSpec, implemented_ops
from .plugins import backends


def capability_rows(spec: BackendSpec) -> tuple[str | None, dict[str, dict[str, str]]]:
    """(why unavailable or None, op -> device -> how) for one backend."""
    reason = spec.unavailable()
    native: set[str] | None = None
    try:
        native = implemented_ops(spec.loader())
    except Exception as exc:  # noqa: BLE001 - listed with the reason instead
        reason = reason or f"failed to load: {exc}"
    table: dict[str, dict[str, str]] = {}
    for op in ALL_OPS:
        how = "?" if native is None else ("native" if op in native else "generic")
        table[op] = {
            "cpu": how if "cpu" in spec.devices else "-",
            "cuda": how if "cuda" in spec.devices or how == "?" else ("staged" if "cpu" in spec.devices else "-"),
        }
    return reason, table


def info(out: Any = None) -> None:
    """Print versions, backends and the capability table."""
    out = out or sys.stdout
    w = out.write
    w(f"procgroup {__version__} (Python {platform.python_version()}, {platform.system()} {platform.machine()})\n")
    mods = ("numpy", "pluggy", "pydantic", "mpi4py", "pygloo", "cupy")
    for mod in mods:
        w(f"  {mod:<{max(map(len, mods))}s}  {_version(mod)}\n")
    found = backends()
    if not found:
        w("\nno backends installed: pip install procgroup-tcp\n")
        return
    w("\nbackends:\n")
    tables = {}
    name_w = max(len(n) for n in found)
    dist_w = max(len(spec.distribution or "?") for spec in found.values())
    dev_w = max(len(",".join(spec.devices)) for spec in found.values())
    for name, spec in found.items():
        reason, tables[name] = capability_rows(spec)
        state = "available" if reason is None else f"unavailable: {reason}"
        w(f"  {name:<{name_w}s}  {spec.distribution or '?':<{dist_w}s}  "
          f"devices={','.join(spec.devices):<{dev_w}s}  {state}\n")
        detail = spec.detail() if reason is None else None
        if detail:
            w(f"  {'':<{name_w}s}  {detail}\n")
    w("\ncapabilities (native = backend's own, generic = core algorithm on its send/recv,\n"
      "staged = CUDA arrays copied through host memory, - = not supported):\n")
    names = list(found)
    op_w = max(len(op) for op in ALL_OPS)
    col = {n: max(len(n) + 5, len("generic")) + 2 for n in names}  # "<name> cuda", right-aligned
    header = f"  {'op':<{op_w}s}" + "".join(f"{n + ' cpu':>{col[n]}s}{n + ' cuda':>{col[n]}s}" for n in names)
    w(header + "\n")
    for op in ALL_OPS:
        w(f"  {op:<{op_w}s}" + "".join(f"{tables[n][op]['cpu']:>{col[n]}s}{tables[n][op]['cuda']:>{col[n]}s}"
                                       for n in names) + "\n")


def _version(module: str) -> str:
    from importlib import metadata

    dist = {"cupy": "cupy-cuda12x"}.get(module, module)
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m procgroup", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["info", "torch-compat", "flight"], help="what to show")
    parser.add_argument("dumps", nargs="*", help="flight: saved flight dumps (JSON files or directories)")
    parser.add_argument("--markdown", action="store_true", help="torch-compat: print docs/from-torch.md")
    args = parser.parse_args(argv)
    if args.command == "torch-compat":
        from . import _torch_compat  # imports torch: for this command only

        sys.stdout.write(_torch_compat.markdown() if args.markdown else _torch_compat.plain())
        return 0
    if args.command == "flight":
        return flight(args.dumps)
    info()
    return 0


def flight(paths: Sequence[str], out: Any = None) -> int:
    """Print the culprit report of saved flight dumps (docs/debugging.md)."""
    from ._flight import analyse_flight_dumps, load_flight_dumps
    from .errors import InvalidArgumentError

    out = out or sys.stdout
    if not paths:
        sys.stderr.write("python -m procgroup flight: give the dump files or directories to analyse\n")
        return 2
    try:
        dumps = load_flight_dumps(paths)
    except InvalidArgumentError as exc:
        sys.stderr.write(f"python -m procgroup flight: {exc}\n")
        return 2
    out.write(f"{len(dumps)} dump(s), ranks {sorted(d['rank'] for d in dumps)}\n")
    out.write(analyse_flight_dumps(dumps).text() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
