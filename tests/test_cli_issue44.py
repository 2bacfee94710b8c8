"""CLI and tests (issue 44): a file source that names no file fails `config check`, `--probe` and `collect`;
`--probe` checks node_exporter and inference sources; a mistyped key names the key meant; `-c` after the
command; `postgresql://` store URLs; a missing PostgreSQL database is one named line; audit timings only at
DEBUG."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import run_cli
from test_chargeback import mixed

from auditor.config import SourceConfig
from auditor.probe import probe_source
from auditor.store.engine import Store


def _cfg(tmp_path: Path, body: str, url: str | None = None) -> Path:
    p = tmp_path / "c.toml"
    url = url or "sqlite:///" + str(tmp_path / "s.db")
    p.write_text(f'[store]\nurl = "{url}"\n' + body, encoding="utf-8")
    return p


EMPTY_GLOB = '''
[[clusters]]
name = "c"
[[clusters.allocations]]
kind = "file"
paths = ["jobs.csv"]
[[clusters.telemetry]]
kind = "file"
paths = ["exports/*.csv"]
'''


def test_a_glob_that_matches_nothing_fails_check_probe_and_collect(tmp_path: Path) -> None:
    """Before: `config check` said ok, `--probe` "everything answers" and `collect` exited 0 with nothing."""
    (tmp_path / "jobs.csv").write_text("id,user,start,end,gpus\n", encoding="utf-8")
    (tmp_path / "exports").mkdir()
    cfg = _cfg(tmp_path, EMPTY_GLOB)
    res = run_cli("-c", str(cfg), "config", "check")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "clusters[0].telemetry[0] (file): paths 'exports/*.csv' matches no file (looked in " in res.stderr
    assert len(res.stderr.splitlines()) == 1, res.stderr
    res = run_cli("-c", str(cfg), "config", "check", "--probe")  # every source probed, this one FAILs
    assert res.returncode == 1, res.stdout + res.stderr
    assert re.search(r"^FAIL c telemetry\[0\]:file \(exports/\*\.csv\): paths 'exports/\*\.csv' matches no file",
                     res.stdout, re.M), res.stdout
    assert re.search(r"^ok   c allocations\[0\]:file", res.stdout, re.M) and "everything answers" not in res.stdout
    res = run_cli("-c", str(cfg), "collect")
    assert res.returncode != 0 and "'exports/*.csv' matches no file" in res.stdout + res.stderr, res
    probe = probe_source("c", "telemetry", 0, SourceConfig(kind="file", paths=["exports/*.csv"]), tmp_path)
    assert not probe.ok and "matches no file" in probe.detail
    (tmp_path / "exports" / "a.csv").write_text("timestamp,host,gpu,metric,value\n", encoding="utf-8")
    assert run_cli("-c", str(cfg), "config", "check").returncode == 0


@pytest.mark.parametrize("kind", ["node_exporter", "inference"])
def test_probe_checks_node_exporter_and_inference_sources(kind: str, tmp_path: Path) -> None:
    """Before: "not probed (no address in the config ...)", ok, whatever the URL or files. (A URL that answers:
    tests of the duplicate-series probe.)"""
    down = probe_source("c", "telemetry", 0, SourceConfig(kind=kind, url="http://127.0.0.1:9", timeout_s=2),
                        tmp_path)
    assert not down.ok and "not probed" not in down.detail, down
    files = probe_source("c", "telemetry", 0, SourceConfig(kind=kind, paths=["n-*.csv"]), tmp_path)
    assert not files.ok and "matches no file" in files.detail
    (tmp_path / "n-1.csv").write_text("start\n", encoding="utf-8")
    files = probe_source("c", "telemetry", 0, SourceConfig(kind=kind, paths=["n-*.csv"]), tmp_path)
    assert files.ok and files.detail == "1 readable file"


@pytest.mark.parametrize(("typo", "meant"), [("idle_sm_activity", "idle_sm"), ("idle_smm", "idle_sm"),
                                             ("idle_gpu_fraction", "idle_gpus_fraction"),
                                             ("mirage_util", "mirage_gpu_util")])
def test_a_mistyped_key_names_the_key_meant(typo: str, meant: str, tmp_path: Path) -> None:
    """Before: idle_sm_activity suggested idle_gpus_fraction (more letters in line, not the key meant)."""
    cfg = _cfg(tmp_path, f"[thresholds]\n{typo} = 0.1\n")
    res = run_cli("-c", str(cfg), "config", "check")
    assert res.returncode == 1 and f"thresholds.{typo}: unknown key (did you mean {meant!r}?)" in res.stderr, \
        res.stderr


def test_config_after_the_command(tmp_path: Path) -> None:
    """Before: `gpu-audit config check -c FILE` was "No such option: -c"."""
    cfg = _cfg(tmp_path, "[report]\ndays = 3\n")
    for args in (("config", "check", "-c", str(cfg)), ("config", "check", "--config", str(cfg))):
        res = run_cli("--json", *args)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["ok"] is True
    res = run_cli("db", "upgrade", "-c", str(cfg))
    assert res.returncode == 0 and (tmp_path / "s.db").exists(), res.stderr
    res = run_cli("-c", str(tmp_path / "nope.toml"), "config", "check", "-c", str(cfg))  # the later one wins
    assert res.returncode == 0, res.stderr


def test_a_plain_postgresql_url_is_accepted(tmp_path: Path) -> None:
    """Before: `postgresql://` and `postgres://` were refused ("means psycopg2")."""
    for url in ("postgresql://u@127.0.0.1:9/gpu", "postgres://u@127.0.0.1:9/gpu"):
        cfg = _cfg(tmp_path, "", url)
        res = run_cli("-c", str(cfg), "config", "check")
        assert res.returncode == 0, res.stderr
    from auditor.config.base import store_url

    assert store_url("postgresql://u:p@h:5/db?sslmode=require") == "postgresql+psycopg://u:p@h:5/db?sslmode=require"
    assert store_url("POSTGRES://u@h/db") == "postgresql+psycopg://u@h/db"
    assert store_url("postgresql+psycopg2://u@h/db") == "postgresql+psycopg2://u@h/db"  # refused by the check


@pytest.mark.service
def test_postgresql_url_opens_and_a_missing_database_is_one_named_line(pg_schema_url: str, tmp_path: Path) -> None:
    """Before: `postgresql://` was refused. A missing database is one line naming the store on every command
    tried (db current/upgrade, audit); `auditor.cli._store_failure` names any driver error that escapes a
    command the same way instead of "unexpected OperationalError"."""
    plain = pg_schema_url.replace("postgresql+psycopg://", "postgresql://", 1)
    cfg = _cfg(tmp_path, "", plain)
    res = run_cli("-c", str(cfg), "db", "upgrade")
    assert res.returncode == 0, res.stderr
    res = run_cli("-c", str(cfg), "db", "current")
    assert res.returncode == 0, res.stderr
    missing = re.sub(r"/[A-Za-z0-9_]+$", "/gpu_audit_no_such_db", pg_schema_url.split("?")[0])
    cfg = _cfg(tmp_path, "", missing)
    for args in (("db", "current"), ("audit",), ("db", "upgrade")):
        res = run_cli("-c", str(cfg), *args)
        assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
        assert res.stderr.startswith("gpu-audit: error: ") and "unexpected" not in res.stderr, res.stderr
        assert 'database "gpu_audit_no_such_db" does not exist' in res.stderr, res.stderr


def test_audit_timings_only_at_debug(store_url: str, tmp_path: Path) -> None:
    """Before: every audit printed its step timings at INFO, above the demo's headline too."""
    s = Store.open(store_url)
    s.upgrade()
    s.ingest(mixed())
    s.engine.dispose()
    cfg = _cfg(tmp_path, "", store_url)
    window = ("--since", "2026-11-15T23:00", "--until", "2026-11-16T07:00")
    res = run_cli("-c", str(cfg), "audit", *window)
    assert res.returncode == 0 and "audit run 1:" in res.stdout, res.stderr
    assert "steps:" not in res.stderr and "upkeep" not in res.stderr, res.stderr
    res = run_cli("--debug", "-c", str(cfg), "audit", *window)
    assert res.returncode == 0 and re.search(r"DEBUG gpu_audit.audit: audit run 2 steps: ", res.stderr), res.stderr


