"""Why the mpi backend refuses revoke, agree and shrink: MPI's fault tolerance (ULFM) as
this process's MPI library and mpi4py offer it.

procgroup would drive ULFM (``MPIX_Comm_revoke``/``shrink``/``agree``, mpi4py's
``Comm.Revoke``/``Shrink``/``Agree``) where it works. It does not work with the MPI
libraries procgroup was tested with, so the backend refuses with a message that says
what this process found and what was seen when it was tried (docs/fault-tolerance.md,
"mpi"):

- MPICH 5.0.2 from pip (device ``ch4:ucx ofi``) under ``mpiexec -disable-auto-cleanup``:
  mpi4py 4.1.2 does not bind MPICH's MPIX calls (``Comm.Revoke`` raises
  NotImplementedError; ``Comm.Shrink`` and ``Comm.Agree`` fall back to ``MPI_Comm_dup``
  and ``MPI_Allreduce``, which wait for the dead rank). Called directly, the ch4 device
  stops the process in an internal assertion (``src/mpid/ch4/src/ch4_comm.c``), and
  ``MPIR_CVAR_ENABLE_FT=1`` makes ``MPI_Init`` abort (``ch4_request.h``). A pending
  collective never reports the death.
- Open MPI 5.0.11 from pip under ``mpiexec --with-ft ulfm``: revoke, shrink and agree
  work, but a death is reported only by MPI's own heartbeat detector
  (``--mca mpi_ft_detector true``), and ``MPI_Finalize`` never returns on the
  survivors afterwards, so a job that survived a death cannot end.

Only safe, local checks run here: the library's version string, mpi4py's version and
whether mpi4py bound ULFM's error classes (its fallbacks alias them to
``MPI_ERR_UNKNOWN``). No ULFM call is made: on MPICH's ch4 one would abort the process.
"""

from __future__ import annotations

import functools
import logging
import os
import re

import mpi4py
from mpi4py import MPI

log = logging.getLogger(__name__)

#: What the user can do instead, the end of every refusal.
ADVICE = "use the tcp or gloo backend to survive a death (procgroup-run --keep-going; docs/fault-tolerance.md)"


def library() -> tuple[str, str]:
    """(name and version, MPICH device or "") of the MPI library this process runs on."""
    text = MPI.Get_library_version()
    first = " ".join(text.strip().splitlines()[0].split()) if text.strip() else "an unknown MPI library"
    # "Open MPI v5.0.11, package: ..." -> "Open MPI v5.0.11"; "MPICH Version: 5.0.2" -> "MPICH 5.0.2"
    first = first.split(",")[0].replace(" Version:", "")
    device = re.search(r"MPICH Device:\s*(.+)", text)
    return first, device.group(1).strip() if device else ""


def ulfm_bound() -> bool:
    """True when mpi4py was built with this library's ULFM (its error classes are real)."""
    unknown = MPI.ERR_UNKNOWN
    return all(getattr(MPI, name, unknown) != unknown for name in ("ERR_PROC_FAILED", "ERR_REVOKED"))


@functools.lru_cache(maxsize=1)
def why_not() -> str:
    """The full refusal: why this process's MPI cannot let survivors go on (cached)."""
    name, device = library()
    bound = ulfm_bound()
    binding = (f"mpi4py {mpi4py.__version__} binds ULFM for it" if bound else
               f"mpi4py {mpi4py.__version__} does not bind its ULFM calls (Comm.Revoke raises "
               f"NotImplementedError; Comm.Shrink and Comm.Agree fall back to MPI_Comm_dup and "
               f"MPI_Allreduce, which wait for a dead rank forever)")
    if name.startswith("MPICH"):
        where = f"{name} (device {device})" if device else name
        if "ch4" in device:
            why = (f"{binding}, and MPICH's ch4 device does not implement MPIX_Comm_revoke, "
                   f"MPIX_Comm_shrink or MPIX_Comm_agree: called directly they stop the process in an "
                   f"internal assertion (ch4_comm.c), MPIR_CVAR_ENABLE_FT=1 makes MPI_Init abort the "
                   f"same way, and a pending collective never reports the death while MPI_Finalize "
                   f"hangs on the survivors (tried with MPICH 5.0.2 under mpiexec -disable-auto-cleanup)")
        else:
            why = f"{binding}; procgroup does not drive MPICH's ULFM outside the ch4 device (untested)"
    elif name.startswith("Open MPI"):
        where = name
        enabled = os.environ.get("OMPI_MCA_mpi_ft_enable", "") not in ("", "0", "false")
        why = (f"{binding}{'' if enabled else ' (and this job was not started with mpiexec --with-ft ulfm)'}; "
               f"procgroup does not drive it: with Open MPI 5.0.11 under mpiexec --with-ft ulfm, revoke, "
               f"shrink and agree work, but a death is seen only by MPI's heartbeat detector "
               f"(--mca mpi_ft_detector true) and MPI_Finalize then never returns on the survivors, so "
               f"a job that survived a death could not end")
    else:
        where = name
        why = f"{binding}; procgroup does not drive ULFM on this library (untested)"
    message = (f"the mpi backend cannot revoke, agree or shrink after a death: MPI's fault tolerance "
               f"(ULFM) is not usable with {where}: {why}; {ADVICE}")
    log.debug("survival refused: %s", message)
    return message


__all__ = ["ADVICE", "library", "ulfm_bound", "why_not"]
