"""What the tutorial_*.py examples share: picking the array kind, and starting the ranks.

The examples follow the layout of "Writing Distributed Applications with PyTorch": a
``run(rank, size)`` function, an ``init_process`` that joins the group and calls it, and
a main block that starts one process per rank, with ``import procgroup as dist`` in
place of torch.distributed. ``--arrays torch`` uses torch tensors, ``--arrays numpy``
(the default) NumPy arrays; the calls are the same. Under mpiexec (``--backend mpi``)
the ranks come from MPI and no processes are started here.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import sys
from typing import Any
from collections.abc import Callable

import numpy as np
import procgroup as dist

#: "numpy" or "torch": what zeros()/ones() build (set by main() or the caller)
ARRAYS = os.environ.get("TUTORIAL_ARRAYS", "numpy")


def zeros(*shape: int) -> Any:
    if ARRAYS == "torch":
        import torch

        return torch.zeros(*shape)
    return np.zeros(shape, dtype=np.float32)


def ones(*shape: int) -> Any:
    return zeros(*shape) + 1


def as_numpy(x: Any) -> np.ndarray:
    return x.numpy() if hasattr(x, "numpy") else np.asarray(x)


def init_process(rank: int, size: int, fn: Callable[[int, int], None], backend: str = "tcp",
                 arrays: str = "numpy") -> None:
    """Join the group, run ``fn``, leave."""
    global ARRAYS
    ARRAYS = arrays
    if backend == "mpi":
        dist.init_process_group(backend)  # MPI says who is who
    else:
        dist.init_process_group(backend, rank=rank, world_size=size)
    fn(dist.get_rank(), dist.get_world_size())
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(fn: Callable[[int, int], None], default_size: int = 2) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="tcp", help="tcp, gloo or mpi (mpi: start with mpiexec -n N)")
    parser.add_argument("--arrays", choices=["numpy", "torch"], default=ARRAYS)
    parser.add_argument("-n", "--size", type=int, default=default_size)
    args = parser.parse_args()
    if args.backend == "mpi":
        init_process(-1, -1, fn, "mpi", args.arrays)
        return
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    mp.set_start_method("spawn")
    processes = []
    for rank in range(args.size):
        p = mp.Process(target=init_process, args=(rank, args.size, fn, args.backend, args.arrays))
        p.start()
        processes.append(p)
    for p in processes:
        p.join()
    sys.exit(max(abs(p.exitcode or 0) for p in processes))
