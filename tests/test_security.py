"""Security: hostile strings are inert data, secrets never leave, log lines cannot be forged, and a secrets
file others can read is warned about.

HTML/CSV/email escaping and TLS defaults are tested by their owners (see docs/reliability.md)."""

from __future__ import annotations

import csv
import json
import os
import sqlite3
import subprocess
import uuid
import warnings
from pathlib import Path

import pytest
from conftest import run_cli
from helpers_crash import REPO

from auditor.config import SecretRef
from auditor.logs import log_safe

HOSTILE = ["<img src=x onerror=alert(1)>", "; rm -rf /", "$(touch {pwned})", "`touch {pwned}`",
           "a\nb\r\x1b[31mred\x07", "=HYPERLINK(\"http://evil\",\"x\")", "' OR 1=1; DROP TABLE allocations; --"]


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return run_cli(*args, env=env, cwd=cwd)  # in this process: what the CLI does with hostile input is the point


def test_hostile_job_names_are_inert_and_stored_verbatim(tmp_path: Path) -> None:
    pwned = tmp_path / f"pwned-{uuid.uuid4().hex[:8]}"
    names = [h.format(pwned=pwned) for h in HOSTILE]
    with (tmp_path / "alloc.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "name", "user", "account", "start", "end", "gpus"])
        for i, name in enumerate(names):
            w.writerow([str(i), name, name[:40], name[:20], "2026-11-20T00:00:00Z", "2026-11-20T03:00:00Z", f"n0:{i}"])
    with (tmp_path / "tel.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["timestamp", "host", "gpu", "uuid", "metric", "value"])
        for t in range(0, 3 * 3600, 300):
            for i in range(len(names)):
                w.writerow([1795132800 + t, "n0", i, f"GPU-{i}", "sm_active", 0.0])
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nurl = "sqlite:///{tmp_path / "s.db"}"\n[[clusters]]\nname = "c"\ninitial_days = 30\n'
                   '[[clusters.allocations]]\nkind = "file"\npaths = ["alloc.csv"]\n'
                   '[[clusters.telemetry]]\nkind = "file"\npaths = ["tel.csv"]\n')
    assert cli("-c", str(cfg), "db", "upgrade").returncode == 0
    res = cli("-c", str(cfg), "--json", "run", "--steps", "collect,audit", "--since", "2026-11-20",
              "--until", "2026-11-21", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert not pwned.exists() and not list(tmp_path.glob("pwned*")), "a job name was executed"
    with sqlite3.connect(tmp_path / "s.db") as db:
        stored = dict(db.execute("SELECT external_id, name FROM allocations").fetchall())
        assert [stored[str(i)] for i in range(len(names))] == names
        assert db.execute("SELECT count(*) FROM findings").fetchone()[0] >= 1  # the audit ran over them
    res = cli("-c", str(cfg), "--json", "audit", "--since", "2026-11-20", "--until", "2026-11-21", cwd=tmp_path)
    assert res.returncode == 0 and json.loads(res.stdout)["reserved_gpu_hours"] == pytest.approx(3 * len(names))
    assert not pwned.exists()


def _secret_config(tmp_path: Path) -> tuple[Path, dict[str, str], list[str]]:
    token = uuid.uuid4().hex[:10]
    secrets = {"SEC_SMTP": f"smtp-pw-{token}", "SEC_PROM": f"prom-bearer-{token}", "SEC_PROMPW": f"prom-basic-{token}",
               "SEC_K8S": f"k8s-token-{token}", "SEC_JWT": f"slurm-jwt-{token}"}
    url_pw = f"urlpw{token}"
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[store]\nurl = "sqlite:///{tmp_path / "s.db"}"\n'
        '[email]\nusername = "mailer"\npassword = { env = "SEC_SMTP" }\nsmtp_host = "127.0.0.1"\nsmtp_port = 9\n'
        'admin_to = ["ops@example.com"]\n'
        '[[clusters]]\nname = "c"\n'
        '[[clusters.allocations]]\nkind = "kubernetes"\nhost = "http://127.0.0.1:9"\ntoken = { env = "SEC_K8S" }\n'
        'timeout_s = 2\n'
        '[[clusters.allocations]]\nkind = "slurm"\nbackend = "rest"\nrest_url = "http://127.0.0.1:9"\n'
        'rest_token = { env = "SEC_JWT" }\ntimeout_s = 2\n'
        f'[[clusters.telemetry]]\nkind = "prometheus"\nurl = "http://scraper:{url_pw}@127.0.0.1:9"\n'
        'bearer_token = { env = "SEC_PROM" }\nusername = "u"\npassword = { env = "SEC_PROMPW" }\ntimeout_s = 2\n')
    return cfg, secrets, [*secrets.values(), url_pw]


@pytest.mark.parametrize("args", [
    ["--json", "config", "check"], ["--debug", "config", "check"], ["--debug", "collect"],
    ["--debug", "run", "--steps", "collect,audit,notify", "--dry-run"],
    ["--json", "run", "--steps", "collect,audit,report,notify"],
])
def test_secrets_never_in_output_logs_or_store(tmp_path: Path, args: list[str]) -> None:
    for mod in ("connectors.kubernetes", "connectors.slurm", "connectors.prometheus"):
        pytest.importorskip(mod)
    cfg, env, planted = _secret_config(tmp_path)
    assert cli("-c", str(cfg), "db", "upgrade").returncode == 0
    extra = ["--out", str(tmp_path / "out")] if "--steps" in args else []
    res = cli("-c", str(cfg), *args, *extra, env=env)
    outputs = res.stdout + res.stderr
    for f in (tmp_path / "out").rglob("*") if (tmp_path / "out").exists() else []:
        if f.is_file():
            outputs += f.read_text(errors="replace")
    with sqlite3.connect(tmp_path / "s.db") as db:
        outputs += "\n".join(db.iterdump())
    assert "Traceback" not in res.stderr or "--debug" in args
    for secret in planted:
        assert secret not in outputs, f"planted secret leaked by {args}"


def test_inline_store_password_not_printed_by_config_check(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[store]\nurl = "postgresql+psycopg://u:InlinePw42@127.0.0.1:9/x"\n')
    res = cli("-c", str(cfg), "--json", "config", "check")
    assert res.returncode == 0 and "InlinePw42" not in res.stdout + res.stderr


@pytest.mark.parametrize("command", [["collect"], ["--debug", "db", "current"], ["--json", "db", "upgrade"]])
def test_store_password_not_in_store_errors(tmp_path: Path, command: list[str]) -> None:
    cfg = tmp_path / "c.toml"
    # a source, so collect gets as far as the store (with nothing to collect it stops before opening it)
    cfg.write_text('[store]\nurl_env = "SEC_STORE"\n[[clusters]]\nname = "c"\n[[clusters.telemetry]]\n'
                   'kind = "file"\npaths = ["t.csv"]\n')
    res = cli("-c", str(cfg), *command, env={"SEC_STORE": "postgresql+psycopg://u:StorePw77@127.0.0.1:9/x"})
    assert res.returncode != 0 and "127.0.0.1" in res.stderr
    assert "StorePw77" not in res.stdout + res.stderr


def test_log_lines_cannot_be_forged(tmp_path: Path) -> None:
    assert log_safe("a\nINFO forged\r\x1b[2J\x00") == "a\\x0aINFO forged\\x0d\\x1b[2J\\x00"
    name = "evil\nINFO gpu_audit: forged line.csv"
    (tmp_path / name).write_text("id,start,gpus\n1,not-a-time,n0:0\n2,2026-11-20,n0:1\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nurl = "sqlite:///{tmp_path / "s.db"}"\n[[clusters]]\nname = "c"\n'
                   f'[[clusters.allocations]]\nkind = "file"\npaths = [{json.dumps(name)}]\n')
    assert cli("-c", str(cfg), "db", "upgrade").returncode == 0
    res = cli("-c", str(cfg), "collect", "--since", "2026-11-19", "--until", "2026-11-22")
    assert res.returncode == 0, res.stderr
    assert "cannot parse time" in res.stderr and "\\x0aINFO gpu_audit: forged" in res.stderr
    assert not any(line.startswith("INFO gpu_audit: forged") for line in res.stderr.splitlines())


def test_secret_file_readable_by_others_warns_without_the_secret(tmp_path: Path) -> None:
    f = tmp_path / "pw"
    f.write_text("file-secret-123\n")
    f.chmod(0o644)
    with pytest.warns(UserWarning, match="readable by group/others") as caught:
        assert SecretRef(file=f).resolve("email.password") == "file-secret-123"
    assert all("file-secret-123" not in str(w.message) for w in caught)
    f.chmod(0o600)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert SecretRef(file=f).resolve("email.password") == "file-secret-123"
    assert "file-secret-123" not in repr(SecretRef(file=f))


def test_secret_values_not_in_config_dumps(tmp_path: Path) -> None:
    from auditor.config import parse

    os.environ["SEC_DUMP_TEST"] = "dump-secret-456"
    try:
        cfg = parse({"email": {"password": {"env": "SEC_DUMP_TEST"}}})
        assert cfg.email.password.resolve("email.password") == "dump-secret-456"
        assert "dump-secret-456" not in repr(cfg) + cfg.model_dump_json() + str(cfg.model_dump())
    finally:
        del os.environ["SEC_DUMP_TEST"]
