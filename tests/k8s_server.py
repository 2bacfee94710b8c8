"""A small kube-apiserver stand-in that replays responses recorded from a real v1.24 server
(tests/fixtures/kubernetes): the list paths the connector uses, field/label selectors, paging with
limit/continue, bearer-token auth, watch streams, and the recorded 400/401/403/404/410 bodies.

Not a mock of the client: the real ``kubernetes`` package talks HTTP to it. Faults are switched on per
test through :class:`Faults`.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from auditor.records import Allocation
from connectors import build
from connectors.base import Context, Problems, Window

FIXTURES = Path(__file__).parent / "fixtures" / "kubernetes"
TOKEN = "test-token-not-a-secret"
WATCH_TYPES = ("ADDED", "MODIFIED", "MODIFIED", "MODIFIED", "DELETED")  # client-check.json watch_events

#: path -> (resource, API group, list kind, apiVersion); namespaced paths are derived.
RESOURCES = {
    "/api/v1/pods": ("pods", "", "PodList", "v1"),
    "/api/v1/nodes": ("nodes", "", "NodeList", "v1"),
    "/apis/batch/v1/jobs": ("jobs", "batch", "JobList", "batch/v1"),
    "/apis/apps/v1/replicasets": ("replicasets", "apps", "ReplicaSetList", "apps/v1"),
    **{f"/apis/resource.k8s.io/{v}/{plural}": (plural, "resource.k8s.io", kind, f"resource.k8s.io/{v}")
       for v in ("v1", "v1beta2", "v1beta1")
       for plural, kind in (("resourceclaims", "ResourceClaimList"), ("resourceslices", "ResourceSliceList"))},
}
#: custom resources of the queueing systems (Kueue, KAI-Scheduler, Volcano); the data key says which system
RESOURCES.update({
    "/apis/kueue.x-k8s.io/v1beta1/clusterqueues": ("clusterqueues", "kueue.x-k8s.io", "ClusterQueueList",
                                                   "kueue.x-k8s.io/v1beta1"),
    "/apis/kueue.x-k8s.io/v1beta1/localqueues": ("localqueues", "kueue.x-k8s.io", "LocalQueueList",
                                                 "kueue.x-k8s.io/v1beta1"),
    "/apis/kueue.x-k8s.io/v1beta1/workloads": ("workloads", "kueue.x-k8s.io", "WorkloadList", "kueue.x-k8s.io/v1beta1"),
    "/apis/scheduling.run.ai/v2/queues": ("kai-queues", "scheduling.run.ai", "QueueList", "scheduling.run.ai/v2"),
    "/apis/scheduling.run.ai/v2alpha2/podgroups": ("kai-podgroups", "scheduling.run.ai", "PodGroupList",
                                                   "scheduling.run.ai/v2alpha2"),
    "/apis/scheduling.volcano.sh/v1beta1/queues": ("volcano-queues", "scheduling.volcano.sh", "QueueList",
                                                   "scheduling.volcano.sh/v1beta1"),
    "/apis/scheduling.volcano.sh/v1beta1/podgroups": ("podgroups", "scheduling.volcano.sh", "PodGroupList",
                                                      "scheduling.volcano.sh/v1beta1"),
})
RECORDED_GROUPS = ("", "batch", "apps")
#: API groups served beyond the recorded v1.24 ones, answered at /apis/<group> (APIGroup discovery) and their
#: list paths; a group not here answers 404 as a server without it does. Set per test (``K8sReplay.groups``).
DRA = "resource.k8s.io"
FIELD_LABELS = {
    "pods": {"metadata.name", "metadata.namespace", "spec.nodeName", "spec.restartPolicy",
             "spec.schedulerName", "spec.serviceAccountName", "status.phase", "status.podIP",
             "status.nominatedNodeName"},
    "nodes": {"metadata.name", "spec.unschedulable"},
    "jobs": {"metadata.name", "metadata.namespace", "status.successful"},
    "replicasets": {"metadata.name", "metadata.namespace", "status.replicas"},
    "resourceclaims": {"metadata.name", "metadata.namespace"},
    "resourceslices": {"metadata.name", "spec.driver", "spec.nodeName", "spec.pool.name"},
}
_NS_PATH = re.compile(r"^/(api/v1|apis/[a-z.-]+/v[0-9a-z]+)/namespaces/([a-z0-9-]+)/([a-z]+)$")
_REQ = re.compile(r"^\s*(!?)([A-Za-z0-9_./-]+)\s*"
                  r"(?:(==|=|!=)\s*([A-Za-z0-9_.-]*)|\s+(in|notin)\s*\(([^)]*)\))?\s*$")


#: the environment variable the tests put the replay server's token in
TOKEN_ENV = "GPU_AUDIT_TEST_K8S_TOKEN"
#: from the recorded objects' month on, far ahead: every pod the replay holds, running or not
OPEN_WINDOW = Window(datetime(2026, 11, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC))


def collect(srv: K8sServer, problems: Problems | None = None, **options: Any) -> list[Any]:
    """The records of the real kubernetes connector reading ``srv`` over :data:`OPEN_WINDOW` (the token from
    :data:`TOKEN_ENV`, which the test sets); ``options`` are the connector's."""
    conn = build("kubernetes", "allocations", {"host": srv.url, "token": {"env": TOKEN_ENV}, **options},
                 Context("k8s-test"))
    return list(conn.collect(OPEN_WINDOW, problems or Problems()))


