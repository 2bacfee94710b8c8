"""/metrics passes `promtool check metrics` (names, base units, help and types) and is served by
prometheus_client's exposition app; /healthz and unknown paths keep their answers."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import need

from auditor.config import Config
from auditor.daemon.health import HealthServer, Metrics
from auditor.daemon.pipeline import RunSummary, StepResult
from auditor.store.engine import Store


def _metrics(tmp_path: Path) -> Metrics:
    store = Store.open(f"sqlite:///{tmp_path / 'm.db'}")
    store.upgrade()
    m = Metrics(store, Config())
    m.observe(RunSummary(steps=[StepResult("collect", False, 1.5, "x", {"sources": [
        {"cluster": "c1", "source": "telemetry[0]:prometheus", "ok": False}]}), StepResult("audit", True, 0.2)]))
    m.job_skips.labels("audit", "lease_held").inc()
    return m


@pytest.mark.service  # Prometheus' own promtool (installed by scripts/testbed-prometheus.sh)
def test_metrics_pass_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    need(promtool is not None, "promtool not installed (scripts/testbed-prometheus.sh installs it)")
    body = _metrics(tmp_path).render()
    res = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert res.returncode == 0, (res.stdout + res.stderr).decode()
    text = body.decode()
    assert "_hours" not in text  # base units: GPU time is exposed in seconds
    assert 'gpu_audit_step_failures_total{step="collect"} 1.0' in text
    assert 'gpu_audit_collect_source_failures_total{cluster="c1",source="telemetry[0]:prometheus"} 1.0' in text


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 (loopback test server)
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def test_server_answers_metrics_health_and_404(tmp_path: Path) -> None:
    m = _metrics(tmp_path)
    checks = iter([(True, {"status": "ok"}), (False, {"status": "unhealthy"})])
    server = HealthServer("127.0.0.1", 0, m, lambda: next(checks)).start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        code, ctype, body = _get(base + "/metrics")
        assert code == 200 and ctype.startswith("text/plain") and "gpu_audit_step_runs_total" in body
        code, ctype, body = _get(base + "/healthz")
        assert (code, ctype, json.loads(body)) == (200, "application/json", {"status": "ok"})
        code, _ctype, body = _get(base + "/health?x=1")
        assert code == 503 and json.loads(body)["status"] == "unhealthy"
        code, _ctype, body = _get(base + "/nothing")
        assert code == 404 and "try /healthz or /metrics" in body
    finally:
        server.stop()
