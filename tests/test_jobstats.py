"""jobstats summaries in Slurm's AdminComment (``JS1:``) and Slurm's own gres/gpuutil as per-GPU telemetry of
finished jobs. The sample (fixtures/jobstats/sacct-admincomment-js1.txt) is built from the public format,
see fixtures/jobstats/PROVENANCE.md; expected values below are worked out by hand from it."""

from __future__ import annotations

import base64
import gzip
import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from auditor.errors import SourceError
from connectors import build
from connectors.base import Context, Problems, Window
from connectors.slurm.jobstats import Js1Error, decode_js1, encode_js1

FIX = Path(__file__).parent / "fixtures" / "jobstats"
T0 = datetime(2026, 11, 29, 8, 0, tzinfo=UTC)
WIN = Window(T0, T0 + timedelta(hours=2), 300)


def read(window: Window = WIN, **opts: object) -> tuple[list, Problems]:
    src = build("jobstats", "telemetry", {"paths": ["sacct-admincomment-js1.txt"], **opts}, Context("lab", FIX))
    problems = Problems()
    return list(src.collect(window, problems)), problems


def test_decode_is_what_jobstats_writes() -> None:
    # jobstats: "JS1:" + base64(gzip(json)); its reader: json.loads(gzip.decompress(base64.b64decode(s[4:])))
    doc = {"nodes": {"n1": {"gpu_utilization": {"0": 12.5}}}, "total_time": 600, "gpus": 1}
    text = "JS1:" + base64.b64encode(gzip.compress(json.dumps(doc).encode())).decode()
    assert decode_js1(text) == doc and decode_js1(encode_js1(doc)) == doc
    assert decode_js1("JS1:Short") is None and decode_js1("JS1:None") is None
    assert decode_js1("") is None and decode_js1("some admin note") is None
    for bad in ("JS1:!!!", "JS1:" + base64.b64encode(b"not gzip").decode(),
                "JS1:" + base64.b64encode(gzip.compress(b"[1, 2]")).decode()):
        with pytest.raises(Js1Error):
            decode_js1(bad)


def test_summaries_and_slurm_gpuutil_become_per_gpu_buckets() -> None:
    buckets, problems = read()
    rows = defaultdict(list)
    for b in buckets:
        rows[(b.hpc_job, b.host, b.gpu)].append(b)
    # 101: 08:00-09:00 on gpu-node-01 GPUs 0 and 3 -> 12 five-minute buckets each
    # 103: no summary; batch step gres/gpuutil=37, gres/gpumem=2048M over its 2 GPUs: since Slurm 24.05.1 a
    #      SUM over the task's GPUs, not a per-GPU reading -> no buckets (before: 37 % copied onto both GPUs)
    # 108: 1 GPU, gpuutil=64 -> that GPU's reading, 08:20-08:30 = 2 buckets; 109: 4 GPUs, sum 0 -> each GPU 0
    # 106_2: 08:02:30-08:07:30 touches the 08:00 and 08:05 buckets, one GPU on each node
    # 102 (JS1:Short), 104 (corrupt), 105 (CPU only), 107 (running): nothing
    assert {k: len(v) for k, v in rows.items()} == {
        ("101", "gpu-node-01", 0): 12, ("101", "gpu-node-01", 3): 12,
        ("108", "gpu-node-02", 0): 2, **{("109", "gpu-node-02", k): 2 for k in range(4)},
        ("106_2", "gpu-node-01", 1): 2, ("106_2", "gpu-node-02", 0): 2}
    g0 = rows[("101", "gpu-node-01", 0)]
    assert {(b.gpu_util, b.fb_used_mib) for b in g0} == {(0.985, 40960.0)}  # 98.5 %; 42949672960 B = 40 GiB
    assert sorted(b.start for b in g0) == [T0 + timedelta(minutes=5 * i) for i in range(12)]
    assert {(b.gpu_util, b.fb_used_mib) for b in rows[("101", "gpu-node-01", 3)]} == {(0.0, 1.0)}
    assert {(b.gpu_util, b.fb_used_mib) for b in rows[("108", "gpu-node-02", 0)]} == {(0.64, 4096.0)}
    assert {(b.gpu_util, b.fb_used_mib) for k in range(4) for b in rows[("109", "gpu-node-02", k)]} == {(0.0, 0.0)}
    assert {b.gpu_util for b in rows[("106_2", "gpu-node-02", 0)]} == {0.55}
    assert all(b.sm_active is None and b.samples == 1 and b.seconds == 300 for b in buckets)
    # the corrupt summary is quarantined with its job, nothing else is
    assert problems.total == 1 and problems.items[0][1] == "job 104" and "does not decode" in problems.items[0][2]


