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
    assert "|" + "\u2588" * 24 + "_" * 24 + "|" in res.output and "util_mirage" in res.output
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


# -- the compact view: verdict first, a jobstats-like header, one line per GPU ------------------------------------

def eight_gpu_records() -> list:
    """An 8-GPU job on two nodes for 4 h (48 five-minute buckets per GPU): GPU k has SM activity k/10 and
    GPU-Util 0.9, Tensor 0.2, DRAM 0.3, memory 8,192 MiB + 1,024 k; GPU 7 sends nothing in the second hour
    (12 buckets = 12 of the 48 time bins without data). Partition gpu, QOS high, time limit 40 h."""
    t = T0
    gpus = [AllocatedGpu("n1" if k < 4 else "n2", k % 4) for k in range(8)]
    recs: list = [Allocation("c1", "slurm", "800", name="big", user="fay", account="acct-ml", partition="gpu",
                             qos="high", time_limit_s=40 * 3600, start=t, end=t + timedelta(hours=4), gpus=gpus)]
    for k in range(8):
        m = dict(sm_active=k / 10, gpu_util=0.9, tensor_active=0.2, dram_active=0.3,
                 fb_used_mib=8192.0 + 1024 * k, power_w=300.0)
        rows = bk(gpus[k].node, gpus[k].index, t, 4, **m)
        if k == 7:
            rows = rows[:12] + rows[24:]
        recs += rows
    return recs


@pytest.fixture
def eight(store):  # noqa: ANN001, ANN201
    cfg = Config()
    store.ingest(eight_gpu_records())
    return store, cfg, run_audit(store, cfg, T0, T0 + DAY).run_id


def test_eight_gpus_one_line_each(eight) -> None:  # noqa: ANN001
    from auditor.cli.jobs import format_job

    store, cfg, _ = eight
    v = jobview.job_view(store, cfg, "c1:800")
    out = format_job(v)
    lines = out.splitlines()
    assert len(lines) <= 45, out  # a screenful (it was ~100 lines for 8 GPUs)
    rows = [x for x in lines if x.startswith("  ") and x.rstrip().endswith("|") and (" n1 " in x or " n2 " in x)]
    assert len(rows) == 8, out
    # GPU 3 (n1, index 3): util 90%, SM 30%, tensor 20%, DRAM 30%, peak memory (8192 + 3072) MiB = 11.0 GiB, all
    # 48 bins low (0.1 <= SM < 0.5 with the default thresholds)
    assert rows[3].split()[:9] == ["3", "n1", "3", "90%", "30%", "20%", "30%", "11.0", "100%"], rows[3]
    assert rows[3].split("|")[1] == "\u2584" * 48
    # GPU 7 (n2, index 3): SM 70% working; its second hour (bins 12..23) has no data: drawn "?", coverage 3/4
    g7 = rows[7].split()
    assert g7[:5] == ["7", "n2", "3", "90%", "70%"] and g7[8] == "75%", rows[7]
    assert rows[7].split("|")[1] == "\u2588" * 12 + "?" * 12 + "\u2588" * 24
    spark7 = [x for x in lines if x.startswith("    7 ") and "|" in x and x not in rows][0]
    assert spark7.split("|")[1] == "\u2586" * 12 + "?" * 12 + "\u2586" * 24  # 0.7 * 8 = 5.6 -> level 5 of 0..7
    assert "? no data" in out  # the legend says what "?" means


def test_header_like_jobstats(eight) -> None:  # noqa: ANN001
    from auditor.cli.jobs import format_job
    from auditor.store.schema import enforcement_log

    store, cfg, _ = eight
    with store.engine.begin() as c:
        aid = c.execute(text("SELECT id FROM allocations WHERE external_id = '800'")).scalar()
        c.execute(enforcement_log.insert().values(
            run_key="r1", decided_ts=int((T0 + timedelta(hours=3)).timestamp()), cluster="c1", allocation_id=aid,
            target="slurm job 800", policy="p", stage="warn", action="warn", decision="done", reason="idle 2 h",
            actor="ops@h", dry_run=False, result="mail sent"))
    v = jobview.job_view(store, cfg, "c1:800")
    out = format_job(v)
    head = out.splitlines()
    # 4 h held of a 40 h limit: 10 %
    assert v["time_limit_used"] == pytest.approx(0.1) and "used 10% of its time limit" in out
    assert "partition gpu, QOS high, state " in out and "8 GPU(s) on nodes n1, n2" in out
    assert "CPU efficiency not collected; host memory not collected; exit code not collected" in out
    assert any("warn warn done: slurm job 800 -> mail sent" in x for x in head[:12]), out
    assert head[0] == v["verdict"]["text"]


