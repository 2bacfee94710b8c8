"""What one backend read from one cluster, before the connector merges, filters and yields it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from auditor.records import Allocation, GpuInventory, GpuQuota, NodeEvent, Reservation
from connectors.slurm.jobs import HOLDING, PENDING


@dataclass
class Reading:
    """``running``: jobs holding GPUs now (indices when Slurm showed them); ``running_complete``: the listing
    was read whole, so jobs missing from it have ended; ``history``: accounting rows for the window."""

    running: list[Allocation] = field(default_factory=list)
    running_complete: bool = False
    running_at: datetime | None = None  # when the running listing was taken
    #: GPU jobs pending now, from the same listing (GPUs requested, eligible time): the waiting demand
    pending: list[Allocation] = field(default_factory=list)
    history: list[Allocation] = field(default_factory=list)
    #: jobs that have ended but slurmctld still lists (MinJobAge, 300 s by default) with the GPUs they
    #: requested (``tres_per_job`` / ``TresPerNode``; no indices once ended): on a site whose accounting
    #: has no gres/gpu TRES the only GPU count there is of a finished job
    ended: list[Allocation] = field(default_factory=list)
    reservations: list[Reservation] = field(default_factory=list)
    inventory: list[GpuInventory] = field(default_factory=list)
    shards: dict[str, int] = field(default_factory=dict)  # node -> shards per GPU (nodes with gres shard)
    #: AccountingStorageTRES lists gres/gpu (None = could not tell): when False, a finished job on a GPU
    #: node whose accounting row has no GPU count is stored with its GPU count unknown, never dropped
    gpu_accounted: bool | None = None
    quotas: list[GpuQuota] = field(default_factory=list)  # GPU limits of QOS and accounts (cli backend)
    #: nodes drained or down, with their reason (slurmdbd's node events; cli backend)
    events: list[NodeEvent] = field(default_factory=list)
    #: (event source, kinds) when ``events`` is the current state only (slurmrestd's node list): the snapshot
    #: closes ongoing events of these kinds the listing no longer shows
    event_states: tuple[str, tuple[str, ...]] | None = None

    def add_live(self, a: Allocation) -> None:
        """File one job of slurmctld's listing: running (holding GPUs), pending GPU demand, or ended with
        GPUs."""
        if a.state in HOLDING and a.gpus:
            self.running.append(a)
        elif a.state == PENDING:
            if a.gpus_requested > 0:
                self.pending.append(a)
        elif a.gpus and a.end is not None:
            self.ended.append(a)
