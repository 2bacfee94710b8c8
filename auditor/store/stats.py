"""What one ingest wrote, counted per record kind."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class IngestStats:
    allocations: int = 0
    allocated_gpus: int = 0
    reservations: int = 0
    inventory: int = 0
    buckets: int = 0
    closed: int = 0
    waits: int = 0  # GPU jobs that waited (gpu_waits rows)
    quotas: int = 0  # GPU quotas (gpu_quotas rows)
    events: int = 0  # node events (infrastructure: faults, drained/down/NotReady/cordoned nodes)
    inference: int = 0  # inference-server buckets (inference_buckets rows)
    nodes: int = 0  # host telemetry buckets (node_buckets rows)
    ports: int = 0  # InfiniBand port buckets (ib_port_buckets rows)
    jobs: int = 0  # Kubernetes Jobs with GPU pods (kube_jobs rows)
    quarantined: int = 0  # records refused at ingest (non-finite or absurd shares/GPU counts)

    def add(self, other: IngestStats) -> None:
        for k in vars(self):
            setattr(self, k, getattr(self, k) + getattr(other, k))
