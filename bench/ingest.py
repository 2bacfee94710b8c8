"""Bucket ingest into the store (Store.ingest, the bulk path every collector uses) against raw sqlite3.

The same simulated buckets are built in memory first (not timed). Then, each into a fresh SQLite file:
``Store.ingest`` of the GpuBucket records (telemetry GPU ids resolved, upsert on the natural key, foreign
keys on, batches of ``batch_rows``), and the floor: sqlite3 ``executemany`` of a plain INSERT of the same
row tuples into an identical table (same DDL, same WAL/synchronous settings and batch commits).

Run: python -m bench.ingest [--gpus 256] [--days 7]
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path

from auditor.records import LABEL_FIELDS, METRIC_FIELDS, GpuBucket
from auditor.simulate import FleetSpec, fleet_records
from auditor.store.engine import Store
from auditor.store.ingest import BUCKET_COLS


def _buckets(spec: FleetSpec) -> list[GpuBucket]:
    return [r for r in fleet_records(spec) if isinstance(r, GpuBucket)]


def measure(gpus: int, days: float, batch_rows: int = 50_000) -> dict[str, float]:
    spec = FleetSpec(gpus=gpus, days=days, seed=7)
    buckets = _buckets(spec)
    with tempfile.TemporaryDirectory(prefix="gpu-audit-bench-") as tmp:
        store_db = Path(tmp) / "store.db"
        store = Store.open(f"sqlite:///{store_db}", batch_rows=batch_rows)
        store.upgrade()
        t = time.perf_counter()
        stats = store.ingest(buckets, seen_at_ts=int(spec.end.timestamp()))
        store_s = time.perf_counter() - t
        with store.engine.connect() as conn:
            ids = {(r.cluster, r.host, r.gpu_index, r.gpu_instance): r.id for r in conn.exec_driver_sql(
                "SELECT id, cluster, host, gpu_index, gpu_instance FROM telemetry_gpus")}
            ddl = [r[0] for r in conn.exec_driver_sql(
                "SELECT sql FROM sqlite_master WHERE name IN ('telemetry_gpus', 'gpu_buckets') ORDER BY name DESC")]
        store.engine.dispose()
        rows = [(ids[(b.cluster, b.host, b.gpu, b.gpu_instance)], int(b.start.timestamp()), b.job_key(), b.seconds,
                 b.samples, float(b.seconds) if b.samples > 0 else 0.0, None, None,
                 *[getattr(b, f) for f in METRIC_FIELDS], *[getattr(b, f) for f in LABEL_FIELDS],
                 None if b.sm_active is None else 1.0 if b.sm_exact else 0.0)  # EXACT_FIELDS, as the store writes
                for b in buckets]
        raw = sqlite3.connect(Path(tmp) / "raw.db")
        raw.execute("PRAGMA journal_mode=WAL")
        raw.execute("PRAGMA synchronous=NORMAL")
        for stmt in ddl:
            raw.execute(stmt)
        raw.commit()
        sql = f"INSERT INTO gpu_buckets ({', '.join(BUCKET_COLS)}) VALUES ({', '.join('?' * len(BUCKET_COLS))})"
        t = time.perf_counter()
        for i in range(0, len(rows), batch_rows):
            raw.executemany(sql, rows[i:i + batch_rows])
            raw.commit()
        raw_s = time.perf_counter() - t
        raw.close()
    n = stats.buckets
    return {"rows": n, "store_s": store_s, "store_rows_s": n / store_s, "raw_s": raw_s,
            "raw_rows_s": len(rows) / raw_s, "ratio": (n / store_s) / (len(rows) / raw_s)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=256)
    ap.add_argument("--days", type=float, default=7)
    args = ap.parse_args()
    r = measure(args.gpus, args.days)
    print(f"ingest {r['rows']:,} rows: store {r['store_rows_s']:,.0f} rows/s, raw sqlite3 executemany "
          f"{r['raw_rows_s']:,.0f} rows/s, ratio {r['ratio']:.2f}x")


if __name__ == "__main__":
    main()
