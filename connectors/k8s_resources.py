"""Pure conversion of Kubernetes API objects (raw JSON dicts) into gpu-audit records.

Kept apart from the HTTP side so it can be tested and benchmarked on plain dicts: the connector reads
raw JSON (``_preload_content=False``) because building client models costs ~2.4x the time (README of the
recorded fixtures) and much more memory on large clusters.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from auditor.intparse import UINT
from auditor.records import AllocatedGpu, Allocation, GpuInventory, GpuWait, KubeJob, NodeEvent

GPU_PRODUCT = "nvidia.com/gpu.product"
GPU_COUNT = "nvidia.com/gpu.count"
GPU_REPLICAS = "nvidia.com/gpu.replicas"
SHARING_STRATEGY = "nvidia.com/gpu.sharing-strategy"
MIG_CONFIG = "nvidia.com/mig.config"
TERMINAL = ("Succeeded", "Failed")
#: the label under which gpu-audit before migration 0039_pod_failure kept why a Failed pod failed; an allocations
#: file may still carry it (connectors/file.py). Now the record's ``failure_reason``
FAILURE_LABEL = "gpu-audit.io/failure-reason"
#: pod labels naming the Job that owns a pod (the Job controller sets both since Kubernetes 1.27)
JOB_UID_LABELS = ("batch.kubernetes.io/controller-uid", "controller-uid")


def job_uid(labels: Mapping[str, Any]) -> str:
    """The uid of the Job that owns a pod, from its labels (:data:`JOB_UID_LABELS`); "" for a pod of no Job."""
    return next((str(labels[k]) for k in JOB_UID_LABELS if labels.get(k)), "")

#: HAMi's modifiers of ``nvidia.com/gpu`` (per vGPU: compute % of the SMs, memory MiB, memory %; scheduling
#: priority), the resource names of its device config (Project-HAMi/HAMi docs, ``hami-scheduler-device``
#: ConfigMap ``resourceCoreName`` / ``resourceMemoryName`` / ``resourceMemoryPercentageName`` /
#: ``resourcePriorityName``): they describe the GPU a container holds, they are not GPUs of their own
HAMI_CORES, HAMI_MEM, HAMI_MEM_PCT = "nvidia.com/gpucores", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage"
HAMI_RESOURCES = frozenset((HAMI_CORES, HAMI_MEM, HAMI_MEM_PCT, "nvidia.com/priority"))
#: KAI-Scheduler / Run:ai GPU sharing: pod annotations asking for a fraction of a GPU (``gpu-fraction``, on
#: ``gpu-fraction-num-devices`` GPUs) or an amount of its memory (``gpu-memory``, MiB), without any
#: ``nvidia.com/gpu`` request (NVIDIA/KAI-Scheduler docs/gpu-sharing; Run:ai docs "GPU fractions")
KAI_FRACTION, KAI_DEVICES, KAI_MEMORY = "gpu-fraction", "gpu-fraction-num-devices", "gpu-memory"
GPU_MEMORY = "nvidia.com/gpu.memory"  # GFD node label: MiB of each GPU
_MIB = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*(Mi|M|Gi|G)?$")
_MIG_RES = re.compile(r"^nvidia\.com/mig-(\d+)g\.([0-9a-z.+]+)$")
_MIG_PRODUCT = re.compile(r"-MIG-(\d+g\.[0-9a-z.+]+)$", re.IGNORECASE)
_INT = re.compile(rf"{UINT}\Z")  # ASCII digits to the very end (match anchors the start)
MAX_GPUS_PER_CONTAINER = 1024


class BadObject(ValueError):
    """An API object this module cannot read; the caller quarantines it via ``problems.skip``."""


def parse_time(value: Any) -> datetime | None:
    """RFC 3339 timestamps as the API writes them ("2026-11-29T12:31:58Z") into aware UTC datetimes."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).astimezone(UTC)
    except ValueError as exc:
        raise BadObject(f"bad timestamp {value!r}") from exc


