"""docs/cli.md is the CLI reference generated from `--help` (auditor/cli/reference.py): current, and naming every
command and every option (regenerate: python -m auditor.cli.reference > docs/cli.md)."""

from __future__ import annotations

from pathlib import Path

import click

from auditor.cli import main
from auditor.cli.reference import reference_markdown

PAGE = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


def _commands(cmd: click.Command, path: str) -> list[tuple[str, click.Command]]:
    out = [(path, cmd)]
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            if not sub.hidden:
                out += _commands(sub, f"{path} {name}")
    return out


def test_cli_reference_is_current() -> None:
    assert PAGE.read_text(encoding="utf-8") == reference_markdown(), \
        "docs/cli.md is stale: python -m auditor.cli.reference > docs/cli.md"


def test_cli_reference_names_every_command_and_option() -> None:
    page = PAGE.read_text(encoding="utf-8")
    sections = {s.split("`", 2)[1]: s for s in page.split("\n## ")[1:]}
    for path, cmd in _commands(main, "gpu-audit"):
        assert path in sections, f"{path} missing from docs/cli.md"
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden:
                assert any(o in sections[path] for o in p.opts), f"{path}: {p.opts} missing from docs/cli.md"
