"""One figure reads the same on every surface (issue 32 §3).

Every surface is rendered from one audit run: the HTML, text, Markdown and JSON reports, the findings CSV,
the admin report and the user and team nudges, the web pages and their API (in process, as tests/test_web.py
drives them), `gpu-audit job` and `gpu-audit jobs`, and chargeback. Each headline figure each surface shows
is checked against the audit's own totals (plain SQL over usage_allocation and findings, written here) and
against an independent figure: the demo's planted numbers by hand (tests/test_demo.py derives them), and on
generated fleets the reference oracle (tests/oracle.py), on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from oracle import HOUR
from oracle_fleets import Fleet, detect, fleets
from sqlalchemy import text
from starlette.testclient import TestClient

from auditor.audit.run import run_audit
from auditor.cli import main
from auditor.cli.core import headline as cli_headline
from auditor.config import Config, EmailConfig, load
from auditor.report import context as report
from auditor.report.chargeback import chargeback, totals
from auditor.report.notify import build_messages
from auditor.report.render import render_html, render_json, render_md, render_text
from auditor.store.engine import Store
from auditor.store.retention import prune
from auditor.web.app import create_app

sys.path.insert(0, str(Path(__file__).parent))
from test_oracle import PRICES, clear, run_oracle, scraped  # noqa: E402

NUM = r"(-?[\d,]+\.\d+)"
TOL = 0.051  # surfaces print one decimal: a figure within half a tenth (and float noise) of the truth


def num(s: str) -> float:
    return float(s.replace(",", ""))


def find(pattern: str, textual: str, what: str) -> float:
    m = re.search(pattern, textual, re.S)
    assert m, f"{what}: {pattern!r} not found"
    return num(m.group(1))


def close(got: float | None, want: float, what: str, tol: float = TOL) -> None:
    assert got is not None and abs(float(got) - want) <= tol, f"{what}: shows {got}, the audit says {want}"


# -- the audit's own totals, read here in plain SQL -----------------------------------------------------------

def truth(store: Store, rid: int) -> dict[str, Any]:
    """Headline figures from the stored rows: usage per allocation summed, and per user."""
    with store.engine.connect() as conn:
        t = conn.execute(text(
            "SELECT SUM(reserved_s) AS r, SUM(idle_s + mirage_s) AS i, SUM(idle_cost) AS ic, SUM(unknown_s) AS u, "
            "SUM(reserved_cost) AS rc FROM usage_allocation WHERE run_id = :r"), {"r": rid}).one()
        users = {r.user_name: (float(r.r) / HOUR, float(r.i) / HOUR) for r in conn.execute(text(
            "SELECT a.user_name, SUM(u.reserved_s) AS r, SUM(u.idle_s + u.mirage_s) AS i FROM usage_allocation u "
            "JOIN allocations a ON a.id = u.allocation_id WHERE u.run_id = :r GROUP BY a.user_name"), {"r": rid})}
        kinds = {r[0] for r in conn.execute(text("SELECT DISTINCT kind FROM findings WHERE run_id = :r"),
                                            {"r": rid})}
        win = conn.execute(text("SELECT since_ts, until_ts FROM audit_runs WHERE id = :r"), {"r": rid}).one()
    return {"reserved": float(t.r or 0) / HOUR, "idle": float(t.i or 0) / HOUR, "idle_cost": float(t.ic or 0),
            "unknown": float(t.u or 0) / HOUR, "reserved_cost": float(t.rc or 0), "users": users, "kinds": kinds,
            "since": int(win.since_ts), "until": int(win.until_ts)}


def nudge_figures(store: Store, cfg: Config, rid: int) -> dict[str, tuple[float, float, float, float | None, int]]:
    """Per nudge recipient: (idle GPU-hours, idle cost, GPU-hours reserved) as its text body says them, and
    the sum of its rows' idle GPU-hours (None when rows were cut; else they must add up to the total)."""
    out: dict[str, tuple[float, float, float, float | None, int]] = {}
    msgs, _ = build_messages(store, cfg, rid, admin=False, now=datetime.fromtimestamp(truth(store, rid)["until"],
                                                                                       UTC))
    for o in msgs:
        body = o.message.get_body(("plain",)).get_content()
        m = re.search(NUM + r" idle GPU-hours, costing \S+ " + NUM + r", out of (?:the )?" + NUM + " GPU-hours",
                      body)
        assert m, body
        rows = [num(x) for x in re.findall(r"\n   \d{4}-.*? to .*?: " + NUM + r" idle of ", body)]
        out[o.recipient] = (num(m.group(1)), num(m.group(2)), num(m.group(3)),
                            None if re.search(r"costliest of", body) else sum(rows), len(rows))
    return out


