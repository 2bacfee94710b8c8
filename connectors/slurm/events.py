"""Slurm node events: when nodes were drained or down, and why (README "Infrastructure-affected time").

slurmdbd keeps each node state change as an event: ``sacctmgr -n -P show event event=node start=...
end=... format=NodeName,Start,End,State,Reason`` lists them with their reason and ``End`` = ``Unknown``
while the state lasts. DOWN (and NOT_RESPONDING) becomes ``down``; DRAIN, FAIL (a drain that is still
draining running jobs) becomes ``drain``; other states (maintenance, power saving, reboot) are not faults
and are skipped. Reason is the last column because Slurm prints it unescaped (it may contain ``|``).
"""

from __future__ import annotations

from collections.abc import Iterator

from auditor.records import NodeEvent
from connectors.base import Problems
from connectors.slurm.parse import expand_hostlist, parse_time

EVENT_FIELDS = ("NodeName", "Start", "End", "State", "Reason")


def event_kind(state: str) -> str | None:
    """Slurm node state (``DOWN``, ``DRAIN``, ``IDLE+DRAIN``, ``DOWN*``...) -> ``down``, ``drain`` or None."""
    parts = {p.strip("*~#!%$@^-").upper() for p in state.replace("+", " ").split()}
    if parts & {"DOWN", "NOT_RESPONDING", "NO_RESPOND"}:
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
