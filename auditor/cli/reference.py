"""The CLI reference (docs/cli.md), generated from the commands' own ``--help``: every command and subcommand
with its options, as ``gpu-audit COMMAND --help`` prints them. Regenerate with
``python -m auditor.cli.reference > docs/cli.md``; tests/test_cli_reference.py checks the page is current (as
sqlite-utils checks its CLI reference with cog)."""

from __future__ import annotations

import click

WIDTH = 100  # fixed, so the page does not depend on the terminal that generated it


def _walk(cmd: click.Command, path: list[str], parent: click.Context | None) -> list[tuple[str, str]]:
    # The command's own context_settings (the root's ``-h``), as ``make_context`` applies them on a real run.
    settings = {**cmd.context_settings, "terminal_width": WIDTH, "max_content_width": WIDTH}
    ctx = click.Context(cmd, info_name=path[-1], parent=parent, **settings)
    out = [(" ".join(path), cmd.get_help(ctx))]
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                out += _walk(sub, [*path, name], ctx)
    return out


def reference_markdown() -> str:
    """docs/cli.md: one section per command, its ``--help`` verbatim."""
    from auditor.cli import main

    parts = ["# CLI reference\n",
             "Generated from `--help` by `python -m auditor.cli.reference > docs/cli.md` (checked by "
             "tests/test_cli_reference.py): every command and option of `gpu-audit`.\n"]
    for name, text in _walk(main, ["gpu-audit"], None):
        parts.append(f"## `{name}`\n\n```\n{text.rstrip()}\n```\n")
    return "\n".join(parts)


if __name__ == "__main__":
    print(reference_markdown(), end="")
