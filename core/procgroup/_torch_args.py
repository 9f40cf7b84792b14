"""torch.distributed's calling conventions for procgroup's public functions.

- :func:`torch_names`: a function is defined with torch's parameter names, defaults and
  positional order; procgroup's older spellings (``array=`` ...) are accepted as aliases.
  Passing an alias together with the name it stands for is a TypeError naming both; an
  unknown keyword's TypeError lists torch's names and procgroup's aliases.
- :func:`root_rank`: torch's ``src``/``dst`` (world ranks) or ``group_src``/``group_dst``
  (ranks inside the group), exactly one of them, as a group rank.
- :func:`member_or_none`: torch's rule for a rank outside the group: the call warns once
  per op and does nothing (returns None), rather than raising.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, TypeVar
from collections.abc import Callable, Mapping

from . import _state
from .errors import InvalidArgumentError
from .groups import Group

F = TypeVar("F", bound=Callable[..., Any])


def torch_names(aliases: Mapping[str, str] | None = None) -> Callable[[F], F]:
    """Accept ``aliases`` (old name -> torch's name) as keywords of the decorated function.

    The function's own signature (what ``inspect.signature`` reports) is torch's; a call
    that uses only those names pays one set lookup.
    """
    renames = dict(aliases or {})

    def decorate(fn: F) -> F:
        order = list(inspect.signature(fn).parameters)
        known = frozenset(order)
        for old, new in renames.items():
            if new not in known:  # a typo in a table must fail at import, not at a call
                raise AssertionError(f"{fn.__name__}: alias {old!r} names unknown parameter {new!r}")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if kwargs and not known.issuperset(kwargs):
                kwargs = _rename(fn, kwargs, renames, order[:len(args)])
            return fn(*args, **kwargs)

        wrapper.__procgroup_aliases__ = renames  # type: ignore[attr-defined]  # read back by the docs and tests
        return wrapper  # type: ignore[return-value]  # same signature as fn, aliases added

    return decorate


def _rename(fn: Callable[..., Any], kwargs: dict[str, Any], renames: Mapping[str, str],
            positional: list[str]) -> dict[str, Any]:
    known = inspect.signature(fn).parameters
    out: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key in known:
            out[key] = value
            continue
        new = renames.get(key)
        if new is None:
            names = ", ".join(inspect.signature(fn).parameters)
            old = ", ".join(f"{o} (= {n})" for o, n in renames.items())
            also = f"; procgroup's older names: {old}" if old else ""
            raise TypeError(f"{fn.__name__}() got an unexpected keyword argument {key!r}; "
                            f"its parameters (torch.distributed's names): {names}{also}")
        if new in kwargs or new in positional:
            raise TypeError(f"{fn.__name__}() got both {new!r} and {key!r}, which is procgroup's older "
                            f"name for {new!r}; pass only {new!r}")
        out[new] = value
    return out


def root_rank(g: Group, rank: int | None, group_rank: int | None, what: str, op: str,
              default: int | None = None) -> int:
    """The group rank meant by torch's ``what`` (a world rank) or ``group_what`` (a rank in
    the group); exactly one may be given (``default`` is the world rank used when neither is)."""
    if group_rank is not None:
        if rank is not None:
            raise InvalidArgumentError(f"{op}: pass either {what} (a world rank) or group_{what} "
                                       f"(a rank in the group), not both")
        if isinstance(group_rank, bool) or not isinstance(group_rank, int) or not 0 <= group_rank < g.size:
            raise InvalidArgumentError(f"{op}: group_{what}={group_rank!r} is not a rank of this group "
                                       f"(0..{g.size - 1})")
        return group_rank
    if rank is None:
        if default is None:
            raise InvalidArgumentError(f"{op}: pass {what} (a world rank) or group_{what} (a rank in the group)")
        rank = default
    return g.group_rank(rank, what)


def world_rank(g: Group, rank: int | None, group_rank: int | None, what: str, op: str) -> int | None:
    """Like :func:`root_rank` but a world rank, and None when neither is given (any source)."""
    if rank is None and group_rank is None:
        return None
    return g.global_rank(root_rank(g, rank, group_rank, what, op))


_warned: set[str] = set()


def member_or_none(group: Any, op: str) -> Group | None:
    """The member Group for ``group``, or None (after warning once per op, as torch does)
    when this rank is not in it: torch's non-members skip the call, nothing is sent."""
    g = _state.resolve(group)
    if g.is_member:
        return _state.member(g, op)
    if op not in _warned:
        _warned.add(op)
        rank = _state.world().world.rank
        warnings.warn(f"Running {op} on global rank {rank} which does not belong to the given group "
                      f"{list(g.ranks)}: nothing is done", stacklevel=4)
    return None


__all__ = ["member_or_none", "root_rank", "torch_names", "world_rank"]
