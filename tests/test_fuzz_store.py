"""Property-based fuzzing of the store path on both engines (issue 15 part 2): whatever the records (NUL
characters, 600-character keys, integers beyond 32 bits, NaN and infinite shares, times from 1900 to 2100)
or the bytes of an input file, no exception escapes, every record is stored or quarantined, and SQLite and
PostgreSQL end up with exactly the same rows and the same quarantine."""

from __future__ import annotations

import itertools
import math
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from helpers import migrated_store
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from auditor import collect as collect_mod
from auditor import config as config_mod
from auditor.records import AllocatedGpu, Allocation, GpuBucket
from auditor.store import schema
from auditor.store.engine import Store
from connectors.base import Problems, Window

pytestmark = pytest.mark.service  # both engines side by side: PostgreSQL is the test database

FUZZ = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
T0 = datetime(2026, 11, 20, tzinfo=UTC)
_n = itertools.count()

TEXT = st.one_of(st.text(max_size=30), st.text(alphabet="a\x00\u2028é", max_size=30),
                 st.sampled_from(["x" * 300, "k" * 600, "\x00", ""]))
BIGINT = st.one_of(st.none(), st.integers(-(2**40), 2**40), st.sampled_from([2**31 - 1, 2**31, -(2**31) - 1]))
FLOAT = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.5, 1.0, 1e301]))
TIMES = st.one_of(st.none(), st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2100, 1, 1),
                                          timezones=st.just(UTC)))


@pytest.fixture(scope="module")
def stores() -> Iterator[tuple[Store, Store]]:
    with (tempfile.TemporaryDirectory() as tmp, migrated_store("postgresql", Path(tmp), "fuzz") as pg,
          migrated_store("sqlite", Path(tmp)) as lite):
        yield lite, pg


@st.composite
def allocation(draw: st.DrawFn, cluster: str) -> Allocation:
    gpus = [AllocatedGpu(draw(st.sampled_from(["n0", "n1"])), draw(BIGINT), share=draw(FLOAT))
            for _ in range(draw(st.integers(1, 2)))]
    return Allocation(cluster, "file", draw(TEXT) or "id", name=draw(TEXT), user=draw(TEXT), account=draw(TEXT),
                      start=draw(TIMES), end=draw(TIMES), time_limit_s=draw(BIGINT),
                      labels={draw(TEXT): draw(TEXT)}, gpus=gpus)


@st.composite
def bucket(draw: st.DrawFn, cluster: str) -> GpuBucket:
    return GpuBucket(cluster, draw(TEXT) or "h", draw(BIGINT) or 0, T0 + timedelta(minutes=5 * draw(st.integers(0, 3))),
                     300, draw(st.integers(0, 10)), sm_active=draw(FLOAT), pod=draw(TEXT))


def _ingest(store: Store, records: list) -> tuple[list, list]:
    problems = Problems()
    refused: list[str] = []
    store.ingest(collect_mod._guarded(iter(records), "fuzz", problems), seen_at_ts=int(T0.timestamp()),
                 on_bad=lambda rec, reason: refused.append(reason))
    return [(loc, reason) for _s, loc, reason, _e in problems.items], refused


def _rows(store: Store, cluster: str) -> tuple[list, list]:
    a, g, b, tg = schema.allocations, schema.allocated_gpus, schema.gpu_buckets, schema.telemetry_gpus
    with store.engine.connect() as c:
        allocs = sorted((tuple(r) for r in c.execute(
            select(a.c.external_id, a.c.name, a.c.user_name, a.c.account, a.c.start_ts, a.c.end_ts,
                   a.c.time_limit_s, a.c.labels, a.c.gpu_count, g.c.node, g.c.gpu_index, g.c.share)
            .join(g, g.c.allocation_id == a.c.id).where(a.c.cluster == cluster))), key=repr)
        buckets = sorted((tuple(r) for r in c.execute(
            select(tg.c.host, tg.c.gpu_index, b.c.bucket_ts, b.c.samples, b.c.sm_active, b.c.pod)
            .join(b, b.c.gpu_id == tg.c.id).where(tg.c.cluster == cluster))), key=repr)
    return allocs, buckets


def _canon(rows: list) -> list:
    """Floats compared to 12 digits (the engines print doubles differently), labels as sorted items."""
    def one(v: object) -> object:
        if isinstance(v, float):
            return round(v, 9)
        if isinstance(v, dict):
            return tuple(sorted(v.items()))
        return v

    return [tuple(one(v) for v in r) for r in rows]


@FUZZ
@given(st.data())
def test_any_records_same_outcome_on_both_engines(stores: tuple[Store, Store], data: st.DataObject) -> None:
    cluster = f"f{next(_n)}"
    records = data.draw(st.lists(st.one_of(allocation(cluster), bucket(cluster)), min_size=1, max_size=6))
    lite, pg = stores
    q_lite, r_lite = _ingest(lite, [_copy(r) for r in records])
    q_pg, r_pg = _ingest(pg, [_copy(r) for r in records])
    assert q_lite == q_pg  # the same records quarantined before the store, for the same reasons
    assert r_lite == [] and r_pg == []  # nothing left for an engine to refuse on its own
    rows_lite, rows_pg = _rows(lite, cluster), _rows(pg, cluster)
    assert _canon(rows_lite[0]) == _canon(rows_pg[0]) and _canon(rows_lite[1]) == _canon(rows_pg[1])
    for row in rows_lite[0]:
        assert all("\x00" not in str(v) for v in row)
        assert all(not isinstance(v, float) or math.isfinite(v) for v in row)


def _copy(rec: object) -> object:
    import copy

    return copy.deepcopy(rec)


@FUZZ
@given(st.lists(st.lists(st.one_of(TEXT, st.integers(-(2**40), 2**40).map(str), st.sampled_from(
    ["2026-11-20", "n0:0", "n0:*2", "1e400", "nan", "0001-01-01T00:30:00+01:00", "2040-01-01"])),
    min_size=7, max_size=7), max_size=5))
def test_any_allocation_csv_same_outcome_on_both_engines(stores: tuple[Store, Store], rows: list[list[str]]) -> None:
    """Arbitrary CSV rows through the real collection path into both stores: same rows, same quarantine."""
    import csv

    cluster = f"c{next(_n)}"
    with tempfile.TemporaryDirectory() as tmp:
        with (Path(tmp) / "a.csv").open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["id", "name", "user", "start", "end", "gpus", "time_limit_s"])
            w.writerows(rows)
        cfg = config_mod.parse({"clusters": [{"name": cluster, "allocations": [{"kind": "file",
                                                                              "paths": ["a.csv"]}]}]})
        window = Window(datetime(1970, 1, 2, tzinfo=UTC), datetime(2038, 1, 1, tzinfo=UTC), 300)
        results = [collect_mod.collect_source(s, cfg, cfg.clusters[0], "allocations", 0,
                                              cfg.clusters[0].allocations[0], window, Path(tmp)) for s in stores]
    assert all(r.ok for r in results), [r.error for r in results]
    assert results[0].skipped == results[1].skipped and results[0].stats == results[1].stats
    lite, pg = (_canon(_rows(s, cluster)[0]) for s in stores)
    assert lite == pg
    q = schema.quarantined_records
    quarantined = []
    for s in stores:
        with s.engine.connect() as c:
            quarantined.append(sorted(tuple(r) for r in c.execute(
                select(q.c.location, q.c.reason).where(q.c.cluster == cluster))))
    assert quarantined[0] == quarantined[1] and len(quarantined[0]) == results[0].skipped
