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
#: the label a Failed pod's allocation carries with why it failed (:func:`failure_reason`); a prefixed key no
#: pod label of the user's collides with
FAILURE_LABEL = "gpu-audit.io/failure-reason"
#: pod labels naming the Job that owns a pod (the Job controller sets both since Kubernetes 1.27)
JOB_UID_LABELS = ("batch.kubernetes.io/controller-uid", "controller-uid")

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
    return NodeInfo(meta.get("name", ""), model, replicas,
                    single.group(1).lower() if single else None, mig_slices_for(model))


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
                    if name.startswith("nvidia.com/"):
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


def pod_allocation(pod: Mapping[str, Any], rules: PodRules, nodes: Mapping[str, NodeInfo],
                   owners: OwnerResolver, unknown: Callable[[str], None],
                   now: datetime | None = None) -> Allocation | None:
    """The Allocation of a scheduled GPU pod seen at ``now``; None for pods that hold no GPU (CPU-only,
    unscheduled). A startTime after ``now`` is clamped to it, the original kept in
    ``labels["start_clamped_from"]``. Raises :class:`BadObject` for objects that cannot be read."""
    now = now or datetime.now(UTC)
    units = pod_gpu_units(pod, rules.is_gpu, unknown)
    node_name = (pod.get("spec") or {}).get("nodeName") or ""
    if not units or not node_name:
        return None
    meta = pod.get("metadata") or {}
    uid = meta.get("uid")
    if not uid:
        raise BadObject("missing metadata.uid")
    start, end, state = pod_times(pod, now)
    if start is None:
        return None  # bound but not yet acknowledged: seen again on the next poll
    node = nodes.get(node_name)
    gpus: list[AllocatedGpu] = []
    for resource in sorted(units):
        share, profile = gpu_share(resource, node)
        gpus.extend(AllocatedGpu(node=node_name, index=None, model=node.model if node else None,
                                 share=share, mig_profile=profile) for _ in range(units[resource]))
    labels = dict(meta.get("labels") or {})
    if state == "Failed" and (why := failure_reason(pod)):
        labels[FAILURE_LABEL] = why
    if (ahead := clamped_start(pod, now)) is not None:
        labels["start_clamped_from"] = ahead.strftime("%Y-%m-%dT%H:%M:%SZ")
    if rules.team_label != "team" and rules.team_label in labels:
        labels["team"] = labels[rules.team_label]
    annotations = meta.get("annotations") or {}
    user = next((src[k] for k in rules.user_keys for src in (labels, annotations) if src.get(k)), "")
    return Allocation(
        cluster=rules.cluster, source="kubernetes", external_id=uid, name=meta.get("name", ""),
        user=str(user), account=meta.get("namespace", ""), state=state, start=start, end=end,
        submit=None, owner_workload=owners.top(pod), labels=labels, gpus=gpus, restarts=pod_restarts(pod))


def failure_reason(pod: Mapping[str, Any]) -> str:
    """Why a Failed pod failed, in the API's own words: the ``DisruptionTarget`` condition's reason (the
    scheduler preempted it, an eviction or a drain, the taint manager or the kubelet deleted it), else the pod's
    ``status.reason`` (``Evicted``, ``DeadlineExceeded``), else a terminated container's reason
    (``OOMKilled``, ``Error``); "" when none says. The goodput rules map it to a cause (auditor/audit/goodput.py
    ``POD_CAUSES``)."""
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
    if not pod_gpu_units(template, rules.is_gpu, lambda _resource: None):
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


def pod_wait(pod: Mapping[str, Any], rules: PodRules, unknown: Callable[[str], None]) -> GpuWait | None:
    """The wait of a GPU pod (docs/definitions.md "Opportunity cost"): from its creation until the scheduler
    bound it (the PodScheduled condition turning True); an unscheduled Pending pod still waits (end None).
    None for pods without GPUs, without a creation time, or bound the moment they were created."""
    units = pod_gpu_units(pod, rules.is_gpu, unknown)
    meta = pod.get("metadata") or {}
    created = parse_time(meta.get("creationTimestamp"))
    if not units or created is None or not meta.get("uid"):
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
    gpus = sum(n * gpu_share(r, None)[0] for r, n in units.items())
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
