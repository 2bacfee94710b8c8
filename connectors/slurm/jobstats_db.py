"""jobstats' external MariaDB/MySQL store of job summaries (PrincetonUniversity/jobstats, 27 Aug 2025: "Job
summary statistics can now be stored in a MariaDB database instead of Slurm DB"). Read at
PrincetonUniversity/jobstats @ dfc9aa0 (docs/setup/external-database.md, db_handler.py): ``store_jobstats.py``
writes, per finished job, one row of

    job_summary(id, cluster VARCHAR(40), jobid BIGINT -- the raw numeric Slurm job id (JobIDRaw),
                admin_comment LONGTEXT -- the same "JS1:..." text AdminComment would hold,
                total_time DOUBLE, gpus INT, created_at, updated_at, UNIQUE (cluster, jobid))
    job_nodes(id, job_summary_id -> job_summary.id, node_name, cpus, total_memory, used_memory, total_time)
    job_gpu_metrics(id, job_node_id -> job_nodes.id, gpu_index VARCHAR(16), gpu_utilization DECIMAL(5,2),
                    gpu_used_memory BIGINT, gpu_total_memory BIGINT)

(the decoded summary in explicit columns; jobstats itself reads ``admin_comment``, ``ORDER BY updated_at DESC
LIMIT 1``). The store holds no start or end time, so the jobs still come from Slurm accounting (sacct or
saved files): this module only fetches their summaries, by (cluster, JobIDRaw). A row whose admin_comment is
empty is rebuilt from the structured tables. Needs PyMySQL (``pip install gpu-audit[jobstats-db]``)."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from auditor.errors import SourceError

SUMMARY, NODES, GPUS = "job_summary", "job_nodes", "job_gpu_metrics"  # db_handler.py EXTERNAL_DB_*_TABLE
CHUNK = 1000


def connect(host: str, port: int, user: str, password: str | None, database: str, timeout_s: float) -> Any:
    """A PyMySQL connection, read-only by use (SELECT only); one-line SourceErrors, never the password."""
    try:
        pymysql = importlib.import_module("pymysql")
    except ImportError:
        raise SourceError("jobstats", "jobstats.db_host is set but PyMySQL is not installed (pip install "
                          "'gpu-audit[jobstats-db]')", transient=False) from None
    try:
        return pymysql.connect(host=host, port=port, user=user, password=password or "", database=database,
                               connect_timeout=max(1, int(timeout_s)), read_timeout=max(1, int(timeout_s)),
                               charset="utf8mb4", autocommit=True)
    except pymysql.MySQLError as exc:
        code = exc.args[0] if exc.args else "?"
        raise SourceError("jobstats", f"jobstats database {user}@{host}:{port}/{database}: error {code} "
                          f"({_first(exc)})", transient=code not in (1044, 1045, 1049)) from None


def _first(exc: Exception) -> str:
    text = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
    return text.splitlines()[0][:200] if text else type(exc).__name__


def summaries(conn: Any, cluster: str, job_ids: Iterable[int]) -> dict[int, str | dict[str, Any]]:
    """jobid -> the JS1 text of its summary, or the summary rebuilt from job_nodes/job_gpu_metrics when
    admin_comment is empty (per node ``gpu_utilization`` {index: %}, ``gpu_used_memory`` /
    ``gpu_total_memory`` {index: bytes}, as JS1 has them)."""
    ids = sorted(set(job_ids))
    out: dict[int, str | dict[str, Any]] = {}
    rebuild: list[int] = []
    try:
        with conn.cursor() as cur:
            for i in range(0, len(ids), CHUNK):
                part = ids[i:i + CHUNK]
                marks = ",".join(["%s"] * len(part))
                cur.execute(f"SELECT jobid, admin_comment FROM {SUMMARY} WHERE cluster = %s AND jobid IN "  # noqa: S608
                            f"({marks}) ORDER BY updated_at", (cluster, *part))
                for jobid, comment in cur.fetchall():  # the latest row of a job wins, as jobstats reads it
                    if comment:
                        out[int(jobid)] = str(comment)
                    else:
                        rebuild.append(int(jobid))
            for i in range(0, len(rebuild), CHUNK):
                part = rebuild[i:i + CHUNK]
                marks = ",".join(["%s"] * len(part))
                cur.execute(f"SELECT s.jobid, n.node_name, g.gpu_index, g.gpu_utilization, g.gpu_used_memory, "  # noqa: S608
                            f"g.gpu_total_memory FROM {SUMMARY} s JOIN {NODES} n ON n.job_summary_id = s.id "
                            f"JOIN {GPUS} g ON g.job_node_id = n.id WHERE s.cluster = %s AND s.jobid IN ({marks})",
                            (cluster, *part))
                for jobid, node, idx, util, used, total in cur.fetchall():
                    doc = out.setdefault(int(jobid), {"nodes": {}})
                    assert isinstance(doc, dict)
                    n = doc["nodes"].setdefault(str(node), {})
                    for key, value in (("gpu_utilization", util), ("gpu_used_memory", used),
                                       ("gpu_total_memory", total)):
                        if value is not None:
                            n.setdefault(key, {})[str(idx)] = float(value) if isinstance(value, Decimal) else value
    except Exception as exc:  # PyMySQL's errors, a table missing: one line
        code = exc.args[0] if getattr(exc, "args", None) else "?"
        raise SourceError("jobstats", f"jobstats database query failed: error {code} ({_first(exc)})",
                          transient=True) from None
    return out
