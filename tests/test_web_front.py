"""The web front page answers who (top teams, users and allocations by idle cost, a user's every allocation)
and every page says which audit run it shows: the latest weekly audit, which a chargeback run made
afterwards never replaces, or the run chosen in the picker. SQLite and PostgreSQL, numbers by hand."""

from __future__ import annotations

import json
import re
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from auditor.audit.run import run_audit
from auditor.config import Config, Team, WebConfig
from auditor.records import AllocatedGpu, Allocation
from auditor.report.chargeback import chargeback, totals
from auditor.web.app import create_app

sys.path.insert(0, str(Path(__file__).parent))
from test_jobview import bk  # noqa: E402
from test_report import T0  # noqa: E402
from test_web import world_records  # noqa: E402

WEEK = timedelta(days=7)
BUSY = dict(sm_active=0.9, gpu_util=1.0, tensor_active=0.3, dram_active=0.4, fb_used_mib=40000.0, power_w=400.0)


def front_records() -> list:
    """tests/test_web.py's world (dana's job 501: 8 GPU-h, 6 idle; erin's notebook: 2 GPU-h, 2 idle;
    mallory's job 666: 1 GPU-h, 1 idle) plus dana's busy job 502 (1 GPU x 1 h, no finding): 12 reserved,
    9 idle GPU-hours; at 2.0 per GPU-hour 24.00 reserved and 18.00 idle cost."""
    recs = world_records()
    recs.append(Allocation("c1", "slurm", "502", name="busy-run", user="dana", account="acct-ml",
                           start=T0 + timedelta(hours=5), end=T0 + timedelta(hours=6), gpus=[AllocatedGpu("g1", 0)]))
    recs += bk("g1", 0, T0 + timedelta(hours=5), 1, **BUSY)
    return recs


@pytest.fixture
def weekly(store):  # noqa: ANN001, ANN201
    """The world, audited as the weekly audit does: a window of report.days (7) ending T0 + 1 day; teams ml
    (account acct-ml: dana) and nb (namespace team-ns: erin), mallory's acct-x unmapped."""
    store.ingest(front_records())
    cfg = Config(teams=[Team(name="ml", accounts=["acct-ml"]), Team(name="nb", namespaces=["team-ns"])])
    rid = run_audit(store, cfg, T0 + timedelta(days=1) - WEEK, T0 + timedelta(days=1)).run_id
    return store, rid


def client(store, web: WebConfig | None = None) -> TestClient:  # noqa: ANN001
    return TestClient(create_app(store, Config(web=web or WebConfig())))


def test_chargeback_never_changes_the_run_the_pages_show(weekly) -> None:  # noqa: ANN001
    """`gpu-audit chargeback` audits its own window (here one as long as a week, so the window's length
    alone could not tell them apart): every page still shows the weekly audit and says so."""
    store, rid = weekly
    cfg = Config()
    # the chargeback window starts an hour later: 501 keeps 2 GPUs x 3 h, the notebook 1 h, 666 nothing, 502
    # 1 h: 8 reserved GPU-hours; idle 501's GPU 0 2 h + GPU 1 3 h + the notebook 1 h = 6, 12.00
    since = T0 + timedelta(hours=1)
    rows = chargeback(store, cfg, since, since + WEEK, "user")
    cb_run = rows[0]["audit_run_id"]
    assert cb_run != rid and float(totals(rows)["reserved_gpu_hours"]) == pytest.approx(8.0)
    assert float(totals(rows)["idle_cost"]) == pytest.approx(12.0)
    c = client(store)
    ov = c.get("/api/overview").json()
    assert ov["run"]["id"] == rid and ov["run"]["kind"] == "weekly audit" and not ov["run"]["chosen"]
    assert ov["headline"]["reserved_gpu_hours"] == pytest.approx(12.0)
    assert ov["headline"]["idle_cost"] == pytest.approx(18.0)
    page = c.get("/").text
    assert re.search(rf'Showing audit run <strong id="run-id">{rid}</strong> \(weekly audit,', page)
    assert ">USD 18.00<" in page
    for path in ("/teams", "/users", "/clusters", "/findings", "/chargeback"):
        assert c.get("/api" + path).json()["run"]["id"] == rid, path
        assert f'<strong id="run-id">{rid}</strong>' in c.get(path).text, path
    assert c.get("/api/users").json()["totals"]["idle_cost"] == pytest.approx(18.0)
    assert float(c.get("/api/chargeback").json()["totals"]["reserved_cost"]) == pytest.approx(24.0)
    # the picker offers both and shows the chargeback run when asked, saying it was chosen
    kinds = {r["id"]: r["kind"] for r in ov["runs"]}
    assert kinds == {rid: "weekly audit", cb_run: "chargeback"}
    chosen = c.get(f"/api/overview?run={cb_run}").json()
    assert chosen["run"]["chosen"] and chosen["headline"]["reserved_gpu_hours"] == pytest.approx(8.0)
    body = c.get(f"/findings?run={cb_run}").text
    assert f'<option value="{cb_run}" selected>' in body and "as chosen" in body
    assert f'name="run" value="{cb_run}"' in body  # the filter form keeps the chosen run
    # the monthly chargeback of the daemon is no weekly audit either
    run_audit(store, cfg, T0 - timedelta(days=15), T0 + timedelta(days=15), purpose="chargeback")
    assert client(store).get("/api/overview").json()["run"]["id"] == rid


