"""Rows of JSON allocation files that are not allocations, reservations or inventory (docs/file-formats.md):
``"type": "wait"`` (a GPU job that waited: id, gpus, eligible, end (absent while it waits), partition, account,
user, qos, state), ``"type": "quota"`` (kind ``qos``, ``account`` or ``queue``, name, gpus) and ``"type": "node_event"``
(a node or GPU out of service)."""

from __future__ import annotations

from typing import Any

from auditor.records import NODE_EVENT_KINDS, GpuQuota, GpuWait, NodeEvent
from connectors._rows import row_time

MAX_GPUS = 65536


def _gpus(value: Any) -> float:
    gpus = float(value or 0)
    if not 0 < gpus <= MAX_GPUS:
        raise ValueError(f"gpus: {gpus:g} is not a GPU count")
    return gpus


def wait_from_row(cluster: str, row: dict[str, Any]) -> GpuWait:
    """A GPU job that waited; ``end`` is when it started (or left the queue), absent while still waiting."""
    ext = str(row.get("id") or "").strip()
    if not ext:
        raise ValueError("id: missing")
    eligible = row_time(row.get("eligible"), "eligible")
    if eligible is None:
        raise ValueError("eligible: missing")
    end = row_time(row.get("end"), "end")
    if end is not None and end < eligible:
        raise ValueError(f"end {end.isoformat()} is before eligible {eligible.isoformat()}")
    source = "kubernetes" if row.get("source") == "kubernetes" else "slurm"
    return GpuWait(cluster, source, ext, _gpus(row.get("gpus")), eligible=eligible, end=end,
                   submit=row_time(row.get("submit"), "submit"), name=str(row.get("name") or ""),
                   user=str(row.get("user") or ""), account=str(row.get("account") or ""),
                   partition=str(row.get("partition") or ""), qos=str(row.get("qos") or ""),
                   state=str(row.get("state") or ("PENDING" if end is None else "")))


def quota_from_row(cluster: str, row: dict[str, Any]) -> GpuQuota:
    """A GPU quota of a QOS, an account (namespace) or a queue (the allocations' partition: a Kubernetes queue
    such as a Kueue ClusterQueue)."""
    kind = row.get("kind")
    if kind not in ("qos", "account", "queue"):
        raise ValueError(f"kind: {str(kind)[:40]!r} is not qos, account or queue")
    name = str(row.get("name") or "").strip()
    if not name:
        raise ValueError("name: missing")
    return GpuQuota(cluster, kind, name, _gpus(row.get("gpus")))


def node_event_from_row(cluster: str, row: dict[str, Any]) -> NodeEvent:
    """A node or GPU out of service (``"type": "node_event"``: node, kind, start, end (empty: ongoing), gpu
    (empty: the whole node), reason)."""
    node, kind = str(row.get("node") or "").strip(), str(row.get("kind") or "")
    if not node or kind not in NODE_EVENT_KINDS:
        raise ValueError(f"node_event needs a node and a kind ({', '.join(NODE_EVENT_KINDS)})")
    start, end = row_time(row.get("start"), "start"), row_time(row.get("end"), "end")
    if start is None or (end is not None and end < start):
        raise ValueError("node_event: start missing or after end")
    gpu = row.get("gpu")
    return NodeEvent(cluster, node, kind, start, end, None if gpu in (None, "") else int(gpu),
                     str(row.get("reason") or ""), "file")


#: ``type`` of a JSON row -> its reader
EXTRA_ROWS = {"wait": wait_from_row, "quota": quota_from_row, "node_event": node_event_from_row}
