"""Shared test helpers. Real-service tests call :func:`need` : it skips with a reason on a laptop without
the service, and fails when CI is set, so CI can never silently skip them.

Live services are opt-in and positively identified: a test may reach Slurm, Prometheus, VictoriaMetrics,
PostgreSQL, SMTP or Chromium only when it is marked ``service``, and only the project's own testbed, known by
what the testbed scripts create (``scripts/testbed-*.sh``: a marker file that the live service's own answer
must match, a dedicated database carrying a comment). :func:`_live_service_guard` fails every other test that
reaches one. The migrated store is built once per run and copied per test (:func:`store`)."""

from __future__ import annotations

import functools
import ipaddress
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
IN_CI = bool(os.environ.get("CI"))


def need(available: bool, reason: str) -> None:
    """Skip (laptop) or fail (CI) when a real service a test needs is not there."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"required service missing in CI: {reason}")
    pytest.skip(reason)


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# --- Testbed identification -----------------------------------------------------------------------------
# Each testbed script writes a marker (key=value lines); a live service is the testbed only when its own
# answer matches the marker (Slurm's cluster name and state directory, the TSDB path a Prometheus or
# VictoriaMetrics reports, the database name and its comment). Anything else that answers is not touched.

MARKER_NAME = "gpu-audit-testbed"
SLURM_TESTBED_BASE = Path(os.environ.get("SLURM_TESTBED_BASE", "/var/lib/gpu-audit-slurm-testbed"))
TSDB_TESTBED_ROOT = Path(os.environ.get("TESTBED_ROOT", "/var/lib/gpu-audit-testbed"))
PG_DB = "gpu_audit_test"  # scripts/testbed-postgres.sh
PG_MARKER = "gpu-audit test database (scripts/testbed-postgres.sh)"
PG_URL = os.environ.get("GPU_AUDIT_TEST_PG", f"postgresql+psycopg://postgres@127.0.0.1:5432/{PG_DB}")
_GUARD_ENV = "GPU_AUDIT_TEST_GUARD"  # set while the guard is on: identification results are then not cached


def read_marker(path: Path) -> dict[str, str] | None:
    """The key=value lines of a testbed marker file, or None when there is none."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def _identified(check: Any) -> Any:
    """Cache an identification for the session, except while the guard is on (a refused call is no answer)."""
    cache: dict[tuple[Any, ...], str | None] = {}

    @functools.wraps(check)
    def wrapper(*args: Any) -> str | None:
        if args in cache:
            return cache[args]
        reason = check(*args)
        if not os.environ.get(_GUARD_ENV):
            cache[args] = reason
        return reason

    return wrapper


@_identified
def slurm_testbed() -> str | None:
    """None when the Slurm that answers here is scripts/testbed-slurm.sh's cluster, else why it is not used."""
    marker = read_marker(SLURM_TESTBED_BASE / MARKER_NAME)
    if marker is None:
        return f"no Slurm testbed marker {SLURM_TESTBED_BASE / MARKER_NAME} (run: bash scripts/testbed-slurm.sh up)"
    if not (shutil.which("scontrol") and shutil.which("sbatch")):
        return "no Slurm testbed: no Slurm client commands on PATH (run: bash scripts/testbed-slurm.sh up)"
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10)
        conf = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no Slurm testbed: scontrol: {exc}"
    if ping.returncode or "UP" not in ping.stdout or conf.returncode:
        return "no Slurm testbed: slurmctld does not answer (run: bash scripts/testbed-slurm.sh up)"
    live = {k.strip(): v.strip() for k, _, v in (line.partition("=") for line in conf.stdout.splitlines())}
    got = (live.get("ClusterName"), live.get("StateSaveLocation"))
    if got != (marker.get("cluster"), marker.get("state")):
        return (f"no Slurm testbed: the Slurm that answers is cluster {got[0]!r} (state {got[1]!r}), not the testbed "
                f"{marker.get('cluster')!r} of {SLURM_TESTBED_BASE}: not touched")
    return None


