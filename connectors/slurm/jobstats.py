"""Per-GPU telemetry of *finished* Slurm jobs from what Slurm's accounting keeps: the jobstats summary in
AdminComment, and Slurm's own ``gres/gpuutil`` / ``gres/gpumem`` as a job-level fallback.

Sites that run Princeton's jobstats keep, per finished job, a summary long after Prometheus retention.
Its format, as written by PrincetonUniversity/jobstats (``jobstats.py`` ``Jobstats.report_job_json(encode=
True)`` and ``slurm/ingest_jobstats.py``, which stores ``"JS1:%s" % ...`` into ``admin_comment``)::

    "JS1:" + base64(gzip(json.dumps({"nodes": {NODE: {...}}, "total_time": SECONDS, "gpus": N})))

and ``JS1:Short`` (ran under two sampling periods) or ``JS1:None`` (no data). Per node, ``gpu_utilization``
maps ``minor_number`` (the GPU index, as a string) to the job's mean duty cycle in percent (0-100,
``avg_over_time(nvidia_gpu_duty_cycle)``), ``gpu_used_memory`` / ``gpu_total_memory`` to the peak and total
memory in bytes. jobstats itself decodes it with ``json.loads(gzip.decompress(base64.b64decode(s[4:])))``.

Each summary becomes buckets covering the job's run (clipped to the window): one per GPU per bucket, the
job's mean GPU-Util and peak memory, ``hpc_job`` = the job id, ``samples`` = 1. It is a whole-job mean of
GPU-Util only: low confidence by construction (never SM-verified), and a real per-bucket series of the same
GPU and job (more samples) wins when both are stored.

The fallback, for jobs without a summary: Slurm's ``TRESUsageInAve`` of the job's steps (``gres/gpuutil``,
percent; ``gres/gpumem``, bytes with ``--noconvert``) when the site gathers it (``AcctGatherGpu``-style
NVML accounting). Since Slurm 24.05.1 both are the SUM over the GPUs of a task (SchedMD/slurm
CHANGELOG/slurm-24.05.md, 24.05.1: "gpu/nvml - Fix gpuutil/gpumem only tracking last GPU in step. Now,
gpuutil/gpumem will record sums of all GPUS in the step"; before, the last GPU's alone), so a value is one
GPU's reading only for a one-GPU job, and a sum of 0 says every GPU read 0. A multi-GPU job with a non-zero
sum gets no per-GPU rows from it (which GPU did what is unknown: its GPU time stays unknown, never idle, and
never a copy of the sum on each GPU); the source's notes say which jobs had only the sum. Slurm does not say
which GPU index a step used, so the rows are placed on slots 0..n-1 of each node of the job, labelled with
the job: the audit ties them to the job's count-only GPUs by label (exact GPU indices recorded while the job
ran do not match and stay unknown, never guessed idle).
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from auditor.intparse import INT32_MAX, uint_or_none
from auditor.records import GpuBucket
from connectors.base import Problems, Window
from connectors.slurm.parse import _int, expand_hostlist, parse_state, parse_time, parse_tres, tres_gpus

#: ``sacct`` columns this reader asks for (all jobs and steps: summaries sit on the job line, Slurm's
#: own GPU usage on the step lines). AdminComment last: base64 has no ``|``.
FIELDS = ("JobID", "JobIDRaw", "State", "Start", "End", "NodeList", "AllocTRES", "TRESUsageInAve",
          "AdminComment")
MAX_SUMMARY_BYTES = 4 << 20  # a decompressed summary is a few KB; more is hostile input


class Js1Error(ValueError):
    """An AdminComment that says JS1 but does not decode."""


def decode_js1(text: str | None) -> dict[str, Any] | None:
    """The summary of one AdminComment; None when there is none (not JS1, ``Short``, ``None``).
    Raises :class:`Js1Error` for a JS1 value that is corrupt."""
    if not text or not text.startswith("JS1:"):
        return None
    body = text[4:].strip()
    if body in ("", "Short", "None"):
        return None
    try:
        raw = gzip.decompress(base64.b64decode(body, validate=True))
    except (binascii.Error, OSError, EOFError, zlib.error, ValueError) as exc:
        raise Js1Error(f"JS1 summary does not decode: {exc}") from None
    if len(raw) > MAX_SUMMARY_BYTES:
        raise Js1Error("JS1 summary larger than 4 MiB")
    try:
        doc = json.loads(raw)
    except ValueError:
        raise Js1Error("JS1 summary is not JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), dict):
        raise Js1Error("JS1 summary has no 'nodes' object")
    return doc


def encode_js1(summary: dict[str, Any]) -> str:
    """The inverse, as jobstats writes it (used by tests and the benchmark to build samples)."""
    data = json.dumps(summary, separators=(",", ":")).encode("ascii")
    return "JS1:" + base64.b64encode(gzip.compress(data)).decode("ascii")


def per_gpu(summary: dict[str, Any]) -> Iterator[tuple[str, int, float | None, float | None]]:
    """(node, GPU index, GPU-Util 0-1 or None, peak memory MiB or None) per GPU of a summary."""
    for node, d in summary["nodes"].items():
        if not isinstance(d, dict):
            raise Js1Error(f"JS1 node {node!r} is not an object")
        util, mem = d.get("gpu_utilization") or {}, d.get("gpu_used_memory") or {}
        if not isinstance(util, dict) or not isinstance(mem, dict):
            raise Js1Error(f"JS1 node {node!r}: GPU values are not per-GPU objects")
        for minor in sorted(set(util) | set(mem), key=lambda m: (len(str(m)), str(m))):
            if uint_or_none(minor, hi=INT32_MAX) is None:
                raise Js1Error(f"JS1 node {node!r}: GPU {minor!r} is not an index")
            u, m = util.get(minor), mem.get(minor)
            yield str(node), int(minor), _ratio(u, node, minor), _mib(m, node, minor)


def _num(v: Any, node: str, minor: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or v != v or v < 0 or v == float("inf"):
        raise Js1Error(f"JS1 node {node!r} GPU {minor}: bad value {v!r}")
    return float(v)


def _ratio(v: Any, node: str, minor: str) -> float | None:
    n = _num(v, node, minor)
    if n is not None and n > 100.5:
        raise Js1Error(f"JS1 node {node!r} GPU {minor}: utilization {n} is not a percentage")
    return None if n is None else min(n, 100.0) / 100.0


def _mib(v: Any, node: str, minor: str) -> float | None:
    n = _num(v, node, minor)
    return None if n is None else n / 1048576.0


def spread(cluster: str, job: str, start: datetime, end: datetime, window: Window, bucket_s: int,
           gpus: list[tuple[str, int, float | None, float | None]]) -> Iterator[GpuBucket]:
    """Buckets of ``bucket_s`` covering [start, end) inside the window, one per GPU, carrying the job mean."""
    lo = max(start, window.since).timestamp()
    hi = min(end, window.until).timestamp()
    if hi <= lo:
        return
    first = int(lo) // bucket_s * bucket_s
    gpus = [g for g in gpus if g[2] is not None or g[3] is not None]
    for t in range(first, int(hi) + (0 if hi == int(hi) else 1), bucket_s):
        if t >= hi:
            break
        when = _when(t)
        for node, index, util, mem in gpus:
            yield GpuBucket(cluster, node, index, when, bucket_s, 1, gpu_util=util, fb_used_mib=mem,
                            hpc_job=job)


_WHEN: dict[int, datetime] = {}


def _when(t: int) -> datetime:
    """Bucket starts repeat across jobs: one datetime per instant (a measurable share of a big read)."""
    dt = _WHEN.get(t)
    if dt is None:
        if len(_WHEN) > 200_000:
            _WHEN.clear()
        dt = _WHEN[t] = datetime.fromtimestamp(t, UTC)
    return dt


def tres_usage(tres_text: str | None) -> tuple[float | None, float | None]:
    """(GPU-Util 0-1, memory MiB) from a step's ``TRESUsageInAve`` (``gres/gpuutil=37,gres/gpumem=1024M``)."""
    t = parse_tres(tres_text)
    util = t.get("gres/gpuutil")
    mem = t.get("gres/gpumem")
    u = float(util) / 100.0 if util not in (None, "") else None  # a sum over GPUs may pass 100 %
    m = _int(mem) / 1048576.0 if mem not in (None, "") else None
    return u, m