def rows_add_up(got: dict[str, tuple[float, float, float, float | None, int]]) -> None:
    """Each nudge's rows (one per allocation, on lines of their own) add up to its idle total."""
    for rcpt, n in got.items():
        if n[3] is not None:  # each row and the total are rounded to a tenth on their own: 1.88 = 0.94 + 0.94
            # reads 1.9 against 0.9 + 0.9 = 1.8, so the rows may miss the total by half a tenth per figure
            close(n[3], n[0], f"{rcpt}: the sum of its rows' idle GPU-hours", TOL * (n[4] + 1))


def web_client(store: Store, cfg: Config) -> TestClient:
    return TestClient(create_app(store, cfg))


# -- the demo ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, Config, int, Path]:
    out = tmp_path_factory.mktemp("surfaces") / "demo"
    res = CliRunner().invoke(main, ["--json", "demo", "--out", str(out), "--now", "2026-11-29T00:00"])
    assert res.exit_code == 0, res.output
    cfg = load(out / "demo.toml")
    cfg = cfg.model_copy(update={"email": EmailConfig(**{**cfg.email.model_dump(exclude={"password"}),
                                                         "user_domain": "example.org"})})
    store = Store.open(cfg.store.resolved_url())
    return store, cfg, int(json.loads(res.stdout)["run_id"]), out


# The demo's planted figures by hand (tests/test_demo.py derives each): reserved 2,698 GPU-h (2,242 + job
# 1050's three failed runs, 4 GPUs x (12 + 10 + 6) = 112, all working, so no idle, + chat-vllm 1 x 48, + job
# 1060's 8 GPUs x 10 h across two nodes = 80, low or working, + job 1070's 4 GPUs x 12 h waiting on storage =
# 48, low, never idle, + the 2026 site's sft worker 2 x 48 = 96 working and dana's notebook 72 idle); idle 444 (96 +
# 24 mirage of 1002 and 1004, 108 of 1003's 3 idle GPUs, 120 of the notebook, 24 of 1001's 3 h stall on 8 GPUs, 72
# of dana's notebook), idle cost 1,596 (1002 96 x 4 + 1004 24 x 4 + 1003 108 x 4 + notebook 120 x 2.5 + 1001 24 x 4
# + dana's notebook 72 x 4 on an H100); the idle reservation team-b-hackathon 8 GPUs x 24 h = 192 GPU-h no job
# used, x 4.0 = 768.
# The 2026 site's stock counters and MIG node add its hung all-reduce (12 h, an engine spin: not idle) and two
# 1g.5gb slices (1/7 of an A100): the embedding server 168 / 7 (busy by counters) and erin's notebook 96 / 7 idle by
# the counters, at 2.5 per GPU-hour.
MIG_IDLE = 96 / 7
DEMO = {"reserved": 2698.0 + 12 + 168 / 7 + MIG_IDLE, "idle": 444.0 + MIG_IDLE, "idle_cost": 1596.0 + MIG_IDLE * 2.5,
        "resv": 192.0, "resv_cost": 768.0}
# Nudges (idle GPU-hours and cost of the user's nudged allocations; every GPU-hour the user reserved):
# alice: notebook 120 (USD 300) + 1001's stall 24 (USD 96); reserved 1001 8 x 140 + notebook 120 = 1,240.
# bob: 1002 96 (USD 384); reserved 96 + 1030's 10 = 106. carol: 1003 108 (USD 432); reserved 1003 144 +
# 1010_0..5 6 x 2 x 16 = 336. dave: 1004 24 (USD 96); reserved 24. dana (the 2026 site): her notebook 72 (USD 288);
# reserved 72.
NUDGES = {"alice": (144.0, 396.0, 1240.0), "bob": (96.0, 384.0, 106.0), "carol": (108.0, 432.0, 336.0),
          "dave": (24.0, 96.0, 24.0), "dana": (72.0, 288.0, 72.0)}


