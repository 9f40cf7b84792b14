"""The culprit report: what the flight records of a job's ranks say about who holds it up.

A leaf module (standard library only): the backend SDK uses it when an op times out,
procgroup-run when it stops a job or is asked for a report, and ``python -m procgroup
flight`` on saved dumps. Its input is one dump per rank (procgroup.backend._recorder's
``dump``: the ring of ops and the stacks of every thread).

The rules, each from what every rank recorded (collectives are numbered per group, the
same on every member):

- a rank waiting in collective #k of a group waits on each member that has not started
  #k; one that started a *different* op as #k is out of step (it skipped or added a
  collective), and the rank(s) whose op differs from the others' are named;
- a rank waiting in a receive from (a send to) a peer waits on that peer unless the peer
  is in the matching send (receive);
- a rank that is waited on and waits on nobody is a culprit: it is outside procgroup
  (the report gives its main thread's file, line and code), finished, or gone (no dump);
- wait-for edges that close a circle (rank 1 receives from 2, rank 2 is in a barrier
  that waits on 1) are a cycle, and every rank on it is named.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Iterable, Mapping

__all__ = ["Report", "analyse", "describe_op", "where"]

_IN_FLIGHT = ("waiting", "issued")


def _group_name(op: Mapping[str, Any]) -> str:
    key = str(op.get("group") or "")
    if op.get("group_id") == 0 and key.startswith("world"):
        return "the world group"
    ranks = op.get("group_ranks")
    return f"group {op.get('group_id')} (ranks {ranks})" if ranks else f"group {key}"


def _loc(op: Mapping[str, Any]) -> str:
    f = op.get("file")
    return f"{os.path.basename(str(f))}:{op.get('line')}" if f else "?"


def describe_op(op: Mapping[str, Any]) -> str:
    """'all_reduce #5 of the world group (8 B float32) at train.py:30'."""
    name = op.get("op", "?")
    if op.get("kind") == "p2p":
        peer = op.get("peer")
        d = f"{name} {'from' if name == 'recv' else 'to'} rank {peer if peer is not None else 'any'}"
    else:
        d = f"{name} #{op.get('seq')}"
        if op.get("peer") is not None:
            d += f" (root {op.get('peer')})"
    d += f" of {_group_name(op)}"
    nbytes = op.get("bytes")
    if isinstance(nbytes, int) and nbytes >= 0 and op.get("dtype"):
        d += f" ({nbytes} B {op.get('dtype')})"
    # a fast op's caller is not recorded (docs/debugging.md): say so rather than "at ?"
    return d + (f" at {_loc(op)}" if op.get("file") else " (caller not recorded: it completed without waiting)")


def _own(path: str, own_dirs: Iterable[str]) -> bool:
    return any(path.startswith(d) for d in own_dirs) or path.startswith("<frozen") or (
        os.sep + "threading.py" in path or os.sep + "concurrent" + os.sep in path
        or path.endswith("rankside.py") or os.sep + "runpy.py" in path)


def where(dump: Mapping[str, Any]) -> str:
    """Where the rank's main thread is, outside procgroup: 'time.sleep(30) at train.py:88 in load'."""
    own_dirs = dump.get("own_dirs") or ()
    for th in dump.get("stacks") or ():
        if not th.get("main"):
            continue
        frames = th.get("frames") or []
        for fr in reversed(frames):
            if not _own(str(fr.get("file", "")), own_dirs):
                code = fr.get("code") or ""
                at = f"{os.path.basename(str(fr.get('file')))}:{fr.get('line')} in {fr.get('function')}"
                return f"`{code}` at {at}" if code else at
        if frames:
            fr = frames[-1]
            return f"{os.path.basename(str(fr.get('file')))}:{fr.get('line')} in {fr.get('function')}"
    return "an unknown place (no stack)"


@dataclass
class Edge:
    src: int
    dst: int
    why: str


@dataclass
class Report:
    """The analysis: culprit lines first, then what each rank does, then the cycles."""

    culprits: list[int] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # one per culprit finding
    ranks: list[str] = field(default_factory=list)  # one line per rank
    cycles: list[str] = field(default_factory=list)
    first_failure: str | None = None
    recorded: set[int] = field(default_factory=set)  # the ranks whose dumps were analysed

    @property
    def stuck(self) -> list[int]:
        """The culprits that were still there to be asked (not gone before the report)."""
        return [r for r in self.culprits if r in self.recorded]

    def summary(self) -> str:
        """The culprit lines (empty when nothing is known)."""
        lines = [f"culprit: {r}" for r in self.reasons]
        lines += [f"wait-for cycle: {c}" for c in self.cycles]
        if self.first_failure and not lines:
            lines.append(f"first failure: {self.first_failure}")
        return "\n".join(lines)

    def text(self) -> str:
        """The whole report."""
        head = self.summary() or "no culprit found: no rank waits on another"
        return head + "\nranks:\n" + "\n".join(f"  {line}" for line in self.ranks)


