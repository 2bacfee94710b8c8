"""Workload labels as a REAL Prometheus stores them (issue 42 section 1): a prometheus process of this module's
own (Debian's package) scrapes loopback dcgm-exporter pages this module serves, every second, through the
relabel rules the Prometheus Operator generates for a ServiceMonitor (prometheus-operator
pkg/prometheus/promcfg.go: the target's namespace, service, pod, container, job and endpoint labels), once
with ``honor_labels: false`` (the Operator's default: the exporter's pod/namespace/container arrive as
``exported_*`` and ``pod`` is the exporter's own pod), once with ``honor_labels: true``, and once with the
site's metricRelabelings renaming ``exported_*`` to ``workload_*`` (read through the label map).

Four nodes, two GPUs each, one exporter pod per node (a DaemonSet): node-a GPU 0 runs team-a/train-0
(container trainer), node-b GPU 0 runs team-b/notebook-1, every other GPU is idle (dcgm-exporter puts no pod
label on it). Nodes a and b's exporters are named as the GPU Operator names them (nvidia-dcgm-exporter-*);
nodes c and d's as a site's own DaemonSet (gpu-telemetry-*), which no name pattern knows. By hand: in every
convention node-a GPU 0's rows carry job team-a/train-0, node-b GPU 0's team-b/notebook-1, and every other
GPU's rows carry no job (never an exporter's pod)."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from helpers import free_port
from sqlalchemy import text

from auditor.audit.run import run_audit
from auditor.collect import collect
from auditor.config import Config
from auditor.records import GpuBucket
from connectors import build
from connectors.base import Context, Problems, Window
from connectors.prometheus import PrometheusTelemetry
from connectors.scrape import ScrapeFiles
from connectors.workload import Workload, WorkloadOptions
from tests.conftest import need, run_cli

ROOT = Path(__file__).resolve().parents[1]
NODES = {"node-a": "nvidia-dcgm-exporter-7xk2p", "node-b": "nvidia-dcgm-exporter-q9d4m",
         "node-c": "gpu-telemetry-5hc8w", "node-d": "gpu-telemetry-b2n6r"}
#: (node, gpu) -> (namespace, pod, container) of the workload dcgm-exporter reports on it
WORKLOADS = {("node-a", 0): ("team-a", "train-0", "trainer"), ("node-b", 0): ("team-b", "notebook-1", "lab")}
SM = {("node-a", 0): 0.8, ("node-b", 0): 0.01}
#: the scrape jobs: (job name, honor_labels, metric relabelling)
JOBS = {"dcgm-honor-false": (False, ""), "dcgm-honor-true": (True, ""),
        "dcgm-relabelled": (False, "    metric_relabel_configs:\n"
                                   "      - {action: labelmap, regex: 'exported_(pod|namespace|container)', "
                                   "replacement: 'workload_$1'}\n"
                                   "      - {action: labeldrop, regex: 'exported_(pod|namespace|container)'}\n")}
EXPECTED = {("node-a", 0): "team-a/train-0", ("node-a", 1): "", ("node-b", 0): "team-b/notebook-1",
            ("node-b", 1): "", ("node-c", 0): "", ("node-c", 1): "", ("node-d", 0): "", ("node-d", 1): ""}


def page(node: str) -> str:
    """One dcgm-exporter page (its default counters' names and labels; pod labels only on a GPU in use)."""
    out = ["# HELP DCGM_FI_PROF_SM_ACTIVE Ratio of cycles an SM has at least 1 warp assigned.",
           "# TYPE DCGM_FI_PROF_SM_ACTIVE gauge", "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
           "# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    for gpu in (0, 1):
        labels = (f'gpu="{gpu}",UUID="GPU-{node}-{gpu}",pci_bus_id="00000000:0{gpu + 1}:00.0",device="nvidia{gpu}",'
                  f'modelName="NVIDIA H100 80GB HBM3",Hostname="{node}",DCGM_FI_DRIVER_VERSION="570.124.06"')
        if (node, gpu) in WORKLOADS:
            ns, pod, container = WORKLOADS[(node, gpu)]
            labels += f',container="{container}",namespace="{ns}",pod="{pod}"'
        sm = SM.get((node, gpu), 0.0)
        out += [f"DCGM_FI_PROF_SM_ACTIVE{{{labels}}} {sm}", f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {round(sm * 100)}"]
    return "\n".join(out) + "\n"


class _Exporter(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = page(self.server.node).encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def scrape_config(ports: dict[str, int]) -> str:
    """prometheus.yml: per job, the ServiceMonitor's targets (one exporter pod per node, its Kubernetes meta
    labels as endpoints discovery would give them) and the relabel rules the Operator generates."""
    out = ["global: {scrape_interval: 1s, evaluation_interval: 1s}", "scrape_configs:"]
    for job, (honor, metric_relabel) in JOBS.items():
        out += [f"  - job_name: serviceMonitor/gpu-operator/{job}/0", f"    honor_labels: {str(honor).lower()}",
                "    static_configs:"]
        for node, pod in NODES.items():
            out += [f"      - targets: ['127.0.0.1:{ports[node]}']", "        labels:",
                    "          __meta_kubernetes_namespace: gpu-operator",
                    f"          __meta_kubernetes_service_name: {job}",
                    f"          __meta_kubernetes_pod_name: {pod}",
                    "          __meta_kubernetes_pod_container_name: nvidia-dcgm-exporter",
                    f"          __meta_kubernetes_pod_node_name: {node}",
                    "          __meta_kubernetes_endpoint_port_name: gpu-metrics"]
        # the Operator's generateServiceMonitorConfig, in its order (the keep rules on service labels and
        # port name select these very targets, so they are left out)
        out += ["    relabel_configs:",
                "      - {source_labels: [job], target_label: __tmp_prometheus_job_name}",
                "      - {source_labels: [__meta_kubernetes_namespace], target_label: namespace}",
                "      - {source_labels: [__meta_kubernetes_service_name], target_label: service}",
                "      - {source_labels: [__meta_kubernetes_pod_name], target_label: pod}",
                "      - {source_labels: [__meta_kubernetes_pod_container_name], target_label: container}",
                "      - {source_labels: [__meta_kubernetes_service_name], target_label: job, replacement: '${1}'}",
                "      - {target_label: endpoint, replacement: gpu-metrics}"]
        if metric_relabel:
            out.append(metric_relabel.rstrip("\n"))
    return "\n".join(out) + "\n"


def _json(url: str) -> Any:
    import json

    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 (loopback test server)
        return json.loads(r.read())


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The exporters and a Prometheus scraping them under the three conventions, until each job has 8
    scrapes of every target."""
    need(bool(shutil.which("prometheus")), "prometheus not installed (scripts/testbed-prometheus.sh installs it)")
    servers = {}
    for node in NODES:
        srv = ThreadingHTTPServer(("127.0.0.1", 0), _Exporter)
        srv.node = node  # type: ignore[attr-defined]
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers[node] = srv
    d = tmp_path_factory.mktemp("prom")
    (d / "prometheus.yml").write_text(scrape_config({n: s.server_address[1] for n, s in servers.items()}))
    port = free_port()
    started = datetime.now(UTC)
    proc = subprocess.Popen(["prometheus", f"--config.file={d / 'prometheus.yml'}",  # noqa: S603
                             f"--storage.tsdb.path={d / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=(d / "log").open("w"))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        q = urllib.parse.quote("min(count_over_time(up[5m]))")
        while True:
            try:
                res = _json(f"{url}/api/v1/query?query={q}")["data"]["result"]
                if res and float(res[0]["value"][1]) >= 8:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (d / "log").read_text()[-2000:]
            time.sleep(0.5)
        yield {"url": url, "started": started, "dir": d}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for srv in servers.values():
            srv.shutdown()


def window(prom: dict[str, Any]) -> Window:
    since = prom["started"].replace(second=0, microsecond=0) - timedelta(minutes=5)
    return Window(since, datetime.now(UTC) + timedelta(seconds=1), 300)


def pull(prom: dict[str, Any], job: str, **opts: Any) -> tuple[list[GpuBucket], list[str], Problems]:
    src = build("prometheus", "telemetry", {"url": prom["url"], "matchers": f'job="{job}"', "sample_interval_s": 1,
                                            **opts}, Context("k8s"))
    p = Problems()
    rows = [b for b in src.collect(window(prom), p) if isinstance(b, GpuBucket)]
    return rows, list(getattr(src, "notes", [])), p


def jobs_by_gpu(rows: list[GpuBucket]) -> dict[tuple[str, int], str]:
    out: dict[tuple[str, int], set[str]] = {}
    for b in rows:
        out.setdefault((b.host, b.gpu), set()).add(b.job)
    return {k: ",".join(sorted(v)) for k, v in out.items()}


@pytest.mark.service
def test_prometheus_really_stores_the_operator_conventions(prom: dict[str, Any]) -> None:
    """The premise, read back from the TSDB: honor_labels false renames the exporter's labels exported_*
    and gives every series the exporter's own pod; honor_labels true keeps the workload's pod and gives idle
    GPUs the exporter's; the relabelled job has workload_* and no exported_*."""
    def series(job: str, node: str, gpu: int) -> dict[str, str]:
        sel = urllib.parse.quote(f'DCGM_FI_PROF_SM_ACTIVE{{job="{job}",Hostname="{node}",gpu="{gpu}"}}')
        res = _json(f"{prom['url']}/api/v1/query?query={sel}")["data"]["result"]
        assert len(res) == 1, res
        return res[0]["metric"]

    s = series("dcgm-honor-false", "node-a", 0)
    assert (s["pod"], s["namespace"], s["container"]) == (NODES["node-a"], "gpu-operator", "nvidia-dcgm-exporter")
    assert (s["exported_pod"], s["exported_namespace"], s["exported_container"]) == ("train-0", "team-a", "trainer")
    assert s["endpoint"] == "gpu-metrics" and s["service"] == "dcgm-honor-false"
    assert series("dcgm-honor-false", "node-a", 1)["pod"] == NODES["node-a"]
    assert "exported_pod" not in series("dcgm-honor-false", "node-a", 1)
    s = series("dcgm-honor-true", "node-a", 0)
    assert (s["pod"], s["namespace"]) == ("train-0", "team-a") and "exported_pod" not in s
    assert series("dcgm-honor-true", "node-a", 1)["pod"] == NODES["node-a"]
    s = series("dcgm-relabelled", "node-a", 0)
    assert s["workload_pod"] == "train-0" and s["pod"] == NODES["node-a"] and "exported_pod" not in s


@pytest.mark.service
@pytest.mark.parametrize("job", ["dcgm-honor-false", "dcgm-honor-true"])
def test_workload_labels_in_both_conventions(prom: dict[str, Any], job: str) -> None:
    rows, notes, p = pull(prom, job)
    assert p.total == 0, p.items
    assert jobs_by_gpu(rows) == EXPECTED
    a0 = [b for b in rows if (b.host, b.gpu) == ("node-a", 0)]
    assert {(b.pod, b.namespace, b.container) for b in a0} == {("train-0", "team-a", "trainer")}
    assert all(b.samples > 0 and b.sm_active == pytest.approx(0.8) for b in a0)
    assert not any(b.pod for b in rows if (b.host, b.gpu) not in WORKLOADS)
    # one line says what was seen and which setting changes it
    (note,) = [n for n in notes if n.startswith("workload labels:")]
    assert "exporter_pods" in note and "pod_label" in note
    assert "gpu-operator/nvidia-dcgm-exporter-7xk2p" in note and "gpu-operator/gpu-telemetry-5hc8w" in note
    assert ("exported_pod" in note) is (job == "dcgm-honor-false")


@pytest.mark.service
def test_relabelled_names_through_the_label_map(prom: dict[str, Any]) -> None:
    labels = {"pod_label": "workload_pod", "namespace_label": "workload_namespace",
              "container_label": "workload_container"}
    rows, notes, _p = pull(prom, "dcgm-relabelled", **labels)
    # with the label map the exporters' own pods are never read, so no DaemonSet guess is needed
    assert jobs_by_gpu(rows) == EXPECTED
    assert {(b.pod, b.namespace, b.container) for b in rows if (b.host, b.gpu) == ("node-b", 0)} == {
        ("notebook-1", "team-b", "lab")}
    assert not any(n.startswith("workload labels:") for n in notes), notes
    # without it, the target's pod (the exporter) would tie every bucket to the exporter: never
    rows, notes, _p = pull(prom, "dcgm-relabelled")
    assert set(jobs_by_gpu(rows).values()) == {""}
    # a label map naming a label no series has says so
    _rows, notes, _p = pull(prom, "dcgm-relabelled", pod_label="workload_pod_name")
    assert any("pod_label = 'workload_pod_name'" in n for n in notes), notes


@pytest.mark.service
def test_exporter_pods_setting(prom: dict[str, Any]) -> None:
    """A pattern names exporter pods the guesses would miss (honor_labels true, a lone exporter on a node
    whose GPU is busy: no exported_pod beside it, not on every GPU)."""
    rows, _notes, _p = pull(prom, "dcgm-honor-true", exporter_pods=[])
    # without patterns nodes a/b's idle GPUs carry their exporter's pod (the busy GPU beside it breaks
    # the every-GPU rule), nodes c/d are still caught as a DaemonSet
    got = jobs_by_gpu(rows)
    assert got[("node-a", 1)] == "gpu-operator/nvidia-dcgm-exporter-7xk2p" and got[("node-c", 0)] == ""
    rows, _notes, _p = pull(prom, "dcgm-honor-true", exporter_pods=["gpu-operator/nvidia-dcgm-*"])
    assert jobs_by_gpu(rows) == EXPECTED


@pytest.mark.service
def test_config_check_probe_says_it_in_one_line(prom: dict[str, Any], tmp_path: Path) -> None:
    cfg = tmp_path / "gpu-audit.toml"
    cfg.write_text(f'[store]\nurl = "sqlite:///{tmp_path / "s.db"}"\n\n[[clusters]]\nname = "k8s"\n\n'
                   f'[[clusters.telemetry]]\nkind = "prometheus"\nurl = "{prom["url"]}"\n'
                   "matchers = 'job=\"dcgm-honor-false\"'\n")
    res = run_cli("--config", str(cfg), "config", "check", "--probe")
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if "workload labels:" in ln]
    assert len(lines) == 1, res.stdout + res.stderr
    assert "exported_pod" in lines[0] and "nvidia-dcgm-exporter-7xk2p" in lines[0] and "exporter_pods" in lines[0]


@pytest.mark.service
@pytest.mark.parametrize("engine", ["sqlite", pytest.param("postgresql", marks=pytest.mark.service)])
def test_operator_telemetry_is_attributed_end_to_end(prom: dict[str, Any], tmp_path: Path, engine: str) -> None:
    """Pods (a file of Kubernetes allocations) + the honor_labels false Prometheus, collected into the store
    and audited: train-0's and notebook-1's GPU time is observed (it was all unknown when the exporter's pod
    was taken for the workload), and judged (train-0 working, notebook-1 idle)."""
    from helpers import migrated_store

    win = window(prom)
    start = win.since.strftime("%Y-%m-%dT%H:%M:%SZ")
    (tmp_path / "pods.csv").write_text(
        "id,name,account,user,start,gpus,source\n"
        f"uid-train,train-0,team-a,alice,{start},node-a:0,kubernetes\n"
        f"uid-nb,notebook-1,team-b,bob,{start},node-b:0,kubernetes\n")
    cfg = Config.model_validate({"clusters": [{
        "name": "k8s", "allocations": [{"kind": "file", "paths": ["pods.csv"]}],
        "telemetry": [{"kind": "prometheus", "url": prom["url"], "matchers": 'job="dcgm-honor-false"',
                       "sample_interval_s": 1}]}]})
    with migrated_store(engine, tmp_path) as store:
        # telemetry windows end at a bucket boundary at or before `now`: the one after the scrapes
        until = datetime.fromtimestamp(-(-win.until.timestamp() // 300) * 300, UTC)
        summary = collect(store, cfg, base_dir=tmp_path, since=win.since, until=until, now=until)
        assert all(r.ok for r in summary.results), [r.error for r in summary.results]
        assert any(n.startswith("workload labels:") for r in summary.results for n in r.notes)
        rid = run_audit(store, cfg, win.since, until).run_id
        with store.engine.connect() as conn:
            use = {r.external_id: r for r in conn.execute(text(
                "SELECT a.external_id, u.observed_s, u.working_s, u.idle_s FROM usage_allocation u "
                "JOIN allocations a ON a.id = u.allocation_id WHERE u.run_id = :r"), {"r": rid})}
            stored = {(r.job, r.pod) for r in conn.execute(text("SELECT DISTINCT job, pod FROM gpu_buckets"))}
    assert use["uid-train"].observed_s >= 5 and use["uid-train"].working_s == pytest.approx(use["uid-train"].observed_s)
    assert use["uid-nb"].observed_s >= 5 and use["uid-nb"].idle_s == pytest.approx(use["uid-nb"].observed_s)
    assert stored == {("team-a/train-0", "train-0"), ("team-b/notebook-1", "notebook-1"), ("", None)}


def test_resolution_rules_without_a_server() -> None:
    """The rules on label sets as Prometheus stores them (the live tests above show they are real)."""
    w = Workload(WorkloadOptions())
    target = {"pod": "nvidia-dcgm-exporter-x", "namespace": "gpu-operator", "container": "nvidia-dcgm-exporter"}
    assert w.labels({**target, "exported_pod": "p", "exported_namespace": "ns", "exported_container": "c"}) == {
        "pod": "p", "namespace": "ns", "container": "c"}
    assert w.labels(target) == {}  # the exporter's pod on an idle GPU: no workload
    assert w.labels({"pod": "p", "namespace": "ns"}) == {"pod": "p", "namespace": "ns"}
    assert w.labels({"pod_name": "p", "pod_namespace": "ns"}) == {"pod": "p", "namespace": "ns"}
    w = Workload(WorkloadOptions(exporter_pods=[]))
    w.scan([{**target, "pod": "exp-1", "exported_pod": "p"}], lambda m: None)
    assert w.labels({**target, "pod": "exp-1"}) == {}  # the target's pod, learned beside exported_pod
    with pytest.raises(ValueError, match="not a label name"):
        WorkloadOptions(pod_label="exported pod")


def test_scrape_files_resolve_the_same_way(tmp_path: Path) -> None:
    """A saved scrape of a federated/Operator-relabelled page (labels as the TSDB holds them)."""
    t = int(datetime(2026, 11, 2, 10, 0, tzinfo=UTC).timestamp())
    lines = []
    for i in range(10):
        ts = (t + 30 * i) * 1000
        common = 'gpu="{g}",UUID="GPU-{g}",Hostname="node-a",namespace="gpu-operator",pod="dcgm-exp-1",' \
                 'container="nvidia-dcgm-exporter",endpoint="gpu-metrics",service="dcgm"'
        lines.append(f'DCGM_FI_PROF_SM_ACTIVE{{{common.format(g=0)},exported_pod="train-0",exported_namespace='
                     f'"team-a",exported_container="trainer"}} 0.7 {ts}')
        lines.append(f"DCGM_FI_PROF_SM_ACTIVE{{{common.format(g=1)}}} 0 {ts}")
    (tmp_path / "m.prom").write_text("\n".join(lines) + "\n")
    src = build("scrape", "telemetry", {"paths": [str(tmp_path / "m.prom")]}, Context("k8s"))
    rows = list(src.collect(Window(datetime.fromtimestamp(t, UTC), datetime.fromtimestamp(t + 300, UTC)), Problems()))
    assert {(b.gpu, b.job, b.container) for b in rows} == {(0, "team-a/train-0", "trainer"), (1, "", None)}
    assert any("dcgm-exp-1" in n and "exported_pod" in n for n in src.notes)


def test_every_workload_setting_is_documented() -> None:
    doc = (ROOT / "docs" / "telemetry.md").read_text()
    for cls, kind in ((PrometheusTelemetry, "prometheus"), (ScrapeFiles, "scrape")):
        for field in WorkloadOptions.model_fields:
            assert field in cls.Options.model_fields
            assert f"| `{kind}.{field}` |" in doc, (kind, field)


def test_a_multi_node_job_on_whole_nodes_is_no_exporter(store: Any, store_url: str, tmp_path: Path) -> None:
    """Both engines. A two-pod job (ml/train-worker-0 on both GPUs of node-a, ml/train-worker-1 on both of
    node-b) has the DaemonSet shape of the exporter heuristic (one pod on every GPU of each node, one namespace),
    as do a site's exporter pods on the idle nodes c and d (honor_labels true: their own pod on idle GPUs). The
    Kubernetes allocations collected first say the workers held GPUs: their series keep their job label, the
    exporters' are still dropped. Before the fix the workers' rows were stored with job "" (taken for exporters)."""
    t = int(datetime(2026, 11, 2, 10, 0, tzinfo=UTC).timestamp())
    placed = {"node-a": ("ml", "train-worker-0"), "node-b": ("ml", "train-worker-1"),
              "node-c": ("monitoring", "gpu-telemetry-5hc8w"), "node-d": ("monitoring", "gpu-telemetry-b2n6r")}
    lines = []
    for i in range(10):
        for node, (ns, pod) in placed.items():
            for g in range(2):
                lines.append(f'DCGM_FI_PROF_SM_ACTIVE{{gpu="{g}",UUID="GPU-{node}-{g}",Hostname="{node}",'
                             f'namespace="{ns}",pod="{pod}"}} 0.5 {(t + 30 * i) * 1000}')
    (tmp_path / "m.prom").write_text("\n".join(lines) + "\n")
    start = datetime.fromtimestamp(t - 600, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    (tmp_path / "pods.csv").write_text(
        "id,name,account,user,start,gpus,source\n"
        f"uid-w0,train-worker-0,ml,alice,{start},node-a:0-1,kubernetes\n"
        f"uid-w1,train-worker-1,ml,alice,{start},node-b:0-1,kubernetes\n")
    cfg = Config.model_validate({"store": {"url": store_url}, "clusters": [{
        "name": "k8s", "allocations": [{"kind": "file", "paths": ["pods.csv"]}],
        "telemetry": [{"kind": "scrape", "paths": ["m.prom"]}]}]})
    until = datetime.fromtimestamp(t + 300, UTC)
    summary = collect(store, cfg, base_dir=tmp_path, since=datetime.fromtimestamp(t, UTC), until=until, now=until)
    assert all(r.ok for r in summary.results), [r.error for r in summary.results]
    with store.engine.connect() as conn:
        jobs = {(r.host, r.gpu): r.job for r in conn.execute(text(
            "SELECT DISTINCT g.host, g.gpu_index AS gpu, b.job FROM gpu_buckets b "
            "JOIN telemetry_gpus g ON g.id = b.gpu_id"))}
    assert jobs == {("node-a", 0): "ml/train-worker-0", ("node-a", 1): "ml/train-worker-0",
                    ("node-b", 0): "ml/train-worker-1", ("node-b", 1): "ml/train-worker-1",
                    ("node-c", 0): "", ("node-c", 1): "", ("node-d", 0): "", ("node-d", 1): ""}
    w = Workload(WorkloadOptions(exporter_pods=[]), holders={"ml/train-worker-0", "ml/train-worker-1"})
    w.scan([{"Hostname": n, "gpu": str(g), "namespace": ns, "pod": p} for n, (ns, p) in placed.items()
            for g in range(2)], lambda m: (m["Hostname"], m["gpu"]))
    assert sorted(w.exporters) == ["monitoring/gpu-telemetry-5hc8w", "monitoring/gpu-telemetry-b2n6r"]