def test_demo_truth_is_the_planted_week(demo: tuple[Store, Config, int, Path]) -> None:
    store, _, rid, _ = demo
    t = truth(store, rid)
    for k in ("reserved", "idle", "idle_cost"):
        close(t[k], DEMO[k], f"the audit's {k}", 1e-6)
    for user, (_, _, reserved) in NUDGES.items():
        close(t["users"][user][0], reserved, f"{user}'s reserved GPU-hours", 1e-6)


def test_demo_reports_say_the_headline(demo: tuple[Store, Config, int, Path]) -> None:
    """Text, Markdown, HTML and JSON: reserved, idle and idle cost as the audit summed them, and the idle
    reservation beside the idle figure, never silently left out."""
    store, cfg, rid, _ = demo
    ctx = report.build_context(store, cfg, rid)
    txt, md = render_text(ctx), render_md(ctx)
    html, _ = render_html(ctx)
    doc = json.loads(render_json(ctx))
    t = truth(store, rid)
    close(find(r"Reserved GPU-hours:\s+" + NUM, txt, "text reserved"), t["reserved"], "text reserved")
    close(find(r"Idle GPU-hours:\s+" + NUM, txt, "text idle"), t["idle"], "text idle")
    close(find(r"Idle cost:\s+\S+ " + NUM, txt, "text idle cost"), t["idle_cost"], "text idle cost")
    close(find(r"\| Idle[^|]*\| " + NUM, md, "md idle"), t["idle"], "Markdown idle")
    close(find(r'id="idle-gpu-hours"[^>]*>' + NUM, html, "html idle"), t["idle"], "HTML idle")
    close(doc["headline"]["idle_gpu_hours"], t["idle"], "JSON idle", 1e-6)
    close(doc["headline"]["idle_cost"], t["idle_cost"], "JSON idle cost", 1e-6)


def test_demo_headline_says_the_idle_reservation(demo: tuple[Store, Config, int, Path]) -> None:
    """The idle reservation (192 GPU-h no job used) is shown beside the idle figure on every format, the
    web overview and the CLI summary, never silently left out."""
    store, cfg, rid, _ = demo
    ctx = report.build_context(store, cfg, rid)
    txt, md = render_text(ctx), render_md(ctx)
    html, _ = render_html(ctx)
    doc = json.loads(render_json(ctx))
    close(find(r"Idle reservations:\s+" + NUM, txt, "text idle reservations"), DEMO["resv"], "text reservations")
    close(find(r"\| Idle reservations[^|]*\| " + NUM, md, "md idle reservations"), DEMO["resv"], "Markdown")
    close(find(r'id="idle-reservation-gpu-hours"[^>]*>' + NUM, html, "html reservations"), DEMO["resv"], "HTML")
    close(doc["headline"].get("idle_reservation_gpu_hours"), DEMO["resv"], "JSON idle reservations", 1e-6)
    close(doc["headline"].get("idle_reservation_cost"), DEMO["resv_cost"], "JSON idle reservation cost", 1e-6)
    page = web_client(store, cfg).get("/").text
    close(find(r'id="idle-reservation-gpu-hours"[^>]*>' + NUM, page, "web overview"), DEMO["resv"], "web overview")
    with store.engine.connect() as conn:  # what `gpu-audit demo` and `gpu-audit audit` print
        summary = conn.execute(text("SELECT summary FROM audit_runs WHERE id = :r"), {"r": rid}).scalar()
    summary = json.loads(summary) if isinstance(summary, str) else summary
    close(find(r"Idle reservations:\s+" + NUM, cli_headline(summary), "CLI summary"), DEMO["resv"], "CLI summary")


def test_demo_section_totals_add_no_hour_twice(demo: tuple[Store, Config, int, Path]) -> None:
    """The top idle allocations total 420 = 1003's 108 + 1002's 96 + the notebook's 120 + dana's notebook's 72 (the
    2026 site) + 1004's 24 (each
    allocation's idle hours once) on every format."""
    store, cfg, rid, _ = demo
    ctx = report.build_context(store, cfg, rid)
    close(ctx["top_idle"]["totals"]["idle_gpu_hours"], 420.0 + MIG_IDLE, "top idle total", 1e-6)  # + erin's slice
    close(find(r"TOP IDLE ALLOCATIONS.*?All 6: " + NUM, render_text(ctx), "text top idle total"), 420.0 + MIG_IDLE,
          "text")
    close(ctx["episodes"]["totals"]["idle_gpu_hours"], 24.0, "episodes total", 1e-6)
    close(ctx["reservations"]["totals"]["idle_gpu_hours"], 192.0, "reservations total", 1e-6)


