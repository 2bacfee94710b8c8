"""Web UI page render times on a simulated fleet store (a benchmark, not a test; target p95 <= 200 ms).

Each page and its JSON API is requested in-process through the ASGI app (Starlette's TestClient: routing,
the store's SELECTs, Jinja2 rendering, SVG, middleware; no network), after two warm-up requests, and the
wall time and the process CPU time of every request are kept (on a busy machine the CPU time shows the
page's own cost, the wall time adds the wait for a core; the 1-minute load average is printed).
Prints one JSON line per URL (p50, p95, max in ms, bytes) and a summary.
The audit run it needs is created when the store has none and deleted afterwards (``--keep`` keeps it), so
the cached store stays as generated.

Run: python -m bench.bench_web [--gpus 4096] [--days 7] [--seed 1] [--n 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

from sqlalchemy import text

TARGET_MS = 200.0


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of ``values``."""
    s = sorted(values)
    return s[max(0, min(len(s) - 1, int(round(q / 100.0 * len(s) + 0.5)) - 1))]


def urls(store: Any, run_id: int) -> list[str]:
    """Every page (and its API), with a costly allocation and a filtered, sorted findings list."""
    with store.engine.connect() as conn:
        aid = conn.execute(text("SELECT allocation_id FROM findings WHERE run_id = :r AND allocation_id IS NOT "
                                "NULL ORDER BY cost DESC LIMIT 1"), {"r": run_id}).scalar()
        multi = conn.execute(text("SELECT allocation_id FROM usage_allocation WHERE run_id = :r ORDER BY gpus DESC "
                                  "LIMIT 1"), {"r": run_id}).scalar()
    pages = ["/", "/teams", "/users", "/clusters", "/findings", "/findings?kind=idle_allocation&sort=idle&order=asc",
             "/findings?q=job&page=3", f"/allocation/{aid}", f"/allocation/{multi}", "/chargeback?by=team",
             "/chargeback?by=user"]
    return [*pages, *("/api" + (p if p != "/" else "/overview") for p in pages), "/chargeback.csv?by=account"]


def measure(gpus: int, days: float, seed: int, n: int, keep: bool) -> dict[str, Any]:
    from starlette.testclient import TestClient

    from auditor.audit.run import latest_run, run_audit
    from auditor.config import Config
    from auditor.simulate import FleetSpec
    from auditor.store.engine import Store
    from auditor.web.app import create_app
    from bench.fleet import cached

    spec = FleetSpec(gpus=gpus, days=days, seed=seed)
    path, _, _ = cached(spec, log=lambda m: print(m, file=sys.stderr, flush=True))
    store = Store.open(f"sqlite:///{path}")
    cfg = Config()
    created = None
    run_id = latest_run(store)
    if run_id is None:
        t = time.perf_counter()
        created = run_id = run_audit(store, cfg, spec.start, spec.end).run_id
        print(f"  audit for the pages: {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    client = TestClient(create_app(store, cfg))
    results = []
    try:
        for url in urls(store, run_id):
            times, cpu, size = [], [], 0
            for i in range(n + 2):
                t, c = time.perf_counter(), time.process_time()
                r = client.get(url)
                dt, dc = (time.perf_counter() - t) * 1000, (time.process_time() - c) * 1000
                if r.status_code != 200:
                    raise SystemExit(f"{url}: HTTP {r.status_code}: {r.text[:200]}")
                size = len(r.content)
                if i >= 2:
                    times.append(dt)
                    cpu.append(dc)
            row = {"url": url, "n": n, "p50_ms": statistics.median(times), "p95_ms": pct(times, 95),
                   "max_ms": max(times), "cpu_p50_ms": statistics.median(cpu), "cpu_p95_ms": pct(cpu, 95),
                   "bytes": size}
            results.append(row)
            print(json.dumps(row), flush=True)
    finally:
        if created is not None and not keep:
            with store.begin() as conn:
                for table in ("findings", "usage_gpu", "usage_allocation"):
                    conn.execute(text(f"DELETE FROM {table} WHERE run_id = :r"), {"r": created})
                conn.execute(text("DELETE FROM audit_runs WHERE id = :r"), {"r": created})
        store.engine.dispose()
    worst = max(results, key=lambda r: r["p95_ms"])
    pages = [r for r in results if not r["url"].startswith("/api") and not r["url"].endswith(".csv")]
    return {"gpus": gpus, "urls": len(results), "worst_url": worst["url"], "worst_p95_ms": worst["p95_ms"],
            "pages_p95_ms": pct([r["p95_ms"] for r in pages], 95),
            "worst_cpu_p95_ms": max(r["cpu_p95_ms"] for r in results), "target_ms": TARGET_MS,
            "met": worst["p95_ms"] <= TARGET_MS, "load_avg_1m": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=4096)
    ap.add_argument("--days", type=float, default=7)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--n", type=int, default=30, help="Timed requests per URL (after 2 warm-up requests).")
    ap.add_argument("--keep", action="store_true", help="Keep the audit run created for the pages.")
    args = ap.parse_args(argv)
    print(json.dumps({"summary": measure(args.gpus, args.days, args.seed, args.n, args.keep)}), flush=True)


if __name__ == "__main__":
    main()
