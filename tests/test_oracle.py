"""Differential test: the real pipeline (ingest -> db prune -> audit, in SQL) equals the reference oracle
(tests/oracle.py, plain Python from the definitions) to 1e-6 GPU-hours for every allocation, every class and
every allocated GPU, and finds the same findings, on generated fleets, on SQLite and PostgreSQL.

CI runs ``GPU_AUDIT_ORACLE_EXAMPLES`` (default 300) derandomized fleets per engine; set it lower locally.
Which fleet features are generated: tests/oracle_fleets.py ``detect`` (``GPU_AUDIT_ORACLE_FEATURES``).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from helpers import migrated_store
from hypothesis import HealthCheck, given, settings
from oracle import CORE_FINDINGS, HOUR, Oracle
from oracle_fleets import ALL_FEATURES, Fleet, detect, fleets
from oracle_samples import Sample
from sqlalchemy import text

from auditor.audit.run import run_audit
from auditor.config import Config, PriceCard
from auditor.store import schema
from auditor.store.engine import Store
from auditor.store.retention import prune
from connectors.aliases import METRIC_ALIASES
from connectors.base import Problems
from connectors.file_telemetry import stored_unit
from connectors.scrape import BucketBuilder

EXAMPLES = int(os.environ.get("GPU_AUDIT_ORACLE_EXAMPLES", "300"))
FEATURES = detect()
PRICES = PriceCard(default=2.0, models={"h100": 4.0, "a100": 2.5}, mig={"1g.10gb": 0.75})
TOL_S = 1e-6 * HOUR  # 1e-6 GPU-hours
SECONDS = ("reserved", "observed", "idle", "idle_by_util", "mirage", "low", "working", "busy_unverified",
           "idle_by_counters", "busy_by_counters", "engine_spin", "unknown", "effective", "infra", "input_wait",
           "host_busy_idle")
# per allocated GPU also the waiting classes memory, communication, starved and the straggler candidates lead and
# waitable (usage_gpu columns; GpuResult.sums)


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.service)])
def oracle_store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """One migrated store per engine for all examples (tables are emptied between fleets)."""
    with migrated_store(request.param, tmp_path_factory.mktemp("oracle"), "oracle") as store:
        yield store


def clear(store: Store) -> None:
    tables = [t.name for t in reversed(schema.metadata.sorted_tables)]
    with store.begin() as conn:
        if store.dialect == "postgresql":
            conn.execute(text(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"))
        else:
            for t in tables:
                conn.execute(text(f"DELETE FROM {t}"))


def config(fleet: Fleet) -> Config:
    return Config(thresholds=fleet.th, prices=PRICES)


def scraped(records: list[Any]) -> list[Any]:
    """Raw samples of one batch made into bucket rows by the scrape connector's builder (the real path)."""
    raw = [r for r in records if isinstance(r, Sample)]
    if not raw:
        return records
    alias = {f: next(n for n, s in METRIC_ALIASES.items() if s.field == f and s.unit == stored_unit(f))
             for f in {f for r in raw for f in r.metrics}}
    builders: dict[str, BucketBuilder] = {}
    for r in raw:
        bb = builders.setdefault(r.cluster, BucketBuilder(r.cluster, 300, Problems()))
        for f, v in r.metrics.items():
            bb.add(r.host, r.gpu, "", alias[f], v, r.ts, ("oracle", "sample"), labels=r.labels)
    return [r for r in records if not isinstance(r, Sample)] + [b for bb in builders.values() for b in bb.buckets()]


