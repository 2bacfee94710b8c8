"""The CLI: one-line errors and exit codes, --json for machines, --debug for tracebacks."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from conftest import run_cli

from auditor.cli import main


def run(*args: str, **kw):
    return CliRunner().invoke(main, list(args), **kw)


def test_help_lists_commands() -> None:
    res = run("--help")
    assert res.exit_code == 0
    for cmd in ("db", "config", "collect", "audit", "run", "demo"):
        assert cmd in res.output


def test_bad_config_is_one_line_and_exit_1(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[thresholds]\nidle_sm = 7\n")
    res = run_cli("-c", str(cfg), "config", "check")
    assert res.returncode == 1
    assert res.stderr.strip().count("\n") == 0
    assert "thresholds.idle_sm" in res.stderr and "Traceback" not in res.stderr


def test_debug_shows_traceback(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[thresholds]\nidle_sm = 7\n")
    res = run_cli("--debug", "-c", str(cfg), "audit")  # config check lists errors; a command raises the first
    assert res.returncode != 0 and "Traceback" in res.stderr


def test_db_upgrade_current_and_json(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nurl = "sqlite:///{tmp_path / "s.db"}"\n')
    res = run("-c", str(cfg), "db", "current")
    assert "run `gpu-audit db upgrade`" in res.output
    assert run("-c", str(cfg), "db", "upgrade").exit_code == 0
    res = run("-c", str(cfg), "--json", "db", "current")
    data = json.loads(res.output)
    assert data["current"] == data["head"] and data["current"]


def test_unmigrated_store_is_a_one_line_error(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nurl = "sqlite:///{tmp_path / "s.db"}"\n')
    res = run("-c", str(cfg), "audit")
    assert res.exit_code == 1 and "gpu-audit db upgrade" in res.output


def test_bad_time_option(tmp_path: Path) -> None:
    res = run("audit", "--since", "last tuesday")
    assert res.exit_code == 1 and "cannot parse time" in res.output


def test_run_reports_failed_sources_and_exit_code(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    (tmp_path / "good.csv").write_text("timestamp,host,gpu,uuid,metric,value\n")
    cfg.write_text(f'''[store]
url = "sqlite:///{tmp_path / "s.db"}"
[[clusters]]
name = "ok"
[[clusters.telemetry]]
kind = "file"
paths = ["good.csv"]
[[clusters]]
name = "broken"
[[clusters.telemetry]]
kind = "file"
paths = ["missing.csv"]
''')
    assert run("-c", str(cfg), "db", "upgrade").exit_code == 0
    res = run("-c", str(cfg), "--json", "run", "--steps", "collect,audit")
    data = json.loads(res.stdout)
    assert res.exit_code == 3, res.output
    collect = data["steps"][0]
    assert collect["name"] == "collect" and not collect["ok"]
    assert "broken" in collect["error"] and "missing.csv" in collect["error"]
    assert data["steps"][1]["name"] == "audit" and data["steps"][1]["ok"]
