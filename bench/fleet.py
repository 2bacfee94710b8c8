"""Simulated fleet stores for the benchmarks, generated once and cached under bench/out/.

A store is keyed by its :class:`auditor.simulate.FleetSpec` (GPUs, days, bucket, seed). It is written to
a temporary name and renamed when complete, with a JSON sidecar recording how long generation and ingest
took, so a later run reuses it and still reports the generation figures.

Run: python -m bench.fleet --sizes 1024,4096,16384 [--days 7] [--seed 1] [--clusters 1]   (pre-generate)
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from auditor.simulate import FleetSpec, fleet_records
from auditor.store.engine import Store

OUT = Path(__file__).resolve().parent / "out"


def store_path(spec: FleetSpec, out: Path = OUT) -> Path:
    return out / f"fleet-{spec.key()}.db"


def _remove(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        p = Path(str(path) + suffix)
        if p.exists():
            p.unlink()


def generate(spec: FleetSpec, path: Path, batch_rows: int = 200_000) -> dict[str, Any]:
    """Stream the fleet through Store.ingest into a fresh SQLite file; return counts and timings."""
    _remove(path)
    store = Store.open(f"sqlite:///{path}", batch_rows=batch_rows)
    store.upgrade()
    t0 = time.monotonic()
    gen_s = 0.0

    def timed() -> Any:
        nonlocal gen_s
        it = fleet_records(spec)
        while True:
            t = time.monotonic()
            try:
                rec = next(it)
            except StopIteration:
                gen_s += time.monotonic() - t
                return
            gen_s += time.monotonic() - t
            yield rec

    stats = store.ingest(timed(), seen_at_ts=int(spec.end.timestamp()))
    total = time.monotonic() - t0
    store.engine.dispose()
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return {"gpus": spec.gpus, "days": spec.days, "bucket_s": spec.bucket_s, "seed": spec.seed,
            "buckets": stats.buckets, "allocations": stats.allocations, "allocated_gpus": stats.allocated_gpus,
            "total_s": round(total, 1), "generate_s": round(gen_s, 1), "ingest_s": round(total - gen_s, 1),
            "bytes": path.stat().st_size}


def cached(spec: FleetSpec, out: Path = OUT, log: Any = print) -> tuple[Path, dict[str, Any], bool]:
    """The store for ``spec``: (path, generation figures, reused?). Generates it when missing."""
    out.mkdir(parents=True, exist_ok=True)
    path = store_path(spec, out)
    meta = path.with_suffix(".json")
    if path.exists() and meta.exists():
        store = Store.open(f"sqlite:///{path}")
        store.upgrade()  # a store cached under an older migration head gets the newer tables (cheap)
        store.engine.dispose()
        return path, json.loads(meta.read_text()), True
    log(f"  generating {spec.gpus:,} GPUs x {spec.days:g} days ({spec.gpus * spec.buckets_per_gpu:,} buckets) "
        f"-> {path.name} ...")
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    info = generate(spec, tmp)
    _remove(path)
    tmp.rename(path)
    _remove(tmp)
    meta.write_text(json.dumps(info, indent=1))
    return path, info, False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1024,4096,16384")
    ap.add_argument("--days", type=float, default=7)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--clusters", type=int, default=1, help="Clusters the fleet is split into (contiguous "
                    "blocks of nodes, named sim-00, sim-01, ...): per-cluster audits (bench.clusters).")
    args = ap.parse_args()
    for n in (int(x) for x in args.sizes.split(",") if x):
        path, info, reused = cached(FleetSpec(gpus=n, days=args.days, seed=args.seed, clusters=args.clusters))
        print(f"{path.name}: {'reused' if reused else 'generated'} {json.dumps(info)}", flush=True)


if __name__ == "__main__":
    main()
