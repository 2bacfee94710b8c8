"""Who held the quota on Kubernetes (issue 42 §4): the GPU quotas of the batch queueing systems, which queue each
pod ran in, and the waits for admission, as pure conversion of raw JSON objects.

* Kueue (``kueue.x-k8s.io/v1beta1``, https://kueue.sigs.k8s.io/docs/reference/kueue.v1beta1/): a
  ``ClusterQueue``'s ``spec.resourceGroups[].flavors[].resources[]`` ``{name, nominalQuota}`` (summed over the
  flavors for the GPU resources) is the quota; a ``LocalQueue`` (namespaced) points at it through
  ``spec.clusterQueue``; a pod names its LocalQueue in the label ``kueue.x-k8s.io/queue-name``; a ``Workload``
  (``spec.queueName``, ``spec.podSets[] {count, template}``, ``status.admission.clusterQueue``,
  ``status.conditions`` ``QuotaReserved`` / ``Admitted`` / ``Finished``) waits for admission from its creation
  until ``Admitted`` turns True; its Job's pods do not exist until then, so the Workload is the wait.
* KAI-Scheduler / Run:ai (``scheduling.run.ai/v2`` ``Queue``, NVIDIA/KAI-Scheduler docs/queues): the
  queue's deserved GPUs are ``spec.resources.gpu.quota`` (-1: unlimited, not a quota). A pod's queue is its
  PodGroup's (``scheduling.run.ai/v2alpha2`` ``PodGroup``, KAI-Scheduler pkg/apis/scheduling/v2alpha2/
  podgroup_types.go ``spec.queue``; the pod names its PodGroup, in its namespace, in the annotation
  ``pod-group-name``, pkg/common/constants ``PodGroupAnnotationForPod``: KAI's pod grouper takes the queue from
  the top owner, a Job or PyTorchJob, so the pod itself often carries no queue label), else the pod's label
  ``kai.scheduler/queue`` (older Run:ai: ``runai/queue``). A parent queue (named in a child's
  ``spec.parentQueue``) is not a quota of its own.
* Volcano (``scheduling.volcano.sh/v1beta1`` ``Queue``, volcano-sh/apis pkg/apis/scheduling/v1beta1/types.go):
  ``spec.deserved`` (the queue's fair share), else ``spec.guarantee.resource`` (reserved for it), for the GPU
  resources; a pod names its PodGroup in the annotation ``scheduling.k8s.io/group-name`` and the PodGroup its
  queue in ``spec.queue`` (Volcano Jobs also annotate pods ``volcano.sh/queue-name``).

The queue of a pod becomes its allocation's ``partition`` and its wait's, and each queue with a GPU quota a
:class:`GpuQuota` of kind ``queue``: the idle-quota finding and "idle while GPU jobs waited" then read them as
they read Slurm's partitions and QOS limits (docs/definitions.md "Opportunity cost").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from auditor.records import GpuQuota, GpuWait
from connectors.k8s_resources import GpuMatcher, PodRules, gpu_share, parse_time, pod_gpu_units

#: system -> its CRDs as (API group, version, plural) gpu-audit lists
CRDS: dict[str, dict[str, tuple[str, str, str]]] = {
    "kueue": {"clusterqueues": ("kueue.x-k8s.io", "v1beta1", "clusterqueues"),
              "localqueues": ("kueue.x-k8s.io", "v1beta1", "localqueues"),
              "workloads": ("kueue.x-k8s.io", "v1beta1", "workloads")},
    "kai": {"queues": ("scheduling.run.ai", "v2", "queues"),
            "podgroups": ("scheduling.run.ai", "v2alpha2", "podgroups")},
    "volcano": {"queues": ("scheduling.volcano.sh", "v1beta1", "queues"),
                "podgroups": ("scheduling.volcano.sh", "v1beta1", "podgroups")},
}
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KAI_QUEUE_LABELS = ("kai.scheduler/queue", "runai/queue")
KAI_GROUP_ANNOTATION = "pod-group-name"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_QUEUE_ANNOTATION = "volcano.sh/queue-name"
_QTY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|M|G)?$")
_SCALE = {None: 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9}


def quantity(value: Any) -> float | None:
    """A Kubernetes quantity as GPU counts are written ("8", "8.5", "500m"); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    m = _QTY.match(str(value).strip())
    return float(m.group(1)) * _SCALE[m.group(2)] if m else None