def test_demo_idle_episode_card_names_the_window_it_shows(demo: tuple[Store, Config, int, Path]) -> None:
    """Job 1001's idle episode: 3 h on 8 GPUs = 24 idle GPU-hours; the means and the sparkline are the whole
    job's (140 h), so the card and the text report must say the job's window where they show them."""
    store, cfg, rid, _ = demo
    with store.engine.connect() as conn:
        a = conn.execute(text("SELECT start_ts, end_ts FROM allocations WHERE external_id = '1001'")).one()
    t = truth(store, rid)
    job_start = report._when(max(a.start_ts, t["since"]), report._tz(cfg))
    job_end = report._when(min(a.end_ts, t["until"]), report._tz(cfg))
    ctx = report.build_context(store, cfg, rid)
    html, _ = render_html(ctx)
    cards = [c for c in html.split('class="ga-card finding"') if ">Idle episode<" in c.split("</table>")[0] or
             ">Idle episode<" in c[:2000]]
    assert cards, "no idle episode card"
    card = cards[0].split('class="ga-card finding"')[0]
    assert "<img" in card, "the episode card has no sparkline"
    assert job_start in card and job_end in card, "the card shows the whole job's sparkline and means " \
        "without naming the job's window"
    txt = render_text(ctx)
    ep = txt.split("IDLE EPISODES", 1)[1].split("\n\n", 1)[0]
    means = next(line for line in ep.splitlines() if "GPU-Util" in line)
    assert job_start in means, f"the text report's means are the whole job's but say no window: {means!r}"


def test_demo_nudges_say_the_users_figures(demo: tuple[Store, Config, int, Path]) -> None:
    store, cfg, rid, _ = demo
    got = nudge_figures(store, cfg, rid)
    t = truth(store, rid)
    for user, (idle, cost, reserved) in NUDGES.items():
        n = got[f"{user}@example.org"]
        close(n[0], idle, f"{user}'s nudge idle GPU-hours")
        close(n[1], cost, f"{user}'s nudge idle cost", 0.0051)
        close(n[2], reserved, f"{user}'s nudge 'GPU-hours reserved'")
        close(n[2], t["users"][user][0], f"{user}'s nudge reserved vs the audit")
    rows_add_up(got)


def test_demo_web_pages_and_api(demo: tuple[Store, Config, int, Path]) -> None:
    store, cfg, rid, _ = demo
    t = truth(store, rid)
    c = web_client(store, cfg)
    head = c.get("/api/overview").json()["headline"]
    close(head["idle_gpu_hours"], t["idle"], "web overview idle", 1e-6)
    close(head["reserved_gpu_hours"], t["reserved"], "web overview reserved", 1e-6)
    close(find(r'id="idle-gpu-hours"[^>]*>' + NUM, c.get("/").text, "overview page"), t["idle"], "overview page")
    users = {r["name"]: r for r in c.get("/api/users").json()["rows"]}
    for user, (_, _, reserved) in NUDGES.items():
        close(users[user]["reserved_gpu_hours"], reserved, f"web users page {user}", 1e-6)
    close(c.get("/api/teams").json()["totals"]["idle_gpu_hours"], t["idle"], "web teams total", 1e-6)


