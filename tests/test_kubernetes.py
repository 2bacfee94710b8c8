"""Kubernetes connector over HTTP: the real ``kubernetes`` client against tests/k8s_server.py, which
replays responses recorded from a real kube-apiserver v1.24 (tests/fixtures/kubernetes/README.md).
With GPU_AUDIT_TEST_KUBECONFIG set, the cluster-agnostic tests also run against that real cluster."""

from __future__ import annotations

import copy
import json
import logging
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from k8s_server import FIXTURES, TOKEN, K8sReplay, K8sServer, load
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from auditor.errors import SourceError
from auditor.records import Allocation, GpuInventory, KubeJob
from connectors import build, connector_class
from connectors.base import Context, Problems, RunningSnapshot, Window

REAL_KUBECONFIG = os.environ.get("GPU_AUDIT_TEST_KUBECONFIG")
WINDOW = Window(datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC))
TOKEN_ENV = "GPU_AUDIT_TEST_K8S_TOKEN"
CHECK = json.loads((FIXTURES / "client-check.json").read_text())


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[K8sServer]:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with K8sServer() as srv:
        yield srv


def connector(srv: K8sServer, page_size: int | None = None, **options: Any) -> Any:
    """A source of the replay server; ``page_size`` pages its listings smaller than PAGE_SIZE (an option until
    issue 45) so a small fixture spans pages."""
    opts = {"host": srv.url, "token": {"env": TOKEN_ENV}, **options}
    conn = build("kubernetes", "allocations", opts, Context("k8s-test"))
    if page_size is not None:
        conn.page_size = page_size
    return conn


def collect(conn: Any, problems: Problems | None = None) -> list[Any]:
    return list(conn.collect(WINDOW, problems or Problems()))


def by_name(records: list[Any]) -> dict[str, Allocation]:
    return {r.name: r for r in records if isinstance(r, Allocation)}


def ts(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text).astimezone(UTC) if text else None


# -- what the recorded cluster holds -----------------------------------------------------------------
def test_every_gpu_pod_matches_the_reference_reading(server: K8sServer) -> None:
    """client-check.json is the reference reading done when recording: each scheduled GPU pod appears
    once with its GPU units, node, times, first owner and labels; CPU-only and unscheduled pods do not."""
    allocs = by_name(collect(connector(server)))
    expected = [p for p in CHECK["gpu_pod_table"] if p["gpu"] and p["node"]]
    assert sorted(allocs) == sorted(p["pod"] for p in expected)
    for ref in expected:
        a = allocs[ref["pod"]]
        assert a.account == ref["ns"] and a.source == "kubernetes" and a.cluster == "k8s-test"
        assert len(a.gpus) == sum(ref["gpu"].values())
        assert {g.node for g in a.gpus} == {ref["node"]}
        assert (a.start, a.end) == (ts(ref["start"]), ts(ref["end"]))
        assert a.state == ref["phase"]
        # a Failed pod's allocation also says why it failed (the recorded crashed-eval: its container OOMKilled)
        assert a.labels == ref["labels"]
        assert a.failure_reason == ("OOMKilled" if ref["phase"] == "Failed" else "")
        if ref["owner"]:
            assert a.owner_workload.split("/")[0] in ("Job", "CronJob", "Deployment")
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in load("pods-all.json")["items"]}
    assert all(a.external_id == uids[name] for name, a in allocs.items())


