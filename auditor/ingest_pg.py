"""PostgreSQL bulk path for telemetry buckets: COPY into a temporary staging table, then one set-based merge.

The merge is the same field-by-field rule as the row-at-a-time upsert (:func:`auditor.ingest.bucket_sets`),
so both paths leave identical tables. One ``INSERT ... SELECT ... ON CONFLICT DO UPDATE`` may not touch a
row twice, while ``executemany`` folds repeated keys one after another, in order, and that fold is not
associative (the stored sample count decides). So a batch with repeated keys is merged in rounds: round k
holds the k-th occurrence of each key, which keeps every key's order and so gives exactly the same result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

STAGE = "_gpu_bucket_stage"


def rounds(rows: Sequence[tuple]) -> list[list[tuple]]:
    """Split rows so no round repeats a (gpu_id, bucket_ts, job) key; each key's rows keep their order."""
    if len({(r[0], r[1], r[2]) for r in rows}) == len(rows):
        return [list(rows)]  # the usual batch: every key once
    seen: dict[tuple, int] = {}
    out: list[list[tuple]] = [[]]
    for r in rows:
        k = (r[0], r[1], r[2])
        n = seen.get(k, 0)
        seen[k] = n + 1
        if n == len(out):
            out.append([])
        out[n].append(r)
    return out


def copy_rows(dbapi_conn: Any, table: str, cols: Sequence[str], rows: Sequence[tuple]) -> None:
    """COPY ``rows`` into ``table`` through psycopg 3's copy protocol (text format, C dumpers)."""
    with dbapi_conn.cursor() as cur, cur.copy(f"COPY {table} ({', '.join(cols)}) FROM STDIN") as cp:
        write = cp.write_row
        for r in rows:
            write(r)


def copy_merge(conn: Connection, rows: Sequence[tuple], cols: Sequence[str], sets: Sequence[str]) -> None:
    """Stage ``rows`` (tuples in ``cols`` order) with COPY and merge them into gpu_buckets set-wise."""
    dbapi = conn.connection.dbapi_connection
    # the temporary table lives as long as the connection; IF NOT EXISTS because a rolled-back savepoint
    # (the row-by-row retry) takes a table created inside it away again
    conn.exec_driver_sql(f"CREATE TEMPORARY TABLE IF NOT EXISTS {STAGE} "
                         "(LIKE gpu_buckets INCLUDING DEFAULTS) ON COMMIT DELETE ROWS")
    names = ", ".join(cols)
    merge = (f"INSERT INTO gpu_buckets ({names}) SELECT {names} FROM {STAGE} ORDER BY gpu_id, bucket_ts, job "
             f"ON CONFLICT (gpu_id, bucket_ts, job) DO UPDATE SET {', '.join(sets)}")
    for part in rounds(rows):
        conn.exec_driver_sql(f"TRUNCATE {STAGE}")
        copy_rows(dbapi, STAGE, cols, part)
        conn.exec_driver_sql(merge)
    conn.exec_driver_sql(f"TRUNCATE {STAGE}")
