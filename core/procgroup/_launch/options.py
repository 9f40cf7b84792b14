"""The validated configuration of one ``procgroup-run`` invocation."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from procgroup.errors import InvalidArgumentError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaunchOptions:
    """Everything the supervisor needs; built by :func:`procgroup.run.parse_args`."""

    target: str  # a script path, or a module name when ``module`` is True
    target_args: tuple[str, ...] = ()
    module: bool = False
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    backend: str | None = None
    prefix: bool = True
    log_dir: str | None = None
    max_restarts: int = 0
    timeout: float | None = None
    grace_period: float = 5.0
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def global_rank(self, local_rank: int) -> int:
        """Ranks are numbered node by node: node k holds ranks k*n .. k*n+n-1."""
        return self.node_rank * self.nproc_per_node + local_rank

    def validate(self) -> LaunchOptions:
        """Raise InvalidArgumentError naming the first bad option; return self."""
        if self.nproc_per_node < 1:
            raise InvalidArgumentError(
                f"--nproc-per-node must be >= 1, got {self.nproc_per_node}"
            )
        if self.nnodes < 1:
            raise InvalidArgumentError(f"--nnodes must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise InvalidArgumentError(
                f"--node-rank must be in [0, {self.nnodes - 1}] for --nnodes {self.nnodes}, "
                f"got {self.node_rank}"
            )
        if self.master_port is not None and not 1 <= self.master_port <= 65535:
            raise InvalidArgumentError(
                f"--master-port must be in [1, 65535], got {self.master_port}"
            )
        if self.master_port is None and self.nnodes > 1:
            raise InvalidArgumentError(
                "--master-port is required with --nnodes > 1: every node's launcher must be "
                "given the same port (only a single-node job picks a free one itself)"
            )
        if not self.master_addr:
            raise InvalidArgumentError("--master-addr must not be empty")
        if self.max_restarts < 0:
            raise InvalidArgumentError(f"--max-restarts must be >= 0, got {self.max_restarts}")
        if self.timeout is not None and not self.timeout > 0:
            raise InvalidArgumentError(f"--timeout must be > 0 seconds, got {self.timeout}")
        if not self.grace_period >= 0:
            raise InvalidArgumentError(
                f"--grace-period must be >= 0 seconds, got {self.grace_period}"
            )
        if not self.target:
            raise InvalidArgumentError("no script or -m module given")
        if not self.module and not os.path.isfile(self.target):
            raise InvalidArgumentError(f"script not found: {self.target!r}")
        if self.backend is not None and not self.backend.strip():
            raise InvalidArgumentError("--backend must not be empty")
        return self
