"""The guard of tests/conftest.py: a test not marked `service` that reaches a live service fails, even when the
code under test swallows the refusal, and even when the call is made by a child process; a marked test is
left alone. Checked on a throw-away test file run by a real pytest with this conftest."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

INNER = '''
import socket, sqlite3, subprocess, sys
import pytest

def test_drain_swallowed():
    try:
        subprocess.run(["scontrol", "update", "nodename=n1", "state=drain"], capture_output=True)
    except OSError:
        pass  # code that treats a refusal as "Slurm not installed"

def test_postgres_port():
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", 5432), timeout=1)

def test_child_process_sinfo():
    subprocess.run([sys.executable, "-c", "import subprocess; subprocess.run(['sinfo'])"], check=False)

def test_sqlite_outside_temp(tmp_path):
    sqlite3.connect(str(tmp_path / "ok.db")).close()  # inside the temp dirs: fine
    with pytest.raises(OSError):
        sqlite3.connect("/var/tmp-not/gpu-audit-guard-test.db")

def test_loopback_own_server_is_fine():
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
    socket.create_connection(srv.getsockname(), timeout=1).close(); srv.close()

@pytest.mark.service
def test_marked_is_left_alone():
    assert subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True).returncode == 0
'''


def test_guard_fails_unmarked_tests_that_reach_services(tmp_path: Path) -> None:
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_inner.py").write_text(INNER)
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "-W", "ignore::pytest.PytestUnknownMarkWarning", str(tmp_path)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, check=False)
    out = res.stdout
    # each offender fails at teardown with what it reached (the swallowed one too); the rest pass
    for name, what in [("test_drain_swallowed", "command scontrol update nodename=n1 state=drain"),
                       ("test_postgres_port", "connect to 127.0.0.1:5432"),
                       ("test_child_process_sinfo", "command (child process) sinfo"),
                       ("test_sqlite_outside_temp", "SQLite database /var/tmp-not/gpu-audit-guard-test.db")]:
        section = out.split(f"ERROR at teardown of {name} ", 1)[-1].split("\n___", 1)[0]
        assert f"ERROR at teardown of {name} " in out and what in section, (name, out[-3000:])
    for name in ("test_loopback_own_server_is_fine", "test_marked_is_left_alone"):
        assert any(x.startswith("PASSED") and name in x for x in out.splitlines()), (name, out[-3000:])
    assert "4 errors" in out.splitlines()[-1], out[-1500:]
