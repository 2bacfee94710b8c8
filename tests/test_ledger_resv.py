"""Reservations in the ledger (issue 13 §3, issue 14 §3): pieces that sacctmgr keeps per modification,
reservations that move, GPUs other jobs held (IGNORE_JOBS), teams and the REST id -> name map. SQLite and
PostgreSQL; every expected number is computed by hand in the comments."""

from __future__ import annotations

import json
import stat
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text

from auditor.audit.run import run_audit
from auditor.config import Config, Team
from auditor.records import AllocatedGpu, Allocation, GpuInventory, Reservation
from auditor.store import schema
from auditor.store.engine import Store
from connectors import build
from connectors.base import Context, Problems, Window
from connectors.slurm import inventory as inv
from connectors.slurm import jobs
from connectors.slurm.parse import scontrol_records
from connectors.slurm.reading import Reading
from connectors.slurm.rest import name_reservations

FX = Path(__file__).parent / "fixtures" / "slurm"
D = datetime(2026, 11, 29, tzinfo=UTC)
H = timedelta(hours=1)
W0, W1 = D, D + timedelta(days=1)


def at(hms: str) -> datetime:
    h, m, s = (int(x) for x in hms.split(":"))
    return D + timedelta(hours=h, minutes=m, seconds=s)


def ts(hms: str) -> int:
    return int(at(hms).timestamp())


def fixture_lines(rel: str) -> str:
    """A captured command output without its ``$ command`` line (see tests/fixtures/slurm/PROVENANCE.md)."""
    return "\n".join(x for x in (FX / rel).read_text().splitlines() if not x.startswith(("$ ", "[rc=")))


def resv_rows(store: Store) -> dict[str, list[Any]]:
    t = schema.reservations
    out: dict[str, list[Any]] = {}
    with store.engine.connect() as conn:
        for r in conn.execute(select(t).order_by(t.c.start_ts)):
            out.setdefault(r.name, []).append(r)
    return out


def idle_reservation(store: Store, run_id: int) -> dict[str, dict[str, Any]]:
    sql = ("SELECT f.team, f.gpu_hours, f.idle_gpu_hours, f.evidence, r.name FROM findings f JOIN reservations r "
           "ON r.id = f.reservation_id WHERE f.run_id = :r AND f.kind = 'idle_reservation'")
    out = {}
    with store.engine.connect() as conn:
        for row in conn.execute(text(sql), {"r": run_id}):
            d = dict(row._mapping)
            d["evidence"] = json.loads(d["evidence"]) if isinstance(d["evidence"], str) else d["evidence"]
            out[d["name"]] = d
    return out


# --- an updated reservation: sacctmgr's pieces assembled (the CLI backend through fake binaries) ---------

# Hand-made in the shape of the real 22.05 `sacctmgr -n -P show reservation format=Name,ID,TRES,TimeStart,
# TimeEnd,NodeNames,Flags` output (tests/fixtures/slurm/22.05/2node/reservations): reservation alice-ft (ID 6)
# was created 15:00:00 for 40 minutes on gpu-node-01 (8 GPUs); `scontrol update reservation=alice-ft
# users=alice,carol` 18 seconds later made slurmdbd end that row and start a new one with the same ID
# (as_mysql_resv.c: modify of a started reservation). Another reservation, old-maint (ID 2), ended earlier.
SACCTMGR_PIECES = """alice-ft|6|cpu=16|2026-11-29T15:00:00|2026-11-29T15:00:18|gpu-node-01|SPEC_NODES
alice-ft|6|cpu=16|2026-11-29T15:00:18|2026-11-29T15:40:00|gpu-node-01|SPEC_NODES
old-maint|2|cpu=16|2026-11-29T13:00:00|2026-11-29T13:30:00|gpu-node-02|MAINT,SPEC_NODES
"""
# the job ran in it: sacct -P columns of jobs.SACCT_FIELDS; 22.05 leaves Reservation empty, gives the id
SACCT = ("100|100|alice|team-a|gpu|normal|COMPLETED|2026-11-29T15:00:00|2026-11-29T15:00:00|"
         "2026-11-29T15:38:00|2280|60|gpu-node-01|billing=1,cpu=1,gres/gpu:h100=1,gres/gpu=1,node=1|6||"
         "2026-11-29T15:00:00|billing=1,cpu=1,gres/gpu=1,node=1|0:0|00:01.500|ft\n")