def test_an_audit_of_another_window_does_not_replace_the_weekly_one(weekly) -> None:  # noqa: ANN001
    """A one-day audit afterwards (an ad hoc look) is offered in the picker but not shown by default; with
    no weekly run at all the latest audit is shown and the page says why."""
    store, rid = weekly
    day = run_audit(store, Config(), T0, T0 + timedelta(days=1)).run_id
    c = client(store)
    ov = c.get("/api/overview").json()
    assert ov["run"]["id"] == rid and {r["id"]: r["kind"] for r in ov["runs"]}[day] == "audit of 1 day"
    # a site whose weekly window is 30 days: none of these is weekly; the latest audit that is no chargeback
    monthly = TestClient(create_app(store, Config(report={"days": 30})))
    ov = monthly.get("/api/overview").json()
    assert ov["run"]["id"] == day and "none covers report.days (30 days)" in ov["run"]["why"]


def test_front_page_who_by_hand(weekly) -> None:  # noqa: ANN001
    store, rid = weekly
    c = client(store)
    who = c.get("/api/overview").json()["who"]
    # idle cost per user: dana 501's 6 idle GPU-h x 2.0 = 12 (502 adds none), erin 2 x 2.0 = 4, mallory 1 x 2.0
    assert [(r["user_name"], r["idle_cost"]) for r in who["users"]["rows"]] == [("dana", 12.0), ("erin", 4.0),
                                                                                 ("mallory", 2.0)]
    assert [(r["team"], r["idle_cost"]) for r in who["teams"]["rows"]] == [("ml", 12.0), ("nb", 4.0),
                                                                           ("(unmapped)", 2.0)]
    # the allocations, each once: 501 (6 idle GPU-h, two findings), the notebook (2), 666 (1); 502 idled none
    assert [(r["job_id"], r["idle_gpu_hours"], r["idle_cost"]) for r in who["jobs"]["rows"]] == [
        ("501", 6.0, 12.0), ("uid-nb", 2.0, 4.0), ("666", 1.0, 2.0)]
    # 501's GPU 0 idles its last 2 h (an idle episode, an idle GPU), GPU 1 is a mirage
    assert who["jobs"]["rows"][0]["kinds"] == ["idle_episode", "idle_gpus", "util_mirage"]
    assert who["jobs"]["rows"][0]["advice"]
    assert who["user_names"] == ["dana", "erin", "mallory"]
    assert c.get("/api/overview").json()["who"] == who  # the app's ranking of this run, kept, reads the same
    page = c.get("/").text
    for table in ("top-teams", "top-users", "top-jobs"):
        assert f'id="{table}"' in page
    top_users = page.split('id="top-users"')[1].split("</table>")[0]
    assert re.findall(r'data-label="Idle cost">([^<]+)<', top_users) == ["USD 12.00", "USD 4.00", "USD 2.00"]


