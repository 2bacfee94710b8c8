"""Kubernetes actions with the real ``kubernetes`` client against the replay server (tests/k8s_actions.py):
the exact HTTP calls each action makes, the answers shaped as a v1.24 API server gives them, and the
separate RBAC role for actions (the collector's role stays read-only)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from k8s_actions import ActionServer, workload  # noqa: E402
from k8s_server import TOKEN  # noqa: E402

from auditor.config import Policy  # noqa: E402
from auditor.errors import SourceError  # noqa: E402
from connectors.actions.kubernetes import KubernetesActions  # noqa: E402
from connectors.kubernetes import KubernetesOptions  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TOKEN_ENV = "GPU_AUDIT_TEST_K8S_TOKEN"
NOTEBOOK = {"account": "research", "name": "notebook-alice-6d5f8b7c9-tx2lq",
            "external_id": "903819e2-6ee2-45e4-89cf-b620c277c31a"}
LLAMA = {"account": "ml-train", "name": "llama-ft-x7k2p", "external_id": "daeb5749-9f34-4d99-9766-0ceec707c6ca"}
BARE = {"account": "research", "name": "prep-then-train", "external_id": "029c1ef3-d0db-4150-ba35-23333803d268"}
TRITON = {"account": "inference", "name": "triton-mig-0", "external_id": "22f85480-39e0-4b93-92b6-ba1eb21f8532"}


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ActionServer]:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with ActionServer() as srv:
        yield srv


def actions(srv: ActionServer) -> KubernetesActions:
    opts = KubernetesOptions.model_validate({"host": srv.url, "token": {"env": TOKEN_ENV}})
    return KubernetesActions("k8s-test", opts)


def writes(srv: ActionServer) -> list[tuple[str, str, str, Any]]:
    return list(srv.replay.writes)


def test_deployment_pod_scales_the_deployment_to_zero(server: ActionServer) -> None:
    act = actions(server)
    live = act.inspect(NOTEBOOK, Policy(name="p"))
    assert (live.running, live.action, live.target, live.blocked, live.infra) == (
        True, "scale_to_zero", "Deployment research/notebook-alice", "", "")
    # inspecting reads; it writes nothing: pod, its node, the ReplicaSet that names the Deployment, the
    # Deployment (uid and selector checked by the enforcement's proof), then the pods the scale would stop
    assert writes(server) == []
    assert server.replay.requests[-6:] == ["/api/v1/namespaces/research/pods/notebook-alice-6d5f8b7c9-tx2lq",
                                           "/api/v1/nodes/gpu-node-a",
                                           "/apis/apps/v1/namespaces/research/replicasets/notebook-alice-6d5f8b7c9",
                                           "/apis/apps/v1/namespaces/research/deployments/notebook-alice",
                                           "/apis/apps/v1/namespaces/research/replicasets",
                                           "/api/v1/namespaces/research/pods"]
    assert [c["kind"] for c in live.chain] == ["ReplicaSet", "Deployment"]
    assert [m["uid"] for m in live.members] == [NOTEBOOK["external_id"]]
    result = act.execute(NOTEBOOK, live)
    assert writes(server) == [("PATCH", "/apis/apps/v1/namespaces/research/deployments/notebook-alice/scale",
                               "application/merge-patch+json", {"spec": {"replicas": 0}})]
    assert result == "scaled Deployment research/notebook-alice to 0 replicas (had 1): HTTP 200"
    assert server.replay.find("deployments", "research", "notebook-alice")["spec"]["replicas"] == 0


def test_job_pod_suspends_or_deletes_the_job(server: ActionServer) -> None:
    act = actions(server)
    live = act.inspect(LLAMA, Policy(name="p"))
    assert (live.action, live.target) == ("suspend_job", "Job ml-train/llama-ft")
    assert act.execute(LLAMA, live) == "suspended Job ml-train/llama-ft (spec.suspend=True): HTTP 200"
    live = act.inspect(LLAMA, Policy(name="p", job_action="delete"))
    assert live.action == "delete_job"
    assert act.execute(LLAMA, live) == "deleted Job ml-train/llama-ft (Success): HTTP 200"
    assert writes(server) == [
        ("PATCH", "/apis/batch/v1/namespaces/ml-train/jobs/llama-ft", "application/merge-patch+json",
         {"spec": {"suspend": True}}),
        ("DELETE", "/apis/batch/v1/namespaces/ml-train/jobs/llama-ft?propagationPolicy=Background",
         "", None),
    ]
    assert server.replay.find("jobs", "ml-train", "llama-ft") is None


def test_bare_pod_is_deleted_with_a_uid_precondition(server: ActionServer) -> None:
    act = actions(server)
    live = act.inspect(BARE, Policy(name="p"))
    assert (live.action, live.target) == ("delete_pod", "Pod research/prep-then-train")
    assert act.execute(BARE, live) == \
        "deleted Pod research/prep-then-train (deletionTimestamp 2026-11-29T14:00:00Z): HTTP 200"
    assert writes(server) == [("DELETE", "/api/v1/namespaces/research/pods/prep-then-train", "application/json",
                               {"preconditions": {"uid": BARE["external_id"]}})]
    # a pod being deleted is no longer running: nothing more to do
    assert act.inspect(BARE, Policy(name="p")).running is False


def test_replaced_pod_uid_conflict_and_gone(server: ActionServer) -> None:
    act = actions(server)
    other = {**BARE, "external_id": "00000000-0000-0000-0000-000000000000"}
    live = act.inspect(other, Policy(name="p"))
    assert live.running is False and live.state.startswith("replaced")
    # a stale decision that still tried: the API refuses the precondition (409), one-line error
    live = act.inspect(BARE, Policy(name="p"))
    live.detail["uid"] = other["external_id"]
    with pytest.raises(SourceError) as exc:
        act.execute(BARE, live)
    assert "HTTP 409 on delete_pod Pod research/prep-then-train: Precondition failed" in str(exc.value)
    gone = {**BARE, "name": "no-such-pod"}
    assert act.inspect(gone, Policy(name="p")).state == "gone"


def test_statefulset_scales_and_unknown_owner_is_not_acted_on(server: ActionServer) -> None:
    pod = server.replay.find("pods", "inference", "triton-mig-0")
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "triton",
                                           "uid": "5d0c7e51-0000-4000-8000-000000000001", "controller": True}]
    server.replay.data["statefulsets"].append(workload("StatefulSet", "inference", "triton",
                                                       "5d0c7e51-0000-4000-8000-000000000001", 2))
    act = actions(server)
    live = act.inspect(TRITON, Policy(name="p"))
    assert (live.action, live.target) == ("scale_to_zero", "StatefulSet inference/triton")
    assert act.execute(TRITON, live) == "scaled StatefulSet inference/triton to 0 replicas (had 2): HTTP 200"
    assert writes(server)[-1][:2] == ("PATCH", "/apis/apps/v1/namespaces/inference/statefulsets/triton/scale")
    pod["metadata"]["ownerReferences"][0]["kind"] = "DaemonSet"
    live = act.inspect(TRITON, Policy(name="p"))
    assert live.blocked == "owned by a DaemonSet: gpu-audit does not act on DaemonSets"


def test_cordoned_or_not_ready_node_is_infrastructure_trouble(server: ActionServer) -> None:
    node = server.replay.find("nodes", None, "gpu-node-a")
    node["spec"]["unschedulable"] = True
    assert actions(server).inspect(NOTEBOOK, Policy(name="p")).infra == "node gpu-node-a is cordoned"
    node["spec"]["unschedulable"] = False
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    ready["status"] = "Unknown"
    assert actions(server).inspect(NOTEBOOK, Policy(name="p")).infra == "node gpu-node-a Ready=Unknown"


def test_forbidden_write_names_the_actions_role(server: ActionServer, monkeypatch: pytest.MonkeyPatch) -> None:
    act = actions(server)
    live = act.inspect(NOTEBOOK, Policy(name="p"))
    orig = server.replay.act

    def deny(method: str, path: str, auth: str | None, ctype: str, body: bytes) -> tuple[int, Any]:
        if method == "PATCH":
            return 403, server.replay.status(403, "Forbidden", "deployments.apps \"notebook-alice\" is forbidden: "
                                             "User \"gpu-auditor\" cannot patch resource \"deployments/scale\"")
        return orig(method, path, auth, ctype, body)

    monkeypatch.setattr(server.replay, "act", deny)
    with pytest.raises(SourceError) as exc:
        act.execute(NOTEBOOK, live)
    assert "HTTP 403" in str(exc.value) and "rbac-actions.yaml" in str(exc.value) and "\n" not in str(exc.value)


def _rules(path: Path) -> dict[str, list[dict[str, Any]]]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return {d["metadata"]["name"]: d["rules"] for d in docs if d["kind"] == "ClusterRole"}


def test_reader_role_stays_read_only_and_actions_role_is_minimal() -> None:
    reader = _rules(ROOT / "deploy" / "kubernetes" / "base" / "rbac.yaml")
    assert {v for r in reader["gpu-audit-reader"] for v in r["verbs"]} == {"get", "list", "watch"}
    actions_ = _rules(ROOT / "deploy" / "kubernetes" / "enforcement" / "rbac-actions.yaml")
    assert list(actions_) == ["gpu-audit-actor"]
    granted = {(g, res, v) for r in actions_["gpu-audit-actor"] for g in r["apiGroups"] for res in r["resources"]
               for v in r["verbs"]}
    # exactly what connectors/actions/kubernetes.py calls, nothing more (no create, no secrets, no exec)
    # reads: the pod, its node, every owner in the chain (uid and selector checked) and the pods / ReplicaSets
    # an owner runs (the unit an action would stop)
    assert granted == {("", "pods", "get"), ("", "pods", "list"), ("", "pods", "delete"), ("", "nodes", "get"),
                       ("apps", "replicasets", "get"), ("apps", "replicasets", "list"),
                       ("apps", "deployments", "get"), ("apps", "statefulsets", "get"),
                       ("apps", "deployments/scale", "patch"), ("apps", "statefulsets/scale", "patch"),
                       ("batch", "jobs", "get"), ("batch", "cronjobs", "get"), ("batch", "jobs", "patch"),
                       ("batch", "jobs", "delete")}
