"""The streamed JSON export and findings CSV (auditor.report.export, issue 20) are byte for byte what the
in-memory path wrote: ``render_json(build_context(full=True), compact=True)`` and
``write_csv(findings_csv_rows(...))`` are the oracle, on both engines, with chunks far smaller than the
tables (so every chunk boundary, every spool and the silent-GPU table are crossed), hostile names and CSV
formula cells. Counts are also checked against plain SQL over the findings table."""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text
from test_report import T0, WEEK, make_cfg, week_records

from auditor.audit.run import run_audit
from auditor.records import AllocatedGpu, Allocation, GpuBucket, GpuInventory
from auditor.report import context as report
from auditor.report import export, render
from auditor.store.engine import Store

NOW = datetime(2026, 11, 24, 9, 30, tzinfo=UTC)
FORMULAS = ("=HYPERLINK(\"http://x\")", "+1+2", "-3", "@SUM(A1)", "ok ✓ ünïcode")


def many(t0: datetime) -> list:
    """week_records plus 12 idle one-GPU jobs with formula-like names and 7 inventory GPUs never heard of."""
    recs = week_records(t0)
    for i in range(12):
        host, start = f"m{i}", t0 + timedelta(hours=i)
        recs.append(Allocation("c1", "slurm", str(500 + i), name=FORMULAS[i % len(FORMULAS)],
                               user=f"=u{i}" if i % 2 else f"u{i}", account="acct-ml", start=start,
                               end=start + timedelta(hours=3 + i % 4), gpus=[AllocatedGpu(host, 0)]))
        recs += [GpuBucket("c1", host, 0, start + timedelta(seconds=300 * k), 300, 10, sm_active=0.01,
                           gpu_util=0.0 if i % 3 else 0.95) for k in range((3 + i % 4) * 12)]
    recs += [GpuInventory("c1", f"dark{i}", 0) for i in range(7)]
    # 3 GPUs nobody held reading 99 % GPU-Util with no memory for an hour: 3 ghost_busy findings, more than
    # top_n (2), in their own table (not top_idle), uncut in the export
    recs += [GpuBucket("c1", f"ghost{i}", 0, t0 + timedelta(hours=2, seconds=300 * k), 300, 10, gpu_util=0.99,
                       sm_active=0.0, fb_used_mib=0.0) for i in range(3) for k in range(12)]
    return recs


def audited(store: Store) -> int:
    cfg = make_cfg(top_n=2)
    rid = 0
    for k in (1, 0):
        start = T0 - k * WEEK
        store.ingest(many(start + timedelta(hours=1)))
        rid = run_audit(store, cfg, start, start + WEEK).run_id
    return rid


def oracle(store: Store, run_id: int, tmp: Path) -> tuple[str, str]:
    """What the in-memory path writes: the full context dumped whole, and the CSV from a list of rows."""
    cfg = make_cfg(top_n=2)
    js = render.render_json(report.build_context(store, cfg, run_id, full=True, now=NOW), compact=True)
    render.write_csv(report.findings_csv_rows(store, cfg, run_id), tmp / "oracle.csv")
    return js, (tmp / "oracle.csv").read_text(encoding="utf-8")


@pytest.mark.parametrize("chunk", [1, 3, 2000])
def test_streamed_exports_equal_the_in_memory_ones(store: Store, tmp_path: Path, chunk: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(export, "CHUNK", chunk)
    run_id = audited(store)
    paths = render.write_reports(store, make_cfg(top_n=2), run_id, tmp_path / "out", render.FORMATS, now=NOW)
    got = {p.suffix: p.read_text(encoding="utf-8") for p in paths}
    want_json, want_csv = oracle(store, run_id, tmp_path)
    assert got[".json"] == want_json
    assert got[".csv"] == want_csv
    doc = json.loads(got[".json"])
    with store.engine.connect() as c:  # plain SQL: how many findings of each table's kinds the run has
        per_kind = dict(c.execute(text("SELECT kind, COUNT(*) FROM findings WHERE run_id = :r GROUP BY kind"),
                                  {"r": run_id}).all())
        ghosts = c.execute(text("SELECT COUNT(*) FROM findings WHERE run_id = :r AND kind = 'ghost_busy' "
                                "AND allocation_id IS NULL"), {"r": run_id}).scalar()
    idle = sum(per_kind.get(k, 0) for k in report.IDLE_KINDS) - ghosts
    assert ghosts == 3 and doc["ghosts"]["shown"] == len(doc["ghosts"]["rows"]) == doc["ghosts"]["total"] == 3
    assert idle >= 14  # 12 idle jobs + the two evil-named idle/mirage jobs of week_records
    assert doc["full"] is True and doc["top_idle"]["shown"] == len(doc["top_idle"]["rows"]) == idle
    assert doc["coverage"]["silent"]["shown"] == doc["coverage"]["silent"]["total"] == 8  # 7 dark + n9
    rows = list(csv.reader(got[".csv"].splitlines()))
    assert len(rows) - 1 == sum(per_kind.get(k, 0) for k in export.all_kinds())
    names = {r[rows[0].index("job_name")] for r in rows[1:]}
    assert "'=HYPERLINK(\"http://x\")" in names and "'+1+2" in names and "'-3" in names
    assert "'@SUM(A1)" in names and not any(n[:1] and n[:1] in "=+-@" for n in names)
    # the cut context of the other formats is untouched: top_n rows, cut
    assert "&lt;script&gt;" in got[".html"] and doc["teams"]["rows"]


def test_empty_run_and_csv_only(store: Store, tmp_path: Path) -> None:
    """No findings at all: the CSV is the default header; without json only the CSV is streamed."""
    store.ingest([GpuInventory("c1", "n1", 0)])
    cfg = make_cfg()
    run_id = run_audit(store, cfg, T0, T0 + WEEK).run_id
    paths = render.write_reports(store, cfg, run_id, tmp_path / "o", ["json"], now=NOW)
    js = render.render_json(report.build_context(store, cfg, run_id, full=True, now=NOW), compact=True)
    assert paths[0].read_text(encoding="utf-8") == js
    assert paths[1].read_text(encoding="utf-8").strip() == ",".join(export.CSV_DEFAULT_FIELDS)
    paths = render.write_reports(store, cfg, run_id, tmp_path / "t", ["text"], now=NOW)
    assert [p.suffix for p in paths] == [".txt", ".csv"] and not (tmp_path / "t" / f"report-{run_id}.json").exists()
    assert not list((tmp_path / "t").glob(".*.tmp"))


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin", "Australia/Lord_Howe", "Asia/Kathmandu"])
def test_cached_minute_text_equals_direct_formatting(zone: str) -> None:
    """report._when caches by minute; every second around DST changes (Berlin: 1 h, Lord Howe: 30 min)
    and in a +5:45 zone reads as datetime formats it directly."""
    from zoneinfo import ZoneInfo

    tz = ZoneInfo(zone)
    starts = [datetime(2026, 3, 29, 0, 58, tzinfo=UTC), datetime(2026, 10, 25, 0, 58, tzinfo=UTC),
              datetime(2026, 4, 4, 14, 58, tzinfo=UTC), datetime(2026, 10, 3, 15, 28, tzinfo=UTC)]
    for start in starts:
        base = int(start.timestamp())
        for ts in range(base - 7, base + 240, 7):
            want = datetime.fromtimestamp(ts, UTC).astimezone(tz).strftime("%Y-%m-%d %H:%M %Z")
            assert report._when(ts, tz) == want, (zone, ts)
    assert report._when(None, tz) is None