def gpu_units(value: Any, resource: str) -> int:
    """A GPU quantity must be a plain whole number: the API server rejects fractions for extended
    resources, so "500m", "1k" or "0.5" mean a hand-edited or foreign object we must not guess at."""
    text = str(value).strip()
    if not _INT.match(text) or int(text) > MAX_GPUS_PER_CONTAINER:
        raise BadObject(f"odd quantity {text!r} for {resource}")
    return int(text)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What a pod's GPUs inherit from their node: model and time-slicing replicas."""

    name: str
    model: str | None
    replicas: int
    mig_single_profile: str | None
    mig_slices: int
    memory_mib: int | None = None  # GFD nvidia.com/gpu.memory: what HAMi's and KAI's memory requests divide


def mig_slices_for(product: str | None) -> int:
    """Compute slices of a full GPU: 7 on A100/H100/H200/B200, 4 on A30."""
    return 4 if product and re.search(r"\bA30\b", product.replace("-", " ")) else 7


def node_info(node: Mapping[str, Any]) -> NodeInfo:
    """Read GPU feature discovery labels; ``-SHARED`` (renamed time-sliced product) is stripped from
    the model so the price card matches the physical GPU."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    product = labels.get(GPU_PRODUCT) or None
    shared = bool(product and product.upper().endswith("-SHARED"))
    model = product[: -len("-SHARED")] if product and shared else product
    single = _MIG_PRODUCT.search(model or "")
    if single and model:
        model = model[: single.start()]
    replicas = 1
    raw = str(labels.get(GPU_REPLICAS, "1"))
    if _INT.match(raw) and int(raw) > 1:
        replicas = int(raw)
    elif shared or labels.get(SHARING_STRATEGY) == "time-slicing":
        replicas = _replicas_from_capacity(node, labels)
    mem = str(labels.get(GPU_MEMORY, ""))
    return NodeInfo(meta.get("name", ""), model, replicas,
                    single.group(1).lower() if single else None, mig_slices_for(model),
                    int(mem) if _INT.match(mem) and int(mem) > 0 else None)


def _replicas_from_capacity(node: Mapping[str, Any], labels: Mapping[str, str]) -> int:
    """Time-sliced without a replicas label: advertised units / physical GPUs."""
    cap = (node.get("status") or {}).get("capacity") or {}
    units = sum(int(v) for k, v in cap.items() if k.startswith("nvidia.com/gpu") and _INT.match(str(v)))
    count = str(labels.get(GPU_COUNT, ""))
    return max(1, units // int(count)) if _INT.match(count) and int(count) > 0 else 1


class GpuMatcher:
    """Which resource names are GPUs (config globs such as ``nvidia.com/mig-*``)."""

    def __init__(self, patterns: list[str]) -> None:
        self.patterns = patterns
        self._cache: dict[str, bool] = {}

    def __call__(self, resource: str) -> bool:
        hit = self._cache.get(resource)
        if hit is None:
            hit = self._cache[resource] = any(fnmatch.fnmatchcase(resource, p) for p in self.patterns)
        return hit


def pod_gpu_units(pod: Mapping[str, Any], is_gpu: GpuMatcher,
                  unknown: Callable[[str], None]) -> dict[str, int]:
    """Per GPU resource, what the pod holds: max(sum over app containers, largest init container).

    Kubernetes requires requests == limits for extended resources and copies limits into requests, so
    limits are read first. ``unknown`` is told of ``nvidia.com/*`` names that are not configured GPUs.
    """
    spec = pod.get("spec") or {}
    app: dict[str, int] = {}
    init: dict[str, int] = {}
    for key, acc, add in (("containers", app, True), ("initContainers", init, False)):
        for container in spec.get(key) or ():
            res = container.get("resources") or {}
            amounts = {**(res.get("requests") or {}), **(res.get("limits") or {})}
            for name, value in amounts.items():
                if not is_gpu(name):
                    if name.startswith("nvidia.com/") and name not in HAMI_RESOURCES:
                        unknown(name)
                    continue
                n = gpu_units(value, name)
                acc[name] = acc.get(name, 0) + n if add else max(acc.get(name, 0), n)
    return {k: max(app.get(k, 0), init.get(k, 0)) for k in app.keys() | init.keys()
            if max(app.get(k, 0), init.get(k, 0)) > 0}


def gpu_share(resource: str, node: NodeInfo | None) -> tuple[float, str | None]:
    """Share of one physical GPU that one unit of ``resource`` is, and its MIG profile if any."""
    replicas = node.replicas if node else 1
    slices = node.mig_slices if node else 7
    mig = _MIG_RES.match(resource)
    if mig:
        g = int(mig.group(1))
        return min(1.0, g / slices) / replicas, f"{g}g.{mig.group(2)}"
    if node and node.mig_single_profile:
        g = int(node.mig_single_profile.split("g.", 1)[0])
        return min(1.0, g / slices) / replicas, node.mig_single_profile
    return 1.0 / replicas, None


def _mib(value: Any) -> float | None:
    """A memory amount as HAMi and KAI write it: MiB as a plain number, or with a M/Mi/G/Gi suffix."""
    m = _MIB.match(str(value).strip())
    if not m:
        return None
    n = float(m.group(1))
    return n * 1024 if m.group(2) in ("G", "Gi") else n


def _percent(value: Any) -> float | None:
    text = str(value).strip()
    return min(100.0, float(text)) / 100 if _INT.match(text) else None


def hami_share(amounts: Mapping[str, Any], node: NodeInfo | None) -> float | None:
    """The share of one GPU a HAMi vGPU holds: the larger of its compute share (``gpucores`` %) and its memory
    share (``gpumem`` MiB over the node's GPU memory, or ``gpumem-percentage``), since either one keeps other
    pods off the rest; memory not given is all of it (HAMi's ``defaultMemory: 0``), so a vGPU without a memory
    limit holds a whole GPU. None when the container has no HAMi modifier (or a memory in MiB on a node whose
    GPU memory is unknown, and no other figure: charged whole)."""
    if not any(k in amounts for k in (HAMI_CORES, HAMI_MEM, HAMI_MEM_PCT)):
        return None
    cores = _percent(amounts.get(HAMI_CORES, "0")) or 0.0
    mem: float | None = 1.0
    if HAMI_MEM_PCT in amounts:
        mem = _percent(amounts[HAMI_MEM_PCT])
    elif HAMI_MEM in amounts:
        mib = _mib(amounts[HAMI_MEM])
        mem = min(1.0, mib / node.memory_mib) if mib is not None and node and node.memory_mib else None
    if mem is None:
        return cores or 1.0
    return max(cores, mem) or 1.0


def kai_fraction(pod: Mapping[str, Any], node: NodeInfo | None) -> tuple[float, int] | None:
    """(share of each GPU, number of GPUs) a KAI / Run:ai fractional pod holds, from its annotations; None for a
    pod without them. ``gpu-memory`` on a node whose GPU memory is unknown counts a whole GPU."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    devices = str(ann.get(KAI_DEVICES, "1")).strip()
    n = int(devices) if _INT.match(devices) and 0 < int(devices) <= MAX_GPUS_PER_CONTAINER else 1
    if ann.get(KAI_FRACTION) is not None:
        try:
            f = float(str(ann[KAI_FRACTION]).strip())
        except ValueError:
            raise BadObject(f"odd annotation {KAI_FRACTION}={str(ann[KAI_FRACTION])[:40]!r}") from None
        if not 0 < f <= 1:
            raise BadObject(f"odd annotation {KAI_FRACTION}={f:g} (a fraction in (0, 1])")
        return f, n
    if ann.get(KAI_MEMORY) is not None:
        mib = _mib(ann[KAI_MEMORY])
        if mib is None:
            raise BadObject(f"odd annotation {KAI_MEMORY}={str(ann[KAI_MEMORY])[:40]!r}")
        return (min(1.0, mib / node.memory_mib) if node and node.memory_mib else 1.0), n
    return None


def pod_gpu_shares(pod: Mapping[str, Any], is_gpu: GpuMatcher, node: NodeInfo | None,
                   unknown: Callable[[str], None]) -> list[tuple[float, str | None]]:
    """(share, MIG profile) of each GPU a pod holds through extended resources and sharing annotations: the
    units of :func:`pod_gpu_units` at their :func:`gpu_share`, a HAMi vGPU at its :func:`hami_share`, and a
    KAI fraction at its fraction (on the pod's ``nvidia.com/gpu`` units if it has any, else on
    ``gpu-fraction-num-devices`` GPUs)."""
    units = pod_gpu_units(pod, is_gpu, unknown)
    fraction = kai_fraction(pod, node)
    hami: list[float] = []
    for container in (pod.get("spec") or {}).get("containers") or ():
        res = container.get("resources") or {}
        amounts = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        share = hami_share(amounts, node)
        if share is not None and is_gpu("nvidia.com/gpu") and "nvidia.com/gpu" in amounts:
            hami.extend([share] * gpu_units(amounts["nvidia.com/gpu"], "nvidia.com/gpu"))
    out: list[tuple[float, str | None]] = []
    for resource in sorted(units):
        base, profile = gpu_share(resource, node)
        for i in range(units[resource]):
            if resource == "nvidia.com/gpu" and fraction is not None:
                out.append((base * fraction[0], profile))
            elif resource == "nvidia.com/gpu" and i < len(hami):
                out.append((base * hami[i], profile))
            else:
                out.append((base, profile))
    if fraction is not None and "nvidia.com/gpu" not in units:
        out.extend([(fraction[0], None)] * fraction[1])
    return out


def pod_times(pod: Mapping[str, Any], now: datetime | None = None
              ) -> tuple[datetime | None, datetime | None, str]:
    """(start, end, state) of a pod, never an end in the future (issue 14 §3b, seen on a real v1.24 API):

    * start: ``status.startTime``; a pod bound through ``pods/binding`` (what the scheduler does) has a
      PodScheduled time but no startTime until the kubelet acknowledges it: then the first container start,
      else None (not yet running, picked up on the next poll). creationTimestamp is never used. A start
      after ``now`` (the sighting; the node's clock ahead of the API server's) is clamped to ``now``
      (:func:`clamped_start` says so).
    * end of a Succeeded/Failed pod, at its last sign of life: its latest container ``finishedAt`` (also
      ``lastState``); else the Ready (or ContainersReady) condition turning False; else, for a pod that
      never ran a container (rejected at admission, e.g. ``UnexpectedAdmissionError``), its start: it is
      charged nothing; else the phase change as the API server last recorded it (the latest status write
      in ``managedFields``), else the latest other sign of life after start. Never its deletion: a Failed
      pod is often deleted days later.
    * a pod being deleted is ``Terminating``: its ``deletionTimestamp`` is the delete time *plus* the grace
      period, so it ends at its containers' termination, or at ``deletionTimestamp`` once that has passed;
      before that it is still held (end None) and a vanished pod is closed at its last sighting.
    """
    now = now or datetime.now(UTC)
    status = pod.get("status")
    if not isinstance(status, Mapping) or not status:
        raise BadObject("missing status")
    phase = status.get("phase") or "Unknown"
    statuses = [cs for key in ("containerStatuses", "initContainerStatuses") for cs in status.get(key) or ()]
    states = [((cs.get(k) or {}).get(s) or {}) for cs in statuses for k in ("state", "lastState")
              for s in ("running", "terminated")]
    started = [t for t in (parse_time(st.get("startedAt")) for st in states) if t is not None]
    finished = [t for t in (parse_time(st.get("finishedAt")) for st in states) if t is not None]
    start = parse_time(status.get("startTime"))
    if start is None and started:
        start = min(started)
    if start is not None and start > now:
        start = now
    conditions = status.get("conditions") or ()
    deleted = parse_time((pod.get("metadata") or {}).get("deletionTimestamp"))
    end: datetime | None = None
    if phase in TERMINAL:
        end = _terminal_end(pod, statuses, started, finished, conditions, start)
    elif deleted is not None:
        phase = "Terminating"
        running = [cs for cs in statuses if (cs.get("state") or {}).get("running")]
        if statuses and not running and finished:
            end = max(finished)
        elif deleted <= now:
            end = deleted
    if end is not None and end > now:
        end = now
    if start is not None and end is not None and end < start:
        end = start
    return start, end, phase


def _terminal_end(pod: Mapping[str, Any], statuses: list[Mapping[str, Any]], started: list[datetime],
                  finished: list[datetime], conditions: Any, start: datetime | None) -> datetime | None:
    """The last sign of life of a Succeeded or Failed pod (see :func:`pod_times`)."""
    if finished:
        return max(finished)
    after = (lambda t: start is None or t > start)  # noqa: E731
    stopped = [t for c in conditions if c.get("type") in ("Ready", "ContainersReady")
               and str(c.get("status")) == "False" and (t := parse_time(c.get("lastTransitionTime")))
               and after(t)]
    if stopped:
        return max(stopped)
    ran = started or any(cs.get("containerID") or cs.get("started") or (cs.get("restartCount") or 0) > 0
                         for cs in statuses)
    if not ran:
        return start  # rejected at admission or failed before any container: held no GPU time
    written = [t for f in (pod.get("metadata") or {}).get("managedFields") or ()
               if isinstance(f, Mapping) and "f:status" in (f.get("fieldsV1") or {})
               and (t := parse_time(f.get("time"))) and after(t)]
    if written:
        return max(written)
    signs = [t for t in (parse_time(c.get("lastTransitionTime")) for c in conditions) if t is not None]
    later = [t for t in signs + started if after(t)]
    return max(later) if later else start


def clamped_start(pod: Mapping[str, Any], now: datetime) -> datetime | None:
    """The pod's own start when it lies after ``now`` (the start :func:`pod_times` clamped), else None."""
    status = pod.get("status") or {}
    start = parse_time(status.get("startTime")) if isinstance(status, Mapping) else None
    return start if start is not None and start > now else None


class OwnerResolver:
    """Walks ownerReferences to the top workload: ReplicaSet -> Deployment, Job -> CronJob. Listings of
    intermediate kinds are fetched lazily once per collection through ``fetch(kind)``."""

    WALKED = ("ReplicaSet", "Job")

    def __init__(self, fetch: Callable[[str], list[Mapping[str, Any]] | None]) -> None:
        self._fetch = fetch
        self._index: dict[str, dict[tuple[str, str], Mapping[str, Any]] | None] = {}

    def _lookup(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        if kind not in self._index:
            items = self._fetch(kind)
            self._index[kind] = None if items is None else {
                ((i.get("metadata") or {}).get("namespace", ""), (i.get("metadata") or {}).get("name", "")): i
                for i in items}
        index = self._index[kind]
        return index.get((namespace, name)) if index is not None else None

    def top(self, obj: Mapping[str, Any]) -> str:
        """``Kind/name`` of the top controller, or "" for a bare pod."""
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace", "")
        found = ""
        for _ in range(8):  # owner chains are short; a loop guards against cycles
            ref = _controller_ref(meta)
            if ref is None:
                return found
            found = f"{ref.get('kind', '')}/{ref.get('name', '')}"
            if ref.get("kind") not in self.WALKED:
                return found
            parent = self._lookup(ref["kind"], namespace, ref.get("name", ""))
            if parent is None:
                return found
            meta = parent.get("metadata") or {}
        return found


def _controller_ref(meta: Mapping[str, Any]) -> Mapping[str, Any] | None:
    refs = meta.get("ownerReferences") or []
    for ref in refs:
        if ref.get("controller"):
            return ref
    return refs[0] if refs else None


@dataclass(frozen=True, slots=True)
class PodRules:
    """Per-connector settings the conversion needs."""

    cluster: str
    is_gpu: GpuMatcher
    team_label: str
    user_keys: tuple[str, ...]


#: the GPUs a pod holds other than through extended resources (DRA claims: :mod:`connectors.k8s_dra`)
ExtraGpus = Callable[[Mapping[str, Any], NodeInfo | None], list[AllocatedGpu]]


def pod_allocation(pod: Mapping[str, Any], rules: PodRules, nodes: Mapping[str, NodeInfo],
                   owners: OwnerResolver, unknown: Callable[[str], None],
                   now: datetime | None = None, extra: ExtraGpus | None = None) -> Allocation | None:
    """The Allocation of a scheduled GPU pod seen at ``now``; None for pods that hold no GPU (CPU-only,
    unscheduled). ``extra`` adds the GPUs of the pod's DRA claims. A startTime after ``now`` is clamped to
    it, the original kept in ``labels["start_clamped_from"]``. Raises :class:`BadObject` for objects that
    cannot be read."""
    now = now or datetime.now(UTC)
    node_name = (pod.get("spec") or {}).get("nodeName") or ""
    if not node_name:
        pod_gpu_units(pod, rules.is_gpu, unknown)
        return None
    node = nodes.get(node_name)
    shares = pod_gpu_shares(pod, rules.is_gpu, node, unknown)
    claimed = extra(pod, node) if extra is not None and (pod.get("spec") or {}).get("resourceClaims") else []
    if not shares and not claimed:
        return None
    meta = pod.get("metadata") or {}
    uid = meta.get("uid")
    if not uid:
        raise BadObject("missing metadata.uid")
    start, end, state = pod_times(pod, now)
    if start is None:
        return None  # bound but not yet acknowledged: seen again on the next poll
    gpus = [AllocatedGpu(node=node_name, index=None, model=node.model if node else None, share=share,
                         mig_profile=profile) for share, profile in shares]
    gpus.extend(claimed)
    labels = dict(meta.get("labels") or {})
    if (ahead := clamped_start(pod, now)) is not None:
        labels["start_clamped_from"] = ahead.strftime("%Y-%m-%dT%H:%M:%SZ")
    if rules.team_label != "team" and rules.team_label in labels:
        labels["team"] = labels[rules.team_label]
    annotations = meta.get("annotations") or {}
    user = next((src[k] for k in rules.user_keys for src in (labels, annotations) if src.get(k)), "")
    return Allocation(
        cluster=rules.cluster, source="kubernetes", external_id=uid, name=meta.get("name", ""),
        user=str(user), account=meta.get("namespace", ""), state=state, start=start, end=end,
        submit=None, owner_workload=owners.top(pod), labels=labels, gpus=gpus, restarts=pod_restarts(pod),
        failure_reason=failure_reason(pod) if state == "Failed" else "", job_uid=job_uid(labels))


def failure_reason(pod: Mapping[str, Any]) -> str:
    """Why a Failed pod failed, in the API's own words: the ``DisruptionTarget`` condition's reason (the
    scheduler preempted it, an eviction or a drain, the taint manager or the kubelet deleted it), else the pod's
    ``status.reason`` (``Evicted``, ``DeadlineExceeded``), else a terminated container's reason
    (``OOMKilled``, ``Error``); "" when none says. The allocation's ``failure_reason``: the goodput rules map it
    to a cause (auditor/audit/goodput.py)."""
    status = pod.get("status") or {}
    for c in status.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == "DisruptionTarget" and str(c.get("status")) == "True" \
                and c.get("reason"):
            return str(c["reason"])[:64]
    if status.get("reason"):
        return str(status["reason"])[:64]
    for k in ("containerStatuses", "initContainerStatuses"):
        for cs in status.get(k) or ():
            term = ((cs.get("state") or {}).get("terminated") or {}) if isinstance(cs, Mapping) else {}
            if term.get("reason") and term.get("exitCode") not in (0, None):
                return str(term["reason"])[:64]
    return ""


def job_record(job: Mapping[str, Any], rules: PodRules, now: datetime) -> KubeJob | None:
    """The :class:`KubeJob` of a Job whose pod template holds GPUs; None for other Jobs. Raises
    :class:`BadObject` for objects that cannot be read."""
    meta = job.get("metadata") or {}
    spec = job.get("spec") or {}
    template = spec.get("template") or {}
    if not pod_gpu_shares(template, rules.is_gpu, None, lambda _resource: None):
        return None
    uid = meta.get("uid")
    if not uid:
        raise BadObject("missing metadata.uid")
    status = job.get("status") or {}

    def count(value: Any, what: str) -> int:
        if value is None:
            return 0
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BadObject(f"{what}: {value!r} is not a count")
        return value

    uncounted = (status.get("uncountedTerminatedPods") or {}).get("failed") or []
    failed = count(status.get("failed"), "status.failed") + (len(uncounted) if isinstance(uncounted, list) else 0)
    limit = spec.get("backoffLimit")
    state, reason, end = "Running", "", parse_time(status.get("completionTime"))
    for c in status.get("conditions") or ():
        if not isinstance(c, Mapping) or str(c.get("status")) != "True":
            continue
        if c.get("type") == "Failed":
            state, reason = "Failed", str(c.get("reason") or "")
            end = end or parse_time(c.get("lastTransitionTime"))
        elif c.get("type") == "Complete" and state != "Failed":
            state = "Complete"
    if state == "Running" and spec.get("suspend") is True:
        state = "Suspended"
    return KubeJob(cluster=rules.cluster, uid=str(uid), namespace=str(meta.get("namespace") or ""),
                   name=str(meta.get("name") or ""), backoff_limit=count(limit, "spec.backoffLimit")
                   if limit is not None else None, failed=failed, succeeded=count(status.get("succeeded"),
                   "status.succeeded"), active=count(status.get("active"), "status.active"), state=state,
                   reason=reason, start=parse_time(status.get("startTime")), end=end, seen_at=now)


def pod_restarts(pod: Mapping[str, Any]) -> int | None:
    """Container restarts of a pod: the sum of its (init) containers' ``restartCount``; None when the
    status lists no container (the goodput rules read it as the pod's restarts)."""
    status = pod.get("status") or {}
    counts = [cs.get("restartCount") for k in ("initContainerStatuses", "containerStatuses")
              for cs in (status.get(k) or []) if isinstance(cs, dict)]
    counts = [c for c in counts if isinstance(c, int) and not isinstance(c, bool) and c >= 0]
    return sum(counts) if counts else None


def pod_wait(pod: Mapping[str, Any], rules: PodRules, unknown: Callable[[str], None],
             claimed: Callable[[Mapping[str, Any]], float] | None = None) -> GpuWait | None:
    """The wait of a GPU pod (docs/definitions.md "Opportunity cost"): from its creation until the scheduler
    bound it (the PodScheduled condition turning True); an unscheduled Pending pod still waits (end None).
    ``claimed`` says how many GPUs the pod's DRA claims ask for. None for pods without GPUs, without a
    creation time, or bound the moment they were created."""
    shares = pod_gpu_shares(pod, rules.is_gpu, None, unknown)
    via_claims = claimed(pod) if claimed is not None and (pod.get("spec") or {}).get("resourceClaims") else 0.0
    meta = pod.get("metadata") or {}
    created = parse_time(meta.get("creationTimestamp"))
    if (not shares and not via_claims) or created is None or not meta.get("uid"):
        return None
    status = pod.get("status") or {}
    scheduled = next((c for c in status.get("conditions") or () if c.get("type") == "PodScheduled"
                      and c.get("status") == "True"), None)
    if scheduled is not None:
        end = parse_time(scheduled.get("lastTransitionTime"))
        if end is None or end <= created:
            return None
    elif (pod.get("spec") or {}).get("nodeName") or status.get("phase") != "Pending":
        return None  # bound without a condition to say when, or gone without running: no wait to measure
    else:
        end = None
    gpus = sum(share for share, _ in shares) + via_claims
    return GpuWait(cluster=rules.cluster, source="kubernetes", external_id=str(meta["uid"]), gpus=gpus,
                   eligible=created, end=end, name=meta.get("name", ""), account=meta.get("namespace", ""),
                   state="Pending" if end is None else "Scheduled")


def node_inventory(node: Mapping[str, Any], cluster: str, is_gpu: GpuMatcher,
                   at: datetime) -> list[GpuInventory]:
    """One GpuInventory per physical GPU of a GPU node (GFD ``gpu.count``, else capacity)."""
    info = node_info(node)
    labels = (node.get("metadata") or {}).get("labels") or {}
    status = node.get("status") or {}
    cap = {**(status.get("allocatable") or {}), **(status.get("capacity") or {})}
    gpu_cap = {k: int(v) for k, v in cap.items() if is_gpu(k) and _INT.match(str(v))}
    mig = {m.group(1) + "g." + m.group(2): n for k, n in gpu_cap.items() if n and (m := _MIG_RES.match(k))}
    count_label = str(labels.get(GPU_COUNT, ""))
    if _INT.match(count_label):
        count = int(count_label)
        if info.mig_single_profile:  # single strategy: gpu.count counts MIG devices
            g = int(info.mig_single_profile.split("g.", 1)[0])
            count = math.ceil(count * g / info.mig_slices)
    elif mig:
        count = math.ceil(sum(int(p.split("g.", 1)[0]) * n for p, n in mig.items()) / info.mig_slices)
    else:
        count = sum(n for k, n in gpu_cap.items() if not _MIG_RES.match(k)) // info.replicas
    if count <= 0:
        return []
    layout = labels.get(MIG_CONFIG) or ",".join(f"{p}:{n}" for p, n in sorted(mig.items()))
    if not layout and info.mig_single_profile:
        layout = f"all-{info.mig_single_profile}"
    return [GpuInventory(cluster=cluster, host=info.name, gpu=i, model=info.model, mig_layout=layout,
                         seen_at=at) for i in range(count)]


#: Node event kinds a node listing reports the current state of
NODE_STATE_KINDS = ("not_ready", "cordoned")


def node_events(node: Mapping[str, Any], cluster: str, at: datetime) -> list[NodeEvent]:
    """A node's infrastructure state now (README "Infrastructure-affected time"): ``Ready`` False or Unknown
    -> ``not_ready`` since the condition's lastTransitionTime; ``spec.unschedulable`` (cordoned) ->
    ``cordoned`` since this sighting (a cordon carries no time; the store continues an ongoing one)."""
    name = str((node.get("metadata") or {}).get("name") or "")
    if not name:
        return []
    out = []
    for c in (node.get("status") or {}).get("conditions") or ():
        if c.get("type") == "Ready" and str(c.get("status")) != "True":
            why = ": ".join(str(x) for x in (c.get("reason"), c.get("message")) if x)
            out.append(NodeEvent(cluster, name, "not_ready", parse_time(c.get("lastTransitionTime")) or at, None,
                                 None, f"Ready={c.get('status')}" + (f" ({why})" if why else ""), "kubernetes"))
    if (node.get("spec") or {}).get("unschedulable") is True:
        out.append(NodeEvent(cluster, name, "cordoned", at, None, None, "cordoned (spec.unschedulable)",
                             "kubernetes"))
    return out
