"""``gpu-audit serve --web``: the daemon mounts the read-only web UI next to /healthz; it serves pages once
an audit ran, refuses writes, and stops with the daemon on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from conftest import port_open

sys.path.insert(0, str(Path(__file__).parent))
from test_schedule import demo_store, free_port, get, wait_for  # noqa: E402


def post(url: str) -> int:
    req = urllib.request.Request(url, data=b"x=1", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310 - loopback test server
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.slow
def test_serve_mounts_the_web_ui(tmp_path: Path) -> None:
    cfg_path, _cfg, _store = demo_store(tmp_path)
    health_port, web_port = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "auditor", "-c", str(cfg_path), "serve", "--listen",  # noqa: S603
                             f"127.0.0.1:{health_port}", "--web", f"127.0.0.1:{web_port}", "--once-now", "--every", "3",
                             "--health-max-age", "600"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    base = f"http://127.0.0.1:{web_port}"
    try:
        assert wait_for(lambda: port_open("127.0.0.1", web_port), 30, 0.2)
        assert wait_for(lambda: get(base + "/api/overview")[0] == 200, 120, 0.5)  # after the first audit
        code, body = get(base + "/")
        assert code == 200 and "GPU audit:" in body and "spin-wait" in get(base + "/findings")[1]
        assert post(base + "/") == 405 and post(base + "/api/findings") == 405
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err + out and "web UI" in err
