"""Every DCGM metric name gpu-audit reads is one DCGM defines, and a page using DCGM 4.x names loses nothing.

The lists are taken from the sources (tests/fixtures/dcgm/PROVENANCE.md): NVIDIA/DCGM's dcgm_fields.h
@ 72fa3fe (DCGM 4.x), dcgm-exporter's shipped counter files @ d5e5f51 and the go-dcgm it pins (ec245c0).
"""

from __future__ import annotations

import csv
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import FIXTURES

from connectors import build
from connectors.aliases import FAULT_ALIASES, KNOWN_UNSTORED, METRIC_ALIASES
from connectors.base import Context, Problems, Window

DCGM = FIXTURES / "dcgm"
ROOT = Path(__file__).resolve().parent.parent
NAMES = FIXTURES / "dcgm_names"
HEADER = set((NAMES / "dcgm_fields-72fa3fe.txt").read_text().split())
RENAMED = dict(line.split() for line in (NAMES / "dcgm_fields-72fa3fe-aliases.txt").read_text().splitlines()
               if line and not line.startswith("#"))
EXPORTER_FILES = ("dcgm-exporter-default-counters.csv", "dcgm-exporter-dcp-metrics-included.csv",
                  "dcgm-exporter-1.x-compatibility-metrics.csv")
#: every name dcgm-exporter's shipped counter files mention (enabled or commented out)
EXPORTER = {word.strip("# ,") for f in EXPORTER_FILES for line in (DCGM / f).read_text().splitlines()
            for word in line.split(",")[:1] if word.strip("# ").startswith("DCGM_")}
GO_DCGM = set((NAMES / "go-dcgm-ec245c0-field-names.txt").read_text().split())
EVER = Window(datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC))
TABLES = {"METRIC_ALIASES": set(METRIC_ALIASES), "FAULT_ALIASES": set(FAULT_ALIASES),
          "KNOWN_UNSTORED": set(KNOWN_UNSTORED)}


def spec_of(name: str) -> object:
    for table in (METRIC_ALIASES, FAULT_ALIASES):
        if name in table:
            return table[name]
    return "unstored" if name in KNOWN_UNSTORED else None


