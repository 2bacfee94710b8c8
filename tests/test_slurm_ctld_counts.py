"""A finished job on a site whose accounting has no gres/gpu TRES (slurmdbd rows: cpu, mem, energy, node,
billing) is kept with the GPU count slurmctld still lists for it (``tres_per_job`` / ``TresPerNode`` while
MinJobAge keeps it), GPU indices unknown (its time unknown, never idle), and collect says so; before, it was
skipped as "CPU-only" with one INFO line. Both views are real recordings:

- cli: the 22.05 1-node lab after ``scancel 8`` (tests/fixtures/slurm/22.05/1node/after-cancel), every
  gres/gpu TRES removed as slurmctld and slurmdbd print them without GPU accounting (as in
  test_slurm_accounting_gaps);
- rest: Slurm-web's slurmrestd 25.11 recordings (tests/fixtures/slurm/slurmrestd-25.11, a cluster that did
  not account gres/gpu): ``/slurm/v0.0.44/jobs`` and ``/nodes`` as recorded, replayed by a loopback HTTP
  server; job 5736's accounting row is that cluster's recorded ``/slurmdb`` row of job 4637 (same cluster, the
  same GPU-less TRES list) with 5736's id, times, user and account; job 4637 itself, which slurmctld had
  already forgotten, stays in the answer.
"""

from __future__ import annotations

import copy
import json
import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from sqlalchemy import text

from auditor.records import Allocation
from auditor.store.engine import Store
from connectors import build
from connectors.base import Context, Problems, Window
from connectors.slurm import assemble, jobs
from connectors.slurm import inventory as inv
from connectors.slurm.cli import accounting_has_gpu
from connectors.slurm.parse import scontrol_records
from connectors.slurm.reading import Reading

FX = Path(__file__).parent / "fixtures" / "slurm"
LAB = FX / "22.05" / "1node" / "after-cancel"
R2511 = FX / "slurmrestd-25.11"


def no_gpu_tres(s: str) -> str:
    """Every gres/gpu TRES removed, as Slurm prints them when AccountingStorageTRES lacks gres/gpu."""
    return re.sub(r",?gres/gpu(:\w+)?=\d+", "", s)


# --- cli views: scontrol -d -o show job + sacct -P ----------------------------------------------------------

#: GPUs per finished job, read by hand off the recording's TresPerNode/TresPerJob (job 8: the cancelled one)
LAB_FINISHED = {"1": 1, "2": 1, "3": 2, "4": 1, "5": 1, "8": 1, "9_0": 1, "9_1": 1, "9_2": 1, "14": 2, "15": 1}
LAB_WIN = Window(datetime(2026, 11, 29, 14, 0, tzinfo=UTC), datetime(2026, 11, 29, 16, 0, tzinfo=UTC))


def lab_reading(accounted: bool | None) -> Reading:
    reading = Reading(running_complete=True, gpu_accounted=accounted)
    now = datetime(2026, 11, 29, 14, 40, tzinfo=UTC)
    reading.inventory = [g for r in scontrol_records((LAB / "scontrol-show-node.txt").read_text())
                         if r.startswith("NodeName=") for g in inv.from_scontrol_node(r, "lab", now)]
    for rec in scontrol_records(no_gpu_tres((LAB / "scontrol-show-job-oneliner.txt").read_text())):
        if rec.startswith("JobId="):
            reading.add_live(jobs.from_scontrol_job(rec, "lab"))
    cli = build("slurm", "allocations", {}, Context("lab")).backend
    reading.history = list(cli.history_text(no_gpu_tres((LAB / "sacct-X.txt").read_text()), Problems(), {}, None))
    return reading


@pytest.mark.parametrize("accounted", [None, False], ids=["config-unread", "config-says-no-gpu"])
def test_cli_finished_jobs_keep_slurmctld_gpu_count(accounted: bool | None) -> None:
    cfg = no_gpu_tres((FX / "22.05" / "config" / "scontrol-show-config.txt").read_text())
    assert accounting_has_gpu(re.sub(r",gres/gpu(:\w+)?", "", cfg)) is False
    reading = lab_reading(accounted)
    assert all(not h.gpus for h in reading.history)  # the accounting rows hold no GPU
    notes: list[str] = []
    out = {a.external_id: a for a in assemble(reading, LAB_WIN, "lab", notes=notes) if isinstance(a, Allocation)}
    finished = {k: len(out[k].gpus) for k in LAB_FINISHED if k in out}
    assert finished == LAB_FINISHED  # before: {} (config unread) or each with GPU count unknown, 0 GPUs
    for k in LAB_FINISHED:
        a = out[k]
        assert all(g.index is None and g.node == "vm" for g in a.gpus) and a.end is not None
        assert a.labels["gpu_count_from"] == "slurmctld" and "gpu_count" not in a.labels
    assert out["8"].state == "CANCELLED" and out["8"].user == "carol"
    assert any(f"{len(LAB_FINISHED)} finished jobs have no GPU count in Slurm accounting" in n for n in notes), notes