def _collectives(dump: Mapping[str, Any]) -> dict[tuple[str, int], Mapping[str, Any]]:
    out = {}
    for op in dump.get("ops") or ():
        if op.get("kind") == "collective":
            out[(str(op.get("group")), int(op.get("seq", -1)))] = op
    return out


def _last_seq(dump: Mapping[str, Any], group: str) -> int:
    best = -1
    for op in dump.get("ops") or ():
        if op.get("kind") == "collective" and op.get("group") == group:
            best = max(best, int(op.get("seq", -1)))
    return best


def _in_flight(dump: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The ops the rank waits in; else its last op when that one failed (a timeout: the
    rank gave up waiting, and what it waited for is the question)."""
    ops = list(dump.get("ops") or ())
    flying = [op for op in ops if op.get("state") in _IN_FLIGHT]
    if not flying and ops and ops[-1].get("state") == "failed":
        flying = [ops[-1]]
    return flying


def analyse(dumps: Iterable[Mapping[str, Any]], world_size: int | None = None,
            absent: Mapping[int, str] | None = None) -> Report:
    """The report for the dumps of a job's ranks (``absent``: rank -> why it has no dump,
    e.g. 'exited with code 1', from procgroup-run)."""
    by_rank: dict[int, Mapping[str, Any]] = {}
    for d in dumps:
        if isinstance(d, Mapping) and isinstance(d.get("rank"), int):
            by_rank[d["rank"]] = d
    absent = dict(absent or {})
    report = Report(recorded=set(by_rank))
    colls = {r: _collectives(d) for r, d in by_rank.items()}
    edges: list[Edge] = []
    out_of_step: dict[int, str] = {}
    waiting: dict[int, list[Mapping[str, Any]]] = {r: _in_flight(d) for r, d in by_rank.items()}

    def gone(m: int) -> str:
        return absent.get(m, "gave no record (it exited, or does not answer)")

    for r, flying in waiting.items():
        for op in flying:
            group = str(op.get("group"))
            members = [int(x) for x in op.get("group_ranks") or ()]
            if op.get("kind") == "collective":
                k = int(op.get("seq", -1))
                name = op.get("op")
                for m in members:
                    if m == r:
                        continue
                    if m not in by_rank:
                        edges.append(Edge(r, m, f"rank {m} {gone(m)}"))
                        continue
                    theirs = colls[m].get((group, k))
                    if theirs is None:
                        if _last_seq(by_rank[m], group) < k:
                            edges.append(Edge(r, m, f"rank {m} never entered {name} #{k} of {_group_name(op)}"))
                    elif theirs.get("op") != name:
                        edges.append(Edge(r, m, f"rank {m} called {describe_op(theirs)} as its collective #{k}"))
            else:
                peer = op.get("peer")
                if not isinstance(peer, int):
                    continue
                if peer not in by_rank:
                    edges.append(Edge(r, peer, f"rank {peer} {gone(peer)}"))
                    continue
                want = "send" if op.get("op") == "recv" else "recv"
                matched = any(o.get("op") == want and o.get("peer") in (r, None) for o in waiting.get(peer, ()))
                if not matched:
                    edges.append(Edge(r, peer, f"rank {peer} is not in a matching {want}"))

    # out of step: members whose collective #k differs from what the others called as #k
    seen: set[tuple[str, int]] = set()
    for flying in waiting.values():
        for op in flying:
            if op.get("kind") != "collective":
                continue
            key = (str(op.get("group")), int(op.get("seq", -1)))
            if key in seen:
                continue
            seen.add(key)
            calls: dict[str, list[int]] = {}
            where_of: dict[str, str] = {}
            for m in op.get("group_ranks") or ():
                theirs = colls.get(int(m), {}).get(key)
                if theirs is not None:
                    calls.setdefault(str(theirs.get("op")), []).append(int(m))
                    where_of.setdefault(str(theirs.get("op")), _loc(theirs))
            if len(calls) > 1:
                biggest = max(len(v) for v in calls.values())
                majority = [o for o, v in calls.items() if len(v) == biggest]
                common = majority[0] if len(majority) == 1 else None
                for o, members in calls.items():
                    if o == common:
                        continue
                    for m in members:
                        others = ", ".join(f"{x} ({', '.join(str(y) for y in v)})" for x, v in calls.items() if x != o)
                        out_of_step[m] = (
                            f"rank {m} is out of step on {_group_name(op)}: its collective #{key[1]} is {o} at "
                            f"{where_of[o]} while the others called {others} at "
                            f"{', '.join(where_of[x] for x in calls if x != o)}; it skipped or added a collective")

    outgoing: dict[int, list[Edge]] = {}
    for e in edges:
        if e.src in out_of_step:
            continue  # an out-of-step rank waits on the others because it is out of step
        outgoing.setdefault(e.src, []).append(e)

    # cycles through the wait-for edges
    cycle_members: set[int] = set()
    graph = {r: sorted({e.dst for e in es}) for r, es in outgoing.items()}
    cycles_found: set[tuple[int, ...]] = set()

    def visit(node: int, path: list[int]) -> None:
        for nxt in graph.get(node, ()):
            if nxt in path:
                cyc = path[path.index(nxt):]
                i = cyc.index(min(cyc))
                norm = tuple(cyc[i:] + cyc[:i])
                if norm not in cycles_found and len(norm) > 1:
                    cycles_found.add(norm)
                    steps = []
                    for a in norm:
                        flying = waiting.get(a) or []
                        what = describe_op(flying[0]) if flying else "?"
                        steps.append(f"rank {a} in {what}")
                    report.cycles.append(" -> ".join(steps) + f" -> rank {norm[0]}")
                    cycle_members.update(norm)
            elif len(path) < 64:
                visit(nxt, path + [nxt])

    for start in sorted(graph):
        visit(start, [start])

    culprits: list[int] = []
    for m, why in sorted(out_of_step.items()):
        culprits.append(m)
        flying_m = waiting.get(m) or []
        verb = "failed" if flying_m and flying_m[0].get("state") == "failed" else "waiting"
        report.reasons.append(why + (f"; it {verb} in {describe_op(flying_m[0])}" if flying_m else ""))
    waited_on: dict[int, list[Edge]] = {}
    for es in outgoing.values():
        for e in es:
            waited_on.setdefault(e.dst, []).append(e)
    for m in sorted(waited_on):
        if m in outgoing or m in out_of_step:
            continue
        e = waited_on[m][0]
        if m in by_rank:
            flying = waiting.get(m) or []
            if flying:
                state = f"it is {'waiting' if flying[0].get('state') != 'failed' else 'failed'} in {describe_op(flying[0])}"
            else:
                state = f"it is in {where(by_rank[m])}"
            report.reasons.append(f"{e.why}; {state}")
        else:
            report.reasons.append(e.why)
        culprits.append(m)
    for cyc in sorted(cycles_found):
        # on a cycle the point-to-point call is the one that cannot complete: the peer it
        # waits on is in another op that waits (through the cycle) on this rank
        named = [a for a in cyc if (waiting.get(a) or [{}])[0].get("kind") == "p2p"] or list(cyc)
        for a in named:
            nxt = cyc[(cyc.index(a) + 1) % len(cyc)]
            mine, theirs = (waiting.get(a) or [{}])[0], (waiting.get(nxt) or [{}])[0]
            report.reasons.append(
                f"rank {a} is in a wait-for cycle: its {describe_op(mine)} cannot complete, because rank {nxt} "
                f"is in {describe_op(theirs)}, which waits (through the cycle) on rank {a}")
            if a not in culprits:
                culprits.append(a)
    for m in sorted(cycle_members):
        if m not in culprits:
            culprits.append(m)
    report.culprits = culprits

    ranks = sorted(set(by_rank) | set(absent) | ({*range(world_size)} if world_size else set()))
    for r in ranks:
        found = by_rank.get(r)
        if found is None:
            report.ranks.append(f"rank {r}: {gone(r)}")
            continue
        d = found
        flying = waiting.get(r) or []
        if flying:
            on = sorted({e.dst for e in edges if e.src == r})
            whom = f", on rank{'s' if len(on) > 1 else ''} {', '.join(map(str, on))}" if on else ""
            since, until = flying[0].get("start"), flying[0].get("end") or d.get("time", 0)
            age = f" for {max(0.0, float(until) - float(since)):.1f} s" if isinstance(since, (int, float)) else ""
            verb = "failed in" if flying[0].get("state") == "failed" else "waiting in"
            report.ranks.append(f"rank {r}: {verb} {describe_op(flying[0])}{age}{whom}")
        else:
            last = (d.get("ops") or [None])[-1]
            after = f" (last op: {describe_op(last)}, {last.get('state')})" if last else ""
            report.ranks.append(f"rank {r}: not in procgroup; in {where(d)}{after}")
        if d.get("first_failure") and report.first_failure is None:
            report.first_failure = str(d["first_failure"])
    return report