@_identified
def tsdb_testbed(url: str, directory: Path) -> str | None:
    """None when the Prometheus or VictoriaMetrics at ``url`` is the testbed of ``directory`` (it reports the
    marker's storage path), else why it is not used."""
    marker = read_marker(Path(directory) / MARKER_NAME)
    if marker is None:
        return f"no testbed marker {Path(directory) / MARKER_NAME} (run: bash scripts/testbed-*.sh up)"
    if marker.get("url") != url.rstrip("/"):
        return f"{url} is not the URL of the testbed in {directory} ({marker.get('url')})"
    try:
        if marker.get("kind") == "prometheus":
            import json

            with urllib.request.urlopen(f"{url}/api/v1/status/flags", timeout=5) as resp:  # noqa: S310
                path = json.load(resp)["data"].get("storage.tsdb.path")
            want = marker.get("tsdb")
        else:
            with urllib.request.urlopen(f"{url}/flags", timeout=5) as resp:  # noqa: S310
                flags = dict(line.split("=", 1) for line in resp.read().decode().splitlines() if "=" in line)
            path, want = flags.get("-storageDataPath", "").strip('"'), marker.get("data")
    except (OSError, ValueError, KeyError) as exc:
        return f"the testbed at {url} does not answer ({exc})"
    if not path or path != want:
        return f"{url} stores in {path!r}, not the testbed's {want!r}: not touched"
    return None