def allocations(records: list[Any]) -> dict[str, Allocation]:
    """The allocations among ``records``, by pod name."""
    return {r.name: r for r in records if isinstance(r, Allocation)}


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


@dataclass
class Faults:
    """Switchable failures. ``forbidden``: resources answered 403; ``expire_continue``: how many
    continued pod pages answer 410 Expired; ``fail_page``: 1-based page of pod lists answering 500;
    ``delay_s``: sleep before every answer; ``watch_expired``: watches answer the recorded 410 event."""

    forbidden: set[str] = field(default_factory=set)
    expire_continue: int = 0
    fail_page: int = 0
    delay_s: float = 0.0
    watch_expired: bool = False


class K8sReplay:
    """Data and behaviour; ``data[resource]`` holds list items (raw JSON dicts)."""

    def __init__(self, data: dict[str, list[dict[str, Any]]] | None = None, token: str = TOKEN) -> None:
        self.data = data if data is not None else {
            "pods": load("pods-all.json")["items"], "nodes": load("nodes-all.json")["items"],
            "jobs": load("jobs-all.json")["items"], "replicasets": load("replicasets-all.json")["items"]}
        self.token = token
        #: extra API group -> versions served (e.g. {"resource.k8s.io": ["v1"]}); none by default (a v1.24 server)
        self.groups: dict[str, list[str]] = {}
        self.resource_version = "240"
        self.faults = Faults()
        self.requests: list[str] = []
        self._lock = threading.Lock()

    # -- selectors -------------------------------------------------------------------------------
    @staticmethod
    def field_value(obj: dict[str, Any], key: str) -> str:
        cur: Any = obj
        for part in key.split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        if isinstance(cur, bool):
            return "true" if cur else "false"
        return "" if cur is None else str(cur)

    def field_filter(self, resource: str, selector: str) -> list[tuple[str, str, bool]] | str:
        """Parsed terms, or the unsupported field label (answered with the recorded 400 body)."""
        terms = []
        for term in filter(None, (t.strip() for t in selector.split(","))):
            m = re.match(r"^([^!=]+)(!=|==|=)(.*)$", term)
            if not m or m.group(1) not in FIELD_LABELS[resource]:
                return m.group(1) if m else term
            terms.append((m.group(1), m.group(3), m.group(2) == "!="))
        return terms

    @staticmethod
    def label_filter(selector: str) -> list[tuple[str, str, set[str]]] | None:
        """Parsed requirements (key, op, values), or None when unparsable (recorded 400 body)."""
        parts, depth, cur = [], 0, ""
        for ch in selector:
            depth += ch == "("
            depth -= ch == ")"
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        parts.append(cur)
        reqs = []
        for part in filter(str.strip, parts):
            m = _REQ.match(part)
            if not m:
                return None
            neg, key, op, value, setop, values = m.groups()
            if neg and (op or setop):
                return None
            if setop:
                reqs.append((key, setop, {v.strip() for v in values.split(",") if v.strip()}))
            elif op:
                reqs.append((key, "!=" if op == "!=" else "=", {value}))
            else:
                reqs.append((key, "!exists" if neg else "exists", set()))
        return reqs

    @staticmethod
    def label_match(labels: dict[str, str], reqs: list[tuple[str, str, set[str]]]) -> bool:
        for key, op, values in reqs:
            have = key in labels
            ok = {"exists": have, "!exists": not have, "=": have and labels[key] in values,
                  "in": have and labels[key] in values, "!=": not have or labels[key] not in values,
                  "notin": not have or labels[key] not in values}[op]
            if not ok:
                return False
        return True

    # -- answers ---------------------------------------------------------------------------------
    def status(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None
               ) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                "message": message, "reason": reason}
        if details:
            body["details"] = details
        body["code"] = code
        return body

    def forbidden(self, resource: str, group: str, namespace: str | None) -> dict[str, Any]:
        body = load("error-403.json")
        scope = f"in the namespace \"{namespace}\"" if namespace else "at the cluster scope"
        body["message"] = (f"{resource} is forbidden: User \"gpu-auditor\" cannot list resource "
                           f"\"{resource}\" in API group \"{group}\" {scope}")
        body["details"] = {"kind": resource}
        return body

    def answer(self, method: str, raw_path: str, auth: str | None) -> tuple[int, Any]:
        """(HTTP status, JSON body or list of watch event lines)."""
        url = urlsplit(raw_path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        with self._lock:
            self.requests.append(raw_path)
        if self.faults.delay_s:
            time.sleep(self.faults.delay_s)
        if auth != f"Bearer {self.token}":
            return 401, load("error-401.json")
        if url.path.rstrip("/") == "/version":
            return 200, load("version.json")
        namespace = None
        path = url.path
        group_path = path.rstrip("/").removeprefix("/apis/")
        if path.startswith("/apis/") and group_path in self.groups:
            versions = [{"groupVersion": f"{group_path}/{v}", "version": v} for v in self.groups[group_path]]
            return 200, {"kind": "APIGroup", "apiVersion": "v1", "name": group_path, "versions": versions,
                         "preferredVersion": versions[0]}
        m = _NS_PATH.match(path)
        if m:
            namespace, path = m.group(2), f"/{m.group(1)}/{m.group(3)}"
        served = path in RESOURCES and (RESOURCES[path][1] in RECORDED_GROUPS or
                                        RESOURCES[path][3].split("/")[1] in self.groups.get(RESOURCES[path][1], ()))
        if method != "GET" or not served:
            return 404, self.status(404, "NotFound", "the server could not find the requested resource")
        resource, group, kind, api_version = RESOURCES[path]
        if resource in self.faults.forbidden:
            return 403, self.forbidden(resource, group, namespace)
        items = [i for i in self.data.get(resource, [])
                 if namespace is None or i["metadata"].get("namespace") == namespace]
        if query.get("fieldSelector"):
            terms = self.field_filter(resource, query["fieldSelector"])
            if isinstance(terms, str):
                body = load("error-400-field-label.json")
                body["message"] = f"field label not supported: {terms}"
                return 400, body
            items = [i for i in items
                     if all((self.field_value(i, k) != v) if ne else (self.field_value(i, k) == v)
                            for k, v, ne in terms)]
        if query.get("labelSelector"):
            reqs = self.label_filter(query["labelSelector"])
            if reqs is None:
                return 400, load("error-400-label-selector.json")
            items = [i for i in items if self.label_match(i["metadata"].get("labels") or {}, reqs)]
        if query.get("watch") in ("true", "1"):
            return 200, self.watch_lines(query.get("resourceVersion", ""))
        return self.page(resource, kind, api_version, items, query)

    def page(self, resource: str, kind: str, api_version: str, items: list[dict[str, Any]],
             query: dict[str, str]) -> tuple[int, Any]:
        start = 0
        token = query.get("continue")
        if token:
            try:
                state = json.loads(base64.b64decode(token.encode(), validate=True))
                start = int(state["start"])
            except (ValueError, KeyError, TypeError):
                return 400, load("error-continue.json")
            if resource == "pods" and self.faults.expire_continue > 0:
                self.faults.expire_continue -= 1
                return 410, self.status(410, "Expired", "The provided continuation parameter is too old "
                                        "to display a consistent list result. You can start a new list "
                                        "without the continuation parameter.")
        limit = int(query.get("limit") or 0)
        chunk = items[start:start + limit] if limit > 0 else items[start:]
        page_no = (start // limit + 1) if limit > 0 else 1
        if resource == "pods" and self.faults.fail_page == page_no:
            return 500, self.status(500, "InternalError", "Internal error occurred: etcdserver: "
                                    "request timed out")
        meta: dict[str, Any] = {"resourceVersion": self.resource_version}
        end = start + len(chunk)
        if limit > 0 and end < len(items):
            meta["continue"] = base64.b64encode(json.dumps({"rv": self.resource_version, "start": end})
                                                .encode()).decode()
            meta["remainingItemCount"] = len(items) - end
        return 200, {"kind": kind, "apiVersion": api_version, "metadata": meta, "items": chunk}

    def watch_lines(self, since: str) -> list[str]:
        """The recorded probe pod's life, or the recorded 410 ERROR event for a compacted version."""
        if self.faults.watch_expired:
            return [(FIXTURES / "watch-410-expired.txt").read_text().splitlines()[0]]
        objs = load("watch-probe-events.json")
        after = int(since) if since.isdigit() else 0
        return [json.dumps({"type": t, "object": copy.deepcopy(o)})
                for t, o in zip(WATCH_TYPES, objs, strict=True)
                if int(o["metadata"]["resourceVersion"]) > after]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    replay: K8sReplay

    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        status, body = self.replay.answer("GET", self.path, self.headers.get("Authorization"))
        data = ("\n".join(body) + "\n" if isinstance(body, list) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_DELETE(self) -> None:  # noqa: N802
        status, body = self.replay.answer("DELETE", self.path, self.headers.get("Authorization"))
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server API)
        """Quiet: pytest shows failures, not access logs."""


class K8sServer:
    """Runs :class:`K8sReplay` on 127.0.0.1 at a random port in a daemon thread."""

    def __init__(self, replay: K8sReplay | None = None, ssl_context: Any = None) -> None:
        self.replay = replay or K8sReplay()
        handler = type("Handler", (_Handler,), {"replay": self.replay})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.tls = ssl_context is not None
        if ssl_context is not None:  # HTTPS with the given (e.g. self-signed) certificate
            self.httpd.socket = ssl_context.wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> K8sServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
