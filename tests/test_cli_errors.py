"""What a platform engineer meets first when something is wrong: `config check` lists every error with the
nearest known key or connector kind, an unusable store URL names the one that works, a read-only command never
creates a store, `collect` with nothing configured says so, and usage errors are one line like every other."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import click
import pytest
from conftest import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

BAD = """
[thresholds]
idel_sm = 0.1
[store]
bucket_second = 300
[[clusters]]
name = "a"
[[clusters.allocations]]
kind = "slrum"
[[clusters.telemetry]]
kind = "prometheus"
ulr = "http://x"
[[teams]]
name = "t"
acounts = ["x"]
"""


def test_config_check_lists_every_error_with_the_nearest_key(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(BAD)
    res = run_cli("-c", str(cfg), "config", "check")
    assert res.returncode == 1 and res.stdout == ""
    lines = res.stderr.splitlines()
    # six mistakes in the file above, counted by hand: one line each, none summarised as "and N more"
    assert sorted(ln.removeprefix(f"gpu-audit: error: {cfg}: ") for ln in lines) == sorted([
        "thresholds.idel_sm: unknown key (did you mean 'idle_sm'?)",
        "store.bucket_second: unknown key (did you mean 'bucket_seconds'?)",
        "teams[0].acounts: unknown key (did you mean 'accounts'?)",
        "clusters[0].allocations[0].kind: unknown connector kind 'slrum' (did you mean 'slurm'?)",
        "clusters[0].telemetry[0].url: Field required",
        "clusters[0].telemetry[0].ulr: unknown key (did you mean 'url'?)",
    ]), res.stderr
    assert all(ln.startswith(f"gpu-audit: error: {cfg}: ") for ln in lines) and "more" not in res.stderr
    data = json.loads(run_cli("--json", "-c", str(cfg), "config", "check").stdout)
    assert data["ok"] is False and len(data["errors"]) == 6


def test_a_far_off_key_gets_no_suggestion(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[report]\nzzzzzz = 1\n")
    res = run_cli("-c", str(cfg), "config", "check")
    assert res.returncode == 1 and "report.zzzzzz: unknown key" in res.stderr and "did you mean" not in res.stderr


def test_other_commands_still_stop_at_the_first_error_on_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(BAD)
    res = run_cli("-c", str(cfg), "audit")
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1
    assert "(did you mean" in res.stderr and "`gpu-audit config check` lists them" in res.stderr


def test_config_check_warns_when_no_config_file_was_read(tmp_path: Path) -> None:
    res = run_cli("config", "check", cwd=tmp_path, env={"GPU_AUDIT_CONFIG": ""})
    assert res.returncode == 0 and "config ok" in res.stdout
    assert "gpu-audit: warning: no config file read" in res.stderr
    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    res = run_cli("-c", str(cfg), "config", "check")
    assert res.returncode == 0 and "warning" not in res.stderr


@pytest.mark.parametrize("url", ["postgresql+psycopg2://u@db/gpu", "postgresql+asyncpg://u@db/gpu",
                                 "postgres+pg8000://u@db/gpu"])  # postgresql:// itself is psycopg 3 (issue 44)
def test_a_postgres_url_without_psycopg_names_the_form_that_works(tmp_path: Path, url: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nurl = "{url}"\n')
    for cmd in (("config", "check"), ("audit",)):
        res = run_cli("-c", str(cfg), *cmd)
        assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
        assert "postgresql+psycopg://" in res.stderr and "unexpected" not in res.stderr


def test_an_unsupported_backend_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[store]\nurl = "mysql://u@db/gpu"\n')
    res = run_cli("-c", str(cfg), "db", "upgrade")
    assert res.returncode == 1 and "mysql:// is not a supported store" in res.stderr and "unexpected" not in res.stderr
    cfg.write_text('[store]\nurl_env = "GA_TEST_URL"\n')  # the same check on a URL from the environment
    monkeypatch.setenv("GA_TEST_URL", "postgresql+psycopg2://u:secret@db/gpu")
    res = run_cli("-c", str(cfg), "db", "upgrade")
    assert res.returncode == 1 and "store.url_env: postgresql+psycopg2://" in res.stderr and "secret" not in res.stderr
    cfg.write_text('[store]\nurl = "postgresql+psycopg://u@127.0.0.1:9/gpu"\n')
    assert run_cli("-c", str(cfg), "config", "check").returncode == 0  # the form it names passes the check


READERS = [("audit",), ("report",), ("jobs", "--user", "x"), ("job", "hpc:1"), ("db", "current"), ("enforce",),
           ("enforce-log",), ("chargeback",), ("run", "--steps", "audit"), ("db", "prune", "--dry-run")]


@pytest.mark.parametrize("cmd", READERS, ids=lambda c: " ".join(c))
def test_a_reading_command_never_creates_the_store(tmp_path: Path, cmd: tuple[str, ...]) -> None:
    """No -c: the default store in the current directory; a typo'd path: its directories too."""
    res = run_cli(*cmd, cwd=tmp_path, env={"GPU_AUDIT_CONFIG": ""})
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
    assert f"no store at {tmp_path.resolve() / 'gpu-audit.db'}" in res.stderr
    assert "no config file read" in res.stderr and "gpu-audit db upgrade" in res.stderr
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nurl = "sqlite:///{tmp_path}/typo/s.db"\n')
    res = run_cli("-c", str(cfg), *cmd, cwd=tmp_path)
    assert res.returncode == 1 and f"store.url of config {cfg}" in res.stderr, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]


