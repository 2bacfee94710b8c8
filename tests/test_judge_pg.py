"""PostgreSQL judges each allocated GPU in a LATERAL subquery over its own buckets (no sort of every joined
bucket): the usage it writes equals the grouped reference statement's, row by row (service test)."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import text

from auditor.audit import run as audit
from auditor.config import Config, Thresholds
from auditor.simulate import FleetSpec, populate
from auditor.store.engine import Store

SPEC = FleetSpec(gpus=64, days=1, seed=15)


def _usage(store: Store, run_id: int) -> list[tuple]:
    with store.engine.connect() as conn:
        return [tuple(r)[1:] for r in conn.execute(text(
            "SELECT * FROM usage_gpu WHERE run_id = :r ORDER BY allocated_gpu_id"), {"r": run_id})]


def _same(x: tuple, y: tuple) -> bool:
    return all(u == v or (isinstance(u, float) and isinstance(v, float)
                          and math.isclose(u, v, rel_tol=1e-12, abs_tol=1e-9)) for u, v in zip(x, y, strict=True))


def test_lateral_judge_equals_the_grouped_reference(pg_schema_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store.open(pg_schema_url)
    store.upgrade()
    populate(store, SPEC)
    assert "LATERAL" in audit.judge_sql("postgresql", Thresholds())
    for th in (Thresholds(), Thresholds(util_fallback=False), Thresholds(working_sm=0.03, idle_power_w=100.0)):
        fast = audit.run_audit(store, Config(), SPEC.start, SPEC.end, thresholds=th)
        with monkeypatch.context() as m:
            m.setattr(audit, "judge", lambda conn, fn, params, th: conn.execute(
                text(audit.judge_sql("postgresql", th, lateral=False)), params))
            ref = audit.run_audit(store, Config(), SPEC.start, SPEC.end, thresholds=th)
        a, b = _usage(store, fast.run_id), _usage(store, ref.run_id)
        assert len(a) == len(b) > 50
        assert [x for x, y in zip(a, b, strict=True) if not _same(x, y)] == []
        assert sum(r[8] for r in a) > 0  # some idle seconds were judged (not an all-empty comparison)
    store.engine.dispose()


def test_sparklines_equal_a_python_reading_of_the_rows(store_url: str) -> None:
    """The sparkline bins (PostgreSQL reads each GPU's range by a LATERAL index scan): mean SM activity and
    GPU-Util of the sampled rows (unlabelled, or labelled with the job) in 48 equal bins of the allocation's
    clipped interval, recomputed here in Python from the raw rows."""
    from auditor.audit.findings import SPARK_BINS, sparklines

    store = Store.open(store_url)
    store.upgrade()
    populate(store, SPEC)
    s, h = int(SPEC.start.timestamp()), int(SPEC.end.timestamp())
    run = audit.run_audit(store, Config(), SPEC.start, SPEC.end)
    with store.engine.connect() as conn:
        ids = [r[0] for r in conn.execute(text(
            "SELECT DISTINCT allocation_id FROM usage_gpu WHERE run_id = :r AND gpu_id IS NOT NULL "
            "ORDER BY 1 LIMIT 40"), {"r": run.run_id})]
        got = sparklines(conn, run.run_id, ids, s, h)
        rows = conn.execute(text(
            "SELECT u.allocation_id, a.start_ts, a.end_ts, a.source, a.external_id, a.account, a.name, b.bucket_ts, "
            "b.job, b.sm_active, b.gpu_util FROM usage_gpu u JOIN allocations a ON a.id = u.allocation_id "
            "JOIN gpu_buckets b ON b.gpu_id = u.gpu_id WHERE u.run_id = :r AND b.samples > 0"),
            {"r": run.run_id}).all()
    sums: dict[tuple[int, int], list[list[float]]] = {}
    for aid, st, en, src, ext, acc, name, ts, jb, sm, util in rows:
        s0, e0 = max(st, s), min(en if en is not None else h, h)
        key = ext if src == "slurm" else f"{acc}/{name}"
        if aid not in ids or not (s0 <= ts < e0) or e0 <= s0 or jb not in ("", key):
            continue
        acc_ = sums.setdefault((aid, (ts - s0) * SPARK_BINS // (e0 - s0)), [[], []])
        for i, v in enumerate((sm, util)):
            if v is not None:
                acc_[i].append(v)
    assert len(got) >= 20
    checked = 0
    for aid, bins in got.items():
        for k in range(SPARK_BINS):
            want = sums.get((aid, k))
            for i, name in enumerate(("sm", "util")):
                exp = round(sum(want[i]) / len(want[i]), 3) if want and want[i] else None
                assert bins[name][k] == (pytest.approx(exp, abs=1.5e-3) if exp is not None else None), (aid, k, name)
                checked += exp is not None
    assert checked > 500
    store.engine.dispose()
