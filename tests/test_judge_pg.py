"""The one judging form on both engines (PostgreSQL reads each allocated GPU's edges and whole hours in LATERAL
subqueries, SQLite in grouped joins): the same fleet writes the same usage on both; sparklines against a
plain Python reading of the rows; judging in several PostgreSQL connections (service tests)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from sqlalchemy import text

from auditor.audit import run as audit
from auditor.audit.judging import Judging
from auditor.config import Config, Thresholds
from auditor.simulate import FleetSpec, populate
from auditor.store.engine import Store

SPEC = FleetSpec(gpus=64, days=1, seed=15)
#: seed 7 draws a block of Kubernetes pods (357 of 674 allocated GPUs count-only, attributed by labels)
LABELLED = FleetSpec(gpus=128, days=1, seed=7)


def _usage(store: Store, run_id: int) -> list[tuple]:
    with store.engine.connect() as conn:
        return [tuple(r)[1:] for r in conn.execute(text(
            "SELECT * FROM usage_gpu WHERE run_id = :r ORDER BY allocated_gpu_id"), {"r": run_id})]


def _same(x: Any, y: Any) -> bool:
    """Equal, floats to 1e-12 (sums in another order), JSON text compared as the values it holds."""
    if isinstance(x, str) and isinstance(y, str) and x[:1] == "{" and y[:1] == "{":
        return _same(json.loads(x), json.loads(y))
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    if isinstance(x, list | tuple) and isinstance(y, list | tuple):
        return len(x) == len(y) and all(_same(u, v) for u, v in zip(x, y, strict=True))
    if isinstance(x, float) and isinstance(y, float):
        return math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-9)
    return x == y


def test_both_engines_judge_alike(pg_schema_url: str, tmp_path: Any) -> None:
    """One simulated fleet in PostgreSQL and in SQLite: the same usage rows (allocated GPU by allocated GPU;
    ids are the same, both stores are written from the same records in order), under three threshold sets,
    through the judged aggregate and with every bucket judged afresh."""
    stores = [Store.open(pg_schema_url), Store.open(f"sqlite:///{tmp_path}/x.db")]
    for store in stores:
        store.upgrade()
        populate(store, SPEC)
    for th in (Thresholds(), Thresholds(util_fallback=False), Thresholds(working_sm=0.03, idle_power_w=100.0)):
        for whole in (True, False):
            rows = []
            for store in stores:
                rows.append(_usage(store, audit.run_audit(store, Config(), SPEC.start, SPEC.end, thresholds=th,
                                                          judging=Judging(whole_hours=whole)).run_id))
            a, b = rows
            assert len(a) == len(b) > 50
            assert [x for x, y in zip(a, b, strict=True) if not _same(x, y)] == []
            assert sum(r[8] for r in a) > 0  # some idle seconds were judged (not an all-empty comparison)
    for store in stores:
        store.engine.dispose()


def _python_bins(conn: Any, run_id: int, ids: list[int], s: int, h: int) -> dict[int, dict[str, Any]]:
    """allocation -> its sparkline read from the raw rows in Python (docs/definitions.md "Sparklines"): the
    clock hours of its clipped interval in at most 48 bins of k hours; per bin SM activity and GPU-Util
    weighted by share x observed seconds inside the interval, over the applicable rows (the job's rows where
    the bucket has labelled rows, else the unlabelled one). The simulated fleet has whole buckets without
    spans, no infrastructure events and no comma-joined labels."""
    from auditor.audit.sparklines import SPARK_BINS

    rows = conn.execute(text(
        "SELECT u.allocation_id, ag.share, a.start_ts, a.end_ts, a.source, a.external_id, a.account, a.name, "
        "b.gpu_id, b.bucket_ts, b.bucket_s, b.observed_s, b.job, b.sm_active, b.gpu_util FROM usage_gpu u "
        "JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id JOIN allocations a ON a.id = u.allocation_id "
        "JOIN gpu_buckets b ON b.gpu_id = u.gpu_id WHERE u.run_id = :r"), {"r": run_id}).all()
    labelled = {(r.gpu_id, r.bucket_ts) for r in rows if r.job}
    sums: dict[int, dict[int, list[float]]] = {}
    window: dict[int, tuple[int, int]] = {}
    for r in rows:
        s0, e0 = max(r.start_ts, s), min(r.end_ts if r.end_ts is not None else h, h)
        key = r.external_id if r.source == "slurm" else f"{r.account}/{r.name}"
        if r.allocation_id not in ids or e0 <= s0:
            continue
        window[r.allocation_id] = (s0, e0)
        if r.job != (key if (r.gpu_id, r.bucket_ts) in labelled else ""):
            continue
        obs = min(max(0, min(r.bucket_ts + r.bucket_s, e0) - max(r.bucket_ts, s0)), r.observed_s)
        if obs <= 0:
            continue
        acc = sums.setdefault(r.allocation_id, {}).setdefault(r.bucket_ts // 3600, [0.0, 0.0, 0.0, 0.0])
        for i, v in enumerate((r.sm_active, r.gpu_util)):
            if v is not None:
                acc[2 * i] += r.share * obs * v
                acc[2 * i + 1] += r.share * obs
    out = {}
    for aid, (s0, e0) in window.items():
        h0, n = s0 // 3600, (e0 - 1) // 3600 - s0 // 3600 + 1
        k = -(-n // SPARK_BINS)
        bins = [[0.0, 0.0, 0.0, 0.0] for _ in range(-(-n // k))]
        for hour, v in sums.get(aid, {}).items():
            b = bins[max(0, (hour - h0) // k)]
            for i in range(4):
                b[i] += v[i]
        sm = [b[0] / b[1] if b[1] else None for b in bins]
        util = [b[2] / b[3] if b[3] else None for b in bins]
        if any(x is not None for x in sm + util):
            out[aid] = {"sm": sm, "util": util, "bin_hours": k}
    return out


def test_sparklines_equal_a_python_reading_of_the_rows(store_url: str) -> None:
    """The sparklines of 40 allocations (whole hours from the judged aggregate, edges from the buckets) equal
    a Python reading of the raw rows (:func:`_python_bins`), bin for bin to the 3 decimals the store writes."""
    from auditor.audit.sparklines import sparkline_texts

    store = Store.open(store_url)
    store.upgrade()
    populate(store, SPEC)
    s, h = int(SPEC.start.timestamp()), int(SPEC.end.timestamp())
    run = audit.run_audit(store, Config(), SPEC.start, SPEC.end)
    with store.engine.connect() as conn:
        ids = [r[0] for r in conn.execute(text(
            "SELECT DISTINCT allocation_id FROM usage_gpu WHERE run_id = :r AND gpu_id IS NOT NULL "
            "ORDER BY 1 LIMIT 40"), {"r": run.run_id})]
        got = {aid: json.loads(t) for aid, t in sparkline_texts(conn, run.run_id, ids, s, h).items()}
        want = _python_bins(conn, run.run_id, ids, s, h)
        whole = conn.execute(text("SELECT COUNT(*) FROM judged_hours")).scalar()
    assert len(got) >= 20 and whole > 0
    assert got.keys() == want.keys()
    checked = 0
    for aid, spark in got.items():
        assert spark["bin_hours"] == want[aid]["bin_hours"] and len(spark["sm"]) == len(want[aid]["sm"]), aid
        for name in ("sm", "util"):
            for k, (x, y) in enumerate(zip(spark[name], want[aid][name], strict=True)):
                assert x == (pytest.approx(y, abs=5.01e-4) if y is not None else None), (aid, k, name)
                checked += y is not None
    assert checked > 100
    store.engine.dispose()


def test_an_allocation_without_sampled_rows_gets_no_sparkline(store_url: str) -> None:
    """Exactly the allocations with an observed reading in their interval get a sparkline (an all-empty one
    would put a blank chart in the evidence): the telemetry GPU of some single-GPU allocations is made to have
    no observed seconds, and the allocations given a sparkline are those the Python reading finds rows for."""
    from auditor.audit.sparklines import sparkline_texts

    store = Store.open(store_url)
    store.upgrade()
    populate(store, SPEC)
    s, h = int(SPEC.start.timestamp()), int(SPEC.end.timestamp())
    with store.begin() as conn:  # the GPUs of the first five one-GPU allocations: rows, but nothing observed
        gpus = [r[0] for r in conn.execute(text(
            "SELECT tg.id FROM allocations a JOIN allocated_gpus ag ON ag.allocation_id = a.id "
            "JOIN telemetry_gpus tg ON tg.host = ag.node AND tg.gpu_index = ag.gpu_index "
            "WHERE a.gpu_count = 1 ORDER BY a.id LIMIT 5"))]
        assert len(gpus) == 5
        conn.execute(text(f"UPDATE gpu_buckets SET samples = 0, observed_s = 0 WHERE gpu_id IN "
                          f"({', '.join(map(str, gpus))})"))
    run = audit.run_audit(store, Config(), SPEC.start, SPEC.end)
    with store.engine.connect() as conn:
        ids = [r[0] for r in conn.execute(text(
            "SELECT DISTINCT allocation_id FROM usage_gpu WHERE run_id = :r ORDER BY 1"), {"r": run.run_id})]
        got = {aid: json.loads(t) for aid, t in sparkline_texts(conn, run.run_id, ids, s, h).items()}
        with_rows = set(_python_bins(conn, run.run_id, ids, s, h))
    assert set(got) == with_rows
    assert len(with_rows) >= 20 and len(set(ids) - with_rows) >= 1  # both kinds are among them
    store.engine.dispose()


def _findings(store: Store, run_id: int) -> list[tuple]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            "SELECT kind, allocation_id, gpu_hours, idle_gpu_hours, CAST(evidence AS TEXT) FROM findings "
            "WHERE run_id = :r "
            "ORDER BY kind, allocation_id, gpu_hours"), {"r": run_id})]


#: three clusters of one block each; seed 7's first block is Kubernetes pods (count-only GPUs, by labels)
CLUSTERS = FleetSpec(gpus=192, days=1, seed=7, clusters=3)


def _summary_same(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The keys of two run summaries that differ (floats to 1e-12: per-process sums add in another order)."""
    return [k for k in a.keys() | b.keys() if not _same(a.get(k), b.get(k))]