def test_the_probe_never_creates_the_store(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nurl = "sqlite:///{tmp_path}/d/s.db"\n')
    res = run_cli("-c", str(cfg), "config", "check", "--probe")
    assert res.returncode == 1 and "no store file" in res.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]


def test_writing_commands_create_the_store(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("timestamp,host,gpu,uuid,metric,value\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nurl = "sqlite:///{tmp_path}/new/s.db"\n[[clusters]]\nname = "a"\n'
                   '[[clusters.telemetry]]\nkind = "file"\npaths = ["t.csv"]\n')
    res = run_cli("-c", str(cfg), "collect")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "new" / "s.db").is_file()
    res = run_cli("--json", "-c", str(cfg), "db", "current")  # created at the newest revision
    assert res.returncode == 0 and json.loads(res.stdout)["current"] == json.loads(res.stdout)["head"]


def test_collect_with_no_sources_exits_non_zero(tmp_path: Path) -> None:
    res = run_cli("collect", cwd=tmp_path, env={"GPU_AUDIT_CONFIG": ""})
    assert res.returncode == 1 and res.stderr.startswith("gpu-audit: error: nothing to collect: no sources "
                                                         "configured (the built-in defaults")
    cfg = tmp_path / "c.toml"
    cfg.write_text('[[clusters]]\nname = "a"\n')  # a cluster, but no source in it
    res = run_cli("-c", str(cfg), "collect", cwd=tmp_path)
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1 and f"(config {cfg})" in res.stderr
    res = run_cli("-c", str(cfg), "collect", "--cluster", "nope", cwd=tmp_path)
    assert res.returncode == 1 and "unknown cluster 'nope'" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]


def test_run_help_lists_every_step_and_job_help_every_ref_form() -> None:
    text = " ".join(run_cli("run", "--help").stdout.split())
    for step in ("collect", "audit", "report", "notify", "enforce", "chargeback"):  # docs/operations.md's list
        assert step in text.split("--steps TEXT")[1][:200], text
    text = " ".join(run_cli("job", "--help").stdout.split())
    assert "bare job id" in text and "CLUSTER:POD-UID" in text and "CLUSTER:JOBID" in text


@pytest.mark.parametrize("args, says", [
    (("--bogus",), "No such option '--bogus'"),
    (("audit", "--sinc", "now"), "Did you mean '--since'?"),
    (("db", "upgrade", "--rev", "x"), "Did you mean '--revision'?"),
    (("job",), "Missing argument 'REF'"),
    (("report", "--format", "pdf"), "'pdf' is not one of"),
    (("demo", "--seed", "x"), "'x' is not a valid integer"),
    (("config", "check", "extra"), "unexpected extra argument"),
])
def test_usage_errors_are_one_line_with_exit_2(args: tuple[str, ...], says: str) -> None:
    res = run_cli(*args)
    assert res.returncode == 2 and res.stdout == ""
    assert len(res.stderr.splitlines()) == 1 and res.stderr.startswith("gpu-audit: error: "), res.stderr
    assert says in res.stderr and "Usage:" not in res.stderr and "Try '" not in res.stderr


def test_a_group_without_a_command_still_shows_its_help() -> None:
    res = run_cli("db")
    assert "Usage:" in res.stdout + res.stderr and "upgrade" in res.stdout + res.stderr


