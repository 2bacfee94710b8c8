"""A prototype, not the audit: judging from per-(GPU, hour, verdict) sums, against the floor, checked against
the audit's own usage_gpu sums on the same store.

Why (bench/HISTORY.md, "What audit/floor <= 10x takes"): the audit reads every bucket of the window and
judges it (judge/floor 6-13x), so judging can come near the floor only if it reads fewer rows. Here every
unlabelled bucket that lies inside one clock hour is judged once into a temporary table ``_jh`` (GPU, hour,
verdict: the 11 per-verdict sums of :data:`auditor.audit.judge.BY_VERDICT`, with each bucket's observed
seconds as an allocation holding the whole bucket sees them). An allocated GPU then reads the rollup for the
whole hours inside its reserved interval and judges only the buckets of its two partial end hours as the
audit does (:func:`auditor.audit.judge._judged_cols`, the same bucket condition as the audit's judging).
The per-allocated-GPU sums (:data:`auditor.audit.judge.PIVOT`) are compared, column by column, with the
usage_gpu rows the audit wrote for the same allocated GPUs (relative tolerance 1e-9): the figures are
reported only as ``equal`` when every one matches.

Scope of the prototype: allocated GPUs whose telemetry never carried a job label (``has_jobs = 0``, the
audit's "plain" path; 81-91 % of the allocated GPUs of the simulated fleets), buckets that do not cross a
clock hour, no infrastructure intervals (none in the simulated fleets; the run says how many rows it left out).
Building ``_jh`` reads and judges every bucket once: a store would keep it per hour as telemetry arrives
(per threshold set), so an hourly audit would roll up one new hour, not the week.

Run: python -m bench.rollup URL --gpus N [--days 7] [--seed 1]   (a fleet store of bench.fleet / bench.pg_fleet)
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any

from sqlalchemy import Connection, text

from auditor.audit import verdict
from auditor.audit.judge import _IO, BY_VERDICT, LOOKBACK, PIVOT, _judged_cols, usage_columns
from auditor.config import Thresholds
from auditor.store.sqlfuncs import greatest_least
from bench.audit import _time_judge, fleet_parser, floor_seconds

H = 3600
#: usage_gpu columns compared (the seconds of each verdict, the metric sums, energy, peak memory)
COMPARED = ("observed_s", "idle_s", "idle_by_util_s", "mirage_s", "low_s", "working_s", "busy_unverified_s",
            "unknown_s", "effective_s", "gpu_util_s", "util_observed_s", "sm_s", "sm_observed_s", "tensor_s",
            "dram_s", "io_bps_s", "max_gpu_mirage_s", "mirage_util_s", "mirage_power_s",
            "mirage_power_observed_s", "energy_s", "power_observed_s", "idle_energy_s", "idle_power_observed_s")
_MAXIMA = ("peak_fb_mib", "idle_peak_fb_mib")
_BY_V = ", ".join(f"{sql} AS {k}" for k, sql in BY_VERDICT.items())
#: combining per-verdict sums of several parts (rollup hours, edge buckets) of one allocated GPU
_MERGE = ", ".join(f"{'MAX' if k == 'fb' else 'SUM'}(p.{k}) AS {k}" for k in BY_VERDICT)


def build_sql(dialect: str, th: Thresholds) -> str:
    """``_jh``: per (GPU, hour, verdict) the per-verdict sums of the unlabelled buckets inside that hour, each
    bucket's observed seconds as seen by an allocation that holds the whole bucket."""
    b = verdict.prefixed("b")
    cols = _judged_cols(th, b, "b.bucket_ts", "b.bucket_ts + b.bucket_s", _IO, dialect)
    return (f"CREATE TEMPORARY TABLE _jh AS SELECT j.gpu_id, j.h, j.v, {_BY_V} FROM (SELECT b.gpu_id, "
            f"b.bucket_ts / {H} AS h, {cols} FROM gpu_buckets b WHERE b.job = '' AND b.bucket_s > 0 "
            f"AND b.bucket_ts % {H} + b.bucket_s <= {H}) j GROUP BY j.gpu_id, j.h, j.v")