NODES = ("NodeName=gpu-node-01 Arch=x86_64 Gres=gpu:h100:8 State=MIXED\n"
         "NodeName=gpu-node-02 Arch=x86_64 Gres=gpu:h100:8 State=IDLE\n")


def fake_slurm(tmp: Path) -> dict[str, str]:
    """scontrol/sacctmgr/sacct stand-ins that print saved outputs (the reservation has ended: slurmctld no
    longer lists it, only accounting does)."""
    (tmp / "nodes.txt").write_text(NODES)
    (tmp / "pieces.txt").write_text(SACCTMGR_PIECES)
    (tmp / "sacct.txt").write_text(SACCT)
    scripts = {
        "scontrol": f"""case "$*" in *"show node"*) cat {tmp}/nodes.txt;; *"show job"*) echo "No jobs in the system";;
*"show reservation"*) echo "No reservations in the system";; esac""",
        "sacctmgr": f"""case "$*" in *"show reservation"*) cat {tmp}/pieces.txt;; esac""",  # no QOS/assoc limits
        "sacct": f"cat {tmp}/sacct.txt",
    }
    out = {}
    for name, body in scripts.items():
        p = tmp / name
        p.write_text("#!/bin/sh\n" + body + "\n")
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
        out[name] = str(p)
    return out


@pytest.mark.service
def test_updated_reservation_is_assembled_from_its_pieces(store: Store, tmp_path: Path) -> None:
    """alice-ft: 8 GPUs x 40 min = 5.333333 reserved GPU-h; job 100 held 1 GPU 15:00-15:38 inside it =
    0.633333 GPU-h, no telemetry (its own idle time unknown, never idle) -> 5.333333 - 0.633333 = 4.7 idle
    GPU-h. Keeping only the first piece gave 8 x 18 s = 0.04 reserved - 1 x 18 s = 0.005 used = 0.035."""
    conn = build("slurm", "allocations", {**fake_slurm(tmp_path), "history_format": "text"}, Context("c"))
    problems = Problems()
    records = list(conn.collect(Window(at("12:00:00"), at("18:00:00")), problems))
    assert not problems.items, problems.items
    store.ingest(records, seen_at_ts=ts("18:00:00"))
    r = run_audit(store, Config(), W0, W1)
    f = idle_reservation(store, r.run_id)["alice-ft"]
    assert f["idle_gpu_hours"] == pytest.approx(4.7)
    assert f["gpu_hours"] == pytest.approx(8 * 40 / 60)
    assert f["evidence"]["used_gpu_hours"] == pytest.approx(38 / 60) and f["evidence"]["jobs"] == 1
    rows = resv_rows(store)
    (ft,) = rows["alice-ft"]
    assert (ft.start_ts, ft.end_ts, ft.slurm_id, ft.gpu_count) == (ts("15:00:00"), ts("15:40:00"), "6", 8)
    assert rows["old-maint"][0].slurm_id == "2"
    # collected again (the same pieces, later): still one reservation, same numbers
    store.ingest(list(conn.collect(Window(at("12:00:00"), at("18:00:00")), Problems())), seen_at_ts=ts("19:00:00"))
    assert len(resv_rows(store)["alice-ft"]) == 1
    r2 = run_audit(store, Config(), W0, W1)
    assert idle_reservation(store, r2.run_id)["alice-ft"]["idle_gpu_hours"] == pytest.approx(4.7)


