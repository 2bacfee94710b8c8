"""PostgreSQL bulk path for telemetry buckets: new rows COPY straight into gpu_buckets, the rest through a
temporary staging table and one set-based merge.

Most batches are new telemetry (collection moves forward in time): rows of a GPU that has no stored row in
the batch's time range for it cannot conflict, so they are COPYed into gpu_buckets directly (in a savepoint:
should a concurrent writer have stored one of those keys meanwhile, the unique key refuses the COPY, the
savepoint is rolled back and those rows take the merge too). The other rows are staged and merged.

The merge is the same field-by-field rule as the row-at-a-time upsert (:func:`auditor.store.ingest.bucket_sets`),
so both paths leave identical tables. One ``INSERT ... SELECT ... ON CONFLICT DO UPDATE`` may not touch a
row twice, while ``executemany`` folds repeated keys one after another, in order, and that fold is not
associative (the stored sample count decides). So a batch with repeated keys is merged in rounds: round k
holds the k-th occurrence of each key, which keeps every key's order and so gives exactly the same result.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import attrgetter, itemgetter
from typing import Any

from sqlalchemy import Connection

from auditor.errors import StoreError

STAGE = "_gpu_bucket_stage"


def rounds(rows: Sequence[tuple]) -> list[list[tuple]]:
    """Split rows so no round repeats a (gpu_id, bucket_ts, job) key; each key's rows keep their order."""
    if len({r[:3] for r in rows}) == len(rows):
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
    """PostgreSQL type names of the staging table's ``cols`` (for binary COPY)."""
    got = _table_types(conn, STAGE)
    return [got[c] for c in cols]


INT8 = (-(2**63), 2**63 - 1)


def _ints_fit(rows: Sequence[tuple], types: Sequence[str]) -> bool:
    """Binary COPY takes these rows as text COPY would: every int4/int8 column holds Python ints inside
    the type's range. Binary COPY writes an int from its low bits (silently wrapping) and a float's
    integer part; a float there, or an int out of range, goes through text COPY, where PostgreSQL refuses
    it itself, as the upsert would. (Checked per column with C-speed min/max and a set of types.)"""
    for i, t in enumerate(types):
        if t in ("int4", "int8"):
            vals = [v for v in map(itemgetter(i), rows) if v is not None]
            if not vals:
                continue
            lo, hi = INT4 if t == "int4" else INT8
            if set(map(type, vals)) != {int} or min(vals) < lo or max(vals) > hi:
                return False
    return True


