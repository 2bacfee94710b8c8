"""``gpu-audit deploy``: print the deployment files gpu-audit ships, for a pip install that has no checkout
(``gpu-audit deploy dcgm-counters > dcgm-counters.csv``)."""

from __future__ import annotations

import click

#: command name -> the shipped file under deploy/ it prints
FILES = {"dcgm-counters": "dcgm-counters.csv", "example-config": "example-config.toml"}
WHAT = {"dcgm-counters": "dcgm-exporter's counters file with the DCGM profiling fields gpu-audit judges by "
                         "(SM activity, tensor and DRAM activity) on: pass it to dcgm-exporter with -f "
                         "(docs/telemetry.md).",
        "example-config": "A complete, commented example config (docs/configuration.md)."}


def register(main: click.Group) -> None:
    @main.group()
    def deploy() -> None:
        """Print a deployment file gpu-audit ships (redirect it into a file)."""

    def add(name: str) -> None:
        @deploy.command(name, help=f"Print deploy/{FILES[name]}. {WHAT[name]}")
        def show() -> None:
            from auditor.store.engine import resource_dir

            click.echo((resource_dir("deploy") / FILES[name]).read_text(encoding="utf-8"), nl=False)

    for name in FILES:
        add(name)
