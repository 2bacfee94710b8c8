"""The container image, built and run here: deploy/container/build.sh makes a Debian base from Debian's
packages (no registry), installs gpu-audit from wheels built here, and the image runs `gpu-audit demo` and
`config check` read-only, without network, as the non-root user the manifests expect."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import need

ROOT = Path(__file__).resolve().parent.parent
TAG = "localhost/gpu-audit:test"


def podman_args() -> tuple[list[str], list[str]]:
    """runc and resource limits no higher than this process's: the machines this runs on give root no
    CAP_SYS_RESOURCE (a container cannot raise a limit) and crun refuses their cgroup layout."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    ulimits = ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", "nproc=1000:1000"]
    return ["--runtime", "runc"], ulimits


@pytest.mark.service
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_image_builds_and_runs_the_demo_and_config_check() -> None:
    for tool in ("podman", "mmdebstrap", "runc"):
        need(shutil.which(tool) is not None, f"{tool} is not installed (.ci/run installs it from Debian)")
    glob, ulimits = podman_args()
    env = {**os.environ, "GPU_AUDIT_PODMAN_ARGS": " ".join(glob), "GPU_AUDIT_BUILD_ULIMITS": " ".join(ulimits)}
    build = subprocess.run(["bash", str(ROOT / "deploy/container/build.sh"), "--tag", TAG], env=env,
                           capture_output=True, text=True, timeout=1100)
    assert build.returncode == 0, build.stderr[-3000:]
    run = ["podman", *glob, "run", "--rm", "--network", "none", *ulimits, "--read-only", "--tmpfs", "/tmp:mode=1777"]
    try:
        who = subprocess.run([*run, "--entrypoint", "id", TAG, "-u"], capture_output=True, text=True, timeout=120)
        assert who.stdout.strip() == "10001", who.stderr  # the manifests' runAsUser
        demo = subprocess.run([*run, TAG, "demo", "--out", "/tmp/demo", "--now", "2026-11-29T00:00"],
                              capture_output=True, text=True, timeout=600)
        assert demo.returncode == 0, demo.stderr[-2000:]
        assert "Reserved GPU-hours" in demo.stdout and "util_mirage 1" in demo.stdout
        cfg = ROOT / "deploy" / "kubernetes" / "example-site" / "config.toml"
        check = subprocess.run([*run, "-v", f"{cfg}:/etc/gpu-audit/config.toml:ro", "-e", "GPU_AUDIT_STORE_URL=x",
                                TAG, "config", "check"], capture_output=True, text=True, timeout=120)
        assert check.returncode == 0, check.stdout + check.stderr
        bad = subprocess.run([*run, TAG, "-c", "/nonexistent.toml", "config", "check"], capture_output=True,
                             text=True, timeout=120)
        assert bad.returncode != 0  # the check can fail: a missing config is refused
    finally:
        subprocess.run(["podman", *glob, "rmi", "-f", TAG], capture_output=True, timeout=120)
