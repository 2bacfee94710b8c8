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
    """Time the bucket-judging step (auditor.audit.judging.judge) inside the audit: the part that reads every
    bucket, i.e. what the floor compares with; the rest is per-allocation work (findings, sparklines, money)."""
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
    server = ServerCpu(store)
    cfg = Config()
    f1, rows = floor_seconds(store)
    judge_s = _time_judge()
    t, c, sv = time.perf_counter(), _cpu(), server.seconds()
    result = run_audit(store, cfg, spec.start, spec.end)
    audit_s, audit_cpu, audit_srv = time.perf_counter() - t, _cpu() - c, server.seconds() - sv
    rss_kib = peak_rss_kib()
    f2, _ = floor_seconds(store)
    out: dict[str, object] = {"gpus": gpus, "rows": rows, "audit_s": audit_s, "audit_cpu_s": audit_cpu,
                              # PostgreSQL backends the pool opened
                              "audit_server_cpu_s": audit_srv, "judge_s": judge_s[0],
                              "floor_s": min(f1, f2),
                              "rss_mib": rss_kib / 1024, "allocations": result.summary.get("allocations"),
                              "findings": sum(result.summary.get("findings", {}).values()),
                              "steps": {k: round(v, 3) for k, v in result.steps.items()}}
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


class ServerCpu:
    """CPU seconds of the local PostgreSQL backends this store's pool checks out (utime + stime from /proc; 0
    elsewhere or on SQLite): with one judging connection, the server's share of an audit."""

    def __init__(self, store: object) -> None:
        self.pids: set[int] = set()
        if store.engine.dialect.name != "postgresql":  # type: ignore[attr-defined]
            return
        from sqlalchemy import event

        @event.listens_for(store.engine, "connect")  # type: ignore[attr-defined]
        def _pid(dbapi: object, _rec: object) -> None:
            with dbapi.cursor() as cur:  # type: ignore[attr-defined]
                cur.execute("SELECT pg_backend_pid()")
                self.pids.add(cur.fetchone()[0])

    def seconds(self) -> float:
        import os

        total = 0.0
        for pid in self.pids:
            try:
                f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        return total


def _bucket_records(conn: object, lo: int, hi: int) -> list[object]:
    """The stored buckets starting in [lo, hi) as the records an ingest writes (every stored field)."""
    from datetime import UTC, datetime

    from auditor.records import GpuBucket
    from auditor.store.columns import METRIC_COMMENTS

    metrics = list(METRIC_COMMENTS)
    rows = conn.execute(text(  # type: ignore[attr-defined]
        "SELECT tg.cluster, tg.host, tg.gpu_index, tg.gpu_instance, b.bucket_ts, b.bucket_s, b.samples, b.observed_s, "
        "b.span_start, b.span_end, b.job, b.hpc_job, b.pod, b.namespace, b.container, "
        + ", ".join(f"b.{m}" for m in metrics) + " FROM gpu_buckets b JOIN telemetry_gpus tg ON tg.id = b.gpu_id "
        "WHERE b.bucket_ts >= :lo AND b.bucket_ts < :hi"), {"lo": lo, "hi": hi}).all()
    when = lambda ts: None if ts is None else datetime.fromtimestamp(ts, UTC)  # noqa: E731
    return [GpuBucket(r[0], r[1], r[2], when(r[4]), r[5], r[6], gpu_instance=r[3], observed_s=r[7],
                      span_start=when(r[8]), span_end=when(r[9]), job=r[10], hpc_job=r[11], pod=r[12],
                      namespace=r[13], container=r[14], **dict(zip(metrics, r[15:], strict=True))) for r in rows]


def ingest_and_upkeep(store: object, th: object, since: int, hour: int, server: ServerCpu) -> dict[str, float]:
    """Upkeep against ingest, one hour of every GPU: the hour's buckets read back, deleted and ingested again
    (new rows, as a collection writes them; the ingest marks the hour), then the audit's re-judging of the
    marked hour. Wall and CPU (client, and PostgreSQL backends) of each."""
    from auditor.audit import usage

    with store.begin() as conn:  # type: ignore[attr-defined]
        recs = _bucket_records(conn, hour, hour + 3600)
        conn.execute(text("DELETE FROM gpu_buckets WHERE bucket_ts >= :lo AND bucket_ts < :hi"),
                     {"lo": hour, "hi": hour + 3600})
    out: dict[str, float] = {"hour_buckets": len(recs)}
    t, c, sv = time.perf_counter(), _cpu(), server.seconds()
    store.ingest(recs, seen_at_ts=hour + 3600)  # type: ignore[attr-defined]
    out.update(ingest_s=time.perf_counter() - t, ingest_cpu_s=_cpu() - c, ingest_server_cpu_s=server.seconds() - sv)
    t, c, sv = time.perf_counter(), _cpu(), server.seconds()
    up = usage.refresh_aggregate(store, th, since)  # type: ignore[arg-type]
    out.update(upkeep_s=time.perf_counter() - t, upkeep_cpu_s=_cpu() - c, upkeep_server_cpu_s=server.seconds() - sv,
               upkeep_hours=up.get("rejudged_hours") or 0)
    out["upkeep_over_ingest"] = out["upkeep_s"] / out["ingest_s"]
    return out


