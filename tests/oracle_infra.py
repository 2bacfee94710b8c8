"""The oracle's infrastructure-affected time (README "Definitions", "Infrastructure-affected time"), plain
Python; see tests/oracle.py. Written from the definition, not from auditor/audit/infra.py."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from auditor.records import NodeEvent

ALL_KINDS = ("xid", "throttle", "ecc_dbe", "row_remap", "drain", "down", "not_ready", "cordoned")


def _t(v: datetime | None) -> float | None:
    return None if v is None else v.timestamp()


class Events:
    """Stored node events: one per (cluster, node, GPU or None, kind, start); an end once known stays."""

    def __init__(self) -> None:
        self.by_key: dict[tuple, NodeEvent] = {}

    def add(self, e: NodeEvent) -> None:
        k = (e.cluster, e.node, e.gpu, e.kind, _t(e.start))
        old = self.by_key.get(k)
        if old is not None and e.end is None:
            e = NodeEvent(e.cluster, e.node, e.kind, e.start, old.end, e.gpu, e.reason or old.reason, e.source)
        self.by_key[k] = e

    def intervals(self, cluster: str, node: str, gpu: int | None, kinds: Any, since: float,
                  horizon: float) -> list[tuple[float, float]]:
        """[s, e) of the events of the kinds on this GPU (its own and its node's; ``gpu`` None: the node's
        only), ongoing ones to ``horizon``. CHOICE (as the audit): clipped to [since, horizon) first, so a
        bucket straddling ``since`` is only affected by the part of an event inside the window."""
        out = []
        for e in self.by_key.values():
            if e.cluster != cluster or e.node != node or e.kind not in kinds:
                continue
            if e.gpu is not None and e.gpu != gpu:
                continue
            s = max(_t(e.start) or 0.0, since)
            end = _t(e.end)
            x = min(horizon if end is None else end, horizon)
            if x > s:
                out.append((s, x))
        return out


def touches(intervals: list[tuple[float, float]], t0: float, t1: float) -> bool:
    """Does [t0, t1) overlap any interval (by a positive length)?"""
    return any(s < t1 and e > t0 for s, e in intervals)
