"""The connector protocols: one method each, records out, never the database (client_python style)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from auditor.records import Allocation, GpuBucket, GpuInventory, GpuQuota, GpuWait, NodeEvent, Reservation

log = logging.getLogger("gpu_audit.input")


class Options(BaseModel):
    """Base of every connector's options: unknown keys are config errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


@dataclass(frozen=True, slots=True)
class Window:
    """The half-open time range [since, until) a collection covers, in UTC."""

    since: datetime
    until: datetime
    bucket_seconds: int = 300


@dataclass(frozen=True, slots=True)
class RunningSnapshot:
    """Yielded after a *complete* listing of running work: open allocations of this cluster and source
    that the listing did not contain have ended (pods vanish, Slurm forgets), so the collector closes
    them at their last sighting. A listing filtered to some accounts (namespaces) closes only those."""

    cluster: str
    source: str
    at: datetime
    accounts: tuple[str, ...] = ()  # when the listing covered only these accounts/namespaces
    #: node event kinds the listing read the current state of (Kubernetes: not_ready, cordoned): ongoing
    #: events of these kinds from ``event_source`` not seen in it have ended, at their last sighting
    event_kinds: tuple[str, ...] = ()
    event_source: str = ""


@dataclass
class Problems:
    """Quarantine for bad input: one log line per record naming source and location, counted per source.

    Parsers call :meth:`skip` and carry on, so one bad line never costs the good ones.
    """

    max_kept: int = 1000
    max_logged: int = 20  # per source; the rest are counted and summarised
    counts: Counter[str] = field(default_factory=Counter)
    clamped: Counter[str] = field(default_factory=Counter)
    items: list[tuple[str, str, str, str]] = field(default_factory=list)

    def skip(self, source: str, location: str, reason: str, excerpt: str = "") -> None:
        self.counts[source] += 1
        n = self.counts[source]
        if n <= self.max_logged:
            log.warning("%s:%s: %s (record skipped)", source, location, reason)
        elif n == self.max_logged + 1:
            log.warning("%s: more bad records; further ones are counted, not logged", source)
        if len(self.items) < self.max_kept:
            self.items.append((source, location, reason, excerpt[:200]))

    def clamp(self, source: str, what: str) -> None:
        """Count an out-of-range value that was clamped (e.g. MIG SM activity above 1)."""
        self.clamped[f"{source}:{what}"] += 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())


AllocationRecord = Allocation | Reservation | GpuInventory | GpuWait | GpuQuota | NodeEvent | RunningSnapshot


@runtime_checkable
class AllocationSource(Protocol):
    """Reads who held which GPUs when. Constructed from config; returns records only."""

    Options: ClassVar[type[BaseModel]]
    name: str

    def collect(self, window: Window, problems: Problems) -> Iterable[AllocationRecord]: ...


@runtime_checkable
class TelemetrySource(Protocol):
    """Reads what the GPUs did, as normalised per-GPU buckets aligned to ``window.bucket_seconds`` (and GPU
    faults it saw, as :class:`~auditor.records.NodeEvent`)."""

    Options: ClassVar[type[BaseModel]]
    name: str

    def collect(self, window: Window, problems: Problems) -> Iterable[GpuBucket | NodeEvent]: ...


@dataclass(frozen=True, slots=True)
class Context:
    """What every connector is built with: its cluster name and the directory relative paths start from
    (the config file's directory), so tests can point a connector at checked-in data."""

    cluster: str
    base_dir: Path = Path(".")

    def path(self, p: str | Path) -> Path:
        q = Path(p).expanduser()
        return q if q.is_absolute() else self.base_dir / q
