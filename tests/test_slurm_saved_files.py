"""Saved Slurm outputs as allocation files (file connector, format auto/scontrol/slurm-json): the real
captures in fixtures/slurm read through the file connector give the same jobs and GPU indices as the
Slurm parsers on the same captures (README §7.2: job 23 holds IDX 0-2 on gpu-node-01, 1-3 on gpu-node-02)."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from auditor.errors import SourceError
from auditor.records import Allocation
from connectors import build
from connectors.base import Context, Problems, Window

FX = Path(__file__).parent / "fixtures" / "slurm"
EVER = Window(datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC))


def read(tmp: Path, rel: str, name: str, fmt: str = "auto") -> tuple[dict[str, Allocation], Problems]:
    shutil.copy(FX / rel, tmp / name)
    src = build("file", "allocations", {"paths": [name], "format": fmt}, Context("auditlab", tmp))
    problems = Problems()
    out = [r for r in src.collect(EVER, problems) if isinstance(r, Allocation)]
    return {a.external_id: a for a in out}, problems


def idx(a: Allocation) -> dict[str, list[int | None]]:
    out: dict[str, list[int | None]] = {}
    for g in a.gpus:
        out.setdefault(g.node, []).append(g.index)
    return out


@pytest.mark.parametrize(("rel", "name"), [
    ("22.05/2node/running/scontrol-show-job-d.txt", "jobs.txt"),          # blocks
    ("22.05/2node/running/scontrol-show-job-oneliner.txt", "jobs-o.txt"),  # -o
    ("22.05/2node/running/squeue.json", "squeue.json"),
    ("22.05/2node/rest/slurm_v0.0.38_jobs.json", "rest.json"),
])
def test_running_views_keep_indices(tmp_path: Path, rel: str, name: str) -> None:
    jobs, problems = read(tmp_path, rel, name)
    assert problems.total == 0
    assert idx(jobs["23"]) == {"gpu-node-01": [0, 1, 2], "gpu-node-02": [1, 2, 3]}
    assert jobs["23"].user == "alice" and jobs["23"].end is None


def test_accounting_json_and_explicit_format(tmp_path: Path) -> None:
    jobs, problems = read(tmp_path, "22.05/2node/running/sacct.json", "sacct.json")
    assert problems.total == 0 and len(jobs["23"].gpus) == 6  # counts only: slurmdbd keeps no indices
    assert {a.labels["gpu_placement"] for a in jobs.values()} <= {"node", "even-split", "unknown-node"}
    forced, _ = read(tmp_path, "22.05/2node/running/scontrol-show-job-oneliner.txt", "odd.name", "scontrol")
    assert idx(forced["23"]) == {"gpu-node-01": [0, 1, 2], "gpu-node-02": [1, 2, 3]}


def test_slurmrestd_2511_gpu_jobs(tmp_path: Path) -> None:
    # slurm-job-gpus-multi-nodes.json: one job over gpu[1-2] (PROVENANCE.md), GPUs from tres_per_x
    jobs, problems = read(tmp_path, "slurmrestd-25.11/slurm-job-gpus-multi-nodes.json", "multi.json")
    assert problems.total == 0 and len(jobs) == 1
    (a,) = jobs.values()
    assert {g.node for g in a.gpus} == {"gpu1", "gpu2"}


def test_not_a_jobs_document_is_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text('{"jobs": 5}')
    src = build("file", "allocations", {"paths": ["x.json"], "format": "slurm-json"}, Context("c", tmp_path))
    with pytest.raises(SourceError, match="not a Slurm jobs document"):
        list(src.collect(EVER, Problems()))
