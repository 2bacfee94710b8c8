"""Kubernetes actions: scale the owning Deployment or StatefulSet to zero, suspend or delete the owning
Job, delete a pod only when nothing owns it. The pod is re-read first (still Running, same UID, node
Ready and schedulable, its exemption annotations) and every write names exactly one object; a pod delete
carries a UID precondition so a replacement pod of the same name is never hit.

Uses the connector's client configuration (kubeconfig, in-cluster service account or host + token) and
needs the separate role in deploy/kubernetes/rbac-actions.yaml; the collector's role stays read-only."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from auditor.config import Policy
from auditor.errors import SourceError
from connectors.actions import LiveState
from connectors.base import Context
from connectors.kubernetes import KubernetesAllocations, KubernetesOptions

MERGE_PATCH = "application/merge-patch+json"
JSON = "application/json"


class KubernetesActions:
    """Act on one Kubernetes cluster."""

    def __init__(self, cluster: str, options: KubernetesOptions, base_dir: Path = Path(".")) -> None:
        self.cluster = cluster
        self.conn = KubernetesAllocations(Context(cluster, base_dir), options)
        self.timeout = options.timeout_s

    def _api(self, cls: Callable[[client.ApiClient], Any]) -> Any:
        return cls(self.conn._client())

    def _read(self, what: str, call: Callable[..., Any], *args: Any) -> dict[str, Any] | None:
        """GET one object as raw JSON; None when it does not exist (404)."""
        try:
            resp = call(*args, _preload_content=False, _request_timeout=self.timeout)
            return json.loads(resp.data)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise self._error(exc, "get", what) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise SourceError("kubernetes", f"cluster {self.cluster}: get {what}: {type(exc).__name__}",
                              transient=True) from None

    def _error(self, exc: ApiException, verb: str, what: str) -> SourceError:
        try:
            msg = str(json.loads(exc.body or "{}").get("message") or exc.reason)
        except (ValueError, AttributeError):
            msg = str(exc.reason)
        hint = "; apply deploy/kubernetes/rbac-actions.yaml" if exc.status == 403 else ""
        return SourceError("kubernetes", f"cluster {self.cluster}: HTTP {exc.status} on {verb} {what}: "
                           f"{' '.join(msg.split())[:200]}{hint}", transient=exc.status in (429, 500, 502, 503))

    # -- live state ---------------------------------------------------------------------------------
    def inspect(self, alloc: dict[str, Any], policy: Policy) -> LiveState:
        ns, name, uid = alloc["account"], alloc["name"], str(alloc["external_id"])
        core = self._api(client.CoreV1Api)
        pod = self._read(f"pod {ns}/{name}", core.read_namespaced_pod, name, ns)
        if pod is None:
            return LiveState(False, state="gone", target=f"Pod {ns}/{name}")
        meta = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase") or ""
        live = LiveState(phase == "Running" and not meta.get("deletionTimestamp"), state=phase,
                         target=f"Pod {ns}/{name}", annotations=dict(meta.get("annotations") or {}),
                         detail={"uid": meta.get("uid"), "node": (pod.get("spec") or {}).get("nodeName")})
        if meta.get("uid") and meta.get("uid") != uid:
            live.running, live.state = False, f"replaced (uid {meta.get('uid')})"
            return live
        if not live.running:
            return live
        live.infra = self._node_trouble(live.detail["node"])
        self._plan(live, meta, ns, policy)
        return live

    def _node_trouble(self, node: str | None) -> str:
        if not node:
            return ""
        obj = self._read(f"node {node}", self._api(client.CoreV1Api).read_node, node)
        if obj is None:
            return f"node {node} is gone"
        if (obj.get("spec") or {}).get("unschedulable"):
            return f"node {node} is cordoned"
        ready = [c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"]
        if ready and ready[0].get("status") != "True":
            return f"node {node} Ready={ready[0].get('status')}"
        return ""

    def _plan(self, live: LiveState, meta: dict[str, Any], ns: str, policy: Policy) -> None:
        """Walk controller ownerReferences to what can be stopped for good."""
        owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
        if owner is None:
            live.action = "delete_pod"
            return
        kind, oname = owner.get("kind"), owner.get("name")
        if kind == "ReplicaSet":
            rs = self._read(f"replicaset {ns}/{oname}", self._api(client.AppsV1Api).read_namespaced_replica_set,
                            oname, ns)
            top = next((o for o in ((rs or {}).get("metadata") or {}).get("ownerReferences") or []
                        if o.get("controller")), None)
            if top is None or top.get("kind") != "Deployment":
                live.target, live.blocked = f"ReplicaSet {ns}/{oname}", "ReplicaSet without a Deployment"
                return
            kind, oname = "Deployment", top.get("name")
        live.target = f"{kind} {ns}/{oname}"
        live.detail["owner"] = {"kind": kind, "name": oname}
        if kind in ("Deployment", "StatefulSet"):
            live.action = "scale_to_zero"
        elif kind == "Job":
            live.action = "delete_job" if policy.job_action == "delete" else "suspend_job"
        else:
            live.blocked = f"owned by a {kind}: gpu-audit does not act on {kind}s"

    # -- acting -------------------------------------------------------------------------------------
    def execute(self, alloc: dict[str, Any], live: LiveState) -> str:
        ns, kw = alloc["account"], {"_request_timeout": self.timeout}
        owner = live.detail.get("owner") or {}
        try:
            if live.action == "scale_to_zero":
                apps = self._api(client.AppsV1Api)
                call = (apps.patch_namespaced_deployment_scale if owner["kind"] == "Deployment"
                        else apps.patch_namespaced_stateful_set_scale)
                res = call(owner["name"], ns, {"spec": {"replicas": 0}}, _content_type=MERGE_PATCH, **kw)
                return f"scaled {live.target} to {res.spec.replicas} replicas (had {res.status.replicas})"
            if live.action == "suspend_job":
                res = self._api(client.BatchV1Api).patch_namespaced_job(
                    owner["name"], ns, {"spec": {"suspend": True}}, _content_type=MERGE_PATCH, **kw)
                return f"suspended {live.target} (spec.suspend={res.spec.suspend})"
            if live.action == "delete_job":
                raw = self._api(client.BatchV1Api).delete_namespaced_job(
                    owner["name"], ns, propagation_policy="Background", _preload_content=False, **kw)
                body = json.loads(raw.data)
                return f"deleted {live.target} ({body.get('status') or body.get('kind')})"
            if live.action == "delete_pod":
                body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=live.detail["uid"]))
                # the client sends no Content-Type on DELETE (the API server assumes JSON); say it anyway
                raw = self._api(client.CoreV1Api).delete_namespaced_pod(
                    alloc["name"], ns, body=body, _headers={"Content-Type": JSON}, _preload_content=False, **kw)
                stamp = (json.loads(raw.data).get("metadata") or {}).get("deletionTimestamp")
                return f"deleted {live.target} (deletionTimestamp {stamp})"
        except ApiException as exc:
            raise self._error(exc, live.action, live.target) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise SourceError("kubernetes", f"cluster {self.cluster}: {live.action} {live.target}: "
                              f"{type(exc).__name__}", transient=True) from None
        raise SourceError("kubernetes", f"no action for {live.target}", transient=False)