def copy_rows(dbapi_conn: Any, table: str, cols: Sequence[str], rows: Iterable[tuple],
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


def check_gpu_ids(conn: Connection, ids: list[int]) -> None:
    """The foreign key gpu_buckets.gpu_id -> telemetry_gpus, checked once per batch (PostgreSQL has no
    per-row trigger for it since 0010_partitions): every id must exist, else nothing of the batch is
    written. Ingest takes the ids from telemetry_gpus in the same transaction and nothing deletes its rows,
    so this only fires on a bug, never on input."""
    found = conn.exec_driver_sql("SELECT count(*) FROM telemetry_gpus WHERE id = ANY(%s)", (ids,)).scalar()
    if found != len(ids):
        missing = ids if not found else sorted(set(ids) - {i for (i,) in conn.exec_driver_sql(
            "SELECT id FROM telemetry_gpus WHERE id = ANY(%s)", (ids,))})
        raise StoreError(f"gpu_buckets rows for unknown telemetry GPU id(s) {missing[:5]}: refused (no row of "
                         "the batch is written)")


def _stored_in_range(conn: Connection, ids: list[int], lo: int, hi: int) -> set[int]:
    """Those of the GPU ``ids`` that already have a stored bucket in the batch's time range [lo, hi] (rows
    of the others cannot conflict: a key holds the GPU and the time)."""
    return {g for (g,) in conn.exec_driver_sql(
        "SELECT DISTINCT gpu_id FROM gpu_buckets WHERE gpu_id = ANY(%s) AND bucket_ts BETWEEN %s AND %s",
        (ids, lo, hi))}


def _copy_new(conn: Connection, rows: Sequence[tuple], cols: Sequence[str], types: Sequence[str]) -> bool:
    """COPY rows that cannot conflict straight into gpu_buckets; False (nothing written) on a conflict."""
    import psycopg

    conn.exec_driver_sql("SAVEPOINT gpu_bucket_copy")
    try:
        copy_rows(conn.connection.dbapi_connection, "gpu_buckets", cols, rows,
                  types if _ints_fit(rows, types) else None)
    except psycopg.errors.UniqueViolation:
        conn.exec_driver_sql("ROLLBACK TO SAVEPOINT gpu_bucket_copy")
        return False
    conn.exec_driver_sql("RELEASE SAVEPOINT gpu_bucket_copy")
    return True


def copy_merge(conn: Connection, rows: Sequence[tuple], cols: Sequence[str], sets: Sequence[str],
               ids: list[int]) -> None:
    """Write ``rows`` (tuples in ``cols`` order) into gpu_buckets: the rows that cannot conflict by COPY,
    the others staged with COPY and merged set-wise. Same result as the row-at-a-time upsert."""
    dbapi = conn.connection.dbapi_connection
    # the temporary table lives as long as the connection; IF NOT EXISTS because a rolled-back savepoint
    # (the row-by-row retry) takes a table created inside it away again
    conn.exec_driver_sql(f"CREATE TEMPORARY TABLE IF NOT EXISTS {STAGE} "
                         "(LIKE gpu_buckets INCLUDING DEFAULTS) ON COMMIT DELETE ROWS")
    types = _stage_types(conn, cols)
    # the rows of GPUs without stored rows in range go direct; a key twice among them (or a concurrent
    # writer's) makes the COPY fail and roll back, and then every row takes the merge
    stamps = list(map(itemgetter(1), rows))
    busy = _stored_in_range(conn, ids, min(stamps), max(stamps))
    new = [r for r in rows if r[0] not in busy] if busy else rows
    rest = [r for r in rows if r[0] in busy] if busy else []
    if not new or not _copy_new(conn, new, cols, types):
        rest = rows
    if not rest:
        return
    names = ", ".join(cols)
    merge = (f"INSERT INTO gpu_buckets ({names}) SELECT {names} FROM {STAGE} ORDER BY gpu_id, bucket_ts, job "
             f"ON CONFLICT (gpu_id, bucket_ts, job) DO UPDATE SET {', '.join(sets)}")
    for part in rounds(rest):
        conn.exec_driver_sql(f"TRUNCATE {STAGE}")
        copy_rows(dbapi, STAGE, cols, part, types if _ints_fit(part, types) else None)
        conn.exec_driver_sql(merge)
    conn.exec_driver_sql(f"TRUNCATE {STAGE}")


def copy_stream(conn: Connection, buckets: Sequence[Any], gids: list[int], make_row: Any, cols: Sequence[str],
                sets: Sequence[str], rolled_up_before: int | None) -> list[tuple] | None:
    """The usual batch (new telemetry of known width, every integer inside int4): the rows of its GPUs
    that have nothing stored in the batch's time range are built WHILE they are COPYed into gpu_buckets, so
    PostgreSQL inserts on one core as Python builds the next rows on the other; the other GPUs' rows go
    through :func:`copy_merge`. Returns the rows written, or None (nothing written) when the whole batch
    needs the general path."""
    from auditor.store import meta, partitions

    starts = list(map(attrgetter("start"), buckets))
    lo, hi = int(min(starts).timestamp()), int(max(starts).timestamp())
    widths = {int(w) for w in set(map(attrgetter("seconds"), buckets))}
    samples = list(map(attrgetter("samples"), buckets))
    if (rolled_up_before is not None and lo < rolled_up_before) or lo < INT4[0] or hi + max(widths) > INT4[1] \
            or min(widths) < 0 or min(samples) < INT4[0] or max(samples) > INT4[1]:
        return None
    meta.check_width(conn, widths)
    ids = sorted(set(gids))
    check_gpu_ids(conn, ids)
    partitions.ensure_weeks(conn, {int(s.timestamp()) for s in set(starts)})
    busy = _stored_in_range(conn, ids, lo, hi)
    if busy:
        if len(busy) == len(ids):
            return None
        pick = [i for i, g in enumerate(gids) if g not in busy]
        old = [make_row(g, b) for g, b in zip(gids, buckets, strict=True) if g in busy]
        gids, buckets = [gids[i] for i in pick], [buckets[i] for i in pick]
    conn.exec_driver_sql(f"CREATE TEMPORARY TABLE IF NOT EXISTS {STAGE} "
                         "(LIKE gpu_buckets INCLUDING DEFAULTS) ON COMMIT DELETE ROWS")
    types = _stage_types(conn, cols)
    rows: list[tuple] = []
    keep = rows.append

    def built() -> Any:
        for r in map(make_row, gids, buckets):
            keep(r)
            yield r

    conn.exec_driver_sql("SAVEPOINT gpu_bucket_copy")
    try:
        copy_rows(conn.connection.dbapi_connection, "gpu_buckets", cols, built(), types)  # type: ignore[arg-type]
    except Exception:
        conn.exec_driver_sql("ROLLBACK TO SAVEPOINT gpu_bucket_copy")
        return None  # a key twice in the batch, a concurrent writer's row, a value _row refused: general path
    conn.exec_driver_sql("RELEASE SAVEPOINT gpu_bucket_copy")
    if busy:
        copy_merge(conn, old, cols, sets, sorted(busy))
        rows += old
    return rows


#: Binary COPY formats by column type: varchar and json take their text bytes in binary (their recv
#: functions read text), so the text dumper writes them.
_BINARY = {"int4": "int4", "int8": "int8", "float8": "float8", "bool": "bool", "text": "text", "varchar": "text",
           "json": "text"}


def _table_types(conn: Connection, table: str) -> dict[str, str]:
    """Column -> PostgreSQL type name of ``table``, read once per connection."""
    info = conn.connection.info
    key = ("_copy_types", table)
    if key not in info:
        info[key] = dict(conn.exec_driver_sql(
            "SELECT a.attname, t.typname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
            f"WHERE a.attrelid = '{table}'::regclass AND a.attnum > 0 AND NOT a.attisdropped").all())
    return info[key]


def copy_dicts(conn: Connection, table: Any, rows: Sequence[dict[str, Any]]) -> None:
    """Bulk insert of row dicts into ``table`` (a Table: audit output such as usage_allocation, findings) by
    COPY: an INSERT of tens of thousands of 40-column rows spent seconds binding parameters. Binary COPY
    (7x cheaper to encode than text for 14,000 rows of 30 floats) when every column has a binary format
    here and the integers fit, else text. Columns a row leaves out take their scalar Python default, as an
    INSERT would; JSON values go as JSON text."""
    from auditor import jsonsafe

    if not rows:
        return
    first = rows[0]
    cols = [c for c in table.c if c.name in first or (c.default is not None and c.default.is_scalar)]
    get = [(c.name, c.default.arg if c.default is not None and c.default.is_scalar else None) for c in cols]
    out = [tuple(jsonsafe.dumps(v) if isinstance(v := r.get(n, d), dict | list) else v for n, d in get)
           for r in rows]
    copy_tuples(conn, table.name, [c.name for c in cols], out)


def copy_tuples(conn: Connection, table: str, cols: Sequence[str], rows: Sequence[tuple]) -> None:
    """COPY ``rows`` (tuples in ``cols`` order) into ``table``: binary when every column has a binary
    format here and the integers fit (:func:`_ints_fit`), else text."""
    pg = _table_types(conn, table)
    types = [_BINARY.get(pg.get(c, "")) for c in cols]
    binary = all(types) and _ints_fit(rows, types)  # type: ignore[arg-type]
    copy_rows(conn.connection.dbapi_connection, table, cols, rows, types if binary else None)  # type: ignore[arg-type]
