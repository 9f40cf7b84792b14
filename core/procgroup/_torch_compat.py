"""procgroup next to the installed torch.distributed: which function is the same, which
differs and why, which does not apply; ``python -m procgroup torch-compat [--markdown]``.

The status of a function procgroup shares with torch is computed by comparing the two
signatures (names, kinds, order, defaults; procgroup may add keyword-only parameters
after torch's); the notes and the reasons for what procgroup leaves out are the tables
below. docs/from-torch.md is this module's ``--markdown`` output.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

from .errors import UnsupportedOperationError

#: what procgroup does differently behind the same signature
NOTES = {
    "init_process_group": "also takes procgroup's keyword-only `options=` (backend settings) and `token=` "
                          "(the job's secret); `pg_options` is an alias of `options`; `device_id` is accepted; "
                          "mpi takes MPI's rank and size under mpiexec",
    "new_group": "every rank of the world calls it (`use_local_synchronization=True` is refused); a non-member "
                 "gets a Group whose rank is -1 rather than NON_GROUP_MEMBER; `pg_options` are procgroup's "
                 "backend settings (alias `options`)",
    "new_subgroups": "group_size defaults to $LOCAL_WORLD_SIZE (torch: the CUDA device count)",
    "barrier": "`device_ids` is accepted and not needed; `timeout` bounds this call",
    "monitored_barrier": "runs on the job's Store on every backend; names exactly the ranks that did not "
                         "arrive (wait_all_ranks=False: the first of them)",
    "all_gather_object": "`weights_only=True` unpickles plain data only (containers, numbers, str, bytes, "
                         "NumPy arrays and dtypes) and refuses anything else, naming the sender",
    "gather_object": "`weights_only` as all_gather_object",
    "broadcast_object_list": "`device` is accepted (pickles travel in host memory); `weights_only` as "
                             "all_gather_object",
    "scatter_object_list": "`weights_only` as all_gather_object",
    "send_object_list": "`device`, `use_batch` accepted; the receiver's `weights_only` decides",
    "recv_object_list": "`device`, `use_batch` accepted; `weights_only` as all_gather_object",
    "all_to_all_single": "uneven split sizes are padded to the largest split and run as one all_to_all",
    "batch_isend_irecv": "ops start in list order, all at once; a non-member's op gets no Work",
    "is_backend_available": "an installed plugin whose own check passes here (`python -m procgroup info` "
                            "says why not)",
    "get_node_local_rank": "raises InvalidArgumentError (a ValueError) where torch raises RuntimeError",
    "send": "tensors: torch CPU tensors (in place), NumPy/CuPy arrays, buffers; older keyword `array=`",
    "recv": "returns -1 on a non-member of `group`, as torch; older keyword `array=`",
    "all_gather": "older keywords `array_list=`, `array=`",
    "all_to_all": "older keywords `output_list=`, `input_list=`",
}

#: torch functions procgroup does not provide, and why
NOT_PROVIDED = {
    "all_gather_coalesced": "not provided: deprecated by torch; loop over all_gather (or all_gather_into_tensor)",
    "all_reduce_coalesced": "not provided: deprecated by torch; all_reduce one flat array instead",
    "all_gather_single": "not provided: all_gather_into_tensor does the same",
    "gather_single": "not provided: gather into a list of views of one array",
    "gather_into_tensor": "not provided: gather into a list of views of one array",
    "reduce_scatter_single": "not provided: reduce_scatter_tensor does the same",
    "breakpoint": "not applicable: debug one rank with procgroup-run's per-rank logs",
    "get_backend_config": "not applicable: no device-to-backend map; one backend per group",
    "get_backend_impl": "not applicable: procgroup's backends are plugins (`python -m procgroup info`)",
    "get_default_backend_for_device": "not applicable: the backend is named at init (default tcp)",
    "is_ucc_available": "not applicable: no ucc backend",
    "is_xccl_available": "not applicable: no xccl backend",
    "get_debug_level": "not applicable: procgroup reads PROCGROUP_DEBUG (docs/debugging.md)",
    "set_debug_level": "not applicable: procgroup reads PROCGROUP_DEBUG (docs/debugging.md)",
    "set_debug_level_from_env": "not applicable: procgroup reads PROCGROUP_DEBUG (docs/debugging.md)",
    "get_pg_count": "not provided",
    "init_device_mesh": "not applicable: DeviceMesh belongs to torch's tensor parallelism",
    "record_comm": "not applicable: procgroup's flight recorder is always on (docs/debugging.md)",
    "register_rendezvous_handler": "differs: init methods are plugins (hook procgroup_init_methods)",
    "rendezvous": "differs: procgroup.rendezvous.rendezvous(url, ...) returns a RendezvousResult",
    "set_timeout": "not provided: pass timeout= to init_process_group or new_group",
    "shrink_group": "differs: procgroup.shrink(group) builds the group of the live members (ULFM)",
    "split_group": "not provided: new_group / new_subgroups_by_enumeration",
    "supports_complex": "not provided: every reduction but MIN/MAX takes complex dtypes",
}

#: torch classes a program uses, and procgroup's counterpart
CLASSES = {
    "P2POp": "procgroup.P2POp",
    "ReduceOp": "procgroup.ReduceOp (SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR, BXOR; alias reduce_op)",
    "Work": "procgroup.Work: wait(timeout), is_completed(), result(), cancel(), awaitable",
    "group": "procgroup.group.WORLD",
    "GroupMember": "procgroup.GroupMember.WORLD",
    "Backend": "procgroup.Backend (names of the shipped backends)",
    "Store": "procgroup.rendezvous.Store (TCPStore, FileStore, HashStore, PrefixStore)",
    "ProcessGroup": "procgroup.Group (a handle: ranks, rank, size, backend)",
}


def torch_functions() -> dict[str, Any]:
    """The public functions of the installed torch.distributed, by name."""
    try:
        import torch.distributed as td  # only this command needs torch
    except ImportError as exc:
        raise UnsupportedOperationError(f"torch-compat compares procgroup with the installed torch.distributed, "
                                        f"and torch cannot be imported ({exc}); pip install torch") from None

    found = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reduce_op's deprecation, touched by dir()
        for name in dir(td):
            obj = getattr(td, name)
            if not name.startswith("_") and (inspect.isfunction(obj) or inspect.isbuiltin(obj)):
                found[name] = obj
        found["P2POp"] = td.P2POp
    return found


def shared_functions() -> list[str]:
    import procgroup

    return sorted(n for n in torch_functions() if n in procgroup.__all__)


def _params(fn: Any) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(fn).parameters.values() if not p.name.startswith("_")]


def _default(value: Any) -> Any:
    """Defaults compared by meaning: an enum member by its name (torch's RedOpType.SUM is
    procgroup's ReduceOp.SUM)."""
    return getattr(value, "name", value) if value is not inspect.Parameter.empty else value


def compare(name: str) -> str | None:
    """None when procgroup's ``name`` takes torch's parameters, else what differs."""
    import procgroup

    theirs = _params(torch_functions()[name])
    ours = _params(getattr(procgroup, name))
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    for i, t in enumerate(theirs):
        if i >= len(ours):
            return f"missing parameter {t.name!r}"
        o = ours[i]
        if o.name != t.name:
            return f"parameter {i + 1} is {o.name!r}, torch's is {t.name!r}"
        if o.kind != t.kind and not (o.kind in kinds and t.kind in kinds and o.kind == kinds[0]):
            return f"parameter {t.name!r} is {o.kind.description}, torch's is {t.kind.description}"
        if _default(o.default) != _default(t.default):
            return f"parameter {t.name!r} defaults to {o.default!r}, torch's to {t.default!r}"
    extra = [p.name for p in ours[len(theirs):] if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    if extra:
        return f"extra positional parameters {extra}"
    return None


def rows() -> list[tuple[str, str, str]]:
    """(function, status, notes) for every public function of torch.distributed."""
    import procgroup

    out = []
    for name in sorted(torch_functions()):
        if name == "P2POp":
            continue
        if name in procgroup.__all__:
            diff = compare(name)
            status = "same" if diff is None else f"differs: {diff}"
            out.append((name, status, NOTES.get(name, "")))
        else:
            reason = NOT_PROVIDED.get(name, "not provided")
            status = reason.split(":", 1)[0]
            out.append((name, status, reason.split(":", 1)[1].strip() if ":" in reason else ""))
    return out


def markdown() -> str:
    """docs/from-torch.md."""
    table = rows()  # first: it says clearly when torch is missing
    import torch

    lines = [
        "# Coming from torch.distributed",
        "",
        "<!-- generated by `python -m procgroup torch-compat --markdown > docs/from-torch.md`; "
        "tests/test_torch_api.py checks it is current -->",
        "",
        "A torch.distributed program runs with `import procgroup as dist`: the functions below",
        "marked *same* take torch's parameter names, defaults and positional order (compared here",
        f"with the installed torch {torch.__version__.split('+')[0]}), CPU torch tensors are moved in place,",
        "and a rank outside a group that calls a collective on it gets a warning and nothing",
        "happens, as in torch. procgroup's older spellings (`array=` ...) still work as aliases;",
        "passing an alias with the name it stands for is a TypeError. The 2017 module's",
        "`get_num_processes`, int groups (0 is the world) and `gather_send`/`gather_recv`/",
        "`scatter_send`/`scatter_recv` exist too. See [guide.md](guide.md) for the details.",
        "",
        "| torch.distributed | procgroup | notes |",
        "|---|---|---|",
    ]
    counts = {k: sum(1 for _, st, _ in table if st.startswith(k)) for k in ("same", "differs", "not provided",
                                                                           "not applicable")}
    lines.insert(-2, ", ".join(f"{k}: {v}" for k, v in counts.items()) + f" (of {len(table)} functions).\n")
    lines += [f"| `{n}` | {st} | {note} |" for n, st, note in table]
    lines += ["", "## Classes", "", "| torch.distributed | procgroup |", "|---|---|"]
    p2p = compare("P2POp")
    lines += [f"| `{n}` | {c}" + (f" (constructor: {'same' if p2p is None else p2p})" if n == "P2POp" else "") + " |"
              for n, c in CLASSES.items()]
    return "\n".join(lines) + "\n"


def plain() -> str:
    width = max(len(n) for n, _, _ in rows())
    return "".join(f"{n:<{width}s}  {s}{'  (' + note + ')' if note else ''}\n" for n, s, note in rows())


__all__ = ["CLASSES", "NOTES", "NOT_PROVIDED", "compare", "markdown", "plain", "rows", "shared_functions",
           "torch_functions"]
