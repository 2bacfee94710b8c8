"""Issue 44, site trial: what ``gpu-audit job`` and the web job page say (both engines).

- The headline follows the verdict and the actions, never only the findings list: a job 100 % idle for
  0.5 h (under idle_allocation_min_gpu_hours 1.0, so no finding is listed), a 100 % mirage of 0.5 h, and a
  job gpu-audit cancelled read "IDLE", "IDLE ... a mirage" and "stopped by gpu-audit"; before the fix all three read
  "OK: no findings".
- The job view and the web page name the job's waiting class (a job its own input starved: input/storage
  wait).
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from test_enforce_property import Fleet, HonestBackend, Unit, build  # noqa: E402
from test_enforce_rules import sink  # noqa: E402, F401 (the fixture)

from auditor.audit.run import run_audit  # noqa: E402
from auditor.cli.jobs import format_job  # noqa: E402
from auditor.config import Config  # noqa: E402
from auditor.enforce.policy import enforce  # noqa: E402
from auditor.records import AllocatedGpu, Allocation, GpuBucket, NodeBucket  # noqa: E402
from auditor.report.jobview import job_view  # noqa: E402
from auditor.timeutil import floor_to, utcnow  # noqa: E402

T0 = datetime(2026, 11, 20, tzinfo=UTC)
B = 300


def _job(ext: str, node: str, minutes: int, n: int = 1, **metrics: float) -> list[Any]:
    return [Allocation("c", "slurm", ext, user="u", account="a", start=T0, end=T0 + timedelta(minutes=minutes),
                       gpus=[AllocatedGpu(node, g) for g in range(n)]),
            *[GpuBucket("c", node, g, T0 + timedelta(minutes=5 * i), B, 10, **metrics)
              for g in range(n) for i in range(minutes // 5)]]


def test_headline_follows_the_verdict_not_only_the_findings(store: Any) -> None:
    store.ingest([*_job("idle", "n1", 30, sm_active=0.0, gpu_util=0.0),
                  *_job("mirage", "n2", 30, sm_active=0.0, gpu_util=0.99),
                  *_job("starved", "n3", 60, sm_active=0.0, dram_active=0.0),
                  *[NodeBucket("c", "n3", T0 + timedelta(minutes=5 * i), B, 10, 300.0, disk_busy=0.95)
                    for i in range(12)],
                  *_job("fine", "n4", 60, sm_active=0.3, dram_active=0.45, pcie_rx_bps=1e6)])
    run_audit(store, Config(), T0 - timedelta(hours=1), T0 + timedelta(hours=2))
    idle = job_view(store, Config(), "c:idle")
    assert not idle["findings"]  # 0.5 GPU-h: under the hours an idle_allocation finding needs
    assert idle["verdict"]["level"] == "idle", idle["verdict"]  # before the fix: "OK: no findings"
    assert idle["verdict"]["text"].startswith("IDLE: 0.5 of its 0.5 GPU-h idle (100%")
    assert idle["verdict"]["text"].endswith("; no finding listed")
    mirage = job_view(store, Config(), "c:mirage")
    assert mirage["verdict"]["level"] == "idle" and "0.5 GPU-h of it a mirage" in mirage["verdict"]["text"], \
        mirage["verdict"]
    starved = job_view(store, Config(), "c:starved")
    assert starved["verdict"]["level"] == "input wait", starved["verdict"]
    assert "waited on the job's own input" in starved["verdict"]["text"]
    assert starved["waiting"]["main"]["class"] == "storage"
    fine = job_view(store, Config(), "c:fine")
    assert fine["verdict"]["level"] == "ok" and "waited mostly on memory-bound" in fine["verdict"]["text"], \
        fine["verdict"]
    assert "waiting class: mostly input/storage wait" in format_job(starved)
    from sqlalchemy import text
    from starlette.testclient import TestClient

    from auditor.web.app import create_app

    with store.engine.connect() as conn:
        aid = conn.execute(text("SELECT id FROM allocations WHERE external_id = 'starved'")).scalar()
    page = TestClient(create_app(store, Config())).get(f"/allocation/{aid}").text
    assert "INPUT WAIT: 1.0 of its 1.0 GPU-h" in page and "mostly input/storage wait (1.0 GPU-h)" in page


def test_headline_of_a_job_gpu_audit_cancelled(store: Any) -> None:
    now = floor_to(utcnow(), 300)
    world, _truth, cfg = build(store, Fleet(jobs=[Unit("idle")], groups=[]), now)
    backends = {"slurm": HonestBackend(world, "hpc")}
    enforce(store, cfg, backends=lambda cluster, source: backends.get(source), now=now)
    assert [c[:2] for c in world.calls] == [("cancel", "slurm job 1000")]
    v = job_view(store, cfg, "hpc:1000", now=now)
    assert v["verdict"]["level"] == "stopped" and "stopped by gpu-audit" in v["verdict"]["text"], v["verdict"]
    run_audit(store, cfg, now - timedelta(hours=2), now)
    v = job_view(store, cfg, "hpc:1000", now=now)
    assert v["verdict"]["text"].startswith("IDLE: ") and "stopped by gpu-audit" in v["verdict"]["text"], v["verdict"]


def test_collect_says_when_no_node_matched(store: Any, tmp_path: Path) -> None:
    """Issue 44, site trial: with the default node mapping (host_label `instance`) the host rows came in under
    `127.0.0.1` and `collect` printed "ok". It now says that no node matched and which settings map them; a
    partial match is a note; a matching source stays quiet."""
    from auditor.collect import collect
    from auditor.config import ClusterConfig, SourceConfig

    store.ingest(_job("g", "gpu-01", 30, sm_active=0.0))
    rows = "start,node,cpus,cpu_iowait\n" + "".join(f"2026-11-20T00:{m:02d}:00Z,{{n}},8,1\n" for m in (0, 5))
    (tmp_path / "lo.csv").write_text(rows.format(n="127.0.0.1"))
    (tmp_path / "some.csv").write_text(rows.format(n="127.0.0.1") + rows.format(n="gpu-01"))
    (tmp_path / "ok.csv").write_text(rows.format(n="gpu-01"))
    cfg = Config(clusters=[ClusterConfig(name="c", telemetry=[
        SourceConfig(kind="node_exporter", paths=[name]) for name in ("lo.csv", "some.csv", "ok.csv")])])
    res = collect(store, cfg, base_dir=tmp_path, since=T0, until=T0 + timedelta(hours=1))
    lo, some, ok = res.results
    assert lo.ok and lo.warning.startswith("no node matched: host telemetry named 1 node(s) (127.0.0.1), none of "
                                           "them a GPU node of this cluster (e.g. gpu-01)"), lo.warning
    assert "host_label" in lo.warning and "strip_domain" in lo.warning
    assert not some.warning and some.notes == [
        "1 of 2 node(s) matched no GPU node (127.0.0.1); map them with this source's options host_label (the label "
        "naming the node, default `instance`: its host part) or strip_domain (telemetry[1]:node_exporter; "
        "docs/node-telemetry.md)"]
    assert not ok.warning and not ok.notes


def test_half_idle_half_working_bucket_is_no_communication_wait(store: Any) -> None:
    """Issue 44, site trial: a bucket idle half the time and working the other half at 3 GB/s PCIe reads SM 0.45,
    DRAM 0.05, PCIe 1.5 GB/s (>= hint_io_bps) and GPU-Util 0.5: it was called "communication wait". A GPU-Util
    duty cycle under hint_util_pulse_high (0.9) says the GPU was idle part of the bucket: not communication (its
    DRAM and links measured and quiet otherwise: host/input wait). The same means at GPU-Util 1.0 (a kernel
    always running, e.g. NCCL) stay communication wait."""
    m = {"sm_active": 0.45, "dram_active": 0.05, "pcie_rx_bps": 1.5e9}
    store.ingest([*_job("half", "h1", 60, gpu_util=0.5, **m), *_job("comm", "h2", 60, gpu_util=1.0, **m)])
    res = run_audit(store, Config(), T0 - timedelta(hours=1), T0 + timedelta(hours=2))
    got = {a["job_id"]: {k: v for k, v in a["gpu_hours"].items() if v > 1e-9}
           for a in res.summary["waiting"]["allocations"]}
    assert got["half"] == {"starved": 1.0}, got  # before the fix: {"communication": 1.0}
    assert got["comm"] == {"communication": 1.0}


def test_mirage_warning_says_mirage(store: Any, sink: Any) -> None:  # noqa: F811 (the fixture)
    """Issue 44, site trial: the warning about a mirage job (GPU-Util 99 %, SM 0) said "idle 100 %" and its
    outlook "idle 1 % < 95 %" in one mail, and never "mirage"."""
    from test_enforce_rules import channel_cfg
    from test_enforce_rules import run as enforce_run

    now = floor_to(utcnow(), 300)
    world, _, cfg = build(store, Fleet(jobs=[Unit("mirage")], groups=[]), now)
    enforce_run(store, world, channel_cfg(cfg, act_after_hours=1), now)
    msgs = {r["body"]["title"]: r["body"]["message"] for r in sink.requests}
    assert "[gpu-audit] slurm job 1000 is a mirage (reads busy, does no work)" in msgs, msgs
    body = msgs["[gpu-audit] slurm job 1000 is a mirage (reads busy, does no work)"]
    assert "of it a mirage 100%" in body and "idle 1%" not in body and "idle 0% <" not in body, body


def test_report_enforcement_section_says_what_it_left_out(store: Any) -> None:
    """Issue 44, site trial: the report's enforcement section was cut to 25 of 28 rows with no "N more" line,
    and the dropped rows held the warning that led to the only cancel. 28 rows: the warning first, then the
    cancel, then 26 decisions not to act (newer): the cut keeps the warning and the cancel and says 3 more and
    where to see them, in HTML, text and Markdown."""
    from sqlalchemy import insert

    from auditor.report import render
    from auditor.report.context import build_context
    from auditor.store import schema

    store.ingest(_job("j", "e1", 60, sm_active=0.0))
    rid = run_audit(store, Config(), T0, T0 + timedelta(hours=2)).run_id
    base = dict(run_key="r", cluster="c", policy="p", actor="ops@h", dry_run=False, target="slurm job j")
    rows = [dict(base, stage="warn", action="warn", decision="done", reason="idle 100% (the warning)"),
            dict(base, stage="act", action="cancel", decision="done", reason="idle 100% (the cancel)")]
    rows += [dict(base, stage="act", action="none", decision="skipped", reason=f"no {i}") for i in range(26)]
    with store.begin() as conn:
        for i, r in enumerate(rows):
            conn.execute(insert(schema.enforcement_log).values(decided_ts=int(T0.timestamp()) + 60 + i, **r))
    ctx = build_context(store, Config(), rid)
    assert ctx["enforcement"]["log_total"] == 28 and len(ctx["enforcement"]["log"]) == 25
    reasons = [r["reason"] for r in ctx["enforcement"]["log"]]
    assert "idle 100% (the warning)" in reasons and "idle 100% (the cancel)" in reasons  # before: dropped
    for body in (render.render_html(ctx)[0], render.render_text(ctx), render.render_md(ctx)):
        assert "3 more rows of the enforcement log" in body and "gpu-audit enforce-log --limit 28" in body


def test_job_of_a_requeued_job_shows_every_run(store: Any) -> None:
    """Issue 44, site trial: `job CLUSTER:ID` of a requeued job showed only its last run. Job 77 ran three times
    (two REQUEUED runs, then COMPLETED; Slurm gives each a new submit time); a later job of the same id by
    another user is another job, never listed. The CLI page and the web page list the three runs, oldest first,
    with their hours, the newest marked as the one shown."""
    from sqlalchemy import text
    from starlette.testclient import TestClient

    from auditor.web.app import create_app

    def run_(start_h: float, hours: float, state: str, user: str = "u") -> list[Any]:
        s = T0 + timedelta(hours=start_h)
        return [Allocation("c", "slurm", "77", user=user, account="a", state=state, submit=s, start=s,
                           end=s + timedelta(hours=hours), gpus=[AllocatedGpu("r1", 0)]),
                *[GpuBucket("c", "r1", 0, s + timedelta(minutes=5 * i), B, 10, sm_active=0.8)
                  for i in range(int(hours * 12))]]

    store.ingest([*run_(0, 1, "REQUEUED"), *run_(1, 1, "REQUEUED"), *run_(2, 2, "COMPLETED"),
                  *run_(5, 1, "COMPLETED", user="other")])
    run_audit(store, Config(), T0, T0 + timedelta(hours=5))
    v = job_view(store, Config(), "c:77")
    assert v["user"] == "other"  # the newest of the id: another user's job, alone
    assert len(v["job_runs"]) == 1
    with store.engine.connect() as conn:
        aid = conn.execute(text("SELECT id FROM allocations WHERE external_id = '77' AND user_name = 'u' AND "
                                "state = 'COMPLETED'")).scalar()
    v = job_view(store, Config(), aid)
    assert [(r["state"], r["reserved_gpu_hours"], r["shown"]) for r in v["job_runs"]] == [
        ("REQUEUED", 1.0, False), ("REQUEUED", 1.0, False), ("COMPLETED", 2.0, True)]
    page = format_job(v)
    assert "RUNS of this job (3, each a requeue or restart under the same id), oldest first:" in page
    assert page.count("REQUEUED: 1.0 GPU-h reserved") == 2 and "*3." in page
    html = TestClient(create_app(store, Config())).get(f"/allocation/{aid}").text
    assert 'id="runs"' in html and html.count("REQUEUED") >= 2


def test_reservation_notice_is_judged_over_the_window_and_repeated(store: Any, sink: Any) -> None:  # noqa: F811
    """Issue 44, site trial: the reservation owner's notice fired 50 s after the reservation started ("0.1 of
    0.1 GPU-h idle") and never again while 4.5 of 4.9 GPU-h went unused. A 1-GPU reservation for alice with
    nothing in it, the policy's window 1 h: no notice 50 s in; one at 1 h 5 min ("1.0 of 1.0 ... in the last
    1 h"); none again in the same window; again in the next window while it stays idle."""
    from auditor.config import Channel, Policy, SecretRef
    from auditor.records import Reservation

    start = floor_to(utcnow(), 3600) - timedelta(hours=3)
    store.ingest([Reservation("hpc", "resv-b", start, start + timedelta(hours=5), nodes=["n9"], gpu_count=1,
                              users=["alice"])])
    cfg = Config(policies=[Policy(name="p", clusters=["hpc"])],
                 channels=[Channel(name="alice-dm", url=SecretRef(env="GPU_AUDIT_TEST_HOOK"), users=["alice"])])

    def at(minutes: int) -> list[str]:
        enforce(store, cfg, apply=True, backends=lambda c, s: None, now=start + timedelta(minutes=minutes))
        return [r["body"]["message"] for r in sink.requests]

    assert at(1) == []  # 50 s in: before the fix, "0.0 of 0.0 reserved GPU-hours idle"
    told = ("reservation resv-b on hpc: 1.0 of 1.0 reserved GPU-hours idle in the last 1 h. Release it if it is "
            "not needed.")
    assert at(65) == [told]
    assert at(70) == [told]  # the same window: throttled
    assert at(125) == [told, told]  # still idle in the next window: told again (before the fix: never)


