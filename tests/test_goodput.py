"""Training goodput (auditor/audit/goodput.py, docs/definitions.md "Goodput"): GPU-hours lost to failed and
requeued runs, split by cause, per team, on SQLite and PostgreSQL; the same figure in the report context, the
``failed_restarts`` finding and the chargeback column; and the demo's planted job 1050, by hand."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_findings_extra import T0, W0, W1, WORK, findings, job, run

from auditor.audit.run import run_audit
from auditor.cli import main
from auditor.config import Config, PriceCard, Team, Thresholds
from auditor.config import load as load_config
from auditor.records import AllocatedGpu, NodeEvent
from auditor.report import chargeback as cb
from auditor.report.context import build_context
from auditor.store.engine import Store

H = timedelta(hours=1)


def cfg(**th: Any) -> Config:
    return Config(prices=PriceCard(default=2.0), thresholds=Thresholds(**th),
                  teams=[Team(name="ml", accounts=["a1"]), Team(name="bio", accounts=["a2"])])


def gpus(node: str, n: int) -> list[AllocatedGpu]:
    return [AllocatedGpu(node, i) for i in range(n)]


def planted() -> list[Any]:
    """Job 10 (team ml) runs three times on n1's 2 GPUs (Slurm resets the submit time on a requeue): a node
    failure, a failed exit while n1 threw an XID (instantaneous), then a clean finish. Job 30 (ml) is
    preempted on n3 during a drain (a drain does not kill a job). Team bio: job 20 out of memory, job 50
    timed out during fault throttling (not a killing event), job 40 completes and works."""
    xid_at = T0 + 3.5 * H
    return [
        job("10", gpus("n1", 2), 2, start=T0, state="NODE_FAIL", account="a1", submit=T0),
        job("10", gpus("n1", 2), 1, start=T0 + 3 * H, state="FAILED", account="a1", submit=T0 + 3 * H),
        job("10", gpus("n1", 2), 1, start=T0 + 5 * H, state="COMPLETED", account="a1", submit=T0 + 5 * H),
        job("30", gpus("n3", 4), 0.5, start=T0, state="PREEMPTED", account="a1"),
        job("20", gpus("n2", 1), 3, start=T0, state="OUT_OF_MEMORY", account="a2"),
        job("50", gpus("n4", 1), 1, start=T0, state="TIMEOUT", account="a2"),
        job("40", [AllocatedGpu("n2", 1)], 4, start=T0, state="COMPLETED", account="a2"),
        *run("n2", 1, 0, 48, **WORK),  # job 40's 4 h at SM 0.8: 3.2 effective GPU-h
        NodeEvent("c", "n1", "xid", xid_at, xid_at, gpu=0, reason="XID 79"),
        NodeEvent("c", "n3", "drain", T0 - H, T0 + 2 * H, reason="maintenance"),
        NodeEvent("c", "n4", "throttle", T0, T0 + H, gpu=0),
    ]


# By hand: ml reserved 2 x (2 + 1 + 1) = 8 (job 10) + 4 x 0.5 = 2 (job 30) = 10 GPU-h; lost: infrastructure
# 2 x 2 (NODE_FAIL) + 2 x 1 (FAILED under the XID) = 6, preempted 2, user 0 = 8; useful (10 - 8) / 10 = 0.2.
# bio reserved 3 + 1 + 4 = 8; lost user 3 (OOM) + 1 (TIMEOUT) = 4; useful 4 / 8 = 0.5; effective 3.2 / 8 = 0.4.
# All: reserved 18, lost 12 (infrastructure 6, user 4, preempted 2), useful 6 / 18; cost 12 x 2.0 = 24.
ML = {"team": "ml", "reserved_gpu_hours": 10.0, "lost_gpu_hours": 8.0, "infrastructure_gpu_hours": 6.0,
      "user_gpu_hours": 0.0, "preempted_gpu_hours": 2.0, "useful_share": 0.2, "effective_share": 0.0}
BIO = {"team": "bio", "reserved_gpu_hours": 8.0, "lost_gpu_hours": 4.0, "infrastructure_gpu_hours": 0.0,
       "user_gpu_hours": 4.0, "preempted_gpu_hours": 0.0, "useful_share": 0.5, "effective_share": 0.4}


def test_lost_gpu_hours_by_cause_and_team(store: Store) -> None:
    store.ingest(planted())
    c = cfg()
    rid = run_audit(store, c, W0, W1).run_id
    g = build_context(store, c, rid)["goodput"]
    assert g["teams"] == [pytest.approx(ML), pytest.approx(BIO)]
    assert g["totals"] == pytest.approx({"reserved_gpu_hours": 18.0, "lost_gpu_hours": 12.0,
                                         "infrastructure_gpu_hours": 6.0, "user_gpu_hours": 4.0,
                                         "preempted_gpu_hours": 2.0, "lost_cost": 24.0, "runs": 5,
                                         "useful_share": 6 / 18})
    causes = {(r["job"], r["state"]): r["cause"] for r in g["runs"]}
    assert causes == {("10", "NODE_FAIL"): "infrastructure", ("10", "FAILED"): "infrastructure",
                      ("30", "PREEMPTED"): "preempted", ("20", "OUT_OF_MEMORY"): "user", ("50", "TIMEOUT"): "user"}
    assert next(r for r in g["runs"] if r["state"] == "FAILED")["events"] == ["n1 xid: XID 79"]
    # one finding, on job 10's latest run: 2 restarts >= 2; its GPU-hours are its failed runs' 4 + 2 = 6
    f = findings(store, rid, "failed_restarts")
    assert list(f) == ["10"] and len(f["10"]) == 1
    ev = f["10"][0]["evidence"]
    assert (f["10"][0]["gpu_hours"], f["10"][0]["idle_gpu_hours"], ev["restarts"]) == (6.0, 0.0, 2)
    assert ev["lost_by_cause"] == {"infrastructure": 6.0, "user": 0.0, "preempted": 0.0}
    assert f["10"][0]["start_ts"] == int(T0.timestamp()) and f["10"][0]["end_ts"] == int((T0 + 6 * H).timestamp())
    # the chargeback column is the same figure, by team and by account
    by_team = {r["owner"]: float(r["lost_gpu_hours"]) for r in cb.chargeback(store, c, W0, W1, "team", run_id=rid)}
    assert by_team == {"ml": 8.0, "bio": 4.0}
    rows = cb.chargeback(store, c, W0, W1, "account", run_id=rid)
    assert {r["owner"]: float(r["lost_gpu_hours"]) for r in rows} == {"a1": 8.0, "a2": 4.0}
    assert float(cb.totals(rows)["lost_gpu_hours"]) == 12.0


def test_the_rule_constants_decide(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """No killing event kinds: job 10's FAILED run is the user's; 3 restarts needed: no finding (the rule's
    constants, auditor.audit.goodput, settings until issue 45)."""
    from auditor.audit import goodput

    store.ingest(planted())
    monkeypatch.setattr(goodput, "GOODPUT_INFRA_EVENTS", ())
    monkeypatch.setattr(goodput, "GOODPUT_MIN_RESTARTS", 3)
    c = cfg()
    rid = run_audit(store, c, W0, W1).run_id
    g = build_context(store, c, rid)["goodput"]
    assert g["totals"]["infrastructure_gpu_hours"] == pytest.approx(4.0)  # NODE_FAIL only
    assert g["totals"]["user_gpu_hours"] == pytest.approx(4.0 + 2.0)
    assert findings(store, rid, "failed_restarts") == {}
    # a drain that killed jobs at this site: job 30's preemption on the drained n3 becomes infrastructure
    monkeypatch.setattr(goodput, "GOODPUT_INFRA_EVENTS", ("drain",))
    c2 = cfg()
    rid2 = run_audit(store, c2, W0, W1).run_id
    runs = {r["job"]: r for r in build_context(store, c2, rid2)["goodput"]["runs"]}
    assert runs["30"]["cause"] == "infrastructure" and runs["30"]["events"] == ["n3 drain: maintenance"]


def test_no_failures_no_section(store: Store) -> None:
    store.ingest([job("1", gpus("n1", 1), 2, state="COMPLETED", account="a1")])
    c = cfg()
    rid = run_audit(store, c, W0, W1).run_id
    g = build_context(store, c, rid)["goodput"]
    assert g["totals"]["runs"] == 0 and g["totals"]["useful_share"] == pytest.approx(1.0) and g["runs"] == []
    assert [float(r["lost_gpu_hours"]) for r in cb.chargeback(store, c, W0, W1, "team", run_id=rid)] == [0.0]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("demo")
    res = CliRunner().invoke(main, ["--json", "demo", "--out", str(out), "--now", "2026-11-29T00:00"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), out


def test_demo_job_1050_failed_and_requeued_twice(demo: tuple[dict, Path]) -> None:
    """By hand (auditor/demo.py REQUEUED_RUNS, 4 H100s at 4.0 per GPU-hour): a node failure 4 x 12 = 48
    GPU-h (infrastructure), a preemption 4 x 10 = 40 (preempted), a failed exit 4 x 6 = 24 (user): 112 GPU-h,
    USD 448. Team llm (account team-a) reserved 1120 + 24 + 144 + 112 + 80 (the straggler job 1060) + 48 (1070,
    waiting on storage) = 1528: useful (1528 - 112) / 1528 = 92.7 %; the whole demo 2698 reserved
    (tests/test_demo.py): useful (2698 - 112) / 2698."""
    data, out = demo
    c = load_config(out / "demo.toml")
    store = Store.open(c.store.resolved_url())
    g = build_context(store, c, data["run_id"])["goodput"]
    whole = 2698.0 + 12 + (168 + 96) / 7  # the 2026 site's hung all-reduce and MIG slices (tests/test_demo.py)
    assert g["totals"] == pytest.approx({"reserved_gpu_hours": whole, "lost_gpu_hours": 112.0,
                                         "infrastructure_gpu_hours": 48.0, "user_gpu_hours": 24.0,
                                         "preempted_gpu_hours": 40.0, "lost_cost": 448.0, "runs": 3,
                                         "useful_share": (whole - 112) / whole})
    assert [(t["team"], t["lost_gpu_hours"]) for t in g["teams"]] == [("llm", pytest.approx(112.0))]
    assert g["teams"][0]["useful_share"] == pytest.approx((1528 - 112) / 1528)
    assert [(r["job"], r["state"], r["cause"]) for r in g["runs"]] == [
        ("1050", "NODE_FAIL", "infrastructure"), ("1050", "PREEMPTED", "preempted"), ("1050", "FAILED", "user")]
    f = g["findings"]
    assert [(r["kind"], r["job_id"], r["gpu_hours"]) for r in f["rows"]] == [("failed_restarts", "1050", 112.0)]
    txt = (out / "reports" / f"report-{data['run_id']}.txt").read_text()
    assert "Lost: 112.0 GPU-h of 2,747.7 reserved (3 failed runs, USD 448.00)" in txt
    md = (out / "reports" / f"report-{data['run_id']}.md").read_text()
    assert "| llm | 1,528.0 | 112.0 | 48.0 | 24.0 | 40.0 | 93% |" in md
    html = (out / "reports" / f"report-{data['run_id']}.html").read_text()
    assert 'id="goodput"' in html and "<strong>112.0</strong> of 2,747.7 reserved" in html
    rows = cb.chargeback(store, c, *_window(data), "team", run_id=data["run_id"])
    assert {r["owner"]: float(r["lost_gpu_hours"]) for r in rows if r["lost_gpu_hours"]} == {"llm": 112.0}
    store.engine.dispose()


def _window(data: dict) -> tuple[Any, Any]:
    from datetime import datetime

    return datetime.fromisoformat(data["since"]), datetime.fromisoformat(data["until"])


def test_failed_pod_is_lost_time(store: Store) -> None:
    """A Kubernetes pod in phase Failed lost its time (the user's: no node event); a Succeeded one did not.
    By hand: 2 GPUs x 1.5 h = 3 GPU-h lost of 3 + 1 x 2 = 5 reserved; useful 2 / 5."""
    from auditor.records import Allocation

    def pod(uid: str, n: int, hours: float, phase: str) -> Allocation:
        return Allocation("c", "kubernetes", uid, user="", account="a2", start=T0, end=T0 + hours * H,
                          gpus=gpus(f"node-{uid}", n), state=phase)

    store.ingest([pod("p1", 2, 1.5, "Failed"), pod("p2", 1, 2, "Succeeded")])
    c = cfg()
    rid = run_audit(store, c, W0, W1).run_id
    g = build_context(store, c, rid)["goodput"]
    assert [(r["job"], r["state"], r["cause"], r["lost_gpu_hours"]) for r in g["runs"]] == [
        ("p1", "FAILED", "user", pytest.approx(3.0))]
    assert g["teams"] == [pytest.approx({**BIO, "reserved_gpu_hours": 5.0, "lost_gpu_hours": 3.0,
                                         "user_gpu_hours": 3.0, "useful_share": 2 / 5, "effective_share": 0.0})]


FIX = Path(__file__).parent / "fixtures" / "slurm" / "24.11" / "running"


def test_slurm_restart_count_is_read() -> None:
    """Real Slurm 24.11 output (tests/fixtures/slurm/24.11/running): every job says Restarts=0 /
    restart_cnt 0; the same record with Restarts=2 (as scontrol prints a twice-requeued job) reads 2."""
    from connectors.slurm.jobs import from_json_job, from_scontrol_job, restart_count
    from connectors.slurm.parse import scontrol_records

    records = scontrol_records((FIX / "scontrol-show-job-oneliner.txt").read_text())
    assert records and {from_scontrol_job(r, "c").restarts for r in records} == {0}
    assert from_scontrol_job(records[0].replace("Restarts=0", "Restarts=2"), "c").restarts == 2
    jobs = json.loads((FIX / "scontrol-show-job.json").read_text())["jobs"]
    assert {from_json_job(j, "c").restarts for j in jobs} == {0}
    assert from_json_job({**jobs[0], "restart_cnt": {"set": True, "infinite": False, "number": 3}}, "c").restarts == 3
    assert [restart_count(v) for v in (None, "", "x", -1, {"set": False, "number": 0})] == [None] * 5


def test_slurm_restart_count_without_the_earlier_runs(store: Store) -> None:
    """A job Slurm says it restarted 3 times whose earlier runs were never collected: 3 restarts (a finding),
    its lost hours only its own failed run's: 1 GPU x 2 h = 2 GPU-h. A job with Restarts=1: below the
    threshold."""
    store.ingest([job("70", gpus("n5", 1), 2, state="FAILED", account="a2", restarts=3),
                  job("71", gpus("n6", 1), 1, state="COMPLETED", account="a2", restarts=1)])
    rid = run_audit(store, cfg(), W0, W1).run_id
    f = findings(store, rid, "failed_restarts")
    assert list(f) == ["70"] and (f["70"][0]["gpu_hours"], f["70"][0]["evidence"]["restarts"]) == (2.0, 3)


def test_pod_container_restarts_are_read(store: Store) -> None:
    """The recorded pods (tests/fixtures/kubernetes/pods-all.json, a real API server's listing) all say
    restartCount 0; a pod whose container restarted 4 times (the same object, restartCount 4) reads 4 and is
    a failed_restarts finding: its restarts are in the evidence, its lost GPU-hours 0 (it never ended
    failed; the time a container lost inside a pod is not measured)."""
    import copy

    from auditor.records import Allocation
    from connectors.k8s_resources import pod_restarts

    items = json.loads((Path(__file__).parent / "fixtures" / "kubernetes" / "pods-all.json").read_text())["items"]
    assert {pod_restarts(p) for p in items if (p.get("status") or {}).get("containerStatuses")} == {0}
    crashing = copy.deepcopy(next(p for p in items if (p.get("status") or {}).get("containerStatuses")))
    crashing["status"]["containerStatuses"][0]["restartCount"] = 4
    assert pod_restarts(crashing) == 4 and pod_restarts({"status": {}}) is None
    store.ingest([Allocation("c", "kubernetes", "uid-1", user="", account="a2", start=T0, end=T0 + 2 * H,
                             gpus=gpus("node-k", 1), state="Succeeded", restarts=pod_restarts(crashing))])
    rid = run_audit(store, cfg(), W0, W1).run_id
    f = findings(store, rid, "failed_restarts")
    assert list(f) == ["uid-1"] and (f["uid-1"][0]["gpu_hours"], f["uid-1"][0]["evidence"]["restarts"]) == (0.0, 4)


def proxy_fleet() -> list[Any]:
    """Team ml's job 60 on n5 GPUs 0-1 for 4 h: GPU 0 at SM 0.8, Tensor 0.5 all along; GPU 1 at SM 0.6,
    Tensor 0.3 for 2 h, then no samples. Team bio's job 70 on n6 GPU 0 for 2 h at SM 0.5 with no Tensor field
    (its exporter does not collect DCGM_FI_PROF_PIPE_TENSOR_ACTIVE). No run failed."""
    return [job("60", gpus("n5", 2), 4, state="COMPLETED", account="a1"),
            job("70", gpus("n6", 1), 2, state="COMPLETED", account="a2"),
            *run("n5", 0, 0, 48, sm_active=0.8, tensor_active=0.5, gpu_util=1.0),
            *run("n5", 1, 0, 24, sm_active=0.6, tensor_active=0.3, gpu_util=1.0),
            *run("n6", 0, 0, 24, sm_active=0.5, gpu_util=1.0)]


def test_tensor_pipe_activity_as_an_mfu_proxy_on_every_surface(store: Store) -> None:
    """By hand: ml's Tensor GPU-hours 4 x 0.5 + 2 x 0.3 = 2.6 over 4 + 2 = 6 SM-observed GPU-h: 43 %; bio has
    2 SM-observed GPU-h and no Tensor field: not measured (never 0 %); overall 2.6 / 8 = 32.5 %, shown 32 %
    (Python rounds half to even) beside Llama 3's 38-43 % and PaLM's 46 %. The goodput section shows it
    although no run failed; text, Markdown, HTML and JSON all show these same figures."""
    from auditor.report.render import render_html, render_json, render_md, render_text

    store.ingest(proxy_fleet())
    c = cfg()
    rid = run_audit(store, c, W0, W1).run_id
    ctx = build_context(store, c, rid)
    tp = ctx["goodput"]["tensor"]
    assert ctx["goodput"]["totals"]["runs"] == 0
    assert tp["tensor_share"] == pytest.approx(2.6 / 8) and tp["observed_gpu_hours"] == pytest.approx(8.0)
    assert [(t["team"], t["observed_gpu_hours"], t["tensor_share"]) for t in tp["teams"]] == [
        ("ml", pytest.approx(6.0), pytest.approx(2.6 / 6)), ("bio", pytest.approx(2.0), None)]
    assert [(a["job"], a["tensor_share"]) for a in tp["allocations"]["rows"]] == [("60", pytest.approx(2.6 / 6)),
                                                                         ("70", None)]
    assert [(p["low"], p["high"]) for p in tp["published"]] == [(0.38, 0.43), (0.46, 0.46)]
    txt, md, (html, _) = render_text(ctx), render_md(ctx), render_html(ctx)
    for body in (txt, md, html):
        assert "MFU proxy" in body and "not MFU" in body, body[:300]
        assert "32%" in body and "43%" in body and "not measured" in body
        assert "38%-43%" in body and "46%" in body and "Llama 3" in body and "PaLM" in body
    assert "team ml: Tensor-pipe activity 43% over 6.0 GPU-h" in txt
    assert "team bio: Tensor-pipe activity not measured over 2.0 GPU-h" in txt
    doc = __import__("json").loads(render_json(ctx))
    assert doc["goodput"]["tensor"]["teams"][0]["tensor_share"] == pytest.approx(2.6 / 6)


def test_a_reused_job_id_is_never_another_users_restart_chain(store: Store) -> None:
    """Issue 44 "Tenants": three users' single failures of one reused job id (wrap-around: each its own submit
    time) are three jobs with no restart, never one user's ``failed_restarts`` carrying the others' lost
    hours. One user's own requeued job (same id, user and account, a new submit time per run) is still one
    chain: 2 restarts, its two failed runs' 2 x 1 GPU-h lost."""
    reused = [job("90", gpus(f"n{i + 1}", 1), 1, start=T0 + i * 2 * H, state="FAILED", account="a1",
                  submit=T0 + i * 2 * H, user=u) for i, u in enumerate(("ann", "ben", "cy"))]
    chain = [job("91", gpus("n5", 1), 1, start=T0 + i * 2 * H, state=st, account="a2", submit=T0 + i * 2 * H,
                 user="dee") for i, st in enumerate(("FAILED", "NODE_FAIL", "COMPLETED"))]
    store.ingest([*reused, *chain])
    rid = run_audit(store, cfg(), W0, W1).run_id
    f = findings(store, rid, "failed_restarts")
    assert list(f) == ["91"], {k: [(x["user_name"], x["gpu_hours"]) for x in v] for k, v in f.items()}
    one = f["91"][0]
    assert (one["user_name"], one["gpu_hours"], one["evidence"]["restarts"]) == ("dee", 2.0, 2)
    # each of job 90's users keeps their own lost hour, in the goodput section
    g = build_context(store, cfg(), rid)["goodput"]
    assert g["totals"]["lost_gpu_hours"] == pytest.approx(3.0 + 2.0)


def test_a_fault_counts_only_on_the_gpus_it_touched(store: Store) -> None:
    """Issue 44, site trial: an operator's `scontrol requeue` of job 60 (GPU 0 of n5) while job 61's GPU 1 on
    the same node logged an XID was blamed on "infrastructure". A GPU fault counts against a run only on a GPU
    it held; a node-wide event (down) counts for every run on the node: job 62 (GPU 2 of n6) requeued while n6
    was down is infrastructure."""
    xid_at = T0 + 0.5 * H
    store.ingest([job("60", [AllocatedGpu("n5", 0)], 1, start=T0, state="REQUEUED", account="a1"),
                  job("61", [AllocatedGpu("n5", 1)], 1, start=T0, state="COMPLETED", account="a1"),
                  NodeEvent("c", "n5", "xid", xid_at, xid_at, gpu=1, reason="XID 79"),
                  job("62", [AllocatedGpu("n6", 2)], 1, start=T0, state="REQUEUED", account="a1"),
                  NodeEvent("c", "n6", "down", T0 + 0.25 * H, T0 + 0.75 * H, reason="node down")])
    rid = run_audit(store, cfg(), W0, W1).run_id
    from auditor.audit.goodput import lost_runs

    with store.engine.connect() as conn:
        causes = {r["external_id"]: r["cause"] for r in lost_runs(conn, rid, cfg().thresholds)}
    assert causes == {"60": "preempted", "62": "infrastructure"}  # before the fix: 60 "infrastructure"
