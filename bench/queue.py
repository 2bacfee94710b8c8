"""Opportunity cost at fleet scale: the audit of a simulated fleet with and without GPU jobs waiting in its
partition (random waits of 1-8 GPUs, 0.1-8 h, over the week), in one process per run.

Run: python -m bench.queue URL --gpus 256 --waits 2000     (URL: a fresh store; it is filled here)
Prints one JSON line: waits, audit seconds, idle GPU-hours while waited, findings, peak RSS (MiB).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from datetime import timedelta

from auditor.audit.run import run_audit
from auditor.config import Config
from auditor.records import GpuWait
from auditor.simulate import FleetSpec, fleet_records
from auditor.store.engine import Store
from bench.audit import peak_rss_kib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("--gpus", type=int, default=256)
    ap.add_argument("--days", type=float, default=7)
    ap.add_argument("--waits", type=int, default=2000)
    a = ap.parse_args()
    spec = FleetSpec(gpus=a.gpus, days=a.days)
    store = Store.open(a.url)
    store.upgrade()
    store.ingest(fleet_records(spec), seen_at_ts=int(spec.end.timestamp()))
    rng = random.Random(1)
    waits = []
    for i in range(a.waits):
        start = spec.start + timedelta(hours=rng.uniform(0, a.days * 24 - 8))
        waits.append(GpuWait(spec.cluster, "slurm", f"w{i}", rng.choice([1, 2, 4, 8]), eligible=start,
                             end=start + timedelta(hours=rng.uniform(0.1, 8)), partition="gpu"))
    store.ingest(waits, seen_at_ts=int(spec.end.timestamp()))
    t0 = time.perf_counter()
    run = run_audit(store, Config(), spec.start, spec.end)
    dt = time.perf_counter() - t0
    q = run.summary["opportunity"]["idle_while_queued"]
    print(json.dumps({"gpus": a.gpus, "waits": a.waits, "audit_s": round(dt, 2),
                      "idle_while_queued_gpu_hours": round(sum(c["idle_gpu_hours"] for c in q["by_cluster"]), 1),
                      "findings": run.summary["findings"].get("idle_while_queued", 0),
                      "rss_mib": round(peak_rss_kib() / 1024)}))


if __name__ == "__main__":
    main()
