"""CI smoke of ``python -m bench`` at a tiny scale, so the benchmark cannot rot. Not a timing test: it
checks that every figure is measured and printed, never how fast."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import need, port_open

ROOT = Path(__file__).resolve().parent.parent


def _bench(tmp_path: Path, *args: str) -> tuple[str, dict]:
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, "-m", "bench", "--days", "1", "--out", str(tmp_path / "cache"),
                           "--json", str(out), *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())


def test_bench_smoke_sqlite(tmp_path: Path) -> None:
    text, figures = _bench(tmp_path, "--sizes", "32,64", "--ingest-gpus", "16", "--ingest-days", "1",
                           "--pg-sizes", "")
    assert "Store.ingest" in text and "raw sqlite3 executemany" in text
    assert "audit/floor" in text and "peak RSS" in text and "scaling 32 -> 64" in text
    assert "render" in text and "targets" in text
    ing = figures["ingest"]
    assert ing["rows"] == 16 * 288 and ing["store_rows_s"] > 0 and ing["raw_rows_s"] > 0
    sizes = [r["gpus"] for r in figures["sqlite"]]
    assert sizes == [32, 64]
    for r in figures["sqlite"]:
        assert r["rows"] > 0.9 * r["gpus"] * 288 and r["audit_s"] > 0 and r["floor_s"] > 0
        assert r["rss_mib"] > 0 and r["allocations"] > 0
    assert figures["sqlite"][-1]["render_s"] is None or figures["sqlite"][-1]["render_s"] > 0
    # the second run reuses the cached stores (generation is reported, not redone)
    text2, figures2 = _bench(tmp_path, "--sizes", "64", "--ingest-gpus", "0", "--pg-sizes", "")
    assert figures2["sqlite"][0]["reused"] is True and "(cached)" in text2


@pytest.mark.service
def test_bench_smoke_postgresql(tmp_path: Path) -> None:
    need(port_open("127.0.0.1", 5432), "PostgreSQL on 127.0.0.1:5432 is not running")
    text, figures = _bench(tmp_path, "--sizes", "", "--ingest-gpus", "0", "--pg-sizes", "32")
    assert "PostgreSQL audit" in text and "audit/floor" in text
    (r,) = figures["pg"]
    assert r["rows"] > 0.9 * 32 * 288 and r["audit_s"] > 0 and r["floor_s"] > 0 and r["ingest_rows"] == r["rows"]
