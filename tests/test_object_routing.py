"""Object collectives unpickle only what authenticated members sent (issue 14).

On tcp every connection passed the job-token handshake, so the objects travel on the
group itself. gloo's and MPI's own transports do not know the token: there the objects
go over a tcp host side group, made by the first object collective. Each check also
compares the objects exchanged, so the routing is shown on real traffic.
"""

from __future__ import annotations

from typing import Any

import procgroup as pg
import pytest
from _installed import require_gloo
from procgroup import _state
from procgroup.testing import spawn


def _objects_and_route(rank: int, size: int) -> dict[str, Any]:
    gathered: list[Any] = [None] * size
    pg.all_gather_object(gathered, {"rank": rank, "payload": "x" * (rank + 1)})
    box = [("from", rank)] if rank == 1 else [None]
    pg.broadcast_object_list(box, src=1)
    sub = pg.new_group([1, 0])
    sub_box = [{"sub": rank}] if rank == 0 else [None]
    pg.broadcast_object_list(sub_box, src=0, group=sub)
    world = _state.resolve(None)
    route = {
        "world": None if world.host_group is None else world.host_group.backend,
        "sub": None if sub.host_group is None else sub.host_group.backend,
    }
    pg.barrier()
    return {"gathered": gathered, "box": box, "sub_box": sub_box, "route": route}


@pytest.mark.parametrize("backend", ["tcp", "gloo", "mpi"])
def test_objects_travel_only_on_authenticated_connections(backend: str) -> None:
    if backend == "gloo":
        require_gloo()  # tcp and mpi: scripts/setup-dev.sh installs them on every leg
    if backend == "mpi":
        results = spawn(_objects_and_route, 2, "mpi", launcher="mpiexec", init_method=None, timeout=60)
    else:
        results = spawn(_objects_and_route, 2, backend, timeout=60)
    for res in results:
        assert res["gathered"] == [{"rank": 0, "payload": "x"}, {"rank": 1, "payload": "xx"}]
        assert res["box"] == [("from", 1)]
        assert res["sub_box"] == [{"sub": 0}]
        # tcp: on the group itself (no side group); gloo, mpi: a tcp side group
        expected = None if backend == "tcp" else "tcp"
        assert res["route"] == {"world": expected, "sub": expected}
