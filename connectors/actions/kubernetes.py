"""Kubernetes actions: scale the owning Deployment or StatefulSet to zero, suspend or delete the owning
Job, delete a pod only when nothing owns it. The pod is re-read first (still Running, same UID, node
Ready and schedulable, its exemption annotations), then every owner in its controller chain (by name; its
uid and selector are reported) and the live pods the action would stop; the enforcement's proof decides
from those facts. Every write names exactly one object; a pod delete carries a UID precondition so a
replacement pod of the same name is never hit; a write's outcome is its HTTP status.

Uses the connector's client configuration (kubeconfig, in-cluster service account or host + token) and
needs the separate role in deploy/kubernetes/enforcement (rbac-actions.yaml); the collector's role stays read-only."""

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
        hint = "; apply deploy/kubernetes/enforcement (the rbac-actions.yaml role)" if exc.status == 403 else ""
        return SourceError("kubernetes", f"cluster {self.cluster}: HTTP {exc.status} on {verb} {what}: "
                           f"{' '.join(msg.split())[:200]}{hint}", transient=exc.status in (429, 500, 502, 503))

    # -- live state ---------------------------------------------------------------------------------
    def inspect(self, alloc: dict[str, Any], policy: Policy) -> LiveState:
        """The pod now, the controller chain above it (each owner read by name, its uid and selector
        reported) and the live pods the action would stop. Nothing here decides: the enforcement's proof
        compares all of it with what was judged."""
        ns, name, uid = alloc["account"], alloc["name"], str(alloc["external_id"])
        core = self._api(client.CoreV1Api)
        pod = self._read(f"pod {ns}/{name}", core.read_namespaced_pod, name, ns)
        if pod is None:
            return LiveState(False, state="gone", target=f"Pod {ns}/{name}")
        meta = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase") or ""
        node = (pod.get("spec") or {}).get("nodeName")
        live = LiveState(phase == "Running" and not meta.get("deletionTimestamp"), state=phase,
                         target=f"Pod {ns}/{name}", annotations=dict(meta.get("annotations") or {}),
                         detail={"uid": meta.get("uid"), "node": node},
                         identity={"uid": meta.get("uid"), "namespace": meta.get("namespace", ns),
                                   "name": meta.get("name", name), "node": node})
        if meta.get("uid") and meta.get("uid") != uid:
            live.running, live.state = False, f"replaced (uid {meta.get('uid')})"
            return live
        if not live.running:
            return live
        live.infra = self._node_trouble(node)
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

    def _owner(self, kind: str, ns: str, name: str) -> dict[str, Any] | None:
        apps, batch = self._api(client.AppsV1Api), self._api(client.BatchV1Api)
        call = {"ReplicaSet": apps.read_namespaced_replica_set, "Deployment": apps.read_namespaced_deployment,
                "StatefulSet": apps.read_namespaced_stateful_set, "Job": batch.read_namespaced_job,
                "CronJob": batch.read_namespaced_cron_job}.get(kind)
        return None if call is None else self._read(f"{kind.lower()} {ns}/{name}", call, name, ns)

    def _plan(self, live: LiveState, meta: dict[str, Any], ns: str, policy: Policy) -> None:
        """Follow controller ownerReferences (the kinds gpu-audit knows, each read by name), report the chain,
        the action it suggests and the live pods that action would stop."""
        child, child_kind = meta, "Pod"
        while True:
            ref = next((o for o in child.get("ownerReferences") or [] if o.get("controller")), None)
            if ref is None:
                break
            kind, oname = str(ref.get("kind") or ""), str(ref.get("name") or "")
            obj = self._owner(kind, ns, oname) if len(live.chain) < 3 else None
            om = (obj or {}).get("metadata") or {}
            live.chain.append({"kind": kind, "name": oname, "ref_uid": ref.get("uid"), "uid": om.get("uid"),
                               "selector": ((obj or {}).get("spec") or {}).get("selector"),
                               "child_kind": child_kind, "child_labels": dict(child.get("labels") or {})})
            if obj is None:
                break
            child, child_kind = om, kind
        kinds = [c["kind"] for c in live.chain]
        if not kinds:
            live.action = "delete_pod"
            return
        top = {("ReplicaSet", "Deployment"): 1, ("StatefulSet",): 0, ("Job",): 0, ("Job", "CronJob"): 0}.get(
            tuple(kinds))
        if top is None:
            last = live.chain[-1]
            live.target = f"{last['kind']} {ns}/{last['name']}"
            known = {"ReplicaSet", "Deployment", "StatefulSet", "Job", "CronJob"}
            live.blocked = (f"owned by a {last['kind']}: gpu-audit does not act on {last['kind']}s"
                            if len(kinds) == 1 and last["kind"] not in known else
                            f"owner chain Pod -> {' -> '.join(kinds)} is not one gpu-audit follows")
            return
        owner = live.chain[top]
        live.target = f"{owner['kind']} {ns}/{owner['name']}"
        live.detail["owner"] = {"kind": owner["kind"], "name": owner["name"], "uid": owner["uid"]}
        live.action = ("scale_to_zero" if owner["kind"] in ("Deployment", "StatefulSet") else
                       "delete_job" if policy.job_action == "delete" else "suspend_job")
        live.members = self._members(ns, live.chain[: top + 1])

    def _list(self, what: str, call: Callable[..., Any], ns: str) -> list[dict[str, Any]]:
        got = self._read(what, call, ns)
        return list((got or {}).get("items") or [])

    def _members(self, ns: str, chain: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The live pods (not finished) whose controller is the acted-on owner or, for a Deployment, one of
        its ReplicaSets: what scaling to zero or suspending stops."""
        owner = chain[-1]
        parents = {owner["uid"]}
        if owner["kind"] == "Deployment":
            for rs in self._list(f"replicasets in {ns}", self._api(client.AppsV1Api).list_namespaced_replica_set,
                                 ns):
                rm = rs.get("metadata") or {}
                if any(o.get("controller") and o.get("uid") == owner["uid"] for o in rm.get("ownerReferences") or []):
                    parents.add(rm.get("uid"))
        out = []
        for p in self._list(f"pods in {ns}", self._api(client.CoreV1Api).list_namespaced_pod, ns):
            pm = p.get("metadata") or {}
            if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            if any(o.get("controller") and o.get("uid") in parents for o in pm.get("ownerReferences") or []):
                out.append({"uid": pm.get("uid"), "name": pm.get("name"),
                            "annotations": dict(pm.get("annotations") or {})})
        return out

    # -- acting -------------------------------------------------------------------------------------
    def _write(self, call: Callable[..., Any], *args: Any, **kw: Any) -> tuple[int, dict[str, Any]]:
        """One write; its outcome is the HTTP status (an error status raises ApiException). The body is
        read as plain JSON for the log line only: a body the client's models could not parse must not
        turn a done action into a failed one."""
        raw = call(*args, _preload_content=False, _request_timeout=self.timeout, **kw)
        try:
            body = json.loads(raw.data or b"{}")
        except ValueError:
            body = {}
        return int(raw.status), body if isinstance(body, dict) else {}

    def execute(self, alloc: dict[str, Any], live: LiveState) -> str:
        ns = alloc["account"]
        owner = live.detail.get("owner") or {}
        try:
            if live.action == "scale_to_zero":
                apps = self._api(client.AppsV1Api)
                call = (apps.patch_namespaced_deployment_scale if owner["kind"] == "Deployment"
                        else apps.patch_namespaced_stateful_set_scale)
                code, body = self._write(call, owner["name"], ns, {"spec": {"replicas": 0}},
                                         _content_type=MERGE_PATCH)
                had = (body.get("status") or {}).get("replicas") if isinstance(body.get("status"), dict) else None
                now = (body.get("spec") or {}).get("replicas") if isinstance(body.get("spec"), dict) else None
                return f"scaled {live.target} to {now if now is not None else 0} replicas (had " \
                       f"{had if had is not None else '?'}): HTTP {code}"
            if live.action == "suspend_job":
                code, body = self._write(self._api(client.BatchV1Api).patch_namespaced_job, owner["name"], ns,
                                         {"spec": {"suspend": True}}, _content_type=MERGE_PATCH)
                spec = body.get("spec") if isinstance(body.get("spec"), dict) else {}
                return f"suspended {live.target} (spec.suspend={spec.get('suspend')}): HTTP {code}"
            if live.action == "delete_job":
                code, body = self._write(self._api(client.BatchV1Api).delete_namespaced_job, owner["name"], ns,
                                         propagation_policy="Background")
                return f"deleted {live.target} ({body.get('status') or body.get('kind')}): HTTP {code}"
            if live.action == "delete_pod":
                opts = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=live.detail["uid"]))
                # the client sends no Content-Type on DELETE (the API server assumes JSON); say it anyway
                code, body = self._write(self._api(client.CoreV1Api).delete_namespaced_pod, alloc["name"], ns,
                                         body=opts, _headers={"Content-Type": JSON})
                md = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
                return f"deleted {live.target} (deletionTimestamp {md.get('deletionTimestamp')}): HTTP {code}"
        except ApiException as exc:
            raise self._error(exc, live.action, live.target) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise SourceError("kubernetes", f"cluster {self.cluster}: {live.action} {live.target}: "
                              f"{type(exc).__name__}", transient=True) from None
        raise SourceError("kubernetes", f"no action for {live.target}", transient=False)
