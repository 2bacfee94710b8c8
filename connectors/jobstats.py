"""Telemetry source kind ``jobstats``: per-GPU usage of finished Slurm jobs from Slurm accounting (the
jobstats ``JS1:`` summary in AdminComment, else Slurm's own ``gres/gpuutil``), read with ``sacct`` or from
saved ``sacct -P`` files. The format and its caveats are in :mod:`connectors.slurm.jobstats`."""

from __future__ import annotations

import glob
import logging
from collections import Counter
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path
from typing import Literal

from pydantic import Field

from auditor.errors import SourceError
from auditor.records import GpuBucket
from connectors.base import Context, Options, Problems, Window
from connectors.slurm import jobstats as js
from connectors.slurm.jobs import sacct_rows

log = logging.getLogger("gpu_audit.jobstats")


class JobstatsTelemetry:
    """Per-GPU buckets of finished jobs from their jobstats summaries (see module docstring)."""

    class Options(Options):
        paths: list[str] = Field(default_factory=list, description="Saved `sacct -P` outputs (header "
                                 "line first, with JobID, Start, End, NodeList, AdminComment and, for the "
                                 "fallback, AllocTRES and TRESUsageInAve) or glob patterns; unset = run "
                                 "`sacct`.")
        sacct: str = Field("sacct", description="Path or name of the sacct binary (when `paths` is unset).")
        cluster_name: str | None = Field(None, description="Slurm cluster name passed as `-M`.")
        timeout_s: float = Field(120, gt=0, description="Timeout of the sacct call in seconds.")
        fallback: Literal["tres", "none"] = Field(
            "tres", description="Jobs without a summary: `tres` = Slurm's `gres/gpuutil`/`gres/gpumem` from "
            "the steps' TRESUsageInAve (job level, placed on GPU slots 0..n-1 of each node), `none` = skip.")
        bucket_seconds: int | None = Field(None, ge=60, le=3600, description="Width of the buckets a "
                                           "summary is spread over; unset = the collect's bucket (300 s). "
                                           "3600 (the roll-up width, the widest the audit reads) stores 12x "
                                           "fewer rows for the same whole-job mean.")

    name = "jobstats"

    def __init__(self, context: Context, options: JobstatsTelemetry.Options) -> None:
        self.context, self.options = context, options
        self.counts: Counter[str] = Counter()

    def texts(self, window: Window) -> Iterator[tuple[str, str]]:
        """(source name, sacct -P text) per file, or one sacct call over the window."""
        if self.options.paths:
            for pattern in self.options.paths:
                p = self.context.path(pattern)
                matches = sorted(Path(m) for m in glob.glob(str(p))) if glob.has_magic(str(p)) else [p]
                if not matches:
                    raise SourceError(self.name, f"no file matches {pattern}")
                for path in matches:
                    try:
                        yield str(path), path.read_text(encoding="utf-8", errors="replace")
                    except OSError as exc:
                        raise SourceError(self.name, f"cannot read {path}: {exc.strerror}") from None
            return
        from connectors.slurm import SlurmAllocations, SlurmOptions
        from connectors.slurm.cli import CliBackend

        owner = SlurmAllocations(self.context, SlurmOptions(sacct=self.options.sacct,
                                                            cluster_name=self.options.cluster_name,
                                                            timeout_s=self.options.timeout_s))
        fmt = "%Y-%m-%dT%H:%M:%S"
        args = ["-a", "-P", "--noconvert", "-s", "CD,CA,F,TO,NF,OOM,PR,DL,BF",
                "-S", window.since.astimezone(UTC).strftime(fmt), "-E", window.until.astimezone(UTC).strftime(fmt),
                "-o", ",".join(js.FIELDS)]
        if self.options.cluster_name:
            args = ["-M", self.options.cluster_name, *args]
        yield "jobstats:sacct", CliBackend(owner).run(self.options.sacct, *args)

    def collect(self, window: Window, problems: Problems) -> Iterator[GpuBucket]:
        bucket_s = self.options.bucket_seconds or window.bucket_seconds
        self.counts = Counter(summaries=0, tres_fallback=0, jobs=0)
        for source, text in self.texts(window):
            if text.strip() and not _has_header(text):
                raise SourceError(self.name, f"{source}: no header line naming {', '.join(js.FIELDS)} "
                                  "(JobID, Start, End and AdminComment or TRESUsageInAve at least; save "
                                  "`sacct -P` with its header)")
            grouped = js.JobRows()
            for lineno, row in sacct_rows(text):
                if isinstance(row, str):
                    problems.skip(source, f"line {lineno}", "wrong number of columns", row)
                    continue
                grouped.add(row)
            for job in grouped.jobs.values():
                self.counts["jobs"] += 1
                if self.options.fallback == "none":
                    job["util"] = job["mem"] = None
                yield from js.job_buckets(job, self.context.cluster, window, bucket_s, source,
                                          f"job {job['row'].get('JobID', '')}", problems, self.counts)
        log.info("jobstats: %d jobs, %d summaries, %d from Slurm's gres/gpuutil", self.counts["jobs"],
                 self.counts["summaries"], self.counts["tres_fallback"])
        if self.counts["jobs"] and not self.counts["summaries"] and not self.counts["tres_fallback"]:
            self.empty_reason = (f"{self.counts['jobs']} finished jobs but none with a JS1 summary in "
                                 "AdminComment or gres/gpuutil in TRESUsageInAve")


def _has_header(text: str) -> bool:
    for line in text.splitlines():
        if line.startswith("$ ") or not line.strip():
            continue
        cols = line.split("|")
        return "JobID" in cols and "Start" in cols and "End" in cols and (
            "AdminComment" in cols or "TRESUsageInAve" in cols)
    return False


TELEMETRY = JobstatsTelemetry