def judge_sql(dialect: str, th: Thresholds) -> str:
    """Per allocated GPU of ``_att`` the SUMS of :mod:`auditor.audit.judge` (PIVOT): the rollup rows of the
    whole hours inside [a_s, a_e), and the buckets of the partial hours judged as the audit judges them."""
    g, le = greatest_least(dialect)
    b = verdict.prefixed("b")
    cols = _judged_cols(th, b, "x.a_s", "x.a_e", _IO, dialect)
    # hours [hs, he) are whole inside the interval; an interval with none (hs >= he) is all edge
    hs, he = f"(x.a_s + {H - 1}) / {H}", f"x.a_e / {H}"
    # the two partial hours as two index ranges (one range with an OR between them was read whole)
    first = f"b.bucket_ts >= x.a_s - {LOOKBACK} AND b.bucket_ts < {le}(x.a_e, {hs} * {H})"
    last = f"b.bucket_ts >= {g}({hs}, {he}) * {H} AND b.bucket_ts < x.a_e"
    if dialect == "postgresql":  # LATERAL index range scans per allocated GPU, as the audit reads; OFFSET 0
        # keeps PostgreSQL from flattening them into a join (planned as a scan of every bucket with _att probed
        # per bucket: 208 s at 16,384 GPUs)
        part = ("SELECT x.agid, j.* FROM _att x CROSS JOIN LATERAL (SELECT {cols} FROM gpu_buckets b "
                "WHERE b.gpu_id = x.gpu_id AND {rng} AND b.bucket_ts + b.bucket_s > x.a_s AND b.bucket_s > 0 "
                "AND b.job = '' OFFSET 0) j")
        hours = (f"SELECT x.agid, r.* FROM _att x CROSS JOIN LATERAL (SELECT r.v, "
                 f"{', '.join(f'r.{k}' for k in BY_VERDICT)} FROM _jh r WHERE r.gpu_id = x.gpu_id AND r.h >= {hs} "
                 f"AND r.h < {he} OFFSET 0) r")
    else:  # SQLite: CROSS JOIN keeps _att the outer loop, the buckets and rollup rows read through their keys
        part = ("SELECT x.agid, {cols} FROM _att x CROSS JOIN gpu_buckets b ON b.gpu_id = x.gpu_id AND {rng} "
                "AND b.bucket_ts + b.bucket_s > x.a_s AND b.bucket_s > 0 AND b.job = ''")
        hours = (f"SELECT x.agid, r.v, {', '.join(f'r.{k}' for k in BY_VERDICT)} FROM _att x CROSS JOIN _jh r "
                 f"ON r.gpu_id = x.gpu_id AND r.h >= {hs} AND r.h < {he}")
    edges = (f"SELECT j.agid, j.v, {_BY_V} FROM ({part.format(cols=cols, rng=first)} UNION ALL "
             f"{part.format(cols=cols, rng=last)}) j GROUP BY j.agid, j.v")
    merged = f"SELECT p.agid, p.v, {_MERGE} FROM ({edges} UNION ALL {hours}) p GROUP BY p.agid, p.v"
    pivot = ", ".join(f"{sql} AS {k}" for k, sql in PIVOT.items())
    return f"CREATE TEMPORARY TABLE _jr AS SELECT g.agid, {pivot} FROM ({merged}) g GROUP BY g.agid"


def _att(conn: Connection, run_id: int, since: int, horizon: int) -> int:
    """``_att``: the run's plain-path allocated GPUs (telemetry never labelled) with their clipped interval."""
    g, le = greatest_least(conn.dialect.name)
    conn.execute(text(f"""CREATE TEMPORARY TABLE _att AS SELECT u.allocated_gpu_id AS agid, u.gpu_id,
        {g}(a.start_ts, :since) AS a_s, {le}(COALESCE(a.end_ts, :horizon), :horizon) AS a_e, ag.share
        FROM usage_gpu u JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id
        JOIN allocations a ON a.id = u.allocation_id JOIN telemetry_gpus tg ON tg.id = u.gpu_id
        WHERE u.run_id = :run AND tg.has_jobs = 0"""),
                 {"since": since, "horizon": horizon, "run": run_id})
    conn.execute(text("CREATE INDEX _att_gpu ON _att (gpu_id, a_s)"))
    return conn.execute(text("SELECT COUNT(*) FROM _att")).scalar() or 0


def compare(conn: Connection, run_id: int) -> dict[str, Any]:
    """Column by column, the prototype's usage (usage_columns of its sums) against the audit's usage_gpu."""
    cols = usage_columns({k: f"COALESCE(r.{k}, 0)" for k in PIVOT}, "x.share", "(x.a_e - x.a_s)")
    cols.update(peak_fb_mib="r.peak_fb", idle_peak_fb_mib="r.idle_fb")  # usage_gpu's two maxima
    sel = ", ".join(f"{cols[c]} AS p_{c}, u.{c} AS a_{c}" for c in (*COMPARED, *_MAXIMA))
    rows = conn.execute(text(f"SELECT x.agid, u.reserved_s, x.share * (x.a_e - x.a_s) AS p_reserved, {sel} "
                             "FROM _att x JOIN usage_gpu u ON u.run_id = :run AND u.allocated_gpu_id = x.agid "
                             "LEFT JOIN _jr r ON r.agid = x.agid"), {"run": run_id}).mappings().all()
    worst, bad, example = 0.0, 0, None
    for r in rows:
        for c in ("reserved", *COMPARED, *_MAXIMA):
            p, a = r[f"p_{c}"] or 0.0, (r["reserved_s"] if c == "reserved" else r[f"a_{c}"]) or 0.0
            err = abs(p - a) / max(1.0, abs(a))
            worst = max(worst, err)
            if not math.isclose(p, a, rel_tol=1e-9, abs_tol=1e-6):
                bad += 1
                example = example or {"allocated_gpu_id": r["agid"], "column": c, "prototype": p, "audit": a}
    return {"compared_gpus": len(rows), "compared_values": len(rows) * (len(COMPARED) + len(_MAXIMA) + 1),
            "mismatches": bad,
            "max_rel_diff": worst, "first_mismatch": example}


