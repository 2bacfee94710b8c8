"""Telemetry source kind ``jobstats``: per-GPU usage of finished Slurm jobs from Slurm accounting (the
jobstats ``JS1:`` summary in AdminComment, or in jobstats' external MariaDB store when ``db_host`` is set,
else Slurm's own ``gres/gpuutil``), read with ``sacct`` or from saved ``sacct -P`` files. The format and its
caveats are in :mod:`connectors.slurm.jobstats`, the database in :mod:`connectors.slurm.jobstats_db`."""

from __future__ import annotations

import glob
import logging
from collections import Counter
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path
from typing import Literal

from pydantic import Field

from auditor.config import SecretRef
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
            "the steps' TRESUsageInAve (job level, placed on GPU slots 0..n-1 of each node; a sum over the "
            "task's GPUs since 24.05.1, so stored per GPU only for one-GPU jobs or a sum of 0), `none` = skip.")
        db_host: str | None = Field(None, description="Host of jobstats' external MariaDB/MySQL store "
                                    "(`EXTERNAL_DB_CONFIG` in jobstats' config.py): summaries are read from its "
                                    "`job_summary` table by cluster and JobIDRaw instead of AdminComment; the jobs "
                                    "still come from sacct or `paths`. Needs `pip install gpu-audit[jobstats-db]`. "
                                    "Unset = AdminComment.")
        db_port: int = Field(3306, ge=1, le=65535, description="Port of jobstats' database.")
        db_name: str = Field("jobstats", description="Database name of jobstats' store.")
        db_user: str = Field("jobstats", description="User for jobstats' database (SELECT on its three tables "
                             "is all it needs).")
        db_password: SecretRef = Field(default_factory=SecretRef, description="Password for jobstats' database: "
                                       "`{env = \"JOBSTATS_DB_PASSWORD\"}` or `{file = \"/path\"}`; unset = none.")
        db_cluster: str | None = Field(None, description="The `cluster` value jobstats writes in `job_summary` "
                                       "(its Slurm cluster name); unset = `cluster_name`, else this cluster's name.")
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
        self.counts = Counter(summaries=0, tres_fallback=0, tres_sum_only=0, jobs=0)
        self.notes: list[str] = []
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
            if self.options.db_host:
                self._from_db(grouped)
            for job in grouped.jobs.values():
                self.counts["jobs"] += 1
                if self.options.fallback == "none":
                    job["util"] = job["mem"] = None
                yield from js.job_buckets(job, self.context.cluster, window, bucket_s, source,
                                          f"job {job['row'].get('JobID', '')}", problems, self.counts)
        log.info("jobstats: %d jobs, %d summaries, %d from Slurm's gres/gpuutil", self.counts["jobs"],
                 self.counts["summaries"], self.counts["tres_fallback"])
        if self.counts["tres_sum_only"]:
            self.notes.append(f"{self.counts['tres_sum_only']} multi-GPU jobs have only Slurm's gres/gpuutil or "
                              "gres/gpumem, a sum over each task's GPUs (Slurm 24.05.1+), not per-GPU readings ("
                              f"{'; '.join(self.counts['sum_examples'])}): no per-GPU use stored for them, their "  # type: ignore[arg-type]
                              "GPU time stays unknown, never idle")
        if self.counts["jobs"] and not self.counts["summaries"] and not self.counts["tres_fallback"]:
            self.empty_reason = (f"{self.counts['jobs']} finished jobs but none with a JS1 summary in "
                                 "AdminComment or gres/gpuutil in TRESUsageInAve")


    def _from_db(self, grouped: js.JobRows) -> None:
        """Each job's summary from jobstats' external store, by (cluster, JobIDRaw)."""
        from connectors.slurm import jobstats_db

        o = self.options
        raw = {}
        for job in grouped.jobs.values():
            jid = (job["row"].get("JobIDRaw") or job["row"].get("JobID") or "").strip()
            if jid.isascii() and jid.isdigit():
                raw[int(jid)] = job
        if not raw:
            return
        cluster = o.db_cluster or o.cluster_name or self.context.cluster
        conn = jobstats_db.connect(o.db_host or "", o.db_port, o.db_user, o.db_password.resolve("jobstats.db_password"),
                                   o.db_name, o.timeout_s)
        try:
            found = jobstats_db.summaries(conn, cluster, raw)
        finally:
            conn.close()
        for jid, summary in found.items():
            raw[jid]["summary"] = summary
        self.counts["db_summaries"] += len(found)


def _has_header(text: str) -> bool:
    for line in text.splitlines():
        if line.startswith("$ ") or not line.strip():
            continue
        cols = line.split("|")
        return "JobID" in cols and "Start" in cols and "End" in cols and (
            "AdminComment" in cols or "TRESUsageInAve" in cols)
    return False


TELEMETRY = JobstatsTelemetry
