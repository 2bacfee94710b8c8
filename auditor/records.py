"""The records connectors return (DESIGN.md "Records"): plain data, no database, no I/O.

All times are timezone-aware UTC datetimes. Ratios are 0-1, memory MiB, power W, bandwidth bytes/s:
connectors normalise through :mod:`connectors.aliases` before building a :class:`GpuBucket`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

Source = Literal["slurm", "kubernetes", "file"]

#: Normalised metric fields of a bucket, in storage order. Every one may be None (not measured).
METRIC_FIELDS: tuple[str, ...] = (
    "gpu_util", "gr_engine", "sm_active", "sm_occupancy", "tensor_active", "dram_active",
    "fp64_active", "fp32_active", "fp16_active", "fb_used_mib", "power_w",
    "pcie_tx_bps", "pcie_rx_bps", "nvlink_tx_bps", "nvlink_rx_bps",
)

#: Attribution labels telemetry may carry (cross-checks, not truth).
LABEL_FIELDS: tuple[str, ...] = ("hpc_job", "pod", "namespace", "container")


@dataclass(frozen=True, slots=True)
class AllocatedGpu:
    """One GPU (or a fraction of one) held by an allocation on one node."""

    node: str
    index: int | None = None  # None once the scheduler forgot it (sacct keeps counts only)
    uuid: str | None = None
    model: str | None = None
    share: float = 1.0  # below 1 for a MIG slice or a time-sliced replica
    mig_profile: str | None = None


@dataclass(slots=True)
class Allocation:
    """A job or pod that held GPUs. ``external_id`` is the scheduler's id (Slurm job id incl. array/het
    part, Kubernetes pod UID); ``account`` is the Slurm account or Kubernetes namespace."""

    cluster: str
    source: Source
    external_id: str
    name: str = ""
    user: str = ""
    account: str = ""
    partition: str = ""
    qos: str = ""
    state: str = ""
    submit: datetime | None = None
    start: datetime | None = None
    end: datetime | None = None  # None while running
    reservation: str = ""
    owner_workload: str = ""  # Kubernetes owner chain top, e.g. "Job/llama-ft"
    time_limit_s: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    gpus: list[AllocatedGpu] = field(default_factory=list)
    #: when the job could have started (Slurm Eligible): read by connectors to build a :class:`GpuWait`,
    #: not stored with the allocation
    eligible: datetime | None = None
    #: GPUs the job asked for (Slurm ReqTRES gres/gpu): a pending job holds none yet; not stored either
    gpus_requested: float = 0.0
    #: the host side Slurm accounting keeps (sacct ExitCode, AllocTRES cpu, TotalCPU); None: not said
    exit_code: str | None = None
    cpus: int | None = None
    cpu_time_s: float | None = None
    #: times the scheduler restarted (requeued) the job (Slurm Restarts); None: not said
    restarts: int | None = None
    #: Slurm 25.11+'s SLUID of this run of the job (``s`` + 13 Crockford base-32 characters): a requeue
    #: gives the same job id a new SLUID. None: the source or the Slurm version does not say
    sluid: str | None = None
    #: Kubernetes: why a Failed pod failed, in the API's words (its DisruptionTarget condition's reason, else
    #: status.reason, else a container's); "" when it did not fail or nothing says. The goodput rules map it to
    #: a cause (auditor/audit/goodput.py)
    failure_reason: str = ""
    #: Kubernetes: the uid of the Job that owns the pod (the Job controller's pod label controller-uid); "" for
    #: a pod of no Job. The goodput rules count a Job's pods as its runs
    job_uid: str = ""

    @property
    def gpu_count(self) -> float:
        return sum(g.share for g in self.gpus)


@dataclass(slots=True)
class Reservation:
    """A Slurm advance reservation: GPUs set aside for some users whether or not jobs use them."""

    cluster: str
    name: str
    start: datetime
    end: datetime
    nodes: list[str] = field(default_factory=list)
    gpu_count: float = 0.0
    users: list[str] = field(default_factory=list)
    accounts: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    slurm_id: str = ""  # Slurm's reservation id (sacctmgr ID, jobs' ReservationId) when the source gives it


@dataclass(slots=True)
class GpuBucket:
    """Normalised telemetry of one GPU over one time bucket (default 5 min). ``samples`` is how many raw
    samples fed it: 0 means "not observed", which the audit judges unknown, never idle."""

    cluster: str
    host: str
    gpu: int
    start: datetime
    seconds: int
    samples: int
    uuid: str | None = None
    model: str | None = None
    gpu_instance: str = ""  # MIG GPU instance id, "" for the whole GPU
    gpu_util: float | None = None
    gr_engine: float | None = None
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    fp64_active: float | None = None
    fp32_active: float | None = None
    fp16_active: float | None = None
    fb_used_mib: float | None = None
    power_w: float | None = None
    pcie_tx_bps: float | None = None
    pcie_rx_bps: float | None = None
    nvlink_tx_bps: float | None = None
    nvlink_rx_bps: float | None = None
    hpc_job: str | None = None
    pod: str | None = None
    namespace: str | None = None
    container: str | None = None
    #: seconds of the bucket the samples cover (0..seconds); None = the source cannot tell (stored as
    #: ``seconds`` when samples > 0, else 0)
    observed_s: float | None = None
    #: first sample time .. last sample time + interval, inside the bucket; None = the whole bucket
    span_start: datetime | None = None
    span_end: datetime | None = None
    #: job key of the series (hpc_job as given, or "namespace/pod"); None = derive it from the labels
    job: str | None = None
    #: sm_active is exact: the increase of DCGM 4.x's SM cycle counters over the bucket (connectors._cycles),
    #: not the mean of sampled SM_ACTIVE readings
    sm_exact: bool = False

    def job_key(self) -> str:
        """The telemetry job key: ``job`` if set, else hpc_job, else namespace/pod, else "" (no label)."""
        if self.job is not None:
            return self.job
        if self.hpc_job:
            return self.hpc_job
        if self.pod:
            return f"{self.namespace or ''}/{self.pod}"
        return ""


@dataclass(slots=True)
class GpuInventory:
    """A GPU that exists, allocated or not, so unallocated capacity is visible."""

    cluster: str
    host: str
    gpu: int
    model: str | None = None
    uuid: str | None = None
    mig_layout: str = ""  # e.g. "1g.10gb:7" or "all-disabled"
    seen_at: datetime | None = None


@dataclass(slots=True)
class GpuWait:
    """A GPU job or pod that waited for GPUs: eligible to start (Slurm ``Eligible``, a Pending pod's
    creation) and not running. ``end`` is when the wait ended (the job started, or left the queue without
    starting); None while it still waits: the store then ends it at its last sighting, never later."""

    cluster: str
    source: Source
    external_id: str
    gpus: float  # GPUs requested
    eligible: datetime
    end: datetime | None = None
    submit: datetime | None = None
    name: str = ""
    user: str = ""
    account: str = ""
    partition: str = ""  # Slurm partition; Kubernetes: "" (the whole cluster is one queue)
    qos: str = ""
    state: str = ""


@dataclass(slots=True)
class GpuQuota:
    """A GPU limit a team or queue holds whether or not it uses it: a Slurm QOS or account ``GrpTRES``
    ``gres/gpu=N``, or a Kubernetes queue's GPU quota (Kueue ClusterQueue nominal quota, KAI queue deserved
    GPUs, Volcano queue deserved/guarantee). ``kind`` says which allocations count against it: ``qos`` (jobs
    of that QOS), ``account`` (jobs of that account or namespace) or ``queue`` (jobs and pods of that
    partition or queue). ``reserved``: the GPUs of it the queueing system had reserved for admitted
    workloads when seen (Kueue ClusterQueue ``status.flavorsUsage``, borrowed GPUs included); None where the
    system does not say (Slurm, KAI, Volcano)."""

    cluster: str
    kind: Literal["qos", "account", "queue"]
    name: str
    gpus: float
    seen_at: datetime | None = None
    reserved: float | None = None


#: Kinds of infrastructure event (docs/definitions.md "Infrastructure-affected time"): GPU faults from
#: telemetry, node states from the schedulers.
NodeEventKind = Literal["xid", "throttle", "ecc_dbe", "row_remap", "drain", "down", "not_ready", "cordoned"]
NODE_EVENT_KINDS: tuple[str, ...] = ("xid", "throttle", "ecc_dbe", "row_remap", "drain", "down", "not_ready",
                                     "cordoned")


@dataclass(slots=True)
class NodeEvent:
    """An interval when a node or one of its GPUs was not fit for work through no fault of its users: a GPU
    fault (XID error, fault clock throttling, ECC double-bit error, row remapping) or a node the scheduler
    drained, marked down, NotReady or cordoned. ``gpu`` None = the whole node; ``end`` None = ongoing."""

    cluster: str
    node: str
    kind: str
    start: datetime
    end: datetime | None = None
    gpu: int | None = None
    reason: str = ""
    source: str = ""  # e.g. "sacctmgr", "sinfo", "kubernetes", "dcgm"


@dataclass(slots=True)
class KubeJob:
    """A Kubernetes Job whose pods hold GPUs, as the API server last said: how many of its pods failed
    (``status.failed`` plus the failed pods not yet counted), succeeded and run now, and its retry policy
    (``spec.backoffLimit``). Its pods are :class:`Allocation` records (labels ``controller-uid`` /
    ``batch.kubernetes.io/controller-uid`` = ``uid``); the goodput rules count its failed pods as restarts
    (docs/definitions.md "Goodput")."""

    cluster: str
    uid: str
    namespace: str
    name: str
    backoff_limit: int | None = None
    failed: int = 0
    succeeded: int = 0
    active: int = 0
    state: str = ""  # Running | Complete | Failed | Suspended
    reason: str = ""  # why it ended Failed, e.g. BackoffLimitExceeded, DeadlineExceeded
    start: datetime | None = None
    end: datetime | None = None
    seen_at: datetime | None = None


Record = Allocation | Reservation | GpuBucket | GpuInventory | GpuWait | GpuQuota | NodeEvent | KubeJob


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


@dataclass(slots=True)
class InferenceBucket:
    """One inference server's (vLLM, TGI, SGLang, Triton) work in one bucket, per pod: tokens generated (the counter's
    increase), mean requests running and waiting, mean batch size where the engine reports one. ``job`` is
    the telemetry job key of the pod (namespace/pod, as GpuBucket.job_key), which ties it to the pod's GPU
    allocation."""

    cluster: str
    engine: str  # vllm | tgi | sglang | triton
    job: str  # namespace/pod
    start: datetime
    seconds: int
    instance: str = ""
    model: str = ""
    generated_tokens: float | None = None
    running_mean: float | None = None
    waiting_mean: float | None = None
    batch_mean: float | None = None
    #: prompt-cache (prefix cache) tokens looked up and found in the bucket (vLLM's counters' increase)
    cache_queries: float | None = None
    cache_hits: float | None = None
    #: mean prompt-cache hit rate, 0-1, where the engine exports only a rate (SGLang's gauge)
    cache_hit_rate: float | None = None


#: Host fields of a :class:`NodeBucket`, in storage order: per-second means over the bucket (counters as rates).
#: Every one may be None: the node's exporter did not report it (not measured, never 0).
NODE_FIELDS: tuple[str, ...] = (
    "cpus", "cpu_busy", "cpu_iowait", "cpu_pegged", "disk_read_bps", "disk_write_bps", "disk_busy",
    "ib_rx_bps", "ib_tx_bps", "nfs_read_bps", "nfs_write_bps", "nfs_ops", "lustre_read_bps", "lustre_write_bps",
)


@dataclass(slots=True)
class NodeBucket:
    """What one node's host did in one bucket (node_exporter and the Lustre client exporter): CPU cores
    busy, in I/O wait and pegged, disk, InfiniBand, NFS and Lustre client traffic, each a per-second mean
    over the bucket (docs/node-telemetry.md). ``observed_s``: the seconds the exporter's samples covered
    (None: not known, a whole bucket when ``samples`` > 0). ``node`` is the host name GPU telemetry and
    the schedulers use, which ties the bucket to the allocations on the node."""

    cluster: str
    node: str
    start: datetime
    seconds: int
    samples: int = 0
    observed_s: float | None = None
    cpus: float | None = None  # cores the exporter reports
    cpu_busy: float | None = None  # cores busy (user, nice, system, irq, softirq), mean over the bucket
    cpu_iowait: float | None = None  # cores idle in I/O wait, mean
    cpu_pegged: float | None = None  # cores busy at least the connector's pegged_core_busy share
    disk_read_bps: float | None = None
    disk_write_bps: float | None = None
    disk_busy: float | None = None  # 0-1: the busiest disk's share of the bucket with I/O in flight
    ib_rx_bps: float | None = None
    ib_tx_bps: float | None = None
    nfs_read_bps: float | None = None  # bytes/s read from NFS servers (mountstats)
    nfs_write_bps: float | None = None
    nfs_ops: float | None = None  # NFS client requests/s (node_nfs_requests_total)
    lustre_read_bps: float | None = None  # Lustre client (llite) bytes/s
    lustre_write_bps: float | None = None


@dataclass(slots=True)
class PortBucket:
    """One InfiniBand or RoCE port of one node in one bucket (node_exporter's infiniband collector, issue 48 §2):
    the share of the bucket the port had data to send and sent none (its transmit wait, 0-1, see
    :func:`connectors.node_exporter.wait_share`), the link errors counted in the bucket, and on a RoCE port the
    share of its received packets a switch marked congested (ECN, 0-1: :func:`connectors.node_exporter.ecn_share`)
    (docs/node-telemetry.md "Per port"). None: not measured. ``device``/``port``: the HCA and port number as the
    exporter labels them (``mlx5_2``, ``1``)."""

    cluster: str
    node: str
    device: str
    port: str
    start: datetime
    seconds: int
    wait_share: float | None = None
    link_errors: float | None = None
    ecn_share: float | None = None