@_identified
def pg_testbed(url: str) -> str | None:
    """None when ``url`` is the dedicated test database of scripts/testbed-postgres.sh, else why not."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    if u.database != PG_DB:
        return f"PostgreSQL database {u.database!r} is not the dedicated test database {PG_DB!r}: not touched"
    if not port_open(u.host or "127.0.0.1", u.port or 5432):
        return f"PostgreSQL on {u.host}:{u.port or 5432} is not running"
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed"
    try:
        with psycopg.connect(host=u.host, port=u.port or 5432, user=u.username, password=u.password,
                             dbname=u.database, connect_timeout=5) as conn:
            row = conn.execute("SELECT shobj_description(oid, 'pg_database') FROM pg_database "
                               "WHERE datname = current_database()").fetchone()
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0]
        return f"PostgreSQL database {PG_DB}: {first} (run: bash scripts/testbed-postgres.sh up)"
    if not row or row[0] != PG_MARKER:
        return f"database {PG_DB} lacks the testbed comment (run: bash scripts/testbed-postgres.sh up)"
    return None


def need_slurm() -> None:
    reason = slurm_testbed()
    need(reason is None, reason or "")


def need_tsdb(url: str, directory: Path) -> None:
    reason = tsdb_testbed(url, directory)
    need(reason is None, reason or "")


def need_pg(url: str = PG_URL) -> str:
    """The URL of the identified test database (skip on a laptop, fail in CI otherwise)."""
    reason = pg_testbed(url)
    need(reason is None, reason or "")
    return url


# --- The guard: tests not marked `service` reach no live service -------------------------------------------

# Slurm clients, the TSDB and browser binaries, database clients: running one is touching a live service.
SERVICE_COMMANDS = frozenset({
    "scontrol", "sbatch", "squeue", "scancel", "sinfo", "sacct", "sacctmgr", "srun", "salloc", "sreport",
    "sprio", "sshare", "sstat", "sdiag", "strigger", "scrontab", "slurmrestd", "promtool", "prometheus",
    "victoria-metrics", "vmalert", "chromium", "chromium-browser", "google-chrome", "chrome", "headless_shell", "psql",
    "mysql", "mariadb"})
# The testbeds' and the usual services' ports: PostgreSQL, MariaDB, Slurm (ctld, slurmd, dbd, restd, the
# testbed's slurmd ports), Prometheus/VictoriaMetrics (testbeds and defaults), SMTP.
SERVICE_PORTS = frozenset({5432, 3306, 6817, 6818, 6819, 6820, 6831, 6832, 19090, 19091, 19092, 19093, 19094,
                           19095, 9090, 8428, 25, 465, 587})
SERVICE_SOCKETS = ("/run/munge", "/var/run/munge", "/run/postgresql", "/var/run/postgresql", "/run/mysqld",
                   "/var/run/mysqld", "/tmp/.s.PGSQL")
_DOC_NETS = [ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")]
_SHELLS = {"sh", "bash", "dash", "zsh"}
_TEMP_ROOTS = tuple({os.path.realpath(tempfile.gettempdir()), "/tmp", "/dev/shm"})


def _words(command: str) -> list[str]:
    for sep in ";|&()`":
        command = command.replace(sep, " ")
    return command.split()


class _Guard:
    """What one unmarked test tried: each attempt is refused (an OSError) and fails the test at teardown,
    so a library that swallows the error cannot hide it."""

    def __init__(self, log: Path, bin_dir: Path) -> None:
        self.log = log
        self.bin = os.path.realpath(bin_dir)
        self.hits: list[str] = []

    def refuse(self, what: str) -> None:
        self.hits.append(what)
        raise PermissionError(f"test not marked `service` reached a live service: {what}")

    def check_address(self, family: int, address: Any) -> None:
        if family == getattr(socket, "AF_UNIX", None):
            path = address.decode(errors="replace") if isinstance(address, bytes) else str(address)
            if path.startswith(SERVICE_SOCKETS):
                self.refuse(f"unix socket {path}")
            return
        if family not in (socket.AF_INET, socket.AF_INET6) or not isinstance(address, tuple):
            return
        host, port = str(address[0]), int(address[1])
        if port in SERVICE_PORTS:
            self.refuse(f"connect to {host}:{port}")
        try:
            ip = ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            if host != "localhost":
                self.refuse(f"connect to {host}:{port}")
            return
        if not (ip.is_loopback or ip.is_unspecified or any(ip in net for net in _DOC_NETS)):
            self.refuse(f"connect to {host}:{port} (not loopback)")

    def check_command(self, args: Any, executable: Any, env: Any, cwd: Any) -> None:
        words = [str(a) for a in args] if isinstance(args, list | tuple) else _words(str(args))
        cands = words[:1] + ([str(executable)] if executable else [])
        if words and os.path.basename(words[0]) in _SHELLS and "-c" in words[:-1]:
            cands += _words(words[words.index("-c") + 1])
        if "run-driver" in words:  # Playwright's driver: it starts a browser
            self.refuse(f"command {' '.join(words)[:200]}")
        path = (env or os.environ).get("PATH", os.defpath)
        for cand in cands:
            if os.path.basename(cand) not in SERVICE_COMMANDS:
                continue
            where = cand if "/" in cand else shutil.which(cand, path=path)
            if where and "/" in cand and cwd and not os.path.isabs(cand):
                where = os.path.join(str(cwd), cand)
            real = os.path.realpath(where) if where else ""
            # a stand-in the test wrote into its own temp dir is the test's, not a live service
            if real.startswith(_TEMP_ROOTS) and not real.startswith(self.bin):
                continue
            self.refuse(f"command {' '.join(words)[:200]}")

    def check_sqlite(self, database: Any) -> None:
        path = str(database)
        if path in ("", ":memory:") or path.startswith("file::memory:") or "mode=memory" in path:
            return
        if path.startswith("file:"):
            path = path[5:].split("?", 1)[0]
        real = os.path.realpath(path)
        if not (real.startswith(_TEMP_ROOTS) or real.startswith(str(FIXTURES.resolve()))):
            self.refuse(f"SQLite database {real} outside the temp dirs")


def _stand_in(name: str) -> str:
    return ("#!/bin/sh\n"
            f'printf "%s\\n" "{name} $*" >> "${{{_GUARD_ENV}:-/dev/null}}"\n'
            f'echo "gpu-audit tests: {name} reaches a live service; this test is not marked service" >&2\n'
            "exit 97\n")


@pytest.fixture(scope="session")
def _guard_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Stand-ins for the service commands, first on PATH for unmarked tests, so a CLI run as a subprocess is
    refused too (they record the call to the test's guard log and exit 97)."""
    d = tmp_path_factory.mktemp("service-guard")
    for name in SERVICE_COMMANDS:
        (d / name).write_text(_stand_in(name))
        (d / name).chmod(0o755)
    return d


