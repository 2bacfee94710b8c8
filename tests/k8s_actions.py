"""Write verbs for the Kubernetes replay server (tests/k8s_server.py), kept apart so both evolve freely:
single-object GETs (pod, node, ReplicaSet, Deployment, StatefulSet, Job, CronJob), PATCH of a Deployment's or
StatefulSet's ``scale`` subresource and of a Job, DELETE of a Job or a pod (with a UID precondition).

Answers are shaped as a v1.24 kube-apiserver returns them (single objects carry kind/apiVersion; scale is
``autoscaling/v1`` Scale; a pod DELETE answers the pod with ``deletionTimestamp`` set; a Job DELETE with
``propagationPolicy=Background`` answers a ``Status`` Success with ``details``; a failed UID precondition
answers 409 Conflict). Deployments and StatefulSets are not in the recordings: they are built in the
shape of apps/v1 objects from the recorded ReplicaSet's ownerReference (same name and uid). Every write is
recorded in ``ActionReplay.writes`` as (method, path, content type, JSON body) for the tests to assert."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from k8s_server import K8sReplay, K8sServer, _Handler

_ONE = re.compile(r"^/(?:api/v1|apis/(?:apps|batch)/v1)(?:/namespaces/([a-z0-9-]+))?/"
                  r"(pods|nodes|replicasets|deployments|statefulsets|jobs|cronjobs)/([a-z0-9.-]+)(/scale)?$")
KIND = {"pods": ("Pod", "v1"), "nodes": ("Node", "v1"), "replicasets": ("ReplicaSet", "apps/v1"),
        "deployments": ("Deployment", "apps/v1"), "statefulsets": ("StatefulSet", "apps/v1"),
        "jobs": ("Job", "batch/v1"), "cronjobs": ("CronJob", "batch/v1")}
GROUP = {"pods": "", "nodes": "", "replicasets": "apps", "deployments": "apps", "statefulsets": "apps",
         "jobs": "batch", "cronjobs": "batch"}
NOW = "2026-11-29T14:00:00Z"


def workload(kind: str, ns: str, name: str, uid: str, replicas: int, rv: str = "300",
             selector: dict[str, str] | None = None) -> dict[str, Any]:
    """An apps/v1 Deployment or StatefulSet as the API server stores it (fields the actions read); its
    selector is ``app=NAME`` unless given (a Deployment's: its ReplicaSet's less ``pod-template-hash``)."""
    match = selector if selector is not None else {"app": name}
    return {"metadata": {"name": name, "namespace": ns, "uid": uid, "resourceVersion": rv, "generation": 1,
                         "creationTimestamp": "2026-11-28T08:00:00Z", "labels": dict(match)},
            "spec": {"replicas": replicas, "selector": {"matchLabels": dict(match)}},
            "status": {"replicas": replicas, "readyReplicas": replicas, "observedGeneration": 1}}


class ActionReplay(K8sReplay):
    """K8sReplay plus the write verbs. ``data`` gains "deployments" and "statefulsets"."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.data.setdefault("deployments", [])
        self.data.setdefault("statefulsets", [])
        self.data.setdefault("cronjobs", [])
        for rs in self.data.get("replicasets", []):
            for o in rs["metadata"].get("ownerReferences") or []:
                if o.get("kind") == "Deployment":
                    sel = {k: v for k, v in ((rs["spec"].get("selector") or {}).get("matchLabels") or {}).items()
                           if k != "pod-template-hash"}
                    self.data["deployments"].append(workload("Deployment", rs["metadata"]["namespace"], o["name"],
                                                             o["uid"], rs["spec"].get("replicas", 1), selector=sel))
        self.writes: list[tuple[str, str, str, Any]] = []
        self.rv = 400

    def find(self, resource: str, ns: str | None, name: str) -> dict[str, Any] | None:
        return next((i for i in self.data.get(resource, []) if i["metadata"]["name"] == name
                     and (ns is None or i["metadata"].get("namespace") == ns)), None)

    def one(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        kind, api = KIND[resource]
        return {"kind": kind, "apiVersion": api, **copy.deepcopy(obj)}

    def not_found(self, resource: str, name: str) -> tuple[int, Any]:
        return 404, self.status(404, "NotFound", f"{resource}{'.' + GROUP[resource] if GROUP[resource] else ''} "
                                f"\"{name}\" not found", {"name": name, "group": GROUP[resource], "kind": resource})

    def bump(self, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    def act(self, method: str, raw_path: str, auth: str | None, ctype: str, body: bytes) -> tuple[int, Any]:
        path, _, query = raw_path.partition("?")
        m = _ONE.match(path)
        if method == "GET" and not m:
            return self.answer(method, raw_path, auth)
        with self._lock:
            self.requests.append(raw_path)
        if auth != f"Bearer {self.token}":
            from k8s_server import load

            return 401, load("error-401.json")
        if not m:
            return 404, self.status(404, "NotFound", "the server could not find the requested resource")
        ns, resource, name, sub = m.groups()
        payload = json.loads(body) if body else None
        if method != "GET":
            self.writes.append((method, raw_path, ctype, payload))
        obj = self.find(resource, ns, name)
        if obj is None:
            return self.not_found(resource, name)
        if method == "GET" and not sub:
            return 200, self.one(resource, obj)
        if method == "PATCH" and sub and resource in ("deployments", "statefulsets"):
            if ctype != "application/merge-patch+json":
                return 415, self.status(415, "UnsupportedMediaType", "the body of the request was in an unknown "
                                        "format - accepted media types include: application/json-patch+json, "
                                        "application/merge-patch+json, application/apply-patch+yaml")
            had = obj["status"]["replicas"]
            obj["spec"]["replicas"] = int(payload["spec"]["replicas"])
            self.bump(obj)
            md = obj["metadata"]
            return 200, {"kind": "Scale", "apiVersion": "autoscaling/v1",
                         "metadata": {"name": name, "namespace": ns, "uid": md["uid"],
                                      "resourceVersion": md["resourceVersion"],
                                      "creationTimestamp": md["creationTimestamp"]},
                         "spec": {"replicas": obj["spec"]["replicas"]},
                         "status": {"replicas": had, "selector": f"app={name}"}}
        if method == "PATCH" and resource == "jobs" and not sub:
            obj["spec"].update(payload.get("spec") or {})
            self.bump(obj)
            return 200, self.one(resource, obj)
        if method == "DELETE" and resource == "jobs":
            self.data["jobs"].remove(obj)
            return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                         "details": {"name": name, "group": "batch", "kind": "jobs", "uid": obj["metadata"]["uid"]}}
        if method == "DELETE" and resource == "pods":
            want = ((payload or {}).get("preconditions") or {}).get("uid")
            if want and want != obj["metadata"]["uid"]:
                return 409, self.status(409, "Conflict", f"Precondition failed: UID in precondition: {want}, UID in "
                                        f"object meta: {obj['metadata']['uid']}", {"name": name, "kind": "pods"})
            obj["metadata"]["deletionTimestamp"] = NOW
            obj["metadata"]["deletionGracePeriodSeconds"] = 30
            self.bump(obj)
            return 200, self.one(resource, obj)
        return 405, self.status(405, "MethodNotAllowed", "the server does not allow this method on the requested "
                                "resource")


class _ActionHandler(_Handler):
    replay: ActionReplay

    def _reply(self, method: str) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        status, out = self.replay.act(method, self.path, self.headers.get("Authorization"),
                                      (self.headers.get("Content-Type") or "").split(";")[0], body)
        data = ("\n".join(out) + "\n" if isinstance(out, list) else json.dumps(out)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        self._reply("GET")

    def do_PATCH(self) -> None:  # noqa: N802
        self._reply("PATCH")

    def do_DELETE(self) -> None:  # noqa: N802
        self._reply("DELETE")


class ActionServer(K8sServer):
    """K8sServer answering the write verbs too."""

    def __init__(self, replay: ActionReplay | None = None) -> None:
        super().__init__(replay or ActionReplay())
        self.httpd.RequestHandlerClass = type("Handler", (_ActionHandler,), {"replay": self.replay})
