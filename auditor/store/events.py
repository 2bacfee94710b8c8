"""Idempotent upsert of :class:`~auditor.records.NodeEvent` records (infrastructure events).

Key: cluster, node, GPU (-1 = whole node), kind and start. An end time once known stays (a later sighting
of the event as still ongoing does not reopen it); a reason once known stays unless a new one is given.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, func

from auditor.records import NodeEvent
from auditor.store import schema
from auditor.store.sqlfuncs import greatest, least, upsert
from auditor.timeutil import to_epoch

WHOLE_NODE = -1


def _row(e: NodeEvent, seen: int) -> dict[str, Any]:
    return {"cluster": e.cluster, "node": e.node, "gpu_index": WHOLE_NODE if e.gpu is None else e.gpu,
            "kind": e.kind, "start_ts": to_epoch(e.start), "end_ts": to_epoch(e.end), "reason": e.reason or "",
            "source": e.source or "", "first_seen_ts": seen, "last_seen_ts": seen}


def ingest_events(conn: Connection, events: list[NodeEvent], seen: int) -> int:
    """Upsert ``events``; returns how many distinct events were written."""
    rows: dict[tuple, dict[str, Any]] = {}
    for e in events:
        r = _row(e, seen)
        key = (r["cluster"], r["node"], r["gpu_index"], r["kind"], r["start_ts"])
        old = rows.get(key)
        if old is not None:  # the same event twice in one batch: keep the end and reason once known
            r["end_ts"] = r["end_ts"] if r["end_ts"] is not None else old["end_ts"]
            r["reason"] = r["reason"] or old["reason"]
        rows[key] = r
    upsert(conn, schema.node_events, list(rows.values()), ("cluster", "node", "gpu_index", "kind", "start_ts"),
           {"end_ts": lambda t, ex: func.coalesce(ex.end_ts, t.c.end_ts),
            "reason": lambda t, ex: func.coalesce(func.nullif(ex.reason, ""), t.c.reason),
            "source": lambda t, ex: func.coalesce(func.nullif(ex.source, ""), t.c.source),
            "first_seen_ts": lambda t, ex: least(t.c.first_seen_ts, ex.first_seen_ts),
            "last_seen_ts": lambda t, ex: greatest(t.c.last_seen_ts, ex.last_seen_ts)})
    return len(rows)