def test_demo_web_front_page_who_and_my_jobs(demo: tuple[Store, Config, int, Path]) -> None:
    """The front page's teams, users, allocations, infrastructure hours and a user's jobs read as the report,
    the nudges and the audit say: the planted idle costs by hand (1003 108 x 4 = 432, 1002 96 x 4 = 384, the
    notebook 120 x 2.5 = 300, dana's notebook on the 2026 site 72 x 4 = 288, 1001's stall and 1004 24 x 4 = 96
    each; the top 5), alice's every allocation (1,240
    reserved GPU-hours, as her nudge says) and the report's team rows and infrastructure figure."""
    store, cfg, rid, _ = demo
    t = truth(store, rid)
    ctx = report.build_context(store, cfg, rid)
    html, _ = render_html(ctx)
    c = web_client(store, cfg)
    ov = c.get("/api/overview").json()
    who, page = ov["who"], c.get("/").text
    assert ov["run"]["id"] == rid and ov["run"]["kind"] == "weekly audit"
    n = len(who["teams"]["rows"])
    assert [(r["team"], r["idle_cost"]) for r in who["teams"]["rows"]] == [
        (r["team"], r["idle_cost"]) for r in ctx["teams"]["rows"][:n]], "web teams vs the report's team table"
    for r in who["users"]["rows"]:
        close(r["idle_gpu_hours"], t["users"][r["user_name"]][1], f"web top users {r['user_name']}", 1e-6)
    assert sorted((round(j["idle_cost"], 6) for j in who["jobs"]["rows"]), reverse=True) == [432.0, 384.0, 300.0,
                                                                                             288.0, 96.0]
    report_top = {r["allocation_id"]: r["cost"] for r in ctx["top_idle"]["rows"]}
    for j in who["jobs"]["rows"]:  # an allocation the report lists as a top idle one costs the same here
        if j["allocation_id"] in report_top:
            close(j["idle_cost"], report_top[j["allocation_id"]], f"web top job {j['job_id']} vs the report", 1e-6)
    # every top idle allocation of the report is on the front page, but for one tying its last row (1001's and
    # 1004's 96 each: the front page shows 5)
    last = min(j["idle_cost"] for j in who["jobs"]["rows"])
    shown = {j["allocation_id"] for j in who["jobs"]["rows"]}
    assert {a for a, cost in report_top.items() if cost > last + 1e-6} <= shown
    infra = find(r'id="infra-gpu-hours"[^>]*>' + NUM, page, "web infrastructure GPU-hours")
    close(infra, find(r'id="infra-gpu-hours"[^>]*>' + NUM, html, "HTML report infrastructure"), "web infra vs HTML")
    close(infra, ctx["headline"]["infra_gpu_hours"], "web infrastructure vs the report context")
    mine = c.get("/api/overview?user=alice").json()["mine"]
    nudge = nudge_figures(store, cfg, rid)["alice@example.org"]
    close(mine["totals"]["reserved_gpu_hours"], NUDGES["alice"][2], "alice's jobs reserved by hand", 1e-6)
    close(mine["totals"]["reserved_gpu_hours"], nudge[2], "alice's jobs vs her nudge's reserved")
    close(sum(r["reserved_gpu_hours"] for r in mine["rows"]), t["users"]["alice"][0], "alice's rows vs the audit", 1e-6)
    close(sum(r["idle_gpu_hours"] for r in mine["rows"]), t["users"]["alice"][1], "alice's idle vs the audit", 1e-6)
    with store.engine.connect() as conn:
        ids = {r[0] for r in conn.execute(text(
            "SELECT u.allocation_id FROM usage_allocation u JOIN allocations a ON a.id = u.allocation_id "
            "WHERE u.run_id = :r AND a.user_name = 'alice'"), {"r": rid})}
    assert {r["allocation_id"] for r in mine["rows"]} == ids and mine["total"] == len(ids)


def test_demo_where_the_waiting_goes_on_every_surface(demo: tuple[Store, Config, int, Path]) -> None:
    """The run summary's waiting classes, as the report (text, Markdown, HTML, JSON) and the web front page
    (API and page) show them: one computation. By hand: job 1070 waited on storage 4 GPUs x 12 h = 48 GPU-h,
    the only input/storage wait and no host-bound hour in the fleet (auditor/demo.py STORAGE_WAIT); 1060's
    node 02 waited 40 GPU-h with its host showing no cause (other host/input wait)."""
    store, cfg, rid, _ = demo
    ctx = report.build_context(store, cfg, rid)
    w = ctx["waiting"]
    close(w["total"]["storage"], 48.0, "storage wait by hand", 1e-6)
    close(w["total"]["starved"], 40.0, "other host/input wait by hand", 1e-6)
    assert w["total"]["host"] == 0
    line = "job 1070 vit-dataload (team llm, hpc): input/storage wait 48.0 of 48.0 GPU-h reserved"
    assert line in render_text(ctx) and line.replace("job", "Job", 1) in render_md(ctx)
    assert json.loads(render_json(ctx))["waiting"]["total"] == w["total"]
    html, _ = render_html(ctx)
    c = web_client(store, cfg)
    api = c.get("/api/overview").json()["waiting"]
    assert api["total"] == w["total"] and api["jobs"] == w["jobs"][:len(api["jobs"])]
    page = c.get("/").text
    for body, what in ((html, "HTML report"), (page, "web front page")):
        table = re.search(r'<table id="waiting".*?</table>', body, re.S)
        assert table, what
        row = re.search(r">Input/storage wait</td><td[^>]*>" + NUM, table.group(0))
        assert row and num(row.group(1)) == 48.0, what
        assert re.search(r"vit-dataload.*?input/storage wait <span[^>]*>48\.0</span>", body, re.S), what


