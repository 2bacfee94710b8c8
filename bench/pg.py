"""The same audit on PostgreSQL, in a throw-away schema (bench_<pid>) selected through search_path.

The fleet goes in through Store.ingest (timed: that is PostgreSQL's bulk path too), then ANALYZE (a
production store has statistics; a freshly loaded one does not), then the audit runs in a child process
(:mod:`bench.audit`) next to its floor. The schema is dropped afterwards, also on failure.

Large fleets (``--from DIR``): generating 16,384 GPUs takes ~10 minutes, so the SQLite fleet store cached
by :mod:`bench.fleet` (``fleet-<key>.db`` in DIR) is copied table by table into a persistent PostgreSQL
schema ``fleet_<key>`` (binary COPY, same ids, weekly partitions created first, sequences moved past the
ids, ANALYZE), reused by later runs; then both engines audit the identical data side by side
(:func:`side_by_side`).

Run: python -m bench.pg [--url postgresql+psycopg://postgres@127.0.0.1:5432/test] [--gpus 1024] [--days 7]
     python -m bench.pg --from DIR --gpus 4096,16384     (both engines, fleets cached in DIR)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import create_engine, text

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _with_schema(url: str, schema: str) -> str:
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-csearch_path={schema}')}"


def measure(url: str, gpus: int, days: float, seed: int = 1) -> dict[str, Any]:
    from auditor.simulate import FleetSpec, populate
    from auditor.store.engine import Store

    schema = f"bench_{os.getpid()}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    try:
        surl = _with_schema(url, schema)
        store = Store.open(surl, batch_rows=50_000)
        store.upgrade()
        spec = FleetSpec(gpus=gpus, days=days, seed=seed)
        t = time.perf_counter()
        stats = populate(store, spec)
        ingest_s = time.perf_counter() - t
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("ANALYZE"))
            size = conn.execute(text(  # the partitions' sizes (a partitioned table itself holds nothing)
                "SELECT CAST(sum(pg_total_relation_size(relid)) AS bigint) "
                "FROM pg_partition_tree('gpu_buckets')")).scalar()
        store.engine.dispose()
        child = subprocess.run([sys.executable, "-m", "bench.audit", surl, "--gpus", str(gpus), "--days",
                                str(days), "--seed", str(seed)], capture_output=True, text=True, check=False,
                               timeout=3600)
        if child.returncode != 0:
            raise RuntimeError(f"audit child failed: {child.stderr.strip().splitlines()[-1:]}")
        out = json.loads(child.stdout.strip().splitlines()[-1])
        out.update(ingest_s=ingest_s, ingest_rows=stats.buckets, bucket_bytes=size)  # type: ignore[attr-defined]
        return out
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        admin.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=DEFAULT_URL)
    ap.add_argument("--gpus", default="1024", help="GPUs; with --from a comma-separated list")
    ap.add_argument("--days", type=float, default=7)
    ap.add_argument("--from", dest="src", default=None, help="directory of cached SQLite fleets (bench.fleet)")
    args = ap.parse_args()
    if args.src is None:
        print(json.dumps(measure(args.url, int(args.gpus), args.days)))
        return
    from bench.pg_fleet import report, side_by_side

    rows = side_by_side(args.url, [int(g) for g in args.gpus.split(",")], args.days, Path(args.src))
    print(report(rows))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