def test_verdict_line(audited, eight) -> None:  # noqa: ANN001
    store, cfg, _ = audited
    v = jobview.job_view(store, cfg, "c1:501")
    # dana's 501: 8.0 GPU-h reserved, 6.0 idle (GPU0 idle 2 h + GPU1 mirage 4 h) = 75 %, USD 12.00; three findings
    # about those hours, the costliest first
    assert v["verdict"]["level"] == "idle"
    assert v["verdict"]["text"].startswith("IDLE: 6.0 of its 8.0 GPU-h idle (75%, USD 12.00); 3 findings: ")
    assert "GPU-Util mirage" in v["verdict"]["text"]
    # its mean GPU-Util over the 8 observed GPU-hours: (1.0 x 2 + 0 x 2 + 0.95 x 4) / 8 = 0.725; SM (0.9 x 2 +
    # 0.02 x 4) / 8 = 0.235
    assert v["summary"]["mean_gpu_util"] == pytest.approx(0.725)
    assert v["summary"]["mean_sm_active"] == pytest.approx(0.235)
    # one figure, one computation: the report's usage of dana (whose only job this is) is the same dict
    from auditor.report.context import usage_of

    with store.engine.connect() as conn:
        assert usage_of(conn, v["run_id"], user="dana") == v["summary"]


def test_verdict_ok_and_unaudited(store) -> None:  # noqa: ANN001
    t = T0
    store.ingest([Allocation("c1", "slurm", "900", user="gil", start=t, end=t + timedelta(hours=2),
                             gpus=[AllocatedGpu("g9", 0)]), *bk("g9", 0, t, 2, sm_active=0.8, gpu_util=1.0,
                                                                tensor_active=0.5, dram_active=0.5)])
    v = jobview.job_view(store, Config(), "c1:900")
    assert v["verdict"]["level"] == "unaudited" and "not audited yet" in v["verdict"]["text"]
    run_audit(store, Config(), T0, T0 + DAY)
    v = jobview.job_view(store, Config(), "c1:900")
    # 2 GPU-h at SM 0.8: effective 1.6 of 2.0 = 80 %
    assert v["verdict"] == {"level": "ok", "text": "OK: no findings; 80% of its 2.0 reserved GPU-h was effective "
                                                  "work (mean SM activity 80%, GPU-Util 100%)"}


def test_jobs_prints_refs_whole_and_names_unknown_clusters(store, tmp_path: Path) -> None:  # noqa: ANN001
    from auditor.cli import main

    pod = "notebook-" + "x" * 60 + "-tail"
    store.ingest([Allocation("c1", "kubernetes", "uid-long", name=pod, user="hal", account="research", start=T0,
                             end=T0 + timedelta(hours=1), gpus=[AllocatedGpu("g2", 0)])])
    url = store.engine.url.render_as_string(hide_password=False)
    cfgp = tmp_path / "c.toml"
    cfgp.write_text(f"[store]\nurl = {json.dumps(url)}\n")
    run = CliRunner()
    res = run.invoke(main, ["-c", str(cfgp), "jobs", "--user", "hal", "--since", "2026-11-01",
                            "--until", "2026-12-01"])
    assert res.exit_code == 0, res.output
    ref = f"c1:research/{pod}"
    assert res.output.splitlines()[1].split()[0] == ref  # whole, pasteable
    again = run.invoke(main, ["-c", str(cfgp), "job", ref])
    assert again.exit_code == 0 and "user hal" in again.output and "-tail" in again.output
    res = run.invoke(main, ["-c", str(cfgp), "jobs", "--user", "hal", "--cluster", "c9"])
    assert res.exit_code == 1 and res.output.strip().count("\n") == 0
    assert "no cluster named 'c9' in the store; known: c1" in res.output


