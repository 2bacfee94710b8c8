"""PostgreSQL's COPY + set-based merge of telemetry buckets leaves exactly the tables the row-at-a-time
upsert leaves (service test: real PostgreSQL)."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from auditor.records import METRIC_FIELDS, GpuBucket
from auditor.simulate import FleetSpec, fleet_records
from auditor.store import ingest
from auditor.store.engine import Store
from auditor.store.ingest_pg import rounds
from tests.conftest import pg_schema

T0 = datetime(2026, 3, 2, tzinfo=UTC)


def _variants(buckets: list[GpuBucket], seed: int) -> list[GpuBucket]:
    """Second sightings of some keys: other sample counts (fewer, equal, more), some metrics missing, spans,
    so every branch of the field-by-field rule is taken, and keys repeated inside one batch."""
    rng = random.Random(seed)
    out = []
    for b in rng.sample(buckets, len(buckets) // 3):
        kw = {f: (None if rng.random() < 0.3 else rng.random()) for f in METRIC_FIELDS}
        samples = max(0, b.samples + rng.choice((-3, 0, 0, 4)))
        span = T0 if rng.random() < 0.5 else None
        out.append(replace(b, samples=samples, **kw, observed_s=float(rng.randint(0, b.seconds)),
                           span_start=b.start + timedelta(seconds=30) if span else None,
                           span_end=b.start + timedelta(seconds=200) if span else None))
    return out


def _load(url: str, batches: list[list[GpuBucket]], copy_min: int, monkeypatch: pytest.MonkeyPatch) -> list:
    monkeypatch.setattr(ingest, "COPY_MIN_ROWS", copy_min)
    store = Store.open(url, batch_rows=10_000)
    store.upgrade()
    for i, batch in enumerate(batches):
        store.ingest(batch, seen_at_ts=1_800_000_000 + i)
    with store.engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT t.cluster, t.host, t.gpu_index, t.gpu_instance, t.has_jobs, b.* FROM gpu_buckets b "
            "JOIN telemetry_gpus t ON t.id = b.gpu_id ORDER BY t.cluster, t.host, t.gpu_index, t.gpu_instance, "
            "b.bucket_ts, b.job")).all()
    store.engine.dispose()
    return [tuple(r[:5]) + tuple(r[6:]) for r in rows]  # all columns but the surrogate gpu_id


def test_copy_path_equals_executemany_path(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    base = [r for r in fleet_records(FleetSpec(gpus=16, days=0.5, seed=3)) if isinstance(r, GpuBucket)]
    again, third = _variants(base, 1), _variants(base, 2)
    # batch 1: everything; batch 2: variants + the same variants' keys again within the batch; batch 3: base
    batches = [base, again + third, base[: len(base) // 2]]
    assert len(rounds([(b.host, b.gpu, b.start) for b in again + third])) >= 2  # repeats inside a batch
    with pg_schema(pg_url) as a, pg_schema(pg_url) as b:
        old = _load(a, batches, 10**9, monkeypatch)
        new = _load(b, batches, 1, monkeypatch)
    assert len(old) == len(base)
    assert old == new


def _b(samples: int, **kw: object) -> GpuBucket:
    return GpuBucket(cluster="c", host="n1", gpu=0, start=T0, seconds=300, samples=samples, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("copy_min", [1, 10**9], ids=["copy", "executemany"])
def test_same_key_merge_by_hand(pg_schema_url: str, copy_min: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ingest, "COPY_MIN_ROWS", copy_min)
    store = Store.open(pg_schema_url)
    store.upgrade()
    # stored: 10 samples, gpu_util 0.5, no sm_active, power 100
    store.ingest([_b(10, gpu_util=0.5, power_w=100.0, observed_s=250.0)], seen_at_ts=1)
    # one batch, same key twice, in order:
    #  r1 (5 samples): sm_active 0.2, gpu_util 0.9, power 300 -> sm_active fills the hole (0.2); gpu_util and
    #     power stay (5 < 10 stored samples); samples max(10, 5) = 10; observed max(250, 300) = 300
    #  r2 (7 samples): sm_active 0.3 -> 7 < 10 samples so far: keeps 0.2 (a per-field "most samples wins"
    #     over the batch would give 0.3: the rounds keep the sequential rule)
    r1 = _b(5, sm_active=0.2, gpu_util=0.9, power_w=300.0)
    r2 = _b(7, sm_active=0.3, span_start=T0 + timedelta(seconds=60), span_end=T0 + timedelta(seconds=120))
    store.ingest([r1, r2], seen_at_ts=2)
    # then 12 samples: more than stored, so its non-null fields win (gpu_util 0.1, span 30..90), its null
    # power keeps 100, samples 12, observed max(300, 60) = 300
    r3 = _b(12, gpu_util=0.1, observed_s=60.0, span_start=T0 + timedelta(seconds=30),
            span_end=T0 + timedelta(seconds=90))
    store.ingest([r3], seen_at_ts=3)
    with store.engine.connect() as conn:
        row = conn.execute(text("SELECT samples, observed_s, gpu_util, sm_active, power_w, span_start, span_end, "
                                "bucket_s, job FROM gpu_buckets")).one()
    store.engine.dispose()
    t0 = int(T0.timestamp())
    assert tuple(row) == (12, 300.0, 0.1, 0.2, 100.0, t0 + 30, t0 + 90, 300, "")


def test_pg_ingest_bench_smoke(pg_url: str) -> None:
    """The side-by-side benchmark runs and counts every bucket (figures checked for presence, not speed)."""
    from bench import pg_ingest

    r = pg_ingest.measure(pg_url, gpus=8, days=0.25)
    assert r["rows"] == 8 * 72  # 8 GPUs x 6 h / 5 min
    for k in ("copy_rows_s", "executemany_rows_s", "raw_copy_rows_s", "merge_only_rows_s", "build_rows_s"):
        assert r[k] > 0
    assert "raw COPY" in pg_ingest.report(r)


@pytest.mark.parametrize("copy_min", [1, 10**9], ids=["copy", "executemany"])
def test_out_of_range_integer_is_refused_not_wrapped(pg_schema_url: str, copy_min: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Binary COPY would store an int4 from the low 32 bits of a Python int: a bucket starting after 2038
    (bucket_ts > 2**31 - 1) must be refused by PostgreSQL like the upsert refuses it, and the good bucket
    of the same batch kept."""
    monkeypatch.setattr(ingest, "COPY_MIN_ROWS", copy_min)
    store = Store.open(pg_schema_url)
    store.upgrade()
    bad = replace(_b(10, sm_active=0.5), start=datetime(2040, 1, 1, tzinfo=UTC))
    refused: list[str] = []
    stats = store.ingest([_b(10, sm_active=0.5), bad], seen_at_ts=1, on_bad=lambda r, why: refused.append(why))
    with store.engine.connect() as conn:
        stored = conn.execute(text("SELECT bucket_ts FROM gpu_buckets")).scalars().all()
    store.engine.dispose()
    assert stored == [int(T0.timestamp())] and stats.buckets == 1
    assert len(refused) == 1 and "out of range" in refused[0]