def test_demo_web_findings_page_lists_every_kind(demo: tuple[Store, Config, int, Path]) -> None:
    store, cfg, rid, _ = demo
    t = truth(store, rid)
    c = web_client(store, cfg)
    api = c.get("/api/findings").json()
    assert {r["kind"] for r in api["rows"]} == t["kinds"] and api["total"] == len(api["rows"]), \
        sorted(t["kinds"] - {r["kind"] for r in api["rows"]})
    assert c.get("/api/findings?kind=lemon_node").json()["total"] == 1
    assert "lemon_node" in c.get("/findings").text


def test_demo_web_findings_totals_add_no_hour_twice(demo: tuple[Store, Config, int, Path]) -> None:
    """The allocations' idle 444 + the reservation's 192 no job used; USD 1,596 + 768."""
    store, cfg, rid, _ = demo
    c = web_client(store, cfg)
    api = c.get("/api/findings").json()
    close(api["totals"]["idle_gpu_hours"], DEMO["idle"] + DEMO["resv"], "web findings idle total", 1e-6)
    close(api["totals"]["cost"], DEMO["idle_cost"] + DEMO["resv_cost"], "web findings cost total", 1e-6)
    page = c.get("/findings").text
    close(find(r'id="summary">\d+ findings, (?:<[^>]+>)?' + NUM, page, "findings page"), 636.0 + MIG_IDLE,
          "findings page")
    # filtered by user: carol's idle GPUs (108), not again as idle_while_queued (18) and request_hygiene (108)
    close(c.get("/api/findings?user=carol").json()["totals"]["idle_gpu_hours"], 108.0, "carol's findings")