def _gpus_of(resources: Mapping[str, Any] | None, is_gpu: GpuMatcher) -> float | None:
    """GPUs in a resource list (name -> quantity): the sum over the GPU resources, MIG ones by their share."""
    if not isinstance(resources, Mapping):
        return None
    found = [(k, quantity(v)) for k, v in resources.items() if is_gpu(str(k))]
    found = [(k, q) for k, q in found if q is not None]
    return sum(q * gpu_share(k, None)[0] for k, q in found) if found else None


class QueueIndex:
    """The queues of one collection: their GPU quotas and which queue each pod ran in."""

    def __init__(self, cluster: str, is_gpu: GpuMatcher, lists: Mapping[str, Mapping[str, list[Mapping[str, Any]]]]
                 ) -> None:
        self.cluster = cluster
        self.is_gpu = is_gpu
        self.lists = lists
        kueue = lists.get("kueue") or {}
        self.local: dict[tuple[str, str], str] = {}
        for lq in kueue.get("localqueues") or ():
            meta = lq.get("metadata") or {}
            cq = (lq.get("spec") or {}).get("clusterQueue")
            if cq:
                self.local[(str(meta.get("namespace") or ""), str(meta.get("name") or ""))] = str(cq)
        self.by_job: dict[tuple[str, str], str] = {}  # (namespace, owner Kind/name) -> admitting ClusterQueue
        for wl in kueue.get("workloads") or ():
            meta = wl.get("metadata") or {}
            cq = self._workload_queue(wl)
            for ref in meta.get("ownerReferences") or ():
                if cq and isinstance(ref, Mapping):
                    self.by_job[(str(meta.get("namespace") or ""), f"{ref.get('kind')}/{ref.get('name')}")] = cq
        self.groups = self._group_queues((lists.get("volcano") or {}).get("podgroups"))
        self.kai_groups = self._group_queues((lists.get("kai") or {}).get("podgroups"))

    @staticmethod
    def _group_queues(podgroups: Any) -> dict[tuple[str, str], str]:
        """(namespace, PodGroup name) -> its ``spec.queue`` (Volcano's and KAI's PodGroups alike)."""
        out: dict[tuple[str, str], str] = {}
        for pg in podgroups or ():
            meta = pg.get("metadata") or {}
            if (pg.get("spec") or {}).get("queue"):
                out[(str(meta.get("namespace") or ""), str(meta.get("name") or ""))] = str(pg["spec"]["queue"])
        return out

    def _workload_queue(self, wl: Mapping[str, Any]) -> str:
        adm = (wl.get("status") or {}).get("admission") or {}
        if adm.get("clusterQueue"):
            return str(adm["clusterQueue"])
        ns = str((wl.get("metadata") or {}).get("namespace") or "")
        return self.local.get((ns, str((wl.get("spec") or {}).get("queueName") or "")), "")

    def _reserved(self, cq: Mapping[str, Any]) -> float | None:
        """GPUs a ClusterQueue's admitted workloads hold of its quota now: ``status.flavorsUsage[].resources[]``
        ``total`` (borrowed included) of its GPU resources, summed over the flavors; None without a status."""
        usage = (cq.get("status") or {}).get("flavorsUsage")
        if not isinstance(usage, list):
            return None
        total = 0.0
        for flavor in usage:
            for res in (flavor.get("resources") or ()) if isinstance(flavor, Mapping) else ():
                if isinstance(res, Mapping) and self.is_gpu(str(res.get("name"))) and (
                        q := quantity(res.get("total"))):
                    total += q * gpu_share(str(res.get("name")), None)[0]
        return total

    def quotas(self, at: datetime) -> list[GpuQuota]:
        """One GpuQuota (kind ``queue``) per queue that holds GPUs; a Kueue ClusterQueue's with the GPUs its
        admitted workloads reserve (``status.flavorsUsage``)."""
        out: dict[str, float] = {}
        reserved: dict[str, float | None] = {}
        for cq in (self.lists.get("kueue") or {}).get("clusterqueues") or ():
            total = 0.0
            for rg in (cq.get("spec") or {}).get("resourceGroups") or ():
                for flavor in rg.get("flavors") or ():
                    for res in flavor.get("resources") or ():
                        if self.is_gpu(str(res.get("name"))) and (q := quantity(res.get("nominalQuota"))):
                            total += q * gpu_share(str(res.get("name")), None)[0]
            if total > 0:
                out[str((cq.get("metadata") or {}).get("name"))] = total
                reserved[str((cq.get("metadata") or {}).get("name"))] = self._reserved(cq)
        kai = (self.lists.get("kai") or {}).get("queues") or ()
        volcano = (self.lists.get("volcano") or {}).get("queues") or ()
        # a parent queue's quota is its children's (KAI spec.parentQueue, Volcano spec.parent): only leaf
        # queues hold pods, so a parent would look unused; it is left out
        parents = {str((q.get("spec") or {}).get(k)) for q in [*kai, *volcano] for k in ("parentQueue", "parent")
                   if (q.get("spec") or {}).get(k)}
        for q in kai:
            if str((q.get("metadata") or {}).get("name")) in parents:
                continue
            gpu = (((q.get("spec") or {}).get("resources") or {}).get("gpu") or {})
            n = quantity(gpu.get("quota"))
            if n is not None and n > 0:
                out[str((q.get("metadata") or {}).get("name"))] = n
        for q in volcano:
            if str((q.get("metadata") or {}).get("name")) in parents:
                continue
            spec = q.get("spec") or {}
            n = _gpus_of(spec.get("deserved"), self.is_gpu)
            if not n:
                n = _gpus_of((spec.get("guarantee") or {}).get("resource"), self.is_gpu)
            if n:
                out[str((q.get("metadata") or {}).get("name"))] = n
        return [GpuQuota(self.cluster, "queue", name, gpus, seen_at=at, reserved=reserved.get(name))
                for name, gpus in sorted(out.items())]

    def queue_of(self, pod: Mapping[str, Any]) -> str:
        """The queue a pod ran in (Kueue ClusterQueue, KAI queue, Volcano queue) of a system whose queues were
        read, "" when none."""
        meta = pod.get("metadata") or {}
        ns = str(meta.get("namespace") or "")
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        if labels.get(KUEUE_QUEUE_LABEL):
            cq = self.local.get((ns, str(labels[KUEUE_QUEUE_LABEL])))
            if cq:
                return cq
        kai_group = annotations.get(KAI_GROUP_ANNOTATION)
        if kai_group and (ns, str(kai_group)) in self.kai_groups:
            return self.kai_groups[(ns, str(kai_group))]
        for key in KAI_QUEUE_LABELS if "kai" in self.lists else ():
            if labels.get(key) or annotations.get(key):
                return str(labels.get(key) or annotations[key])
        if "volcano" in self.lists and annotations.get(VOLCANO_QUEUE_ANNOTATION):
            return str(annotations[VOLCANO_QUEUE_ANNOTATION])
        group = annotations.get(VOLCANO_GROUP_ANNOTATION)
        if group and (ns, str(group)) in self.groups:
            return self.groups[(ns, str(group))]
        if self.by_job:
            for ref in meta.get("ownerReferences") or ():
                cq = self.by_job.get((ns, f"{ref.get('kind')}/{ref.get('name')}")) if isinstance(ref, Mapping) else None
                if cq:
                    return cq
        return ""

    def admission_waits(self, rules: PodRules) -> list[GpuWait]:
        """Kueue Workloads that waited (or wait) for admission, with the GPUs their pod sets ask for: from their
        creation until ``Admitted`` turned True; a Workload that finished or was deactivated unadmitted ended
        its wait then; one still pending waits on (end None)."""
        out = []
        for wl in (self.lists.get("kueue") or {}).get("workloads") or ():
            meta = wl.get("metadata") or {}
            created = parse_time(meta.get("creationTimestamp"))
            if created is None or not meta.get("uid"):
                continue
            gpus = 0.0
            for ps in (wl.get("spec") or {}).get("podSets") or ():
                count = ps.get("count") if isinstance(ps.get("count"), int) else 1
                units = pod_gpu_units(ps.get("template") or {}, rules.is_gpu, lambda _r: None)
                gpus += count * sum(n * gpu_share(r, None)[0] for r, n in units.items())
            if gpus <= 0:
                continue
            conds = {c.get("type"): c for c in (wl.get("status") or {}).get("conditions") or ()
                     if isinstance(c, Mapping) and str(c.get("status")) == "True"}
            end, state = None, "Pending"
            if "Admitted" in conds:
                end, state = parse_time(conds["Admitted"].get("lastTransitionTime")), "Admitted"
            elif "Finished" in conds:
                end, state = parse_time(conds["Finished"].get("lastTransitionTime")), "Finished"
            if end is not None and end <= created:
                continue
            out.append(GpuWait(cluster=rules.cluster, source="kubernetes", external_id=str(meta["uid"]), gpus=gpus,
                               eligible=created, end=end, name=str(meta.get("name") or ""),
                               account=str(meta.get("namespace") or ""), partition=self._workload_queue(wl),
                               state=state))
        return out