def test_per_cluster_processes_equal_one_process(pg_schema_url: str) -> None:
    """store.audit_processes = 3 on three clusters: each cluster attributed, judged and turned into usage and
    findings in its own process; usage and findings (evidence, sparklines included, as stored text) equal the
    one-process audit's row by row, attribution by telemetry labels among them, and so does every part of the
    run summary (merged from the processes' parts)."""
    store = Store.open(pg_schema_url)
    store.upgrade()
    populate(store, CLUSTERS)
    one = audit.run_audit(store, Config(), CLUSTERS.start, CLUSTERS.end)
    three = audit.run_audit(store, Config(store={"audit_processes": 3}), CLUSTERS.start, CLUSTERS.end)
    assert (one.processes, three.processes) == (1, 3)
    assert sorted(c for w in three.workers for c in w["clusters"]) == ["sim-00", "sim-01", "sim-02"]
    assert all(w["peak_rss_mib"] > 0 and w["cpu_s"] > 0 for w in three.workers)
    walls = {"clusters: judging wall (3 processes)", "clusters: totals and findings wall (3 processes)"}
    assert walls <= set(three.steps)
    a, b = _usage(store, one.run_id), _usage(store, three.run_id)
    assert len(a) == len(b) > 50
    assert [x for x, y in zip(a, b, strict=True) if not _same(x, y)] == []
    with store.engine.connect() as conn:
        kinds = {r[0] for r in conn.execute(text("SELECT DISTINCT attribution FROM usage_gpu WHERE run_id = :r"),
                                            {"r": three.run_id})}
        ua = [conn.execute(text("SELECT * FROM usage_allocation WHERE run_id = :r ORDER BY allocation_id"),
                           {"r": r}).all() for r in (one.run_id, three.run_id)]
    assert kinds >= {"index", "label"}
    assert len(ua[0]) == len(ua[1]) > 20 and all(_same(tuple(x)[1:], tuple(y)[1:]) for x, y in zip(*ua, strict=True))
    fa, fb = _findings(store, one.run_id), _findings(store, three.run_id)
    assert len(fa) == len(fb) > 0
    assert [x for x, y in zip(fa, fb, strict=True) if not _same(x, y)] == []
    assert sum('"sparkline"' in f[4] for f in fb) > 10
    assert _summary_same(one.summary, three.summary) == []
    assert len(one.summary["verification_by_cluster"]) == 3
    store.engine.dispose()