@pytest.fixture(autouse=True)
def _live_service_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, _guard_bin: Path,
                        tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Fail any test not marked ``service`` that reaches a live service: a socket to a service port, a
    non-loopback address or a service's unix socket; a Slurm/TSDB/browser/database command (in this process
    or, through PATH, in a child); a PostgreSQL connection; an SQLite file outside the temp dirs."""
    if request.node.get_closest_marker("service"):
        yield
        return
    log = tmp_path_factory.getbasetemp() / f"guard-{uuid.uuid4().hex}.log"
    guard = _Guard(log, _guard_bin)
    monkeypatch.setenv(_GUARD_ENV, str(log))
    monkeypatch.setenv("PATH", f"{_guard_bin}{os.pathsep}{os.environ.get('PATH', '')}")

    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def connect(self: socket.socket, address: Any) -> None:
        guard.check_address(self.family, address)
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        guard.check_address(self.family, address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)

    real_execute = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def execute_child(self: subprocess.Popen, args: Any, executable: Any, *rest: Any, **kw: Any) -> Any:
        guard.check_command(args, executable, rest[4] if len(rest) > 4 else None, rest[3] if len(rest) > 3 else None)
        return real_execute(self, args, executable, *rest, **kw)

    monkeypatch.setattr(subprocess.Popen, "_execute_child", execute_child)

    real_sqlite = sqlite3.connect

    def sqlite_connect(database: Any, *a: Any, **kw: Any) -> Any:
        guard.check_sqlite(database)
        return real_sqlite(database, *a, **kw)

    monkeypatch.setattr(sqlite3, "connect", sqlite_connect)
    monkeypatch.setattr(sqlite3.dbapi2, "connect", sqlite_connect)  # what SQLAlchemy's pysqlite dialect calls
    try:
        import psycopg
    except ImportError:
        psycopg = None  # type: ignore[assignment]
    if psycopg is not None:  # libpq opens its own sockets: judge the address it would connect to
        real_pg = psycopg.Connection.connect

        def pg_check(conninfo: str = "", **kw: Any) -> None:
            from psycopg.conninfo import conninfo_to_dict

            params = conninfo_to_dict(conninfo, **kw)
            host, port = str(params.get("host") or "/run/postgresql"), int(str(params.get("port") or 5432))
            if host.startswith("/"):
                guard.refuse(f"a PostgreSQL connection over {host}")
            for h in host.split(","):
                guard.check_address(socket.AF_INET6 if ":" in h else socket.AF_INET, (h, port))

        def pg_connect(conninfo: str = "", **kw: Any) -> Any:
            pg_check(conninfo, **kw)
            return real_pg(conninfo, **kw)

        monkeypatch.setattr(psycopg, "connect", pg_connect)
        monkeypatch.setattr(psycopg.Connection, "connect", classmethod(lambda cls, conninfo="", **kw:
                                                                        pg_connect(conninfo, **kw)))
    yield
    children = log.read_text(errors="replace").splitlines() if log.exists() else []
    hits = guard.hits + [f"command (child process) {line}" for line in children]
    if hits:
        pytest.fail("test not marked `service` reached live services (mark it and use the testbed "
                    f"identification in tests/conftest.py): {'; '.join(dict.fromkeys(hits))}", pytrace=False)


PG_FIXTURES = {"pg_url", "pg_schema_url"}  # a test that asks for one uses PostgreSQL: a service test


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: unknown under -p no:xdist
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: one worker per CPU, plus one for the serial group when the Slurm testbed is here. That group
    runs in one worker and spends most of its time waiting on real Slurm jobs (an act window of idle time,
    a requeue), about 40 s of CPU in 10 minutes; without the extra worker the other tests get one CPU of two
    meanwhile. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still overrides."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    if config.getoption("markexpr", "") and "not service" in config.getoption("markexpr", ""):
        return None
    if not (SLURM_TESTBED_BASE / MARKER_NAME).is_file():
        return None  # no testbed: the serial tests skip (or fail under CI) at once, no worker waits on them
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cpus + 1


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that takes a PostgreSQL fixture is a ``service`` test even when it does not say so. Tests marked
    ``serial`` share the Slurm testbed: under pytest-xdist (``--dist loadgroup``) they all run in one worker,
    one after another; a service test of a module that uses the Slurm testbed (it has ``slurm_ready``) is
    serial even when it does not say so."""
    for item in items:
        if PG_FIXTURES & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker("service"):
            item.add_marker(pytest.mark.service)
        module = getattr(item, "module", None)
        if item.get_closest_marker("service") and getattr(module, "slurm_ready", None) is not None:
            item.add_marker(pytest.mark.serial)
        if item.get_closest_marker("serial"):
            item.add_marker(pytest.mark.xdist_group("serial"))


# --- Fixtures ----------------------------------------------------------------------------------------------

@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def pg_url() -> str:
    """The dedicated test database (scripts/testbed-postgres.sh); tests work in fresh schemas of it."""
    return need_pg()


