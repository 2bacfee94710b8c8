"""jobstats' external MariaDB store (issue 43 section 3), against the MariaDB this machine runs
(127.0.0.1:3306, root): each test creates its own database, named ``gpu_audit_jobstats_<random>`` and carrying
a comment that says so, and drops only a database that carries both (never another one). Its tables are
jobstats' own, as PrincetonUniversity/jobstats @ dfc9aa0 docs/setup/external-database.md creates them, and
rows are written the way its db_handler.py ``_save_to_external_db`` writes them: the JS1 text in
``job_summary.admin_comment`` and the decoded summary in ``job_nodes`` / ``job_gpu_metrics``."""

from __future__ import annotations

import secrets
import socket
from collections import defaultdict
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from auditor.errors import SourceError
from connectors import build
from connectors.base import Context, Problems
from connectors.slurm.jobstats import decode_js1
from tests.conftest import need
from tests.test_jobstats import FIX, T0, WIN

pytestmark = pytest.mark.service
HOST, PORT = "127.0.0.1", 3306
COMMENT = "gpu-audit test database (tests/test_jobstats_db.py); dropped by the test"

# PrincetonUniversity/jobstats @ dfc9aa0, docs/setup/external-database.md "1. Database Setup"
TABLES = ["""CREATE TABLE job_summary (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    cluster VARCHAR(40) NOT NULL,
    jobid BIGINT NOT NULL,
    admin_comment LONGTEXT,
    total_time DOUBLE DEFAULT NULL,
    gpus INT DEFAULT NULL,
    created_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
    updated_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,
    UNIQUE KEY unique_cluster_job (cluster, jobid),
    INDEX idx_created_at (created_at)
)""", """CREATE TABLE job_nodes (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    job_summary_id BIGINT NOT NULL,
    node_name VARCHAR(255) NOT NULL,
    cpus INT DEFAULT NULL,
    total_memory BIGINT DEFAULT NULL,
    used_memory BIGINT DEFAULT NULL,
    total_time DOUBLE DEFAULT NULL,
    INDEX idx_job_summary (job_summary_id),
    INDEX idx_node_name (node_name),
    FOREIGN KEY (job_summary_id) REFERENCES job_summary(id) ON DELETE CASCADE
)""", """CREATE TABLE job_gpu_metrics (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    job_node_id BIGINT NOT NULL,
    gpu_index VARCHAR(16) NOT NULL,
    gpu_utilization DECIMAL(5,2) DEFAULT NULL,
    gpu_used_memory BIGINT DEFAULT NULL,
    gpu_total_memory BIGINT DEFAULT NULL,
    INDEX idx_job_node (job_node_id),
    INDEX idx_gpu_index (gpu_index),
    FOREIGN KEY (job_node_id) REFERENCES job_nodes(id) ON DELETE CASCADE
)"""]


def _mariadb_up() -> bool:
    try:
        with socket.create_connection((HOST, PORT), timeout=2):
            return True
    except OSError:
        return False


def _root() -> Any:
    import pymysql

    return pymysql.connect(host=HOST, port=PORT, user="root", password="", autocommit=True)


