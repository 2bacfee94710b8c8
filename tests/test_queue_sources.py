"""The waiting demand and GPU quotas as the connectors read them from recorded scheduler outputs: Slurm
pending jobs (scontrol, sacct -P, slurmrestd 25.11), sacctmgr GrpTRES, Kubernetes Pending pods (the real
client against tests/k8s_server.py)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from k8s_server import TOKEN, K8sServer, load

from auditor.records import GpuQuota, GpuWait
from connectors import build
from connectors.base import Context, Problems, Window
from connectors.k8s_resources import GpuMatcher, PodRules, pod_wait
from connectors.slurm import jobs, quotas
from connectors.slurm.waits import wait_of, waits

FIX = Path(__file__).parent / "fixtures" / "slurm-queue"
WINDOW = Window(datetime(2025, 1, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC))


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_scontrol_pending_job_is_a_wait_and_its_forecast_is_no_start() -> None:
    """22.05 job 11: PENDING, EligibleTime 14:23:48, TRES gres/gpu=8; StartTime 15:27:01 is the backfill
    forecast, never a start."""
    a = jobs.from_scontrol_job((FIX / "scontrol-show-job-pending.txt").read_text(), "c")
    assert (a.state, a.start, a.eligible, a.gpus_requested) == ("PENDING", None, at("2026-11-29T14:23:48"), 8.0)
    w = wait_of(a)
    assert w == GpuWait("c", "slurm", "11", 8.0, eligible=at("2026-11-29T14:23:48"), end=None,
                        submit=at("2026-11-29T14:23:48"), name="pending-8gpu", user="carol", account="team-a",
                        partition="gpu", qos="normal", state="PENDING")


def test_sacct_row_without_eligible_takes_it_from_the_pending_listing() -> None:
    """sacct -P (no Eligible column): ReqTRES says 8 GPUs; the eligible time comes from slurmctld's listing;
    one wait per job."""
    [(_, row)] = list(jobs.sacct_rows((FIX / "sacct-X-pending.txt").read_text()))
    h = jobs.from_sacct_row(row, "c")
    assert (h.state, h.start, h.eligible, h.gpus_requested, h.gpus) == ("PENDING", None, None, 8.0, [])
    live = jobs.from_scontrol_job((FIX / "scontrol-show-job-pending.txt").read_text(), "c")
    [w] = list(waits([h], [live], WINDOW))
    assert (w.external_id, w.gpus, w.eligible, w.end) == ("11", 8.0, at("2026-11-29T14:23:48"), None)


def test_slurmrestd_pending_job_gpus_from_slurmctld() -> None:
    """25.11 job 4965: slurmctld says tres_per_job gres/gpu:4, eligible 1762787291 and a start_time that is
    a forecast; slurmdbd (gres/gpu not accounted) requests no GPU and has start 0."""
    live = jobs.from_json_job(json.loads((FIX / "slurm-job-gpus-pending.json").read_text())["jobs"][0], "c")
    db = jobs.from_json_db_job(json.loads((FIX / "slurmdb-job-gpus-pending.json").read_text())["jobs"][0], "c")
    eligible = datetime.fromtimestamp(1762787291, UTC)
    assert (live.state, live.start, live.eligible, live.gpus_requested) == ("PENDING", None, eligible, 4.0)
    assert (db.state, db.start, db.eligible, db.gpus_requested) == ("PENDING", None, eligible, 0.0)
    assert wait_of(db) is None  # no GPUs known from accounting alone
    [w] = list(waits([db], [live], WINDOW))
    assert (w.external_id, w.gpus, w.eligible, w.end, w.partition, w.user) == (
        "4965", 4.0, eligible, None, "gpu", "jwilson")


def test_started_job_waited_from_eligible_to_start() -> None:
    """A finished sacct row: Eligible 10:00, Start 10:45 -> a closed wait of 45 minutes; a job that started
    when eligible did not wait."""
    fields = ("JobID", "State", "Submit", "Eligible", "Start", "End", "Partition", "AllocTRES", "ReqTRES")
    row = dict(zip(fields, ("7", "COMPLETED", "2026-11-29T09:59:00", "2026-11-29T10:00:00", "2026-11-29T10:45:00",
                            "2026-11-29T11:00:00", "gpu", "gres/gpu=2,node=1", "gres/gpu=2,node=1"), strict=True))
    w = wait_of(jobs.from_sacct_row(row, "c"))
    assert w is not None and (w.eligible, w.end, w.gpus) == (at("2026-11-29T10:00:00"), at("2026-11-29T10:45:00"), 2.0)
    row["Start"] = row["Eligible"]
    assert wait_of(jobs.from_sacct_row(row, "c")) is None


def test_sacctmgr_gpu_quotas() -> None:
    """QOS and account GrpTRES with gres/gpu are quotas; a user association, a CPU-only limit and other
    clusters' rows are not; a malformed count is one quarantined line."""
    qos = "normal|\ngpu-q|cpu=64,gres/gpu=16\nlong|gres/gpu=x\n"
    assoc = ("auditlab|root||\nauditlab|team-a||gres/gpu=8\nauditlab|team-a|alice|gres/gpu=2\n"
             "other|team-b||gres/gpu=4\nauditlab|team-c||cpu=100\n")
    bad: list[tuple] = []
    seen = at("2026-11-30T00:00:00")
    got = [*quotas.from_qos_rows(jobs.sacct_rows(qos, quotas.QOS_FIELDS), "c", seen, lambda *x: bad.append(x)),
           *quotas.from_assoc_rows(jobs.sacct_rows(assoc, quotas.ASSOC_FIELDS), "c", "auditlab", seen,
                                   lambda *x: bad.append(x))]
    assert got == [GpuQuota("c", "qos", "gpu-q", 16.0, seen), GpuQuota("c", "account", "team-a", 8.0, seen)]
    assert [b[0] for b in bad] == [3]


