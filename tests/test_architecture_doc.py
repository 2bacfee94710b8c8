"""docs/architecture.md names every module of auditor/ and connectors/: its generated module index
(scripts/module_index.py) is current, so a new, moved or removed module shows up in the diff of the page."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _gen():  # noqa: ANN202 (the script is not a package module)
    spec = importlib.util.spec_from_file_location("module_index", ROOT / "scripts" / "module_index.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_architecture_names_every_module() -> None:
    gen = _gen()
    page = gen.PAGE.read_text(encoding="utf-8")
    assert gen.current(page) == gen.index(), "docs/architecture.md module index is stale: " \
        "python scripts/module_index.py --write"
    for p in list((ROOT / "auditor").rglob("*.py")) + list((ROOT / "connectors").rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        if rel.startswith(gen.RESOURCES):
            continue  # shipped resources (Alembic's revisions), not code: "Where the files are" names them
        assert f"`{rel}`" in page, p
    assert "## Where the files are" in page and "`auditor/migrations/`" in page