def test_window_clips_and_hourly_buckets_and_fallback_off() -> None:
    half = Window(T0 + timedelta(minutes=30), T0 + timedelta(hours=2), 300)
    buckets, _ = read(half)
    # 101 from 08:30 to 09:00 = 6 buckets x 2 GPUs; 103 only a sum; 106_2, 108 and 109 ended before
    assert len(buckets) == 6 * 2
    hourly, _ = read(bucket_seconds=3600)
    # 101: one 08:00 bucket per GPU; 106_2: one per GPU; 108: one; 109: one per GPU -> 9 rows of 3600 s
    assert len(hourly) == 9 and {b.seconds for b in hourly} == {3600}
    none, _ = read(fallback="none")
    assert {b.hpc_job for b in none} == {"101", "106_2"}


def test_headerless_or_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "x.txt").write_text("101|101|COMPLETED|2026-11-29T08:00:00|2026-11-29T09:00:00|n||\n")
    src = build("jobstats", "telemetry", {"paths": ["x.txt"]}, Context("lab", tmp_path))
    with pytest.raises(SourceError, match="no header line naming JobID"):
        list(src.collect(WIN, Problems()))
    src = build("jobstats", "telemetry", {"paths": ["nope*.txt"]}, Context("lab", tmp_path))
    with pytest.raises(SourceError, match="no file matches"):
        list(src.collect(WIN, Problems()))


@pytest.mark.parametrize("bucket", [300, 3600])
def test_summary_audited_end_to_end_at_any_row_width(store_url: str, tmp_path: Path, bucket: int) -> None:
    """Job 101 alone (2 GPUs, 08:00-09:00; GPU 0 at 98.5 %, GPU 3 at 0 %): by hand reserved 2 GPU-h, idle by
    GPU-Util 1 GPU-h (GPU 3), whatever the width of the rows the summary is spread over."""
    from sqlalchemy import text

    from auditor.audit.run import run_audit
    from auditor.collect import collect
    from auditor.config import Config
    from auditor.store.engine import Store

    lines = (FIX / "sacct-admincomment-js1.txt").read_text().splitlines()
    (tmp_path / "s.txt").write_text("\n".join(ln for ln in lines if ln.startswith(("JobID|", "101"))) + "\n")
    cfg = Config.model_validate({"clusters": [{
        "name": "lab", "allocations": [{"kind": "file", "paths": ["s.txt"], "format": "sacct"}],
        "telemetry": [{"kind": "jobstats", "paths": ["s.txt"], "bucket_seconds": bucket}]}]})
    store = Store.open(store_url)
    store.upgrade()
    until = T0 + timedelta(days=1)
    res = collect(store, cfg, base_dir=tmp_path, since=T0 - timedelta(days=1), until=until, now=until)
    assert all(r.ok for r in res.results)
    rid = run_audit(store, cfg, T0 - timedelta(days=1), until).run_id
    with store.engine.connect() as conn:
        row = conn.execute(text("SELECT u.reserved_s, u.idle_s FROM usage_allocation u JOIN allocations a "
                                "ON a.id = u.allocation_id WHERE u.run_id = :r AND a.external_id = '101'"),
                           {"r": rid}).one()
    assert (row.reserved_s, row.idle_s) == (7200, 3600)


def test_slurm_gpuutil_is_a_sum_never_copied_onto_each_gpu() -> None:
    """Since Slurm 24.05.1 gres/gpuutil and gres/gpumem are sums over a task's GPUs (SchedMD/slurm
    CHANGELOG/slurm-24.05.md, 24.05.1): on job 103 (2 GPUs, 37 %) no GPU gets 37 % as its reading; the
    source's note says that only the sum is known, with the job's figure."""
    src = build("jobstats", "telemetry", {"paths": ["sacct-admincomment-js1.txt"]}, Context("lab", FIX))
    buckets = list(src.collect(WIN, Problems()))
    assert not [b for b in buckets if b.hpc_job == "103"]
    assert src.counts["tres_sum_only"] == 1 and src.counts["tres_fallback"] == 2
    (note,) = src.notes
    assert "1 multi-GPU jobs have only Slurm's gres/gpuutil or gres/gpumem, a sum over each task's GPUs" in note
    assert "job 103: 37 % over 2 GPUs" in note and "unknown, never idle" in note