@pytest.mark.parametrize("since, until, start, end", [
    # --until 2026-03-04T10:30 (a Wednesday); each expected value worked out by hand from it
    ("today", "2026-03-04T10:30", "2026-03-04T00:00", "2026-03-04T10:30"),
    ("midnight", "2026-03-04T10:30", "2026-03-04T00:00", "2026-03-04T10:30"),
    ("noon", "2026-03-04T10:30", "2026-03-03T12:00", "2026-03-04T10:30"),  # the latest noon: yesterday's
    ("now-36h", "2026-03-04T10:30", "2026-03-02T22:30", "2026-03-04T10:30"),
    ("03/01", "2026-03-04T10:30", "2026-03-01T00:00", "2026-03-04T10:30"),
    ("12/30", "2026-03-04T10:30", "2025-12-30T00:00", "2026-03-04T10:30"),  # no year: the latest 30 Dec
    ("12/30/25", "03/02/26-08:15", "2025-12-30T00:00", "2026-03-02T08:15"),
    ("2026-03-01", "2026-03-02T00:00+01:00", "2026-03-01T00:00", "2026-03-01T23:00"),
])
def test_sacct_style_times(tmp_path: Path, since: str, until: str, start: str, end: str) -> None:
    """Through a command that takes times and prints the window it used (an empty store: nothing judged)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nurl = "sqlite:///{tmp_path / "s.db"}"\n')
    assert run_cli("-c", str(cfg), "db", "upgrade").returncode == 0
    res = run_cli("--json", "-c", str(cfg), "audit", "--since", since, "--until", until)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert (data["since"], data["until"]) == (f"{start}:00+00:00", f"{end}:00+00:00")


@pytest.mark.parametrize("text", ["02/30", "13/01", "03/01-25:00", "last tuesday", "tomorrow-ish"])
def test_bad_sacct_times_are_one_line(text: str) -> None:
    res = run_cli("audit", "--since", text)
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1 and "cannot parse time" in res.stderr


def test_deploy_prints_the_shipped_files() -> None:
    root = Path(__file__).resolve().parent.parent / "deploy"
    res = run_cli("deploy", "dcgm-counters")
    assert res.returncode == 0 and res.stdout == (root / "dcgm-counters.csv").read_text(encoding="utf-8")
    assert "DCGM_FI_PROF_SM_ACTIVE" in res.stdout
    res = run_cli("deploy", "example-config")
    assert res.returncode == 0 and res.stdout == (root / "example-config.toml").read_text(encoding="utf-8")


def test_the_counters_advice_names_the_command_that_prints_the_file() -> None:
    from auditor.audit.findings import COUNTERS_ADVICE

    cmd = COUNTERS_ADVICE.split("`")[1].split(">")[0].split()  # the command the advice names, run as written
    assert cmd[0] == "gpu-audit"
    res = run_cli(*cmd[1:])
    assert res.returncode == 0 and "DCGM_FI_PROF_SM_ACTIVE" in res.stdout


def _commands(cmd: click.Command, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    out = [(path, cmd)]
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            out += _commands(sub, (*path, name))
    return out


def test_every_command_and_flag_is_documented() -> None:
    """README.md and docs/ name every command (`gpu-audit demo`) and every long option of it (`--fresh`)."""
    from auditor.cli import main

    root = Path(__file__).resolve().parent.parent
    docs = "\n".join(p.read_text() for p in (root / "docs").glob("*.md")) + (root / "README.md").read_text()
    missing = []
    for path, cmd in _commands(main):
        name = " ".join(("gpu-audit", *path))
        if path and name not in docs:
            missing.append(name)
        missing += [f"{name} {o}" for p in cmd.params if isinstance(p, click.Option) for o in p.opts
                    if o.startswith("--") and o != "--help" and o not in docs]
    assert not missing, f"undocumented commands or flags: {missing}"


@settings(max_examples=300, deadline=None)
@given(st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2037, 12, 31), timezones=st.just(UTC)),
       st.integers(1, 12), st.integers(1, 31), st.sampled_from(["", "-00:00", "-23:59", "-12:30:15"]))
def test_a_date_without_a_year_is_the_latest_one_at_or_before_now(now: datetime, month: int, day: int,
                                                                   clock: str) -> None:
    """sacct's reading of MM/DD: this year's, or last year's when this year's is still to come."""
    from auditor.timeutil import parse_time

    try:
        got = parse_time(f"{month:02d}/{day:02d}{clock}", now=now)
    except ValueError:  # 02/30, or 02/29 in a year that has none
        assert day > 28 and month == 2 or day == 31 and month in (4, 6, 9, 11) or day > 29 and month == 2
        return
    assert (got.month, got.day) == (month, day) and got <= now
    assert got.year in (now.year, now.year - 1) and (got.year == now.year or got.replace(year=now.year) > now)
