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
#: the DCGM 4.x cumulative SM cycle counters `dcgm-counters --cycle-counters` appends
CYCLE_COUNTERS = "dcgm-cycle-counters.csv"


def register(main: click.Group) -> None:
    @main.group()
    def deploy() -> None:
        """Print a deployment file gpu-audit ships (redirect it into a file)."""

    def add(name: str) -> None:
        @deploy.command(name, help=f"Print deploy/{FILES[name]}. {WHAT[name]}")
        def show() -> None:
            click.echo(shipped(FILES[name]), nl=False)

    for name in FILES:
        if name != "dcgm-counters":
            add(name)

    @deploy.command("dcgm-counters", help=f"Print deploy/{FILES['dcgm-counters']}. {WHAT['dcgm-counters']}")
    @click.option("--cycle-counters", is_flag=True,
                  help=f"Append deploy/{CYCLE_COUNTERS}: DCGM 4.x's cumulative SM cycle counters "
                       "(DCGM_FI_PROF_SM_CYCLES_ACTIVE_TOTAL, _ELAPSED_TOTAL), from which SM activity is exact. "
                       "Needs a dcgm-exporter built with DCGM 4.6 field names; older releases refuse the file.")
    def dcgm_counters(cycle_counters: bool) -> None:
        text = shipped(FILES["dcgm-counters"])
        if cycle_counters:
            text += "\n" + shipped(CYCLE_COUNTERS)
        click.echo(text, nl=False)


def shipped(name: str) -> str:
    """A file under deploy/ (the checkout's, or the installed package's)."""
    from auditor.resources import resource_dir

    return (resource_dir("deploy") / name).read_text(encoding="utf-8")
