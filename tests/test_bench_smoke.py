"""CI smoke of ``python -m bench`` at a tiny scale, so the benchmark cannot rot. Not a timing test: it
checks that every figure is measured and printed, never how fast."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import need_pg

ROOT = Path(__file__).resolve().parent.parent


def _bench(tmp_path: Path, *args: str) -> tuple[str, dict]:
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path / "cache"),
                           "--json", str(out), *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())


def _table(text: str) -> dict[str, list[str]]:
    """The closing table's rows by figure name (columns split on runs of two or more spaces)."""
    import re

    lines = text.split("targets (ratio = value / target)\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert re.split(r"\s{2,}", lines[0].strip()) == ["figure", "value", "target", "ratio", "status"]
    return {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", x.strip()) for x in lines[1:])}


@pytest.mark.slow
def test_bench_smoke_sqlite(tmp_path: Path) -> None:
    text, figures = _bench(tmp_path)
    assert "Store.ingest" in text and "raw sqlite3 executemany" in text
    ing = figures["ingest"]
    assert ing["rows"] == 16 * 288 and ing["store_rows_s"] > 0 and ing["raw_rows_s"] > 0
    sizes = [r["gpus"] for r in figures["sqlite"]]
    assert sizes == [32, 64]
    for r in figures["sqlite"]:
        assert r["rows"] > 0.9 * r["gpus"] * 288 and r["audit_s"] > 0 and r["floor_s"] > 0
        assert r["rss_mib"] > 0 and r["allocations"] > 0
    rows = _table(text)
    # every figure of the issue is in the one table, with its target and ratio where it has one
    for name in ("SQLite ingest: Store.ingest", "SQLite audit/floor 64 GPUs", "SQLite judge/floor 64 GPUs",
                 "SQLite peak RSS 64 GPUs", "SQLite scaling 32 -> 64 GPUs (2x data)",
                 "render all formats, {:,} allocations".format(figures["render"]["allocations"]),
                 "render json+csv", "legacy render all formats (before)",
                 "SQLite collect 2 clusters sequential", "SQLite collect speed-up (sequential / parallel)"):
        assert name in rows, (name, sorted(rows))
    assert rows["SQLite scaling 32 -> 64 GPUs (2x data)"][1] == "<= 2.25x"  # 4.5x per 4x data, pro rata
    # the per-allocation stage alone: (audit - judging) / floor, from the figures the run wrote
    big = figures["sqlite"][-1]
    less = rows["SQLite audit less judging / floor 64 GPUs"]
    assert less[0] == f"{(big['audit_s'] - big['judge_s']) / big['floor_s']:.2f}x" and less[1] == "-"
    floor = rows["SQLite audit/floor 64 GPUs"]
    assert floor[1] == "<= 10.00x" and floor[3].split()[0] in ("met", "MISSED")
    r = figures["render"]
    assert r["identical"] is True and r["new"]["total_s"] > 0
    assert r["allocations"] == figures["sqlite"][-1]["allocations"]
    (c,) = figures["collect"]
    assert c["allocations"] > 0 and c["buckets"] > 0 and c["sequential_s"] > 0 and c["parallel_s"] > 0
    assert {x["name"].strip() for x in figures["rows"]} == set(rows)
    # issue 46: the fixed cost of a run and the peer side by side (JDS only where the bench extra is installed)
    assert rows["CLI start: gpu-audit --help, CPU"][1] == "<= 0.25 s"
    assert "new SQLite store from the models (process CPU)" in rows
    assert any(n.startswith("jobstats 100 jobs: gpu-audit CPU") for n in rows)
    # the second run reuses the cached stores (generation is reported, not redone)
    text2, figures2 = _bench(tmp_path, "--gpus", "64", "--only", "audit")
    assert figures2["sqlite"][0]["reused"] is True and "(cached)" in text2
    assert "render" not in figures2 and "SQLite audit 64 GPUs" in _table(text2)


@pytest.mark.service
@pytest.mark.slow
def test_bench_smoke_postgresql(tmp_path: Path) -> None:
    text, figures = _bench(tmp_path, "--pg-url", need_pg(), "--engines", "postgresql", "--gpus", "32",
                           "--ingest-gpus", "4")
    assert "PostgreSQL audit" in text and "audit/floor" in text
    (r,) = figures["pg"]
    assert r["rows"] > 0.9 * 32 * 288 and r["audit_s"] > 0 and r["floor_s"] > 0 and r["ingest_rows"] == r["rows"]
    rows = _table(text)
    assert "PostgreSQL audit/floor 32 GPUs" in rows and "PostgreSQL peak RSS 32 GPUs" in rows
    assert "PostgreSQL collect speed-up (sequential / parallel)" in rows
    if "pg_ingest" in figures:
        assert any(name.startswith("PostgreSQL ingest") for name in rows)


def test_bench_evidence_smoke(tmp_path: Path) -> None:
    """``python -m bench.evidence`` on a 32-GPU day: both paths timed, the spliced sparklines equal the
    parsed ones (the module exits otherwise), and the evidence without the thresholds is smaller."""
    from bench.fleet import FleetSpec, generate

    path = tmp_path / "fleet.db"
    generate(FleetSpec(gpus=32, days=1, seed=1), path)
    proc = subprocess.run([sys.executable, "-m", "bench.evidence", f"sqlite:///{path}", "--gpus", "32", "--days", "1",
                           "--repeat", "1"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["findings"] > 0 and r["allocations"] > 0 and len(r["seconds"]) == 2
    assert 0 < r["evidence bytes"] < r["evidence bytes (before)"]


def test_the_peer_bench_feeds_both_tools_the_same_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench.bench_jobstats: the stand-in ``sacct`` answers a caller's ``-a -X -P -n -o`` with the saved rows'
    fields in the order asked, step lines left out and times as epoch seconds under SLURM_TIME_FORMAT=%s (the
    way Job Defense Shield reads them), and gpu-audit's idle GPU-hours on those rows equal the generator's
    truth (GPUs at 0 % x elapsed hours, summed by the generator, not by gpu-audit)."""
    import contextlib
    import io

    from bench import bench_jobstats, sacct_replay

    path = tmp_path / "sacct.txt"
    kinds = bench_jobstats.generate(200, path, seed=3)
    monkeypatch.setenv("GPU_AUDIT_SACCT_REPLAY", str(path))
    monkeypatch.setenv("SLURM_TIME_FORMAT", "%s")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        sacct_replay.main(["-a", "-X", "-P", "-n", "-o", "jobid,start,alloctres,admincomment,jobname"])
    rows = [line.split("|") for line in out.getvalue().splitlines()]
    assert len(rows) == 200 and all(len(r) == 5 for r in rows)  # no header, no step line
    assert rows[0][0] == "1" and rows[0][1].isdigit() and int(rows[0][1]) >= 1_794_787_200  # 2026-11-16 UTC
    assert sum(r[3].startswith("JS1:") and r[3] != "JS1:Short" for r in rows) == kinds["summary"]
    proc = subprocess.run([sys.executable, "-m", "bench.bench_jobstats", "--child", str(path),
                           str(tmp_path / "store.db"), "3600"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["idle_gpu_hours"] == pytest.approx(kinds["truth_zero_gpu_hours"], rel=1e-9)
    assert kinds["truth_zero_gpu_hours"] > 0
