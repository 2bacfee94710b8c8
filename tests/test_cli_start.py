"""The CLI's start imports only what the command needs (issue 46): `gpu-audit --help` and `--version` load the
command group, not the store, the config models or the report. The seconds are measured in bench/
(bench.start); this checks the modules, which a test can hold."""

from __future__ import annotations

import subprocess
import sys

from auditor import config
from auditor.cli.app import CONFIG_ENV

HEAVY = ("sqlalchemy", "pydantic", "alembic", "jinja2", "auditor.store.engine", "auditor.config",
         "auditor.report.render", "auditor.daemon.pipeline", "connectors")


def test_the_command_group_imports_no_heavy_module() -> None:
    code = ("import sys; import auditor.cli; "
            f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"`gpu-audit --help` would import {out}"


def test_the_config_variable_is_the_configs() -> None:
    assert CONFIG_ENV == config.ENV_VAR
