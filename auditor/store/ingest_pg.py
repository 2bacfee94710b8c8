"""PostgreSQL bulk path for telemetry buckets: COPY into a temporary staging table, then one set-based merge.

The merge is the same field-by-field rule as the row-at-a-time upsert (:func:`auditor.store.ingest.bucket_sets`),
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


INT4 = (-(2**31), 2**31 - 1)


def _stage_types(conn: Connection, cols: Sequence[str]) -> list[str]:
    """PostgreSQL type names of the staging table's ``cols`` (for binary COPY), read once per connection."""
    info = conn.connection.info
    key = ("_gpu_bucket_stage_types", tuple(cols))
    if key not in info:
        got = dict(conn.exec_driver_sql(
            "SELECT a.attname, t.typname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
            f"WHERE a.attrelid = '{STAGE}'::regclass AND a.attnum > 0 AND NOT a.attisdropped").all())
        info[key] = [got[c] for c in cols]
    return info[key]


def _ints_fit(rows: Sequence[tuple], types: Sequence[str]) -> bool:
    """Binary COPY writes an int4 from the low 32 bits of a Python int (silently wrapping): only rows whose
    integers all fit go binary; otherwise text COPY lets PostgreSQL refuse them, as the upsert would."""
    lo, hi = INT4
    for i, t in enumerate(types):
        if t == "int4":
            vals = [v for r in rows if (v := r[i]) is not None]
            if vals and (min(vals) < lo or max(vals) > hi):
                return False
    return True


def copy_rows(dbapi_conn: Any, table: str, cols: Sequence[str], rows: Sequence[tuple],
              types: Sequence[str] | None = None) -> None:
    """COPY ``rows`` into ``table`` through psycopg 3's copy protocol: binary with ``types`` (about 3x
    cheaper to encode than text), else text."""
    fmt = " (FORMAT BINARY)" if types else ""
    with dbapi_conn.cursor() as cur, cur.copy(f"COPY {table} ({', '.join(cols)}) FROM STDIN{fmt}") as cp:
        if types:
            cp.set_types(list(types))
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
    types = _stage_types(conn, cols)
    names = ", ".join(cols)
    merge = (f"INSERT INTO gpu_buckets ({names}) SELECT {names} FROM {STAGE} ORDER BY gpu_id, bucket_ts, job "
             f"ON CONFLICT (gpu_id, bucket_ts, job) DO UPDATE SET {', '.join(sets)}")
    for part in rounds(rows):
        conn.exec_driver_sql(f"TRUNCATE {STAGE}")
        copy_rows(dbapi, STAGE, cols, part, types if _ints_fit(part, types) else None)
        conn.exec_driver_sql(merge)
    conn.exec_driver_sql(f"TRUNCATE {STAGE}")
