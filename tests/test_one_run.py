"""Issue 44 "One figure, one run": every page and command shows the run the one rule picks
(:func:`auditor.report.context.shown_run`): the report, the overview, the findings, ``gpu-audit job`` and the
web allocation page. An ad-hoc audit of a shorter window made after the weekly one never silently replaces it
on any of them; ``?run=`` / ``--run`` picks another run on each; an unknown run is a 404 or a one-line error;
every page says which run it shows.

The demo's week (run A) and then ``gpu-audit audit`` of its last 12 hours (run B, "audit of 0.5 days", the same
end). The inference pod triton-0 (2 GPUs the whole week) is in both: 336 reserved GPU-h in A, 24 in B; before
the fix its page and ``gpu-audit job`` showed B (the newest run that judged it) while the report showed A.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import text
from starlette.testclient import TestClient

from auditor.cli import main
from auditor.config import load
from auditor.report.context import build_context, shown_run
from auditor.store.engine import Store
from auditor.web.app import create_app


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("one-run") / "demo"
    res = CliRunner().invoke(main, ["--json", "demo", "--out", str(out), "--now", "2026-11-29T00:00"])
    assert res.exit_code == 0, res.output
    weekly = int(json.loads(res.stdout)["run_id"])
    toml = str(out / "demo.toml")
    res = CliRunner().invoke(main, ["-c", toml, "--json", "audit", "--since", "2026-11-28T12:00", "--until",
                                    "2026-11-29T00:00"])
    assert res.exit_code == 0, res.output
    adhoc = int(json.loads(res.stdout)["run_id"])
    assert adhoc > weekly
    cfg = load(out / "demo.toml")
    store = Store.open(cfg.store.resolved_url())
    with store.engine.connect() as conn:
        aid = conn.execute(text("SELECT id FROM allocations WHERE external_id = '7e1f-triton'")).scalar()
    return {"toml": toml, "cfg": cfg, "store": store, "weekly": weekly, "adhoc": adhoc, "aid": int(aid)}


def reserved(v: dict[str, Any]) -> float:
    return float(v["usage"]["reserved_gpu_hours"])


def test_every_surface_shows_the_weekly_run_after_an_adhoc_audit(two_runs: dict[str, Any]) -> None:
    store, cfg, weekly, aid = two_runs["store"], two_runs["cfg"], two_runs["weekly"], two_runs["aid"]
    assert shown_run(store, cfg)["id"] == weekly
    assert build_context(store, cfg, weekly)["run"]["id"] == weekly
    client = TestClient(create_app(store, cfg))
    for page in ("overview", "findings", "teams", "services", "chargeback"):
        assert client.get(f"/api/{page}").json()["run"]["id"] == weekly, page
    # the allocation page and `gpu-audit job`: the report's run, and they say so (it read the ad-hoc run 2)
    api = client.get(f"/api/allocation/{aid}").json()
    assert api["run_id"] == weekly and reserved(api) == pytest.approx(336.0), (api["run_id"], reserved(api))
    assert api["run"]["kind"] == "weekly audit" and not api["run"]["chosen"]
    html = client.get(f"/allocation/{aid}").text
    assert f'<strong id="run-id">{weekly}</strong>' in html and "weekly audit" in html
    res = CliRunner().invoke(main, ["-c", two_runs["toml"], "--json", "job", "k8s:7e1f-triton"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got["run_id"] == weekly and reserved(got) == pytest.approx(336.0)
    res = CliRunner().invoke(main, ["-c", two_runs["toml"], "job", "k8s:7e1f-triton"])
    assert f"figures from audit run {weekly} (weekly audit" in res.output, res.output


def test_run_picks_another_run_on_every_surface_and_an_unknown_one_is_refused(two_runs: dict[str, Any]) -> None:
    store, cfg, adhoc, aid = two_runs["store"], two_runs["cfg"], two_runs["adhoc"], two_runs["aid"]
    client = TestClient(create_app(store, cfg))
    api = client.get(f"/api/allocation/{aid}?run={adhoc}").json()
    assert api["run_id"] == adhoc and api["run"]["chosen"]
    assert reserved(api) == pytest.approx(24.0)  # 2 GPUs x the last 12 h
    assert client.get(f"/api/overview?run={adhoc}").json()["run"]["id"] == adhoc
    res = CliRunner().invoke(main, ["-c", two_runs["toml"], "--json", "job", "k8s:7e1f-triton", "--run", str(adhoc)])
    assert res.exit_code == 0 and json.loads(res.stdout)["run_id"] == adhoc
    for path in (f"/allocation/{aid}?run=99", f"/api/allocation/{aid}?run=99", "/?run=99", "/findings?run=99",
                 f"/allocation/{aid}?run=x"):
        r = client.get(path)
        assert r.status_code == 404, (path, r.status_code)
    assert "no audit run 99" in client.get(f"/api/allocation/{aid}?run=99").json()["error"]
    res = CliRunner().invoke(main, ["-c", two_runs["toml"], "job", "k8s:7e1f-triton", "--run", "99"])
    assert res.exit_code != 0 and "no audit run 99" in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1, res.output


def test_chargeback_without_a_window_is_the_reports_window_and_says_it(two_runs: dict[str, Any]) -> None:
    """A default ``chargeback`` ended "now" (2,527.857 GPU-h beside the report's 2,530.0): it takes the window of
    the run the report shows, that run's figures, and prints the window used."""
    store, cfg, weekly = two_runs["store"], two_runs["cfg"], two_runs["weekly"]
    res = CliRunner().invoke(main, ["-c", two_runs["toml"], "chargeback", "--by", "team", "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    ctx = build_context(store, cfg, weekly)
    assert float(doc["totals"]["reserved_gpu_hours"]) == pytest.approx(ctx["headline"]["reserved_gpu_hours"])
    assert (doc["period_start"], doc["period_end"]) == ("2026-11-22T00:00:00+00:00", "2026-11-29T00:00:00+00:00")
    assert f"chargeback window: 2026-11-22T00:00:00+00:00 to 2026-11-29T00:00:00+00:00 (audit run {weekly}, " \
           "weekly audit" in res.stderr, res.stderr


def test_the_front_page_and_the_email_rank_the_same_actions(two_runs: dict[str, Any]) -> None:
    """The email's first action (the idle reservation team-b-hackathon, USD 768) was not on the web front page:
    both now show the rows of one computation (:func:`auditor.report.context.actions_section`)."""
    from auditor.report.render import render_text

    store, cfg, weekly = two_runs["store"], two_runs["cfg"], two_runs["weekly"]
    ctx = build_context(store, cfg, weekly)
    want = ctx["actions"]["rows"]
    assert want and want[0]["scope"] == "reservation" and want[0]["cost"] == pytest.approx(768.0)
    client = TestClient(create_app(store, cfg))
    got = client.get("/api/overview").json()["actions"]
    assert [(r["scope"], r["name"], r["cost"]) for r in got["rows"]] == [(r["scope"], r["name"], r["cost"])
                                                                        for r in want]
    html = client.get("/").text
    assert 'id="actions"' in html and "team-b-hackathon" in html and "USD 768.00" in html
    # the weekly email is the report rendered from the same context: its first action is the page's first
    assert "team-b-hackathon" in render_text(ctx).split("Who idled")[0]


def test_findings_page_names_each_money_column_for_what_it_holds(two_runs: dict[str, Any]) -> None:
    """The web findings page's "Idle cost" column held money that is not idle (failed_restarts' lost runs
    beside 0.0 idle GPU-h, request_hygiene restating its jobs'): idle cost only for kinds that add to idle
    totals, the rest in a column of its own that says what it is; the total adds idle money only, once."""
    store, cfg = two_runs["store"], two_runs["cfg"]
    client = TestClient(create_app(store, cfg))
    api = client.get("/api/findings?kind=failed_restarts").json()
    assert api["rows"], api
    for r in api["rows"]:
        assert r["idle_cost"] is None and r["other_cost"] == r["cost"] > 0
        assert r["money_is"] == "lost to failed runs"
    assert api["totals"]["cost"] == pytest.approx(0.0) or api["totals"]["counted_kinds"] == ["failed_restarts"]
    every = client.get("/api/findings").json()
    for r in every["rows"]:
        assert (r["idle_cost"] is None) == (r["other_cost"] is not None), r["kind"]
    html = client.get("/findings?kind=failed_restarts").text
    assert "Other money (not idle)" in html and "lost to failed runs" in html
    cells = html.split('data-label="Idle cost">')[1:]
    assert cells and all(c.startswith("&ndash;") or c.startswith("–") for c in cells), cells[0][:40]


def test_one_allocations_figure_reads_the_same_on_every_surface(two_runs: dict[str, Any]) -> None:
    """triton-0's reserved GPU-hours and cost (336.0 GPU-h on the report, "14.0 reserved GPU-h ... audit run 4"
    on its page before the fix): the report's run's own row, the allocation page and its API, and ``gpu-audit
    job`` all show the weekly run's figure."""
    store, cfg, aid = two_runs["store"], two_runs["cfg"], two_runs["aid"]
    client = TestClient(create_app(store, cfg))
    api = client.get(f"/api/allocation/{aid}").json()
    cost = api["reserved_cost"]
    assert reserved(api) == pytest.approx(336.0) and cost > 0
    with store.engine.connect() as conn:  # the report's run's own row of it
        ua = conn.execute(text("SELECT reserved_s, reserved_cost FROM usage_allocation WHERE run_id = :r AND "
                               "allocation_id = :a"), {"r": two_runs["weekly"], "a": aid}).one()
    assert ua.reserved_s / 3600 == pytest.approx(336.0) and ua.reserved_cost == pytest.approx(cost)
    money = f"{cfg.prices.currency} {cost:,.2f}"
    assert money in client.get(f"/allocation/{aid}").text
    res = CliRunner().invoke(main, ["-c", two_runs["toml"], "job", "k8s:7e1f-triton"])
    assert "reserved 336.0 GPU-h" in res.output and money in res.output, res.output


def test_the_jobs_list_takes_each_allocations_figures_from_the_same_rule(two_runs: dict[str, Any]) -> None:
    """``gpu-audit jobs`` showed each allocation from the newest run that judged it: bob's debug-shell (job
    1030, 1 GPU, 06:00-16:00 on the week's last day) read 4.0 GPU-h (the ad-hoc run's 12:00-16:00), the report
    10.0. Now the weekly run's, as the report and its page."""
    res = CliRunner().invoke(main, ["-c", two_runs["toml"], "--json", "jobs", "--user", "bob", "--since",
                                    "2026-11-20", "--until", "2026-12-05"])
    assert res.exit_code == 0, res.output
    row = next(r for r in json.loads(res.stdout)["jobs"] if r["id"] == "1030")
    assert row["run_id"] == two_runs["weekly"] and row["reserved_gpu_hours"] == pytest.approx(10.0)


def test_the_rule_per_allocation_on_both_engines(store: Store) -> None:
    """The same rule on SQLite and PostgreSQL, without the demo: job 7 (2 GPUs, T0 to T0 + 10 h) audited in a
    week (run A) and then in an ad-hoc audit of its last 4 hours (run B, a newer run ending later): its view,
    the jobs list and the picker show A (20 GPU-h), ``run_id`` B shows B (8 GPU-h), an unknown run is refused
    in one line."""
    from datetime import timedelta

    from test_findings_extra import T0, WORK, job, run

    from auditor.audit.run import run_audit
    from auditor.config import Config
    from auditor.errors import GpuAuditError
    from auditor.records import AllocatedGpu
    from auditor.report.jobview import job_view, jobs_list

    cfg = Config()
    store.ingest([job("7", [AllocatedGpu("n1", 0), AllocatedGpu("n1", 1)], 10, user="ed"),
                  *run("n1", 0, 0, 120, **WORK), *run("n1", 1, 0, 120, **WORK)])
    weekly = run_audit(store, cfg, T0 - timedelta(days=6), T0 + timedelta(days=1)).run_id
    adhoc = run_audit(store, cfg, T0 + timedelta(hours=6), T0 + timedelta(days=1, hours=1)).run_id
    v = job_view(store, cfg, "c:7")
    assert (v["run_id"], v["usage"]["reserved_gpu_hours"]) == (weekly, pytest.approx(20.0))
    assert v["run"]["kind"] == "weekly audit" and "judged this allocation" in v["run"]["why"]
    b = job_view(store, cfg, "c:7", run_id=adhoc)
    assert (b["run_id"], b["usage"]["reserved_gpu_hours"]) == (adhoc, pytest.approx(8.0))
    rows = jobs_list(store, cfg, user="ed", since=T0 - timedelta(days=1), until=T0 + timedelta(days=1))
    assert [(r["run_id"], r["reserved_gpu_hours"]) for r in rows] == [(weekly, pytest.approx(20.0))]
    with pytest.raises(GpuAuditError, match="no audit run 99"):
        job_view(store, cfg, "c:7", run_id=99)