# --- Kubernetes ------------------------------------------------------------------------------------------

TOKEN_ENV = "GPU_AUDIT_TEST_K8S_TOKEN"


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[K8sServer]:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with K8sServer() as srv:
        yield srv


def test_pending_gpu_pod_is_the_only_wait(server: K8sServer) -> None:
    """pods-all.json: waiting-for-gpus (research) is Pending, unscheduled, asks for 8 nvidia.com/gpu, created
    2026-11-29T14:31:59Z; the scheduled pods were bound before their recorded creation (backdated status):
    no wait. The unscheduled pods come from their own listing (spec.nodeName=, status.phase=Pending)."""
    conn = build("kubernetes", "allocations", {"host": server.url, "token": {"env": TOKEN_ENV}}, Context("k"))
    records = list(conn.collect(WINDOW, Problems()))
    [w] = [r for r in records if isinstance(r, GpuWait)]
    assert (w.external_id, w.gpus, w.eligible, w.end, w.account, w.partition, w.source) == (
        "738ef416-8bb1-4c61-9f67-ed5f44ec5b86", 8.0, at("2026-11-29T14:31:59"), None, "research", "",
        "kubernetes")


def test_scheduled_pod_waited_until_bound() -> None:
    """A pod created at 14:00 and bound (PodScheduled True) at 14:20 waited 20 minutes for 4 GPUs."""
    pod = copy.deepcopy(next(p for p in load("pods-all.json")["items"] if p["metadata"]["name"] == "llama-ft-x7k2p"))
    pod["metadata"]["creationTimestamp"] = "2026-11-29T14:00:00Z"
    for c in pod["status"]["conditions"]:
        if c["type"] == "PodScheduled":
            c["lastTransitionTime"] = "2026-11-29T14:20:00Z"
    rules = PodRules("k", GpuMatcher(["nvidia.com/gpu"]), "team", ())
    w = pod_wait(pod, rules, lambda _r: None)
    assert w is not None and (w.eligible, w.end, w.gpus, w.state) == (
        at("2026-11-29T14:00:00"), at("2026-11-29T14:20:00"), 4.0, "Scheduled")


