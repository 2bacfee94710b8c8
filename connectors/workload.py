"""Which pod, namespace and container a GPU series belongs to: the one place every telemetry reader
(Prometheus, scrape files) resolves workload labels, in every convention sites store them.

dcgm-exporter labels a GPU's series with the workload on it (``pod``, ``namespace``, ``container``). How they
reach the TSDB depends on the scrape:

- ``honor_labels: true`` (a ServiceMonitor/PodMonitor with ``honorLabels: true``, most hand-written scrape
  configs): the exporter's labels are kept; a GPU without a workload carries no pod label from the exporter,
  so the target's own ``pod`` (the exporter's pod) shows instead.
- ``honor_labels: false`` (the Prometheus Operator's default, which the dcgm-exporter Helm chart and the GPU
  Operator keep): the Operator's relabelling gives every series the target's ``namespace``, ``pod``,
  ``container``, ``service`` and ``endpoint`` (prometheus-operator pkg/prometheus/promcfg.go,
  generateServiceMonitorConfig/generatePodMonitorConfig), and Prometheus renames the exporter's clashing
  labels to ``exported_pod``, ``exported_namespace``, ``exported_container`` (Prometheus docs,
  scrape_config ``honor_labels``). ``pod`` is then the exporter's pod on every series.
- relabelled names (a site's ``metricRelabelings``): the label map ``pod_label``, ``namespace_label``,
  ``container_label`` names them.

Resolution, per series: the label map where set; else the ``exported_*`` triple when the series has
``exported_pod``; else ``pod``/``namespace``/``container`` (then the older ``pod_name``, ``pod_namespace``,
``container_name``). A pod that is a known exporter is never a workload label (its namespace and container
are the target's too, so all three are dropped): one matching ``exporter_pods``; the scrape target's own pod
(the ``pod`` of a series that also has ``exported_pod``); and, unless ``pod_label`` is set, a pod on every GPU
(two or more) of its node in one answer while another node's GPUs likewise all carry one pod of the same
namespace (a DaemonSet's pod per node, which no workload scheduler produces for a whole window), unless the allocations
source of the cluster saw that pod hold GPUs (a multi-node job holding every GPU of its nodes has that shape
too: ``holders``, the ``namespace/pod`` of the pods the cluster's allocations were collected for just before).
dcgm-exporter's DRA labels (``dra_claim_name``,
``dra_claim_namespace``, ``dra_device_name``, ...; Kubernetes docs "Monitor device plugin resources", its
kubelet PodResources example) name the ResourceClaim through which the pod holds the GPU: a series with
``dra_claim_name`` is a workload's, never taken for an exporter's (a multi-node job holding every GPU of its nodes
through claims looks like a DaemonSet otherwise), and ``dra_claim_namespace`` (a claim is in its pod's namespace)
is the namespace when no other label gives one. Dropping
the label of a real workload costs little (its GPU's unlabelled rows still apply to the allocation holding
it, docs/definitions.md); keeping an exporter's costs every workload's time (it is never the allocation).
"""

from __future__ import annotations

import fnmatch
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable

from pydantic import Field, field_validator

from auditor.contract import Options
from auditor.logs import log_safe

#: Canonical workload label -> the names exporters and scrapes use for it when no label map is set, in order
#: (``exported_*`` first only as a triple, see :meth:`Workload.labels`).
DEFAULT_NAMES: dict[str, tuple[str, ...]] = {
    "pod": ("pod", "pod_name"),
    "namespace": ("namespace", "pod_namespace", "dra_claim_namespace"),
    "container": ("container", "container_name"),
}
WORKLOAD_FIELDS: tuple[str, ...] = ("pod", "namespace", "container")
#: Fields dcgm-exporter gives per pod under ``--kubernetes-virtual-gpus`` (NVIDIA/dcgm-exporter at d5e5f51,
#: internal/pkg/transformation/process_metrics.go ``isPerProcessMetric``: GPU_UTIL and FB_USED, the pod's processes'
#: NVML utilization and memory, labelled ``pod_uid``); its other fields are the whole GPU's value copied onto each
#: sharing pod's series (transformation/kubernetes.go ``Process``), labelled ``vgpu`` on a shared (time-sliced,
#: MPS) GPU. Those copies are not the pod's: :func:`shared_copy`.
PER_POD_FIELDS: tuple[str, ...] = ("gpu_util", "fb_used_mib")