# -- the host side Slurm accounting keeps: exit code and CPU efficiency (migration 0016) -------------------------

FX = Path(__file__).parent / "fixtures" / "slurm"


def test_sacct_exit_code_and_cpu_time_parsed() -> None:
    from connectors import build
    from connectors.base import Context, Problems
    from connectors.slurm import jobs

    # by hand: 1 day + 2 h + 3 min + 4.5 s = 86,400 + 7,200 + 180 + 4.5
    assert jobs.cpu_seconds("1-02:03:04.500") == pytest.approx(93784.5)
    assert jobs.cpu_seconds("00:01.500") == pytest.approx(1.5) and jobs.cpu_seconds("01:00:00") == 3600.0
    for unsaid in ("", "00:00:00", "00:00.000", "garbage", "1-xx:00:00", None):
        assert jobs.cpu_seconds(unsaid) is None, unsaid
    assert [jobs.exit_code(x) for x in ("0:0", "3:0", "0:9", "", "n/a", "3")] == ["0:0", "3:0", "0:9", None, None,
                                                                                 None]
    # real sacct -P -X output of Slurm 24.11 (ExitCode column, no TotalCPU): job 4 FAILED with exit code 3
    p = Problems()
    cli = build("slurm", "allocations", {}, Context("lab")).backend
    txt = {a.external_id: a for a in cli.history_text((FX / "24.11/running/sacct-X.txt").read_text(), p, {}, None)}
    assert p.total == 0
    assert (txt["4"].exit_code, txt["1"].exit_code, txt["4"].cpus, txt["4"].cpu_time_s) == ("3:0", "0:0", 1, None)
    assert txt["7"].exit_code is None and txt["7"].cpus == 2  # running: no final exit code yet
    # the same cluster's sacct --json: 24.11's {set, number} shapes; job 4's TotalCPU 7,440 microseconds
    data = json.loads((FX / "24.11/running/sacct.json").read_text())
    js = {a.external_id: a for a in (jobs.from_json_db_job(j, "lab") for j in data["jobs"])}
    assert (js["4"].exit_code, js["4"].cpus, js["4"].cpu_time_s) == ("3:0", 1, pytest.approx(0.00744))
    assert js["5"].exit_code is None and js["5"].cpu_time_s is None  # running
    old = json.loads((FX / "22.05/1node/after-cancel/sacct.json").read_text())  # 22.05: plain ints
    first = jobs.from_json_db_job(old["jobs"][0], "lab")
    assert first.exit_code == "0:0" and first.cpus == 1 and first.cpu_time_s is None  # 0 s: not said


def test_exit_code_and_cpu_efficiency_shown(store, tmp_path: Path) -> None:  # noqa: ANN001
    from starlette.testclient import TestClient

    from auditor.cli.jobs import format_job
    from auditor.web.app import create_app

    t = T0
    job = Allocation("c1", "slurm", "950", user="ivy", start=t, end=t + timedelta(hours=4), exit_code="3:0",
                     cpus=4, cpu_time_s=14400.0, gpus=[AllocatedGpu("g5", 0)])
    store.ingest([job, *bk("g5", 0, t, 4, sm_active=0.6, gpu_util=0.9)])
    # a later sighting that does not say (e.g. a running snapshot) keeps what accounting said
    store.ingest([Allocation("c1", "slurm", "950", user="ivy", start=t, end=t + timedelta(hours=4),
                             gpus=[AllocatedGpu("g5", 0)])])
    v = jobview.job_view(store, Config(), "c1:950")
    # 14,400 CPU-s used of 4 CPUs x 4 h = 57,600 CPU-s held: 25 %
    assert v["exit_code"] == "3:0" and v["cpu_efficiency"] == pytest.approx(0.25)
    assert "CPU efficiency 25% of 4 CPU(s); host memory not collected; exit code 3:0" in format_job(v)
    page = TestClient(create_app(store, Config())).get(f"/allocation/{v['allocation_id']}").text
    assert 'id="cpu-eff">25% of 4 CPU(s)<' in page and ">3:0<" in page
