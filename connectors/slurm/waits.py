"""GPU jobs that waited, from the jobs Slurm listed (docs/definitions.md "Opportunity cost"): a job waits
from ``Eligible`` (it could have started) until it starts, or leaves the queue without starting. A pending
job's wait is open (end None): the store ends it at its last sighting."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from auditor.records import Allocation, GpuWait
from connectors.base import Window
from connectors.slurm.jobs import PENDING


def wait_of(a: Allocation) -> GpuWait | None:
    """The wait of one job, or None: no eligible time, no GPUs asked for, or it started when eligible."""
    gpus = a.gpus_requested or a.gpu_count
    if a.eligible is None or gpus <= 0:
        return None
    if a.state == PENDING:
        end = None
    else:
        end = a.start or a.end  # started, or cancelled while pending (no start)
        if end is None or end <= a.eligible:
            return None
    return GpuWait(cluster=a.cluster, source="slurm", external_id=a.external_id, gpus=gpus,
                   eligible=a.eligible, end=end, submit=a.submit, name=a.name, user=a.user, account=a.account,
                   partition=a.partition, qos=a.qos, state=a.state)


def waits(jobs: Iterable[Allocation], pending: Iterable[Allocation], window: Window) -> Iterator[GpuWait]:
    """Waits overlapping the window, one per job: accounting rows (``jobs``) with what slurmctld's pending
    listing knows better filled in (GPUs requested where accounting does not track gres/gpu)."""
    live = {a.external_id: a for a in pending}
    for a in jobs:
        p = live.pop(a.external_id, None)
        if p is not None and a.state == PENDING:
            a.gpus_requested = a.gpus_requested or p.gpus_requested
            a.eligible = a.eligible or p.eligible
        if (w := wait_of(a)) is not None and _overlaps(w, window):
            yield w
    for p in live.values():
        if (w := wait_of(p)) is not None and _overlaps(w, window):
            yield w


def _overlaps(w: GpuWait, window: Window) -> bool:
    return w.eligible < window.until and (w.end is None or w.end > window.since)