def test_new_rows_with_a_key_twice_fall_back_to_the_merge(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows of GPUs with nothing stored go straight into gpu_buckets by COPY; a key twice among them makes
    that COPY fail, its savepoint is rolled back and the batch merges in rounds: the same tables again."""
    base = [r for r in fleet_records(FleetSpec(gpus=8, days=0.25, seed=5)) if isinstance(r, GpuBucket)]
    batches = [base + _variants(base, 3)]  # one batch, fresh store: every GPU new, some keys twice
    with pg_schema(pg_url) as a, pg_schema(pg_url) as b:
        old = _load(a, batches, 10**9, monkeypatch)
        new = _load(b, batches, 1, monkeypatch)
    assert len(old) == len(base)
    assert old == new


def test_batch_of_new_and_stored_gpus(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch whose GPUs are half new (their rows stream straight into gpu_buckets) and half already stored
    in its time range, with keys twice among those (merged in rounds): the same tables again."""
    base = [r for r in fleet_records(FleetSpec(gpus=16, days=0.25, seed=9)) if isinstance(r, GpuBucket)]
    hosts = sorted({b.host for b in base})
    first = [b for b in base if b.host == hosts[0]]
    assert first and len(first) < len(base)
    batches = [first, base + _variants(first, 4)]
    with pg_schema(pg_url) as a, pg_schema(pg_url) as b:
        old = _load(a, batches, 10**9, monkeypatch)
        new = _load(b, batches, 1, monkeypatch)
    assert len(old) == len(base)
    assert old == new


def test_copy_dicts_binary_stores_what_text_copy_and_insert_store(pg_schema_url: str) -> None:
    """Audit output written by binary COPY (copy_dicts) equals the same rows written by text COPY and by an
    INSERT: None, JSON with quotes and non-ASCII text, floats, Decimals; a float in an integer column and
    an integer past int4 take text COPY, where PostgreSQL refuses them as an INSERT would."""
    from decimal import Decimal

    from sqlalchemy import insert

    from auditor.store import ingest_pg, schema

    store = Store.open(pg_schema_url)
    store.upgrade()
    with store.begin() as conn:
        run = conn.execute(insert(schema.audit_runs).values(started_ts=1, since_ts=0, until_ts=1, status="ok",
                                                            what_if=False)).inserted_primary_key[0]
    ev = {"rule": 'idle "92 %" – GPU 0', "sparkline": {"sm": [None, 0.5]}, "n": [1, 2.5]}
    rows = [{"run_id": run, "kind": "idle_allocation", "cluster": "c1", "allocation_id": None, "account": "",
             "user_name": "zoë", "team": "t", "start_ts": 1_700_000_000, "end_ts": 1_700_003_600,
             "gpu_hours": 1.25, "idle_gpu_hours": Decimal("0.5"), "cost": 0.1 + 0.2, "evidence": ev},
            {"run_id": run, "kind": "lemon_node", "cluster": "c1", "allocation_id": None, "account": "a,b",
             "user_name": "", "team": "", "start_ts": 0, "end_ts": None, "gpu_hours": 0.0,
             "idle_gpu_hours": 0.0, "cost": -0.0, "evidence": {}}]

    def stored(kind_prefix: str) -> list[tuple]:
        with store.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(
                "SELECT kind, cluster, allocation_id, account, user_name, team, start_ts, end_ts, gpu_hours, "
                "idle_gpu_hours, cost, CAST(evidence AS TEXT) FROM findings WHERE cluster = :c ORDER BY id"),
                {"c": kind_prefix})]

    with store.begin() as conn:
        ingest_pg.copy_dicts(conn, schema.findings, rows)
    binary = stored("c1")
    with store.begin() as conn:
        conn.execute(text("DELETE FROM findings"))
        saved = dict(ingest_pg._BINARY)
        ingest_pg._BINARY.clear()  # no binary format: text COPY
        try:
            ingest_pg.copy_dicts(conn, schema.findings, rows)
        finally:
            ingest_pg._BINARY.update(saved)
    assert stored("c1") == binary
    assert binary[0][8:11] == (1.25, 0.5, 0.1 + 0.2) and binary[1][2:4] == (None, "a,b")
    assert binary[1][7] is None
    assert json.loads(binary[0][11]) == ev
    for bad in ({"start_ts": 1.5}, {"end_ts": 2 ** 31}):  # refused by PostgreSQL, not truncated or wrapped
        with pytest.raises(Exception, match="integer|out of range"), store.begin() as conn:
            ingest_pg.copy_dicts(conn, schema.findings, [{**rows[1], **bad}])
    store.engine.dispose()