def test_pieces_assemble_per_id_not_per_name() -> None:
    """Two pieces of ID 6 become one 15:00:00-15:40:00 reservation; a reused name with another id stays apart."""
    rows = [r for _, r in jobs.sacct_rows(SACCTMGR_PIECES + "alice-ft|9|cpu=16|2026-11-29T20:00:00|"
                                          "2026-11-29T21:00:00|gpu-node-02|SPEC_NODES\n",
                                          ("Name", "ID", "TRES", "TimeStart", "TimeEnd", "NodeName", "Flags"))]
    got = sorted((r.name, r.slurm_id, r.start, r.end) for r in
                 inv.assemble_pieces([inv.from_sacctmgr_row(x, "c", {"gpu-node-01": 8, "gpu-node-02": 8})
                                      for x in rows]))
    assert got == [("alice-ft", "6", at("15:00:00"), at("15:40:00")), ("alice-ft", "9", at("20:00:00"), at("21:00:00")),
                   ("old-maint", "2", at("13:00:00"), at("13:30:00"))]


# --- reservations that move between collections ------------------------------------------------------

def resv(name: str, start: str, end: str, gpus: float = 2, slurm_id: str = "", **kw: Any) -> Reservation:
    return Reservation("c", name, at(start), at(end), nodes=["n1"], gpu_count=gpus, slurm_id=slurm_id, **kw)


@pytest.mark.service
def test_moved_reservation_is_one_reservation_with_its_latest_definition(store: Store) -> None:
    """`maint` (2 GPUs on n1) planned 10:00-12:00 when seen at 08:00, moved to 13:00-14:00 before it began
    (seen 09:00): one reservation 13:00-14:00 -> 2 GPUs x 1 h = 2 idle GPU-h (not 2 x 2 + 2 x 1 = 6).
    `long` 10:00-11:00 seen while active at 10:30, extended to 12:00 (seen 11:00): one row, 2 x 2 h = 4.
    `weekly` 16:00-17:00 (id 3) ended, then the name was used again 20:00-21:00 (id 8): two rows, 2 + 2."""
    store.ingest([resv("maint", "10:00:00", "12:00:00")], seen_at_ts=ts("08:00:00"))
    store.ingest([resv("maint", "13:00:00", "14:00:00")], seen_at_ts=ts("09:00:00"))
    store.ingest([resv("long", "10:00:00", "11:00:00")], seen_at_ts=ts("10:30:00"))
    store.ingest([resv("long", "10:00:00", "12:00:00")], seen_at_ts=ts("11:00:00"))
    store.ingest([resv("weekly", "16:00:00", "17:00:00", slurm_id="3")], seen_at_ts=ts("16:30:00"))
    store.ingest([resv("weekly", "20:00:00", "21:00:00", slurm_id="8"),
                  resv("weekly", "16:00:00", "17:00:00", slurm_id="3")], seen_at_ts=ts("18:00:00"))
    rows = resv_rows(store)
    assert [(r.start_ts, r.end_ts) for r in rows["maint"]] == [(ts("13:00:00"), ts("14:00:00"))]
    assert [(r.start_ts, r.end_ts) for r in rows["long"]] == [(ts("10:00:00"), ts("12:00:00"))]
    assert [(r.start_ts, r.slurm_id) for r in rows["weekly"]] == [(ts("16:00:00"), "3"), (ts("20:00:00"), "8")]
    r = run_audit(store, Config(), W0, W1)
    found = idle_reservation(store, r.run_id)
    assert found["maint"]["idle_gpu_hours"] == pytest.approx(2.0)
    assert found["long"]["idle_gpu_hours"] == pytest.approx(4.0)
    assert found["weekly"]["idle_gpu_hours"] == pytest.approx(2.0)  # one finding per row: 2 rows x 2
    assert len([k for k in found if k == "weekly"]) == 1
    with store.engine.connect() as conn:
        n = conn.execute(text("SELECT COUNT(*) FROM findings WHERE run_id = :r AND kind = 'idle_reservation'"),
                         {"r": r.run_id}).scalar()
    assert n == 4  # maint, long, weekly x 2