def test_my_jobs_lists_every_allocation_not_only_findings(weekly) -> None:  # noqa: ANN001
    store, rid = weekly
    c = client(store)
    mine = c.get("/api/overview?user=dana").json()["mine"]
    # dana: 501 (8 reserved, 6 idle, 12.00, findings) and 502 (1 reserved, 0 idle, no finding)
    assert [(r["job_id"], r["reserved_gpu_hours"], r["idle_cost"]) for r in mine["rows"]] == [("501", 8.0, 12.0),
                                                                                              ("502", 1.0, 0.0)]
    assert mine["rows"][1]["kinds"] == [] and mine["rows"][0]["kinds"] and mine["rows"][0]["advice"]
    assert (mine["total"], mine["totals"]["reserved_gpu_hours"], mine["totals"]["idle_cost"]) == (2, 9.0, 12.0)
    page = c.get("/?user=dana").text
    assert "busy-run" in page and "Nothing: no finding." in page and 'id="mine-jobs"' in page
    assert re.search(r'id="mine-reserved">9\.0<', page) and re.search(r'id="mine-idle-cost">USD 12\.00<', page)
    assert c.get("/api/overview").json()["mine"] is None  # an admin names a user first
    assert c.get("/api/overview?user=nobody").json()["mine"]["rows"] == []
    # behind the auth proxy a user sees their own jobs, whatever ?user= says, and no one else's rankings
    web = WebConfig(user_header="X-WEBAUTH-USER")
    erin = client(store, web).get("/api/overview?user=dana", headers={"X-WEBAUTH-USER": "erin"}).json()
    assert erin["mine"]["user"] == "erin" and [r["job_id"] for r in erin["mine"]["rows"]] == ["uid-nb"]
    assert erin["who"]["teams"] is None and erin["who"]["users"] is None
    assert [r["user"] for r in erin["who"]["jobs"]["rows"]] == ["erin"]
    assert erin["who"]["user_names"] == ["erin"]


def test_trend_says_how_to_get_a_second_bar(weekly) -> None:  # noqa: ANN001
    store, rid = weekly
    c = client(store)
    ov = c.get("/api/overview").json()
    # the window before [T0 - 6 days, T0 + 1 day): [T0 - 13 days, T0 - 6 days); T0 is 2026-11-16
    assert ov["earlier"] == {"since": "2026-11-03T00:00Z", "until": "2026-11-10T00:00Z"}
    assert "gpu-audit audit --since 2026-11-03T00:00Z --until 2026-11-10T00:00Z" in c.get("/").text
    run_audit(store, Config(), T0 - timedelta(days=13), T0 - timedelta(days=6))
    ov = c.get("/api/overview").json()
    assert ov["run"]["id"] == rid and len(ov["trend"]) == 2 and ov["earlier"] is None
    assert c.get("/").text.count("<rect") >= 2  # a bar per window


def test_front_page_escapes_names_and_parameters(weekly) -> None:  # noqa: ANN001
    """mallory's job's 3,000-character hostile name and a hostile ?user= reach the front page as text."""
    store, _ = weekly
    c = client(store)
    for path in ("/", "/?user=mallory", "/?user=%3Cscript%3Ealert(2)%3C/script%3E%22%3E&run=1"):
        body = c.get(path).text
        assert "<script>" not in body and "x" * 400 not in body and "\u202e" not in body, path
        assert "<script" not in body.lower(), path
    body = c.get("/?user=mallory").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and "-tail" in body
    hostile = c.get("/?user=%3Cscript%3Ealert(2)%3C/script%3E%22%3E").text
    assert 'value="&lt;script&gt;alert(2)&lt;/script&gt;&#34;&gt;"' in hostile


def test_report_and_notify_default_to_the_run_the_pages_show(weekly, tmp_path: Path) -> None:  # noqa: ANN001
    """`gpu-audit report` (and `notify`) without --run chose the newest run: after `chargeback`, the weekly
    report silently became the chargeback window's (8 reserved GPU-hours instead of 12). Now the CLI takes
    the run the web pages show (report.context.shown_run)."""
    from conftest import run_cli

    store, rid = weekly
    since = T0 + timedelta(hours=1)
    cb_run = chargeback(store, Config(), since, since + WEEK, "user")[0]["audit_run_id"]
    assert cb_run > rid
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nurl = "{store.engine.url.render_as_string(hide_password=False)}"\n'
                   '[[teams]]\nname = "ml"\naccounts = ["acct-ml"]\n')
    out = tmp_path / "out"
    res = run_cli("-c", str(cfg), "report", "--format", "json", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert [f.name for f in out.glob("report-*.json")] == [f"report-{rid}.json"]
    data = json.loads((out / f"report-{rid}.json").read_text())
    assert data["headline"]["reserved_gpu_hours"] == pytest.approx(12.0)
    res = run_cli("-c", str(cfg), "report", "--format", "json", "--out", str(tmp_path / "cb"), "--run", str(cb_run))
    assert res.returncode == 0, res.stderr
    data = json.loads((tmp_path / "cb" / f"report-{cb_run}.json").read_text())
    assert data["headline"]["reserved_gpu_hours"] == pytest.approx(8.0)
