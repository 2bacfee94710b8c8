"""GPUs allocated through Dynamic Resource Allocation (issue 42 §3): the real ``kubernetes`` client against the
replay server (tests/k8s_server.py), serving the recorded v1.24 cluster plus a DRA node whose ResourceSlices,
ResourceClaims and pods are shaped as the ``resource.k8s.io/v1`` API reference documents them
(tests/fixtures/kubernetes/dra/README.md), and converted to v1beta2 / v1beta1 the way those versions differ."""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from k8s_server import DRA, FIXTURES, OPEN_WINDOW, TOKEN, TOKEN_ENV, K8sReplay, K8sServer, allocations, collect, load
from sqlalchemy import text

from auditor.audit.run import run_audit
from auditor.collect import collect as collect_all
from auditor.config import Config
from auditor.records import GpuBucket, GpuInventory, GpuWait
from auditor.store.engine import Store
from connectors import build
from connectors.base import Context, Problems, Window

DRA_CLUSTER = load("dra/cluster-v1.json")
UUID = [f"GPU-5b8c2a1e-7d40-4f0b-9e6a-3c1d2e4f{i:04d}" for i in range(8)]
H100 = "NVIDIA-H100-80GB-HBM3"


def v1beta2(obj: dict[str, Any]) -> dict[str, Any]:
    """v1beta2 has v1's shape (``exactly`` requests, flat devices) under another apiVersion."""
    out = copy.deepcopy(obj)
    out["apiVersion"] = "resource.k8s.io/v1beta2"
    return out