# --- rest: slurmrestd 25.11 replayed ------------------------------------------------------------------------

def _db_job_5736() -> dict:
    """Job 5736's accounting row: the recorded row of job 4637 (same cluster and TRES shape), re-identified."""
    ctld = next(j for j in json.loads((R2511 / "slurm-jobs.json").read_text())["jobs"] if j["job_id"] == 5736)
    row = copy.deepcopy(json.loads((R2511 / "slurmdb-job-gpus-archived.json").read_text())["jobs"][0])
    row.update(job_id=5736, user=ctld["user_name"], account=ctld["account"], nodes=ctld["nodes"],
               name=ctld["name"], state={"current": ctld["job_state"], "reason": "None"}, steps=[])
    for key, src in (("start", "start_time"), ("end", "end_time"), ("submission", "submit_time"),
                     ("eligible", "eligible_time")):
        row["time"][key] = ctld[src]["number"]
    return row


def _answers() -> dict[str, tuple[int, bytes]]:
    db = json.loads((R2511 / "slurmdb-job-gpus-archived.json").read_text())
    db["jobs"] = [_db_job_5736(), *db["jobs"]]
    empty = {"reservations": [], "errors": [], "warnings": []}  # the recordings hold no reservation listing
    return {"/slurm/v0.0.44/nodes": (200, (R2511 / "slurm-nodes.json").read_bytes()),
            "/slurm/v0.0.44/jobs": (200, (R2511 / "slurm-jobs.json").read_bytes()),
            "/slurm/v0.0.44/reservations": (200, json.dumps(empty).encode()),
            "/slurmdb/v0.0.44/jobs": (200, json.dumps(db).encode())}


@pytest.fixture
def slurmrestd() -> Iterator[str]:
    answers = _answers()

    class Replay(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            status, body = answers.get(self.path.split("?")[0], (404, b'{"errors": [{"error": "not found"}]}'))
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Replay)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def _config(tmp_path: Path, store_url: str, url: str) -> Path:
    cfg = tmp_path / "gpu-audit.toml"
    cfg.write_text(f'[store]\nurl = "{store_url}"\n[[clusters]]\nname = "hpc"\ninitial_days = 1\n'
                   f'[[clusters.allocations]]\nkind = "slurm"\nbackend = "rest"\nrest_url = "{url}"\n'
                   # never this host's Slurm: no sacctmgr there
                   'rest_version = "v0.0.44"\nsacctmgr = "/nonexistent/no-accounting-here"\n')
    return cfg


def test_rest_finished_job_keeps_slurmctld_gpu_count(store: Store, store_url: str, slurmrestd: str,
                                                      tmp_path: Path) -> None:
    from click.testing import CliRunner

    from auditor.cli import main

    cfg = _config(tmp_path, store_url, slurmrestd)
    res = CliRunner().invoke(main, ["-c", str(cfg), "collect", "--since", "2025-11-10T00:00:00Z",
                                    "--until", "2025-11-13T00:00:00Z"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.strip().splitlines()
    assert lines[0].startswith("hpc allocations[0]:slurm: ok ("), lines
    assert "  note: 1 finished jobs have no GPU count in Slurm accounting (add gres/gpu to AccountingStorageTRES): "\
           "kept with the GPU count slurmctld still lists, GPU indices unknown, so their GPU time is unknown, " \
           "never idle" in lines
    assert "  note: 1 finished jobs on GPU nodes have no GPU count in Slurm accounting" in "\n".join(lines)
    with store.engine.connect() as conn:
        got = {r.external_id: (r.state, r.gpu_count, r.n, r.indexed) for r in conn.execute(text(
            "SELECT a.external_id, a.state, a.gpu_count, count(g.id) AS n, count(g.gpu_index) AS indexed "
            "FROM allocations a LEFT JOIN allocated_gpus g ON g.allocation_id = a.id "
            "WHERE a.cluster = 'hpc' GROUP BY a.external_id, a.state, a.gpu_count"))}
    # 5736: tres_per_job gres/gpu:4 on gpu1, no index; before: skipped as CPU-only, no row at all
    assert got["5736"] == ("CANCELLED", 4.0, 4, 0)
    # 4637 on gpu1 (a GPU node), forgotten by slurmctld: stored, GPU count unknown (no invented GPUs)
    assert got["4637"] == ("COMPLETED", 0.0, 0, 0)
    assert not any(k in got for k in ("5738", "5740"))  # CPU-only jobs on cn1 stay out
