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
#: Top-level modules outside the layers on purpose: the package marker and `python -m auditor`.
OUTSIDE = {"__init__", "__main__"}


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


def test_connectors_are_a_layer_under_collect_over_config() -> None:
    layers = [set(m.strip() for m in layer.replace("|", ":").split(":"))
              for layer in next(c for c in _contracts() if c["type"] == "layers")["layers"]]
    at = {m: i for i, layer in enumerate(layers) for m in layer}
    assert at["auditor.collect"] < at["connectors"] < at["auditor.config"] < at["auditor.records"]
    assert at["connectors"] == at["auditor.store"]  # independent siblings: neither imports the other


def test_no_cycles_contract_covers_both_packages() -> None:
    acyclic = [c for c in _contracts() if c["type"] == "acyclic_siblings"]
    assert acyclic and set(acyclic[0]["ancestors"]) == {"auditor", "connectors"}


def test_contracts_hold() -> None:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    need(Path(exe).exists(), "import-linter not installed (pip install -e '.[test]')")
    res = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]


#: (importer, imported) pairs kept apart by a ``forbidden`` contract (issue 45): each moved to the layer that owns
#: it (parse_listen and source_key into config, resource_dir out of the store, a pod's failure and Job on the
#: record), and kept out by the contract
FORBIDDEN = {("auditor.audit", "connectors"), ("auditor.web", "auditor.daemon"), ("auditor.report", "auditor.daemon"),
             ("auditor.web", "auditor.collect"), ("auditor.enforce", "auditor.collect")}


def test_forbidden_contracts_keep_the_rooms_apart() -> None:
    pairs = {(s, f) for c in _contracts() if c["type"] == "forbidden"
             for s in c["source_modules"] for f in c["forbidden_modules"]}
    assert FORBIDDEN <= pairs, f"missing forbidden contracts: {sorted(FORBIDDEN - pairs)}"
