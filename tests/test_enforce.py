"""Enforcement decisions on a real store (SQLite and PostgreSQL) with the Kubernetes actions going through
the real client to the replay server: which allocation gets which stage and action, what blocks acting
(exemptions, coverage, GPU-Util-only and unverified time, infrastructure, the cap, a stale store), dry-run
versus --apply, and the audit-log rows. Telemetry is hand-built so every expected number is a hand count."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).parent))
from k8s_actions import ActionServer  # noqa: E402
from k8s_server import TOKEN  # noqa: E402
from test_notify import smtp_server  # noqa: E402, F401, F811 (fixture)

from auditor.audit import exempt
from auditor.config import Config, EnforceConfig, ExemptionRule, Policy  # noqa: E402
from auditor.enforce.policy import enforce  # noqa: E402
from auditor.records import AllocatedGpu, Allocation, GpuBucket  # noqa: E402
from auditor.store import schema  # noqa: E402
from auditor.timeutil import floor_to, utcnow  # noqa: E402
from connectors.actions.kubernetes import KubernetesActions  # noqa: E402
from connectors.kubernetes import KubernetesOptions  # noqa: E402

TOKEN_ENV = "GPU_AUDIT_TEST_K8S_TOKEN"
NB = ("research", "notebook-alice-6d5f8b7c9-tx2lq", "903819e2-6ee2-45e4-89cf-b620c277c31a", "gpu-node-a", 0)
LLAMA = ("ml-train", "llama-ft-x7k2p", "daeb5749-9f34-4d99-9766-0ceec707c6ca", "gpu-node-a", 1)
BARE = ("research", "prep-then-train", "029c1ef3-d0db-4150-ba35-23333803d268", "gpu-node-b", 0)
TRITON = ("inference", "triton-mig-0", "22f85480-39e0-4b93-92b6-ba1eb21f8532", "gpu-node-mig", 0)


def series(cluster: str, host: str, idx: int, start: datetime, hours: float, sm: float | None,
           util: float | None) -> list[GpuBucket]:
    return [GpuBucket(cluster, host, idx, start + timedelta(seconds=300 * i), 300, 10, sm_active=sm, gpu_util=util)
            for i in range(int(hours * 12))]


def pod(p: tuple, start: datetime, user: str = "alice") -> Allocation:
    ns, name, uid, node, idx = p
    return Allocation("k8s", "kubernetes", uid, name=name, user=user, account=ns, start=start,
                      gpus=[AllocatedGpu(node, idx)])


@pytest.fixture
def now() -> datetime:
    return floor_to(utcnow(), 300)


@pytest.fixture
def world(store: Any, now: datetime, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, ActionServer]]:
    """4 hours of history ending now: notebook idle, llama working, prep-then-train idle, triton idle with
    the last hour unobserved; Slurm job 201 idle by GPU-Util only, 202 GPU-Util busy without SM activity."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    t0 = now - timedelta(hours=4)
    recs: list = [pod(NB, t0), pod(LLAMA, t0, "bob"), pod(BARE, t0), pod(TRITON, t0, "carol")]
    recs += series("k8s", "gpu-node-a", 0, t0, 4, 0.01, 0.0) + series("k8s", "gpu-node-a", 1, t0, 4, 0.8, 0.9)
    recs += series("k8s", "gpu-node-b", 0, t0, 4, 0.0, 0.0) + series("k8s", "gpu-node-mig", 0, t0, 3, 0.0, 0.0)
    recs += [Allocation("hpc", "slurm", "201", user="dave", account="acct", partition="gpu", start=t0,
                        gpus=[AllocatedGpu("n1", 0)]),
             Allocation("hpc", "slurm", "202", user="erin", account="acct", partition="gpu", start=t0,
                        gpus=[AllocatedGpu("n1", 1)])]
    recs += series("hpc", "n1", 0, t0, 4, None, 0.0) + series("hpc", "n1", 1, t0, 4, None, 0.9)
    store.ingest(recs)
    collected(store, ["k8s", "hpc"], now)
    with ActionServer() as srv:
        yield store, srv