def test_readme_table_shares_owners_and_times(server: K8sServer) -> None:
    """The README table: init container max, time-sliced quarter, MIG sevenths, owners, ended pods."""
    allocs = by_name(collect(connector(server)))
    assert "waiting-for-gpus" not in allocs and "etl-cpu-only" not in allocs
    prep = allocs["prep-then-train"]
    assert prep.gpu_count == 2 and prep.end is None and prep.user == "bob"
    shared = allocs["embedder-shared-0"]
    assert [(g.share, g.model) for g in shared.gpus] == [(0.25, "NVIDIA-L4")]
    mig = allocs["triton-mig-0"]
    assert [(Fraction(g.share).limit_denominator(10), g.mig_profile) for g in mig.gpus] == \
        [(Fraction(1, 7), "1g.10gb")] * 2
    assert mig.start == datetime(2026, 11, 27, 12, 31, 58, tzinfo=UTC) and mig.end is None
    notebook = allocs["notebook-alice-6d5f8b7c9-tx2lq"]
    assert notebook.owner_workload == "Deployment/notebook-alice" and notebook.user == "alice"
    assert allocs["llama-ft-x7k2p"].owner_workload == "Job/llama-ft"
    assert allocs["llama-ft-x7k2p"].labels["team"] == "nlp"
    sweep = allocs["resnet-sweep-7-q9d4m"]
    assert sweep.state == "Succeeded" and sweep.gpu_count == 8
    assert sweep.end == datetime(2026, 11, 29, 8, 31, 58, tzinfo=UTC)
    crashed = allocs["crashed-eval"]
    assert crashed.state == "Failed" and crashed.end == datetime(2026, 11, 29, 11, 1, 58, tzinfo=UTC)
    assert all(g.model == "NVIDIA-H100-80GB-HBM3" and g.index is None
               for name in ("llama-ft-x7k2p", "prep-then-train") for g in allocs[name].gpus)


def test_inventory_of_gpu_nodes(server: K8sServer) -> None:
    inv = [r for r in collect(connector(server)) if isinstance(r, GpuInventory)]
    per_host: dict[str, list[GpuInventory]] = {}
    for g in inv:
        per_host.setdefault(g.host, []).append(g)
    assert [g.gpu for g in per_host["gpu-node-a"]] == list(range(8))
    assert [g.gpu for g in per_host["gpu-node-b"]] == list(range(8))
    assert {g.model for g in per_host["gpu-node-a"]} == {"NVIDIA-H100-80GB-HBM3"}
    assert len(per_host["gpu-node-mig"]) == 2
    assert {g.mig_layout for g in per_host["gpu-node-mig"]} == {"1g.10gb:7,3g.40gb:2"}
    assert [(g.gpu, g.model) for g in per_host["gpu-node-ts"]] == [(0, "NVIDIA-L4")]
    assert "cpu-node-1" not in per_host
    assert all(g.seen_at is not None and g.seen_at.tzinfo is UTC for g in inv)


def test_snapshot_follows_a_complete_listing_and_paging_changes_nothing(server: K8sServer) -> None:
    small = collect(connector(server, page_size=3))
    assert isinstance(small[-1], RunningSnapshot) and small[-1].source == "kubernetes"
    assert sum(isinstance(r, RunningSnapshot) for r in small) == 1
    pod_requests = [r for r in server.replay.requests if r.startswith("/api/v1/pods")]
    # 8 scheduled pods in pages of 3, then the unscheduled Pending ones (the waiting demand) in one page
    assert len(pod_requests) == 4 and all("fieldSelector=spec.nodeName%21%3D" in r for r in pod_requests[:3])
    assert "fieldSelector=spec.nodeName%3D%2Cstatus.phase%3DPending" in pod_requests[3]
    big = collect(connector(server, page_size=500))
    assert by_name(small) == by_name(big)


def test_namespace_filter_lists_per_namespace_with_a_scoped_snapshot(server: K8sServer) -> None:
    records = collect(connector(server, namespaces=["research"]))
    assert sorted(by_name(records)) == ["notebook-alice-6d5f8b7c9-tx2lq", "prep-then-train"]
    snaps = [r for r in records if isinstance(r, RunningSnapshot)]
    assert len(snaps) == 1 and snaps[0].accounts == ("research",)
    assert any(r.startswith("/api/v1/namespaces/research/pods") for r in server.replay.requests)
    assert by_name(records)["notebook-alice-6d5f8b7c9-tx2lq"].owner_workload == "Deployment/notebook-alice"


def test_team_label_and_registry(server: K8sServer) -> None:
    assert connector_class("kubernetes", "allocations").name == "kubernetes"
    allocs = by_name(collect(connector(server, team_label="tier")))
    assert allocs["triton-mig-0"].labels["team"] == "serving"


