"""PostgreSQL: ``gpu_buckets`` is range-partitioned by week on ``bucket_ts`` (migration 0010_partitions).

One partition per week, bounds at Monday 00:00 UTC, named ``gpu_buckets_w<YYYYMMDD of the Monday>``. There
is NO default partition: a DEFAULT partition holding a row of some week makes every later ``CREATE TABLE
... PARTITION OF`` for that week fail (and scans it on each creation), and it would quietly grow into the
unpartitioned table this replaces. Instead every writer creates the weeks it writes, on demand, first
(:func:`ensure_weeks`, idempotent); a write to a missing week fails loudly
("no partition of relation found"), it never lands in the wrong place. SQLite keeps one ``WITHOUT ROWID``
table: everything here is a no-op there.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from sqlalchemy import Connection

DAY = 86400
WEEK = 7 * DAY
MONDAY = 4 * DAY  # 1970-01-05 00:00 UTC, the first Monday after the epoch
PREFIX = "gpu_buckets_w"
INT4_MIN, INT4_MAX = -(2**31), 2**31 - 1


def week_lo(ts: int) -> int:
    """Start (Monday 00:00 UTC) of the week holding epoch second ``ts``."""
    return (int(ts) - MONDAY) // WEEK * WEEK + MONDAY


def name(lo: int) -> str:
    return f"{PREFIX}{datetime.fromtimestamp(lo, UTC):%Y%m%d}"


def partitioned(conn: Connection) -> bool:
    """Whether this store's gpu_buckets is partitioned by week (PostgreSQL at or past 0010_partitions)."""
    if conn.dialect.name != "postgresql":
        return False
    info = conn.connection.info
    if "gpu_buckets_partitioned" not in info:
        info["gpu_buckets_partitioned"] = bool(conn.exec_driver_sql(
            "SELECT p.partstrat = 'r' FROM pg_partitioned_table p WHERE p.partrelid = "
            "to_regclass('gpu_buckets')").scalar())
    return bool(info["gpu_buckets_partitioned"])


def weeks(conn: Connection) -> dict[int, str]:
    """The existing partitions: {week start: table name}, from the catalog (bounds parsed from the name)."""
    rows = conn.exec_driver_sql(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = to_regclass('gpu_buckets')").all()
    out = {}
    for (rel,) in rows:
        if rel.startswith(PREFIX) and rel[len(PREFIX):].isdigit():
            day = datetime.strptime(rel[len(PREFIX):], "%Y%m%d").replace(tzinfo=UTC)
            out[int(day.timestamp())] = rel
    return out


def create_week(conn: Connection, lo: int) -> None:
    """The partition for the week starting at ``lo`` (idempotent: IF NOT EXISTS)."""
    hi = lo + WEEK if lo + WEEK <= INT4_MAX else "MAXVALUE"  # bucket_ts is an int4
    start = lo if lo >= INT4_MIN else "MINVALUE"
    conn.exec_driver_sql(f"CREATE TABLE IF NOT EXISTS {name(lo)} PARTITION OF gpu_buckets "
                         f"FOR VALUES FROM ({start}) TO ({hi})")


def ensure_weeks(conn: Connection, stamps: Iterable[int]) -> None:
    """Create the partitions for every week holding one of the epoch seconds ``stamps``, before writing
    them. The catalog is read each time (one small query per batch): a cache of known weeks could outlive a
    rolled-back transaction that created one."""
    if not partitioned(conn):
        return
    # a time outside int4 gets no partition: the write itself refuses it ("integer out of range")
    wanted = {week_lo(ts) for ts in stamps if INT4_MIN <= ts <= INT4_MAX}
    for lo in sorted(wanted - set(weeks(conn))):
        create_week(conn, lo)