def collected(store: Any, clusters: list[str], until: datetime, source: str = "telemetry[0]:file") -> None:
    """What a successful collection leaves: the source's watermark at ``until`` (rule (d): evidence must
    reach the last collected window)."""
    with store.begin() as conn:
        for c in clusters:
            store.set_watermark(conn, c, source, int(until.timestamp()))


def cfg(**enforce: Any) -> Config:
    return Config(policies=[Policy(name="idle-2h", warn_after_hours=1, act_after_hours=2)],
                  enforce=EnforceConfig(**enforce))


def backends(srv: ActionServer) -> Any:
    k8s = KubernetesActions("k8s", KubernetesOptions.model_validate({"host": srv.url, "token": {"env": TOKEN_ENV}}))
    return lambda cluster, source: k8s if source == "kubernetes" else None


def log_rows(store: Any) -> list[dict[str, Any]]:
    t = schema.enforcement_log
    with store.engine.connect() as conn:
        return [dict(r) for r in conn.execute(select(t).order_by(t.c.id)).mappings()]


def short(rows: list[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    return {(r["target"], r["stage"], r["action"], r["decision"]) for r in rows}


def test_dry_run_then_apply(world: tuple[Any, ActionServer], now: datetime) -> None:
    store, srv = world
    c = cfg()
    exempt.add(store, c, "k8s:research/prep-then-train", "now+1day", "deadline run for the paper", by="tester")
    res = enforce(store, c, backends=backends(srv), now=now)
    assert res["dry_run"] is True and res["acted"] == 1
    rows = log_rows(store)
    assert short(rows) == {
        ("Deployment research/notebook-alice", "act", "scale_to_zero", "dry_run"),
        ("Pod research/prep-then-train", "act", "none", "skipped"),  # exempt
        ("kubernetes inference/triton-mig-0", "act", "none", "skipped"),  # coverage
        ("slurm job 201", "act", "none", "skipped"),  # GPU-Util-only idle never leads to an act
        ("slurm job 201", "warn", "warn", "skipped"),  # ...but warns (here: nobody to tell)
        ("slurm job 202", "act", "none", "skipped"),  # GPU-Util busy, no SM: never idle
    }
    assert len(rows) == 6 and all(r["dry_run"] and r["actor"] for r in rows)
    why = {(r["target"], r["stage"]): r["reason"] for r in rows}
    assert why[("Pod research/prep-then-train", "act")] == "exempt (recorded by tester): deadline run for the paper"
    # triton: observed 1 of the 2 act-window hours (its last hour has no samples) -> coverage 50 %
    assert why[("kubernetes inference/triton-mig-0", "act")].startswith("telemetry coverage 50% < min_coverage 80%")
    assert "do not count as idle" in why[("slurm job 201", "act")]
    assert "idle 0% < 95%" in why[("slurm job 202", "act")] or "coverage 0%" in why[("slurm job 202", "act")]
    nb = next(r for r in rows if r["action"] == "scale_to_zero")
    # act window = 2 h x 1 GPU, all of it idle (SM 0.01 < 0.05): 2.0 idle GPU-hours, share 100 %
    assert (nb["evidence"]["reserved_gpu_hours"], nb["evidence"]["idle_gpu_hours"], nb["evidence"]["coverage"]) == \
        (2.0, 2.0, 1.0)
    assert nb["reason"] == "would scale_to_zero: idle 100% of reserved time in the last 2 h >= 95%"
    assert [n["target"] for n in res["not_idle"]] == ["kubernetes ml-train/llama-ft-x7k2p"]
    assert srv.replay.writes == []  # a dry run changes nothing

    res = enforce(store, c, apply=True, backends=backends(srv), now=now)
    assert res["dry_run"] is False and res["acted"] == 1
    assert srv.replay.writes == [("PATCH", "/apis/apps/v1/namespaces/research/deployments/notebook-alice/scale",
                                  "application/merge-patch+json", {"spec": {"replicas": 0}})]
    applied = [r for r in log_rows(store) if not r["dry_run"]]
    done = [r for r in applied if r["decision"] == "done"]
    assert [(r["target"], r["action"], r["result"]) for r in done] == [
        ("Deployment research/notebook-alice", "scale_to_zero",
         "scaled Deployment research/notebook-alice to 0 replicas (had 1): HTTP 200")]
    assert not any(r["decision"] == "done" for r in applied if "prep-then-train" in r["target"]
                   or "triton" in r["target"] or "20" in r["target"])


def test_cap_config_switch_and_exemption_rules(world: tuple[Any, ActionServer], now: datetime) -> None:
    store, srv = world
    c = cfg(apply=True, max_actions_per_run=1)
    res = enforce(store, c, backends=backends(srv), now=now)
    assert res["dry_run"] is False  # enforce.apply = true acts without --apply
    acts = [r for r in log_rows(store) if r["stage"] == "act" and r["action"] != "none"]
    # allocations are taken in id order: the notebook acts, prep-then-train hits the cap of 1
    assert [(r["target"], r["decision"], r["reason"]) for r in acts] == [
        ("Deployment research/notebook-alice", "done", "idle 100% of reserved time in the last 2 h >= 95%"),
        ("Pod research/prep-then-train", "skipped", "cap reached: enforce.max_actions_per_run = 1")]
    assert len(srv.replay.writes) == 1

    # standing rules: by namespace, with an expiry; an expired rule exempts nothing
    rule = ExemptionRule(reason="inference is on call", namespaces=["research"], until=now + timedelta(days=1))
    old = ExemptionRule(reason="old", users=["alice"], until=now - timedelta(days=1))
    c2 = c.model_copy(update={"exemptions": [old, rule], "enforce": EnforceConfig(apply=False)})
    enforce(store, c2, backends=backends(srv), now=now)
    last = [r for r in log_rows(store) if r["dry_run"] and "prep-then-train" in r["target"]]
    assert last[-1]["reason"] == "exempt (config exemptions[1]): inference is on call"


def test_annotation_infra_and_stale(world: tuple[Any, ActionServer], now: datetime) -> None:
    store, srv = world
    pod_b = srv.replay.find("pods", "research", "prep-then-train")
    pod_b["metadata"]["annotations"] = {"gpu-audit.io/exempt-until": (now + timedelta(hours=5)).isoformat(),
                                        "gpu-audit.io/exempt-reason": "checkpoint at 18:00"}
    srv.replay.find("nodes", None, "gpu-node-a")["spec"]["unschedulable"] = True
    srv.replay.find("pods", "inference", "triton-mig-0")["metadata"]["name"] = "renamed"
    enforce(store, cfg(), backends=backends(srv), now=now)
    why = {r["target"]: r["reason"] for r in log_rows(store) if r["stage"] == "act"}
    assert why["Pod research/prep-then-train"] == \
        "exempt (pod annotation gpu-audit.io/exempt-until): checkpoint at 18:00"
    assert why["Deployment research/notebook-alice"] == "infrastructure trouble: node gpu-node-a is cordoned"
    # triton's coverage block comes first (decided before any live check)
    assert why["kubernetes inference/triton-mig-0"].startswith("telemetry coverage 50%")
    # an expired annotation exempts nothing
    pod_b["metadata"]["annotations"]["gpu-audit.io/exempt-until"] = (now - timedelta(hours=1)).isoformat()
    srv.replay.find("nodes", None, "gpu-node-a")["spec"]["unschedulable"] = False
    srv.replay.find("pods", "research", "notebook-alice-6d5f8b7c9-tx2lq")["metadata"]["name"] = "gone"
    res = enforce(store, cfg(), backends=backends(srv), now=now)
    got = {(d["target"], d["decision"]): d["reason"] for d in res["decisions"] if d["stage"] == "act"}
    assert got[("Pod research/prep-then-train", "dry_run")].startswith("would delete_pod")
    assert got[("Pod research/notebook-alice-6d5f8b7c9-tx2lq", "skipped")] == "not running any more (state gone)"


def test_exempt_command_records_who_why_until(store: Any, now: datetime) -> None:
    c = Config(clusters=[{"name": "hpc"}])
    row = exempt.add(store, c, "hpc:4242", "now+2days", "  thesis deadline ", by="alice@login1", future=True,
                     now=now)
    assert (row["cluster"], row["external_id"], row["reason"], row["requested_by"]) == \
        ("hpc", "4242", "thesis deadline", "alice@login1")
    assert row["until_ts"] - int(now.timestamp()) == 2 * 86400
    act = exempt.active(store, c, int(now.timestamp()))
    assert [(a["scope"], a["by"]) for a in act] == [("hpc:4242", "alice@login1")]
    from auditor.errors import GpuAuditError

    for target, until, reason, msg in [("nocolon", "now+1day", "x", "expected CLUSTER:ID"),
                                       ("other:1", "now+1day", "x", "unknown cluster 'other'"),
                                       ("hpc:1", "now-1day", "x", "must be in the future"),
                                       ("hpc:1", "someday", "x", "--until"),
                                       ("hpc:1", "now+1day", " ", "--reason must say why")]:
        with pytest.raises(GpuAuditError, match=msg):
            exempt.add(store, c, target, until, reason, now=now)


@pytest.mark.parametrize("u, status, why", [
    # 2 h x 1 GPU reserved, all observed: 1 h idle + 1 h busy_unverified -> idle share 50 %, blocked
    ({"reserved_s": 7200, "observed_s": 7200, "idle_s": 3600, "busy_unverified_s": 3600}, "blocked",
     "idle 50% < 95% (busy_unverified and GPU-Util-only time do not count as idle)"),
    # 6840 s idle of 7200 = exactly 95 %: fires (threshold inclusive, 1e-9 tolerance)
    ({"reserved_s": 7200, "observed_s": 7200, "idle_s": 6840, "working_s": 360}, "idle",
     "idle 95% of reserved time in the last 2 h >= 95%"),
    # idle by GPU-Util only: 0 SM-verified idle seconds for the act stage
    ({"reserved_s": 7200, "observed_s": 7200, "idle_s": 7200, "idle_by_util_s": 7200}, "blocked",
     "idle 0% < 95% (busy_unverified and GPU-Util-only time do not count as idle)"),
    # idle on the stock counters (no SM activity): not SM-verified, so the act stage does not count it
    ({"reserved_s": 7200, "observed_s": 7200, "idle_s": 7200, "idle_by_counters_s": 7200}, "blocked",
     "idle 0% < 95% (engine-spin time, and for acting idle-by-counters time, judged without SM activity, do not "
     "count as idle)"),
    # an engine spin (GR engine busy, Tensor and DRAM idle) is never idle
    ({"reserved_s": 7200, "observed_s": 7200, "idle_s": 3600, "engine_spin_s": 3600}, "blocked",
     "idle 50% < 95% (engine-spin time, and for acting idle-by-counters time, judged without SM activity, do not "
     "count as idle)"),
    # 1.5 h of 2 observed (75 % < 80 %): never judged idle, whatever the rest says
    ({"reserved_s": 7200, "observed_s": 5400, "idle_s": 5400, "unknown_s": 1800}, "blocked",
     "telemetry coverage 75% < min_coverage 80% (unknown 0.50 GPU-h is never idle)"),
    # working: simply not idle (not logged)
    ({"reserved_s": 7200, "observed_s": 7200, "working_s": 7200}, "not_idle", "idle 0% < 95%"),
])
def test_evaluate_never_counts_unknown_or_unverified_as_idle(u: dict, status: str, why: str) -> None:
    from auditor.enforce.policy import evaluate

    a = {"start_ts": 0}
    got = evaluate(u, a, Policy(name="p"), "act", 2.0, 7200)
    assert got[:2] == (status, why)
    # started 1 h before the window's end: a 2 h stage cannot fire yet
    assert evaluate(u, {"start_ts": 3600}, Policy(name="p"), "act", 2.0, 7200)[:2] == (
        "not_idle", "running 1.00 h < 2 h")


def test_report_shows_exemptions_and_log(world: tuple[Any, ActionServer], now: datetime) -> None:
    from auditor.audit.run import run_audit
    from auditor.report.context import build_context
    from auditor.report.render import render_md, render_text

    store, srv = world
    c = cfg()
    exempt.add(store, c, "k8s:research/prep-then-train", "now+1day", "deadline run", by="tester")
    enforce(store, c, backends=backends(srv), now=now)
    run_id = run_audit(store, c, now - timedelta(days=1), now).run_id
    ctx = build_context(store, c, run_id, now=now)
    assert [(e["scope"], e["by"], e["reason"]) for e in ctx["enforcement"]["exemptions"]] == [
        ("k8s:research/prep-then-train", "tester", "deadline run")]
    assert ctx["enforcement"]["log_total"] == 6
    md, txt = render_md(ctx), render_text(ctx)
    assert "## Enforcement" in md and "| k8s:research/prep-then-train |" in md
    assert "| Deployment research/notebook-alice | act | scale\\_to\\_zero | dry\\_run |" in md  # Markdown-escaped
    assert "exempt k8s:research/prep-then-train until" in txt and "scale_to_zero dry_run" in txt


def test_cli_enforce_exempt_and_log(store_url: str, tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from auditor.cli import main

    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text(f'[store]\nurl = "{store_url}"\n\n[[clusters]]\nname = "hpc"\n')
    run = CliRunner().invoke
    assert run(main, ["-c", str(cfg_file), "db", "upgrade"]).exit_code == 0
    res = run(main, ["-c", str(cfg_file), "enforce"])
    assert res.exit_code == 0 and "DRY RUN" in res.output and "no [[policies]] configured" in res.output
    res = run(main, ["-c", str(cfg_file), "--json", "exempt", "hpc:77", "--until", "now+2hours", "--reason",
                     "final epoch", "--by", "alice", "--future"])
    assert res.exit_code == 0, res.output
    assert {k: json.loads(res.output)[k] for k in ("cluster", "external_id", "requested_by")} == \
        {"cluster": "hpc", "external_id": "77", "requested_by": "alice"}
    bad = run(main, ["-c", str(cfg_file), "exempt", "hpc77", "--until", "now+1day", "--reason", "x"])
    assert bad.exit_code == 1 and bad.output.strip().startswith("gpu-audit: error: exempt: expected CLUSTER:ID")
    assert "Traceback" not in bad.output
    res = run(main, ["-c", str(cfg_file), "enforce-log"])
    assert res.exit_code == 0 and res.output.strip() == "(empty)"


def test_warn_first_then_act_with_notices_to_a_channel(world: tuple[Any, ActionServer], now: datetime,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from http_sink import Sink

    from auditor.config import Channel, SecretRef

    store, srv = world
    with Sink() as sink:
        monkeypatch.setenv("GPU_AUDIT_TEST_HOOK", f"json://127.0.0.1:{sink.port}/hook/s3cret")
        c = Config(policies=[Policy(name="p", warn_after_hours=1, act_after_hours=2, warn_first=True,
                                    namespaces=["research"])],
                   channels=[Channel(name="ops", url=SecretRef(env="GPU_AUDIT_TEST_HOOK"))])
        exempt.add(store, c, "k8s:research/prep-then-train", "now+1day", "not this one", by="t")
        first = enforce(store, c, apply=True, backends=backends(srv), now=now)
        assert [(d["target"], d["stage"], d["decision"]) for d in first["decisions"]] == [
            ("Deployment research/notebook-alice", "warn", "done"), ("Pod research/prep-then-train", "warn", "skipped")]
        assert srv.replay.writes == []  # warned, not acted
        notebook = [r["body"]["message"] for r in sink.requests if "notebook-alice" in r["body"]["message"]]
        assert len(notebook) == 1 and "will be stopped" in notebook[0] and "warn_first" in notebook[0]
        second = enforce(store, c, apply=True, backends=backends(srv), now=now)
        assert [(d["target"], d["stage"], d["decision"]) for d in second["decisions"] if d["stage"] == "act"] == [
            ("Deployment research/notebook-alice", "act", "done")]  # prep-then-train: exempt, never warned
        assert len(srv.replay.writes) == 1
        notices = [r["body"] for r in sink.requests if "notebook-alice" in r["body"]["message"]]
        assert [n["title"] for n in notices] == [
            "[gpu-audit] Deployment research/notebook-alice is idle and will be stopped",
            "[gpu-audit] Deployment research/notebook-alice was stopped"]


def test_maintenance_reservation_is_infrastructure(world: tuple[Any, ActionServer], now: datetime) -> None:
    """A MAINT reservation on gpu-node-a during the last 2 hours: nothing there is acted on or warned about."""
    from auditor.records import Reservation

    store, srv = world
    store.ingest([Reservation("k8s", "maint-a", now - timedelta(hours=1), now + timedelta(hours=1),
                              nodes=["gpu-node-a"], gpu_count=8, flags=["MAINT", "IGNORE_JOBS"])])
    enforce(store, cfg(), backends=backends(srv), now=now)
    why = {r["target"]: r["reason"] for r in log_rows(store) if r["stage"] == "act"}
    assert why["Deployment research/notebook-alice"] == \
        "infrastructure trouble: maintenance reservation maint-a on gpu-node-a"
    assert why["Pod research/prep-then-train"].startswith("would delete_pod")  # gpu-node-b: not affected


def test_one_enforcement_run_at_a_time(store: Any) -> None:
    from auditor.errors import GpuAuditError
    from auditor.store.locks import Lease

    with Lease(store, "enforce", "someone-else", 300) as held:
        assert held.acquired
        with pytest.raises(GpuAuditError, match="another enforcement run holds the `enforce` lease"):
            enforce(store, cfg(), backends=lambda c, s: None)
    assert enforce(store, cfg(), backends=lambda c, s: None)["decisions"] == []


def test_backends_from_config_use_each_clusters_source() -> None:
    from connectors.actions import from_config
    from connectors.actions.slurm import SlurmActions

    c = Config(clusters=[{"name": "hpc", "allocations": [{"kind": "slurm", "backend": "cli", "squeue": "/x/squeue"}]},
                         {"name": "k8s", "allocations": [{"kind": "kubernetes", "host": "https://10.0.0.1:6443",
                                                          "token": {"env": TOKEN_ENV}}]}])
    get = from_config(c, Path("."))
    slurm = get("hpc", "slurm")
    assert isinstance(slurm, SlurmActions) and slurm.o.squeue == "/x/squeue"
    assert isinstance(get("k8s", "kubernetes"), KubernetesActions)
    assert get("hpc", "kubernetes") is None and get("nope", "slurm") is None
    assert get("hpc", "slurm") is slurm  # built once per run


def test_an_odd_scheduler_answer_is_logged_and_the_run_goes_on(world: tuple[Any, ActionServer],
                                                               now: datetime) -> None:
    store, srv = world
    # a pod object without metadata.ownerReferences shape the client expects: a list of strings
    srv.replay.find("pods", "research", "notebook-alice-6d5f8b7c9-tx2lq")["metadata"]["ownerReferences"] = ["x"]
    res = enforce(store, cfg(), backends=backends(srv), now=now)
    got = {d["target"]: d["reason"] for d in res["decisions"] if d["stage"] == "act"}
    assert got["kubernetes research/notebook-alice-6d5f8b7c9-tx2lq"] == \
        "cannot check the live state: AttributeError: 'str' object has no attribute 'get'"
    assert got["Pod research/prep-then-train"].startswith("would delete_pod")  # the others are still decided


def test_docs_list_every_action_and_cli_option() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "enforcement.md").read_text()
    for action in ("cancel", "requeue", "scale_to_zero", "suspend_job", "delete_job", "delete_pod", "notify_owners"):
        assert f"| {action}" in doc or f"{action} |" in doc or f"| {action} " in doc, action
    for option in ("--apply", "--until", "--reason", "--by", "--limit", "enforce-log", "exempt CLUSTER:ID"):
        assert option in doc, option
    for decision in ("done", "dry_run", "skipped", "failed"):
        assert decision in doc


def test_escalation_goes_to_team_leads_sponsor_and_channel_over_real_smtp(
        world: tuple[Any, ActionServer], now: datetime, smtp_server: Any) -> None:  # noqa: F811
    """Slurm job 201 (user dave, account acct -> team ml) idle by GPU-Util for 4 h; policy: warn after 1 h,
    escalate after 1.5 h, never act. Escalation: the team's emails + escalate_to (an address and a channel);
    the owner's warning was not sent before, but escalate is the strongest stage that fires, so only it goes."""
    from http_sink import Sink

    from auditor.config import Channel, EmailConfig, SecretRef, Team

    store, srv = world
    inbox, port = smtp_server()
    with Sink() as sink, pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPU_AUDIT_TEST_HOOK", f"json://127.0.0.1:{sink.port}/hook")
        c = Config(policies=[Policy(name="esc", clusters=["hpc"], warn_after_hours=1, escalate_after_hours=1.5,
                                    escalate_to=["sponsor@example.org", "ops"])],
                   teams=[Team(name="ml", accounts=["acct"], emails=["ml-lead@example.org"])],
                   channels=[Channel(name="ops", url=SecretRef(env="GPU_AUDIT_TEST_HOOK"), kinds=["escalate"])],
                   email=EmailConfig(smtp_host="127.0.0.1", smtp_port=port, security="none",
                                     sender="gpu-audit@example.org", user_domain="example.org"))
        res = enforce(store, c, apply=True, backends=lambda cl, s: None, now=now)
        esc = [d for d in res["decisions"] if d["target"] == "slurm job 201"]
        assert [(d["stage"], d["decision"]) for d in esc] == [("escalate", "done")]
        assert esc[0]["result"] == ("channel:ops: sent; sponsor@example.org: sent; ml-lead@example.org: sent")
        assert sorted(r for e in inbox.envelopes for r in e["rcpt"]) == ["ml-lead@example.org", "sponsor@example.org"]
        assert all(e["msg"]["Subject"] == "[gpu-audit] slurm job 201 is idle (escalated)" for e in inbox.envelopes)
        assert len(sink.requests) == 1
        # job 202 (GPU-Util busy): never escalated; a second run tells nobody twice
        assert not any(d["target"] == "slurm job 202" and d["decision"] == "done" for d in res["decisions"])
        again = enforce(store, c, apply=True, backends=lambda cl, s: None, now=now)
        assert [d["decision"] for d in again["decisions"] if d["target"] == "slurm job 201"] == ["throttled"]
        assert len(inbox.envelopes) == 2 and len(sink.requests) == 1


def test_run_step_enforce_never_acts_in_a_dry_run(store: Any, tmp_path: Path) -> None:
    """`gpu-audit run --steps enforce --dry-run` (and a dry-run daemon) must not act even where the config
    says `enforce.apply = true`; without --dry-run the config's switch holds. The daemon's hourly audit job
    runs the enforce step after the audit."""
    from auditor.daemon.pipeline import run_steps
    from auditor.daemon.schedule import JOB_STEPS

    c = cfg(apply=True)
    dry = run_steps(store, c, ["enforce"], base_dir=tmp_path, dry_run=True)
    assert [(s.name, s.ok) for s in dry.steps] == [("enforce", True)] and dry.steps[0].detail["dry_run"] is True
    real = run_steps(store, c, ["enforce"], base_dir=tmp_path, dry_run=False)
    assert real.steps[0].detail["dry_run"] is False
    assert JOB_STEPS["audit"] == ["audit", "enforce"]