class JobRows:
    """Groups ``sacct -P`` rows (job line, then its step lines) into one record per job."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}

    def add(self, row: dict[str, str]) -> None:
        job_id = row.get("JobID", "")
        base, dot, _step = job_id.partition(".")
        if not dot:
            self.jobs[base] = {"row": row, "util": None, "mem": None}
            return
        job = self.jobs.get(base)
        if job is None:
            return
        u, m = tres_usage(row.get("TRESUsageInAve"))
        if u is not None:
            job["util"] = u if job["util"] is None else max(job["util"], u)
        if m is not None:
            job["mem"] = m if job["mem"] is None else max(job["mem"], m)


def job_buckets(job: dict[str, Any], cluster: str, window: Window, bucket_s: int, source: str,
                where: str, problems: Problems, counts: dict[str, int]) -> Iterator[GpuBucket]:
    """Buckets of one finished job: its JS1 summary, else Slurm's gres/gpuutil; counted by kind."""
    row = job["row"]
    job_id = row.get("JobID", "")
    start, end = parse_time(row.get("Start")), parse_time(row.get("End"))
    if start is None or end is None or parse_state(row.get("State")) in ("RUNNING", "PENDING"):
        return
    stored = job.get("summary")  # from jobstats' external database (connectors.slurm.jobstats_db), if read
    text = stored if isinstance(stored, str) else row.get("AdminComment")
    try:
        summary = stored if isinstance(stored, dict) else decode_js1(text)
    except Js1Error as exc:
        problems.skip(source, where, str(exc), (text or "")[:80])
        summary = None
    if summary is not None:
        try:
            gpus = list(per_gpu(summary))
        except Js1Error as exc:
            problems.skip(source, where, str(exc))
            gpus = []
        if gpus:
            counts["summaries"] += 1
            yield from spread(cluster, job_id, start, end, window, bucket_s, gpus)
            return
    if job["util"] is None and job["mem"] is None:
        return
    total, _ = tres_gpus(parse_tres(row.get("AllocTRES")))
    nodes = expand_hostlist(row.get("NodeList"))
    if total <= 0 or not nodes:
        return
    each = max(1, total // len(nodes))
    util, mem = (per_gpu_of_sum(job["util"], total, 1.0), per_gpu_of_sum(job["mem"], total, None))
    if util is None and mem is None:
        counts["tres_sum_only"] += 1
        sums = counts.setdefault("sum_examples", [])  # type: ignore[arg-type]
        if len(sums) < 3:
            sums.append(f"job {job_id}: {job['util'] * 100:g} % over {total} GPUs" if job["util"] is not None
                        else f"job {job_id}: {job['mem']:g} MiB over {total} GPUs")
        return
    counts["tres_fallback"] += 1
    yield from spread(cluster, job_id, start, end, window, bucket_s,
                      [(n, k, util, mem) for n in nodes for k in range(each)])


def per_gpu_of_sum(value: float | None, gpus: int, cap: float | None) -> float | None:
    """One GPU's reading from Slurm's sum over a task's GPUs: the value itself on a one-GPU job (capped at
    ``cap``: GPU-Util is at most 100 %), 0 when the sum is 0 (no GPU read more), else None (unknown)."""
    if value is None:
        return None
    if gpus == 1:
        return min(value, cap) if cap is not None else value
    return 0.0 if value == 0 else None