# -- faults --------------------------------------------------------------------------------------------
def test_401_is_one_line_without_the_token(server: K8sServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "wrong-secret-value-123")
    with pytest.raises(SourceError) as err:
        collect(connector(server))
    text = str(err.value)
    assert "401" in text and "\n" not in text and "wrong-secret-value-123" not in text


def test_403_names_the_missing_permission(server: K8sServer) -> None:
    server.replay.faults.forbidden = {"pods"}
    with pytest.raises(SourceError) as err:
        collect(connector(server))
    text = str(err.value)
    assert "'list' on 'pods'" in text and "403" in text and "\n" not in text and TOKEN not in text


def test_403_on_replicasets_degrades_owner_only(server: K8sServer, caplog: pytest.LogCaptureFixture) -> None:
    server.replay.faults.forbidden = {"replicasets"}
    with caplog.at_level(logging.WARNING, "gpu_audit.kubernetes"):
        allocs = by_name(collect(connector(server)))
    assert allocs["notebook-alice-6d5f8b7c9-tx2lq"].owner_workload == "ReplicaSet/notebook-alice-6d5f8b7c9"
    assert "'list' on 'replicasets'" in caplog.text


def test_410_on_continue_relists_without_double_counting(server: K8sServer) -> None:
    server.replay.faults.expire_continue = 1
    records = collect(connector(server, page_size=3))
    allocs = [r for r in records if isinstance(r, Allocation)]
    assert len(allocs) == len({a.external_id for a in allocs}) == 7
    firsts = [r for r in server.replay.requests if r.startswith("/api/v1/pods") and "continue=" not in r
              and "status.phase" not in r]  # not the Pending pods' listing (the waiting demand)
    assert len(firsts) == 2  # the listing restarted from the beginning


def test_410_forever_gives_up(server: K8sServer) -> None:
    server.replay.faults.expire_continue = 99
    with pytest.raises(SourceError, match="410") as err:
        collect(connector(server, page_size=3))
    assert err.value.transient


def test_page_failing_mid_list_yields_nothing(server: K8sServer) -> None:
    server.replay.faults.fail_page = 2
    seen: list[Any] = []
    with pytest.raises(SourceError, match="HTTP 500") as err:
        for record in connector(server, page_size=3).collect(WINDOW, Problems()):
            seen.append(record)
    assert seen == [] and err.value.transient


def test_timeout_is_a_transient_source_error(server: K8sServer) -> None:
    server.replay.faults.delay_s = 2.0
    start = datetime.now(UTC)
    with pytest.raises(SourceError, match="timeout_s=0.3") as err:
        collect(connector(server, timeout_s=0.3))
    assert err.value.transient and (datetime.now(UTC) - start).total_seconds() < 2.0


def test_bad_objects_are_quarantined_and_the_rest_kept(server: K8sServer) -> None:
    base = next(p for p in server.replay.data["pods"] if p["metadata"]["name"] == "llama-ft-x7k2p")

    def variant(name: str, **changes: Any) -> dict[str, Any]:
        pod = copy.deepcopy(base)
        pod["metadata"].update(name=name, uid=f"uid-{name}")
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        for key, value in changes.items():
            if key == "status":
                pod.pop("status")
            else:
                limits[key.replace("_", "/").replace("nvidia/com", "nvidia.com")] = value
                pod["spec"]["containers"][0]["resources"]["requests"].pop("nvidia.com/gpu")
        return pod

    bad = [variant("no-status", status=None), variant("milli", nvidia_com_gpu="500m"),
           variant("kilo", nvidia_com_gpu="1k")]
    odd = variant("odd-resource", nvidia_com_gpu="1")
    odd["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/fpga"] = "1"
    server.replay.data["pods"] = [*server.replay.data["pods"], *bad, odd]
    problems = Problems()
    allocs = by_name(collect(connector(server), problems))
    assert len(allocs) == 8 and allocs["odd-resource"].gpu_count == 1
    where = {loc: reason for _, loc, reason, _ in problems.items}
    assert where["pod ml-train/no-status"] == "missing status"
    assert "500m" in where["pod ml-train/milli"] and "1k" in where["pod ml-train/kilo"]
    assert "nvidia.com/fpga" in where["pod ml-train/odd-resource"]
    assert problems.total == 4


