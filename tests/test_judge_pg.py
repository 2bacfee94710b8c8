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
