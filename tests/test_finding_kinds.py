"""The finding-kinds registry (auditor/audit/kinds.py) is documented exactly (docs/definitions.md "Finding
kinds", as Datasette checks its SETTINGS against its docs) and is the only list of kinds: every surface's
kinds come from it, and no module keeps a list of its own."""

from __future__ import annotations

import re
from pathlib import Path

from auditor.audit import kinds
from auditor.report import context, export, words
from auditor.web import data

ROOT = Path(__file__).resolve().parents[1]


def documented() -> list[tuple[str, ...]]:
    """The rows of the "Finding kinds" table of docs/definitions.md, cells stripped of backticks."""
    doc = (ROOT / "docs" / "definitions.md").read_text(encoding="utf-8")
    section = doc.split("## Finding kinds", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("| `"):
            rows.append(tuple(c.strip().strip("`") for c in line.strip().strip("|").split("|")))
    return rows


def test_docs_table_is_the_registry() -> None:
    yn = {True: "yes", False: "no"}
    want = [(k.name, k.family, k.audience, k.section, yn[k.nudged], yn[k.adds_to_idle], k.help)
            for k in kinds.KINDS]
    assert documented() == want, "docs/definitions.md 'Finding kinds' and auditor/audit/kinds.py disagree"


def test_every_surface_reads_the_registry() -> None:
    assert set(data.ALL_KINDS) == set(kinds.NAMES)  # the web findings page lists every kind
    assert "lemon_node" in data.ALL_KINDS and "busy_unverified" not in data.ALL_KINDS  # a verdict, not a kind
    assert set(export.all_kinds()) == set(kinds.NAMES)  # the CSV and JSON export
    assert set(words.ADVICE) == set(kinds.NAMES)  # advice for every kind, none for a kind that is not
    sections = {**{"top_idle": context.IDLE_KINDS}, **context.SECTION_KINDS}
    shown = {k for ks in sections.values() for k in ks}
    for k in kinds.KINDS:  # a kind in a findings-table section is listed there; the others have their own
        assert (k.name in shown) == (k.section in sections), k.name
    assert set(kinds.NUDGED) <= {k.name for k in kinds.KINDS if k.audience == "user"}
    assert all(kinds.label(k) != k for k in kinds.NAMES)


def test_no_module_keeps_its_own_list_of_kinds() -> None:
    """A tuple or dict literal naming three or more finding kinds anywhere in auditor/ or templates/ (but
    the registry) is a partial list that will drift."""
    names = "|".join(kinds.NAMES)
    literal = re.compile("[\"'](?:" + names + ")[\"']")
    bad = []
    for path in [*(ROOT / "auditor").rglob("*.py"), *(ROOT / "templates").rglob("*.j2")]:
        if path.name == "kinds.py":
            continue
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if len(literal.findall(line)) >= 3:
                bad.append(f"{path.relative_to(ROOT)}:{no}")
    assert not bad, f"partial lists of finding kinds: {bad}"