def shared_copy(metric: dict[str, str], field: str) -> bool:
    """A series that is the whole shared GPU's value copied onto one of the pods sharing it (dcgm-exporter
    ``--kubernetes-virtual-gpus``: a ``vgpu`` label, a field it does not measure per pod): its samples still
    count for the pod's row, its value does not (the pod is judged on its own GPU-Util, docs/telemetry.md)."""
    return bool(metric.get("vgpu")) and field not in PER_POD_FIELDS


#: exporter pods by name: the GPU Operator's DaemonSet ``nvidia-dcgm-exporter``, the dcgm-exporter Helm chart's
#: ``<release>-dcgm-exporter`` (deployment/templates/daemonset.yaml), nvidia_gpu_exporter's chart
DEFAULT_EXPORTER_PODS: tuple[str, ...] = ("*dcgm-exporter*", "*nvidia-gpu-exporter*")
_FIX = ("settings: pod_label/namespace_label/container_label name relabelled workload labels, exporter_pods "
        "lists exporter pod names")


class WorkloadOptions(Options):
    """The workload-label settings of every telemetry source that reads them (prometheus, scrape)."""

    pod_label: str | None = Field(None, description="Label holding the workload's pod (e.g. `exported_pod`, or a "
                                  "relabelled name); unset = `exported_pod` when the series has it (a scrape with "
                                  "honor_labels false), else `pod`, then `pod_name`.")
    namespace_label: str | None = Field(None, description="Label holding the workload's namespace; unset = "
                                        "`exported_namespace` beside `exported_pod`, else `namespace`, then "
                                        "`pod_namespace`.")
    container_label: str | None = Field(None, description="Label holding the workload's container; unset = "
                                        "`exported_container` beside `exported_pod`, else `container`, then "
                                        "`container_name`.")
    exporter_pods: list[str] = Field(list(DEFAULT_EXPORTER_PODS), description="Name patterns (`*` wildcards, "
                                     "`pod` or `namespace/pod`) of exporter pods, never used as a workload "
                                     "label; the scrape target's own pod (beside `exported_pod`) is never one "
                                     "either.")

    @field_validator("pod_label", "namespace_label", "container_label")
    @classmethod
    def _label_name(cls, v: str | None) -> str | None:
        if v is not None and (not v or not v.replace("_", "a").isalnum() or v[0].isdigit()):
            raise ValueError(f"{v!r} is not a label name")
        return v


