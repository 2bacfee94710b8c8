"""Money in the ledger (issue 13 §3, issue 14 §4): team_label gives the same chargeback on SQLite and
PostgreSQL, chargeback --by qos / --by state, and money is always finite. Numbers computed by hand."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import text

from auditor.config import Config, PriceCard, Team
from auditor.records import AllocatedGpu, Allocation
from auditor.report import chargeback as cb
from auditor.store.engine import Store

T0 = datetime(2026, 11, 16, tzinfo=UTC)
W0, W1 = T0, T0 + timedelta(hours=10)
H = timedelta(hours=1)


def strict_json(s: str) -> Any:
    """json.loads that refuses NaN / Infinity / -Infinity tokens (what a strict parser does)."""
    def bad(token: str) -> None:
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(s, parse_constant=bad)


def fleet() -> list[Allocation]:
    """4 allocations, no telemetry (every reserved hour is unknown, never idle); price 2.0 per GPU-hour:
    - pod p1: namespace ns-ml (team ml by namespace) but label team=vision: 2 GPUs x 3 h = 6 GPU-h, 12.00
    - pod p2: namespace ns-ml, no team label: 1 GPU x 1 h = 1 GPU-h -> team ml, 2.00
    - job j1: account physics (team phys), QOS high, COMPLETED: 1 GPU x 2 h = 2 GPU-h, 4.00
    - job j2: account physics, QOS normal, RUNNING since T0+6h: 4 GPUs x 4 h (to W1) = 16 GPU-h, 32.00"""
    def pod(uid: str, gpus: int, hours: int, labels: dict[str, str]) -> Allocation:
        return Allocation("c", "kubernetes", uid, name=uid, account="ns-ml", qos="batch", state="Succeeded",
                          start=T0, end=T0 + hours * H, labels=labels,
                          gpus=[AllocatedGpu("k1", None) for _ in range(gpus)])

    return [pod("p1", 2, 3, {"team": "vision"}), pod("p2", 1, 1, {}),
            Allocation("c", "slurm", "j1", account="physics", qos="high", state="COMPLETED", submit=T0, start=T0,
                       end=T0 + 2 * H, gpus=[AllocatedGpu("n1", 0)]),
            Allocation("c", "slurm", "j2", account="physics", qos="normal", state="RUNNING", submit=T0 + 6 * H,
                       start=T0 + 6 * H, gpus=[AllocatedGpu("n1", g) for g in range(4)])]


def config() -> Config:
    return Config(prices=PriceCard(default=2.0),
                  teams=[Team(name="ml", namespaces=["ns-ml"]), Team(name="phys", accounts=["physics"])])


def table(rows: list[dict[str, Any]]) -> dict[str, tuple[Decimal, Decimal]]:
    return {r["owner"]: (r["reserved_gpu_hours"], r["reserved_cost"]) for r in rows}


@pytest.mark.service
def test_team_label_same_chargeback_on_both_engines(store: Store) -> None:
    """Hand: vision 6 GPU-h / 12.00; ml 1 / 2.00; phys 2 + 16 = 18 / 36.00. (SQLite returned the labels
    as JSON text, so the pod label was ignored there: ml got 7 / 14.00 on SQLite only.)"""
    store.ingest(fleet(), seen_at_ts=int(W1.timestamp()))
    rows = cb.chargeback(store, config(), W0, W1, "team")
    assert table(rows) == {"ml": (Decimal("1"), Decimal("2")), "phys": (Decimal("18"), Decimal("36")),
                           "vision": (Decimal("6"), Decimal("12"))}
    custom = config().model_copy(update={"team_label": "owner"})
    store.ingest([Allocation("c", "kubernetes", "p3", account="ns-ml", start=T0, end=T0 + H,
                             labels={"owner": "search"}, gpus=[AllocatedGpu("k1", None)])],
                 seen_at_ts=int(W1.timestamp()))
    # team_label = owner: p1's "team" label no longer counts (ml 1 + 6 = 7), p3 -> search 1 GPU-h
    assert table(cb.chargeback(store, custom, W0, W1, "team")) == {
        "ml": (Decimal("7"), Decimal("14")), "phys": (Decimal("18"), Decimal("36")),
        "search": (Decimal("1"), Decimal("2"))}


def _audit_teams(store: Store, cfg: Config) -> dict[str, str]:
    from auditor.audit.run import run_audit

    run = run_audit(store, cfg, W0, W1)
    with store.engine.connect() as conn:
        return dict(conn.execute(text("SELECT a.external_id, u.team FROM usage_allocation u JOIN allocations a "
                                      "ON a.id = u.allocation_id WHERE u.run_id = :r"), {"r": run.run_id}).all())


@pytest.mark.service
def test_team_label_read_by_the_server_as_python_read_it(store: Store) -> None:
    """The audit reads the team label's value in SQL (auditor.audit.totals.team_label_sql) instead of parsing
    labels in Python; by hand, namespace ns-ml is team ml: a label team=vision wins (p1); an empty label
    (p2), no labels (p3) and labels that are no JSON object (p5: text that is no JSON on SQLite, a JSON array
    on PostgreSQL) fall back to the namespace; a value with a quote is kept as it is (p4). A label name no
    JSON path quotes (we"ird) reads the whole labels instead: p6 -> odd, the rest -> ml."""
    def pod(uid: str, labels: dict[str, str]) -> Allocation:
        return Allocation("c", "kubernetes", uid, name=uid, account="ns-ml", start=T0, end=T0 + H, labels=labels,
                          gpus=[AllocatedGpu("k1", None)])

    store.ingest([pod("p1", {"team": "vision"}), pod("p2", {"team": ""}), pod("p3", {}),
                  pod("p4", {"team": 'a"b'}), pod("p5", {"team": "lost"}), pod("p6", {'we"ird': "odd"})],
                 seen_at_ts=int(W1.timestamp()))
    bad = "'not json'" if store.engine.dialect.name == "sqlite" else "'[\"team\", \"x\"]'"
    with store.begin() as conn:
        conn.execute(text(f"UPDATE allocations SET labels = {bad} WHERE external_id = 'p5'"))
    assert _audit_teams(store, config()) == {"p1": "vision", "p2": "ml", "p3": "ml", "p4": 'a"b', "p5": "ml",
                                             "p6": "ml"}
    odd = config().model_copy(update={"team_label": 'we"ird'})
    assert _audit_teams(store, odd) == {"p1": "ml", "p2": "ml", "p3": "ml", "p4": "ml", "p5": "ml", "p6": "odd"}


@pytest.mark.service
def test_chargeback_by_qos_and_by_state(store: Store) -> None:
    """Hand, by qos: batch = p1 6 + p2 1 = 7 GPU-h / 14.00; high = 2 / 4.00; normal = 16 / 32.00.
    By state: Succeeded 7 / 14.00; COMPLETED 2 / 4.00; RUNNING 16 / 32.00. Totals 25 GPU-h / 50.00."""
    store.ingest(fleet(), seen_at_ts=int(W1.timestamp()))
    by_qos = cb.chargeback(store, config(), W0, W1, "qos")
    assert table(by_qos) == {"batch": (Decimal("7"), Decimal("14")), "high": (Decimal("2"), Decimal("4")),
                             "normal": (Decimal("16"), Decimal("32"))}
    assert {r["owner_type"] for r in by_qos} == {"qos"}
    by_state = cb.chargeback(store, config(), W0, W1, "state")
    assert table(by_state) == {"Succeeded": (Decimal("7"), Decimal("14")),
                               "COMPLETED": (Decimal("2"), Decimal("4")),
                               "RUNNING": (Decimal("16"), Decimal("32"))}
    tot = cb.totals(by_state)
    assert (tot["reserved_gpu_hours"], tot["reserved_cost"]) == (Decimal("25"), Decimal("50"))
    doc = strict_json(cb.to_json(by_qos, since=W0, until=W1, by="qos", period=None, currency="USD"))
    assert doc["by"] == "qos" and [r["owner"] for r in doc["rows"]] == ["batch", "high", "normal"]


def test_cli_by_choices_documented() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "chargeback.md").read_text()
    assert "--by account\\|namespace\\|team\\|user\\|cluster\\|qos\\|state" in doc
    assert set(cb.BY) == {"account", "namespace", "team", "user", "cluster", "qos", "state"}


