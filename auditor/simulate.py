"""A simulated GPU fleet at any scale, for benchmarks and load tests (``python -m bench``).

The fleet is N GPUs in nodes of 8, grouped in blocks of 8 nodes (64 GPUs). Each block is scheduled on its
own from a seed derived from (seed, block), so generation streams block by block with bounded memory and
the same seed always yields the same records. Blocks are one of:

- ``multi``: multi-node Slurm jobs of 16, 32 or 64 GPUs (2-8 whole nodes), hours to days long;
- ``mixed``: Slurm nodes split into lanes of 8, 4, 2 or 1 GPUs running back-to-back jobs of matching size;
- ``k8s``: Kubernetes pods of 1-4 GPUs whose GPU indices are unknown (attributed through telemetry labels).

Every job gets a behaviour drawn from a realistic mix and rendered with the demo's profiles
(:mod:`auditor.demo`): working, inference (daily cycle), low efficiency, held idle, mirage (a kernel spinning:
GPU-Util busy, SM activity idle), partial idle (one GPU of several works) and an idle episode inside a
working job. Unallocated time is FREE; a few nodes lose telemetry for some hours (unknown, never idle).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from auditor.demo import FREE, HELD_IDLE, INFERENCE, SPIN, WORKING, Profile
from auditor.records import AllocatedGpu, Allocation, GpuBucket, GpuInventory, Record

NODE_GPUS = 8
BLOCK_NODES = 8
LOW = Profile(sm=0.18, util=0.9, tensor=0.05, dram=0.12, fb=24000, power=230)
#: Behaviour mix of jobs: (name, weight). "partial" needs at least 2 GPUs (else it is "working").
BEHAVIOURS = (("working", 0.52), ("inference", 0.06), ("low", 0.08), ("idle", 0.12), ("mirage", 0.06),
              ("partial", 0.10), ("episode", 0.06))
#: Block kinds and their share of the fleet.
BLOCK_KINDS = (("multi", 0.25), ("mixed", 0.62), ("k8s", 0.13))
#: Lane layouts (GPUs per lane) of one node, per block kind.
NODE_LAYOUTS = {"mixed": ([8], [4, 4], [4, 2, 1, 1], [2, 2, 2, 2], [1] * 8, [2, 2, 1, 1, 1, 1]),
                "k8s": ([1] * 8, [2, 2, 1, 1, 1, 1], [4, 2, 2], [1, 1, 1, 1, 4])}
#: Multi-node groupings of a block's 8 nodes.
MULTI_LAYOUTS = ([8], [4, 4], [4, 2, 2], [2, 2, 2, 2])
#: Mean job length in hours by lane size (lognormal around it); multi-node lanes use the 16+ entry.
MEAN_HOURS = {1: 2.2, 2: 4.0, 4: 8.0, 8: 14.0, 16: 24.0}
GAP_MEAN_H = 0.6  # mean unallocated time between two jobs of a lane
EPOCH = datetime(2026, 11, 2, tzinfo=UTC)  # a Monday; fixed so a seed always means the same store


@dataclass(frozen=True)
class FleetSpec:
    """What to simulate. ``start`` defaults to a fixed Monday so cached benchmark stores stay valid."""

    gpus: int = 1024
    days: float = 7
    bucket_s: int = 300
    seed: int = 1
    cluster: str = "sim"
    start: datetime = EPOCH
    model: str = "h100"
    #: clusters the blocks are split into, in contiguous runs of blocks (``<cluster>-00`` ...); 1: all in ``cluster``
    clusters: int = 1

    @property
    def end(self) -> datetime:
        return self.start + timedelta(days=self.days)

    @property
    def nodes(self) -> int:
        return -(-self.gpus // NODE_GPUS)

    @property
    def buckets_per_gpu(self) -> int:
        return int(self.days * 86400) // self.bucket_s

    @property
    def blocks(self) -> int:
        return -(-self.nodes // BLOCK_NODES)

    def cluster_of(self, block: int) -> str:
        """The cluster of a block: contiguous runs of blocks per cluster (per-cluster audits are disjoint)."""
        if self.clusters <= 1:
            return self.cluster
        return f"{self.cluster}-{block * self.clusters // self.blocks:02d}"

    def key(self) -> str:
        """A file-name-safe identity of the generated data (for caches)."""
        return f"g{self.gpus}-d{self.days:g}-b{self.bucket_s}-s{self.seed}" + (
            f"-c{self.clusters}" if self.clusters > 1 else "")


@dataclass(slots=True)
class Job:
    """One simulated allocation: which GPUs, when, and how each GPU behaves."""

    ext_id: str
    source: str
    start: int
    end: int
    gpus: list[tuple[str, int]]
    behaviour: str
    profile: Profile
    per_gpu: dict[tuple[str, int], Profile] = field(default_factory=dict)
    episode: tuple[int, int] | None = None  # idle span inside a working job
    user: str = ""
    account: str = ""

    def profile_at(self, gpu: tuple[str, int], ts: int) -> Profile:
        if self.episode and self.episode[0] <= ts < self.episode[1]:
            return HELD_IDLE
        return self.per_gpu.get(gpu, self.profile)


def host_name(node: int) -> str:
    return f"sim-node-{node:05d}"


def _pick(rng: random.Random, table: tuple[tuple[str, float], ...]) -> str:
    return rng.choices([k for k, _ in table], weights=[w for _, w in table])[0]


def _lane_times(rng: random.Random, t0: int, t1: int, size: int) -> Iterator[tuple[int, int]]:
    """Back-to-back jobs of one lane with gaps; the first may have started before the window."""
    mean_h = MEAN_HOURS[min(size, 16)]
    t = t0 - int(rng.uniform(0, mean_h) * 3600)
    while t < t1:
        t += int(rng.expovariate(1 / GAP_MEAN_H) * 3600)
        dur = int(min(rng.lognormvariate(0, 0.8) * mean_h, 6 * mean_h) * 3600) + 600
        if t + dur > t0 and t < t1:
            yield t, t + dur
        t += dur


def _behave(rng: random.Random, job: Job) -> None:
    kind = _pick(rng, BEHAVIOURS)
    if kind == "partial" and len(job.gpus) < 2:
        kind = "working"
    job.behaviour = kind
    job.profile = {"working": WORKING, "inference": INFERENCE, "low": LOW, "idle": HELD_IDLE,
                   "mirage": SPIN, "partial": HELD_IDLE, "episode": WORKING}[kind]
    if kind == "partial":
        busy = max(1, len(job.gpus) // 8)
        job.per_gpu = {g: WORKING for g in job.gpus[:busy]}
    elif kind == "episode" and job.end - job.start > 6 * 3600:
        s = rng.randint(job.start + 3600, job.end - 4 * 3600)
        job.episode = (s, s + rng.randint(2 * 3600 + 600, 3 * 3600 + 1800))


def block_jobs(spec: FleetSpec, block: int) -> tuple[str, list[int], list[Job]]:
    """The kind, nodes and jobs of one block (deterministic from seed and block number)."""
    rng = random.Random(f"{spec.seed}:{block}")
    first = block * BLOCK_NODES
    nodes = list(range(first, min(first + BLOCK_NODES, spec.nodes)))
    kind = _pick(rng, BLOCK_KINDS)
    if kind == "multi" and len(nodes) < 2:
        kind = "mixed"
    t0, t1 = int(spec.start.timestamp()), int(spec.end.timestamp())
    lanes: list[list[tuple[str, int]]] = []
    if kind == "multi":
        layout = rng.choice([lay for lay in MULTI_LAYOUTS if sum(lay) <= len(nodes)] or [[len(nodes)]])
        at = 0
        for n in layout:
            lanes.append([(host_name(x), g) for x in nodes[at:at + n] for g in range(NODE_GPUS)])
            at += n
        lanes += [[(host_name(x), g) for g in range(NODE_GPUS)] for x in nodes[at:]]
    else:
        for x in nodes:
            at = 0
            for n in rng.choice(NODE_LAYOUTS[kind]):
                lanes.append([(host_name(x), g) for g in range(at, at + n)])
                at += n
    lanes = [[(h, g) for h, g in lane if _gpu_no(h, g) < spec.gpus] for lane in lanes]
    jobs: list[Job] = []
    source = "kubernetes" if kind == "k8s" else "slurm"
    for lane in filter(None, lanes):
        for s, e in _lane_times(rng, t0, t1, len(lane)):
            n = len(jobs)
            ext = f"{block:05d}{n:04d}" if source == "slurm" else f"pod-{spec.seed}-{block}-{n}"
            job = Job(ext, source, s, e, lane, "working", WORKING, user=f"user{rng.randrange(600):03d}",
                      account=f"team-{rng.randrange(48):02d}")
            _behave(rng, job)
            jobs.append(job)
    return kind, nodes, jobs


def _gpu_no(host: str, gpu: int) -> int:
    return int(host.rsplit("-", 1)[1]) * NODE_GPUS + gpu


def _allocation(spec: FleetSpec, job: Job, cluster: str) -> Allocation:
    k8s = job.source == "kubernetes"
    start, end = datetime.fromtimestamp(job.start, UTC), datetime.fromtimestamp(job.end, UTC)
    return Allocation(
        cluster=cluster, source="kubernetes" if k8s else "slurm", external_id=job.ext_id,
        name=f"{job.behaviour}-{job.ext_id}", user=job.user, account=job.account,
        partition="" if k8s else "gpu", state="Succeeded" if k8s else "COMPLETED", submit=start, start=start,
        end=end, gpus=[AllocatedGpu(node=h, index=None if k8s else g, model=spec.model) for h, g in job.gpus])


def block_records(spec: FleetSpec, block: int) -> Iterator[Record]:
    """One block: inventory, its allocations, then every GPU's buckets, node by node and GPU by GPU (the
    store's key order, so SQLite appends instead of inserting all over its B-tree)."""
    kind, nodes, jobs = block_jobs(spec, block)
    cluster = spec.cluster_of(block)
    rng = random.Random(f"{spec.seed}:{block}:telemetry")
    for x in nodes:
        for g in range(NODE_GPUS):
            if x * NODE_GPUS + g < spec.gpus:
                yield GpuInventory(cluster, host_name(x), g, model=spec.model, seen_at=spec.end)
    for job in jobs:
        yield _allocation(spec, job, cluster)
    placed: dict[tuple[str, int], list[Job]] = {}
    for job in jobs:
        for gpu in job.gpus:
            placed.setdefault(gpu, []).append(job)
    t0, bs, nb = int(spec.start.timestamp()), spec.bucket_s, spec.buckets_per_gpu
    starts = [datetime.fromtimestamp(t0 + i * bs, UTC) for i in range(nb)]
    samples = max(1, bs // 30)
    for x in nodes:
        host = host_name(x)
        gap = (-1, -1)
        if rng.random() < 0.03:  # this node's exporter was down for a few hours
            g0 = rng.randrange(nb)
            gap = (g0, g0 + rng.randint(2 * 3600, 8 * 3600) // bs)
        profiling = rng.random() >= 0.04  # dcgm-exporter ships SM activity disabled: some nodes lack it
        for g in range(NODE_GPUS):
            if x * NODE_GPUS + g >= spec.gpus:
                break
            yield from _gpu_buckets(spec, host, g, placed.get((host, g), []), starts, gap, samples, rng,
                                    profiling, cluster)


def _gpu_buckets(spec: FleetSpec, host: str, g: int, jobs: list[Job], starts: list[datetime],
                 gap: tuple[int, int], samples: int, rng: random.Random,
                 profiling: bool = True, cluster: str | None = None) -> Iterator[GpuBucket]:
    jobs = sorted(jobs, key=lambda j: j.start)
    t0, bs = int(spec.start.timestamp()), spec.bucket_s
    uuid = f"GPU-{host}-{g}"
    cluster, model, i = cluster or spec.cluster, spec.model, 0
    for b, start in enumerate(starts):
        if gap[0] <= b < gap[1]:
            continue
        ts = t0 + b * bs
        mid = ts + bs // 2
        while i < len(jobs) and jobs[i].end <= mid:
            i += 1
        job = jobs[i] if i < len(jobs) and jobs[i].start <= mid else None
        prof = job.profile_at((host, g), mid) if job else FREE
        m = prof.at(ts, rng)
        pod = ns = None
        if job is not None and job.source == "kubernetes":
            pod, ns = f"{job.behaviour}-{job.ext_id}", job.account
        if profiling:
            yield GpuBucket(cluster, host, g, start, bs, samples, uuid, model, gpu_util=m["gpu_util"] / 100.0,
                            observed_s=float(bs), sm_active=m["sm_active"], tensor_active=m["tensor_active"],
                            dram_active=m["dram_active"], fb_used_mib=m["fb_used_mib"], power_w=m["power_w"],
                            pod=pod, namespace=ns)
        else:
            yield GpuBucket(cluster, host, g, start, bs, samples, uuid, model, gpu_util=m["gpu_util"] / 100.0,
                            observed_s=float(bs), fb_used_mib=m["fb_used_mib"], power_w=m["power_w"], pod=pod,
                            namespace=ns)


def fleet_records(spec: FleetSpec) -> Iterator[Record]:
    """Every record of the simulated fleet, streamed block by block (memory: one block's schedule)."""
    for block in range(spec.blocks):
        yield from block_records(spec, block)


def populate(store: object, spec: FleetSpec) -> object:
    """Write the simulated fleet through the store's bulk ingest path; returns its IngestStats."""
    from auditor.store.engine import Store

    assert isinstance(store, Store)
    return store.ingest(fleet_records(spec), seen_at_ts=int(spec.end.timestamp()))