class Workload:
    """Resolves the workload labels of GPU series for one collect (or probe) and remembers what it saw, so the
    source can say in one line (:meth:`note`) which convention the TSDB stores and which pods it ignored."""

    def __init__(self, options: WorkloadOptions, holders: Iterable[str] = ()) -> None:
        self.options = options
        self.holders = frozenset(holders)  # namespace/pod of pods seen holding GPUs: never DaemonSet-shaped
        self.exporters: dict[str, str] = {}  # exporter pod (namespace/pod or pod) -> why
        self.exported = 0  # series whose workload labels came from exported_*
        self.mapped_missing: Counter[str] = Counter()  # configured label absent from a series
        self.dropped: Counter[str] = Counter()  # exporter pod -> series it labelled
        self.series = 0
        self._seen: set[int] = set()  # series already counted (one answer per field repeats them)

    # -- resolution --------------------------------------------------------------------------------

    def raw(self, metric: dict[str, str]) -> dict[str, str]:
        """pod, namespace, container as the labels give them (label map, else the convention), before the
        exporter check; absent ones left out."""
        o = self.options
        mapped = {"pod": o.pod_label, "namespace": o.namespace_label, "container": o.container_label}
        exported = not o.pod_label and bool(metric.get("exported_pod"))
        out: dict[str, str] = {}
        for key in WORKLOAD_FIELDS:
            name = mapped[key]
            if name:
                value = metric.get(name)
            elif exported:
                value = metric.get(f"exported_{key}")
            else:
                value = next((metric[n] for n in DEFAULT_NAMES[key] if metric.get(n)), None)
            if value:
                out[key] = value
        return out

    def is_exporter(self, namespace: str | None, pod: str) -> bool:
        full = f"{namespace or ''}/{pod}"
        if full in self.exporters or pod in self.exporters:
            return True
        return any(fnmatch.fnmatchcase(full if "/" in pat else pod, pat) for pat in self.options.exporter_pods)

    def labels(self, metric: dict[str, str]) -> dict[str, str]:
        """The workload labels of one series (only non-empty ones); a known exporter's pod gives none."""
        sig = hash(frozenset(metric.items()))
        new = sig not in self._seen
        if new:
            self._seen.add(sig)
            self.series += 1
        out = self.raw(metric)
        if new and not self.options.pod_label and metric.get("exported_pod"):
            self.exported += 1
        for key, name in (("pod", self.options.pod_label), ("namespace", self.options.namespace_label),
                          ("container", self.options.container_label)):
            if new and name and key not in out:
                self.mapped_missing[f"{key}_label = {name!r}"] += 1
        pod = out.get("pod")
        if pod and self.is_exporter(out.get("namespace"), pod):
            if new:
                self.dropped[f"{out.get('namespace', '')}/{pod}"] += 1
            return {}
        return out

    # -- finding exporter pods in what came back ---------------------------------------------------

    def scan(self, metrics: Iterable[dict[str, str]], gpu_of: Callable[[dict[str, str]], tuple[str, str] | None]
             ) -> None:
        """Learn the exporter pods of one answer (all series of a query, or of a scrape file) before its series
        are resolved: the target's pod beside ``exported_pod``; and, unless ``pod_label`` is set, a pod on
        every GPU of its node (two or more) while another node's GPUs all carry one pod of the same namespace.
        ``gpu_of`` gives a series' (host, gpu) or None."""
        pods_on: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))  # host -> gpu -> pods
        for m in metrics:
            target = m.get("pod")
            if m.get("exported_pod") and target and not self.options.pod_label:
                self.exporters.setdefault(f"{m.get('namespace', '')}/{target}",
                                          "the scrape target's pod (its exporter's labels renamed exported_*)")
            if self.options.pod_label:
                continue
            where = gpu_of(m)
            raw = self.raw(m)
            if where and raw.get("pod") and not m.get("dra_claim_name"):  # a DRA claim holder is a workload
                pods_on[where[0]][where[1]].add(f"{raw.get('namespace', '')}/{raw['pod']}")
        whole: dict[str, list[str]] = defaultdict(list)  # namespace -> per node, the one pod on all its GPUs
        for _host, gpus in pods_on.items():
            if len(gpus) < 2:
                continue
            common = set.intersection(*gpus.values())
            for pod in common:
                whole[pod.split("/", 1)[0]].append(pod)
        for _ns, pods in whole.items():
            if len(set(pods)) >= 2:
                for pod in pods:
                    if pod in self.holders:
                        continue  # a workload the scheduler gave GPUs (a multi-node job on whole nodes)
                    self.exporters.setdefault(pod, "one pod on every GPU of its node, one such pod per node "
                                                   "(a DaemonSet)")

    # -- what it saw, in one line ------------------------------------------------------------------

    def note(self) -> str | None:
        """One line saying what the series carried and what was done, with the setting that changes it;
        None when nothing is worth saying (plain workload labels, no exporter pod)."""
        parts: list[str] = []
        if self.exported:
            parts.append(f"{self.exported} GPU series carried exported_pod (scraped with honor_labels: false, "
                         "the Prometheus Operator's default): workload labels read from exported_pod/"
                         "exported_namespace/exported_container")
        if self.dropped:
            pods = sorted(self.dropped)
            shown = ", ".join(pods[:3]) + (f" and {len(pods) - 3} more" if len(pods) > 3 else "")
            whys = sorted({self.exporters.get(p) or self.exporters.get(p.split("/", 1)[1]) or "matches exporter_pods"
                           for p in pods})
            parts.append(f"{sum(self.dropped.values())} GPU series named an exporter pod as their pod ({shown}: "
                         f"{'; '.join(whys)}), never used as a workload label")
        absent = sorted(k for k, n in self.mapped_missing.items() if n >= self.series > 0)
        if absent:
            parts.append(f"label map: no GPU series carries the label of {', '.join(absent)} ({self.series} "
                         "series read): no workload labels")
        if not parts:
            return None
        return log_safe("workload labels: " + "; ".join(parts) + f" ({_FIX})")