def v1beta1(obj: dict[str, Any]) -> dict[str, Any]:
    """v1beta1 (Kubernetes 1.32): a request names its class directly (no ``exactly``), a slice's device nests
    its attributes and capacity under ``basic`` (API reference resource-claim-v1beta1, resource-slice-v1beta1)."""
    out = copy.deepcopy(obj)
    out["apiVersion"] = "resource.k8s.io/v1beta1"
    if out["kind"] == "ResourceClaim":
        for req in out["spec"]["devices"]["requests"]:
            req.update(req.pop("exactly", {}))
    else:
        out["spec"]["devices"] = [{"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}}
                                  for d in out["spec"]["devices"]]
    return out


def replay(versions: list[str] | None = ("v1",), convert: Any = None) -> K8sReplay:  # type: ignore[assignment]
    """The recorded device-plugin cluster plus the DRA node, serving resource.k8s.io at ``versions``."""
    rec = K8sReplay()
    for kind in ("pods", "nodes"):
        rec.data[kind] = rec.data[kind] + copy.deepcopy(DRA_CLUSTER[kind])
    for kind in ("resourceclaims", "resourceslices"):
        rec.data[kind] = [convert(o) if convert else copy.deepcopy(o) for o in DRA_CLUSTER[kind]]
    if versions:
        rec.groups[DRA] = list(versions)
    return rec


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[K8sServer]:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with K8sServer(replay()) as srv:
        yield srv


def test_dra_pods_hold_their_exact_gpus(server: K8sServer) -> None:
    """Template claims and standalone claims resolve to the device each result names, its UUID from the
    ResourceSlice; a pod without an nvidia.com/gpu limit is no longer invisible. Before: none of these pods
    was an allocation."""
    got = allocations(collect(server))
    train = got["train-dra-0"]
    assert [(g.node, g.index, g.uuid, g.share, g.model) for g in train.gpus] == [
        ("gpu-node-d", 0, UUID[0], 1.0, H100), ("gpu-node-d", 1, UUID[1], 1.0, H100)]
    assert train.gpu_count == 2 and train.account == "ml-train" and train.state == "Running"
    assert [(g.index, g.uuid, g.share) for g in got["train-single"].gpus] == [(3, UUID[3], 1.0)]
    # a MIG device: the parent GPU's UUID, its profile, g/7 of the GPU; index unknown (per-instance telemetry)
    (mig,) = got["notebook-mig"].gpus
    assert (mig.index, mig.uuid, mig.mig_profile, mig.share) == (None, UUID[6], "1g.10gb", pytest.approx(1 / 7))
    # a CPU pod whose claim is a NIC (driver dra.net) holds no GPU
    assert "net-only" not in got


def test_a_claim_shared_by_two_pods_is_split(server: K8sServer) -> None:
    """One GPU, two pods in reservedFor: each holds half (docs/definitions.md "Shared DRA claims"), so the
    GPU is charged once, not twice."""
    got = allocations(collect(server))
    a, b = got["infer-shared-a"].gpus, got["infer-shared-b"].gpus
    assert [(g.uuid, g.share) for g in a] == [(g.uuid, g.share) for g in b] == [(UUID[2], 0.5)]


def test_device_plugin_and_dra_pods_in_one_cluster(server: K8sServer) -> None:
    """The recorded device-plugin pods are read as before beside the DRA ones; the DRA node's GPUs come into
    the inventory from its ResourceSlices (no nvidia.com/gpu capacity there), the MIG one with its layout."""
    records = collect(server)
    got = allocations(records)
    assert {"llama-ft-x7k2p", "triton-mig-0", "embedder-shared-0", "train-dra-0", "notebook-mig"} <= set(got)
    assert len(got["llama-ft-x7k2p"].gpus) == 4 and all(g.uuid is None for g in got["llama-ft-x7k2p"].gpus)
    inv = sorted((g.gpu, g.uuid, g.mig_layout, g.model) for g in records
                 if isinstance(g, GpuInventory) and g.host == "gpu-node-d")
    assert inv == [(i, UUID[i], "", H100) for i in range(6)] + [(6, UUID[6], "1g.10gb:7", H100)]
    assert {g.host for g in records if isinstance(g, GpuInventory)} >= {"gpu-node-a", "gpu-node-mig", "gpu-node-d"}


def test_a_pending_dra_pod_waits_for_what_its_claim_asks(server: K8sServer) -> None:
    """An unscheduled pod whose claim (from a template, not yet allocated) asks for 4 GPUs waits for 4."""
    waits = {w.name: w for w in collect(server) if isinstance(w, GpuWait)}
    assert waits["waiting-dra"].gpus == 4 and waits["waiting-dra"].end is None
    assert waits["waiting-for-gpus"].gpus == 8  # the recorded device-plugin one, unchanged


@pytest.mark.parametrize(("versions", "convert"), [(["v1beta2"], v1beta2), (["v1beta1"], v1beta1),
                                                   (["v1beta1", "v1beta2"], v1beta2)])
def test_older_api_versions(monkeypatch: pytest.MonkeyPatch, versions: list[str], convert: Any) -> None:
    """A 1.32 or 1.33 cluster serves only v1beta1 / v1beta2: the connector reads the version the server has
    (the newest), in that version's shape, with the same result."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with K8sServer(replay(versions, convert)) as srv:
        got = allocations(collect(srv))
        assert any(f"/apis/resource.k8s.io/{versions[-1]}/resourceclaims" in r for r in srv.replay.requests)
    assert [(g.index, g.uuid) for g in got["train-dra-0"].gpus] == [(0, UUID[0]), (1, UUID[1])]
    assert got["notebook-mig"].gpus[0].mig_profile == "1g.10gb"
    assert got["infer-shared-b"].gpus[0].share == 0.5


def test_a_cluster_without_the_api_is_skipped_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """No resource.k8s.io (a v1.24 server answers 404): one info line, said once, and the collection goes on
    with the device-plugin pods."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with K8sServer(replay(None)) as srv, caplog.at_level(logging.INFO, "gpu_audit.kubernetes"):
        conn = build("kubernetes", "allocations", {"host": srv.url, "token": {"env": TOKEN_ENV}},
                     Context("k8s-test"))
        got = allocations(list(conn.collect(OPEN_WINDOW, Problems())))
        list(conn.collect(OPEN_WINDOW, Problems()))
    assert "llama-ft-x7k2p" in got and "train-dra-0" not in got
    said = [r.getMessage() for r in caplog.records if "resource.k8s.io" in r.getMessage()]
    assert len(said) == 1 and "DRA skipped" in said[0]


def test_forbidden_claims_are_said_not_fatal(server: K8sServer) -> None:
    """RBAC without resourceclaims (an old deploy/kubernetes/rbac.yaml): the collection succeeds and its note
    names the missing permission."""
    server.replay.faults.forbidden = {"resourceclaims"}
    conn = build("kubernetes", "allocations", {"host": server.url, "token": {"env": TOKEN_ENV}},
                 Context("k8s-test"))
    got = allocations(list(conn.collect(OPEN_WINDOW, Problems())))
    assert "llama-ft-x7k2p" in got and "train-dra-0" not in got
    (note,) = conn.notes
    assert "missing permission 'list' on 'resourceclaims'" in note and "rbac.yaml" in note


def test_dra_gpus_in_the_store(store: Store, store_url: str, server: K8sServer, tmp_path: Path) -> None:
    """Both engines: a DRA pod's GPUs are stored with their UUID, index and share beside the device-plugin
    pods of the same cluster, and the DRA node's GPUs are in the inventory."""
    cfg = Config.model_validate({"store": {"url": store_url}, "clusters": [{"name": "k8s-test", "allocations": [
        {"kind": "kubernetes", "host": server.url, "token": {"env": TOKEN_ENV}}]}]})
    assert all(r.ok for r in collect_all(store, cfg, base_dir=tmp_path, now=datetime.now(UTC)).results)
    with store.engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT a.name, g.gpu_index, g.uuid, g.share, g.mig_profile FROM allocations a JOIN allocated_gpus g "
            "ON g.allocation_id = a.id WHERE a.name IN ('train-dra-0', 'infer-shared-a', 'notebook-mig', "
            "'llama-ft-x7k2p') ORDER BY a.name, g.slot")).all()
        inv = conn.execute(text("SELECT COUNT(*), COUNT(uuid) FROM gpu_inventory WHERE host = 'gpu-node-d'")).one()
    assert [tuple(r) for r in rows] == [
        ("infer-shared-a", 2, UUID[2], 0.5, None),
        *[("llama-ft-x7k2p", None, None, 1.0, None)] * 4,
        ("notebook-mig", None, UUID[6], pytest.approx(1 / 7), "1g.10gb"),
        ("train-dra-0", 0, UUID[0], 1.0, None), ("train-dra-0", 1, UUID[1], 1.0, None)]
    assert tuple(inv) == (7, 7)


