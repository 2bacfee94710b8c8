"""Collecting several file-based clusters one after another vs in parallel worker processes (issue 20).

Each cluster gets its own allocations CSV and long-format telemetry CSV (one row per GPU, metric and minute,
as dcgm-exporter data exported by a site), generated once into a temporary directory (not timed). Then
``auditor.collect.collect`` reads all clusters into a fresh store twice: ``parallel=1`` (in this process,
one cluster after another) and ``parallel=N`` (N spawned workers, each streaming batches to the store).
Both stores must hold the same number of allocations and buckets (checked). SQLite writers queue on the
write lock, PostgreSQL writers run concurrently; the reading and parsing run side by side either way.

Run: python -m bench.collect [--clusters 4] [--gpus 32] [--hours 24] [--url sqlite|postgresql+psycopg://...]
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

T0 = datetime(2026, 11, 20, tzinfo=UTC)
METRICS = ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED")


def write_cluster(d: Path, gpus: int, hours: float, seed: int) -> int:
    """Allocations (one 2-hour job per GPU every 3 hours) and minute telemetry; returns telemetry rows."""
    rnd = random.Random(seed)
    d.mkdir(parents=True, exist_ok=True)
    hosts = max(1, gpus // 8)
    with (d / "alloc.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "name", "user", "account", "start", "end", "gpus", "model"])
        n = 0
        for h in range(hosts):
            for g in range(8):
                for k in range(max(1, int(hours // 3))):
                    s = T0 + timedelta(hours=3 * k, minutes=rnd.randint(0, 30))
                    w.writerow([str(n), f"job{n}", f"user{n % 13}", f"acct{n % 5}", s.isoformat(),
                                (s + timedelta(hours=2)).isoformat(), f"n{h}:{g}", "h100"])
                    n += 1
    rows = 0
    base = int(T0.timestamp())
    with (d / "tel.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["timestamp", "host", "gpu", "uuid", "metric", "value"])
        for t in range(int(hours * 60)):
            for h in range(hosts):
                for g in range(8):
                    w.writerow([base + 60 * t, f"n{h}", g, f"GPU-{seed}-{h}-{g}", METRICS[0], round(rnd.random(), 3)])
                    w.writerow([base + 60 * t, f"n{h}", g, f"GPU-{seed}-{h}-{g}", METRICS[1], rnd.randint(0, 100)])
                    rows += 2
    return rows


def config(root: Path, url: str, clusters: int) -> Any:
    from auditor import config as config_mod

    text = f'[store]\nurl = "{url}"\n'
    for i in range(clusters):
        text += (f'[[clusters]]\nname = "c{i}"\ninitial_days = 30\n'
                 f'[[clusters.allocations]]\nkind = "file"\npaths = ["c{i}/alloc.csv"]\n'
                 f'[[clusters.telemetry]]\nkind = "file"\npaths = ["c{i}/tel.csv"]\n')
    (root / "c.toml").write_text(text)
    return config_mod.load(root / "c.toml")


def _once(root: Path, url: str, clusters: int, parallel: int) -> tuple[float, int, int]:
    from auditor.collect import collect
    from auditor.store.engine import Store

    cfg = config(root, url, clusters)
    store = Store.open(url, cfg.store.batch_rows)
    store.upgrade()
    until = T0 + timedelta(days=2)
    t = time.perf_counter()
    summary = collect(store, cfg, base_dir=root, until=until, now=until, parallel=parallel)
    secs = time.perf_counter() - t
    if not summary.ok:
        raise SystemExit(f"bench.collect: {[r.error for r in summary.failed]}")
    counts = store.count("allocations"), store.count("gpu_buckets")
    store.engine.dispose()
    return secs, *counts


def measure(clusters: int = 4, gpus: int = 32, hours: float = 24, url: str = "sqlite",
            workers: int = 0) -> dict[str, Any]:
    """Sequential vs parallel collection of ``clusters`` generated clusters into fresh stores."""
    from contextlib import ExitStack

    workers = workers or clusters
    with tempfile.TemporaryDirectory(prefix="gpu-audit-bench-collect-") as tmp, ExitStack() as stack:
        root = Path(tmp)
        rows = sum(write_cluster(root / f"c{i}", gpus, hours, seed=i + 1) for i in range(clusters))
        urls = []
        for name in ("seq", "par"):
            if url == "sqlite":
                urls.append(f"sqlite:///{root / (name + '.db')}")
            else:
                from bench.pg_ingest import _schema

                urls.append(stack.enter_context(_schema(url, 100 + len(urls))))
        seq_s, a1, b1 = _once(root, urls[0], clusters, 1)
        par_s, a2, b2 = _once(root, urls[1], clusters, workers)
    if (a1, b1) != (a2, b2):
        raise SystemExit(f"bench.collect: parallel stored {a2} allocations / {b2} buckets, sequential {a1} / {b1}")
    return {"engine": "sqlite" if url == "sqlite" else "postgresql", "clusters": clusters, "workers": workers,
            "telemetry_rows": rows, "allocations": a1, "buckets": b1, "sequential_s": seq_s, "parallel_s": par_s,
            "speedup": seq_s / par_s}


def report(r: dict[str, Any]) -> str:
    return (f"collect {r['clusters']} file clusters ({r['telemetry_rows']:,} telemetry rows -> {r['buckets']:,} "
            f"buckets, {r['allocations']:,} allocations) on {r['engine']}: sequential {r['sequential_s']:.2f}s | "
            f"{r['workers']} workers {r['parallel_s']:.2f}s | speed-up {r['speedup']:.2f}x (same rows stored)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clusters", type=int, default=4)
    ap.add_argument("--gpus", type=int, default=32, help="GPUs per cluster.")
    ap.add_argument("--hours", type=float, default=24)
    ap.add_argument("--workers", type=int, default=0, help="Worker processes (default: one per cluster).")
    ap.add_argument("--url", default="sqlite", help="'sqlite' (temporary files) or a PostgreSQL URL.")
    a = ap.parse_args()
    r = measure(a.clusters, a.gpus, a.hours, a.url, a.workers)
    print(report(r))
    print(json.dumps(r))


if __name__ == "__main__":
    main()
