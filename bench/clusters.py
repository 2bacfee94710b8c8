"""One audit of a fleet in one process beside the same audit in per-cluster processes (``store.audit_processes``),
on one store, each audit in a child process of its own (so its peak RSS is its own).

Prints one JSON line per audit and a closing comparison: wall seconds, the audit process's CPU seconds, its
peak RSS (``VmHWM``) and, for the per-cluster audit, each process's clusters, wall and CPU seconds and peak
RSS; whether both audits' usage rows and findings hash the same (:func:`bench.audit.run_digest`). PostgreSQL's
own CPU is not in these figures (the server's processes are not ours). A fleet of several clusters comes from
``python -m bench.fleet --clusters N`` and its PostgreSQL copy from :func:`bench.pg_fleet.fleet_schema`.

Run: python -m bench.clusters URL --gpus 100000 --days 1 --clusters 10 [--processes 4]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from typing import Any


def child(url: str, gpus: int, days: float, seed: int, clusters: int, processes: int) -> dict[str, Any]:
    """One audit of the fleet (in this process); its figures, then its digest, then the run is deleted."""
    from auditor.audit.run import run_audit
    from auditor.config import Config
    from auditor.simulate import FleetSpec
    from auditor.store.engine import Store
    from bench.audit import _drop_run, peak_rss_kib, run_digest

    spec = FleetSpec(gpus=gpus, days=days, seed=seed, clusters=clusters)
    store = Store.open(url)
    store.upgrade()
    t, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    res = run_audit(store, Config.model_validate({"store": {"audit_processes": processes}}), spec.start, spec.end)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    out: dict[str, Any] = {
        "processes": res.processes, "wall_s": time.perf_counter() - t,
        "cpu_s": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, "peak_rss_mib": peak_rss_kib() / 1024,
        "allocations": res.summary.get("allocations"), "findings": sum(res.summary.get("findings", {}).values()),
        "workers": [{k: v for k, v in w.items() if k != "steps"} for w in res.workers],
        "steps": {k: round(v, 2) for k, v in res.steps.items()}}
    out["digest"] = run_digest(store, res.run_id)  # after the peak was read: it holds every row
    _drop_run(store, res.run_id)
    store.engine.dispose()
    return out


def main(argv: list[str] | None = None) -> None:
    from bench.audit import fleet_parser

    ap = fleet_parser(__doc__.splitlines()[0])
    ap.add_argument("--clusters", type=int, default=1, help="Clusters of the fleet (part of its spec).")
    ap.add_argument("--processes", type=int, default=4, help="store.audit_processes of the second audit.")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child is not None:
        print(json.dumps(child(a.url, a.gpus, a.days, a.seed, a.clusters, a.child)), flush=True)
        return
    from auditor.audit.usage import refresh_aggregate
    from auditor.config import Config
    from auditor.simulate import FleetSpec
    from auditor.store.engine import Store

    store = Store.open(a.url)  # the judged aggregate up to date first, so neither audit pays its upkeep
    store.upgrade()
    spec = FleetSpec(gpus=a.gpus, days=a.days, seed=a.seed, clusters=a.clusters)
    refresh_aggregate(store, Config().thresholds, int(spec.start.timestamp()))
    store.engine.dispose()
    rows = []
    for n in (1, a.processes):
        cmd = [sys.executable, "-m", "bench.clusters", a.url, "--gpus", str(a.gpus), "--days", str(a.days),
               "--seed", str(a.seed), "--clusters", str(a.clusters), "--child", str(n)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)  # noqa: S603
        if proc.returncode != 0:
            raise SystemExit(f"audit with {n} process(es) failed: {proc.stderr.strip()[-2000:]}")
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    one, many = rows
    print(f"one process: wall {one['wall_s']:.1f} s, CPU {one['cpu_s']:.1f} s, peak RSS {one['peak_rss_mib']:.0f} "
          f"MiB | {many['processes']} processes: wall {many['wall_s']:.1f} s (x{one['wall_s'] / many['wall_s']:.2f}), "
          f"CPU {many['cpu_s'] + sum(w['cpu_s'] for w in many['workers']):.1f} s (the audit's own "
          f"{many['cpu_s']:.1f} s + its processes'), peak RSS the audit's own {many['peak_rss_mib']:.0f} MiB, "
          f"per process {', '.join(str(round(w['peak_rss_mib'])) for w in many['workers'])} MiB | "
          f"usage rows and findings {'identical' if one['digest'] == many['digest'] else 'DIFFER'}", flush=True)


if __name__ == "__main__":
    main()