def test_watch_mode_follows_changes_and_relists_on_410(server: K8sServer, monkeypatch: pytest.MonkeyPatch) -> None:
    import connectors.kubernetes as k8s

    monkeypatch.setattr(k8s, "WATCH_S", 1)
    conn = connector(server, mode="watch")
    first = collect(conn)
    assert isinstance(first[-1], RunningSnapshot)
    changes = collect(conn)  # the recorded probe pod: Pending, Running, terminating, deleted
    assert [(a.name, a.end) for a in changes if not isinstance(a, KubeJob)] == \
        [("watch-probe", datetime(2026, 11, 29, 14, 32, 1, tzinfo=UTC))]
    assert any("watch=true" in r and "resourceVersion=240" in r for r in server.replay.requests)
    # resumed after the last seen resourceVersion: nothing new but the GPU Jobs' counts, listed every time
    assert [(type(r).__name__, r.name) for r in collect(conn)] == [("KubeJob", "llama-ft"),
                                                                    ("KubeJob", "resnet-sweep-7")]
    server.replay.faults.watch_expired = True
    relisted = collect(conn)
    assert isinstance(relisted[-1], RunningSnapshot) and len(by_name(relisted)) == 7


def test_verify_tls_off_is_logged(server: K8sServer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "gpu_audit.kubernetes"):
        collect(connector(server, verify_tls=False))
    assert "TLS verification" in caplog.text and TOKEN not in caplog.text


# -- the replay server reproduces the recorded API behaviour (real client, real HTTP) ------------------
def typed_core(srv: K8sServer) -> client.CoreV1Api:
    cfg = client.Configuration(host=srv.url)
    cfg.api_key = {"authorization": TOKEN}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    return client.CoreV1Api(client.ApiClient(cfg))


