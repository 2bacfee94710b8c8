"""Issue 14 §4, connector side: no silent zero results (a header that does not match names the expected
columns; metrics present but none supported name the most common names), CPU-only jobs skipped and counted
(not bad records), epoch timestamps of any size, and allocation windows that end now."""

from __future__ import annotations

import logging
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from auditor.collect import plan_window
from auditor.config import Config
from auditor.errors import SourceError
from auditor.store.engine import Store
from auditor.timeutil import parse_time
from connectors import build
from connectors.base import Context, Problems, Window

FX = Path(__file__).parent / "fixtures"
EVER = Window(datetime(1970, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC))


@pytest.mark.parametrize(("text", "want"), [
    ("0", datetime(1970, 1, 1, tzinfo=UTC)),                      # traces start at 0
    ("3600", datetime(1970, 1, 1, 1, tzinfo=UTC)),
    ("86400.5", datetime(1970, 1, 2, 0, 0, 0, 500000, tzinfo=UTC)),
    ("1795705200", datetime(2026, 11, 26, 15, tzinfo=UTC)),       # seconds
    ("1795705200000", datetime(2026, 11, 26, 15, tzinfo=UTC)),    # milliseconds
    ("1795705200000000", datetime(2026, 11, 26, 15, tzinfo=UTC)),  # microseconds
    ("1795705200000000000", datetime(2026, 11, 26, 15, tzinfo=UTC)),  # nanoseconds
])
def test_epoch_timestamps_of_any_size(text: str, want: datetime) -> None:
    assert parse_time(text) == want


def test_sacct_file_with_a_foreign_header_names_the_expected_columns(tmp_path: Path) -> None:
    (tmp_path / "jobs.txt").write_text("id|user|gpus\n1|alice|2\n2|bob|1\n")
    src = build("file", "allocations", {"paths": ["jobs.txt"], "format": "sacct"}, Context("c", tmp_path))
    with pytest.raises(SourceError) as err:
        list(src.collect(EVER, Problems()))
    msg = str(err.value)
    assert "lacks JobID, Start, End, NodeList, AllocTRES" in msg and "JobIDRaw" in msg and "\n" not in msg


def test_cpu_only_jobs_are_counted_not_bad_records(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # the real 22.05 capture holds one CPU-only job (10, "cpu-only") among GPU jobs (SAMPLES.md)
    shutil.copy(FX / "slurm/22.05/1node/running/sacct-X.txt", tmp_path / "sacct.txt")
    src = build("file", "allocations", {"paths": ["sacct.txt"], "format": "sacct"}, Context("c", tmp_path))
    problems = Problems()
    with caplog.at_level(logging.INFO, "gpu_audit.input"):
        ids = {a.external_id for a in src.collect(EVER, problems)}
    assert problems.total == 0 and "10" not in ids and "6" in ids
    assert "1 jobs without GPUs (CPU-only) skipped" in caplog.text


def test_unsupported_metrics_name_the_most_common(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lines = [f'node_cpu_seconds_total{{cpu="{i}"}} {i}' for i in range(3)] + ["node_load1 0.5"]
    (tmp_path / "node.prom").write_text("\n".join(lines) + "\n")
    src = build("scrape", "telemetry", {"paths": ["node.prom"], "at": "2026-11-26T15:00:00Z"},
                Context("c", tmp_path))
    with caplog.at_level(logging.WARNING, "gpu_audit.scrape"):
        assert list(src.collect(EVER, Problems())) == []
    assert "4 samples but no supported GPU metric" in caplog.text
    assert "node_cpu_seconds_total (3), node_load1 (1)" in caplog.text


def test_allocation_windows_end_now_telemetry_windows_at_a_bucket(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    store.upgrade()
    cluster = Config.model_validate({"clusters": [{"name": "c"}]}).clusters[0]
    now = datetime(2026, 11, 26, 15, 3, 20, tzinfo=UTC)
    alloc = plan_window(store, cluster, "allocations[0]:slurm", 300, now, None, None, "allocations")
    tele = plan_window(store, cluster, "telemetry[0]:prometheus", 300, now, None, None, "telemetry")
    assert alloc.until == now  # a job started at 15:01 is read on this first run
    assert tele.until == datetime(2026, 11, 26, 15, 0, tzinfo=UTC)  # only whole buckets of telemetry
    assert alloc.since == tele.since == datetime(2026, 11, 26, 15, 0, tzinfo=UTC) - timedelta(
        days=cluster.initial_days)


def test_collect_storing_nothing_from_a_non_empty_source_is_a_warning(tmp_path: Path) -> None:
    from auditor.collect import collect

    (tmp_path / "node.prom").write_text("node_load1 0.5 1795705200000\nnode_load1 0.7 1795705230000\n")
    shutil.copy(FX / "dcgm" / "t4-gke-k8s-prof.prom", tmp_path / "t4.prom")
    cfg = Config.model_validate({"clusters": [{"name": "c", "telemetry": [
        {"kind": "scrape", "paths": ["node.prom"]},
        {"kind": "scrape", "paths": ["t4.prom"], "at": "2026-11-26T15:00:00Z"}]}]})
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    store.upgrade()
    res = collect(store, cfg, base_dir=tmp_path, since=datetime(2026, 11, 26, 14, tzinfo=UTC),
                  until=datetime(2026, 11, 26, 16, tzinfo=UTC), now=datetime(2026, 11, 26, 16, tzinfo=UTC))
    empty, real = res.results
    assert empty.ok and empty.warning.startswith("0 records stored: 2 samples but no supported GPU metric")
    assert "node_load1 (2)" in empty.warning
    assert real.ok and real.warning == "" and real.stats["buckets"] > 0
