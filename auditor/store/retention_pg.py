"""PostgreSQL retention on the weekly partitions: a week wholly older than the cutoff is rolled up by
building its hourly rows in a fresh table and exchanging it for the week's partition (the old partition is
DROPPED, no row-wise ``DELETE``, no vacuum debt, and the new one is about 12x smaller). The rows are exactly
those the row-wise path leaves (:func:`auditor.store.retention._roll`): the same ``ROLLUP`` aggregate, and
every row of a GPU-hour that got no hourly row kept as it was. A partial week still goes row-wise.
"""

from __future__ import annotations

from sqlalchemy import Connection, text

from auditor.store import partitions


def whole_weeks(conn: Connection, cutoff: int) -> list[tuple[int, str]]:
    """(week start, partition) of the weeks that end at or before ``cutoff`` and still hold fine rows."""
    out = []
    for lo, rel in sorted(partitions.weeks(conn).items()):
        if lo + partitions.WEEK <= cutoff and conn.execute(text(
                f"SELECT EXISTS (SELECT 1 FROM {rel} WHERE bucket_s < 3600)")).scalar():
            out.append((lo, rel))
    return out


def roll_week(conn: Connection, lo: int, rel: str, ddl: str, rollup: str, columns: list[str]) -> tuple[int, int]:
    """Replace partition ``rel`` (the week from ``lo``) by its rolled-up copy; (fine rows, hourly rows).
    ``ddl``/``rollup``/``columns``: the row-wise path's ``_rollup`` table, its aggregate and its columns."""
    hi = lo + partitions.WEEK
    new = f"{rel}_rolled"
    cols = ", ".join(columns)
    p = {"lo": lo, "hi": hi}
    fine = int(conn.execute(text(f"SELECT count(*) FROM {rel} WHERE bucket_s < 3600")).scalar() or 0)
    conn.execute(text("DROP TABLE IF EXISTS _rollup"))
    conn.execute(text(ddl))
    conn.execute(text(rollup.format(least="LEAST")), p)
    conn.execute(text(f"DROP TABLE IF EXISTS {new}"))
    conn.execute(text(f"CREATE TABLE {new} (LIKE gpu_buckets INCLUDING DEFAULTS)"))
    written = conn.execute(text(f"INSERT INTO {new} (bucket_s, {cols}) SELECT 3600, {cols} FROM _rollup "
                                "ORDER BY gpu_id, bucket_ts, job")).rowcount or 0
    # the rows the row-wise path leaves alone: every row of a GPU-hour without a new hourly row
    conn.execute(text(f"INSERT INTO {new} (bucket_s, {cols}) SELECT b.bucket_s, "
                      f"{', '.join('b.' + c for c in columns)} FROM {rel} b WHERE NOT EXISTS (SELECT 1 FROM "
                      "_rollup r WHERE r.gpu_id = b.gpu_id AND r.bucket_ts = (b.bucket_ts / 3600) * 3600)"))
    conn.execute(text("DROP TABLE _rollup"))
    # the CHECK lets ATTACH skip its validating scan; the key is built by one sort, not row by row
    conn.execute(text(f"ALTER TABLE {new} ADD CONSTRAINT {new}_bounds CHECK (bucket_ts >= {lo} AND "
                      f"bucket_ts < {hi})"))
    conn.execute(text(f"ALTER TABLE {new} ADD CONSTRAINT {new}_pkey PRIMARY KEY (gpu_id, bucket_ts, job)"))
    conn.execute(text(f"DROP TABLE {rel}"))
    conn.execute(text(f"ALTER TABLE {new} RENAME TO {rel}"))
    conn.execute(text(f"ALTER TABLE {rel} RENAME CONSTRAINT {new}_pkey TO {rel}_pkey"))
    conn.execute(text(f"ALTER TABLE gpu_buckets ATTACH PARTITION {rel} FOR VALUES FROM ({lo}) TO ({hi})"))
    conn.execute(text(f"ALTER TABLE {rel} DROP CONSTRAINT {new}_bounds"))
    return fine, int(written)
