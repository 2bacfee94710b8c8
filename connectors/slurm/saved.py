"""Saved Slurm command outputs as allocation files, so a site can send what it has: ``scontrol show job -d``
text (one-line ``-o`` or blocks), and ``squeue --json`` / ``sacct --json`` / slurmrestd ``/slurm/vX/jobs``
and ``/slurmdb/vX/jobs`` JSON. Parsed by the same functions as the live backends; the file connector only
dispatches here (formats ``scontrol`` and ``slurm-json``, or ``auto``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from auditor.errors import SourceError
from auditor.records import Allocation
from connectors.base import Problems
from connectors.slurm import jobs
from connectors.slurm.parse import scontrol_records

log = logging.getLogger("gpu_audit.slurm")
MAX_BYTES = 512 << 20


def sniff(path: Path) -> str | None:
    """``scontrol`` or ``slurm-json`` when the file's start looks like one, else None."""
    try:
        with path.open("rb") as fh:
            head = fh.read(4096).decode("utf-8", "replace")
    except OSError:
        return None
    lines = [ln for ln in head.splitlines() if ln.strip() and not ln.startswith("$ ")]
    first = lines[0].lstrip() if lines else ""
    if first.startswith("JobId="):
        return "scontrol"
    if first.startswith("{") and '"jobs"' in head:
        return "slurm-json"
    return None


def _text(path: Path) -> str:
    try:
        if path.stat().st_size > MAX_BYTES:
            raise SourceError(str(path), f"larger than {MAX_BYTES >> 20} MiB")
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise SourceError(str(path), f"cannot read: {exc.strerror}") from None


def read_saved(path: Path, fmt: str, cluster: str, problems: Problems) -> Iterator[tuple[str, Allocation]]:
    """(location, allocation) for every job of the file that held GPUs; CPU-only jobs are counted."""
    text = _text(path)
    cpu_only = 0
    if fmt == "scontrol":
        items: Iterator[tuple[str, Any]] = ((f"record {i}", r) for i, r in enumerate(scontrol_records(text), 1)
                                            if not r.startswith("No jobs"))
    else:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SourceError(str(path), f"invalid JSON at line {exc.lineno}: {exc.msg}") from None
        except RecursionError:
            raise SourceError(str(path), "JSON nested too deeply") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
            raise SourceError(str(path), "not a Slurm jobs document (expected an object with a \"jobs\" list: "
                              "squeue --json, sacct --json or slurmrestd /jobs)")
        items = ((f"job {i}", j) for i, j in enumerate(doc["jobs"], 1))
    for loc, item in items:
        try:
            if isinstance(item, str):
                a = jobs.from_scontrol_job(item, cluster)
            elif not isinstance(item, dict):
                raise ValueError("job is not an object")
            elif isinstance(item.get("time"), dict):  # slurmdbd shape: sacct --json, /slurmdb/vX/jobs
                a = jobs.from_json_db_job(item, cluster)
            else:  # slurmctld shape: squeue --json, /slurm/vX/jobs
                a = jobs.from_json_job(item, cluster)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            problems.skip(str(path), loc, str(exc).strip("'") or type(exc).__name__,
                          item if isinstance(item, str) else json.dumps(item, default=str)[:200])
            continue
        if not a.gpus:
            cpu_only += 1
            continue
        yield loc, a
    if cpu_only:
        log.info("%s: %d jobs without GPUs skipped", path, cpu_only)
