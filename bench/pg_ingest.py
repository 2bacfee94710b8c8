"""PostgreSQL bucket ingest side by side: COPY + set-based merge vs the old executemany upsert vs raw COPY.

The same simulated buckets are built in memory first (not timed). Each path writes them into a fresh
throw-away schema (bench_ingest_<pid>_<n>, dropped afterwards):

- ``copy``: ``Store.ingest`` as shipped (telemetry GPU ids resolved, row tuples built, COPY into a temporary
  staging table, one ``INSERT ... SELECT ... ON CONFLICT DO UPDATE`` per batch of ``batch_rows``);
- ``executemany``: the same ``Store.ingest`` with the COPY path switched off (the previous hot path);
- ``merge only``: the COPY + merge step alone on the prebuilt row tuples (no record handling in Python);
- ``raw COPY``: the floor, psycopg binary COPY of the identical row tuples into a bare table of the same
  columns (no primary key, no foreign key, no merge), in the same batches (text COPY shown too);
- ``raw COPY, keyed``: the same binary COPY straight into ``gpu_buckets`` itself (its primary key and weekly
  partitions, which any ingest must maintain; no staging, no merge): it splits ``Store.ingest / raw COPY`` into
  what the table's key costs and what gpu-audit's own work costs (reported, not a target);
- ``build``: no database at all, only the records turned into those row tuples (``ingest._row``, best of 3).
  Building runs in the same Python thread as psycopg's encoding of each row for COPY, so
  raw / (raw + build) bounds what ``Store.ingest / raw COPY`` can reach however fast the server merges
  (reported as ``build_bound_vs_raw``).

Run: python -m bench.pg_ingest [--gpus 256] [--days 2] [--url postgresql+psycopg://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import create_engine, text

from bench.pg import DEFAULT_URL, _with_schema

TARGET_ROWS_S, TARGET_RATIO = 300_000.0, 0.5


@contextmanager
def _schema(url: str, n: int) -> Iterator[str]:
    name = f"bench_ingest_{os.getpid()}_{n}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE SCHEMA {name}"))
    try:
        yield _with_schema(url, name)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP SCHEMA IF EXISTS {name} CASCADE"))
        admin.dispose()


def _store_ingest(url: str, buckets: list, batch_rows: int, copy: bool) -> tuple[float, int, list[tuple]]:
    from auditor.store import ingest
    from auditor.store.engine import Store

    saved = ingest.COPY_MIN_ROWS
    ingest.COPY_MIN_ROWS = 1 if copy else 10**12
    try:
        store = Store.open(url, batch_rows=batch_rows)
        store.upgrade()
        t = time.perf_counter()
        stats = store.ingest(buckets, seen_at_ts=2_000_000_000)
        secs = time.perf_counter() - t
        with store.engine.connect() as conn:
            cache = {(r.cluster, r.host, r.gpu_index, r.gpu_instance): r.id for r in conn.exec_driver_sql(
                "SELECT id, cluster, host, gpu_index, gpu_instance FROM telemetry_gpus")}
        store.engine.dispose()
    finally:
        ingest.COPY_MIN_ROWS = saved
    rows = [ingest._row(cache[ingest._BUCKET_KEY(b)], b) for b in buckets]
    return secs, stats.buckets, rows


def _build_only(buckets: list, gids: list[int]) -> float:
    """Seconds to turn the records into row tuples, nothing else (best of 3)."""
    from auditor.store import ingest

    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        list(map(ingest._row, gids, buckets))
        best = min(best, time.perf_counter() - t)
    return best


def _merge_only(url: str, rows: list[tuple], batch_rows: int) -> float:
    """The COPY + merge step alone on prebuilt tuples, into the emptied gpu_buckets (telemetry_gpus kept)."""
    from auditor.store.engine import Store
    from auditor.store.ingest import write_bucket_rows

    store = Store.open(url)
    with store.engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE gpu_buckets")
    t = time.perf_counter()
    for i in range(0, len(rows), batch_rows):
        with store.engine.begin() as conn:
            write_bucket_rows(conn, rows[i:i + batch_rows], copy=True)
    secs = time.perf_counter() - t
    store.engine.dispose()
    return secs


def _raw_copy(url: str, rows: list[tuple], batch_rows: int, binary: bool, *, keyed: bool = False) -> float:
    """Seconds to COPY ``rows`` in batches: into a bare table of gpu_buckets' columns (no key, no
    partitions), or ``keyed``: straight into gpu_buckets itself (its primary key and weekly partitions, which
    ``Store.ingest`` must maintain too; no staging table, no merge, no Python record handling)."""
    from auditor.store import partitions
    from auditor.store.engine import Store
    from auditor.store.ingest import BUCKET_COLS
    from auditor.store.ingest_pg import copy_rows

    store = Store.open(url)
    store.upgrade()  # for the column types (and, keyed, the table itself)
    table = "gpu_buckets" if keyed else "bare_buckets"
    with store.engine.begin() as conn:
        if keyed:
            conn.exec_driver_sql("TRUNCATE gpu_buckets")
            partitions.ensure_weeks(conn, {r[1] for r in rows})  # not timed: made once per week anyway
        else:
            conn.exec_driver_sql("DROP TABLE IF EXISTS bare_buckets")
            conn.exec_driver_sql("CREATE TABLE bare_buckets (LIKE gpu_buckets)")
        got = dict(conn.exec_driver_sql(
            "SELECT a.attname, t.typname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
            f"WHERE a.attrelid = '{table}'::regclass AND a.attnum > 0").all())
    types = [got[c] for c in BUCKET_COLS] if binary else None
    t = time.perf_counter()
    for i in range(0, len(rows), batch_rows):
        with store.engine.begin() as conn:
            copy_rows(conn.connection.dbapi_connection, table, BUCKET_COLS, rows[i:i + batch_rows], types)
    secs = time.perf_counter() - t
    store.engine.dispose()
    return secs


def measure(url: str, gpus: int, days: float, batch_rows: int = 50_000) -> dict[str, Any]:
    from auditor.records import GpuBucket
    from auditor.simulate import FleetSpec, fleet_records

    buckets = [r for r in fleet_records(FleetSpec(gpus=gpus, days=days, seed=7)) if isinstance(r, GpuBucket)]
    with _schema(url, 1) as u:
        copy_s, n, rows = _store_ingest(u, buckets, batch_rows, copy=True)
        merge_s = _merge_only(u, rows, batch_rows)
    with _schema(url, 2) as u:
        old_s, _, _ = _store_ingest(u, buckets, batch_rows, copy=False)
    with _schema(url, 3) as u:
        raw_text_s = _raw_copy(u, rows, batch_rows, binary=False)
        raw_s = _raw_copy(u, rows, batch_rows, binary=True)
    with _schema(url, 4) as u:
        keyed_s = _raw_copy(u, rows, batch_rows, binary=True, keyed=True)
    build_s = _build_only(buckets, [r[0] for r in rows])
    out = {"rows": n, "copy_s": copy_s, "merge_only_s": merge_s,
           "merge_only_rows_s": n / merge_s, "executemany_s": old_s, "raw_copy_s": raw_s,
           "raw_copy_text_rows_s": n / raw_text_s,
           "copy_rows_s": n / copy_s, "executemany_rows_s": n / old_s, "raw_copy_rows_s": n / raw_s}
    out["copy_vs_raw"] = out["copy_rows_s"] / out["raw_copy_rows_s"]
    out["merge_only_vs_raw"] = out["merge_only_rows_s"] / out["raw_copy_rows_s"]
    out["copy_vs_executemany"] = out["copy_rows_s"] / out["executemany_rows_s"]
    out["build_s"], out["build_rows_s"] = build_s, n / build_s
    out["build_bound_vs_raw"] = raw_s / (raw_s + build_s)
    # the same raw COPY into gpu_buckets itself: what its key and partitions cost, apart from gpu-audit's own work
    out["raw_keyed_rows_s"] = n / keyed_s
    out["keyed_vs_bare"] = raw_s / keyed_s
    out["copy_vs_raw_keyed"] = out["copy_rows_s"] / out["raw_keyed_rows_s"]
    return out


def report(r: dict[str, Any]) -> str:
    ok = "met" if r["copy_rows_s"] >= TARGET_ROWS_S else "MISSED"
    ok2 = "met" if r["copy_vs_raw"] >= TARGET_RATIO else "MISSED"
    return (f"PostgreSQL ingest of {r['rows']:,} buckets: Store.ingest via COPY + merge {r['copy_rows_s']:,.0f} rows/s "
            f"({ok}: >= {TARGET_ROWS_S:,.0f}); old executemany upsert {r['executemany_rows_s']:,.0f} rows/s "
            f"(COPY path {r['copy_vs_executemany']:.1f}x); raw binary COPY into a bare table "
            f"{r['raw_copy_rows_s']:,.0f} rows/s (text: {r['raw_copy_text_rows_s']:,.0f}); "
            f"COPY path / raw COPY {r['copy_vs_raw']:.2f}x ({ok2}: >= {TARGET_RATIO}x); the COPY + merge step "
            f"alone on the same prebuilt tuples {r['merge_only_rows_s']:,.0f} rows/s = "
            f"{r['merge_only_vs_raw']:.2f}x raw; turning the records into those tuples alone (Python, no database) "
            f"{r['build_rows_s']:,.0f} rows/s ({1e6 / r['build_rows_s']:.2f} us per row vs "
            f"{1e6 / r['raw_copy_rows_s']:.2f} us for the whole raw COPY), which bounds Store.ingest / raw COPY "
            f"at {r['build_bound_vs_raw']:.2f}x; raw binary COPY straight into gpu_buckets (its key and partitions) "
            f"{r['raw_keyed_rows_s']:,.0f} rows/s = {r['keyed_vs_bare']:.2f}x the bare table, and Store.ingest / that "
            f"COPY {r['copy_vs_raw_keyed']:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=DEFAULT_URL)
    ap.add_argument("--gpus", type=int, default=256)
    ap.add_argument("--days", type=float, default=2)
    ap.add_argument("--batch-rows", type=int, default=50_000)
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON line too")
    args = ap.parse_args()
    r = measure(args.url, args.gpus, args.days, args.batch_rows)
    print(report(r))
    if args.json:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