def side_by_side(url: str, gpus: int, days: float, seed: int) -> dict[str, object]:
    """In one process on one store: the floor, the audit judging every bucket (``Judging(whole_hours=False)``:
    the bucket path), building the judged aggregate, the audit reading it (whole hours from judged_hours, edges
    judged and kept), the audit after it (edges read as kept), and the upkeep of one hour of every GPU against
    that hour's ingest (:func:`ingest_and_upkeep`); wall, this process's CPU and (PostgreSQL) the server backends'
    CPU seconds (one judging connection, so the server's work is on backends this process opened), the machine's
    speed, and whether both audits' digests (:func:`run_digest`) agree."""
    from auditor.audit import usage
    from auditor.audit.judging import Judging
    from auditor.audit.run import run_audit
    from auditor.config import Config
    from auditor.simulate import FleetSpec
    from auditor.store.engine import Store
    from bench.__main__ import machine

    spec = FleetSpec(gpus=gpus, days=days, seed=seed)
    store = Store.open(url)
    server = ServerCpu(store)  # before the pool opens its first connection
    store.upgrade()
    cfg = Config()
    out: dict[str, object] = {"gpus": gpus, "engine": store.engine.dialect.name, "machine": machine()}
    with store.begin() as conn:  # a cold start: no aggregate yet
        for t in ("judged_hours", "judged_sets", "judged_dirty"):
            conn.execute(text(f"DELETE FROM {t}"))
    floors = [floor_seconds(store)[0]]

    def timed(fn: object) -> tuple[float, float, float, object]:
        t, c, sv = time.perf_counter(), _cpu(), server.seconds()
        res = fn()  # type: ignore[operator]
        return time.perf_counter() - t, _cpu() - c, server.seconds() - sv, res

    def audit(whole_hours: bool) -> tuple[float, float, float, object]:
        return timed(lambda: run_audit(store, cfg, spec.start, spec.end, judging=Judging(whole_hours=whole_hours)))

    old_s, old_cpu, old_srv, old = audit(False)
    floors.append(floor_seconds(store)[0])
    fc, fsv = _cpu(), server.seconds()
    floors.append(floor_seconds(store)[0])
    out["floor_cpu_s"], out["floor_server_cpu_s"] = _cpu() - fc, server.seconds() - fsv
    out["build_s"], out["build_cpu_s"], out["build_server_cpu_s"], _ = timed(
        lambda: usage.refresh_aggregate(store, cfg.thresholds, int(spec.start.timestamp())))
    new_s, new_cpu, new_srv, new = audit(True)
    floors.append(floor_seconds(store)[0])
    # the audit after it: nothing written since, so it reads the whole hours and (Judging.edges) the kept edges
    again_s, again_cpu, again_srv, again = audit(True)
    floors.append(floor_seconds(store)[0])
    floor = min(floors)
    d_old, d_new = run_digest(store, old.run_id), run_digest(store, new.run_id)  # type: ignore[attr-defined]
    d_again = run_digest(store, again.run_id)  # type: ignore[attr-defined]
    out.update({"floor_s": floor, "old_audit_s": old_s, "old_audit_cpu_s": old_cpu, "old_audit_server_cpu_s": old_srv,
                "new_audit_s": new_s, "new_audit_cpu_s": new_cpu, "new_audit_server_cpu_s": new_srv,
                "again_audit_s": again_s, "again_audit_cpu_s": again_cpu, "again_audit_server_cpu_s": again_srv,
                "old_floor": old_s / floor, "new_floor": new_s / floor, "again_floor": again_s / floor,
                "old_steps": {k: round(v, 3) for k, v in old.steps.items()},  # type: ignore[attr-defined]
                "new_steps": {k: round(v, 3) for k, v in new.steps.items()},  # type: ignore[attr-defined]
                "again_steps": {k: round(v, 3) for k, v in again.steps.items()},  # type: ignore[attr-defined]
                "digest_old": d_old, "digest_new": d_new, "equal": d_old == d_new == d_again})
    for r in (old, new, again):
        _drop_run(store, r.run_id)  # type: ignore[attr-defined]
    last = int(spec.end.timestamp()) // 3600 * 3600 - 3600
    out["upkeep"] = ingest_and_upkeep(store, cfg.thresholds, int(spec.start.timestamp()), last, server)
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
