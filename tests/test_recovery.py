"""How fast training comes back (issue 48 §5; auditor/audit/goodput.py ``recovery``, docs/definitions.md
"Goodput"): the hours from a failed run's end to the next run of the same job computing again, per job and
team, beside the useful-time share; on SQLite and PostgreSQL, and the demo's job 1050, by hand."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_findings_extra import IDLE, T0, W0, W1, WORK, job, run

from auditor.audit.run import run_audit
from auditor.cli import main
from auditor.config import Config, PriceCard, Team, Thresholds
from auditor.config import load as load_config
from auditor.records import AllocatedGpu
from auditor.report.context import build_context
from auditor.store.engine import Store

H = timedelta(hours=1)


def cfg() -> Config:
    return Config(prices=PriceCard(default=2.0), thresholds=Thresholds(),
                  teams=[Team(name="ml", accounts=["a1"]), Team(name="bio", accounts=["a2"])])


def planted() -> list[Any]:
    """Job 10 (team ml, n1 GPU 0): a node failure at T0+1h; requeued, it starts at T0+2h, loads its checkpoint
    idle for 30 minutes (buckets 24-29), computes from T0+2h30 (bucket 30) and is preempted at T0+4h;
    the third run starts at T0+4h15 and computes at once (bucket 51), completing at T0+6h. Job 20 (team bio,
    n2 GPU 0) fails at T0+1h; its rerun starts at T0+1h and never computes (idle throughout): not back.
    Job 30 (bio) completes: no interruption."""
    return [
        job("10", [AllocatedGpu("n1", 0)], 1, start=T0, state="NODE_FAIL", account="a1", submit=T0),
        job("10", [AllocatedGpu("n1", 0)], 2, start=T0 + 2 * H, state="PREEMPTED", account="a1", submit=T0 + 2 * H),
        job("10", [AllocatedGpu("n1", 0)], 1.75, start=T0 + 4.25 * H, state="COMPLETED", account="a1",
            submit=T0 + 4.25 * H),
        *run("n1", 0, 0, 12, **WORK), *run("n1", 0, 24, 6, **IDLE), *run("n1", 0, 30, 18, **WORK),
        *run("n1", 0, 51, 21, **WORK),
        job("20", [AllocatedGpu("n2", 0)], 1, start=T0, state="FAILED", account="a2", submit=T0),
        job("20", [AllocatedGpu("n2", 0)], 1, start=T0 + H, state="COMPLETED", account="a2", submit=T0 + H),
        *run("n2", 0, 0, 12, **WORK), *run("n2", 0, 12, 12, **IDLE),
        job("30", [AllocatedGpu("n3", 0)], 2, start=T0, state="COMPLETED", account="a2"),
    ]


# By hand: job 10's node failure at T0+1h -> its next run computes at T0+2h30: 1.5 h back (1.0 h waiting to
# start, 0.5 h starting up); its preemption at T0+4h -> computing at T0+4h15 (bucket 51 = 255 min): 0.25 h
# (0.25 waiting, 0 starting up). Mean (1.5 + 0.25) / 2 = 0.875, median the same, longest 1.5, total 1.75.
# Job 20: its FAILED run ends at T0+1h, the rerun never computes: 1 interruption, 0 back, no figure.
# Useful time (goodput): ml reserved 1 + 2 + 1.75 = 4.75, lost 1 + 2 = 3: 1.75 / 4.75; bio reserved 1 + 1 + 2
# = 4, lost 1: 3 / 4.
def test_recovery_by_job_and_team(store: Store) -> None:
    store.ingest(planted())
    c = cfg()
    rid = run_audit(store, c, W0, W1).run_id
    r = build_context(store, c, rid)["goodput"]["recovery"]
    assert (r["interruptions"], r["back"]) == (3, 2)
    assert r["mean_recovery_hours"] == pytest.approx(0.875) and r["median_recovery_hours"] == pytest.approx(0.875)
    j10 = next(j for j in r["jobs"] if j["job"] == "10")
    assert [(i["state"], i["wait_hours"], i["startup_hours"], i["recovery_hours"]) for i in j10["interruptions"]] == [
        ("NODE_FAIL", pytest.approx(1.0), pytest.approx(0.5), pytest.approx(1.5)),
        ("PREEMPTED", pytest.approx(0.25), pytest.approx(0.0), pytest.approx(0.25))]
    assert (j10["max_recovery_hours"], j10["recovery_hours"]) == (pytest.approx(1.5), pytest.approx(1.75))
    j20 = next(j for j in r["jobs"] if j["job"] == "20")
    assert (j20["count"], j20["back"], j20["max_recovery_hours"]) == (1, 0, None)
    assert j20["interruptions"][0]["recovery_hours"] is None
    teams = {t["team"]: t for t in r["teams"]}
    assert teams["ml"] == pytest.approx({"team": "ml", "interruptions": 2, "back": 2, "jobs": 1,
                                         "mean_recovery_hours": 0.875, "median_recovery_hours": 0.875,
                                         "max_recovery_hours": 1.5, "recovery_hours": 1.75,
                                         "useful_share": 1.75 / 4.75})
    assert (teams["bio"]["interruptions"], teams["bio"]["back"], teams["bio"]["useful_share"]) == (
        1, 0, pytest.approx(0.75))


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("demo")
    res = CliRunner().invoke(main, ["--json", "demo", "--out", str(out), "--now", "2026-11-29T00:00"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), out


def test_demo_job_1050_comes_back_slowly(demo: tuple[dict, Path]) -> None:
    """By hand (auditor/demo.py REQUEUED_RUNS): job 1050's node failure ends its first run at hour 82, the
    requeued run starts at hour 84 and computes at once: 2 h back; the preemption at hour 94, the third run
    starts at hour 100 (the node drained 95-99) and computes at once: 6 h back. Mean and median 4 h, the
    longest 6 h, total 8 h; team llm beside its useful time (1528 - 112) / 1528 (tests/test_goodput.py)."""
    data, out = demo
    c = load_config(out / "demo.toml")
    store = Store.open(c.store.resolved_url())
    r = build_context(store, c, data["run_id"])["goodput"]["recovery"]
    assert (r["interruptions"], r["back"], r["mean_recovery_hours"]) == (2, 2, pytest.approx(4.0))
    (j,) = r["jobs"]
    assert (j["job"], j["max_recovery_hours"], j["recovery_hours"]) == ("1050", pytest.approx(6.0),
                                                                      pytest.approx(8.0))
    assert [i["recovery_hours"] for i in j["interruptions"]] == [pytest.approx(2.0), pytest.approx(6.0)]
    (t,) = r["teams"]
    assert (t["team"], t["useful_share"]) == ("llm", pytest.approx((1528 - 112) / 1528))
    rid = data["run_id"]
    txt = (out / "reports" / f"report-{rid}.txt").read_text()
    assert "Back after a failure: 2 interruptions, mean 4.0 h, median 4.0 h" in txt
    assert "hpc job 1050 (llama-finetune, erin): 2 interruptions, back after 2.0 h, 6.0 h" in txt
    md = (out / "reports" / f"report-{rid}.md").read_text()
    assert "| llm | 2 | 2 | 4.0 | 4.0 | 6.0 | 93% |" in md
    html = (out / "reports" / f"report-{rid}.html").read_text()
    assert 'id="goodput-recovery"' in html and "<strong>4.0 h</strong>" in html
    doc = json.loads((out / "reports" / f"report-{rid}.json").read_text())
    assert doc["goodput"]["recovery"]["jobs"][0]["recovery_hours"] == pytest.approx(8.0)
    store.engine.dispose()


def test_teams_page_shows_the_reports_recovery(store: Store) -> None:
    """The web teams page (and /api/teams) shows the report's recovery figures, computed by the same function;
    a scoped viewer gets none (the figures are the fleet's)."""
    from starlette.testclient import TestClient

    from auditor.web.app import create_app

    store.ingest(planted())
    c = cfg()
    rid = run_audit(store, c, W0, W1).run_id
    client = TestClient(create_app(store, c))
    api = client.get("/api/teams").json()
    assert api["recovery"] == json.loads(json.dumps(build_context(store, c, rid)["goodput"]["recovery"]))
    html = client.get("/teams").text
    assert 'id="recovery-teams"' in html and "0.9 h" in html and "not back" in html
    assert "1.5 h" in html  # job 10's node failure: back after 1.5 h
