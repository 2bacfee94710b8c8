"""What the host side of "Where the waiting goes" costs: the waiting pass (auditor.audit.waiting.analyse: the
classes and the stragglers) over a simulated fleet, without node rows and with one node row per node and
bucket (every bucket row then meets its node row through the one LEFT JOIN), side by side in one run, wall and
CPU seconds.

Run: python -m bench.waiting_host [--gpus 256] [--days 7] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import text

from auditor.simulate import FleetSpec


def timed(fn: Any, repeat: int) -> tuple[float, float]:
    """Best wall and CPU seconds of ``repeat`` calls."""
    best = (float("inf"), float("inf"))
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        best = min(best, (time.perf_counter() - w, time.process_time() - c))
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=256)
    ap.add_argument("--days", type=float, default=7)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    from auditor.audit import waiting
    from auditor.audit.run import run_audit
    from auditor.config import Config
    from auditor.records import NodeBucket
    from auditor.store.engine import Store
    from bench import fleet

    spec = FleetSpec(gpus=a.gpus, days=a.days)
    path, _, _ = fleet.cached(spec, log=lambda *x: None)
    d = Path(tempfile.mkdtemp())
    shutil.copyfile(path, d / "s.db")
    store = Store.open(f"sqlite:///{d / 's.db'}")
    store.upgrade()
    cfg = Config()
    res = run_audit(store, cfg, spec.start, spec.end)
    p = {"since": int(spec.start.timestamp()), "until": int(spec.end.timestamp()),
         "horizon": int(spec.end.timestamp()), "run": res.run_id}
    with store.engine.connect() as conn:
        per_alloc = [dict(r._mapping) | {"price": 1.0, "infra_s": 0.0} for r in conn.execute(text(
            "SELECT u.allocation_id, u.reserved_s, a.cluster, a.account AS team, a.external_id, a.name "
            "FROM usage_allocation u JOIN allocations a ON a.id = u.allocation_id WHERE u.run_id = :r"),
            {"r": res.run_id})]
        hosts = [r[0] for r in conn.execute(text("SELECT DISTINCT host FROM telemetry_gpus"))]

    def once() -> None:
        with store.engine.connect() as conn:
            waiting.analyse(conn, res.run_id, per_alloc, cfg.thresholds, p)

    bare = timed(once, a.repeat)
    start = int(spec.start.timestamp())
    rows = [NodeBucket(spec.cluster, h, datetime.fromtimestamp(start + i * spec.bucket_s, UTC), spec.bucket_s, 10,
                       300.0, cpus=64.0, cpu_busy=8.0, cpu_iowait=0.5, cpu_pegged=0.0, disk_busy=0.1, nfs_ops=10.0)
            for h in hosts for i in range(spec.buckets_per_gpu)]
    store.ingest(rows, seen_at_ts=int(time.time()))
    joined = timed(once, a.repeat)
    print(json.dumps({"gpus": a.gpus, "days": a.days, "node_rows": len(rows), "bare_wall_s": round(bare[0], 3),
                      "bare_cpu_s": round(bare[1], 3), "joined_wall_s": round(joined[0], 3),
                      "joined_cpu_s": round(joined[1], 3), "ratio_wall": round(joined[0] / bare[0], 2)}))
    store.engine.dispose()
    shutil.rmtree(d)


if __name__ == "__main__":
    main()