@pytest.mark.service
def test_gpus_other_jobs_held_are_not_idle_reserved_capacity(store: Store) -> None:
    """`ij` (IGNORE_JOBS) takes all 4 GPUs of n1 10:00-12:00 = 8 GPU-h. Job `in` ran in it on 1 GPU the
    whole time (2 GPU-h used); job `old`, started 09:00 outside the reservation, held 2 GPUs until 11:00
    (2 GPUs x 1 h = 2 GPU-h inside it). Unused = 8 - 2 - 2 = 4 GPU-h (was 6).
    `part` reserves 1 of n2's 4 GPUs (24.x GPU TRES) 10:00-12:00 = 2 GPU-h; job `side` holds the other 3
    GPUs all along (6 GPU-h), which the 3 unreserved GPUs absorb (4 x 2 - 2 = 6): unused stays 2."""
    inv4 = [GpuInventory("c", n, g, model="h100") for n in ("n1", "n2") for g in range(4)]
    ij = Reservation("c", "ij", at("10:00:00"), at("12:00:00"), nodes=["n1"], gpu_count=4, flags=["IGNORE_JOBS"])
    part = Reservation("c", "part", at("10:00:00"), at("12:00:00"), nodes=["n2"], gpu_count=1)
    jobs_ = [Allocation("c", "slurm", "in", submit=at("10:00:00"), start=at("10:00:00"), end=at("12:00:00"),
                        reservation="ij", gpus=[AllocatedGpu("n1", 0)]),
             Allocation("c", "slurm", "old", submit=at("09:00:00"), start=at("09:00:00"), end=at("11:00:00"),
                        gpus=[AllocatedGpu("n1", 2), AllocatedGpu("n1", 3)]),
             Allocation("c", "slurm", "side", submit=at("09:00:00"), start=at("09:00:00"), end=at("13:00:00"),
                        gpus=[AllocatedGpu("n2", g) for g in (1, 2, 3)])]
    store.ingest([*inv4, ij, part, *jobs_], seen_at_ts=ts("23:00:00"))
    r = run_audit(store, Config(), W0, W1)
    found = idle_reservation(store, r.run_id)
    ev = found["ij"]["evidence"]
    assert (ev["reserved_gpu_hours"], ev["used_gpu_hours"]) == (pytest.approx(8.0), pytest.approx(2.0))
    assert ev["other_jobs_gpu_hours"] == pytest.approx(2.0) and ev["unused_gpu_hours"] == pytest.approx(4.0)
    assert found["ij"]["idle_gpu_hours"] == pytest.approx(4.0)
    assert found["part"]["evidence"]["other_jobs_gpu_hours"] == pytest.approx(0.0)
    assert found["part"]["idle_gpu_hours"] == pytest.approx(2.0)


# --- teams, and what a history-only sighting keeps ----------------------------------------------------

@pytest.mark.service
def test_reservation_team_from_its_accounts_or_users(store: Store) -> None:
    """Real 22.05 outputs: `scontrol -o show reservation` at 14:30 (team-b-idle: Accounts=team-b;
    alice-used: Users=alice), then at 17:00 sacctmgr's copy (no users/accounts; alice-used deleted early,
    TimeEnd 14:41:23). One row each; users/accounts kept; teams from [[teams]]:
    team-b-idle -> "B" via account team-b; 8 GPUs x 2 h = 16 idle GPU-h (no job used it).
    alice-used -> "A" via user alice; 8 GPUs x 12 min 1 s (721 s) = 5768 GPU-s = 1.602222 GPU-h."""
    per_node = {"gpu-node-01": 8, "gpu-node-02": 8}
    live = [inv.from_scontrol_reservation(x, "c", per_node) for x in
            scontrol_records(fixture_lines("22.05/2node/reservations/scontrol-show-reservation-oneliner.txt"))]
    hist = inv.assemble_pieces([inv.from_sacctmgr_row(row, "c", per_node) for _, row in jobs.sacct_rows(
        fixture_lines("22.05/sreport/sacctmgr-show-reservation.txt"))])
    store.ingest(live, seen_at_ts=ts("14:30:00"))
    store.ingest(hist, seen_at_ts=ts("17:00:00"))
    rows = resv_rows(store)
    assert len(rows["team-b-idle"]) == len(rows["alice-used"]) == 1
    (b,), (a,) = rows["team-b-idle"], rows["alice-used"]
    assert (b.slurm_id, _list(b.accounts)) == ("3", ["team-b"])
    assert (a.slurm_id, a.end_ts, _list(a.users)) == ("4", ts("14:41:23"), ["alice"])
    cfg = Config(teams=[Team(name="A", users=["alice"]), Team(name="B", accounts=["team-b"])])
    r = run_audit(store, cfg, W0, W1)
    found = idle_reservation(store, r.run_id)
    assert found["team-b-idle"]["team"] == "B" and found["team-b-idle"]["idle_gpu_hours"] == pytest.approx(16.0)
    assert found["alice-used"]["team"] == "A"
    assert found["alice-used"]["idle_gpu_hours"] == pytest.approx(5768 / 3600)