def run_code(store: Store, fleet: Fleet) -> dict[str, Any]:
    """The real pipeline on one fleet: ingest, prune, audit; then the run's rows keyed like the oracle's."""
    clear(store)
    for op in fleet.ops:
        if op[0] == "ingest":
            store.ingest(scraped(op[1]), seen_at_ts=fleet.since)
        else:
            prune(store, now=op[1], keep_weeks=op[2], keep_runs_days=10_000)
    now = datetime.fromtimestamp(fleet.now, UTC)
    with mock.patch("auditor.audit.run.utcnow", return_value=now):
        rid = run_audit(store, config(fleet), datetime.fromtimestamp(fleet.since, UTC),
                        datetime.fromtimestamp(fleet.until, UTC)).run_id
    with store.engine.connect() as conn:
        gpus = [dict(r._mapping) for r in conn.execute(text(
            "SELECT a.cluster, a.source, a.external_id, a.start_ts, ag.node, ag.slot, tg.cluster AS tg_cluster, "
            "tg.host, tg.gpu_index, tg.gpu_instance, u.* FROM usage_gpu u "
            "JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id JOIN allocations a ON a.id = u.allocation_id "
            "LEFT JOIN telemetry_gpus tg ON tg.id = u.gpu_id "
            "WHERE u.run_id = :r"), {"r": rid})]
        allocs = [dict(r._mapping) for r in conn.execute(text(
            "SELECT a.cluster, a.source, a.external_id, a.start_ts, u.* FROM usage_allocation u "
            "JOIN allocations a ON a.id = u.allocation_id WHERE u.run_id = :r"), {"r": rid})]
        found = [tuple(r) for r in conn.execute(text(
            "SELECT a.cluster, a.source, a.external_id, a.start_ts, f.kind, f.evidence FROM findings f "
            "JOIN allocations a ON a.id = f.allocation_id WHERE f.run_id = :r"), {"r": rid})]
    key = lambda r: (r["cluster"], r["source"], r["external_id"], float(r["start_ts"]))  # noqa: E731
    out: dict[str, Any] = {"gpus": {}, "allocs": {}, "findings": {}, "sparklines": {}}
    for r in gpus:
        out["gpus"][(key(r), r["node"], r["slot"])] = r
    for r in allocs:
        out["allocs"][key(r)] = r
    for c, s, e, t, kind, ev in found:
        if kind in CORE_FINDINGS:
            out["findings"].setdefault((c, s, e, float(t)), set()).add(kind)
        ev = json.loads(ev) if isinstance(ev, str) else ev
        out["sparklines"][(c, s, e, float(t))] = ev.get("sparkline")
    return out


SEEN: Counter[str] = Counter()


def run_oracle(fleet: Fleet) -> dict:
    o = Oracle()
    for op in fleet.ops:
        if op[0] == "ingest":
            o.ingest(op[1])
        else:
            o.prune(op[1], op[2])
    # the definitions' default 0.1 where the code has no such setting yet; 0 while the feature is off
    min_h = getattr(fleet.th, "min_finding_gpu_hours", 0.1) if "min_finding" in fleet.features else 0.0
    res = o.audit(fleet.th, PRICES, fleet.since, fleet.until, fleet.now, min_finding_gpu_hours=min_h)
    SEEN.update(o.seen)
    for r in res.values():
        SEEN.update(f"finding {k}" for k in r.findings)
        if "_" in r.key[2] or "+" in r.key[2]:
            SEEN["array/het job audited"] += 1
        if r.alloc.end is None:
            SEEN["running allocation audited"] += 1
        if r.key[0] != "c":
            SEEN["allocation of cluster d"] += 1
            if any(k[0] == "c" and k[2] == r.key[2] for k in res):
                SEEN["same job id in two clusters"] += 1
    return res


def _col(row: dict[str, Any], name: str) -> float | None:
    c = f"{name}_s"
    return None if c not in row else float(row[c] or 0.0)


