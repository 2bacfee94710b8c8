"""Reports from a real store: numbers match the usage tables, every format escapes user text, edge weeks
(empty, unknown-only telemetry, 10,000 allocations) render, tables are cut with totals, the CLI works."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from auditor.audit.run import run_audit
from auditor.config import Config, EmailConfig, ReportConfig, Team
from auditor.records import AllocatedGpu, Allocation, GpuBucket, GpuInventory
from auditor.report import charts, render
from auditor.report import context as report
from auditor.store.engine import Store

T0 = datetime(2026, 11, 16, tzinfo=UTC)
WEEK = timedelta(days=7)
EVIL_NAMES = ("<script>alert(1)</script>", "<img src=x onerror=alert(1)>")
EVIL_USER = "evil\r\nBcc: x@y"


def make_cfg(top_n: int = 25, **email: object) -> Config:
    return Config(report=ReportConfig(top_n=top_n),
                  teams=[Team(name="ml", accounts=["acct-ml"], emails=["ml-leads@example.org"]),
                         Team(name="vision", accounts=["acct-vis"], emails=["vision@example.org"])],
                  email=EmailConfig(**{"sender": "gpu-audit@example.org", "admin_to": ["ops@example.org"],
                                       "user_domain": "example.org", **email}))


def buckets(host: str, idx: int, start: datetime, hours: float, sm: float | None, util: float | None,
            step: int = 300) -> list[GpuBucket]:
    return [GpuBucket("c1", host, idx, start + timedelta(seconds=step * i), step, 10, sm_active=sm,
                      gpu_util=util) for i in range(int(hours * 3600 / step))]


def week_records(t0: datetime, *, idle_hours: float = 8.0) -> list:
    """One week: an idle job (evil names), a mirage job, a working job, a half-idle 2-GPU job, no-telemetry job."""
    recs: list = []
    recs.append(Allocation("c1", "slurm", "101", name=EVIL_NAMES[0], user="alice", account="acct-ml",
                           start=t0, end=t0 + timedelta(hours=idle_hours), gpus=[AllocatedGpu("n1", 0)]))
    recs += buckets("n1", 0, t0, idle_hours, 0.01, 0.0)
    recs.append(Allocation("c1", "slurm", "102", name=EVIL_NAMES[1], user=EVIL_USER, account="acct-ml",
                           start=t0, end=t0 + timedelta(hours=6), gpus=[AllocatedGpu("n1", 1)]))
    recs += buckets("n1", 1, t0, 6, 0.02, 0.97)
    recs.append(Allocation("c1", "slurm", "103", name="train", user="bob", account="acct-vis",
                           start=t0, end=t0 + timedelta(hours=10), gpus=[AllocatedGpu("n2", 0)]))
    recs += buckets("n2", 0, t0, 10, 0.9, 1.0)
    recs.append(Allocation("c1", "slurm", "104", name="half | *bold* _x_", user="bob", account="acct-vis",
                           start=t0, end=t0 + timedelta(hours=5),
                           gpus=[AllocatedGpu("n3", 0), AllocatedGpu("n3", 1)]))
    recs += buckets("n3", 0, t0, 5, 0.8, 1.0) + buckets("n3", 1, t0, 5, 0.0, 0.0)
    recs.append(Allocation("c1", "slurm", "105", name="dark", user="carol", account="acct-x",
                           start=t0, end=t0 + timedelta(hours=4), gpus=[AllocatedGpu("n9", 0)]))
    recs += [GpuInventory("c1", "n9", 0), GpuInventory("c1", "n1", 0)]
    return recs


def new_store(tmp_path: Path, name: str = "r.db") -> Store:
    s = Store.open(f"sqlite:///{tmp_path / name}")
    s.upgrade()
    return s


def audited(tmp_path: Path, cfg: Config, weeks: int = 2) -> tuple[Store, int]:
    """A store with ``weeks`` weekly audits (older weeks less idle) and the id of the latest run."""
    store = new_store(tmp_path)
    run_id = 0
    for k in range(weeks - 1, -1, -1):
        start = T0 - k * WEEK
        store.ingest(week_records(start + timedelta(hours=1), idle_hours=8.0 - 2 * k))
        run_id = run_audit(store, cfg, start, start + WEEK).run_id
    return store, run_id


@pytest.fixture
def world(tmp_path: Path) -> tuple[Store, Config, int]:
    cfg = make_cfg()
    store, run_id = audited(tmp_path, cfg)
    return store, cfg, run_id


def sql_totals(store: Store, run_id: int) -> dict[str, float]:
    with store.engine.connect() as c:
        r = c.execute(text("SELECT SUM(reserved_s)/3600, SUM(idle_s+mirage_s)/3600, SUM(effective_s)/3600, "
                           "SUM(idle_cost) FROM usage_allocation WHERE run_id = :r"), {"r": run_id}).one()
    return {"reserved": r[0], "idle": r[1], "effective": r[2], "idle_cost": r[3]}


def test_context_numbers_match_store(world: tuple[Store, Config, int]) -> None:
    store, cfg, run_id = world
    ctx = report.build_context(store, cfg, run_id)
    tot = sql_totals(store, run_id)
    h = ctx["headline"]
    assert h["reserved_gpu_hours"] == pytest.approx(tot["reserved"])
    assert h["idle_gpu_hours"] == pytest.approx(tot["idle"])
    assert h["effective_gpu_hours"] == pytest.approx(tot["effective"])
    assert ctx["teams"]["totals"]["idle_cost"] == pytest.approx(tot["idle_cost"])
    assert sum(t["reserved_gpu_hours"] for t in ctx["teams"]["rows"]) == pytest.approx(tot["reserved"])
    assert {t["team"] for t in ctx["teams"]["rows"]} >= {"ml", "vision"}
    names = {f["job_name"] for f in ctx["top_idle"]["rows"]}
    assert set(EVIL_NAMES) <= names
    costs = [f["cost"] for f in ctx["top_idle"]["rows"]]
    assert costs == sorted(costs, reverse=True)
    assert any(f["sparkline"] for f in ctx["top_idle"]["rows"])
    assert ctx["coverage"]["unmonitored_gpus"] >= 1 and ctx["coverage"]["silent"]["total"] == 1
    assert ctx["unmonitored"]["total"] >= 1
    # trend: the previous week's audit is found and was less idle
    assert [p["current"] for p in ctx["trend"]] == [False, True]
    assert ctx["trend"][1]["idle_change"] == pytest.approx(ctx["trend"][1]["idle_gpu_hours"]
                                                           - ctx["trend"][0]["idle_gpu_hours"])
    assert ctx["trend"][1]["idle_change"] > 0
    json.dumps(ctx)


def test_every_format_escapes_user_text(world: tuple[Store, Config, int], tmp_path: Path) -> None:
    store, cfg, run_id = world
    paths = render.write_reports(store, cfg, run_id, tmp_path / "out", render.FORMATS)
    by_ext = {p.suffix: p.read_text(encoding="utf-8") for p in paths}
    assert set(by_ext) == {".html", ".txt", ".md", ".json", ".csv"}
    html = by_ext[".html"]
    assert "<script>" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "data:image/png;base64," in html and 'alt="Sparkline: ' in html
    md = by_ext[".md"]
    assert "\\<script\\>alert(1)\\</script\\>" in md
    assert "half \\| \\*bold\\* \\_x\\_" in md
    assert "evil Bcc: x@y" in md and "\r" not in md
    txt = by_ext[".txt"]
    assert "\r" not in txt and "evil Bcc: x@y" in txt
    data = json.loads(by_ext[".json"])
    assert data["schema"] == "gpu-audit.report/1" and data["full"] is True  # keys: test_golden_report.py
    assert EVIL_USER in {f["user"] for f in data["top_idle"]["rows"]}
    assert by_ext[".csv"].splitlines()[0].startswith("id,kind,cluster")
    h = data["headline"]
    for body in (html, txt, md):
        assert render.fmt_hours(h["reserved_gpu_hours"]) in body
        assert render.fmt_money(h["idle_cost"], "USD") in body
        assert render.fmt_pct(h["sm_active"]) in body and render.fmt_pct(h["dashboard_busy"]) in body


def md_columns(line: str) -> int:
    """Table columns of a Markdown row, not counting escaped pipes."""
    return line.replace("\\|", "").count("|") - 1


def test_markdown_tables_keep_their_columns(world: tuple[Store, Config, int]) -> None:
    store, cfg, run_id = world
    md = render.render_md(report.build_context(store, cfg, run_id))
    blocks: list[list[str]] = [[]]
    for ln in md.splitlines():
        if ln.startswith("|"):
            blocks[-1].append(ln)
        elif blocks[-1]:
            blocks.append([])
    blocks = [b for b in blocks if b]
    assert len(blocks) >= 4
    for b in blocks:
        assert {md_columns(ln) for ln in b} == {md_columns(b[0])}, b


def test_cut_tables_show_totals_and_pointer(tmp_path: Path) -> None:
    cfg = make_cfg(top_n=2)
    store, run_id = audited(tmp_path, cfg, weeks=1)
    ctx = report.build_context(store, cfg, run_id)
    t = ctx["top_idle"]
    assert t["shown"] == 2 and t["total"] > 2 and t["cut"]
    full = report.build_context(store, cfg, run_id, full=True)
    assert len(full["top_idle"]["rows"]) == t["total"]
    assert t["totals"]["cost"] == pytest.approx(sum(f["cost"] for f in full["top_idle"]["rows"]))
    for body in (render.render_text(ctx), render.render_md(ctx), render.render_html(ctx)[0]):
        assert f"findings-{run_id}.csv" in body and f"of {t['total']}" in body


def test_empty_week_renders(tmp_path: Path) -> None:
    cfg = make_cfg()
    store = new_store(tmp_path)
    run_id = run_audit(store, cfg, T0, T0 + WEEK).run_id
    ctx = report.build_context(store, cfg, run_id)
    assert ctx["headline"]["reserved_gpu_hours"] == 0 and ctx["top_idle"]["total"] == 0
    html = render.render_html(ctx)[0]
    assert "No GPU was reserved in this window" in html
    assert "No GPU was reserved in this window" in render.render_text(ctx)
    assert "No GPU was reserved in this window" in render.render_md(ctx)
    assert json.loads(render.render_json(ctx))["headline"]["idle_cost"] == 0


def test_week_with_only_unknown_telemetry(tmp_path: Path) -> None:
    cfg = make_cfg()
    store = new_store(tmp_path)
    recs: list = [Allocation("c1", "slurm", str(i), name=f"j{i}", user="u", account="acct-ml", start=T0,
                             end=T0 + timedelta(hours=3), gpus=[AllocatedGpu(f"n{i}", 0)]) for i in range(3)]
    # buckets that exist but hold no samples: 3 jobs x 3 h = 9.0 GPU-h unknown (issue 14: a bucket WITH
    # samples but no utilization field would be observed, busy-unverified; see the next test)
    recs += [b for i in range(3) for b in buckets(f"n{i}", 0, T0, 3, None, None)]
    for b in recs:
        if isinstance(b, GpuBucket):
            b.samples = 0
    store.ingest(recs)
    run_id = run_audit(store, cfg.model_copy(update={"thresholds": cfg.thresholds.model_copy(
        update={"util_fallback": False})}), T0, T0 + WEEK).run_id
    ctx = report.build_context(store, cfg, run_id)
    h = ctx["headline"]
    assert h["idle_gpu_hours"] == 0 and h["unknown_gpu_hours"] == pytest.approx(9.0)
    assert h["sm_active"] is None and h["dashboard_busy"] is None
    for body in (render.render_html(ctx)[0], render.render_text(ctx), render.render_md(ctx)):
        assert "n/a" in body and "9.0" in body


def test_util_only_site_is_observed_and_advised(tmp_path: Path) -> None:
    """Issue 14: GPU-Util-only telemetry is observed. n0 reads GPU-Util 90 % for 3 h (busy-unverified 3.0
    GPU-h), n1 reads 1 % (idle-by-util 3.0), n2 has SM activity 0.7 (verified working 3.0): verified 3.0,
    GPU-Util only 6.0, unknown 0, coverage 100 %; the report names the GPU-Util-only node group and advises
    the counters file."""
    cfg = make_cfg()
    store = new_store(tmp_path)
    recs: list = [Allocation("c1", "slurm", str(i), name=f"j{i}", user="u", account="acct-ml", start=T0,
                             end=T0 + timedelta(hours=3), gpus=[AllocatedGpu(f"n{i}", 0)]) for i in range(3)]
    recs += buckets("n0", 0, T0, 3, None, 0.9) + buckets("n1", 0, T0, 3, None, 0.01) + buckets("n2", 0, T0, 3, 0.7, 0.9)
    store.ingest(recs)
    run = run_audit(store, cfg, T0, T0 + WEEK)
    s = run.summary
    assert s["verified_gpu_hours"] == pytest.approx(3.0) and s["util_only_gpu_hours"] == pytest.approx(6.0)
    assert s["busy_unverified_gpu_hours"] == pytest.approx(3.0) and s["idle_by_util_gpu_hours"] == pytest.approx(3.0)
    assert s["unknown_gpu_hours"] == pytest.approx(0.0) and s["coverage"] == pytest.approx(1.0)
    assert "unmonitored" not in s["findings"]
    ctx = report.build_context(store, cfg, run.run_id)
    (g,) = ctx["verification"]["node_groups"]
    assert (g["node_group"], g["nodes"], g["util_only_gpu_hours"]) == ("n", 3, pytest.approx(6.0))
    for body in (render.render_html(ctx)[0], render.render_text(ctx), render.render_md(ctx)):
        assert "dcgm-counters.csv" in body and "GPU-Util only" in body and "6.0" in body


def test_ten_thousand_allocations_render_fast(tmp_path: Path) -> None:
    cfg = make_cfg()
    store = new_store(tmp_path)
    recs: list = []
    for i in range(10_000):
        node, start = f"n{i % 500}", T0 + timedelta(hours=(i // 500) * 2)
        recs.append(Allocation("c1", "slurm", str(i), name=f"job-{i}", user=f"u{i % 97}",
                               account=f"acct-{i % 60}", start=start, end=start + timedelta(hours=1.5),
                               gpus=[AllocatedGpu(node, 0)]))
        recs += buckets(node, 0, start, 1.5, 0.01 if i % 3 else 0.7, 0.9, step=1800)
    store.ingest(recs)
    run_id = run_audit(store, cfg, T0, T0 + WEEK).run_id
    t = time.perf_counter()
    paths = render.write_reports(store, cfg, run_id, tmp_path / "big", render.FORMATS)
    elapsed = time.perf_counter() - t
    print(f"10k allocations: write_reports (4 formats + CSV) {elapsed:.2f}s")
    assert elapsed < 10, f"10k-allocation report took {elapsed:.1f}s"
    ctx = report.build_context(store, cfg, run_id)
    assert ctx["headline"]["allocations"] == 10_000
    assert ctx["top_idle"]["total"] > 6000 and ctx["top_idle"]["shown"] == cfg.report.top_n
    assert ctx["accounts"]["total"] == 60 and ctx["accounts"]["cut"]
    html = next(p for p in paths if p.suffix == ".html").read_text()
    assert len(html) < 2_000_000 and f"of {ctx['top_idle']['total']}" in html
    csv_rows = next(p for p in paths if p.suffix == ".csv").read_text().count("\n")
    # every one of the 97 users (i % 97) has about 2 of 3 jobs idle (i % 3 != 0): 1-GPU jobs never worked, so
    # each is a request_hygiene finding (>= 25 % of requested GPUs unused), in the CSV too
    assert ctx["request_hygiene"]["total"] == 97
    assert csv_rows == ctx["top_idle"]["total"] + ctx["unmonitored"]["total"] + 97 + 1


def test_png_writer_roundtrip() -> None:
    png, w, h = charts.sparkline([0.1, None, 0.9], [1.0, None, 0.95])
    assert charts.png_size(png) == (w, h) == (12, 28)
    alt = charts.sparkline_alt([0.1, None, 0.9], [1.0, None, 0.95])
    assert "SM activity mean 50%" in alt and "1 of 3 time bins without data" in alt
    with pytest.raises(ValueError):
        charts.png_bytes(2, 1, [[(0, 0, 0)]])


def test_text_and_markdown_escapers() -> None:
    assert render.plain("a\x1b[31mred\r\nb\u202e") == "a[31mred b"
    assert render.md("<b>|*_`") == "\\<b\\>\\|\\*\\_\\`"
    assert render.md("x\ny") == "x y"


def test_episode_reservation_and_low_efficiency_sections(tmp_path: Path) -> None:
    from auditor.records import Reservation

    cfg = make_cfg()
    store = new_store(tmp_path)
    t = T0 + timedelta(hours=1)
    recs: list = [Allocation("c1", "slurm", "301", name="pause|job", user="dora", account="acct-ml", start=t,
                             end=t + timedelta(hours=12), gpus=[AllocatedGpu("n5", 0)])]
    recs += buckets("n5", 0, t, 8, 0.9, 1.0) + buckets("n5", 0, t + timedelta(hours=8), 4, 0.0, 0.0)
    recs.append(Allocation("c1", "slurm", "302", name="slow", user="erin", account="acct-vis", start=t,
                           end=t + timedelta(hours=6), gpus=[AllocatedGpu("n6", 0)]))
    recs += buckets("n6", 0, t, 6, 0.1, 0.9)
    recs.append(Reservation("c1", "maint<b>|x", t, t + timedelta(hours=10), nodes=["n7"], gpu_count=4,
                            users=["dora"], accounts=["acct-ml"]))
    recs += [GpuInventory("c1", "n7", i, model="h100") for i in range(4)]
    store.ingest(recs)
    run_id = run_audit(store, cfg, T0, T0 + WEEK).run_id
    ctx = report.build_context(store, cfg, run_id)
    kinds = ctx["headline"]["findings"]
    assert kinds.get("idle_episode") == ctx["episodes"]["total"] >= 1
    assert kinds.get("idle_reservation") == ctx["reservations"]["total"] == 1
    assert ctx["reservations"]["rows"][0]["reservation"] == "maint<b>|x"
    html, txt, md = render.render_html(ctx)[0], render.render_text(ctx), render.render_md(ctx)
    assert "Idle episodes inside working jobs" in html and "IDLE EPISODES" in txt and "## Idle episodes" in md
    assert "maint&lt;b&gt;|x" in html and "maint<b>|x" in txt and "maint\\<b\\>\\|x" in md
    assert kinds.get("low_efficiency") == ctx["low_efficiency"]["total"] >= 1
    assert "Low efficiency" in html and "LOW EFFICIENCY" in txt and ctx["low_efficiency"]["rows"][0]["hint"]


def cli_main():  # noqa: ANN201 - click group
    """The real `gpu-audit` group, with this module's commands even before COMMAND_MODULES lists them."""
    import auditor.cli as cli

    if "report" not in cli.main.commands:
        from auditor.cli import report as cli_report

        cli_report.register(cli.main)
    return cli.main