def test_the_lists_are_the_sources() -> None:
    assert len(HEADER) > 900 and "DCGM_FI_PROF_SM_UTIL_RATIO" in HEADER and "DCGM_FI_PROF_SM_ACTIVE" in HEADER
    assert RENAMED["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] == "DCGM_FI_PROF_TENSOR_UTIL_RATIO"
    assert set(RENAMED) <= HEADER and set(RENAMED.values()) <= HEADER
    assert "DCGM_EXP_XID_ERRORS_COUNT" in EXPORTER and "DCGM_FI_PROF_SM_ACTIVE" in EXPORTER


@pytest.mark.parametrize("table", sorted(TABLES))
def test_every_dcgm_name_is_defined_by_a_source(table: str) -> None:
    """DCGM_FI_* names from the header, dcgm-exporter's own DCGM_EXP_* from its counter files; nothing else."""
    names = {n for n in TABLES[table] if n.startswith("DCGM_")}
    undefined = sorted(n for n in names if n not in (HEADER if n.startswith("DCGM_FI_") else EXPORTER))
    assert names and not undefined, f"{table}: names no source defines: {undefined}"


def test_each_field_is_read_under_its_4x_name_and_its_old_name_alike() -> None:
    """Where the table has a field under one of its names, it has it under the other too, with the same
    meaning (bucket field and unit, or fault rule): an exporter's choice of name loses no reading."""
    missing, differ = [], []
    for old, new in RENAMED.items():
        a, b = spec_of(old), spec_of(new)
        if a is None and b is None:
            continue
        if a is None or b is None:
            missing.append(new if b is None else old)
        elif a != b:
            differ.append((old, a, new, b))
    assert not missing and not differ, (missing, differ)
    for new in ("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", "DCGM_FI_PROF_SM_UTIL_RATIO", "DCGM_FI_PROF_SM_OCCUPANCY_RATIO",
                "DCGM_FI_PROF_TENSOR_UTIL_RATIO", "DCGM_FI_PROF_DRAM_UTIL_RATIO", "DCGM_FI_PROF_FP64_UTIL_RATIO",
                "DCGM_FI_PROF_FP32_UTIL_RATIO", "DCGM_FI_PROF_FP16_UTIL_RATIO"):
        assert METRIC_ALIASES[new].unit == "ratio", new


def collect(page: str, tmp: Path | None = None) -> tuple[list, Problems]:
    """Read one page; with ``tmp``, a copy of it dated 2026-12-01 00:00 UTC (a page without timestamps is
    dated by its file's modification time, and a checkout gives two files different times)."""
    root = DCGM
    if tmp is not None:
        (tmp / page).write_bytes((DCGM / page).read_bytes())
        os.utime(tmp / page, (1_764_547_200, 1_764_547_200))
        root = tmp
    src = build("scrape", "telemetry", {"paths": [page]}, Context("c1", root))
    problems = Problems()
    return list(src.collect(EVER, problems)), problems


@pytest.mark.parametrize(("old", "new"), [("a100-mig-nvidia-docs.txt", "a100-mig-dcgm4-names.txt"),
                                          ("t4-gke-k8s-prof.prom", "t4-gke-dcgm4-names.prom")])
def test_a_page_with_4x_names_reads_like_the_recorded_one(old: str, new: str, tmp_path: Path) -> None:
    """The recorded page and the same page under DCGM 4.x names give the same buckets: no reading lost."""
    assert (DCGM / old).read_text() != (DCGM / new).read_text()
    before, p1 = collect(old, tmp_path)
    after, p2 = collect(new, tmp_path)
    assert p1.total == p2.total == 0
    assert after == before and after
    whole = next(b for b in after if b.gpu_instance == "" and b.gpu == 0)
    if old.startswith("a100"):  # GR_ENGINE_UTIL_RATIO and TENSOR_UTIL_RATIO: the readings once lost
        assert (whole.gr_engine, whole.tensor_active, whole.dram_active) == pytest.approx((0.995630, 0.929260,
                                                                                          0.690789))
    else:
        assert whole.sm_active is not None and whole.sm_occupancy is not None and whole.tensor_active is not None


def exporter_records(path: Path) -> list[list[str]]:
    """A counters file read the way dcgm-exporter reads it (internal/pkg/counters/counter_config.go @ d5e5f51:
    encoding/csv with '#' comments, fields trimmed, exactly 3 per record)."""
    rows = csv.reader(line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#"))
    return [[f.strip(" ") for f in row] for row in rows]


def test_shipped_counters_file_is_one_the_current_exporter_accepts() -> None:
    """Three fields a record, a Prometheus type dcgm-exporter knows (counters/variables.go), and a name its
    go-dcgm resolves (dcgm.GetFieldID): one unknown name makes the exporter refuse the whole file."""
    records = exporter_records(ROOT / "deploy" / "dcgm-counters.csv")
    assert records and all(len(r) == 3 for r in records), [r for r in records if len(r) != 3]
    assert {r[1] for r in records} <= {"gauge", "counter", "histogram", "summary", "label"}
    assert [r[0] for r in records if r[0] not in GO_DCGM] == []
    assert all(r[0] in HEADER for r in records)
    stored = [r[0] for r in records if r[0] in METRIC_ALIASES]
    assert "DCGM_FI_PROF_SM_ACTIVE" in stored and "DCGM_FI_PROF_SM_UTIL_RATIO" not in GO_DCGM


def test_deploy_cycle_counters_adds_the_dcgm_4x_counters(tmp_path: Path) -> None:
    """`gpu-audit deploy dcgm-counters --cycle-counters`: the shipped file plus the two SM cycle counters, as
    counters, in the format dcgm-exporter reads; without the option the file alone."""
    from conftest import run_cli

    from connectors.aliases import CYCLE_COUNTERS

    plain = run_cli("deploy", "dcgm-counters")
    res = run_cli("deploy", "dcgm-counters", "--cycle-counters")
    assert plain.returncode == res.returncode == 0, res.stderr
    assert plain.stdout == (ROOT / "deploy" / "dcgm-counters.csv").read_text() and res.stdout.startswith(plain.stdout)
    (tmp_path / "c.csv").write_text(res.stdout)
    records = exporter_records(tmp_path / "c.csv")
    assert records and all(len(r) == 3 for r in records)
    added = {r[0]: r[1] for r in records[len(exporter_records(ROOT / "deploy" / "dcgm-counters.csv")):]}
    assert added == dict.fromkeys(CYCLE_COUNTERS, "counter") and set(added) <= HEADER
    assert not set(added) & GO_DCGM  # why it is an option: the current exporter's go-dcgm lacks them
