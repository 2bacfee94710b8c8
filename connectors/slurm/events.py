"""Slurm node events: when nodes were drained or down, and why (README "Infrastructure-affected time").

slurmdbd keeps each node state change as an event: ``sacctmgr -n -P show event event=node start=...
end=... format=NodeName,Start,End,State,Reason`` lists them with their reason and ``End`` = ``Unknown``
while the state lasts. DOWN becomes ``down`` (NOT_RESPONDING alone does not: slurmctld marks the node DOWN
after SlurmdTimeout); DRAIN, FAIL (a drain that is still
draining running jobs) becomes ``drain``; other states (maintenance, power saving, reboot) are not faults
and are skipped. Reason is the last column because Slurm prints it unescaped (it may contain ``|``).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from auditor.records import NodeEvent
from connectors.base import Problems
from connectors.slurm.parse import expand_hostlist, parse_time

EVENT_FIELDS = ("NodeName", "Start", "End", "State", "Reason")


def event_kind(state: str) -> str | None:
    """Slurm node state (``DOWN``, ``DRAIN``, ``IDLE+DRAIN``, ``DOWN*``...) -> ``down``, ``drain`` or None."""
    parts = {p.strip("*~#!%$@^-").upper() for p in state.replace("+", " ").split()}
    if "DOWN" in parts:  # NOT_RESPONDING alone (sinfo's "*") is transient: slurmctld marks DOWN after SlurmdTimeout
        return "down"
    if parts & {"DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING"}:
        return "drain"
    return None


def parse_events(text: str, cluster: str, problems: Problems, source: str) -> Iterator[NodeEvent]:
    """``sacctmgr -n -P show event`` output (:data:`EVENT_FIELDS`) -> node events; a line that cannot be
    read is quarantined with its line number and the rest go on."""
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("|", len(EVENT_FIELDS) - 1)
        if len(parts) != len(EVENT_FIELDS):
            problems.skip(source, f"line {lineno}", "wrong number of columns", line)
            continue
        row = dict(zip(EVENT_FIELDS, parts, strict=True))
        kind = event_kind(row["State"])
        if kind is None:
            continue
        try:
            start, end = parse_time(row["Start"]), parse_time(row["End"])
            nodes = expand_hostlist(row["NodeName"].strip())
        except (ValueError, KeyError) as exc:
            problems.skip(source, f"line {lineno}", f"bad value: {exc}", line)
            continue
        if start is None or not nodes:
            problems.skip(source, f"line {lineno}", "no start time or no node", line)
            continue
        if end is not None and end < start:
            problems.skip(source, f"line {lineno}", "ends before it starts", line)
            continue
        for node in nodes:
            yield NodeEvent(cluster, node, kind, start, end, None, row["Reason"].strip(), "sacctmgr")


#: Kinds the REST backend sees as a current state only (the node list): a listing closes those it no longer shows
REST_STATE_KINDS = ("drain", "down")


def from_json_node(node: dict[str, Any], cluster: str, now: datetime) -> NodeEvent | None:
    """slurmrestd's node (``/slurm/vX/nodes``): ``state`` (text in v0.0.38 with ``state_flags``, a list from
    v0.0.40) -> a ``drain``/``down`` event since ``reason_changed_at`` (else now), with its reason; None when
    the node is in service."""
    state = node.get("state")
    words = [*(state if isinstance(state, list) else [str(state or "")]), *(node.get("state_flags") or [])]
    kind = event_kind(" ".join(str(w) for w in words))
    if kind is None:
        return None
    start = parse_time(node.get("reason_changed_at")) or now
    return NodeEvent(cluster, str(node["name"]), kind, start, None, None, str(node.get("reason") or ""),
                     "slurmrestd")