@pytest.fixture
def jobstats_db() -> Iterator[str]:
    need(_mariadb_up(), f"no MariaDB on {HOST}:{PORT}")
    name = f"gpu_audit_jobstats_{secrets.token_hex(4)}"
    conn = _root()
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` COMMENT %s", (COMMENT,))
            cur.execute(f"USE `{name}`")
            for sql in TABLES:
                cur.execute(sql)
        yield name
    finally:
        with conn.cursor() as cur:  # drop it only when it is provably this test's own
            cur.execute("SELECT SCHEMA_COMMENT FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s", (name,))
            row = cur.fetchone()
            if row is not None and row[0] == COMMENT and name.startswith("gpu_audit_jobstats_"):
                cur.execute(f"DROP DATABASE `{name}`")
        conn.close()


def save(db: str, cluster: str, jobid: int, js1: str | None, summary: dict[str, Any]) -> None:
    """What jobstats' store_jobstats.py writes for one job (db_handler.py ``_save_to_external_db``)."""
    conn = _root()
    with conn.cursor() as cur:
        cur.execute(f"USE `{db}`")
        cur.execute("INSERT INTO job_summary (cluster, jobid, admin_comment, total_time, gpus, created_at, updated_at)"
                    " VALUES (%s, %s, %s, %s, %s, NOW(), NOW())",
                    (cluster, jobid, js1, summary.get("total_time"), summary.get("gpus")))
        sid = cur.lastrowid
        for node, d in summary["nodes"].items():
            cur.execute("INSERT INTO job_nodes (job_summary_id, node_name, cpus, total_memory, used_memory, "
                        "total_time) VALUES (%s, %s, %s, %s, %s, %s)", (sid, node, d.get("cpus"), d.get("total_memory"),
                                                            d.get("used_memory"), d.get("total_time")))
            nid = cur.lastrowid
            util, used, total = (d.get(k, {}) for k in ("gpu_utilization", "gpu_used_memory", "gpu_total_memory"))
            for idx in set(util) | set(used) | set(total):
                cur.execute("INSERT INTO job_gpu_metrics (job_node_id, gpu_index, gpu_utilization, gpu_used_memory, "
                            "gpu_total_memory) VALUES (%s, %s, %s, %s, %s)",
                            (nid, idx, util.get(idx), used.get(idx), total.get(idx)))
    conn.close()


def _rows() -> dict[str, str]:
    """The fixture's job lines by JobID, header first."""
    lines = (FIX / "sacct-admincomment-js1.txt").read_text().splitlines()
    return {ln.split("|", 1)[0]: ln for ln in lines if not ln.startswith("$ ")}


def _sacct_without_comments(tmp: Path) -> Path:
    """Jobs 101 and 106_2 as sacct prints them on a site whose jobstats writes to the database: no AdminComment."""
    rows = _rows()
    keep = [rows["JobID"], *(rows[j].rsplit("|", 1)[0] + "|" for j in ("101", "101.batch", "106_2", "102"))]
    (tmp / "sacct.txt").write_text("\n".join(keep) + "\n")
    return tmp / "sacct.txt"


def _fill(db: str) -> None:
    rows = _rows()
    js1_101 = rows["101"].rsplit("|", 1)[1]
    js1_106 = rows["106_2"].rsplit("|", 1)[1]
    save(db, "lab", 101, js1_101, decode_js1(js1_101))
    save(db, "lab", 106, None, decode_js1(js1_106))  # structured rows only: rebuilt from them
    save(db, "other", 102, js1_101, decode_js1(js1_101))  # another cluster's job 102: never read for "lab"


def _read(db: str, tmp: Path, **more: Any) -> tuple[list, Problems, Any]:
    src = build("jobstats", "telemetry", {"paths": [str(_sacct_without_comments(tmp))], "db_host": HOST,
                                          "db_port": PORT, "db_user": "root", "db_name": db, **more},
                Context("lab", tmp))
    p = Problems()
    return list(src.collect(WIN, p)), p, src


def test_summaries_come_from_jobstats_database(jobstats_db: str, tmp_path: Path) -> None:
    """The same buckets as the AdminComment reading of tests/test_jobstats.py for 101 (from admin_comment) and
    106_2 (rebuilt from job_nodes/job_gpu_metrics); 102 is another cluster's in the store: nothing."""
    _fill(jobstats_db)
    got, problems, src = _read(jobstats_db, tmp_path)
    assert not problems.items and src.counts["db_summaries"] == 2
    want = build("jobstats", "telemetry", {"paths": ["sacct-admincomment-js1.txt"]}, Context("lab", FIX))
    ref = [b for b in want.collect(WIN, Problems()) if b.hpc_job in ("101", "106_2")]

    def key(bs: list) -> dict:
        out: dict = defaultdict(set)
        for b in bs:
            out[(b.hpc_job, b.host, b.gpu)].add((b.start, b.gpu_util, b.fb_used_mib))
        return dict(out)

    assert key(got) == key(ref) and len(got) == len(ref) == 12 * 2 + 2 * 2
    assert {b.gpu_util for b in got if b.hpc_job == "106_2" and b.host == "gpu-node-02"} == {0.55}


def test_without_the_database_nothing_is_guessed(jobstats_db: str, tmp_path: Path) -> None:
    """An empty store: no summaries, no buckets (those jobs have no AdminComment either)."""
    got, problems, src = _read(jobstats_db, tmp_path)
    assert got == [] and src.counts["db_summaries"] == 0 and not problems.items


def test_bad_credentials_and_missing_tables_are_one_line(jobstats_db: str, tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"jobstats database nobody@127\.0\.0\.1:3306/.*: error 10(44|45)"):
        _read(jobstats_db, tmp_path, db_user="nobody")
    conn = _root()
    with conn.cursor() as cur:  # this test's own database, its tables gone
        for t in ("job_gpu_metrics", "job_nodes", "job_summary"):
            cur.execute(f"DROP TABLE `{jobstats_db}`.{t}")
    conn.close()
    with pytest.raises(SourceError, match="jobstats database query failed: error 1146"):
        _read(jobstats_db, tmp_path)


@pytest.mark.parametrize("bucket", [300])
def test_database_summary_audited_end_to_end(jobstats_db: str, store_url: str, tmp_path: Path, bucket: int) -> None:
    """Job 101 from the database, on both engines: reserved 2 GPU-h, idle by GPU-Util 1 GPU-h (GPU 3 at 0 %),
    as from AdminComment (tests/test_jobstats.py)."""
    from sqlalchemy import text

    from auditor.audit.run import run_audit
    from auditor.collect import collect
    from auditor.config import Config
    from auditor.store.engine import Store

    _fill(jobstats_db)
    path = _sacct_without_comments(tmp_path)
    cfg = Config.model_validate({"clusters": [{
        "name": "lab", "allocations": [{"kind": "file", "paths": [str(path)], "format": "sacct"}],
        "telemetry": [{"kind": "jobstats", "paths": [str(path)], "bucket_seconds": bucket, "db_host": HOST,
                       "db_user": "root", "db_name": jobstats_db}]}]})
    store = Store.open(store_url)
    store.upgrade()
    until = T0 + timedelta(days=1)
    res = collect(store, cfg, base_dir=tmp_path, since=T0 - timedelta(days=1), until=until, now=until)
    assert all(r.ok for r in res.results), res.results
    rid = run_audit(store, cfg, T0 - timedelta(days=1), until).run_id
    with store.engine.connect() as conn:
        row = conn.execute(text("SELECT u.reserved_s, u.idle_s FROM usage_allocation u JOIN allocations a "
                                "ON a.id = u.allocation_id WHERE u.run_id = :r AND a.external_id = '101'"),
                           {"r": rid}).one()
    assert (row.reserved_s, row.idle_s) == (7200, 3600)