def test_job_view_is_clipped_to_the_allocation(store: Any) -> None:
    """Issue 44, site trial: the job view mixed in the free GPU's readings before and after the job (SM 79 % in
    the header, the last bin drawn from them). Job "edge" holds g1:0 for [150 s, 1650 s); the GPU read SM 0.9
    free before it ([0, 150 s) of the first bucket) and after it ([1650, 1800 s) of the last), SM 0 in the four
    buckets between: its mean SM is 0 %, its GPU row too, and no bin is drawn working."""
    s0 = T0
    rows = [Allocation("c", "slurm", "edge", user="u", account="a", start=s0 + timedelta(seconds=150),
                       end=s0 + timedelta(seconds=1650), gpus=[AllocatedGpu("g1", 0)]),
            GpuBucket("c", "g1", 0, s0, B, 5, sm_active=0.9, gpu_util=1.0, observed_s=150.0,
                      span_start=s0, span_end=s0 + timedelta(seconds=150)),
            *[GpuBucket("c", "g1", 0, s0 + timedelta(seconds=300 * i), B, 10, sm_active=0.0, gpu_util=0.0)
              for i in range(1, 5)],
            GpuBucket("c", "g1", 0, s0 + timedelta(seconds=1500), B, 5, sm_active=0.9, gpu_util=1.0, observed_s=150.0,
                      span_start=s0 + timedelta(seconds=1650), span_end=s0 + timedelta(seconds=1800))]
    store.ingest(rows)
    run_audit(store, Config(), T0 - timedelta(hours=1), T0 + timedelta(hours=1))
    v = job_view(store, Config(), "c:edge")
    (g,) = v["gpus"]
    assert g["metrics"]["sm_active"]["mean"] == 0.0, g["metrics"]  # before the fix: 0.3 (the free GPU's 0.9)
    assert g["metrics"]["gpu_util"]["peak"] == 0.0
    assert "working" not in g["timeline"]["verdicts"], g["timeline"]["verdicts"]
    assert v["summary"]["mean_sm_active"] == 0.0  # the audit's own figure agrees