def test_a_failed_process_fails_the_run_and_leaves_no_rows(pg_schema_url: str) -> None:
    """The process of one cluster fails while writing its findings (a trigger refuses them), after every
    process committed its usage and the others their findings: the run is marked failed, the error names the
    cluster, and no usage, total or finding of the run or of its parts stays behind (a report never reads a
    partial total)."""
    from auditor.errors import GpuAuditError

    store = Store.open(pg_schema_url)
    store.upgrade()
    populate(store, CLUSTERS)
    with store.begin() as conn:
        conn.execute(text("CREATE FUNCTION refuse_sim01() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                          "IF NEW.cluster = 'sim-01' THEN RAISE EXCEPTION 'sim-01 lost its disk'; END IF; "
                          "RETURN NEW; END $$"))
        conn.execute(text("CREATE TRIGGER refuse_sim01 BEFORE INSERT ON findings FOR EACH ROW "
                          "EXECUTE FUNCTION refuse_sim01()"))
    with pytest.raises(GpuAuditError, match="sim-01.*lost its disk"):
        audit.run_audit(store, Config(store={"audit_processes": 3}), CLUSTERS.start, CLUSTERS.end)
    with store.engine.connect() as conn:
        runs = conn.execute(text("SELECT id, status FROM audit_runs ORDER BY id")).all()
        left = [conn.execute(text(f"SELECT COUNT(*) FROM {t}")).scalar()
                for t in ("usage_gpu", "usage_allocation", "findings")]
    assert [st for _id, st in runs] == ["failed"]  # the processes' part runs are gone too
    assert left == [0, 0, 0]
    store.engine.dispose()


