"""The wheel carries templates and migrations: build it, install it into a fresh virtualenv, run the demo."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_installs_and_runs_the_demo(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist),
                    str(ROOT)], check=True, capture_output=True, timeout=300)
    wheel = next(dist.glob("gpu_audit-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "auditor/migrations/env.py" in names
    assert "connectors/actions/kubernetes.py" in names and "connectors/actions/slurm.py" in names
    assert any(n.startswith("auditor/migrations/versions/0001") for n in names)
    assert any(n.startswith("auditor/templates/") for n in names) or not list((ROOT / "templates").iterdir())
    venv = tmp_path / "venv"
    # Dependencies come from this interpreter's site-packages, the package itself only from the wheel.
    # `venv --system-site-packages` would see the *base* interpreter's packages, not those of a virtualenv this
    # test may run in; a .pth file naming this interpreter's site directories works in both cases. Plain paths in
    # a .pth are appended after the new venv's own site-packages, and .pth files inside them (an editable install
    # of this checkout) are not processed, so the wheel's copy is the one imported.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    new_site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
    outer = [p for p in sys.path if p.endswith("-packages") and Path(p).is_dir()]
    Path(new_site, "outer-deps.pth").write_text("\n".join(outer) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--force-reinstall",
                    "-q", str(wheel)], check=True, capture_output=True, timeout=300)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # a checkout on PYTHONPATH would win
    where = subprocess.run([str(py), "-c", "import auditor; print(auditor.__file__)"], cwd=work,
                           capture_output=True, text=True, check=True, env=env)
    assert str(venv) in where.stdout, f"imported from the source tree, not the wheel: {where.stdout}"
    res = subprocess.run([str(venv / "bin" / "gpu-audit"), "demo", "--out", str(work / "demo"),
                          "--now", "2026-11-29T00:00"], cwd=work, capture_output=True, text=True, timeout=300,
                         env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Reserved GPU-hours" in res.stdout and "util_mirage 1" in res.stdout
    res = subprocess.run([str(venv / "bin" / "gpu-audit"), "deploy", "dcgm-counters"], cwd=work, capture_output=True,
                         text=True, timeout=120, env=env)  # the counters file for a pip install, from the wheel
    assert res.returncode == 0 and res.stdout == (ROOT / "deploy" / "dcgm-counters.csv").read_text(), res.stderr