def test_strict_parser_rejects_nan() -> None:
    """The helper itself can fail: json.dumps writes NaN by default, which strict JSON forbids."""
    with pytest.raises(ValueError, match="NaN"):
        strict_json(json.dumps({"x": math.nan}))


@pytest.mark.service
def test_state_query_uses_latest_state(store: Store) -> None:
    """j2 first seen RUNNING, then COMPLETED at T0+8h: by state it is COMPLETED with 4 x 2 = 8 GPU-h."""
    store.ingest(fleet()[3:], seen_at_ts=int((T0 + 7 * H).timestamp()))
    done = fleet()[3]
    done.state, done.end = "COMPLETED", T0 + 8 * H
    store.ingest([done], seen_at_ts=int((T0 + 9 * H).timestamp()))
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM allocations")).scalar() == 1
    assert table(cb.chargeback(store, config(), W0, W1, "state")) == {"COMPLETED": (Decimal("8"), Decimal("16"))}


# --- money is always finite --------------------------------------------------------------------------

@pytest.mark.parametrize("line, message", [
    ("[prices.models]\nh100 = nan", "prices.models.h100: Input should be a finite number"),
    ("[prices.mig]\n\"1g.10gb\" = inf", "prices.mig.1g.10gb: Input should be a finite number"),
    ("[prices]\ndefault = -1.5", "prices.default: Input should be greater than or equal to 0"),
    ("[prices.models]\na100 = 1e9", "prices.models.a100: Input should be less than or equal to 1000000"),
    ("[thresholds]\nidle_sm = nan", "thresholds.idle_sm: Input should be a finite number"),
])
def test_config_rejects_non_finite_negative_and_absurd_prices(tmp_path, line: str, message: str) -> None:
    from auditor.config import load
    from auditor.errors import ConfigError

    p = tmp_path / "site.toml"
    p.write_text(line + "\n")
    with pytest.raises(ConfigError) as exc:
        load(p)
    assert str(exc.value) == f"{p}: {message}"
    assert "\n" not in str(exc.value)


