"""GPUs allocated through Dynamic Resource Allocation (``resource.k8s.io``): pure conversion of ResourceClaims
and ResourceSlices (raw JSON dicts) into the :class:`AllocatedGpu` rows of the pods that hold them.

Field names follow the Kubernetes API reference of ``resource.k8s.io/v1`` (Kubernetes 1.34, where DRA is GA;
https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/resource-claim-v1/ and
.../cluster-resources/resource-slice-v1/), with the two older shapes a 1.32-1.33 cluster serves:

* a pod names its claims in ``spec.resourceClaims[]`` (``name`` plus ``resourceClaimName`` for a standalone
  claim, or ``resourceClaimTemplateName``); the claim generated from a template is named in
  ``status.resourceClaimStatuses[]`` (``name`` -> ``resourceClaimName``), in the pod's namespace;
* a ResourceClaim's ``status.allocation.devices.results[]`` names each allocated device by ``request``,
  ``driver``, ``pool`` and ``device``; ``status.reservedFor[]`` lists the pods (``resource: pods``) that use
  it now; ``spec.devices.requests[]`` says the device class (``exactly.deviceClassName`` in v1 and v1beta2,
  ``deviceClassName`` directly on the request in v1beta1; ``firstAvailable[]`` sub-requests answer as
  ``request/subrequest``);
* a ResourceSlice publishes ``spec.driver``, ``spec.pool.name``, ``spec.nodeName`` and ``spec.devices[]``,
  each with ``name`` and ``attributes`` (v1beta1: under ``basic``), an attribute being one of ``{"string":
  ...}``, ``{"int": ...}``, ``{"bool": ...}``, ``{"version": ...}``. The NVIDIA DRA driver (``gpu.nvidia.com``,
  NVIDIA/k8s-dra-driver-gpu ``cmd/gpu-kubelet-plugin/deviceinfo.go``) publishes ``type`` (``gpu`` or
  ``mig``), ``uuid``, ``productName`` and, for a MIG device, ``parentUUID`` and ``profile``; older releases
  also ``index``.

A claim shared by several pods (``reservedFor`` lists them all) is split evenly: each pod holds 1/n of each
device (docs/definitions.md "Shared DRA claims").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from auditor.records import AllocatedGpu, GpuInventory
from connectors.k8s_resources import NodeInfo, mig_slices_for

#: API versions of resource.k8s.io, most preferred first (v1: Kubernetes 1.34+; v1beta2: 1.33; v1beta1: 1.32)
VERSIONS = ("v1", "v1beta2", "v1beta1")
GROUP = "resource.k8s.io"
_PROFILE = re.compile(r"^(\d+)g\.")


@dataclass(frozen=True, slots=True)
class DraDevice:
    """One device a ResourceSlice publishes, with the attributes gpu-audit reads."""

    driver: str
    pool: str
    name: str
    node: str
    uuid: str | None
    product: str | None
    parent_uuid: str | None
    profile: str | None
    index: int | None


def _attr(value: Any) -> Any:
    """The value of one DeviceAttribute (exactly one of string, int, bool, version is set)."""
    if not isinstance(value, Mapping):
        return None
    for key in ("string", "int", "bool", "version"):
        if key in value:
            return value[key]
    return None


def slice_devices(obj: Mapping[str, Any]) -> list[DraDevice]:
    """The devices of one ResourceSlice (any served version)."""
    spec = obj.get("spec") or {}
    driver = str(spec.get("driver") or "")
    pool = str((spec.get("pool") or {}).get("name") or "")
    node = str(spec.get("nodeName") or "")
    out = []
    for dev in spec.get("devices") or ():
        if not isinstance(dev, Mapping):
            continue
        body = dev.get("basic") if isinstance(dev.get("basic"), Mapping) else dev  # v1beta1 nests under basic
        attrs = {str(k).rsplit("/", 1)[-1]: _attr(v) for k, v in (body.get("attributes") or {}).items()}
        index = attrs.get("index")
        out.append(DraDevice(
            driver=driver, pool=pool, name=str(dev.get("name") or ""), node=node,
            uuid=str(attrs["uuid"]) if attrs.get("uuid") else None,
            product=str(attrs["productName"]) if attrs.get("productName") else None,
            parent_uuid=str(attrs["parentUUID"]) if attrs.get("parentUUID") else None,
            profile=str(attrs["profile"]) if attrs.get("profile") else None,
            index=index if isinstance(index, int) and not isinstance(index, bool) and index >= 0 else None))
    return out


def _request_classes(claim: Mapping[str, Any]) -> dict[str, str]:
    """Request name -> device class name, for v1/v1beta2 (``exactly``, ``firstAvailable``) and v1beta1."""
    out: dict[str, str] = {}
    for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
        if not isinstance(req, Mapping):
            continue
        name = str(req.get("name") or "")
        exact = req.get("exactly") if isinstance(req.get("exactly"), Mapping) else req
        if exact.get("deviceClassName"):
            out[name] = str(exact["deviceClassName"])
        for sub in req.get("firstAvailable") or ():
            if isinstance(sub, Mapping) and sub.get("deviceClassName"):
                out[f"{name}/{sub.get('name', '')}"] = str(sub["deviceClassName"])
    return out


def _requested_count(claim: Mapping[str, Any], is_gpu_class: Any) -> float:
    """GPUs a not yet allocated claim asks for: ``count`` of each ExactCount request of a GPU class (1 when
    unset); an ``All`` request counts 1 (how many it gets is unknown before allocation)."""
    n = 0.0
    for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
        if not isinstance(req, Mapping):
            continue
        exact = req.get("exactly") if isinstance(req.get("exactly"), Mapping) else req
        subs = [s for s in req.get("firstAvailable") or () if isinstance(s, Mapping)]
        pick = exact if exact.get("deviceClassName") else (subs[0] if subs else {})
        if not is_gpu_class(str(pick.get("deviceClassName") or "")):
            continue
        count = pick.get("count")
        n += count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 1
    return n


class DraIndex:
    """The ResourceClaims and ResourceSlices of one collection: which GPUs (exact device, UUID) each pod holds.

    ``drivers``: DRA drivers whose devices are GPUs; ``classes``: device classes whose devices are GPUs (a
    result counts when either matches)."""

    def __init__(self, claims: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]],
                 drivers: Iterable[str], classes: Iterable[str]) -> None:
        self.drivers = frozenset(drivers)
        self.classes = frozenset(classes)
        self.claims: dict[tuple[str, str], Mapping[str, Any]] = {}
        for c in claims:
            meta = c.get("metadata") or {}
            self.claims[(str(meta.get("namespace") or ""), str(meta.get("name") or ""))] = c
        self.devices: dict[tuple[str, str, str], DraDevice] = {}
        for s in slices:
            for d in slice_devices(s):
                self.devices[(d.driver, d.pool, d.name)] = d

    def inventory(self, cluster: str, at: datetime) -> dict[str, list[GpuInventory]]:
        """Per node, the physical GPUs its GPU drivers' ResourceSlices publish (for nodes the device plugin
        does not advertise): a full GPU at its ``index`` attribute, a MIG-partitioned GPU (its MIG devices'
        ``parentUUID``) at the next free index, with its layout (e.g. ``1g.10gb:7``)."""
        full: dict[str, dict[str, DraDevice]] = {}
        parts: dict[str, dict[str, list[str]]] = {}
        for d in self.devices.values():
            if d.driver not in self.drivers or not d.node:
                continue
            if d.parent_uuid:
                parts.setdefault(d.node, {}).setdefault(d.parent_uuid, []).append(d.profile or "")
            elif d.uuid:
                full.setdefault(d.node, {})[d.uuid] = d
        out: dict[str, list[GpuInventory]] = {}
        for node in sorted(full.keys() | parts.keys()):
            gpus = sorted(full.get(node, {}).values(), key=lambda d: (d.index is None, d.index or 0, d.name))
            used = {d.index for d in gpus if d.index is not None}
            free = (i for i in range(10_000) if i not in used)
            rows = [GpuInventory(cluster=cluster, host=node, gpu=d.index if d.index is not None else next(free),
                                 model=d.product.replace(" ", "-") if d.product else None, uuid=d.uuid,
                                 seen_at=at) for d in gpus]
            products = {d.parent_uuid: d.product for d in self.devices.values() if d.node == node and d.parent_uuid}
            for parent, profiles in sorted(parts.get(node, {}).items()):
                counts: dict[str, int] = {}
                for prof in profiles:
                    counts[prof] = counts.get(prof, 0) + 1
                product = products.get(parent)
                rows.append(GpuInventory(cluster=cluster, host=node, gpu=next(free),
                                         model=product.replace(" ", "-") if product else None, uuid=parent,
                                         mig_layout=",".join(f"{k}:{n}" for k, n in sorted(counts.items())),
                                         seen_at=at))
            out[node] = rows
        return out

    @staticmethod
    def claim_names(pod: Mapping[str, Any]) -> list[str]:
        """Names of the ResourceClaims a pod uses (standalone, and generated from templates once created)."""
        spec = pod.get("spec") or {}
        generated = {str(s.get("name")): s.get("resourceClaimName")
                     for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
                     if isinstance(s, Mapping)}
        out = []
        for ref in spec.get("resourceClaims") or ():
            if not isinstance(ref, Mapping):
                continue
            name = ref.get("resourceClaimName") or generated.get(str(ref.get("name")))
            if name:
                out.append(str(name))
        return out

    def _is_gpu(self, driver: str, device_class: str) -> bool:
        return driver in self.drivers or device_class in self.classes

    def pod_gpus(self, pod: Mapping[str, Any], node: NodeInfo | None) -> list[AllocatedGpu]:
        """The GPUs a scheduled pod holds through its allocated claims; [] when it holds none."""
        meta = pod.get("metadata") or {}
        namespace, uid = str(meta.get("namespace") or ""), str(meta.get("uid") or "")
        node_name = str((pod.get("spec") or {}).get("nodeName") or "")
        out: list[AllocatedGpu] = []
        for name in self.claim_names(pod):
            claim = self.claims.get((namespace, name))
            if claim is None:
                continue
            status = claim.get("status") or {}
            results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or ()
            users = [r for r in status.get("reservedFor") or () if isinstance(r, Mapping)
                     and (r.get("resource") or "pods") == "pods" and not r.get("apiGroup")]
            sharers = max(1, len(users)) if any(str(r.get("uid")) == uid for r in users) or not users else \
                len(users) + 1  # not (or no longer) listed: it shares with those that are
            classes = _request_classes(claim)
            for res in results:
                if not isinstance(res, Mapping) or res.get("adminAccess"):
                    continue  # admin access (monitoring) allocates nothing
                driver = str(res.get("driver") or "")
                if not self._is_gpu(driver, classes.get(str(res.get("request") or ""), "")):
                    continue
                dev = self.devices.get((driver, str(res.get("pool") or ""), str(res.get("device") or "")))
                out.append(self._gpu(dev, node, node_name, sharers))
        return out

    def pod_requested(self, pod: Mapping[str, Any]) -> float:
        """GPUs a pod waits for through its claims: an allocated claim's GPU devices, else what it requests."""
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace") or "")
        n = 0.0
        for name in self.claim_names(pod):
            claim = self.claims.get((namespace, name))
            if claim is None:
                continue
            classes = _request_classes(claim)
            results = ((((claim.get("status") or {}).get("allocation") or {}).get("devices") or {})
                       .get("results") or ())
            if results:
                n += sum(1 for r in results if isinstance(r, Mapping) and not r.get("adminAccess")
                         and self._is_gpu(str(r.get("driver") or ""), classes.get(str(r.get("request")), "")))
            else:
                n += _requested_count(claim, lambda c: c in self.classes)
        return n

    @staticmethod
    def _gpu(dev: DraDevice | None, node: NodeInfo | None, node_name: str, sharers: int) -> AllocatedGpu:
        model = (node.model if node and node.model else None) or (
            dev.product.replace(" ", "-") if dev and dev.product else None)
        if dev is not None and dev.profile and dev.parent_uuid:  # a MIG device: g compute slices of its parent
            m = _PROFILE.match(dev.profile)
            slices = node.mig_slices if node else mig_slices_for(model)
            share = min(1.0, int(m.group(1)) / slices) if m else 1.0
            return AllocatedGpu(node=dev.node or node_name, index=None, uuid=dev.parent_uuid, model=model,
                                share=share / sharers, mig_profile=dev.profile)
        return AllocatedGpu(node=(dev.node if dev else "") or node_name, index=dev.index if dev else None,
                            uuid=dev.uuid if dev else None, model=model, share=1.0 / sharers)
