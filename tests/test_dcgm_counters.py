"""DCGM 4.x's cumulative SM cycle counters (DCGM_FI_PROF_SM_CYCLES_ACTIVE_TOTAL / _ELAPSED_TOTAL, dcgm_fields.h
@ 72fa3fe fields 1085 and 1084): where a GPU exports them, a bucket's SM activity is their increase, exact,
read before the sampled SM_ACTIVE gauge, across a counter reset, through every connector that reads DCGM
pages (scrape files, long CSV, a real Prometheus); the store keeps which buckets were exact and a finding's
evidence says so, on SQLite and PostgreSQL.

The series: a scrape every 30 s from one interval before the window, 20 minutes (4 buckets of 5 minutes).
Per bucket the true SM activity is ACTIVE below; elapsed cycles grow by 3000 a scrape, active cycles by
ACTIVE x 3000. The sampled gauge says 0.9 throughout (what a scrape instant caught). At scrape 25 (bucket 2)
both counters reset (a GPU reset or DCGM restart) and count again from 0.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import FIXTURES
from helpers import usage
from sqlalchemy import text

from auditor.audit.run import run_audit
from auditor.config import Config
from auditor.records import AllocatedGpu, Allocation, GpuBucket
from auditor.store import retention
from auditor.store.engine import Store
from connectors import build
from connectors._cycles import increases, ratio
from connectors.aliases import CYCLE_COUNTERS, SM_CYCLES_ACTIVE, SM_CYCLES_ELAPSED
from connectors.base import Context, Problems, Window

NOW = int(time.time())
T0 = (NOW - 2 * 86400) // 3600 * 3600  # two days ago, a whole hour (a real Prometheus keeps it)
ACTIVE = [0.25, 0.5, 0.75, 0.0]
STEP, PER_SCRAPE, RESET_AT = 30, 3000, 25
WINDOW = Window(datetime.fromtimestamp(T0, UTC), datetime.fromtimestamp(T0 + 1200, UTC), 300)
LABELS = 'gpu="0",UUID="GPU-0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-c"'


def readings() -> list[tuple[int, float, float]]:
    """(instant, active, elapsed) from scrape -1 (before the window) to scrape 39."""
    out, a, e = [], 10**12, 4 * 10**12  # counters since boot
    for i in range(-1, 40):
        if i >= 0:
            inc = ACTIVE[i // 10] * PER_SCRAPE
            a, e = (a + inc, e + PER_SCRAPE) if i != RESET_AT else (inc, PER_SCRAPE)  # reset: from 0
        out.append((T0 + i * STEP, a, e))
    return out


def page_lines(with_counters: bool = True) -> list[tuple[int, str]]:
    lines = []
    for t, a, e in readings():
        lines.append((t, f"DCGM_FI_PROF_SM_ACTIVE{{{LABELS}}} 0.9"))
        lines.append((t, f"DCGM_FI_DEV_GPU_UTIL{{{LABELS}}} 100"))
        if with_counters:
            lines.append((t, f"{SM_CYCLES_ACTIVE}{{{LABELS}}} {a:.0f}"))
            lines.append((t, f"{SM_CYCLES_ELAPSED}{{{LABELS}}} {e:.0f}"))
    return lines


def check_exact(buckets: list, problems: Problems) -> None:
    assert problems.total == 0, problems.items
    whole = sorted((b for b in buckets if b.samples > 0), key=lambda b: b.start)
    assert [b.start for b in whole] == [WINDOW.since + timedelta(minutes=5 * k) for k in range(4)]
    assert [b.sm_active for b in whole] == pytest.approx(ACTIVE)
    assert all(b.sm_exact for b in whole)
    assert all(b.gpu_util == 1.0 for b in whole)  # the other fields as before


def test_the_counters_are_defined_by_dcgm() -> None:
    header = set((FIXTURES / "dcgm_names" / "dcgm_fields-72fa3fe.txt").read_text().split())
    assert CYCLE_COUNTERS <= header


def test_increase_handles_a_reset_and_a_gap() -> None:
    a = {0.0: 100.0, 30.0: 130.0, 60.0: 10.0, 90.0: 40.0, 1000.0: 70.0}  # reset at 60; gap 90 -> 1000
    e = {0.0: 1000.0, 30.0: 1100.0, 60.0: 50.0, 90.0: 150.0, 1000.0: 250.0}
    assert increases(a, e, 300) == {0: (30.0 + 10.0 + 30.0, 100.0 + 50.0 + 100.0)}
    assert ratio(70.0, 250.0) == pytest.approx(0.28) and ratio(5.0, 0.0) is None and ratio(None, 1.0) is None


def test_scrape_files(tmp_path: Path) -> None:
    for i, (t, line) in enumerate(page_lines()):
        (tmp_path / f"s{i:04d}.prom").write_text(f"{line} {t * 1000}\n")
    src = build("scrape", "telemetry", {"paths": ["*.prom"]}, Context("c1", tmp_path))
    p = Problems()
    check_exact(list(src.collect(WINDOW, p)), p)


def test_scrape_files_without_counters_keep_the_sampled_gauge(tmp_path: Path) -> None:
    (tmp_path / "a.prom").write_text("".join(f"{line} {t * 1000}\n" for t, line in page_lines(False)))
    src = build("scrape", "telemetry", {"paths": ["a.prom"]}, Context("c1", tmp_path))
    p = Problems()
    buckets = [b for b in src.collect(WINDOW, p) if b.samples > 0]
    assert p.total == 0 and len(buckets) == 4
    assert all(b.sm_active == pytest.approx(0.9) and not b.sm_exact for b in buckets)


def test_long_csv(tmp_path: Path) -> None:
    rows = ["timestamp,host,gpu,uuid,metric,value"]
    for t, a, e in readings():
        when = datetime.fromtimestamp(t, UTC).isoformat()
        rows += [f"{when},node-c,0,GPU-0,{name},{value}" for name, value in (
            ("DCGM_FI_PROF_SM_ACTIVE", "0.9"), ("DCGM_FI_DEV_GPU_UTIL", "100"), (SM_CYCLES_ACTIVE, f"{a:.0f}"),
            (SM_CYCLES_ELAPSED, f"{e:.0f}"))]
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    src = build("file", "telemetry", {"paths": ["t.csv"]}, Context("c1", tmp_path))
    p = Problems()
    check_exact(list(src.collect(WINDOW, p)), p)


@pytest.mark.service
def test_a_real_prometheus(tmp_path: Path) -> None:
    from test_infra_prometheus import private_prometheus

    names = ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_DEV_GPU_UTIL", SM_CYCLES_ACTIVE, SM_CYCLES_ELAPSED)
    lines = page_lines()
    om = "".join(f"# TYPE {n} gauge\n" + "".join(f"{line} {t}\n" for t, line in lines if line.startswith(n + "{"))
                 for n in names) + "# EOF\n"
    with private_prometheus(tmp_path, om) as url:
        src = build("prometheus", "telemetry", {"url": url, "sample_interval_s": 30, "recording_rules": "off"},
                    Context("c1"))
        p = Problems()
        check_exact(list(src.collect(WINDOW, p)), p)


# --- the store and the evidence ----------------------------------------------------------------------------

J0 = datetime(2026, 11, 20, tzinfo=UTC)


def test_store_keeps_exactness_and_the_evidence_says_so(store: Store) -> None:
    """Two idle GPUs of one job for 2 h: GPU 0's SM activity from the cycle counters, GPU 1's sampled. The
    finding's evidence: half of the SM-observed time is exact; a roll-up keeps the share."""
    job = Allocation("c", "slurm", "7", user="u", account="a", start=J0, end=J0 + timedelta(hours=2),
                     gpus=[AllocatedGpu("n1", 0), AllocatedGpu("n1", 1)])
    buckets = [GpuBucket("c", "n1", g, J0 + timedelta(minutes=5 * i), 300, 10, sm_active=0.01, gpu_util=0.0,
                         sm_exact=g == 0) for g in (0, 1) for i in range(24)]
    store.ingest([job, *buckets])
    with store.engine.connect() as conn:
        stored = dict(conn.execute(text("SELECT tg.gpu_index, MIN(b.sm_exact) FROM gpu_buckets b JOIN telemetry_gpus "
                                        "tg ON tg.id = b.gpu_id GROUP BY tg.gpu_index")).all())
    assert stored == {0: 1.0, 1: 0.0}
    r = run_audit(store, Config(), J0 - timedelta(days=1), J0 + timedelta(days=1))
    u = usage(store, r.run_id)["7"]
    assert u["sm_observed_s"] == pytest.approx(14400) and u["sm_exact_s"] == pytest.approx(7200)
    with store.engine.connect() as conn:
        ev = [e for (e,) in conn.execute(text("SELECT evidence FROM findings WHERE run_id = :r AND kind = "
                                              "'idle_allocation'"), {"r": r.run_id})]
    assert len(ev) == 1
    evidence = ev[0] if isinstance(ev[0], dict) else __import__("json").loads(ev[0])
    assert evidence["sm_exact_share"] == pytest.approx(0.5)
    # a sampled bucket re-collected for GPU 0 with fewer samples does not blank its exactness
    store.ingest([GpuBucket("c", "n1", 0, J0, 300, 3, sm_active=0.2)])
    # re-collected with the counters (more samples: the merge takes them); roll-up to hours: GPU 0 stays
    # exact, a mixed hour keeps the observed-seconds weighted share
    store.ingest([GpuBucket("c", "n1", 1, J0 + timedelta(minutes=5 * i), 300, 11, sm_active=0.01,
                            sm_exact=True) for i in range(12, 15)])  # 3 of GPU 1's 12 second-hour buckets exact
    retention.prune(store, now=int((J0 + timedelta(weeks=10)).timestamp()), keep_weeks=1)
    with store.engine.connect() as conn:
        hourly = {(g, ts): x for g, ts, x in conn.execute(text(
            "SELECT tg.gpu_index, b.bucket_ts, b.sm_exact FROM gpu_buckets b JOIN telemetry_gpus tg ON tg.id = "
            "b.gpu_id WHERE b.bucket_s = 3600"))}
    h0 = int(J0.timestamp())
    assert hourly == pytest.approx({(0, h0): 1.0, (0, h0 + 3600): 1.0, (1, h0): 0.0, (1, h0 + 3600): 0.25})
