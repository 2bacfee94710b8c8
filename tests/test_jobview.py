"""``gpu-audit job`` / ``jobs`` on SQLite and PostgreSQL: numbers checked against a hand calculation, the
per-bucket verdict time line checked against the audit's own per-GPU sums, Kubernetes pod references, the
CLI in text and JSON, one-line errors."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from auditor.audit.run import run_audit
from auditor.config import Config
from auditor.errors import GpuAuditError
from auditor.records import AllocatedGpu, Allocation, GpuBucket
from auditor.report import jobview

sys.path.insert(0, str(Path(__file__).parent))
from test_report import T0  # noqa: E402

DAY = timedelta(days=1)


def bk(host: str, idx: int, start, hours: float, **m: float) -> list[GpuBucket]:  # noqa: ANN001
    return [GpuBucket("c1", host, idx, start + timedelta(minutes=5 * i), 300, 10, **m)
            for i in range(int(hours * 12))]


def records() -> list:
    t = T0
    busy = dict(sm_active=0.9, gpu_util=1.0, tensor_active=0.3, dram_active=0.4, fb_used_mib=40000.0, power_w=400.0)
    idle = dict(sm_active=0.0, gpu_util=0.0, tensor_active=0.0, dram_active=0.0, fb_used_mib=1000.0, power_w=60.0)
    # a process spinning (200 W): util_mirage; at idle power on 2 GPUs it would be hung_collective
    mirage = dict(sm_active=0.02, gpu_util=0.95, tensor_active=0.0, dram_active=0.0, fb_used_mib=2000.0, power_w=200.0)
    recs: list = [Allocation("c1", "slurm", "501", name="train", user="dana", account="acct-ml", start=t,
                             end=t + timedelta(hours=4), gpus=[AllocatedGpu("g1", 0), AllocatedGpu("g1", 1)])]
    recs += bk("g1", 0, t, 2, **busy) + bk("g1", 0, t + timedelta(hours=2), 2, **idle) + bk("g1", 1, t, 4, **mirage)
    recs.append(Allocation("c1", "kubernetes", "uid-nb", name="nb-0", user="erin", account="team-ns", start=t,
                           end=t + timedelta(hours=2), gpus=[AllocatedGpu("g2", 0)]))
    recs += bk("g2", 0, t, 2, **idle)
    return recs


@pytest.fixture
def audited(store):  # noqa: ANN001, ANN201
    cfg = Config()
    store.ingest(records())
    return store, cfg, run_audit(store, cfg, T0, T0 + DAY).run_id


def test_job_numbers_by_hand(audited) -> None:  # noqa: ANN001
    store, cfg, run_id = audited
    v = jobview.job_view(store, cfg, "c1:501")
    # 2 GPUs x 4 h = 8 GPU-h reserved; GPU0 idle 2 h, GPU1 mirage 4 h -> 6 idle GPU-h; price 2.0/GPU-h
    assert v["run_id"] == run_id and v["usage"]["reserved_gpu_hours"] == pytest.approx(8.0)
    assert v["usage"]["idle_gpu_hours"] + v["usage"]["mirage_gpu_hours"] == pytest.approx(6.0)
    assert v["reserved_cost"] == pytest.approx(16.0) and v["idle_cost"] == pytest.approx(12.0)
    assert v["usage"]["coverage"] == pytest.approx(1.0) and not v["running"]
    g0, g1 = v["gpus"]
    # GPU0: 24 buckets at SM 0.9 then 24 at 0.0 -> mean 0.45, peak 0.9; power (400 + 60) / 2 = 230, peak 400
    assert g0["metrics"]["sm_active"] == {"mean": pytest.approx(0.45), "peak": pytest.approx(0.9)}
    assert g0["metrics"]["power_w"] == {"mean": pytest.approx(230.0), "peak": pytest.approx(400.0)}
    assert g0["metrics"]["fb_used_mib"]["peak"] == pytest.approx(40000.0)
    assert g0["metrics"]["tensor_active"]["mean"] == pytest.approx(0.15)
    assert g0["timeline"]["line"] == "\u2588" * 24 + "_" * 24 and g0["timeline"]["bins"] == 48
    assert g1["timeline"]["line"] == "!" * 48
    assert g1["metrics"]["gpu_util"]["mean"] == pytest.approx(0.95) and g1["coverage"] == pytest.approx(1.0)
    kinds = {f["kind"]: f for f in v["findings"]}
    assert "util_mirage" in kinds and "spinning" in kinds["util_mirage"]["advice"]
    assert kinds["util_mirage"]["rule"]


def test_timeline_agrees_with_the_audit(audited) -> None:  # noqa: ANN001
    """The time line's verdicts (Python) and the audit's usage_gpu sums (SQL) are two implementations."""
    store, cfg, run_id = audited
    names = {"idle": "idle_s", "mirage": "mirage_s", "working": "working_s", "low": "low_s"}
    for ref in ("c1:501", "k8s:team-ns/nb-0"):
        v = jobview.job_view(store, cfg, ref)
        for g in v["gpus"]:
            got = g["timeline"]["seconds"]
            for verdict, col in names.items():
                assert got.get(verdict, 0.0) == pytest.approx(g["seconds"][col]), (ref, verdict)


def test_kubernetes_refs_and_errors(audited) -> None:  # noqa: ANN001
    store, cfg, _ = audited
    for ref in ("k8s:team-ns/nb-0", "c1:team-ns/nb-0", "kubernetes:team-ns/nb-0", "c1:uid-nb"):
        v = jobview.job_view(store, cfg, ref)
        assert (v["source"], v["name"], v["user"]) == ("kubernetes", "nb-0", "erin")
        assert v["usage"]["idle_gpu_hours"] == pytest.approx(2.0) and v["idle_cost"] == pytest.approx(4.0)
    for bad, msg in (("k8s:team-ns/none", "no allocation matches"), ("c1:", "expected"),
                     ("k8s:/x", "expected NAMESPACE/POD"), ("c2:501", "no allocation matches")):
        with pytest.raises(GpuAuditError, match=msg):
            jobview.job_view(store, cfg, bad)
    with pytest.raises(GpuAuditError):  # the web UI's per-user scope
        jobview.job_view(store, cfg, "c1:501", user="erin")


def test_jobs_list(audited) -> None:  # noqa: ANN001
    store, cfg, _ = audited
    rows = jobview.jobs_list(store, cfg, user="dana", since=T0 - DAY, until=T0 + DAY)
    assert [r["ref"] for r in rows] == ["c1:501"]
    assert rows[0]["reserved_gpu_hours"] == pytest.approx(8.0) and rows[0]["idle_cost"] == pytest.approx(12.0)
    erin = jobview.jobs_list(store, cfg, user="erin", since=T0 - DAY, until=T0 + DAY)
    assert [r["ref"] for r in erin] == ["c1:team-ns/nb-0"]
    assert jobview.jobs_list(store, cfg, user="dana", since=T0 + DAY, until=T0 + 2 * DAY) == []


def test_cli_job_and_jobs(audited, tmp_path: Path) -> None:  # noqa: ANN001
    from auditor.cli import main

    store, _, _ = audited
    url = store.engine.url.render_as_string(hide_password=False)
    cfgp = tmp_path / "c.toml"
    cfgp.write_text(f"[store]\nurl = {json.dumps(url)}\n")
    run = CliRunner()
    res = run.invoke(main, ["-c", str(cfgp), "job", "c1:501"])
    assert res.exit_code == 0, res.output
    assert "verdict |" + "\u2588" * 24 + "_" * 24 + "|" in res.output and "util_mirage" in res.output
    assert "USD 12.00" in res.output and "what to do:" in res.output
    res = run.invoke(main, ["-c", str(cfgp), "--json", "job", "k8s:team-ns/nb-0"])
    data = json.loads(res.output)
    assert data["schema"] == "gpu-audit.job/1" and data["idle_cost"] == pytest.approx(4.0)
    res = run.invoke(main, ["-c", str(cfgp), "jobs", "--user", "dana", "--since", "2026-11-15",
                            "--until", "2026-11-18"])
    assert res.exit_code == 0 and "c1:501" in res.output and "USD 12.00" in res.output
    res = run.invoke(main, ["-c", str(cfgp), "job", "c1:999"])
    assert res.exit_code == 1 and res.output.strip().count("\n") == 0 and "no allocation matches" in res.output
    with store.engine.connect() as c:
        assert c.execute(text("SELECT COUNT(*) FROM allocations")).scalar() == 2  # read-only


def test_job_before_any_audit(store) -> None:  # noqa: ANN001
    """No audit yet: no hours or money, but the time line and metrics straight from telemetry."""
    store.ingest(records())
    v = jobview.job_view(store, Config(), "c1:501")
    assert v["run_id"] is None and v["usage"] is None and v["idle_cost"] is None
    g0, g1 = v["gpus"]
    assert g0["timeline"]["line"] == "\u2588" * 24 + "_" * 24 and g1["timeline"]["line"] == "!" * 48
    assert g0["metrics"]["sm_active"]["mean"] == pytest.approx(0.45) and g0["coverage"] is None
    from auditor.cli.jobs import format_job

    assert "not audited yet" in format_job(v)
