"""Idempotent upsert of :class:`~auditor.records.NodeEvent` records (infrastructure events).

Key: cluster, node, GPU (-1 = whole node), kind and start. An end time once known stays (a later sighting
of the event as still ongoing does not reopen it); a reason once known stays unless a new one is given.
A source that sees only the current state (Kubernetes: a cordoned node carries no time) reports an ongoing
event from its sighting: a cordon continues the stored ongoing event of that node and kind (same row, later last
sighting), and a complete listing that no longer shows it closes it at its last sighting
(:func:`close_unseen_events`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, func, select, update

from auditor.records import NodeEvent
from auditor.store import schema
from auditor.store.sqlfuncs import greatest, least, upsert
from auditor.timeutil import to_epoch

WHOLE_NODE = -1


def _row(e: NodeEvent, seen: int) -> dict[str, Any]:
    return {"cluster": e.cluster, "node": e.node, "gpu_index": WHOLE_NODE if e.gpu is None else e.gpu,
            "kind": e.kind, "start_ts": to_epoch(e.start), "end_ts": to_epoch(e.end), "reason": e.reason or "",
            "source": e.source or "", "first_seen_ts": seen, "last_seen_ts": seen}


#: Kinds a source sees only as a current state, without a start time (a cordon has no timestamp)
STATE_ONLY = ("cordoned",)


def _continued(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """An ongoing sighting of a state-only kind (:data:`STATE_ONLY`) that is already ongoing in the store
    takes the stored start: one row per cordon, not one per listing."""
    t = schema.node_events
    for r in rows:
        if r["end_ts"] is not None or r["kind"] not in STATE_ONLY:
            continue
        start = conn.execute(select(func.min(t.c.start_ts)).where(
            t.c.cluster == r["cluster"], t.c.node == r["node"], t.c.gpu_index == r["gpu_index"],
            t.c.kind == r["kind"], t.c.end_ts.is_(None), t.c.start_ts <= r["start_ts"])).scalar()
        if start is not None:
            r["start_ts"] = start


def ingest_events(conn: Connection, events: list[NodeEvent], seen: int) -> int:
    """Upsert ``events``; returns how many distinct events were written."""
    rows: dict[tuple, dict[str, Any]] = {}
    built = [_row(e, seen) for e in events]
    _continued(conn, built)
    for r in built:
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


def close_unseen_events(conn: Connection, cluster: str, source: str, kinds: tuple[str, ...], seen: int) -> int:
    """After a complete listing of node states at ``seen``: ongoing events of ``kinds`` from ``source`` that it
    did not show have ended, at their last sighting."""
    t = schema.node_events
    res = conn.execute(update(t).where(t.c.cluster == cluster, t.c.source == source, t.c.kind.in_(kinds),
                                       t.c.end_ts.is_(None), t.c.last_seen_ts < seen)
                       .values(end_ts=greatest(func.coalesce(t.c.last_seen_ts, t.c.start_ts), t.c.start_ts)))
    return res.rowcount or 0