# --- files and the store's guard ---------------------------------------------------------------------------

def test_file_rows_wait_and_quota_bad_ones_quarantined(tmp_path: Path) -> None:
    """JSON allocation files carry waits and quotas; a wait without an eligible time, an end before it and a
    quota of an unknown kind are each one quarantined row naming where and why; the rest is read."""
    rows = [{"type": "wait", "id": "9", "gpus": 2, "eligible": "2026-11-29T10:00:00Z", "partition": "gpu"},
            {"type": "wait", "id": "10", "gpus": 2},
            {"type": "wait", "id": "11", "gpus": 1, "eligible": "2026-11-29T10:00:00Z", "end": "2026-11-29T09:00:00Z"},
            {"type": "quota", "kind": "account", "name": "team-a", "gpus": 8},
            {"type": "quota", "kind": "user", "name": "alice", "gpus": 1}]
    (tmp_path / "a.json").write_text(json.dumps(rows))
    conn = build("file", "allocations", {"paths": ["a.json"]}, Context("c", base_dir=tmp_path))
    problems = Problems()
    got = list(conn.collect(WINDOW, problems))
    assert got == [GpuWait("c", "slurm", "9", 2.0, eligible=at("2026-11-29T10:00:00"), partition="gpu",
                           state="PENDING"), GpuQuota("c", "account", "team-a", 8.0)]
    reasons = [(loc, why) for _src, loc, why, _excerpt in problems.items]
    assert [loc for loc, _ in reasons] == ["item 1", "item 2", "item 4"], reasons  # items count from 0
    assert "eligible: missing" in reasons[0][1] and "before eligible" in reasons[1][1]
    assert "is not qos, account or queue" in reasons[2][1]


def test_guard_refuses_a_wait_that_is_no_gpu_count() -> None:
    """A non-finite or absurd GPU request is refused with a one-line reason, never stored."""
    from auditor.store import guard

    for gpus in (float("inf"), -1.0, 1e9):
        w = GpuWait("c", "slurm", "1", gpus, eligible=at("2026-11-29T10:00:00"))
        with pytest.raises(guard.Unstorable):
            guard.clean(w)
    assert guard.describe(GpuQuota("c", "qos", "q", 2.0))[0] == "quota qos q"


def test_slurmrestd_gpu_quotas_recorded() -> None:
    """Recorded from the testbed's slurmrestd 22.05.8 (v0.0.38) after `sacctmgr add qos gpuaudit-rec
    GrpTRES=gres/gpu=6` and `sacctmgr add account gpuaudit-acct GrpTRES=gres/gpu=4`: exactly those two are
    quotas (22.05 names the QOS list "QOS"); the other QOS and the user associations are not."""
    seen = at("2026-11-30T11:03:00")
    qos = json.loads((FIX / "slurmdb-v0.0.38-qos.json").read_text())["QOS"]
    assoc = json.loads((FIX / "slurmdb-v0.0.38-associations.json").read_text())["associations"]
    got = [q for q in [*(quotas.from_json_qos(o, "c", seen) for o in qos),
                       *(quotas.from_json_assoc(o, "c", "auditlab", seen) for o in assoc)] if q is not None]
    assert got == [GpuQuota("c", "qos", "gpuaudit-rec", 6.0, seen),
                   GpuQuota("c", "account", "gpuaudit-acct", 4.0, seen)]
    assert [q for o in assoc if (q := quotas.from_json_assoc(o, "c", "elsewhere", seen))] == []
    with pytest.raises(ValueError):
        quotas.from_json_qos({"name": "q", "limits": {"max": {"tres": {"total": [
            {"type": "gres", "name": "gpu", "count": "six"}]}}}}, "c", seen)