def test_fixture_readme_names_every_object() -> None:
    readme = (FIXTURES / "dra" / "README.md").read_text()
    for kind in ("pods", "resourceclaims", "resourceslices"):
        for obj in DRA_CLUSTER[kind]:
            assert obj["metadata"]["name"] in readme, obj["metadata"]["name"]


def test_dcgm_exporter_dra_labels(tmp_path: Path) -> None:
    """dcgm-exporter's series for GPUs held through claims carry dra_claim_name, dra_claim_namespace,
    dra_device_name, dra_driver_name, dra_pool_name beside pod/namespace (the Kubernetes docs' example of the
    kubelet PodResources API with DRA: two pods sharing claim single-gpu on GPU 0). Here also a two-node job
    holding every GPU of both nodes through claims (train-0 on node-x, train-1 on node-y): without the DRA
    labels that is the shape of an exporter DaemonSet, and its pods were dropped as exporters (job "")."""
    t = int(datetime(2026, 11, 2, 10, 0, tzinfo=UTC).timestamp())
    series = [("sc-node", 0, "gpu-test3", "pod1", "single-gpu", "gpu-0"),
              ("sc-node", 0, "gpu-test3", "pod2", "single-gpu", "gpu-0")]
    series += [(node, g, "ml", pod, f"{pod}-gpus-x7k2p", f"gpu-{g}") for node, pod in (("node-x", "train-0"),
                                                                                         ("node-y", "train-1"))
               for g in (0, 1)]
    lines = []
    for i in range(10):
        ts = (t + 30 * i) * 1000
        for host, g, ns, pod, claim, dev in series:
            lines.append(f'DCGM_FI_PROF_SM_ACTIVE{{gpu="{g}",UUID="GPU-{host}-{g}",device="nvidia{g}",'
                         f'modelName="NVIDIA GH200 96GB HBM3",Hostname="{host}",container="ctr",'
                         f'dra_claim_name="{claim}",dra_claim_namespace="{ns}",dra_device_name="{dev}",'
                         f'dra_driver_name="gpu.nvidia.com",dra_pool_name="{host}",namespace="{ns}",'
                         f'pod="{pod}"}} 0.5 {ts}')
    (tmp_path / "m.prom").write_text("\n".join(lines) + "\n")
    src = build("scrape", "telemetry", {"paths": [str(tmp_path / "m.prom")]}, Context("k8s"))
    rows = list(src.collect(Window(datetime.fromtimestamp(t, UTC), datetime.fromtimestamp(t + 300, UTC)),
                            Problems()))
    assert {(b.host, b.gpu, b.job) for b in rows} == {
        ("sc-node", 0, "gpu-test3/pod1"), ("sc-node", 0, "gpu-test3/pod2"), ("node-x", 0, "ml/train-0"),
        ("node-x", 1, "ml/train-0"), ("node-y", 0, "ml/train-1"), ("node-y", 1, "ml/train-1")}


