"""Slurm allocation source (kind ``slurm``): jobs with their GPUs (indices while they run), advance
reservations, GPU inventory and node events (drained or down, with the reason; cli backend), through the
CLI, slurmrestd or pyslurm. See docs/slurm.md.

Every collect call reads the running jobs (the only moment Slurm shows GPU indices) and the accounting
history of the window, merges them per job, and yields a :class:`RunningSnapshot` only when the running
listing was read whole. Everything is read before the first record is yielded, so a failing command
raises before anything of this cluster is half-written."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from auditor.config import SecretRef
from auditor.records import Allocation
from connectors.base import AllocationRecord, Context, Options, Problems, RunningSnapshot, Window
from connectors.slurm import jobs
from connectors.slurm.parse import expand_hostlist
from connectors.slurm.reading import Reading
from connectors.slurm.waits import waits

log = logging.getLogger("gpu_audit.slurm")


class SlurmOptions(Options):
    backend: Literal["cli", "rest", "pyslurm"] = Field(
        "cli", description="How to read Slurm: `cli` (sacct/scontrol/sacctmgr), `rest` (slurmrestd with "
        "a JWT) or `pyslurm` (the Python bindings, when importable).")
    cluster_name: str | None = Field(
        None, description="Slurm cluster name passed as `-M` to the commands (multi-cluster setups); "
        "unset = the local cluster.")
    sacct: str = Field("sacct", description="Path or name of the sacct binary.")
    squeue: str = Field("squeue", description="Path or name of the squeue binary (used when "
                        "`running_from = \"squeue\"`).")
    running_from: Literal["scontrol", "squeue"] = Field(
        "scontrol", description="cli backend: read running jobs and their GPU indices from "
        "`scontrol -d -o show job` (text, every version) or `squeue --json` (22.05+).")
    scontrol: str = Field("scontrol", description="Path or name of the scontrol binary.")
    sacctmgr: str = Field("sacctmgr", description="Path or name of the sacctmgr binary (reservation "
                          "history and id-to-name mapping; the rest backend too where slurmrestd serves no /slurmdb "
                          "reservations, as 22.05 does not).")
    timeout_s: float = Field(60, gt=0, description="Timeout in seconds for each command or HTTP request.")
    history_format: Literal["auto", "json", "text"] = Field(
        "text", description="cli backend: `text` = `sacct -P` (stable across Slurm versions, ~6x faster and "
        "~10x less memory than JSON for 100,000 jobs), `json` = `sacct --json`, `auto` = JSON and fall back "
        "to text when the JSON is unusable.")
    rest_url: str | None = Field(None, description="slurmrestd base URL, e.g. `http://slurm:6820` "
                                 "(rest backend).")
    rest_user: str = Field("root", description="User name sent as `X-SLURM-USER-NAME` (rest backend).")
    rest_token: SecretRef = Field(default_factory=SecretRef, description="JWT for slurmrestd: "
                                  "`{env = \"SLURM_JWT\"}` or `{file = \"/path\"}`; never the token itself.")
    rest_version: str | None = Field(None, description="OpenAPI version, e.g. `v0.0.42`; unset = the "
                                     "highest known version the server answers.")
    verify_tls: bool = Field(True, description="Verify slurmrestd's TLS certificate.")
    ca_file: Path | None = Field(None, description="CA bundle for slurmrestd's certificate.")
    metrics_url: str | None = Field(None, description="slurmctld's metrics base URL, e.g. "
                                    "`http://slurmctld:6817` (Slurm 25.11+ with `MetricsType=metrics/openmetrics`; "
                                    "GPU gauges from 26.05): after each read, `/metrics/nodes`' "
                                    "`slurm_node_gpus_alloc` is compared per node with the GPUs of the running jobs "
                                    "read, and a difference is said in the collect output. Unset = no cross-check.")


class SlurmAllocations:
    """Allocation source for one Slurm cluster. Read-only: it never cancels, updates or submits."""

    Options = SlurmOptions

    def __init__(self, context: Context, options: SlurmOptions) -> None:
        self.context = context
        self.options = options
        self.name = f"slurm:{options.backend}"
        if options.backend == "cli":
            from connectors.slurm.cli import CliBackend

            self.backend = CliBackend(self)
        elif options.backend == "rest":
            from connectors.slurm.rest import RestBackend

            self.backend = RestBackend(self)
        else:
            from connectors.slurm.pyslurm_backend import PyslurmBackend

            self.backend = PyslurmBackend(self)

    def collect(self, window: Window, problems: Problems) -> Iterator[AllocationRecord]:
        reading = self.backend.read(window, problems)
        self.notes: list[str] = list(getattr(self.backend, "notes", ()))
        if self.options.metrics_url and reading.running_complete:
            from connectors.slurm.ctld_metrics import cross_check

            verify = str(self.options.ca_file) if self.options.ca_file and self.options.verify_tls else \
                self.options.verify_tls
            note = cross_check(self.options.metrics_url, reading.running, self.options.timeout_s, verify)
            if note:
                log.warning("%s: %s", self.context.cluster, note)
                self.notes.append(note)
        yield from assemble(reading, window, self.context.cluster, notes=self.notes)


def assemble(reading: Reading, window: Window, cluster: str, now: datetime | None = None,
             notes: list[str] | None = None) -> Iterator[AllocationRecord]:
    """Merge running and history views per job, keep jobs that held GPUs in the window, then reservations,
    inventory and, when the running listing was whole, the snapshot that lets the store close the rest.
    What was kept in a lesser form (GPU count from slurmctld, or unknown) is said in ``notes``."""
    notes = [] if notes is None else notes
    running = {a.external_id: a for a in reading.running}
    # a reused job id: history may hold an earlier job of the same id (different submit time)
    merged: dict[tuple[str, Any], Allocation] = {}
    for h in reading.history:
        r = running.get(h.external_id)
        if r is not None and _same_job(h, r):
            merged[(h.external_id, h.submit or h.start)] = jobs.merge(h, running.pop(h.external_id))
        elif h.end is None and reading.running_complete:
            # accounting says running, slurmctld's whole listing does not: it ended between the two reads
            # (the next read brings its end) or is a runaway record; never re-open what the snapshot closes
            continue
        else:
            merged[(h.external_id, h.submit or h.start)] = h
    merged.update(((a.external_id, a.submit or a.start), a) for a in running.values())
    from_ctld, gpu_accounted = _ended_counts(reading, merged)
    yield from waits(merged.values(), reading.pending, window)
    gpu_nodes = {g.host for g in reading.inventory}
    cpu_only = unknown = 0
    for a in merged.values():
        if reading.shards and any(g.mig_profile == jobs.SHARD for g in a.gpus):
            a.gpus = [replace(g, share=1.0 / reading.shards[g.node])
                      if g.mig_profile == jobs.SHARD and g.node in reading.shards else g for g in a.gpus]
        if a.start is None or a.start >= window.until or (a.end is not None and a.end < window.since):
            continue
        if not a.gpus:
            if gpu_accounted is False and gpu_nodes & set(expand_hostlist(a.labels.get("nodes"))):
                # AccountingStorageTRES lacks gres/gpu: the row cannot say; keep the job, count unknown
                # (GPUs recorded while it ran stay in the store: an empty GPU list never deletes them)
                a.labels["gpu_count"] = "unknown"
                a.labels["gpu_placement"] = "unknown-count"
                unknown += 1
                yield a
            else:
                cpu_only += 1
            continue
        yield a
    if cpu_only or unknown:
        log.info("%s: %d CPU-only jobs skipped; %d jobs on GPU nodes stored with GPU count unknown "
                 "(AccountingStorageTRES lacks gres/gpu)", cluster, cpu_only, unknown)
    if unknown:
        log.warning("%s: %d finished jobs on GPU nodes have no GPU count in Slurm accounting "
                    "(add gres/gpu to AccountingStorageTRES); stored with GPU count unknown", cluster, unknown)
        notes.append(f"{unknown} finished jobs on GPU nodes have no GPU count in Slurm accounting (add gres/gpu "
                     "to AccountingStorageTRES): stored with GPU count unknown, their GPU time unknown")
    if from_ctld:
        log.warning("%s: %d finished jobs have no GPU count in Slurm accounting (add gres/gpu to "
                    "AccountingStorageTRES); kept with the GPU count slurmctld still lists, indices unknown",
                    cluster, from_ctld)
        notes.append(f"{from_ctld} finished jobs have no GPU count in Slurm accounting (add gres/gpu to "
                     "AccountingStorageTRES): kept with the GPU count slurmctld still lists, GPU indices unknown, "
                     "so their GPU time is unknown, never idle")
    yield from reading.reservations
    yield from reading.inventory
    yield from reading.quotas
    yield from reading.events
    if reading.running_complete:
        at = reading.running_at or now or datetime.now(UTC)
        src, kinds = reading.event_states or ("", ())
        yield RunningSnapshot(cluster=cluster, source="slurm", at=at, event_kinds=kinds, event_source=src)


def _ended_counts(reading: Reading, merged: dict[tuple[str, Any], Allocation]) -> tuple[int, bool | None]:
    """Finished jobs whose accounting row has no GPUs but that slurmctld still lists with a GPU request
    take that count (indices unknown: its time is unknown, never idle); one slurmctld lists that accounting
    has not yet is kept as slurmctld has it. Returns how many took it, and whether accounting records GPUs
    (False once such a job shows it does not)."""
    accounted = reading.gpu_accounted
    by_id: dict[str, list[Allocation]] = {}
    for h in merged.values():
        by_id.setdefault(h.external_id, []).append(h)
    n = 0
    for e in reading.ended:
        if not e.labels.get("nodes"):  # cancelled while pending: slurmctld lists its request, it never ran
            continue
        same = [h for h in by_id.get(e.external_id, []) if _same_job(h, e) and h.start is not None]
        if not same:
            if not by_id.get(e.external_id):
                merged[(e.external_id, e.submit or e.start)] = e
            continue
        for h in same:
            if h.gpus:
                continue
            h.gpus = list(e.gpus)
            h.gpus_requested = h.gpus_requested or e.gpus_requested
            h.labels["gpu_placement"] = e.labels.get("gpu_placement", "")
            h.labels["gpu_count_from"] = "slurmctld"
            n += 1
            if accounted is None:
                accounted = False  # slurmctld says GPUs, accounting none: it does not record gres/gpu
    return n, accounted


def _same_job(history: Allocation, running: Allocation) -> bool:
    """The ledger's rule (auditor.store.ingest): submit times decide, else start times, else the same id."""
    if history.submit and running.submit:
        return history.submit == running.submit
    if history.start and running.start:
        return history.start == running.start
    return True


ALLOCATIONS = SlurmAllocations

__all__ = ["ALLOCATIONS", "SlurmAllocations", "SlurmOptions", "assemble"]