def quarantined(store: Store) -> list[tuple[str, str, str]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            "SELECT source, location, reason FROM quarantined_records ORDER BY location"))]


@pytest.mark.service
def test_bad_shares_and_gpu_counts_are_quarantined_at_ingest(store: Store) -> None:
    """A NaN share, a share of 3 and an infinite reservation are refused (quarantined with a reason); the
    good job (1 GPU x 2 h at 2.0 = 4.00) is stored and audited as usual."""
    from auditor.audit.run import run_audit
    from auditor.records import Reservation

    good = fleet()[2]
    nan = Allocation("c", "slurm", "nan", start=T0, end=T0 + H, gpus=[AllocatedGpu("n1", 1, share=math.nan)])
    big = Allocation("c", "slurm", "big", start=T0, end=T0 + H, gpus=[AllocatedGpu("n1", 2, share=3.0)])
    inf = Reservation("c", "inf", T0, T0 + H, nodes=["n1"], gpu_count=math.inf)
    stats = store.ingest([good, nan, big, inf], seen_at_ts=int(W1.timestamp()))
    assert stats.quarantined == 3 and stats.allocations == 1 and stats.reservations == 0
    got = quarantined(store)
    assert [(s, loc) for s, loc, _ in got] == [("slurm allocation", "big"), ("slurm reservation", "inf"),
                                               ("slurm allocation", "nan")]
    assert "share 3.0" in got[0][2] and "reserved GPU count inf" in got[1][2] and "share nan" in got[2][2]
    r = run_audit(store, config(), W0, W1)
    assert table(cb.chargeback(store, config(), W0, W1, "account", run_id=r.run_id)) == {
        "physics": (Decimal("2"), Decimal("4"))}


