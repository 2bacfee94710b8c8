"""Facts about the stored data (table ``store_meta``): the bucket width telemetry was collected at, and
how far history is rolled up to hourly buckets.

Changing ``store.bucket_seconds`` with telemetry stored would double count: 5-minute and 10-minute rows for
the same time both look observed. So the store records its width with the first telemetry and refuses a
different one with a one-line error. Hourly rows (3600 s) are the roll-up width and always fit.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Connection, select

from auditor.errors import StoreError
from auditor.store import schema

HOUR = 3600


def get(conn: Connection, key: str) -> str | None:
    t = schema.store_meta
    return conn.execute(select(t.c.value).where(t.c.key == key)).scalar()


def put(conn: Connection, key: str, value: str) -> None:
    from auditor.store.sqlfuncs import upsert

    upsert(conn, schema.store_meta, [{"key": key, "value": value}], ("key",))


def rolled_up_before(conn: Connection) -> int | None:
    """Telemetry before this time is rolled up to hourly rows (``gpu-audit db prune``); None = never."""
    v = get(conn, "rolled_up_before")
    return int(v) if v is not None else None


def _refuse(stored: int, width: int) -> StoreError:
    return StoreError(f"the store holds telemetry in {stored}-second buckets; store.bucket_seconds = {width} "
                      f"would count the same time twice: set it back to {stored} or use a new store")


def check_width(conn: Connection, widths: Iterable[int]) -> None:
    """Record the bucket width of the first telemetry; refuse any other fine width afterwards."""
    fine = sorted({int(w) for w in widths if int(w) < HOUR})
    if not fine:
        return
    v = get(conn, "bucket_seconds")
    if v is None:
        if len(fine) > 1:
            raise StoreError(f"telemetry in {fine[0]}- and {fine[-1]}-second buckets at once: one width per store")
        put(conn, "bucket_seconds", str(fine[0]))
        return
    stored = int(v)
    for w in fine:
        if w != stored:
            raise _refuse(stored, w)


def check_config_width(conn: Connection, width: int) -> None:
    """Before a collection: the configured width must be the stored one (when telemetry is stored)."""
    v = get(conn, "bucket_seconds")
    if v is not None and int(v) != width and width < HOUR:
        raise _refuse(int(v), width)
