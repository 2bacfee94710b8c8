"""Every stage of auditor/ is under a layer contract (pyproject [tool.importlinter], checked in CI by
`lint-imports`), so a new module or package cannot slip past the contracts; and the contracts hold."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from conftest import need

ROOT = Path(__file__).resolve().parent.parent
#: Top-level modules outside the layers on purpose: the package marker, `python -m auditor`, and the
#: generator of docs/configuration.md (it reads the connectors' option models).
OUTSIDE = {"__init__", "__main__", "configdoc"}


def _contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _layered() -> set[str]:
    layers = next(c for c in _contracts() if c["type"] == "layers")["layers"]
    return {m.strip().strip("()") for layer in layers for m in layer.replace("|", ":").split(":")}


def test_every_stage_is_in_a_layer() -> None:
    children = {p.stem if p.is_file() else p.name for p in (ROOT / "auditor").iterdir()
                if (p.suffix == ".py" or (p / "__init__.py").is_file())}
    missing = sorted(f"auditor.{c}" for c in children - OUTSIDE if f"auditor.{c}" not in _layered())
    assert not missing, f"add these to the layers contract in pyproject.toml: {missing}"


def test_no_cycles_contract_covers_both_packages() -> None:
    acyclic = [c for c in _contracts() if c["type"] == "acyclic_siblings"]
    assert acyclic and set(acyclic[0]["ancestors"]) == {"auditor", "connectors"}


def test_contracts_hold() -> None:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    need(Path(exe).exists(), "import-linter not installed (pip install -e '.[test]')")
    res = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
