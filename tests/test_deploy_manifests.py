"""The Kubernetes manifests as users apply them: each kustomize overlay rendered by `kubectl kustomize` and
every object checked against the Kubernetes OpenAPI schemas (kubernetes-validate's strict JSON schemas) of
each supported version; the example site's config is a valid gpu-audit config."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import need

ROOT = Path(__file__).resolve().parent.parent
KUBE = ROOT / "deploy" / "kubernetes"
OVERLAYS = ["base", "daemon", "cronjob", "example-site"]
#: the Kubernetes minor versions gpu-audit supports (docs/kubernetes.md): 1.30 to the newest with DRA GA
VERSIONS = ["1.30.0", "1.32.0", "1.34.0", "1.35.0"]


def render(overlay: str) -> list[dict]:
    yaml = pytest.importorskip("yaml")
    kubectl = shutil.which("kubectl")
    need(kubectl is not None, "kubectl (kustomize) is not installed")
    out = subprocess.run([kubectl, "kustomize", str(KUBE / overlay)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.mark.service
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_renders_to_objects_valid_in_each_supported_version(overlay: str) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    objs = render(overlay)
    kinds = sorted(d["kind"] for d in objs)
    assert {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"} <= set(kinds), kinds
    for version in VERSIONS:
        for obj in objs:
            kv.validate(obj, version, strict=True)  # raises ValidationError naming the field
    if overlay == "daemon":
        assert "Deployment" in kinds and "Service" in kinds and "CronJob" not in kinds
    if overlay == "cronjob":
        assert "CronJob" in kinds and "Deployment" not in kinds
    if overlay == "example-site":  # enforcement opted in; the generated ConfigMap is the one the pod mounts
        roles = {d["metadata"]["name"] for d in objs if d["kind"] == "ClusterRole"}
        assert roles == {"gpu-audit-reader", "gpu-audit-actor"}
        cm = next(d for d in objs if d["kind"] == "ConfigMap")["metadata"]["name"]
        pod = next(d for d in objs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
        assert [v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v] == [cm]
    else:  # read-only unless a site opts in
        assert all(d["metadata"]["name"] != "gpu-audit-actor" for d in objs)


@pytest.mark.service
def test_a_broken_manifest_is_caught() -> None:
    """The check can fail: a Deployment with a misspelt field is refused by the strict schema."""
    kv = pytest.importorskip("kubernetes_validate")
    dep = next(d for d in render("daemon") if d["kind"] == "Deployment")
    dep["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kv.ValidationError):
        kv.validate(dep, VERSIONS[-1], strict=True)


def test_the_example_sites_config_is_valid() -> None:
    from auditor import config

    cfg = config.load(KUBE / "example-site" / "config.toml")
    assert cfg.clusters[0].allocations[0].kind == "kubernetes"