def compare(fleet: Fleet, code: dict[str, Any], want: dict) -> list[str]:
    """Every difference between the code's run and the oracle, as readable lines."""
    bad: list[str] = []

    def num(where: str, name: str, got: float | None, exp: float, tol: float = TOL_S) -> None:
        if got is None:
            if abs(exp) > tol:
                bad.append(f"{where} {name}: code has no such column, oracle {exp:.6f}")
            return
        if abs(got - exp) > tol:
            bad.append(f"{where} {name}: code {got:.6f} oracle {exp:.6f}")

    if set(code["allocs"]) != set(want):
        bad.append(f"allocations: code only {sorted(set(code['allocs']) - set(want))}, "
                   f"oracle only {sorted(set(want) - set(code['allocs']))}")
    for key, res in want.items():
        row = code["allocs"].get(key)
        if row is None:
            continue
        for name in SECONDS:
            num(f"alloc {key[2]}", name, _col(row, name), res.totals[name])
        num(f"alloc {key[2]}", "price", float(row["price_per_gpu_hour"]), res.price, 1e-9)
        num(f"alloc {key[2]}", "reserved_cost", float(row["reserved_cost"]), res.reserved_cost, 1e-5)
        num(f"alloc {key[2]}", "idle_cost", float(row["idle_cost"]), res.idle_cost, 1e-5)
        for g in res.gpus:
            where = f"alloc {key[2]} gpu {g.node}/slot{g.slot}"
            grow = code["gpus"].get((key, g.node, g.slot))
            if grow is None:
                bad.append(f"{where}: missing in usage_gpu")
                continue
            tied = None if grow["gpu_id"] is None else (grow["tg_cluster"], grow["host"], grow["gpu_index"],
                                                         grow["gpu_instance"])
            if tied != g.tied:
                bad.append(f"{where} attributed to {tied} ({grow['attribution']}), oracle {g.tied} ({g.attribution})")
            for name, exp in g.sums().items():
                num(where, name, _col(grow, name), exp)
            num(where, "max_gpu_mirage", float(grow["max_gpu_mirage_s"]), g.mirage_raw)
        if key in code["sparklines"]:  # an allocation with a finding: its sparkline (definitions "Sparklines")
            got, exp = code["sparklines"][key], res.sparkline
            SEEN["sparklines compared"] += 1
            if (got is None) != (exp is None):
                bad.append(f"alloc {key[2]} sparkline: code {got} oracle {exp}")
            elif exp is not None:
                if got["bin_hours"] != exp["bin_hours"] or len(got["sm"]) != len(exp["sm"]):
                    bad.append(f"alloc {key[2]} sparkline bins: code {got} oracle {exp}")
                for name in ("sm", "util"):
                    for i, (x, y) in enumerate(zip(got[name], exp[name], strict=False)):
                        # the store writes 3 decimals
                        if (x is None) != (y is None) or (x is not None and abs(x - y) > 5e-4 + 1e-9):
                            bad.append(f"alloc {key[2]} sparkline {name}[{i}]: code {x} oracle {y}")
        if res.near_boundary:
            SEEN["findings not compared (a ratio within 1e-7 of its threshold)"] += 1
        elif code["findings"].get(key, set()) != res.findings:
            bad.append(f"alloc {key[2]} findings: code {sorted(code['findings'].get(key, set()))} "
                       f"oracle {sorted(res.findings)}")
    return bad


STATS: dict[str, int] = {}


def check(store: Store, fleet: Fleet) -> None:
    want = run_oracle(fleet)
    got = run_code(store, fleet)
    bad = compare(fleet, got, want)
    assert not bad, "code and oracle differ:\n" + "\n".join(bad[:40]) + f"\non\n{fleet!r}"
    STATS["fleets"] = STATS.get("fleets", 0) + 1
    STATS["allocations"] = STATS.get("allocations", 0) + len(want)
    STATS["findings"] = STATS.get("findings", 0) + sum(len(r.findings) for r in want.values())


@pytest.mark.slow
def test_audit_equals_oracle(oracle_store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    """At least EXAMPLES generated fleets per engine, reproducibly (derandomized, no example database)."""
    STATS.clear()
    SEEN.clear()

    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None, print_blob=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much, HealthCheck.large_base_example])
    @given(fleets(FEATURES))
    def differential(fleet: Fleet) -> None:
        check(oracle_store, fleet)

    t0 = time.monotonic()
    differential()
    with capsys.disabled():
        print(f"\noracle: {STATS.get('fleets', 0)} fleets ({STATS.get('allocations', 0)} allocations, "
              f"{STATS.get('findings', 0)} findings) equal on {oracle_store.dialect} in "
              f"{time.monotonic() - t0:.0f} s; features: {', '.join(sorted(FEATURES)) or 'none'}; off: "
              f"{', '.join(sorted(set(ALL_FEATURES) - FEATURES)) or 'none'}")
        print("oracle: exercised " + "; ".join(f"{k}: {v}" for k, v in sorted(SEEN.items())))
    assert STATS["fleets"] >= EXAMPLES * 0.9, STATS


def test_features_are_known() -> None:
    """The switchable features are documented and the environment override names only known ones."""
    assert FEATURES <= set(ALL_FEATURES) and all(ALL_FEATURES.values())
    assert Path(__file__).with_name("oracle.py").is_file()
