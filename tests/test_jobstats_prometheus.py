"""Princeton jobstats' exporter names in a REAL Prometheus (``scripts/testbed-prometheus.sh up jobstats``,
port 19092), read through the alias table and audited end to end with Slurm accounting of the same jobs.
Expected buckets are computed here from the generator's raw samples with the units written out by hand."""

from __future__ import annotations

import importlib.util
import json
import os
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import need_tsdb
from sqlalchemy import text

from auditor.audit.run import run_audit
from auditor.collect import collect
from auditor.config import Config
from auditor.store.engine import Store
from connectors import build
from connectors.base import Context, Problems, Window

ROOT = Path(__file__).resolve().parent.parent
URL = os.environ.get("GPU_AUDIT_TEST_JOBSTATS_PROM_URL", "http://127.0.0.1:19092")
DIR = Path(os.environ.get("GPU_AUDIT_TEST_JOBSTATS_PROM_DIR", "/var/lib/gpu-audit-testbed/jobstats"))
#: exporter name -> (bucket field, divisor to the stored unit), independent of connectors.aliases
UNITS = {"nvidia_gpu_duty_cycle": ("gpu_util", 100.0), "nvidia_gpu_memory_used_bytes": ("fb_used_mib", 2**20),
         "nvidia_gpu_power_usage_milliwatts": ("power_w", 1000.0)}


def generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen", ROOT / "scripts" / "gen_dcgm_openmetrics.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def state() -> dict:
    need_tsdb(URL, DIR)  # the jobstats testbed itself (its marker and reported TSDB path)
    return json.loads((DIR / "state.json").read_text())


def expected(state: dict) -> dict[tuple, dict[str, Any]]:
    per: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    jobs: dict[tuple, set[str]] = defaultdict(set)
    for metric, lab, value, ts in generator().samples(state):
        key = (lab["instance"].split(":")[0], int(lab["minor_number"]), ts - ts % 300)
        if metric == "nvidia_gpu_jobId":
            if value > 0:
                jobs[key].add(str(int(value)))
        elif metric in UNITS:
            fname, div = UNITS[metric]
            per[key][fname].append(value / div)
    out = {}
    for key, fields in per.items():
        row = {f: (max(v) if f == "fb_used_mib" else sum(v) / len(v)) for f, v in fields.items()}
        row["samples"] = len(fields["gpu_util"])
        row["hpc_job"] = ",".join(sorted(jobs[key])) or None
        out[key] = row
    return out


@pytest.mark.service
def test_jobstats_names_through_prometheus(state: dict) -> None:
    start = datetime.fromtimestamp(state["start"], UTC)
    src = build("prometheus", "telemetry", {"url": URL, "matchers": 'cluster="della"'}, Context("della"))
    problems = Problems()
    buckets = list(src.collect(Window(start, start + timedelta(hours=state["hours"]), 300), problems))
    assert problems.total == 0
    want = expected(state)
    got = {(b.host, b.gpu, int(b.start.timestamp())): b for b in buckets}
    assert set(got) == set(want) and len(got) == len(buckets) == 3 * 72
    for key, row in want.items():
        b = got[key]
        assert b.samples == row["samples"] == 10 and b.sm_active is None, key
        for f in ("gpu_util", "fb_used_mib", "power_w"):
            assert getattr(b, f) == pytest.approx(row[f], rel=1e-9), (key, f)
        assert b.hpc_job == row["hpc_job"], key
    # the job schedule (generator's JOBSTATS_JOBS): GPU 0 of della-g01 changes hands at hour 3
    assert {got[("della-g01", 0, state["start"] + 3 * 3600 - 300)].hpc_job,
            got[("della-g01", 0, state["start"] + 3 * 3600)].hpc_job} == {"5001", "5003"}


@pytest.mark.service
def test_jobstats_backfill_audited_end_to_end(state: dict, tmp_path: Path) -> None:
    """Slurm accounting (saved sacct -P) + the jobstats-named Prometheus, collected and audited.
    By hand, from the schedule: 5001 holds della-g01 GPUs 0 and 1 for 3 h (GPU 1 reads 0 %: idle by
    GPU-Util 3 GPU-h; GPU 0 ~95 %: not idle); 5002 holds della-g02's GPU for 4 h at 0-4 %: idle by GPU-Util
    4 GPU-h; 5003 holds della-g01 GPU 0 for 3 h at ~95 %: idle 0."""
    t = datetime.fromtimestamp(state["start"], UTC)

    def at(h: float) -> str:
        return (t + timedelta(hours=h)).strftime("%Y-%m-%dT%H:%M:%S")

    (tmp_path / "sacct.txt").write_text(
        "JobID|JobIDRaw|User|Account|Partition|QOS|State|Submit|Start|End|ElapsedRaw|TimelimitRaw|NodeList|"
        "AllocTRES|ReservationId|Reservation|JobName\n"
        f"5001|5001|alice|team-a|gpu|normal|COMPLETED|{at(0)}|{at(0)}|{at(3)}|10800|600|della-g01|"
        "billing=2,cpu=2,gres/gpu=2,node=1|||train\n"
        f"5002|5002|bob|team-b|gpu|normal|COMPLETED|{at(1)}|{at(1)}|{at(5)}|14400|600|della-g02|"
        "billing=1,cpu=1,gres/gpu=1,node=1|||notebook\n"
        f"5003|5003|alice|team-a|gpu|normal|COMPLETED|{at(3)}|{at(3)}|{at(6)}|10800|600|della-g01|"
        "billing=1,cpu=1,gres/gpu=1,node=1|||train2\n")
    cfg = Config.model_validate({"clusters": [{
        "name": "della",
        "allocations": [{"kind": "file", "paths": ["sacct.txt"], "format": "sacct"}],
        "telemetry": [{"kind": "prometheus", "url": URL, "matchers": 'cluster="della"'}]}]})
    store = Store.open(f"sqlite:///{tmp_path / 'a.db'}")
    store.upgrade()
    until = t + timedelta(hours=6)
    summary = collect(store, cfg, base_dir=tmp_path, since=t, until=until, now=until + timedelta(hours=1))
    assert all(r.ok for r in summary.results), [r.error for r in summary.results]
    rid = run_audit(store, cfg, t, until).run_id
    with store.engine.connect() as conn:
        use = {r.external_id: r for r in conn.execute(text(
            "SELECT a.external_id, u.reserved_s, u.idle_s FROM usage_allocation u JOIN allocations a "
            "ON a.id = u.allocation_id WHERE u.run_id = :r"), {"r": rid})}
    assert {k: (v.reserved_s / 3600, v.idle_s / 3600) for k, v in use.items()} == {
        "5001": (6.0, 3.0), "5002": (4.0, 4.0), "5003": (3.0, 0.0)}
