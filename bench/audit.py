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


def _rounded(v: object) -> object:
    """Floats to 9 significant digits (sums added in another order differ in the last bits), recursively."""
    if isinstance(v, float):
        return float(f"{v:.9g}")
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in sorted(v.items())}
    if isinstance(v, list | tuple):
        return [_rounded(x) for x in v]
    return v


def run_digest(store: object, run_id: int) -> dict[str, object]:
    """A hash of a run's usage_gpu rows, of its findings (evidence included) and of its summary, floats to 9
    digits: two judging paths on the same store give the same digest when their figures are the same."""
    import hashlib

    out: dict[str, object] = {}
    with store.engine.connect() as conn:  # type: ignore[attr-defined]
        for table in ("usage_gpu", "usage_allocation", "findings"):
            rows = conn.execute(text(f"SELECT * FROM {table} WHERE run_id = :r"), {"r": run_id}).mappings().all()
            texts = []
            for r in rows:
                d = {k: v for k, v in r.items() if k not in ("run_id", "id")}
                if isinstance(d.get("evidence"), str):
                    d["evidence"] = json.loads(d["evidence"])
                texts.append(json.dumps(_rounded(d), sort_keys=True, default=str))
            h = hashlib.sha256()
            for t in sorted(texts):  # order-independent (findings of one user and kind share every key column)
                h.update(t.encode())
            out[table] = f"{len(rows)}:{h.hexdigest()[:16]}"
        summary = conn.execute(text("SELECT summary FROM audit_runs WHERE id = :r"), {"r": run_id}).scalar()
        summary = json.loads(summary) if isinstance(summary, str) else summary
        # the run summary's figures (where the waiting goes, capacity, ...), floats to 9 digits
        out["summary"] = hashlib.sha256(json.dumps(_rounded(summary), sort_keys=True, default=str).encode()
                                        ).hexdigest()[:16]
    return out


def _drop_run(store: object, run_id: int) -> None:
    with store.begin() as conn:  # type: ignore[attr-defined]
        for table in ("findings", "usage_gpu", "usage_allocation"):
            conn.execute(text(f"DELETE FROM {table} WHERE run_id = :r"), {"r": run_id})
        conn.execute(text("DELETE FROM audit_runs WHERE id = :r"), {"r": run_id})


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def side_by_side(url: str, gpus: int, days: float, seed: int) -> dict[str, object]:
    """In one process on one store: the floor, the audit judging every bucket (the old path), building the
    judged aggregate, the audit reading it (whole hours from judged_hours, edges from buckets), and the
    upkeep of one re-judged hour of every GPU; wall and this process's CPU seconds (the client's: the
    PostgreSQL server's CPU is not in it), and whether both audits' digests (:func:`run_digest`) agree."""
    from auditor.audit import usage
    from auditor.audit.run import run_audit
    from auditor.config import Config
    from auditor.simulate import FleetSpec
    from auditor.store import judged
    from auditor.store.engine import Store

    spec = FleetSpec(gpus=gpus, days=days, seed=seed)
    store = Store.open(url)
    store.upgrade()
    cfg = Config()
    out: dict[str, object] = {"gpus": gpus, "engine": store.engine.dialect.name}
    with store.begin() as conn:  # a cold start: no aggregate yet
        for t in ("judged_hours", "judged_sets", "judged_dirty"):
            conn.execute(text(f"DELETE FROM {t}"))
    floors = [floor_seconds(store)[0]]

    def audit(whole_hours: bool) -> tuple[float, float, object]:
        usage.WHOLE_HOURS = whole_hours
        try:
            t, c = time.perf_counter(), _cpu()
            res = run_audit(store, cfg, spec.start, spec.end)
            return time.perf_counter() - t, _cpu() - c, res
        finally:
            usage.WHOLE_HOURS = True

    old_s, old_cpu, old = audit(False)
    floors.append(floor_seconds(store)[0])
    t, c = time.perf_counter(), _cpu()
    usage.refresh_aggregate(store, cfg.thresholds, int(spec.start.timestamp()))
    out["build_s"], out["build_cpu_s"] = time.perf_counter() - t, _cpu() - c
    new_s, new_cpu, new = audit(True)
    floors.append(floor_seconds(store)[0])
    last = int(spec.end.timestamp()) // 3600 * 3600 - 3600
    with store.begin() as conn:  # one hour of every GPU written again (as an hourly collection would)
        judged.mark_range(conn, last, last + 3600)
    t, c = time.perf_counter(), _cpu()
    up = usage.refresh_aggregate(store, cfg.thresholds, int(spec.start.timestamp()))
    out["upkeep_one_hour_s"], out["upkeep_one_hour_cpu_s"] = time.perf_counter() - t, _cpu() - c
    out["upkeep_hours"] = up.get("rejudged_hours")
    floor = min(floors)
    d_old, d_new = run_digest(store, old.run_id), run_digest(store, new.run_id)
    out.update({"floor_s": floor, "old_audit_s": old_s, "old_audit_cpu_s": old_cpu, "new_audit_s": new_s,
                "new_audit_cpu_s": new_cpu, "old_floor": old_s / floor, "new_floor": new_s / floor,
                "old_steps": {k: round(v, 3) for k, v in old.steps.items()},
                "new_steps": {k: round(v, 3) for k, v in new.steps.items()},
                "digest_old": d_old, "digest_new": d_new, "equal": d_old == d_new})
    for r in (old, new):
        _drop_run(store, r.run_id)
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
    ap.add_argument("--paths", action="store_true", help="Side by side: floor, the audit judging every bucket, "
                    "building the judged aggregate, the audit reading it, one hour's upkeep; digests compared.")
    args = ap.parse_args(argv)
    if args.paths:
        print(json.dumps(side_by_side(args.url, args.gpus, args.days, args.seed)), flush=True)
        return
    print(json.dumps(measure(args.url, args.gpus, args.days, args.seed, args.render)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