def test_demo_job_jobs_and_chargeback(demo: tuple[Store, Config, int, Path]) -> None:
    store, cfg, rid, out = demo
    t = truth(store, rid)
    toml = str(out / "demo.toml")
    res = CliRunner().invoke(main, ["-c", toml, "--json", "job", "hpc:1001"])
    assert res.exit_code == 0, res.output
    u = json.loads(res.stdout)["usage"]
    close(u["reserved_gpu_hours"], 1120.0, "gpu-audit job 1001 reserved", 1e-6)  # 8 GPUs x 140 h
    close(u["idle_gpu_hours"] + u["mirage_gpu_hours"], 24.0, "gpu-audit job 1001 idle", 1e-6)  # the 3 h stall
    res = CliRunner().invoke(main, ["-c", toml, "--json", "jobs", "--user", "alice", "--since", "2026-11-20",
                                    "--until", "2026-12-05"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["jobs"]
    close(sum(r["reserved_gpu_hours"] or 0 for r in rows), NUDGES["alice"][2], "gpu-audit jobs alice reserved")
    since, until = (datetime.fromtimestamp(t[k], UTC) for k in ("since", "until"))
    tot = totals(chargeback(store, cfg, since, until, "user", run_id=rid))
    close(tot["reserved_gpu_hours"], t["reserved"], "chargeback reserved", 1e-6)
    close(tot["idle_gpu_hours"] + tot["mirage_gpu_hours"], t["idle"], "chargeback idle", 1e-6)
    close(tot["idle_cost"], t["idle_cost"], "chargeback idle cost", 1e-4)  # rows' costs rounded to 4 decimals
    by_user: dict[str, float] = defaultdict(float)  # rows per period x cluster x user
    for r in chargeback(store, cfg, since, until, "user", run_id=rid):
        by_user[r["owner"]] += float(r["reserved_gpu_hours"])
    for user, (_, _, reserved) in NUDGES.items():
        close(by_user[user], reserved, f"chargeback {user}", 1e-6)


def test_demo_exports_list_every_kind(demo: tuple[Store, Config, int, Path]) -> None:
    store, cfg, rid, out = demo
    t = truth(store, rid)
    doc = json.loads((out / "reports" / f"report-{rid}.json").read_text(encoding="utf-8"))
    close(doc["headline"]["idle_gpu_hours"], t["idle"], "JSON export idle", 1e-6)
    csv_kinds = {line.split(",")[1] for line in (out / "reports" / f"findings-{rid}.csv").read_text(
        encoding="utf-8").splitlines()[1:]}
    assert csv_kinds == t["kinds"]


def test_demo_findings_name_the_registry_audience(demo: tuple[Store, Config, int, Path]) -> None:
    """Each stored finding's recipient is its kind's audience in the registry (docs/definitions.md)."""
    from auditor.audit import kinds

    store, _, rid, _ = demo
    with store.engine.connect() as conn:
        rows = [(r.kind, r.evidence) for r in conn.execute(text(
            "SELECT kind, evidence FROM findings WHERE run_id = :r"), {"r": rid})]
    got = {k: (json.loads(e) if isinstance(e, str) else e).get("recipient") for k, e in rows}
    assert {k: v for k, v in got.items() if v is not None} == {k: kinds.audience(k) for k, v in got.items()
                                                               if v is not None}
    assert len([v for v in got.values() if v]) >= 12, got  # all but idle_reservation say who acts


# -- two findings about the same hours of one job, on both engines ----------------------------------------------

def test_overlapping_findings_count_once(store: Store) -> None:
    """tests/test_web.py's world: dana's job 501 (2 GPUs x 4 h: GPU 0 busy 2 h then idle 2 h, GPU 1 a 4 h mirage)
    is util_mirage (its 6 idle GPU-hours), idle_gpus (GPU 1's 4 of them) and idle_episode (GPU 0's last 2);
    erin's notebook 2 idle GPU-hours, mallory's job 1. By hand: 9 idle GPU-hours, USD 18.00 at 2.0 per
    GPU-hour, never 15 (30.00)."""
    from test_jobview import DAY
    from test_report import T0
    from test_web import world_records

    store.ingest(world_records())
    cfg = Config(email=EmailConfig(user_domain="example.org"))
    rid = run_audit(store, cfg, T0, T0 + DAY).run_id
    t = truth(store, rid)
    with store.engine.connect() as conn:
        kinds = sorted(r[0] for r in conn.execute(text(
            "SELECT f.kind FROM findings f JOIN allocations a ON a.id = f.allocation_id WHERE a.external_id = '501' "
            "AND f.run_id = :r"), {"r": rid}))
    assert kinds == ["idle_episode", "idle_gpus", "util_mirage"]  # the overlap this test is about
    close(t["idle"], 9.0, "the audit's idle", 1e-6)
    c = web_client(store, cfg)
    f = c.get("/api/findings").json()["totals"]
    close(f["idle_gpu_hours"], 9.0, "web findings idle total", 1e-6)
    close(f["cost"], 18.0, "web findings cost total", 1e-6)
    close(c.get("/api/findings?user=dana").json()["totals"]["idle_gpu_hours"], 6.0, "dana's findings", 1e-6)
    ctx = report.build_context(store, cfg, rid)
    close(ctx["top_idle"]["totals"]["idle_gpu_hours"], 9.0, "report top idle total", 1e-6)
    dana = nudge_figures(store, cfg, rid)["dana@example.org"]
    close(dana[0], 6.0, "dana's nudge idle")
    close(dana[1], 12.0, "dana's nudge cost", 0.0051)
    close(dana[2], 8.0, "dana's nudge reserved")


# -- generated fleets, against the oracle, on both engines ----------------------------------------------------

EXAMPLES = 12


def audit_fleet(store: Store, fleet: Fleet, cfg: Config) -> int:
    clear(store)
    for op in fleet.ops:
        if op[0] == "ingest":
            store.ingest(scraped(op[1]), seen_at_ts=fleet.since)  # raw samples through the scrape builder
        else:
            prune(store, now=op[1], keep_weeks=op[2], keep_runs_days=10_000)
    with mock.patch("auditor.audit.run.utcnow", return_value=datetime.fromtimestamp(fleet.now, UTC)):
        return run_audit(store, cfg, datetime.fromtimestamp(fleet.since, UTC),
                         datetime.fromtimestamp(fleet.until, UTC)).run_id


WHOLE = {"idle_allocation", "util_mirage", "hung_collective"}  # findings about all of an allocation's idle time
SEEN: dict[str, int] = defaultdict(int)  # what the generated fleets exercised (the checks are not vacuous)


def check_fleet(store: Store, fleet: Fleet) -> None:
    cfg = Config(thresholds=fleet.th, prices=PRICES, email=EmailConfig(user_domain="example.org"))
    rid = audit_fleet(store, fleet, cfg)
    want = run_oracle(fleet)
    t = truth(store, rid)
    # the oracle's totals, summed here: reserved, idle (idle + idle-by-util + mirage), idle cost, per user
    o_reserved = sum(r.totals["reserved"] for r in want.values()) / HOUR
    o_idle = sum(r.totals["idle"] + r.totals["mirage"] for r in want.values()) / HOUR
    o_cost = sum(r.idle_cost for r in want.values())
    o_users: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in want.values():
        o_users[r.alloc.user][0] += r.totals["reserved"] / HOUR
        o_users[r.alloc.user][1] += (r.totals["idle"] + r.totals["mirage"]) / HOUR
    close(t["reserved"], o_reserved, "audit vs oracle reserved", 1e-6)
    close(t["idle"], o_idle, "audit vs oracle idle", 1e-6)
    ctx = report.build_context(store, cfg, rid, now=datetime.fromtimestamp(fleet.now, UTC))
    h = ctx["headline"]
    close(h["reserved_gpu_hours"], o_reserved, "report reserved", 1e-6)
    close(h["idle_gpu_hours"], o_idle, "report idle", 1e-6)
    close(h["idle_cost"], o_cost, "report idle cost", 1e-4)
    close(find(r"Idle GPU-hours:\s+" + NUM, render_text(ctx), "text idle"), o_idle, "text idle")
    close(json.loads(render_json(ctx))["headline"]["idle_gpu_hours"], o_idle, "JSON idle", 1e-6)
    c = web_client(store, cfg)
    head = c.get(f"/api/overview?run={rid}").json()["headline"]
    close(head["idle_gpu_hours"], o_idle, "web overview idle", 1e-6)
    f = c.get(f"/api/findings?run={rid}").json()
    # the findings page's idle total never exceeds the idle hours there are (allocations + reservations; the
    # generated fleets have no reservation), nor the report's top idle total plus episodes
    assert f["totals"]["idle_gpu_hours"] <= o_idle + 1e-6, (f["totals"], o_idle)
    SEEN["findings"] += f["total"]
    whole = {k: r for k, r in want.items() if r.findings & WHOLE}
    sub = ctx["top_idle"]["totals"]["idle_gpu_hours"]
    assert sub >= sum((r.totals["idle"] + r.totals["mirage"]) / HOUR for r in whole.values()) - 1e-6
    tot = totals(chargeback(store, cfg, datetime.fromtimestamp(t["since"], UTC),
                            datetime.fromtimestamp(t["until"], UTC), "user", run_id=rid))
    close(float(tot["reserved_gpu_hours"]), o_reserved, "chargeback reserved", 1e-5)
    close(float(tot["idle_gpu_hours"] + tot["mirage_gpu_hours"]), o_idle, "chargeback idle", 1e-5)
    # nudges: every GPU-hour the user reserved (the oracle's), idle at most the user's idle, and exactly the
    # whole-allocation findings' idle when only those were nudged about
    got = nudge_figures(store, cfg, rid)
    for user, (res_h, idle_h) in o_users.items():
        n = got.get(f"{user}@example.org")
        if n is None:
            continue
        SEEN["nudges"] += 1
        close(n[2], res_h, f"{user}'s nudge 'GPU-hours reserved' vs the oracle")
        assert n[0] <= idle_h + TOL, (user, n, idle_h)
        mine = [r for r in want.values() if r.alloc.user == user and r.findings]
        if mine and all(r.findings & WHOLE for r in mine):
            SEEN["nudges checked against the oracle's idle"] += 1
            close(n[0], sum((r.totals["idle"] + r.totals["mirage"]) / HOUR for r in mine),
                  f"{user}'s nudge idle vs the oracle")
    rows_add_up(got)


@pytest.mark.slow
def test_fleets_read_the_same_on_every_surface(store: Store) -> None:
    """Generated fleets (tests/oracle_fleets.py) on both engines (the ``store`` fixture)."""
    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None, print_blob=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much, HealthCheck.large_base_example])
    @given(fleets(detect()))
    def surfaces(fleet: Fleet) -> None:
        check_fleet(store, fleet)

    SEEN.clear()
    surfaces()
    # the generated findings make the comparisons above not vacuous. Which of the 12 examples carry a nudge
    # varies with what ran before in the process (hypothesis' generation is not stable across test orders), so
    # the nudge figures are pinned by hand in test_overlapping_findings_count_once and the demo tests, and
    # compared with the oracle here whenever an example carries one
    assert SEEN["findings"], dict(SEEN)