def test_cli_report_and_notify_on_the_demo(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from auditor.demo import generate

    cfg_path, start, end = generate(tmp_path / "demo")
    main, runner = cli_main(), CliRunner()

    def go(*args: str) -> Any:
        return runner.invoke(main, ["-c", str(cfg_path), *args])

    assert go("db", "upgrade").exit_code == 0
    res = go("report", "--out", str(tmp_path / "r"))
    assert res.exit_code == 1 and "run `gpu-audit audit`" in res.output and len(res.output.splitlines()) == 1
    assert go("collect").exit_code == 0
    assert go("audit", "--since", start.isoformat(), "--until", end.isoformat()).exit_code == 0
    res = go("report", "--format", "html", "--format", "md", "--out", str(tmp_path / "r"))
    assert res.exit_code == 0, res.output
    # and the manifest of the files gpu-audit wrote there (auditor/owned.py), so a later run replaces only those
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == [".gpu-audit-files.json", "findings-1.csv",
                                                                "report-1.html", "report-1.md"]
    assert "spin-wait" in (tmp_path / "r" / "report-1.html").read_text()
    res = go("--json", "report", "--run", "1", "--format", "json", "--out", str(tmp_path / "j"))
    assert res.exit_code == 0 and json.loads(res.output)["files"][0].endswith("report-1.json")
    res = go("report", "--since", start.isoformat(), "--until", end.isoformat(), "--out", str(tmp_path / "w"))
    assert res.exit_code == 0 and len(list((tmp_path / "w").iterdir())) == 5 + 1  # and the manifest (auditor/owned.py)
    assert go("report", "--run", "99").output.startswith("gpu-audit: error: no audit run 99")
    res = go("notify", "--dry-run", "--out", str(tmp_path / "eml"), "--no-users")
    assert res.exit_code == 0, res.output
    emls = sorted(p.name for p in (tmp_path / "eml").iterdir() if p.suffix == ".eml")  # not the manifest
    assert emls[0].startswith("run1-admin-") and sum(n.startswith("run1-team-") for n in emls) == 3
    assert "wrote admin_report to gpu-platform@example.com" in res.output
    res = go("--json", "notify", "--dry-run", "--out", str(tmp_path / "eml2"), "--no-admin", "--no-teams")
    data = json.loads(res.output)
    assert data["dry_run"] is True and {m["kind"] for m in data["sent"]} == {"user_nudge"}
    res = go("notify", "--no-admin", "--no-teams", "--no-users")
    assert res.exit_code == 1 and "nothing to send" in res.output


@pytest.mark.service
def test_report_on_postgresql(pg_url: str, tmp_path: Path) -> None:
    """The report's SQL on the production store, in a database of its own (other tests share `test`)."""
    import os

    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    name = f"gpu_audit_report_{os.getpid()}"
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        url = make_url(pg_url).set(database=name).render_as_string(hide_password=False)
        store = Store.open(url)
        store.upgrade()
        cfg = make_cfg(top_n=2)
        run_id = 0
        for k in (1, 0):
            start = T0 - k * WEEK
            store.ingest(week_records(start + timedelta(hours=1), idle_hours=8.0 - 2 * k))
            run_id = run_audit(store, cfg, start, start + WEEK).run_id
        ctx = report.build_context(store, cfg, run_id)
        assert ctx["headline"]["idle_gpu_hours"] == pytest.approx(sql_totals(store, run_id)["idle"])
        assert ctx["top_idle"]["cut"] and len(ctx["trend"]) == 2 and ctx["coverage"]["silent"]["total"] == 1
        paths = render.write_reports(store, cfg, run_id, tmp_path / "pg", render.FORMATS)
        assert "&lt;script&gt;" in paths[0].read_text()
        store.engine.dispose()
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_inline_sparklines_are_whole_pngs(world: tuple[Store, Config, int], tmp_path: Path) -> None:
    """Every data: URI image in the HTML report decodes to a PNG whose chunks pass their CRCs. The cap on
    shown values (render.cap_shown, 256 characters) once cut a long sparkline's base64 in the middle, and
    the browser drew the alt text instead of the chart."""
    import base64
    import random
    import re
    import struct
    import zlib

    store, cfg, _run = world
    # a mirage job whose SM activity and GPU-Util jump around: its sparkline PNG compresses badly (long base64)
    rnd, t = random.Random(7), T0 + timedelta(days=3)
    store.ingest([Allocation("c1", "slurm", "301", name="jumpy", user="bob", account="acct-vis", start=t,
                             end=t + timedelta(hours=48), gpus=[AllocatedGpu("n9", 0)])]
                 + [GpuBucket("c1", "n9", 0, t + timedelta(minutes=5 * i), 300, 10, sm_active=rnd.random() * 0.04,
                              gpu_util=rnd.random()) for i in range(48 * 12)])
    run_id = run_audit(store, cfg, T0, T0 + timedelta(days=7)).run_id
    html = next(p for p in render.write_reports(store, cfg, run_id, tmp_path / "out", ["html"])
                if p.suffix == ".html").read_text()
    uris = re.findall(r'src="data:image/png;base64,([^"]*)"', html)
    assert uris
    for b64 in uris:
        png = base64.b64decode(b64.encode("ascii"), validate=True)
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        pos = 8
        while pos < len(png):
            (n,), kind = struct.unpack(">I", png[pos:pos + 4]), png[pos + 4:pos + 8]
            assert zlib.crc32(kind + png[pos + 8:pos + 8 + n]) == struct.unpack(">I", png[pos + 8 + n:pos + 12 + n])[0]
            pos += 12 + n
        assert kind == b"IEND"
    longest = max(len(u) for u in uris)
    assert longest > render.SHOWN_MAX, f"no image longer than the cap ({longest}): the test would prove nothing"


def test_counts_take_the_singular_for_one() -> None:
    """Report counts read "1 episode", "2 episodes", "0 reservations" (the HTML report once said "1 episodes")."""
    from auditor.report.render import plural

    assert [plural(n, "episode") for n in (0, 1, 2, 12345)] == ["0 episodes", "1 episode", "2 episodes",
                                                                 "12,345 episodes"]
    assert plural(1, "lemon node") == "1 lemon node" and plural(None, "team") == "0 teams"
