"""One audit of a simulated fleet store, measured in its own process (so its peak RSS is the audit's own).

Prints one JSON line: audit seconds, the engine's floor (a bare grouped aggregate over the same bucket
table, run before and after the audit; the faster is reported, i.e. with a warm cache like the audit's),
peak RSS after the audit, and optionally the seconds to render the report of that run.

Run: python -m bench.audit URL --gpus N [--days 7] [--seed 1] [--render DIR]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

from sqlalchemy import text

FLOOR = "SELECT gpu_id, count(*), avg(sm_active) FROM gpu_buckets GROUP BY gpu_id"


def peak_rss_kib() -> float:
    """This process's peak RSS. Linux: VmHWM (ru_maxrss keeps the high-water mark of the process that
    forked us across exec, i.e. the parent's size); elsewhere ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return float(line.split()[1])
    except OSError:
        pass
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def floor_seconds(store: object) -> tuple[float, int]:
    """The engine's own floor: one grouped pass over every bucket row, nothing judged."""
    t = time.perf_counter()
    with store.engine.connect() as conn:  # type: ignore[attr-defined]
        rows = conn.execute(text(FLOOR)).fetchall()
    return time.perf_counter() - t, sum(r[1] for r in rows)


def _time_judge() -> list[float]:
    """Time the bucket-judging step (auditor.audit.usage.judge) inside the audit: the part that reads every bucket,
    i.e. what the floor compares with; the rest is per-allocation work (findings, sparklines, money)."""
    from auditor.audit import usage as audit

    spent = [0.0]
    inner = audit.judge

    def timed(*args: object, **kw: object) -> None:
        t = time.perf_counter()
        inner(*args, **kw)  # type: ignore[arg-type]
        spent[0] += time.perf_counter() - t

    audit.judge = timed  # type: ignore[assignment]
    return spent


def measure(url: str, gpus: int, days: float, seed: int, render: str | None) -> dict[str, object]:
    from auditor.audit.run import run_audit
    from auditor.config import Config
    from auditor.simulate import FleetSpec
    from auditor.store.engine import Store

    spec = FleetSpec(gpus=gpus, days=days, seed=seed)
    store = Store.open(url)
    cfg = Config()
    f1, rows = floor_seconds(store)
    judge_s = _time_judge()
    t = time.perf_counter()
    result = run_audit(store, cfg, spec.start, spec.end)
    audit_s = time.perf_counter() - t
    rss_kib = peak_rss_kib()
    f2, _ = floor_seconds(store)
    # judging in several connections (PostgreSQL): the slowest connection's judging, not their sum
    judge = result.steps.get("judge buckets", judge_s[0]) if result.judge_connections > 1 else judge_s[0]
    out: dict[str, object] = {"gpus": gpus, "rows": rows, "audit_s": audit_s, "judge_s": judge,
                              "floor_s": min(f1, f2),
                              "rss_mib": rss_kib / 1024, "allocations": result.summary.get("allocations"),
                              "findings": sum(result.summary.get("findings", {}).values()),
                              "steps": {k: round(v, 3) for k, v in result.steps.items()},
                              "judge_connections": result.judge_connections}
    if render:
        try:
            from auditor.report.render import write_reports
        except ImportError:
            out["render_s"] = None
        else:
            t = time.perf_counter()
            write_reports(store, cfg, result.run_id, Path(render), ["html", "text", "md", "json"])
            out["render_s"] = time.perf_counter() - t
    with store.begin() as conn:  # leave the cached store as generated, so repeated runs stay comparable
        for table in ("findings", "usage_gpu", "usage_allocation"):
            conn.execute(text(f"DELETE FROM {table} WHERE run_id = :r"), {"r": result.run_id})
        conn.execute(text("DELETE FROM audit_runs WHERE id = :r"), {"r": result.run_id})
    if store.engine.dialect.name == "postgresql":
        # the deleted rows stay as dead tuples until vacuumed: without this each repeated run reads more of
        # them (the 16,384-GPU idle-episode step went from 2.6 to 9 s after a dozen runs)
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for table in ("findings", "usage_gpu", "usage_allocation", "audit_runs"):
                conn.execute(text(f"VACUUM ANALYZE {table}"))
    store.engine.dispose()
    return out


def fleet_parser(description: str) -> argparse.ArgumentParser:
    """The arguments of a benchmark over one generated fleet store (bench.fleet): its URL and its spec."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("url", help="The fleet store (sqlite:///... or postgresql+psycopg://...).")
    ap.add_argument("--gpus", type=int, required=True, help="GPUs of the fleet (part of its spec).")
    ap.add_argument("--days", type=float, default=7, help="Days of the fleet (default 7).")
    ap.add_argument("--seed", type=int, default=1, help="Simulation seed of the fleet (default 1).")
    return ap


def main(argv: list[str] | None = None) -> None:
    ap = fleet_parser(__doc__.splitlines()[0])
    ap.add_argument("--render", default=None, help="Also time write_reports into this directory.")
    args = ap.parse_args(argv)
    print(json.dumps(measure(args.url, args.gpus, args.days, args.seed, args.render)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