@pytest.mark.service
def test_one_corrupt_allocation_never_fails_the_audit_and_json_is_strict(store: Store, store_url: str,
                                                                         tmp_path) -> None:
    """An old store holds a corrupt share (NaN on PostgreSQL; 1e306 on SQLite, which stores no NaN, so its
    reserved seconds overflow to inf). The audit succeeds, refuses that one allocation (quarantined, no
    usage, no findings) and bills the rest: physics j1 2 GPU-h + j2 16 GPU-h = 18 GPU-h, 36.00; vision
    6 / 12.00; ml 1 / 2.00 (total 25 / 50.00). `--json audit` and `chargeback --format json` are strict JSON."""
    from click.testing import CliRunner

    from auditor.cli import main
    from auditor.records import GpuInventory

    store.ingest([*fleet(), Allocation("c", "slurm", "bad", account="chem", start=T0, end=T0 + H,
                                       gpus=[AllocatedGpu("n9", 0)]), GpuInventory("c", "n9", 0, "h100")],
                 seen_at_ts=int(W1.timestamp()))
    corrupt = "'NaN'" if store.engine.dialect.name == "postgresql" else "1e306"
    with store.engine.begin() as conn:
        conn.execute(text(f"UPDATE allocated_gpus SET share = {corrupt} WHERE allocation_id = "
                          "(SELECT id FROM allocations WHERE external_id = 'bad')"))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nurl = "{store_url}"\n[prices]\ndefault = 2.0\n[[teams]]\nname = "ml"\n'
                   'namespaces = ["ns-ml"]\n[[teams]]\nname = "phys"\naccounts = ["physics"]\n')
    since, until = W0.isoformat(), W1.isoformat()
    res = CliRunner().invoke(main, ["-c", str(cfg), "--json", "audit", "--since", since, "--until", until])
    assert res.exit_code == 0, res.output
    summary = strict_json(res.stdout)
    assert summary["refused_allocations"] == 1
    assert [(s, loc) for s, loc, _ in quarantined(store)] == [(f"audit run {summary['run_id']}",
                                                               f"allocation {_id(store, 'bad')} (bad)")]
    res = CliRunner().invoke(main, ["-c", str(cfg), "chargeback", "--since", since, "--until", until, "--by",
                                    "team", "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = strict_json(res.stdout)
    assert {r["owner"]: (r["reserved_gpu_hours"], r["reserved_cost"]) for r in doc["rows"]} == {
        "ml": (1, 2), "phys": (18, 36), "vision": (6, 12)}
    assert (doc["totals"]["reserved_gpu_hours"], doc["totals"]["reserved_cost"]) == (25, 50)


def _id(store: Store, ext: str) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT id FROM allocations WHERE external_id = :e"), {"e": ext}).scalar())


def test_jsonsafe_writes_no_nan_tokens() -> None:
    from auditor.jsonsafe import dumps

    doc = strict_json(dumps({"a": math.nan, "b": [math.inf, 1.5], "c": Decimal("NaN"), "d": -math.inf}))
    assert doc == {"a": None, "b": [None, 1.5], "c": None, "d": None}


@pytest.mark.service
def test_json_columns_store_no_nan(store: Store) -> None:
    """A NaN that reaches a JSON column (evidence, a run summary) is stored as null: PostgreSQL's json type
    rejects the NaN token (the whole audit failed on it), SQLite would keep text no strict parser reads."""
    from sqlalchemy import insert, select

    from auditor.store import schema

    t = schema.audit_runs
    with store.begin() as conn:
        rid = conn.execute(insert(t).values(started_ts=1, since_ts=0, until_ts=1, status="ok", what_if=False,
                                            summary={"idle_cost": math.nan, "x": [math.inf, 2.0]})
                           ).inserted_primary_key[0]
    with store.engine.connect() as conn:
        got = conn.execute(select(t.c.summary).where(t.c.id == rid)).scalar()
        raw = conn.execute(text("SELECT CAST(summary AS TEXT) FROM audit_runs WHERE id = :i"), {"i": rid}).scalar()
    assert got == {"idle_cost": None, "x": [None, 2.0]}
    strict_json(raw)