def test_dra_gpus_are_attributed_by_uuid(store: Store, store_url: str, server: K8sServer, tmp_path: Path) -> None:
    """Both engines. The NVIDIA DRA driver's current releases publish no index attribute (only uuid, and a device
    name from the minor number), so train-dra-0 holds 2 GPUs known by UUID only; DCGM numbers them differently
    (here GPU ...0000 is index 5, ...0001 index 4). The audit ties each to the telemetry GPU of its UUID
    (attribution uuid), not by slot or by guess. Before: unattributed (no pod labels in this telemetry)."""
    for s in server.replay.data["resourceslices"]:
        for d in s["spec"]["devices"]:
            d.get("attributes", {}).pop("index", None)
    cfg = Config.model_validate({"store": {"url": store_url}, "clusters": [{"name": "k8s-test", "allocations": [
        {"kind": "kubernetes", "host": server.url, "token": {"env": TOKEN_ENV}}]}]})
    assert all(r.ok for r in collect_all(store, cfg, base_dir=tmp_path, now=datetime.now(UTC)).results)
    t0 = datetime(2026, 11, 29, 12, tzinfo=UTC)
    store.ingest([GpuBucket("k8s-test", "gpu-node-d", 5 - i, t0 + timedelta(minutes=5 * k), 300, 10, uuid=UUID[i],
                            sm_active=0.0, gpu_util=0.0) for i in range(6) for k in range(12)],
                 seen_at_ts=int(t0.timestamp()) + 3600)
    run = run_audit(store, cfg, t0, t0 + timedelta(hours=1))
    with store.engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT ag.uuid, u.attribution, u.gpu_index, tg.uuid AS tuuid, u.idle_s FROM usage_gpu u "
            "JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id JOIN allocations a ON a.id = ag.allocation_id "
            "LEFT JOIN telemetry_gpus tg ON tg.id = u.gpu_id WHERE u.run_id = :r AND a.name = 'train-dra-0' "
            "ORDER BY ag.uuid"), {"r": run.run_id}).all()
    assert [(r.uuid, r.attribution, r.gpu_index, r.tuuid) for r in rows] == [
        (UUID[0], "uuid", 5, UUID[0]), (UUID[1], "uuid", 4, UUID[1])]
    assert all(r.idle_s == pytest.approx(3600) for r in rows)


@pytest.mark.parametrize("other", ["3g.40gb", "1g.10gb"])
def test_dra_mig_device_is_attributed_to_its_instance(store: Store, store_url: str, server: K8sServer,
                                                       tmp_path: Path, other: str) -> None:
    """Both engines. notebook-mig holds a 1g.10gb MIG device of the GPU ...0006 through its claim (the
    ResourceSlice's parentUUID and profile). Telemetry (no pod labels) reports two instances of that parent:
    GPU_I_ID 3 as 1g.10gb, idle, and GPU_I_ID 1 as ``other``, busy. With one 1g.10gb instance the device is
    that instance (attribution uuid, gpu_instance 3, its hour idle: 3600 s x 1/7 of the GPU); with two
    (``other`` 1g.10gb too) the labels here cannot say which, so it stays unattributed, never a guess.
    Before: unattributed in both cases (MIG devices were left to the pod labels)."""
    cfg = Config.model_validate({"store": {"url": store_url}, "clusters": [{"name": "k8s-test", "allocations": [
        {"kind": "kubernetes", "host": server.url, "token": {"env": TOKEN_ENV}}]}]})
    assert all(r.ok for r in collect_all(store, cfg, base_dir=tmp_path, now=datetime.now(UTC)).results)
    t0 = datetime(2026, 11, 29, 12, tzinfo=UTC)
    store.ingest([GpuBucket("k8s-test", "gpu-node-d", 6, t0 + timedelta(minutes=5 * k), 300, 10, uuid=UUID[6],
                            model=f"NVIDIA H100 80GB HBM3 MIG {prof}", gpu_instance=gi, gr_engine=act,
                            tensor_active=act, dram_active=act)
                  for gi, prof, act in (("3", "1g.10gb", 0.0), ("1", other, 0.9)) for k in range(12)],
                 seen_at_ts=int(t0.timestamp()) + 3600)
    run = run_audit(store, cfg, t0, t0 + timedelta(hours=1))
    with store.engine.connect() as conn:
        (row,) = conn.execute(text(
            "SELECT u.attribution, tg.gpu_instance, u.idle_s FROM usage_gpu u "
            "JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id JOIN allocations a ON a.id = ag.allocation_id "
            "LEFT JOIN telemetry_gpus tg ON tg.id = u.gpu_id WHERE u.run_id = :r AND a.name = 'notebook-mig'"),
            {"r": run.run_id}).all()
    if other == "3g.40gb":
        assert (row.attribution, row.gpu_instance) == ("uuid", "3")
        assert row.idle_s == pytest.approx(3600 / 7)
    else:
        assert (row.attribution, row.gpu_instance) == ("unattributed", None)