def _list(v: Any) -> list[str]:
    return json.loads(v) if isinstance(v, str) else list(v)


# --- REST: 22.05 slurmdbd gives reservation ids, not names ---------------------------------------------

REST = FX / "22.05" / "2node" / "rest"


class _Replay(BaseHTTPRequestHandler):
    """slurmrestd 22.05 replayed from the captures in tests/fixtures/slurm/22.05/2node (v0.0.38)."""

    routes = {"/slurm/v0.0.38/ping": None, "/slurm/v0.0.38/nodes": "slurm_v0.0.38_nodes.json",
              "/slurm/v0.0.38/jobs": "slurm_v0.0.38_jobs.json",
              "/slurm/v0.0.38/reservations": "slurm_v0.0.38_reservations.json",
              "/slurmdb/v0.0.38/jobs": "slurmdb_v0.0.38_jobs_start_time_2026-11-29T14_3A28_3A00.json"}

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?")[0]
        if path not in self.routes:  # 22.05 has no /slurmdb/v0.0.38/reservations (db-reservations.HTTP404.txt)
            body, code = b"Unable find requested URL. Please view /openapi/v3 for API reference.", 404
        else:
            f = self.routes[path]
            body, code = (REST / f).read_bytes() if f else b'{"meta": {}, "errors": [], "pings": []}', 200
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def slurmrestd() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Replay)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.mark.service
def test_rest_backend_maps_reservation_ids_to_names(store: Store, slurmrestd: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Job 30 ran in alice-used: slurmdbd says reservation {id: 4, name: 0}; the running view says
    resv_name alice-used. The REST backend names it like the CLI does (sacctmgr), gives alice-used its id 4,
    and a later history-only sighting (the job finished, no running view) is named through the store."""
    monkeypatch.setenv("T_JWT", "x")
    conn = build("slurm", "allocations", {"backend": "rest", "rest_url": slurmrestd, "rest_version": "v0.0.38",
                                          "rest_token": {"env": "T_JWT"},
                                          "sacctmgr": "/nonexistent/sacctmgr"},  # never this host's Slurm
                 Context("c"))
    start = datetime.fromtimestamp(1795962000, UTC)
    records = list(conn.collect(Window(start, start + 4 * H), Problems()))
    by_id = {r.external_id: r for r in records if isinstance(r, Allocation)}
    assert by_id["30"].reservation == "alice-used"
    resvs = {r.name: r for r in records if isinstance(r, Reservation)}
    assert resvs["alice-used"].slurm_id == "4" and resvs["team-b-idle"].slurm_id == ""
    store.ingest(records, seen_at_ts=1795963000)
    later = json.loads((REST / "slurmdb_v0.0.38_jobs_start_time_2026-11-29T14_3A28_3A00.json").read_text())
    job30 = next(j for j in later["jobs"] if j["job_id"] == 30)
    done = jobs.from_json_db_job(job30, "c")
    assert done.reservation == "" and str(done.labels["reservation_id"]) == "4"
    store.ingest([done], seen_at_ts=1795964000)
    with store.engine.connect() as c:
        assert c.execute(text("SELECT reservation FROM allocations WHERE external_id = '30'")).scalar() == "alice-used"


def test_rest_name_map_from_real_2205_objects() -> None:
    """The same mapping on the parsed objects alone: only job 30 carries a reservation id (4)."""
    reading = Reading()
    reading.running = [jobs.from_json_job(j, "c") for j in
                       json.loads((REST / "slurm_v0.0.38_jobs.json").read_text())["jobs"]]
    reading.history = [jobs.from_json_db_job(j, "c") for j in json.loads(
        (REST / "slurmdb_v0.0.38_jobs_start_time_2026-11-29T14_3A28_3A00.json").read_text())["jobs"]]
    reading.reservations = [inv.from_json_reservation(r, "c", {}) for r in
                            json.loads((REST / "slurm_v0.0.38_reservations.json").read_text())["reservations"]]
    names: dict[str, str] = {}
    name_reservations(reading, names)
    assert names == {"4": "alice-used"}
    assert {h.external_id: h.reservation for h in reading.history if h.reservation} == {"30": "alice-used"}


def test_slurmdb_reservation_objects_assemble_like_sacctmgr() -> None:
    """`/slurmdb/vX/reservations` (v0.0.39+; 22.05 answers 404, so no real capture exists here): hand-made
    objects in the data_parser shape (times under `time`, `{set, number}` numbers, TRES as a list) and
    the flat one. Pieces of id 6 give one 15:00:00-15:40:00 reservation on gpu-node-01's 8 GPUs; the
    GPU TRES of id 7 (1 GPU) wins over the node count."""
    per_node = {"gpu-node-01": 8, "gpu-node-02": 8}
    objs = [
        {"id": 6, "name": "alice-ft", "nodes": "gpu-node-01", "flags": ["SPEC_NODES"],
         "time": {"start": {"set": True, "number": ts("15:00:00")}, "end": ts("15:00:18")}},
        {"id": 6, "name": "alice-ft", "node_list": "gpu-node-01", "time_start": ts("15:00:18"),
         "time_end": ts("15:40:00")},
        {"id": 7, "name": "one-gpu", "nodes": "gpu-node-02", "time": {"start": ts("16:00:00"), "end": ts("17:00:00")},
         "tres": [{"type": "cpu", "count": 2}, {"type": "gres", "name": "gpu", "count": 1}]},
    ]
    got = sorted((r.name, r.slurm_id, r.start, r.end, r.gpu_count) for r in
                 inv.assemble_pieces([inv.from_json_db_reservation(o, "c", per_node) for o in objs]))
    assert got == [("alice-ft", "6", at("15:00:00"), at("15:40:00"), 8.0),
                   ("one-gpu", "7", at("16:00:00"), at("17:00:00"), 1.0)]
    with pytest.raises(ValueError):
        inv.from_json_db_reservation({"id": 1, "name": "x"}, "c", per_node)


# --- REST after the reservation ended: accounting's copy through sacctmgr ----------------------------------

AFTER = FX / "22.05" / "2node" / "after-end"


def _sacctmgr_from_recording(tmp: Path) -> str:
    """A sacctmgr printing the recorded `sacctmgr -P show reservation` rows (22.05/2node/reservations) in the
    columns the connector asks for (`-n`, `format=Name,ID,TRES,TimeStart,TimeEnd,NodeNames,Flags`)."""
    rec = FX / "22.05" / "2node" / "reservations" / "sacctmgr-show-reservation.txt"
    p = tmp / "sacctmgr"
    p.write_text(f"""#!/usr/bin/env python3
import sys
if "reservation" not in sys.argv:
    sys.exit(0)  # QOS and association limits: none recorded
lines = [ln for ln in open({str(rec)!r}).read().splitlines() if ln and not ln.startswith(("$", "[rc="))]
head = lines[0].split("|")
want = ["Name", "ID", "TRES", "TimeStart", "TimeEnd", "NodeName", "Flags"]
for ln in lines[1:]:
    row = dict(zip(head, ln.split("|")))
    print("|".join(row[k] for k in want))
""")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


class _AfterEnd(_Replay):
    """The same slurmrestd after job 30 finished and alice-used was gone: slurmctld's job list is the
    after-end `squeue --json` (v0.0.38, the shape of /slurm/v0.0.38/jobs: job 30 COMPLETED, resv_name
    empty), accounting's the after-end `sacct --json` (plugin openapi/dbv0.0.38: job 16 in reservation id 2,
    job 30 in id 4, names garbage integers), reservations the recorded REST list less alice-used (the
    after-end `scontrol show reservation` lists team-b-idle and future-maint)."""

    routes = {**_Replay.routes, "/slurm/v0.0.38/jobs": AFTER / "squeue.json",
              "/slurmdb/v0.0.38/jobs": AFTER / "sacct.json", "/slurm/v0.0.38/reservations": "after-end-resv"}

    def do_GET(self) -> None:  # noqa: N802
        f = self.routes.get(self.path.split("?")[0])
        if f == "after-end-resv":
            doc = json.loads((REST / "slurm_v0.0.38_reservations.json").read_text())
            doc["reservations"] = [r for r in doc["reservations"] if r["name"] != "alice-used"]
            body = json.dumps(doc).encode()
        elif isinstance(f, Path):
            body = f.read_bytes()
        else:
            return super().do_GET()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_rest_after_the_reservation_ended_matches_cli(store: Store, store_url: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """First collect after alice-used ended (and resv-node-ignore, 14:26:22-14:28:40, long before): 22.05's
    slurmrestd serves no /slurmdb reservations (404, db-reservations.HTTP404.txt), so the rest backend reads
    accounting's copy through sacctmgr as the cli backend does: the ended reservations get their rows and
    job 16 (ReservationId 2, resv-node-ignore per the recorded sacct-reservation-jobs.txt) and job 30 (id 4,
    alice-used) their names. Before: no row for either and both jobs without a reservation name."""
    from click.testing import CliRunner

    from auditor.cli import main

    srv = ThreadingHTTPServer(("127.0.0.1", 0), _AfterEnd)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("T_JWT", "x")
    cfg = tmp_path / "gpu-audit.toml"
    cfg.write_text(f'[store]\nurl = "{store_url}"\n[[clusters]]\nname = "c"\n[[clusters.allocations]]\n'
                   f'kind = "slurm"\nbackend = "rest"\nrest_url = "http://127.0.0.1:{srv.server_address[1]}"\n'
                   f'rest_version = "v0.0.38"\nrest_token = {{env = "T_JWT"}}\n'
                   f'sacctmgr = "{_sacctmgr_from_recording(tmp_path)}"\n')
    try:
        res = CliRunner().invoke(main, ["-c", str(cfg), "collect", "--since", "2026-11-29T14:00:00Z",
                                        "--until", "2026-11-29T17:00:00Z"])
    finally:
        srv.shutdown()
        srv.server_close()
    assert res.exit_code == 0, res.output
    rows = resv_rows(store)
    assert {"resv-node-ignore", "resv-core-idle", "alice-used"} <= set(rows)
    (used,) = rows["alice-used"]
    assert (used.start_ts, used.end_ts, used.slurm_id) == (ts("14:29:22"), ts("16:29:22"), "4")
    assert rows["resv-node-ignore"][0].slurm_id == "2"
    with store.engine.connect() as c:
        named = dict(c.execute(text("SELECT external_id, reservation FROM allocations WHERE external_id IN "
                                    "('16', '30')")).all())
    assert named == {"16": "resv-node-ignore", "30": "alice-used"}


def test_rest_without_sacctmgr_says_what_it_cannot_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _AfterEnd)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("T_JWT", "x")
    try:
        conn = build("slurm", "allocations", {"backend": "rest", "rest_version": "v0.0.38",
                                              "rest_url": f"http://127.0.0.1:{srv.server_address[1]}",
                                              "rest_token": {"env": "T_JWT"}, "sacctmgr": str(tmp_path / "none")},
                     Context("c"))
        list(conn.collect(Window(at("14:00:00"), at("17:00:00")), Problems()))
    finally:
        srv.shutdown()
        srv.server_close()
    assert conn.notes == [f"slurmrestd v0.0.38 serves no /slurmdb reservations and {tmp_path / 'none'}: command "
                          "not found: reservations that ended before a collect saw them are not stored, and their "
                          "jobs have no reservation name"]
