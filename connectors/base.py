"""The connector protocols: one method each, records out, never the database (client_python style).

The types a connector is handed (:class:`Window`, :class:`Context`, :class:`Problems`, the :class:`Options`
base) live in the bottom layer, :mod:`auditor.contract`, so the core needs no connector; they are imported
here too because a connector is written against this module.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel

from auditor.contract import Context, Options, Problems, Window
from auditor.records import (
    Allocation,
    GpuBucket,
    GpuInventory,
    GpuQuota,
    GpuWait,
    KubeJob,
    NodeEvent,
    Reservation,
    RunningSnapshot,
)

__all__ = ["AllocationRecord", "AllocationSource", "Context", "Options", "Problems", "RunningSnapshot",
           "TelemetrySource", "Window"]

AllocationRecord = (Allocation | Reservation | GpuInventory | GpuWait | GpuQuota | NodeEvent | KubeJob
                    | RunningSnapshot)


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