@pytest.mark.service
def test_a_driver_error_escaping_a_command_is_one_named_line(pg_url: str, tmp_path: Path) -> None:
    """The catch-all of `auditor.cli` (`_store_failure`): every command shipped today meets a missing
    database inside the store's own checks (the test above), so this drives the catch-all itself. A command
    registered for this test only reads the store through its engine directly, past those checks, as a new
    command could; the database named does not exist on the PG testbed (nothing is created). The real
    driver's OperationalError must come out as one line naming the store, never "unexpected
    OperationalError" (before the catch-all: "gpu-audit: unexpected OperationalError: ...")."""
    import click
    from sqlalchemy import text

    from auditor.cli import main
    from auditor.cli.app import App, pass_app

    @main.command("_read_raw", hidden=True)
    @pass_app
    def _read_raw(app: App) -> None:
        with app.store(migrate_check=False).engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    missing = re.sub(r"/[A-Za-z0-9_]+$", "/gpu_audit_no_such_db", pg_url.split("?")[0])
    try:
        res = run_cli("-c", str(_cfg(tmp_path, "", missing)), "_read_raw")
    finally:
        main.commands.pop("_read_raw", None)
    assert isinstance(_read_raw, click.Command)
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
    assert res.stderr.startswith("gpu-audit: error: cannot use store postgresql+psycopg://"), res.stderr
    assert 'database "gpu_audit_no_such_db" does not exist' in res.stderr and "unexpected" not in res.stderr
