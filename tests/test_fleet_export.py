"""The fleet export (docs/fleet-export.md): Parquet partitioned by cluster and week, read back by DuckDB as a
site's data tools read it. Scale by partition, shared-nothing: two stores, one cluster each, exporting into
one root give DuckDB exactly the chargeback one store holding both clusters gives (Decimal equality), and the
figures equal the independent oracle's (tests/oracle.py), on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
from click.testing import CliRunner
from test_chargeback import W0, W1, cfg, mixed, oracle_rows

from auditor.cli import main
from auditor.records import Allocation, GpuBucket, NodeEvent
from auditor.report import chargeback as cb
from auditor.report import fleet
from auditor.store.engine import Store

ROOT = Path(__file__).resolve().parents[1]


def as_cluster(records: list[Any], cluster: str) -> list[Any]:
    return [dataclasses.replace(r, cluster=cluster) if isinstance(r, Allocation | GpuBucket | NodeEvent) else r
            for r in records]


def fleet_records() -> dict[str, list[Any]]:
    """tests/test_chargeback.py's mixed fleet (every verdict, fractional GPUs, a pod, a job straddling the
    window, a GPU without telemetry, infrastructure events) as two clusters."""
    return {"c": as_cluster(mixed(), "c"), "d": as_cluster(mixed(), "d")}


def _read(root: Path, table: str, sql: str) -> list[tuple]:
    rel = f"read_parquet('{root}/{table}/*/*/*.parquet', hive_partitioning = true)"
    return duckdb.sql(sql.format(t=rel)).fetchall()


def test_partition_exports_equal_one_store(store: Store, tmp_path: Path) -> None:
    recs = fleet_records()
    store.ingest(recs["c"] + recs["d"])  # one store holding both clusters (the engine under test)
    one = {(r["cluster"], r["owner"]): r for r in cb.chargeback(store, cfg(), W0, W1, "account")}
    root = tmp_path / "fleet"
    for name, rs in recs.items():  # one SQLite store per cluster, each exporting into the shared root
        part = Store.open(f"sqlite:///{tmp_path / f'{name}.db'}")
        part.upgrade()
        part.ingest(rs)
        res = fleet.export(part, cfg(), root, W0, W1)
        assert res["clusters"] == [name] and res["week"] == "2026-W46"  # W0 = Sunday 2026-11-15 23:00 UTC: ISO week 46
    cols = [f"{h}_gpu_hours" for h in cb.HOURS] + ["reserved_cost", "idle_cost", "lost_gpu_hours"]
    got = {(r[0], r[1]): r[2:] for r in _read(root, "chargeback", "SELECT cluster, owner, allocations, "
                                              + ", ".join(cols) + " FROM {t} ORDER BY 1, 2")}
    assert set(got) == set(one)
    for key, r in one.items():  # exact: decimals in, decimals out
        assert got[key] == (r["allocations"], *(r[c] for c in cols)), key
    # fleet totals in DuckDB = the one store's totals
    tot = _read(root, "chargeback", "SELECT SUM(reserved_cost), SUM(idle_cost), SUM(reserved_gpu_hours) FROM {t}")[0]
    want = cb.totals(list(one.values()))
    assert tot == (want["reserved_cost"], want["idle_cost"], want["reserved_gpu_hours"])
    # and the independent oracle's figures (per cluster the same fleet: twice the single cluster's)
    orc = oracle_rows(recs["c"], cfg(), W0, W1, "account")
    assert abs(float(tot[0]) - 2 * sum(o["reserved_cost"] for o in orc.values())) <= 1e-3
    assert abs(float(tot[2]) - 2 * sum(o["reserved"] for o in orc.values())) <= 1e-4


def test_usage_rows_carry_focus_columns_and_reconcile(tmp_path: Path) -> None:
    part = Store.open(f"sqlite:///{tmp_path / 'c.db'}")
    part.upgrade()
    part.ingest(fleet_records()["c"])
    root = tmp_path / "fleet"
    fleet.export(part, cfg(), root, W0, W1)
    rows = {r["owner"]: r for r in cb.chargeback(part, cfg(), W0, W1, "account")}
    got = _read(root, "usage", "SELECT SubAccountId, COUNT(*), SUM(BilledCost), SUM(ConsumedQuantity), "
                "SUM(x_IdleGpuHours), SUM(x_UnknownGpuHours), MIN(ChargePeriodStart), MAX(ChargePeriodEnd), "
                "MIN(ConsumedUnit), MIN(BillingCurrency) FROM {t} GROUP BY 1 ORDER BY 1")
    assert {g[0] for g in got} == set(rows)
    for owner, n, billed, qty, idle, unknown, start, end, unit, cur in got:
        r = rows[owner]
        assert n == r["allocations"]
        # per-allocation costs are rounded to 4 decimals each: within half a unit per allocation
        assert abs(billed - r["reserved_cost"]) <= Decimal("0.00005") * n
        assert abs(qty - float(r["reserved_gpu_hours"])) <= 1e-5
        assert abs(idle - float(r["idle_gpu_hours"] + r["mirage_gpu_hours"])) <= 1e-5
        assert abs(unknown - float(r["unknown_gpu_hours"])) <= 1e-5
        assert (start, end) == (W0, W1) and unit == "GPU-Hour" and cur == "USD"
    # the pod of mixed(): ResourceId is the gpu-audit job REF, Tags a JSON object, a Kubernetes pod
    pod = _read(root, "usage", "SELECT ResourceId, ResourceType, Tags, x_Team FROM {t} WHERE ResourceName = 'pod'")
    assert len(pod) == 1 and pod[0][:2] == ("c:ns-other/pod", "Kubernetes pod")
    assert json.loads(pod[0][2])["user"] == "dora" and pod[0][3] == "bio"  # dora is team bio (cfg())
    # a spreadsheet-formula account is data, exported as it is (Parquet is not a spreadsheet)
    assert _read(root, "allocations", "SELECT COUNT(*) FROM {t} WHERE account LIKE '=HYPERLINK%'")[0][0] == 1


def test_reexport_replaces_only_its_own_partition(tmp_path: Path) -> None:
    part = Store.open(f"sqlite:///{tmp_path / 'c.db'}")
    part.upgrade()
    part.ingest(fleet_records()["c"])
    root = tmp_path / "fleet"
    mine = root / "notes.txt"
    root.mkdir()
    mine.write_text("the user's")
    fleet.export(part, cfg(), root, W0, W1)
    first = sorted(p.relative_to(root) for p in root.rglob("*.parquet"))
    fleet.export(part, cfg(), root, W0, W1)
    assert sorted(p.relative_to(root) for p in root.rglob("*.parquet")) == first  # replaced, not doubled
    assert mine.read_text() == "the user's"
    assert not [p for p in root.rglob("*.tmp")]
    meta = pq.read_schema(root / "usage" / "cluster=c" / "week=2026-W46" / "data.parquet").metadata
    assert meta[b"gpu_audit.schema"] == fleet.SCHEMA.encode()
    assert json.loads((root / fleet.MANIFEST).read_text())["schema"] == fleet.SCHEMA


def test_cli_export(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    part = Store.open(f"sqlite:///{db}")
    part.upgrade()
    part.ingest(fleet_records()["c"])
    conf = tmp_path / "c.toml"
    conf.write_text(f'[store]\nurl = "sqlite:///{db}"\n')
    res = CliRunner().invoke(main, ["-c", str(conf), "--json", "export", "--out", str(tmp_path / "x"),
                                    "--since", W0.isoformat(), "--until", W1.isoformat()])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["clusters"] == ["c"] and len(doc["files"]) == 3 and doc["rows"]["usage"] == 6


def test_schema_is_documented() -> None:
    """docs/fleet-export.md lists every column of every table, with its type, in the code's order."""
    text = (ROOT / "docs" / "fleet-export.md").read_text(encoding="utf-8")
    for table, cols in fleet.TABLES.items():
        section = text.split(f"### `{table}`", 1)[1].split("\n### ", 1)[0]
        documented = re.findall(r"^\| `([A-Za-z_]+)` \| `([a-z0-9(),]+)` \|", section, re.M)
        assert documented == [(c.name, c.type) for c in cols], table


def test_week_partition_and_names() -> None:
    assert fleet.week_of(datetime(2026, 1, 1, tzinfo=UTC)) == "2026-W01"
    assert fleet.week_of(datetime(2027, 1, 1, tzinfo=UTC)) == "2026-W53"
    assert fleet._safe("a/b=c") == "a%2Fb%3Dc" and fleet._safe("hpc-1") == "hpc-1"