def measure(url: str, gpus: int, days: float, seed: int) -> dict[str, Any]:
    from auditor.audit.run import run_audit
    from auditor.config import Config
    from auditor.simulate import FleetSpec
    from auditor.store.engine import Store
    from auditor.timeutil import to_epoch

    spec = FleetSpec(gpus=gpus, days=days, seed=seed)
    store = Store.open(url)
    cfg = Config()
    th = cfg.thresholds
    floor, rows = floor_seconds(store)
    judge = _time_judge()
    t = time.perf_counter()
    result = run_audit(store, cfg, spec.start, spec.end)
    audit_s = time.perf_counter() - t
    floor = min(floor, floor_seconds(store)[0])
    since, until = to_epoch(spec.start), to_epoch(spec.end)
    assert since is not None and until is not None
    out: dict[str, Any] = {"gpus": gpus, "rows": rows, "floor_s": floor, "audit_s": audit_s,
                           "engine": store.engine.dialect.name, "audit_judge_s": judge[0]}
    store.engine.dispose()  # a fresh session: temp_buffers can only be set before its first temporary table
    try:
        with store.begin() as conn:
            if conn.dialect.name == "postgresql":
                # the rollup is a temporary table here (a store would keep it as a table in shared buffers):
                # with the default 8 MB of temp_buffers its reads went to disk, and the grouping spilled
                conn.execute(text("SET temp_buffers = '1GB'"))
                conn.execute(text("SET LOCAL jit = off"))
                conn.execute(text("SET LOCAL work_mem = '256MB'"))
            out["plain_gpus"] = _att(conn, result.run_id, since, min(until, int(time.time())))  # the audit's horizon
            out["allocated_gpus"] = conn.execute(text("SELECT COUNT(*) FROM usage_gpu WHERE run_id = :r"),
                                                 {"r": result.run_id}).scalar()
            out["crossing_hour_rows"] = conn.execute(text(
                f"SELECT COUNT(*) FROM gpu_buckets WHERE bucket_ts % {H} + bucket_s > {H}")).scalar()
            out["infra_s"] = conn.execute(text("SELECT COALESCE(SUM(infra_s), 0) FROM usage_gpu WHERE run_id = :r"),
                                          {"r": result.run_id}).scalar()
            t = time.perf_counter()
            conn.execute(text(build_sql(conn.dialect.name, th)))
            conn.execute(text("CREATE INDEX _jh_key ON _jh (gpu_id, h)"))
            if conn.dialect.name == "postgresql":
                conn.execute(text("ANALYZE _jh"))
                conn.execute(text("ANALYZE _att"))
            out["rollup_build_s"] = time.perf_counter() - t
            out["rollup_rows"] = conn.execute(text("SELECT COUNT(*) FROM _jh")).scalar()
            t = time.perf_counter()
            conn.execute(text(judge_sql(conn.dialect.name, th)))
            out["rollup_judge_s"] = time.perf_counter() - t
            out.update(compare(conn, result.run_id))
            conn.rollback()
    finally:
        with store.begin() as conn:  # leave the cached store as generated (bench.audit does the same)
            for table in ("findings", "usage_gpu", "usage_allocation"):
                conn.execute(text(f"DELETE FROM {table} WHERE run_id = :r"), {"r": result.run_id})
            conn.execute(text("DELETE FROM audit_runs WHERE id = :r"), {"r": result.run_id})
        store.engine.dispose()
    out["equal"] = out["mismatches"] == 0 and not out["crossing_hour_rows"] and not out["infra_s"]
    out["audit_judge_floor"] = out["audit_judge_s"] / floor
    out["rollup_judge_floor"] = out["rollup_judge_s"] / floor
    out["rollup_build_floor"] = out["rollup_build_s"] / floor
    out["audit_less_judge_floor"] = (audit_s - out["audit_judge_s"]) / floor
    return out


def main(argv: list[str] | None = None) -> None:
    args = fleet_parser(__doc__.splitlines()[0]).parse_args(argv)
    print(json.dumps(measure(args.url, args.gpus, args.days, args.seed)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
