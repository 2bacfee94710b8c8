"""What the ecosystem reads from gpu-audit: the Grafana dashboard (deploy/grafana/gpu-audit.json), the alert
rules (deploy/prometheus-alerts.yml) and the per-team idle budgets behind them.

The dashboard's every query runs against a REAL Prometheus (a process of this module's own, on a free loopback
port) scraping a REAL ``/metrics`` endpoint (the daemon's HealthServer) over the demo's store, and must return
data; the alert rules pass ``promtool check rules`` and their unit tests (``promtool test rules``); the budget
figures are checked against the demo's planted workloads by hand.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from conftest import need
from helpers import free_port

from auditor import config as config_mod
from auditor.cli import main
from auditor.daemon.health import HealthServer, Metrics
from auditor.daemon.pipeline import RunSummary, StepResult
from auditor.report import context as report
from auditor.report.budgets import team_budgets
from auditor.store.engine import Store

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "gpu-audit.json"
ALERTS = ROOT / "deploy" / "prometheus-alerts.yml"
ALERT_TESTS = ROOT / "deploy" / "prometheus-alerts.test.yml"
H = 3600.0


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, Any, int]:
    out = tmp_path_factory.mktemp("demo")
    res = CliRunner().invoke(main, ["--json", "demo", "--out", str(out), "--now", "2026-11-29T00:00"])
    assert res.exit_code == 0, res.output
    cfg = config_mod.load(out / "demo.toml")
    return Store.open(cfg.store.url), cfg, int(json.loads(res.stdout)["run_id"])


def test_budgets_follow_the_demo_workloads(demo: tuple[Store, Any, int]) -> None:
    """The demo gives research a budget of 24 GPU-hours a week and llm 200. Over the 7-day window, by hand:
    research's only idle time is its notebook pods, 1 GPU idle for 120 h on k8s and 1 for 72 h on the 2026 site
    (its other pods train or stream memory: no idle hours) -> 192.0 of 24.0, 800 %, over. llm is the hpc
    cluster's team-a account:
    util_mirage 1002 (2 GPUs x 48 h = 96), hung_collective 1004 (2 x 12 = 24) and the idle episode of 1001
    (8 GPUs x 3 h = 24), plus 12 h of idle GPUs counted inside 1003's 108 -> the report's team row, within
    its 200. platform has no budget and is not listed."""
    store, cfg, run_id = demo
    ctx = report.build_context(store, cfg, run_id)
    rows = {b["team"]: b for b in ctx["budgets"]}
    assert set(rows) == {"research", "llm"}
    r = rows["research"]
    # (and erin's notebook on a MIG slice of the 2026 site, idle by the stock counters: 96 h x 1/7)
    assert (round(r["idle_gpu_hours"], 6), round(r["budget_gpu_hours"], 6), r["over"]) == (
        round(192 + 96 / 7, 6), 24.0, True)
    assert round(r["share"], 6) == round((192 + 96 / 7) / 24, 6)
    assert rows["llm"]["budget_gpu_hours"] == pytest.approx(200.0) and not rows["llm"]["over"]
    # the budget row is the team table's own figure (one computation for both)
    team_row = next(t for t in ctx["teams"]["rows"] if t["team"] == "llm")
    assert rows["llm"]["idle_gpu_hours"] == team_row["idle_gpu_hours"]
    assert [b["team"] for b in ctx["budgets"]] == ["research", "llm"]  # worst share first
    with store.engine.connect() as conn:  # prorated: a 1-day window gets a seventh
        rows1 = team_budgets(cfg, report.usage_group_rows(conn, run_id, ["u.team"]), 86400)
    assert {b["team"]: round(b["budget_gpu_hours"], 6) for b in rows1} == {"research": round(24 / 7, 6),
                                                                          "llm": round(200 / 7, 6)}


def test_budgets_in_every_report_format(demo: tuple[Store, Any, int], tmp_path: Path) -> None:
    from auditor.report import render

    store, cfg, run_id = demo
    ctx = report.build_context(store, cfg, run_id)
    txt = render.render(ctx, "text")
    assert "IDLE BUDGETS" in txt and "research" in txt.split("IDLE BUDGETS", 1)[1].splitlines()[1]
    assert "research: OVER, idle 205.7 of a 24.0 GPU-h budget (857%)" in txt
    md = render.render(ctx, "md")
    assert "| research | 205.7 | 24.0 | 857% | OVER budget |" in md
    html = render.render(ctx, "html")
    assert 'id="budgets"' in html and "over budget" in html
    assert json.loads(render.render(ctx, "json"))["budgets"][0]["team"] == "research"


def _get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 (loopback test server)
        return json.loads(r.read())


@pytest.fixture(scope="module")
def scraped(demo: tuple[Store, Any, int], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus of this module's own scraping the daemon's /metrics over the demo store every second."""
    need(bool(shutil.which("prometheus")), "prometheus not installed (scripts/testbed-prometheus.sh installs it)")
    store, cfg, _run = demo
    metrics = Metrics(store, cfg)
    # a daemon that ran: one collect with a failed source, an audit, a failed report
    metrics.observe(RunSummary(steps=[
        StepResult("collect", False, 1.5, "x", {"sources": [{"cluster": "k8s", "source": "telemetry[0]:file",
                                                             "ok": False}]}),
        StepResult("audit", True, 12.0), StepResult("report", False, 0.4)]))
    server = HealthServer("127.0.0.1", 0, metrics, lambda: (True, {"status": "ok"})).start()
    d = tmp_path_factory.mktemp("prom")
    (d / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: gpu-audit\n    static_configs: [{{targets: ['127.0.0.1:{server.port}']}}]\n")
    port = free_port()
    proc = subprocess.Popen(["prometheus", f"--config.file={d / 'prometheus.yml'}",  # noqa: S603
                             f"--storage.tsdb.path={d / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=(d / "log").open("w"))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:  # ready, and at least 4 scrapes in (rate() and increase() need two samples)
            try:
                res = _get_json(url + "/api/v1/query?query=" + urllib.parse.quote(
                    'count_over_time(up{job="gpu-audit"}[1m])'))["data"]["result"]
                if res and float(res[0]["value"][1]) >= 4:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (d / "log").read_text()[-2000:]
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        server.stop()


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    body = _get_json(url + "/api/v1/query?query=" + urllib.parse.quote(expr))
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def _panel_exprs() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]


def test_dashboard_is_provisionable_json() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and dash["uid"] and dash["title"]
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dash["panels"])
    assert {v["name"] for v in dash["templating"]["list"]} == {"datasource"}
    prov = (ROOT / "deploy" / "grafana" / "provisioning" / "dashboards.yml").read_text()
    assert "type: file" in prov


@pytest.mark.service
@pytest.mark.parametrize(("title", "expr"), _panel_exprs())
def test_every_panel_query_returns_data(scraped: str, title: str, expr: str) -> None:
    assert _query(scraped, expr), f"panel {title!r}: {expr} returned no data"


@pytest.mark.service
def test_panel_figures_match_the_report(scraped: str, demo: tuple[Store, Any, int]) -> None:
    """The dashboard shows the report's figures: the demo's headline says 444.0 idle GPU-hours, 120.0 of them
    mirage, 58.0 unknown (README's demo block), and research over its budget (alert expression)."""
    store, cfg, run_id = demo
    with store.engine.connect() as conn:
        s = report.load_run(conn, run_id)["summary"]

    def one(expr: str) -> float:
        res = _query(scraped, expr)
        assert len(res) == 1, (expr, res)
        return float(res[0]["value"][1])

    assert one("sum(gpu_audit_team_idle_gpu_seconds) / 3600") == pytest.approx(s["idle_gpu_hours"])
    assert one("sum(gpu_audit_team_mirage_gpu_seconds) / 3600") == pytest.approx(s["mirage_gpu_hours"])
    assert one("sum(gpu_audit_team_unknown_gpu_seconds) / 3600") == pytest.approx(s["unknown_gpu_hours"])
    assert one("gpu_audit_latest_audit_sm_active_ratio") == pytest.approx(s["mean_sm_active"])
    assert one('gpu_audit_findings{kind="util_mirage"}') == 1
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    alert = next(r["expr"] for r in rules if r["alert"] == "GpuAuditTeamOverIdleBudget")
    over = _query(scraped, alert)
    assert [r["metric"]["team"] for r in over] == ["research"]
    # the notebooks: 1 GPU x 120 h + 1 x 72 h + a MIG slice (1/7) x 96 h
    assert float(over[0]["value"][1]) == pytest.approx((192 + 96 / 7) * H)


@pytest.mark.service
def test_alert_rules_check_and_unit_tests() -> None:
    need(bool(shutil.which("promtool")), "promtool not installed (scripts/testbed-prometheus.sh installs it)")
    check = subprocess.run(["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True,  # noqa: S607
                           timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 6 rules found" in check.stdout
    unit = subprocess.run(["promtool", "test", "rules", str(ALERT_TESTS)], capture_output=True,  # noqa: S607
                          text=True, timeout=120)
    assert unit.returncode == 0, unit.stdout + unit.stderr
