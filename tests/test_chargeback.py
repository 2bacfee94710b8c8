"""Chargeback: every row's GPU-hours (unknown included, computed on its own) equal the reference oracle's
(tests/oracle.py), totals equal the audit summary, on SQLite and PostgreSQL; the columns are the checked-in
golden list (tests/golden/); files are spreadsheet-safe."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from helpers import migrated_store
from oracle import Oracle
from test_findings_extra import IDLE, WORK, job, run

from auditor.audit.run import run_audit
from auditor.config import Config, PriceCard, ReportConfig, Team
from auditor.errors import GpuAuditError
from auditor.records import AllocatedGpu, Allocation, GpuBucket, NodeEvent
from auditor.report import chargeback as cb
from auditor.store.engine import Store

T0 = datetime(2026, 11, 16, tzinfo=UTC)
W0, W1 = T0 - timedelta(hours=1), T0 + timedelta(hours=7)
PARTS = ("idle", "mirage", "low", "working", "unknown")
GOLDEN = Path(__file__).parent / "golden"
OWNER = {"account": lambda a: a.account, "namespace": lambda a: a.account, "user": lambda a: a.user,
         "cluster": lambda a: a.cluster}


def golden(name: str) -> list[str]:
    lines = (GOLDEN / name).read_text(encoding="utf-8").splitlines()
    return [x for x in lines if x and not x.startswith("#")]


def oracle_rows(records: list[Any], c: Config, since: datetime, until: datetime, by: str) -> dict[str, dict]:
    """GPU-hours per owner from the oracle: unknown is reserved time no sample covers, not a remainder."""
    o = Oracle()
    o.ingest(records)
    out: dict[str, dict[str, float]] = {}
    now = datetime.now(UTC).timestamp()
    for r in o.audit(c.thresholds, c.prices, since.timestamp(), until.timestamp(), now).values():
        row = out.setdefault(OWNER[by](r.alloc), {"allocations": 0})
        row["allocations"] += 1
        for k, v in r.totals.items():
            row[k] = row.get(k, 0.0) + v / 3600
        for k in ("reserved_cost", "idle_cost"):
            row[k] = row.get(k, 0.0) + getattr(r, k)
    return out


def cfg() -> Config:
    return Config(prices=PriceCard(models={"h100": 4.0, "a100": 2.5}, mig={"1g.10gb": 0.75}),
                  teams=[Team(name="ml", accounts=["physics"], namespaces=["ns-ml"], idle_budget_gpu_hours=10.0),
                         Team(name="bio", users=["dora"])])


def mixed() -> list[Any]:
    """Every verdict, fractional GPUs, a pod, a job straddling the window, a GPU with no telemetry."""
    recs: list[Any] = [
        job("idle", [AllocatedGpu("n1", 0, model="h100")], hours=3, account="physics"),
        job("mix", [AllocatedGpu("n1", 1, model="h100"), AllocatedGpu("n1", 2, model="h100")], hours=6,
            account="chem"),
        job("mig", [AllocatedGpu("n2", 0, model="a100", share=1 / 7, mig_profile="1g.10gb")], hours=4,
            account="chem"),
        job("dark", [AllocatedGpu("n3", 0, model="a100")], hours=2, account="=HYPERLINK(\"x\")"),
        Allocation("c", "kubernetes", "uid-1", name="pod", user="dora", account="ns-other", start=T0,
                   end=T0 + timedelta(hours=2), gpus=[AllocatedGpu("n2", 1, share=0.5)]),
        job("edge", [AllocatedGpu("n1", 3, model="h100")], hours=4, start=T0 - timedelta(hours=2),
            account="physics"),
    ]
    recs += run("n1", 0, 0, 36, **IDLE)
    recs += run("n1", 1, 0, 24, **WORK) + run("n1", 1, 24, 24, sm_active=0.02, gpu_util=0.9)
    recs += run("n1", 2, 0, 40, sm_active=0.3, dram_active=0.5) + run("n1", 2, 40, 20, samples=0)
    recs += run("n2", 0, 0, 48, sm_active=0.6, tensor_active=0.4)
    recs += run("n2", 1, 0, 24, gpu_util=0.01)
    recs += [GpuBucket("c", "n1", 3, T0 - timedelta(minutes=5 * i), 300, 10, **WORK) for i in range(1, 13)]
    recs += run("n1", 3, 0, 24, **IDLE)
    # infrastructure events (README "Infrastructure-affected time"): an XID on n1/1 that does not start or end
    # on a bucket boundary, n2 drained for 30 min (both its jobs), n3 NotReady from 1 h on, still ongoing
    recs += [NodeEvent("c", "n1", "xid", T0 + timedelta(minutes=62), T0 + timedelta(minutes=72), gpu=1,
                       reason="XID 79"),
             NodeEvent("c", "n2", "drain", T0 + timedelta(minutes=30), T0 + timedelta(minutes=60), reason="fan"),
             NodeEvent("c", "n3", "not_ready", T0 + timedelta(hours=1), None, reason="KubeletNotReady")]
    return recs


def check_reconciles(store: Store, c: Config, records: list[Any]) -> None:
    summary = run_audit(store, c, W0, W1).summary
    for by in cb.BY:
        rows = cb.chargeback(store, c, W0, W1, by)
        assert rows, by
        for r in rows:
            assert r["unknown_gpu_hours"] >= 0 and r["currency"] == "USD"
        if by in OWNER:  # every hours column, unknown included, equals the oracle (6-decimal rounding)
            want = oracle_rows(records, c, W0, W1, by)
            assert {r["owner"] for r in rows} == set(want), by
            for r in rows:
                w = want[r["owner"]]
                assert r["allocations"] == w["allocations"], (by, r["owner"])
                for h in cb.HOURS:
                    assert abs(float(r[f"{h}_gpu_hours"]) - w[h]) <= 1e-5, (by, r["owner"], h, r, w)
                for k in ("reserved_cost", "idle_cost"):
                    assert abs(float(r[k]) - w[k]) <= 1e-4, (by, r["owner"], k)
        t = cb.totals(rows)
        # totals equal the audit summary (to the 6-decimal rounding of each row)
        tol = Decimal("0.000001") * len(rows)
        for key, parts in (("reserved_gpu_hours", ("reserved",)), ("effective_gpu_hours", ("effective",)),
                           ("idle_gpu_hours", ("idle", "mirage")), ("mirage_gpu_hours", ("mirage",)),
                           ("low_gpu_hours", ("low",)), ("working_gpu_hours", ("working",)),
                           ("unknown_gpu_hours", ("unknown",))):
            got = sum(t[f"{p}_gpu_hours"] for p in parts)
            assert abs(got - Decimal(repr(summary[key]))) <= tol, (by, key, got, summary[key])
        for key in ("reserved_cost", "idle_cost"):
            assert abs(t[key] - Decimal(repr(summary[key]))) <= Decimal("0.0001") * len(rows), (by, key)
        assert t["allocations"] == summary["allocations"]


def hand_checked(store: Store, c: Config) -> None:
    """The numbers of `mixed()`, worked out by hand (window [T0-1h, T0+7h))."""
    rows = {(r["owner"]): r for r in cb.chargeback(store, c, W0, W1, "team")}
    ml, bio = rows["ml"], rows["bio"]
    # ml: idle 3 h x1 (idle) + edge clipped to [T0-1h, T0+2h): 1 h work, 2 h idle
    assert ml["reserved_gpu_hours"] == Decimal("6") and ml["idle_gpu_hours"] == Decimal("5")
    assert ml["working_gpu_hours"] == Decimal("1") and ml["reserved_cost"] == Decimal("24")
    # bio: the pod holds half a GPU of n2 for 2 h, judged idle-by-util (low confidence) at the default price,
    # except the 30 min n2 was drained: 0.5 h x 0.5 = 0.25 infrastructure-affected, 1.5 h x 0.5 = 0.75 idle
    assert bio["reserved_gpu_hours"] == Decimal("1") and bio["idle_by_util_gpu_hours"] == Decimal("0.75")
    assert bio["infra_gpu_hours"] == Decimal("0.25") and bio["unknown_gpu_hours"] == Decimal("0")
    assert bio["reserved_cost"] == Decimal("2") and bio["cost_per_effective_gpu_hour"] is None
    un = rows["(unmapped)"]
    # mix: 2 GPUs x 6 h = 12 (work 2, mirage 2, low 40/12, unknown 2 + 32/12); mig: 4/7 working;
    # dark: 2 unknown. MIG charged at 0.75 per slice-hour: 4 h -> 3.0
    assert un["reserved_gpu_hours"] == Decimal("14.571429")
    assert un["mirage_gpu_hours"] == Decimal("2") and un["low_gpu_hours"] == Decimal("3.333333")
    # infra: the XID on n1/1 10 min (its 3 buckets 60-75 min judged by no verdict: 15 min of work less, the
    # other 5 min unknown) + n2 drained 30 min x 1/7 (mig) + n3 NotReady 1 h of dark's 2 h
    # = 1/6 + 1/14 + 1 = 1.238095; working = mix 2 h - 15 min + mig (4 h - 0.5 h) / 7 = 1.75 + 0.5 = 2.25
    assert un["infra_gpu_hours"] == Decimal("1.238095") and un["working_gpu_hours"] == Decimal("2.25")
    assert un["reserved_cost"] == Decimal("12") * 4 + Decimal("3") + Decimal("2") * Decimal("2.5")


@pytest.fixture
def sqlite_store(tmp_path) -> Store:
    s = Store.open(f"sqlite:///{tmp_path / 'a.db'}")
    s.upgrade()
    return s


def test_reconciles_on_sqlite(sqlite_store: Store) -> None:
    sqlite_store.ingest(mixed())
    check_reconciles(sqlite_store, cfg(), mixed())
    hand_checked(sqlite_store, cfg())


@pytest.mark.service
def test_reconciles_on_postgresql(tmp_path: Path) -> None:
    with migrated_store("postgresql", tmp_path, "t_cb") as store:
        store.ingest(mixed())
        check_reconciles(store, cfg(), mixed())
        hand_checked(store, cfg())


def test_csv_is_spreadsheet_safe_and_columns_are_the_golden_list(sqlite_store: Store) -> None:
    evil = ["=cmd|' /C calc'!A0", "+1+1", "-2", "@SUM(A1)", "\tx", "\rx", "plain"]
    sqlite_store.ingest([job(f"e{i}", [AllocatedGpu("n1", i)], hours=1, account=a) for i, a in enumerate(evil)])
    rows = cb.chargeback(sqlite_store, cfg(), W0, W1, "account")
    parsed = list(csv.DictReader(io.StringIO(cb.to_csv(rows), newline="")))
    columns = golden("chargeback_columns.txt")  # checked in: dropping a finance column fails here
    assert list(parsed[0]) == columns
    owners = sorted(r["owner"] for r in parsed)
    assert owners == sorted(("'" + a if a[0] in "=+-@\t\r" else a) for a in evil)
    assert all(r["reserved_gpu_hours"] == "1.000000" and r["unknown_gpu_hours"] == "1.000000" for r in parsed)
    doc = json.loads(cb.to_json(rows, since=W0, until=W1, by="account", period=None, currency="USD"),
                     parse_float=Decimal)
    assert doc["schema"] == "gpu-audit.chargeback/3" and doc["columns"] == columns
    assert all(list(r) == columns for r in doc["rows"])
    assert sorted([*doc, *(f"totals.{k}" for k in doc["totals"])]) == golden("chargeback_json_keys.txt")
    assert doc["totals"]["reserved_gpu_hours"] == Decimal("7") == sum(r["reserved_gpu_hours"] for r in doc["rows"])
    assert {r["owner"] for r in doc["rows"]} == set(evil)  # JSON keeps the raw text


@pytest.mark.parametrize("period, tz, start, hours", [
    ("2026-10", "Europe/Berlin", "2026-09-30T22:00:00+00:00", 745),  # DST ends Oct 25: one hour longer
    ("2026-03", "Europe/Berlin", "2026-02-28T23:00:00+00:00", 743),  # DST starts Mar 29: one hour shorter
    ("2026-11", "UTC", "2026-11-01T00:00:00+00:00", 720),
    ("2026-12", "America/New_York", "2026-12-01T05:00:00+00:00", 744),
])
def test_period_is_a_local_calendar_month(period: str, tz: str, start: str, hours: int) -> None:
    from zoneinfo import ZoneInfo

    s, u = cb.month_window(period, ZoneInfo(tz))
    assert s.isoformat() == start and (u - s) == timedelta(hours=hours)


def test_month_across_dst_charges_the_real_hours(sqlite_store: Store) -> None:
    c = Config(report=ReportConfig(timezone="Europe/Berlin"))
    long = Allocation("c", "slurm", "long", account="a", start=datetime(2026, 9, 20, tzinfo=UTC),
                      end=datetime(2026, 11, 10, tzinfo=UTC), gpus=[AllocatedGpu("n1", 0)])
    sqlite_store.ingest([long])
    s, u = cb.month_window("2026-10", cb.report_tz(c))
    (row,) = cb.chargeback(sqlite_store, c, s, u, "cluster", period="2026-10")
    assert row["period"] == "2026-10" and row["owner"] == "c"
    assert row["reserved_gpu_hours"] == Decimal(745) == row["unknown_gpu_hours"]
    assert cb.previous_month(datetime(2027, 1, 1, 0, 30, tzinfo=UTC), cb.report_tz(c)) == "2026-12"
    assert cb.previous_month(datetime(2026, 12, 31, 23, 30, tzinfo=UTC), cb.report_tz(c)) == "2026-12"


def cli(tmp_path: Path, *args: str) -> Any:
    from auditor.cli import App
    from auditor.cli.money import register

    cfg_file = tmp_path / "gpu-audit.toml"
    cfg_file.write_text(f'[store]\nurl = "sqlite:///{tmp_path / "a.db"}"\n[prices]\nmodels = {{h100 = 4.0}}\n'
                        '[[teams]]\nname = "ml"\naccounts = ["physics"]\n')
    group = click.Group()
    register(group)
    return CliRunner().invoke(group, list(args), obj=App(str(cfg_file)), catch_exceptions=False)


def test_cli_chargeback_files(sqlite_store: Store, tmp_path: Path) -> None:
    sqlite_store.ingest(mixed())
    out = tmp_path / "cb.csv"
    res = cli(tmp_path, "chargeback", "--since", W0.isoformat(), "--until", W1.isoformat(), "--by", "team",
              "--format", "csv", "--out", str(out))
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(out.open(newline="")))
    assert {r["owner"] for r in rows} == {"ml", "(unmapped)"}  # the file config maps no user "dora"
    ml = next(r for r in rows if r["owner"] == "ml")
    assert ml["reserved_gpu_hours"] == "6.000000" and ml["reserved_cost"] == "24.0000"
    res = cli(tmp_path, "chargeback", "--period", "2026-11", "--by", "cluster", "--format", "json")
    doc = json.loads(res.output)
    assert doc["period"] == "2026-11" and doc["rows"][0]["period_start"] == "2026-11-01T00:00:00+00:00"
    with pytest.raises(GpuAuditError, match="exclude each other"):
        cli(tmp_path, "chargeback", "--period", "2026-11", "--since", "2026-11-01")


def test_write_previous_month(sqlite_store: Store, tmp_path: Path) -> None:
    sqlite_store.ingest(mixed())
    done = cb.write_previous_month(sqlite_store, cfg(), tmp_path / "out", datetime(2026, 12, 3, tzinfo=UTC))
    assert done["period"] == "2026-11" and len(done["files"]) == 4
    doc = json.loads((tmp_path / "out" / "chargeback-2026-11-by-team.json").read_text(), parse_float=Decimal)
    s, u = cb.month_window("2026-11", cb.report_tz(cfg()))
    (want,) = oracle_rows(mixed(), cfg(), s, u, "cluster").values()  # all of November, unknown on its own
    for h in cb.HOURS:
        assert abs(float(doc["totals"][f"{h}_gpu_hours"]) - want[h]) <= 1e-5 * len(doc["rows"]), h
    assert not list((tmp_path / "out").glob("*.tmp"))


def test_busy_unverified_time_is_not_charged_as_unknown(sqlite_store: Store) -> None:
    # job 1 holds n1:0 for 2 h; 24 five-minute buckets with GPU-Util 0.9 and no SM activity: observed, work
    # not verifiable -> busy_unverified 2 h, unknown 0 h (the oracle says the same)
    recs = [job("1", [AllocatedGpu("n1", 0)], hours=2, account="physics"), *run("n1", 0, 0, 24, gpu_util=0.9)]
    sqlite_store.ingest(recs)
    (want,) = oracle_rows(recs, cfg(), W0, W1, "account").values()
    assert (want["busy_unverified"], want["unknown"]) == (2.0, 0.0)
    (row,) = cb.chargeback(sqlite_store, cfg(), W0, W1, "account")
    assert row["unknown_gpu_hours"] == Decimal("0") and row["busy_unverified_gpu_hours"] == Decimal("2")