@contextmanager
def pg_schema(pg_url: str, prefix: str = "t") -> Iterator[str]:
    """A URL whose search_path is a fresh, uniquely named schema, dropped afterwards (tests share the test
    database). Only ever in the identified test database."""
    from sqlalchemy import create_engine, text

    need_pg(pg_url)
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    engine = create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{name}"'))
    sep = "&" if "?" in pg_url else "?"
    try:
        yield f"{pg_url}{sep}options=-csearch_path%3D{name}"
    finally:
        with engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{name}" CASCADE'))
        engine.dispose()


@pytest.fixture
def pg_schema_url(pg_url: str) -> Iterator[str]:
    with pg_schema(pg_url) as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.service)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Both engines: an SQLite file, and a real PostgreSQL schema (service test)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("pg_schema_url")


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One SQLite store migrated to head per run (per xdist worker); tests get a copy (ms, not a migration)."""
    from auditor.store.engine import Store

    path = tmp_path_factory.mktemp("store-template") / "store.db"
    s = Store.open(f"sqlite:///{path}")
    s.upgrade()
    s.engine.dispose()
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0
    return path


_PG_MIGRATION: list[tuple[str, Any]] = []  # the statements of one real migration to head, replayed per schema


def _pg_migration(url: str) -> list[tuple[str, Any]]:
    """The SQL one real `upgrade` to head runs on an empty schema, recorded once per run: replaying it into a
    fresh empty schema gives the same tables, indexes, comments and alembic_version row."""
    if _PG_MIGRATION:
        return _PG_MIGRATION
    from sqlalchemy import create_engine, event, text

    from auditor.store.engine import Store

    name = f"tmpl_{uuid.uuid4().hex[:12]}"
    admin = create_engine(url)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{name}"'))
    recorded: list[tuple[str, Any]] = []
    try:
        s = Store.open(f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{name}")

        def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
            recorded.append((statement.replace(name, "\0schema\0"), parameters))

        event.listen(s.engine, "before_cursor_execute", record)
        s.upgrade()
        s.engine.dispose()
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{name}" CASCADE'))
        admin.dispose()
    _PG_MIGRATION[:] = recorded
    return _PG_MIGRATION


def _pg_replay(store: Any, url: str) -> None:
    """Replay the recorded migration into the (empty) schema of ``url``, a :func:`pg_schema` URL."""
    m = re.search(r"[?&]options=-csearch_path%3D(\w+)", url)
    assert m, f"not a pg_schema URL: {url}"
    with store.engine.begin() as conn:
        for statement, parameters in _pg_migration(url[:m.start()] + url[m.end():]):
            conn.exec_driver_sql(statement.replace("\0schema\0", m.group(1)), parameters)


@pytest.fixture
def store(store_url: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A store at the newest revision: a copy of the run's migrated SQLite file, or on PostgreSQL the run's
    recorded migration replayed into the test's fresh schema (checked against alembic's head)."""
    from auditor.store.engine import Store

    if store_url.startswith("sqlite:///"):
        shutil.copyfile(request.getfixturevalue("_sqlite_template"), store_url[len("sqlite:///"):])
        s = Store.open(store_url)
    else:
        s = Store.open(store_url)
        _pg_replay(s, store_url)
    assert s.current() == s.head(), "the copied store is not at the newest revision"
    yield s
    s.engine.dispose()


# --- The CLI in this process --------------------------------------------------------------------------------

def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | str | None = None,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
    """``gpu-audit ARGS`` through click's CliRunner, in this process (no interpreter start-up and imports per
    case), answered like ``subprocess.run(..., capture_output=True, text=True)``: returncode, stdout, stderr.
    For tests where the process boundary is not the point. An exception that escapes the command (a
    subprocess would print its traceback) is appended to stderr as the traceback; gpu-audit's logging set-up
    is restored afterwards."""
    import logging
    import traceback

    from click.testing import CliRunner

    from auditor.cli import main

    root = logging.getLogger("gpu_audit")
    saved = (root.handlers[:], root.level, root.propagate)
    before = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        res = CliRunner().invoke(main, list(args), env=env, input=input)
    finally:
        os.chdir(before)
        root.handlers[:], root.level, root.propagate = saved[0], saved[1], saved[2]
    stderr = res.stderr
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        stderr += "Traceback (most recent call last):\n" + "".join(traceback.format_exception(res.exception))
    return subprocess.CompletedProcess(["gpu-audit", *args], res.exit_code, res.stdout, stderr)
