"""The judged aggregate's upkeep on the store side: which hours changed (``judged_dirty``).

Every write of telemetry buckets marks the (GPU, clock hour) pairs it touched, in the same transaction, with
a random token; the audit re-judges the marked hours into ``judged_hours`` before it reads them
(:mod:`auditor.audit.aggregate`) and clears only the marks it read, so a write that lands meanwhile stays
marked. An hour is a bucket's start hour (``bucket_ts / 3600``); a bucket crossing its hour's end keeps its
hour judged from the buckets (``judged_dirty.unfit``).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable

from sqlalchemy import Connection, text

HOUR = 3600
_UPSERT = ("INSERT INTO judged_dirty (gpu_id, hour, mark, unfit) {src} ON CONFLICT (gpu_id, hour) "
           "DO UPDATE SET mark = excluded.mark, unfit = 0")


def new_mark() -> int:
    """A token for one write (63 bits: a bigint on PostgreSQL, an integer on SQLite)."""
    return secrets.randbits(62) + 1


def mark_hours(conn: Connection, pairs: Iterable[tuple[int, int]]) -> int:
    """Mark (gpu_id, hour) pairs as changed; returns how many. Sorted, so concurrent writers lock rows in
    one order."""
    rows = sorted(set(pairs))
    if not rows:
        return 0
    m = new_mark()
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(_UPSERT.format(src="SELECT g, h, %s, 0 FROM unnest(%s::int[], %s::int[]) AS u(g, h)"),
                             (m, [r[0] for r in rows], [r[1] for r in rows]))
    else:
        conn.exec_driver_sql(_UPSERT.format(src="VALUES (?, ?, ?, 0)"), [(g, h, m) for g, h in rows])
    return len(rows)


def mark_rows(conn: Connection, rows: Iterable[tuple]) -> int:
    """Mark the start hours of bucket row tuples (gpu_id, bucket_ts, ...)."""
    return mark_hours(conn, {(r[0], r[1] // HOUR) for r in rows})


def mark_range(conn: Connection, lo: int, hi: int) -> None:
    """Mark every (GPU, hour) with a bucket starting in [lo, hi) (after a roll-up rewrote them)."""
    src = ("SELECT DISTINCT gpu_id, bucket_ts / 3600, :m, 0 FROM gpu_buckets WHERE bucket_ts >= :lo "
           "AND bucket_ts < :hi")
    conn.execute(text(_UPSERT.format(src=src)), {"m": new_mark(), "lo": lo, "hi": hi})
