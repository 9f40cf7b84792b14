"""What procgroup reads from Slurm: host lists, and a master port derived from the job step.

**Host lists.** Slurm writes node sets compactly: ``node[01-04,07],gpu7,rack[1-2]-n[1-2]``
(ranges keep their zero padding; several bracket groups in one name multiply out).
:func:`expand_hostlist` expands one the way ``scontrol show hostnames`` does.

**The master port rule.** Inside a Slurm job step with MASTER_PORT unset, env:// (and
procgroup-run under ``srun``/``sbatch``) uses::

    port = 20000 + (SLURM_JOB_ID mod 1000) * 10 + slot
    slot = SLURM_STEP_ID mod 9, or 9 for the batch script

so every rank of a step computes the same port without talking, jobs sharing a node use
different ports unless their ids are equal modulo 1000 (for example jobs 1234 and 2234
both running on one node), and up to 9 consecutive steps of one job get different
ports. A step with no numeric id (the batch script itself, whose SLURM_STEP_ID Slurm
leaves unset or sets to a reserved value) has slot 9 to itself, so it never shares a
port with a step it starts. The range 20000-29999 stays below Linux's ephemeral ports
(32768 and up), which outgoing connections take, and clear of Slurm's own 6817/6818 and
of Open MPI's rule (:mod:`._openmpi`, 10000-19999). Set MASTER_PORT to choose another
port.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from procgroup.errors import InvalidArgumentError

PORT_BASE = 20000
#: ports per job: the numbered steps' slots and the batch script's
STEPS_PER_JOB = 10
#: jobs told apart: job ids modulo this
JOBS = 1000
#: the slot of a step without a numeric id (the batch script)
BATCH_STEP_SLOT = STEPS_PER_JOB - 1
#: numbered steps take the slots below the batch script's: step id modulo this
STEP_SLOTS = BATCH_STEP_SLOT
#: Slurm's reserved step ids (pending, extern, batch, interactive ...) start here
_RESERVED_STEP_ID = 0xFFFFFFF0
#: at most this many hosts from one list (a typo like n[1-99999999] must not eat memory)
MAX_HOSTS = 1_000_000

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets; unbalanced brackets are an error."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError("nested '['")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("']' without '['")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError("'[' without ']'")
    parts.append(text[start:])
    return parts


def _expand_ranges(body: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        item = item.strip()
        m = _RANGE.match(item)
        if not m:
            raise ValueError(f"bad range {item!r} (expected N or N-M)")
        lo, hi = m.group(1), m.group(2)
        if hi is None:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise ValueError(f"range {item!r} runs backwards")
        if int(hi) - int(lo) >= MAX_HOSTS:
            raise ValueError(f"range {item!r} has more than {MAX_HOSTS} hosts")
        width = len(lo) if lo.startswith("0") or len(lo) == len(hi) else 0
        out.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return out


def _expand_one(name: str) -> list[str]:
    """``rack[1-2]-n[01-02]`` -> rack1-n01, rack1-n02, rack2-n01, rack2-n02."""
    open_at = name.find("[")
    if open_at < 0:
        return [name]
    close_at = name.index("]", open_at)
    head, body, tail = name[:open_at], name[open_at + 1:close_at], name[close_at + 1:]
    rest = _expand_one(tail)
    numbers = _expand_ranges(body)
    if len(numbers) * len(rest) > MAX_HOSTS:  # counted before the product is built
        raise ValueError(f"more than {MAX_HOSTS} hosts")
    return [head + n + r for n in numbers for r in rest]


def expand_hostlist(hostlist: str, variable: str = "the host list", where: str = "env://") -> list[str]:
    """Every host of a Slurm host list, in order: ``"n[01-03,07],gpu1"`` -> n01 n02 n03 n07 gpu1."""
    text = hostlist.strip()
    try:
        if not text:
            raise ValueError("it is empty")
        hosts: list[str] = []
        for entry in _split_top(text):
            entry = entry.strip()
            if not entry:
                raise ValueError("an empty entry")
            hosts.extend(_expand_one(entry))
            if len(hosts) > MAX_HOSTS:
                raise ValueError(f"more than {MAX_HOSTS} hosts")
    except ValueError as exc:
        raise InvalidArgumentError(
            f"{where}: cannot read a host from {variable}={hostlist!r}, a Slurm host list "
            f"({exc}); set MASTER_ADDR"
        ) from None
    return hosts


def first_host(hostlist: str, variable: str = "the host list", where: str = "env://") -> str:
    """The first host of a Slurm host list (only the first entry is expanded)."""
    try:
        first = _split_top(hostlist.strip())[0].strip()
    except ValueError:
        first = hostlist  # expand_hostlist reports it
    return expand_hostlist(first or hostlist, variable, where)[0]


def _int_or_none(value: str | None) -> int | None:
    value = (value or "").strip()
    return int(value) if value.isascii() and value.isdigit() else None


def in_job(environ: Mapping[str, str]) -> bool:
    """True inside a Slurm job (the batch script or a step)."""
    return _int_or_none(environ.get("SLURM_JOB_ID")) is not None


def step_nodelist(environ: Mapping[str, str]) -> tuple[str | None, str]:
    """The step's node list (SLURM_STEP_NODELIST), else the job's; and the variable."""
    for var in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        value = environ.get(var, "").strip()
        if value:
            return value, var
    return None, ""


def master_addr(environ: Mapping[str, str], where: str = "env://") -> tuple[str | None, str]:
    """The first host of the step's (else the job's) node list, and the variable it came from."""
    nodelist, var = step_nodelist(environ)
    if nodelist is None:
        return None, ""
    return first_host(nodelist, var, where), var


def master_port(environ: Mapping[str, str]) -> int | None:
    """The port the module docstring's rule gives this job step; None outside a Slurm job."""
    job = _int_or_none(environ.get("SLURM_JOB_ID"))
    if job is None:
        return None
    step = _int_or_none(environ.get("SLURM_STEP_ID", environ.get("SLURM_STEPID")))
    slot = BATCH_STEP_SLOT if step is None or step >= _RESERVED_STEP_ID else step % STEP_SLOTS
    return PORT_BASE + (job % JOBS) * STEPS_PER_JOB + slot


__all__ = ["expand_hostlist", "first_host", "in_job", "master_addr", "master_port", "step_nodelist"]