def test_sqlite_and_one_cluster_audit_in_one_process(store_url: str) -> None:
    """store.audit_processes above 1 splits only what can be split: SQLite (one writer at a time) and a
    fleet of one cluster audit in the audit's own process, with the figures of store.audit_processes = 1."""
    store = Store.open(store_url)
    store.upgrade()
    populate(store, SPEC)  # one cluster
    one = audit.run_audit(store, Config(), SPEC.start, SPEC.end)
    four = audit.run_audit(store, Config(store={"audit_processes": 4}), SPEC.start, SPEC.end)
    assert (one.processes, four.processes, four.workers) == (1, 1, [])
    assert _usage(store, one.run_id) == _usage(store, four.run_id)
    store.engine.dispose()


def test_a_run_abandoned_a_day_ago_is_swept(store_url: str) -> None:
    """A killed audit leaves its run "running" and the usage rows its per-cluster processes committed; the
    next audit a day later marks it failed and deletes those rows (a run started an hour ago is left alone:
    it may still be judging). Both engines."""
    from sqlalchemy import insert

    from auditor.store import schema
    from auditor.timeutil import utcnow

    store = Store.open(store_url)
    store.upgrade()
    populate(store, SPEC)
    now = int(utcnow().timestamp())
    with store.begin() as conn:
        old, recent = (conn.execute(insert(schema.audit_runs).values(
            started_ts=now - age, since_ts=0, until_ts=1, status="running", what_if=False)).inserted_primary_key[0]
            for age in (audit.ABANDONED_S + 60, 3600))
        gid, aid = conn.execute(text("SELECT id, allocation_id FROM allocated_gpus LIMIT 1")).one()
        for run in (old, recent):
            conn.execute(insert(schema.usage_gpu).values(run_id=run, allocated_gpu_id=gid, allocation_id=aid,
                                                         attribution="index", reserved_s=60.0))
    audit.run_audit(store, Config(), SPEC.start, SPEC.end)
    with store.engine.connect() as conn:
        status = dict(conn.execute(text("SELECT id, status FROM audit_runs WHERE id IN (:a, :b)"),
                                   {"a": old, "b": recent}).all())
        left = dict(conn.execute(text("SELECT run_id, COUNT(*) FROM usage_gpu WHERE run_id IN (:a, :b) "
                                      "GROUP BY run_id"), {"a": old, "b": recent}).all())
    assert status == {old: "failed", recent: "running"}
    assert left == {recent: 1}
    store.engine.dispose()


