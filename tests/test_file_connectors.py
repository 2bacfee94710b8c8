"""File connectors: documented formats, one line per bad record, good records kept, units normalised."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from auditor.config import parse
from connectors import build, validate_sources
from connectors.base import Context, Problems, Window
from connectors.file import expand_indices, parse_gpus

FIX = Path(__file__).parent / "fixtures" / "files"
WIN = Window(datetime(2026, 11, 19, tzinfo=UTC), datetime(2026, 11, 22, tzinfo=UTC), 300)


def collect(role: str, options: dict, caplog: pytest.LogCaptureFixture | None = None):
    problems = Problems()
    src = build("file", role, options, Context("c", FIX))
    return list(src.collect(WIN, problems)), problems


def test_gpu_field_parsing() -> None:
    assert expand_indices("0-2,5") == [0, 1, 2, 5]
    gpus = parse_gpus("a:0-1;b:*2", "h100", 1.0, None)
    assert [(g.node, g.index) for g in gpus] == [("a", 0), ("a", 1), ("b", None), ("b", None)]
    with pytest.raises(ValueError):
        parse_gpus("a:3-1", None, 1.0, None)


def test_csv_allocations_skip_bad_rows_keep_good(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "gpu_audit")
    recs, problems = collect("allocations", {"paths": ["allocations-bad.csv"]})
    assert sorted(a.external_id for a in recs) == ["1", "7"]
    assert problems.total == 5
    lines = [r.getMessage() for r in caplog.records]
    assert any("allocations-bad.csv:line 3: start: cannot parse time" in m for m in lines)
    assert any("line 4: end " in m and "is before start" in m for m in lines)
    assert any("line 5: id: missing" in m for m in lines)
    assert any("line 6: bad gpus entry" in m for m in lines)
    assert any("line 7: more fields than the header" in m for m in lines)
    assert all("\n" not in m for m in lines)
    hostile = next(a for a in recs if a.external_id == "7")
    assert hostile.name == "<script>alert(1)</script>; rm -rf /" and hostile.end is None
    assert [g.index for g in hostile.gpus] == [None, None]


def test_json_and_jsonl_allocations(tmp_path: Path) -> None:
    items = [{"id": "u1", "account": "ns", "start": "2026-11-20T00:00:00Z", "source": "kubernetes",
              "gpus": [{"node": "n", "share": 0.25}], "labels": {"team": "x"}}]
    (tmp_path / "a.json").write_text(json.dumps(items))
    (tmp_path / "b.jsonl").write_text(json.dumps(items[0] | {"id": "u2"}) + "\n{not json\n[1]\n")
    problems = Problems()
    src = build("file", "allocations", {"paths": ["*.json*"]}, Context("c", tmp_path))
    recs = list(src.collect(WIN, problems))
    assert sorted(a.external_id for a in recs) == ["u1", "u2"]
    assert recs[0].gpus[0].share == 0.25 and recs[0].labels == {"team": "x"}
    assert problems.total == 2


def test_missing_file_is_a_source_error(tmp_path: Path) -> None:
    from auditor.errors import SourceError

    src = build("file", "allocations", {"paths": ["nope.csv"]}, Context("c", tmp_path))
    with pytest.raises(SourceError, match="nope.csv: no such file"):
        list(src.collect(WIN, Problems()))


def test_long_csv_telemetry_normalises_and_quarantines(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "gpu_audit")
    buckets, problems = collect("telemetry", {"paths": ["telemetry-bad.csv"]})
    by = {(b.host, b.gpu, b.start.minute): b for b in buckets}
    b0 = by[("n1", 0, 0)]
    assert b0.sm_active == pytest.approx(0.6) and b0.gpu_util == pytest.approx(0.8) and b0.samples == 2
    b1 = by[("n1", 1, 0)]
    assert b1.sm_active == 1.0  # 1.04 clamped and counted
    assert b1.fb_used_mib == 2048  # max over the bucket
    assert (b1.pod, b1.namespace) == ("pod-x", "ns-y")
    b2 = by[("n1", 1, 5)]
    assert b2.fb_used_mib == pytest.approx(1024.0)  # bytes -> MiB
    assert b2.gpu_util is None  # 250 % rejected
    assert sum(problems.clamped.values()) == 1
    # NaN, negative, inf, bad time, no host, bad gpu, unknown metric (once), 250 %
    assert problems.total == 8
    assert sum("unknown metric" in r.getMessage() for r in caplog.records) == 1


def test_file_options_are_validated() -> None:
    from auditor.errors import ConfigError

    with pytest.raises(ConfigError, match=r"clusters\[0\]\.allocations\[0\]\.format: "):
        validate_sources(parse({"clusters": [{"name": "c", "allocations": [{"kind": "file", "paths": ["x"],
                                                                      "format": "xls"}]}]}))


def test_reservations_and_inventory_in_json(tmp_path: Path) -> None:
    from auditor.records import GpuInventory, Reservation

    items = [{"type": "reservation", "name": "maint", "start": "2026-11-20", "end": "2026-11-21",
              "nodes": "n1,n2", "gpu_count": 16, "users": ["alice"]},
             {"type": "reservation", "name": "bad", "start": "2026-11-21", "end": "2026-11-20"},
             {"type": "inventory", "node": "n1", "gpus": 8, "model": "h100"},
             {"type": "bogus"}]
    (tmp_path / "r.json").write_text(json.dumps(items))
    problems = Problems()
    recs = list(build("file", "allocations", {"paths": ["r.json"]}, Context("c", tmp_path)).collect(WIN, problems))
    resv = [r for r in recs if isinstance(r, Reservation)]
    assert [(r.name, r.nodes, r.gpu_count) for r in resv] == [("maint", ["n1", "n2"], 16.0)]
    assert len([r for r in recs if isinstance(r, GpuInventory)]) == 8
    assert problems.total == 2


def test_saved_sacct_output_is_read_through_the_slurm_parser(tmp_path: Path) -> None:
    """A real `sacct -X -P` capture from Slurm 22.05 (tests/fixtures/slurm), plus one broken line."""
    real = Path(__file__).parent / "fixtures" / "slurm" / "22.05" / "1node" / "after-cancel" / "sacct-X.txt"
    text = real.read_text().rstrip("\n").splitlines()
    data = [ln for ln in text if not ln.startswith("$ ") and not ln.startswith("[rc=")]
    (tmp_path / "jobs.sacct").write_text("\n".join([*data, "broken|line"]) + "\n")
    problems = Problems()
    window = Window(datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC), 300)
    recs = list(build("file", "allocations", {"paths": ["jobs.sacct"]}, Context("lab", tmp_path))
                .collect(window, problems))
    assert recs and all(a.source == "slurm" and a.gpus for a in recs)
    assert problems.total == 1
    header = data[0].split("|")
    gpu_rows = [dict(zip(header, ln.split("|"), strict=False)) for ln in data[1:]]
    expected = {r.get("JobID") or r["JobIDRaw"] for r in gpu_rows
                if "gres/gpu=" in r.get("AllocTRES", "") and r.get("Start") not in ("Unknown", "None", "")}
    assert {a.external_id for a in recs} == expected


def test_csv_header_with_renamed_columns_fails_the_source(tmp_path: Path) -> None:
    """``start_time,end_time`` for ``start,end`` used to read as "ok (0 allocations, 0 bad records skipped)",
    exit 0; now the source fails naming the unknown and the missing columns (the rest of the run goes on)."""
    from click.testing import CliRunner

    from auditor.cli import main

    corpus = Path(__file__).parent / "corpus" / "alloc_csv"
    (tmp_path / "renamed.csv").write_bytes((corpus / "header-renamed-times.csv").read_bytes())
    (tmp_path / "good.csv").write_text("id,user,start,end,gpus\ng1,alice,2026-11-20T00:00:00Z,"
                                       "2026-11-20T02:00:00Z,n0:0-1\n")
    cfg = tmp_path / "gpu-audit.toml"
    cfg.write_text(f'[store]\nurl = "sqlite:///{tmp_path / "a.db"}"\n[[clusters]]\nname = "c"\n'
                   '[[clusters.allocations]]\nkind = "file"\npaths = ["renamed.csv"]\n'
                   '[[clusters.allocations]]\nkind = "file"\npaths = ["good.csv"]\n')
    assert CliRunner().invoke(main, ["-c", str(cfg), "db", "upgrade"]).exit_code == 0
    res = CliRunner().invoke(main, ["-c", str(cfg), "collect", "--since", "2026-11-19", "--until", "2026-11-21"])
    assert res.exit_code == 3, res.output  # partial: one source failed, the other stored
    lines = res.output.strip().splitlines()
    assert any(ln.startswith("c allocations[0]:file: FAILED: ") and "renamed.csv: CSV header: unknown columns "
               "'start_time', 'end_time'; missing required column 'start'" in ln for ln in lines), lines
    assert any(ln.startswith("c allocations[1]:file: ok (1 allocations") for ln in lines), lines
