"""env:// under torchrun: where rank 0's store goes when torchrun's agent holds MASTER_PORT.

torchrun (torch >= 2.4) hands its workers the agent's own c10d TCPStore: MASTER_ADDR and
MASTER_PORT name that store, which is already listening, and TORCHELASTIC_USE_AGENT_STORE
is ``True``. procgroup's rank 0 cannot bind that port (its store speaks procgroup's
authenticated protocol, not c10d's), so instead:

- rank 0 starts procgroup's store on a free port of the address that routes to
  MASTER_ADDR (loopback for a one-node ``torchrun --standalone``) and writes
  ``"host port"`` under a key of its own in the agent's store;
- every other rank reads that key (waiting up to the init timeout) and connects there.

The key holds TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT and the group name, so a
restart (``--max-restarts``) never reads the address of an earlier attempt. The agent's
store is reached with torch's own client: torch is installed wherever torchrun is.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from procgroup.errors import InvalidArgumentError, StoreTimeoutError

ENV_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
#: at most this many bytes are read back from the agent's store
MAX_VALUE_BYTES = 512


def agent_store_in_use(environ: Mapping[str, str]) -> bool:
    """True when torchrun says MASTER_ADDR:MASTER_PORT is its agent's (already listening) store."""
    return environ.get(ENV_AGENT_STORE, "").strip().lower() in ("true", "1", "yes")


def address_key(environ: Mapping[str, str], group_name: str) -> str:
    """The agent-store key of rank 0's store address for this attempt of this run."""
    run = environ.get("TORCHELASTIC_RUN_ID", "none").strip() or "none"
    attempt = environ.get("TORCHELASTIC_RESTART_COUNT", "0").strip() or "0"
    return f"procgroup/{run}/{attempt}/{group_name}/store_address"


class AgentStore:
    """A client of torchrun's agent store (torch's TCPStore), for one key's exchange."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        try:
            import torch.distributed as tdist
        except ImportError as exc:
            raise InvalidArgumentError(
                f"env://: {ENV_AGENT_STORE}=True says MASTER_ADDR:MASTER_PORT is torchrun's agent "
                f"store, but torch cannot be imported here to read it ({exc}); unset "
                f"{ENV_AGENT_STORE} and set a free MASTER_PORT, or start the job with procgroup-run"
            ) from None
        self.where = f"{host}:{port}"
        try:
            self._store: Any = tdist.TCPStore(host, port, is_master=False,
                                              timeout=datetime.timedelta(seconds=timeout))
        except Exception as exc:  # noqa: BLE001  (torch's errors are RuntimeError subclasses)
            raise StoreTimeoutError(
                f"env://: could not reach torchrun's agent store at {self.where} within "
                f"{timeout:g}s ({exc})", op="rendezvous") from None

    def publish(self, key: str, host: str, port: int) -> None:
        self._store.set(key, f"{host} {port}")

    def fetch(self, key: str) -> tuple[str, int]:
        """Rank 0's ``(host, port)``; waits up to the timeout given at construction."""
        try:
            raw = bytes(self._store.get(key))
        except Exception as exc:  # noqa: BLE001 - the same: any failure of get() is a missing address
            raise StoreTimeoutError(
                f"env://: rank 0 did not publish its store address in torchrun's agent store at "
                f"{self.where} ({exc})", op="rendezvous", ranks=[0]) from None
        try:
            if len(raw) > MAX_VALUE_BYTES:
                raise ValueError("too long")
            host, port_text = raw.decode().rsplit(" ", 1)
            port = int(port_text)
            if not host or not 1 <= port <= 65535:
                raise ValueError("no host or a port out of range")
        except ValueError as exc:
            raise InvalidArgumentError(
                f"env://: torchrun's agent store at {self.where} holds {raw[:80]!r} under {key}, "
                f"not rank 0's store address ({exc})") from None
        return host, port


__all__ = ["AgentStore", "address_key", "agent_store_in_use"]