def test_attribution_never_asks_not_in_of_a_subquery() -> None:
    """"Not yet attributed" must be an anti-join: PostgreSQL runs ``x NOT IN (SELECT ...)`` as a hashed
    subplan only while the hash fits in work_mem, else it scans the subquery once per row; at 16,384 GPUs with
    the default 4 MB the label candidates took 734 s that way, 2.1 s as NOT EXISTS (bench/HISTORY.md).
    A plan test would need a store big enough to spill, so the statements themselves are checked."""
    import re

    from auditor.audit import attribute

    sqls = {"pairs": attribute._LABEL_PAIRS, "unresolved": attribute.UNRESOLVED, "rest": attribute.ATTR_REST,
            "candidates pg": attribute.label_candidates("postgresql"),
            "candidates sqlite": attribute.label_candidates("sqlite")}
    assert [k for k, s in sqls.items() if re.search(r"NOT\s+IN\s*\(\s*SELECT", s, re.I)] == []
    assert all("NOT EXISTS (SELECT 1 FROM _attr x" in s for s in sqls.values())


def test_a_long_job_and_a_mig_slice_by_hand(store_url: str) -> None:
    """Sparklines by hand (definitions "Sparklines"). Job "long" holds a whole GPU for 100 h from an hour's
    start; its SM activity is 0.1 x (hour mod 3): 100 clock hours need k = 3 hours per bin (3 x 48 >= 100 >
    2 x 48), so 34 bins; each full bin averages 0.0, 0.1, 0.2 = 0.1, the last holds hour 99 alone (99 mod 3 =
    0: 0.0). Job "mixed" holds a whole GPU (SM 0.8) and a 1/7 MIG slice (SM 0.1) for 1 h: weighted by share
    x observed seconds, (1 x 0.8 + 1/7 x 0.1) / (1 + 1/7) = 0.7125 (not the plain 0.45)."""
    from datetime import UTC, datetime, timedelta

    from auditor.audit.sparklines import sparkline_texts
    from auditor.records import AllocatedGpu, Allocation, GpuBucket

    t0 = datetime(2026, 11, 2, tzinfo=UTC)
    store = Store.open(store_url)
    store.upgrade()
    recs: list[Any] = [
        Allocation("c", "slurm", "long", user="u", account="a", start=t0, end=t0 + timedelta(hours=100),
                   gpus=[AllocatedGpu("n1", 0)]),
        Allocation("c", "slurm", "mixed", user="u", account="a", start=t0, end=t0 + timedelta(hours=1),
                   gpus=[AllocatedGpu("n2", 0), AllocatedGpu("n2", 1, share=1 / 7, mig_profile="1g.10gb")])]
    for i in range(100 * 12):
        ts = t0 + timedelta(minutes=5 * i)
        recs.append(GpuBucket("c", "n1", 0, ts, 300, 10, sm_active=0.1 * ((i // 12) % 3), gpu_util=0.9))
    for i in range(12):
        ts = t0 + timedelta(minutes=5 * i)
        recs += [GpuBucket("c", "n2", 0, ts, 300, 10, sm_active=0.8, gpu_util=1.0),
                 GpuBucket("c", "n2", 1, ts, 300, 10, sm_active=0.1, gpu_util=1.0)]
    store.ingest(recs)
    until = t0 + timedelta(hours=120)
    run = audit.run_audit(store, Config(), t0, until)
    with store.engine.connect() as conn:
        ids = {ext: aid for aid, ext in conn.execute(text("SELECT id, external_id FROM allocations"))}
        got = {aid: json.loads(t) for aid, t in sparkline_texts(conn, run.run_id, sorted(ids.values()),
                                                                 int(t0.timestamp()), int(until.timestamp())).items()}
    store.engine.dispose()
    long, mixed = got[ids["long"]], got[ids["mixed"]]
    assert long["bin_hours"] == 3 and len(long["sm"]) == 34
    assert long["sm"][:33] == [0.1] * 33 and long["sm"][33] == 0.0
    assert mixed["bin_hours"] == 1 and mixed["sm"] == [0.713]  # 0.7125 as the store writes 3 decimals