def test_server_selectors_match_the_recorded_counts(server: K8sServer) -> None:
    core, counts = typed_core(server), CHECK["counts"]
    assert len(core.list_pod_for_all_namespaces().items) == counts["all"]
    assert len(core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=").items) == \
        counts["scheduled(spec.nodeName!=)"]
    assert len(core.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-node-a").items) == \
        counts["on gpu-node-a"]
    assert len(core.list_pod_for_all_namespaces(field_selector="status.phase=Running").items) == \
        counts["phase=Running"]
    terms = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
    assert len(core.list_pod_for_all_namespaces(field_selector=terms).items) == \
        counts["scheduled & not terminal"]
    assert len(core.list_pod_for_all_namespaces(label_selector="job-name").items) == \
        counts["label job-name exists"]
    assert len(core.list_namespaced_pod("research", label_selector="owner in (alice,bob),app!=big-train")
               .items) == counts["research owner in (alice,bob),app!=big-train"]
    assert len(core.list_node(label_selector="nvidia.com/gpu.present=true").items) == \
        len(load("nodes-gpu.json")["items"])
    page = core.list_pod_for_all_namespaces(limit=3)
    assert len(page.items) == CHECK["pagination"]["page1"] and page.metadata.var_continue
    assert page.metadata.remaining_item_count == CHECK["pagination"]["remaining_item_count"]


@pytest.mark.parametrize(("call", "fixture", "status"), [
    ({"field_selector": "spec.containers.resources"}, "error-400-field-label.json", 400),
    ({"label_selector": "owner in b"}, "error-400-label-selector.json", 400),
    ({"_continue": "bad!token"}, "error-continue.json", 400),
])
def test_server_answers_the_recorded_error_bodies(server: K8sServer, call: dict[str, str], fixture: str,
                                                  status: int) -> None:
    with pytest.raises(ApiException) as err:
        typed_core(server).list_pod_for_all_namespaces(**call)
    assert err.value.status == status and json.loads(err.value.body) == load(fixture)


def test_server_requires_the_bearer_token(server: K8sServer) -> None:
    cfg = client.Configuration(host=server.url)
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(client.ApiClient(cfg)).list_node()
    assert err.value.status == 401 and json.loads(err.value.body) == load("error-401.json")
    assert client.VersionApi(typed_core(server).api_client).get_code().git_version == "v1.24.0+0"


# -- the same connector against a real cluster, when one is configured ---------------------------------
def typed_reading(core: client.CoreV1Api) -> dict[str, float]:
    """Independent reading through client models: pod UID -> GPUs held (containers sum vs init max)."""
    out: dict[str, float] = {}
    for pod in core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=").items:
        def units(containers: list[Any] | None) -> list[int]:
            return [sum(int(v) for k, v in ((c.resources and c.resources.limits) or {}).items()
                        if k.startswith("nvidia.com/gpu") or k.startswith("nvidia.com/mig-"))
                    for c in containers or []]
        held = max(sum(units(pod.spec.containers)), max(units(pod.spec.init_containers) or [0]))
        if held and pod.status and pod.status.start_time:
            out[pod.metadata.uid] = held
    return out


@pytest.fixture(params=["replay", "real"])
def target(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
           ) -> Iterator[tuple[Any, client.CoreV1Api]]:
    if request.param == "real":
        if not REAL_KUBECONFIG:
            pytest.skip("GPU_AUDIT_TEST_KUBECONFIG is not set (optional real-cluster run)")
        from kubernetes import config
        conn = build("kubernetes", "allocations", {"kubeconfig": REAL_KUBECONFIG}, Context("real", Path(".")))
        yield conn, client.CoreV1Api(config.new_client_from_config(config_file=REAL_KUBECONFIG))
        return
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with K8sServer(K8sReplay()) as srv:
        yield connector(srv, page_size=2), typed_core(srv)


def test_connector_agrees_with_a_typed_client_reading(target: tuple[Any, client.CoreV1Api]) -> None:
    conn, core = target
    problems = Problems()
    records = collect(conn, problems)
    allocs = [r for r in records if isinstance(r, Allocation)]
    assert isinstance(records[-1], RunningSnapshot)
    assert {a.external_id: len(a.gpus) for a in allocs} == typed_reading(core)
    now = datetime.now(UTC)
    for a in allocs:
        assert a.start is not None and a.start.tzinfo is UTC and a.account and a.gpus
        assert all(0 < g.share <= 1 and g.node for g in a.gpus)
        # issue 14 §3b, on any cluster: never an end in the future (deletionTimestamp includes the grace
        # period), never an end before the start, and a Terminating pod still running stays open
        assert a.end is None or a.start <= a.end <= now, (a.name, a.start, a.end)
    starts = typed_starts(core)
    assert {a.external_id: a.start for a in allocs} == {k: v for k, v in starts.items() if k in
                                                         {a.external_id for a in allocs}}


def typed_starts(core: client.CoreV1Api) -> dict[str, datetime | None]:
    """Independent reading of each pod's start: startTime, else (bound via pods/binding, no startTime
    yet) the earliest container start."""
    out: dict[str, datetime | None] = {}
    for p in core.list_pod_for_all_namespaces().items:
        st = p.status
        times = [t for cs in (st.container_statuses or []) + (st.init_container_statuses or [])
                 for s in (cs.state, cs.last_state) if s
                 for t in ((s.running.started_at if s.running else None),
                           (s.terminated.started_at if s.terminated else None)) if t]
        out[p.metadata.uid] = st.start_time or (min(times) if times else None)
    return out


def test_time_slicing_labels_cronjob_chain_and_terminating_pods(server: K8sServer) -> None:
    """Variants of the recorded objects: node b time-sliced x2 (resource still nvidia.com/gpu), the
    sweep Job owned by a CronJob, and the llama pod being deleted."""
    data = server.replay.data
    node_b = next(n for n in data["nodes"] if n["metadata"]["name"] == "gpu-node-b")
    node_b["metadata"]["labels"].update({"nvidia.com/gpu.replicas": "2",
                                         "nvidia.com/gpu.sharing-strategy": "time-slicing"})
    sweep = next(j for j in data["jobs"] if j["metadata"]["name"] == "resnet-sweep-7")
    sweep["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "CronJob",
                                             "name": "resnet-sweep", "uid": "cj-1", "controller": True}]
    llama = next(p for p in data["pods"] if p["metadata"]["name"] == "llama-ft-x7k2p")
    llama["metadata"]["deletionTimestamp"] = "2026-11-29T14:40:00Z"
    allocs = by_name(collect(connector(server)))
    assert allocs["resnet-sweep-7-q9d4m"].owner_workload == "CronJob/resnet-sweep"
    assert allocs["resnet-sweep-7-q9d4m"].gpu_count == 4  # 8 replicas of a 2x time-sliced GPU
    assert allocs["prep-then-train"].gpu_count == 1
    assert allocs["llama-ft-x7k2p"].state == "Terminating"
    assert allocs["llama-ft-x7k2p"].end == datetime(2026, 11, 29, 14, 40, tzinfo=UTC)
    assert allocs["llama-ft-x7k2p"].gpu_count == 4  # node a is not time-sliced


def test_rbac_is_read_only_and_covers_what_the_connector_lists() -> None:
    import yaml

    from connectors.kubernetes import LISTS

    docs = list(yaml.safe_load_all((Path(__file__).parents[1] / "deploy/kubernetes/base/rbac.yaml").read_text()))
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    granted = {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert {v for rule in role["rules"] for v in rule["verbs"]} == {"get", "list", "watch"}
    assert {(group, resource.split(".")[0]) for resource, (group, _, _) in LISTS.items()} <= granted
    from connectors.k8s_queues import CRDS

    assert {(group, plural) for crds in CRDS.values() for group, _, plural in crds.values()} <= granted
    binding = next(d for d in docs if d["kind"] == "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-audit", "namespace": "gpu-audit"}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_every_option_is_documented() -> None:
    from connectors.kubernetes import KubernetesOptions

    text = (Path(__file__).parents[1] / "docs/kubernetes.md").read_text()
    rows = {line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| `kubernetes.")}
    assert rows == {f"`kubernetes.{name}`" for name in KubernetesOptions.model_fields}
    assert all(f.description for f in KubernetesOptions.model_fields.values())


def test_kubeconfig_context_selects_the_cluster(server: K8sServer, tmp_path: Path) -> None:
    """The kubeconfig path is relative to the config directory and `context` picks the entry."""
    import yaml

    kubeconfig = {
        "apiVersion": "v1", "kind": "Config", "current-context": "elsewhere",
        "clusters": [{"name": "replay", "cluster": {"server": server.url}},
                     {"name": "nowhere", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "auditor", "user": {"token": TOKEN}}],
        "contexts": [{"name": "replay", "context": {"cluster": "replay", "user": "auditor"}},
                     {"name": "elsewhere", "context": {"cluster": "nowhere", "user": "auditor"}}]}
    (tmp_path / "kube.yaml").write_text(yaml.safe_dump(kubeconfig))
    conn = build("kubernetes", "allocations", {"kubeconfig": "kube.yaml", "context": "replay"},
                 Context("k8s-test", tmp_path))
    assert len(by_name(collect(conn))) == 7
    missing = build("kubernetes", "allocations", {"kubeconfig": "nope.yaml"}, Context("k8s-test", tmp_path))
    with pytest.raises(SourceError, match="cannot load client configuration"):
        collect(missing)


def test_in_cluster_outside_a_pod_is_a_source_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    conn = build("kubernetes", "allocations", {"in_cluster": True}, Context("k8s-test"))
    with pytest.raises(SourceError, match="cannot load client configuration") as err:
        collect(conn)
    assert "\n" not in str(err.value)


def test_options_reject_contradictions() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="watches all namespaces"):
        build("kubernetes", "allocations", {"mode": "watch", "namespaces": ["a"]}, Context("k"))
    with pytest.raises(ValidationError, match="needs `host`"):
        build("kubernetes", "allocations", {"token": {"env": "X"}}, Context("k"))
