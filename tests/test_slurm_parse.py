"""Slurm parsers on REAL outputs (tests/fixtures/slurm: 22.05 / 24.11 text and JSON, slurmrestd v0.0.38,
v0.0.40-42 and 25.11 v0.0.44). Expected values come from the fixture files themselves: other captures of
the same job, the job-id lists of the workload, and what README.md/PROVENANCE.md say about them."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from auditor.errors import SourceError
from auditor.records import Allocation, GpuInventory, Reservation
from connectors import build
from connectors.base import Context, Problems, RunningSnapshot, Window
from connectors.slurm import assemble, jobs
from connectors.slurm import inventory as inv
from connectors.slurm import pyslurm_backend as psb
from connectors.slurm.parse import (
    expand_hostlist,
    gpu_items,
    kv_pairs,
    parse_duration,
    parse_gres,
    parse_ranges,
    parse_state,
    parse_time,
    scontrol_records,
)
from connectors.slurm.reading import Reading

FX = Path(__file__).parent / "fixtures" / "slurm"
C = "auditlab"


def text(rel: str) -> str:
    return (FX / rel).read_text()


def load(rel: str) -> dict:
    return json.loads(text(rel))


def by_id(allocs: list[Allocation]) -> dict[str, Allocation]:
    return {a.external_id: a for a in allocs}


def scontrol_jobs(rel: str) -> dict[str, Allocation]:
    return by_id([jobs.from_scontrol_job(r, C) for r in scontrol_records(text(rel))])


def idx(a: Allocation) -> dict[str, list[int | None]]:
    out: dict[str, list[int | None]] = {}
    for g in a.gpus:
        out.setdefault(g.node, []).append(g.index)
    return out


def workload(rel: str) -> dict[str, str]:
    """name -> job id, from the workload-jobids.txt the capture wrote."""
    return {ln.split()[0]: ln.split()[1] for ln in text(rel).splitlines() if ln.strip()}


# --- strings ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("gres, gtype, count, indices", [
    ("gpu:h100:2(IDX:0-1)", "h100", 2, (0, 1)),
    ("gpu(IDX:0,2-3,5)", None, 4, (0, 2, 3, 5)),
    ("gpu:1(IDX:3)", None, 1, (3,)),
    ("gres/gpu:h100=2", "h100", 2, None),
    ("gres:gpu:3", None, 3, None),
    ("gres/gpu:3", None, 3, None),
    ("gres/gpu=2", None, 2, None),
    ("gpu:h100:0(IDX:N/A)", "h100", 0, ()),
    ("gpu:h100:4(S:0-1)", "h100", 4, None),
])
def test_gres_spellings(gres: str, gtype: str | None, count: int, indices: tuple | None) -> None:
    (g,) = parse_gres(gres)
    assert (g.name, g.type, g.count, g.indices) == ("gpu", gtype, count, indices)


def test_gres_strings_found_in_fixtures_all_parse() -> None:
    """Every GRES= / Gres= / GresUsed= / gres_detail string in every capture parses, and IDX lists
    have as many indices as the count says."""
    seen = 0
    for path in FX.rglob("*"):
        if path.suffix not in (".txt", ".json"):
            continue
        for m in re.finditer(r'(?:GRES|Gres|GresUsed|JOB_GRES)=(\S+)|"(gpu[^"]*\(IDX:[^"]*\))"', path.read_text()):
            for g in gpu_items(m.group(1) or m.group(2)):
                seen += 1
                if g.indices is not None and g.indices:
                    assert len(g.indices) == g.count, (path, m.group(0))
    assert seen > 100


def test_hostlists_ranges_times_states() -> None:
    assert expand_hostlist("gpu-node-[01-02]") == ["gpu-node-01", "gpu-node-02"]
    assert expand_hostlist("gpu[1-2],cn1") == ["gpu1", "gpu2", "cn1"]
    assert expand_hostlist("None assigned") == []
    assert parse_ranges("0-2,4-7") == [0, 1, 2, 4, 5, 6, 7]
    assert parse_time("2026-11-29T14:28:59") == parse_time(1795962539)  # squeue.json start of job 23
    assert parse_time({"set": True, "infinite": False, "number": 1795963018}).tzinfo == UTC
    assert parse_time("Unknown") is None and parse_time(0) is None
    assert parse_duration("01:00:00") == 3600 == parse_duration(60) == parse_duration({"set": True, "number": 60})
    assert parse_duration("UNLIMITED") is None
    assert parse_state(["RUNNING"]) == parse_state("RUNNING") == "RUNNING"
    assert parse_state("CANCELLED by 1003") == "CANCELLED"
    assert jobs.external_id(28, 25, 0) == "25_0"
    assert jobs.external_id(21, {"set": True, "number": 20}, {"set": False, "number": 0},
                            {"set": True, "number": 20}, {"set": True, "number": 1}) == "20+1"


def test_kv_pairs_keep_spaces_and_repeats() -> None:
    (rec,) = [r for r in scontrol_records(text("22.05/2node/running/scontrol-show-node.txt"))
              if "gpu-node-01" in r]
    d = dict(kv_pairs(rec))
    assert d["OS"].startswith("Linux 6.18") and d["Gres"] == "gpu:h100:8"


# --- running jobs: GPU indices --------------------------------------------------------------------------

def test_multinode_job_indices_2205_text_and_json_agree() -> None:
    wl = workload("22.05/2node/workload-jobids.txt")
    job = wl["multinode-2x3"]
    one = scontrol_jobs("22.05/2node/running/scontrol-show-job-oneliner.txt")[job]
    multi = scontrol_jobs("22.05/2node/running/scontrol-show-job-d.txt")[job]
    sq = by_id([jobs.from_json_job(j, C) for j in load("22.05/2node/running/squeue.json")["jobs"]])[job]
    rest = by_id([jobs.from_json_job(j, C)
                  for j in load("22.05/2node/rest/slurm_v0.0.38_jobs.json")["jobs"]])[job]
    # README §7.2/§7.3: job 23 holds 3 GPUs on each node, IDX 0-2 on gpu-node-01 and 1-3 on gpu-node-02
    assert idx(one) == {"gpu-node-01": [0, 1, 2], "gpu-node-02": [1, 2, 3]}
    assert idx(one) == idx(multi) == idx(sq) == idx(rest)
    assert one.user == sq.user == "alice" and one.account == "team-a" and one.end is None
    assert one.start == sq.start and one.time_limit_s == sq.time_limit_s == 3600
    assert {g.model for g in one.gpus} == {"h100"} and one.labels["gpu_placement"] == "idx"


def test_running_jobs_indices_match_node_gres_used() -> None:
    """Union of running jobs' IDX per node == the node's GresUsed IDX set (same capture)."""
    allocs = scontrol_jobs("22.05/2node/running/scontrol-show-job-oneliner.txt").values()
    used: dict[str, set[int]] = {}
    for a in allocs:
        if a.state in jobs.HOLDING:
            for g in a.gpus:
                used.setdefault(g.node, set()).add(g.index)
    for rec in scontrol_records(text("22.05/2node/running/scontrol-show-node-d.txt")):
        d = dict(kv_pairs(rec))
        (g,) = gpu_items(d["GresUsed"])
        assert used.get(d["NodeName"], set()) == set(g.indices), d["NodeName"]


def test_2411_text_json_rest_agree() -> None:
    wl = workload("24.11/workload-jobids.txt")
    job = wl["multinode-2x3"]
    views = [scontrol_jobs("24.11/running/scontrol-show-job-oneliner.txt")[job],
             by_id([jobs.from_json_job(j, C) for j in load("24.11/running/squeue.json")["jobs"]])[job],
             by_id([jobs.from_json_job(j, C) for j in load("24.11/running/scontrol-show-job.json")["jobs"]])[job]]
    for v in ("v0.0.40", "v0.0.41", "v0.0.42"):
        views.append(by_id([jobs.from_json_job(j, C)
                            for j in load(f"24.11/rest/slurm_{v}_jobs.json")["jobs"]])[job])
    first = views[0]
    assert idx(first) == {"gpu-node-01": [0, 1, 2], "gpu-node-02": [1, 2, 3]}
    for v in views[1:]:
        assert (idx(v), v.user, v.account, v.state, v.start, v.reservation) == (
            idx(first), first.user, first.account, first.state, first.start, first.reservation)


def test_collapsed_nodes_line_applies_to_each_node() -> None:
    scontrol_part, json_part = text("22.05/2node/collapsed-nodes/scontrol-show-job-d-collapsed.txt").split("$ squeue")
    (a,) = [jobs.from_scontrol_job(r, C) for r in scontrol_records(scontrol_part)]
    j = json.loads(json_part[json_part.index('{"job_id"'):])
    assert idx(a) == {n: list(gpu_items(d)[0].indices)
                      for n, d in zip(expand_hostlist(j["nodes"]), j["gres_detail"], strict=True)}


def test_finished_jobs_have_no_indices() -> None:
    """after-end: job 23 was cancelled; its IDX is gone everywhere (README §7.6)."""
    job = workload("22.05/2node/workload-jobids.txt")["multinode-2x3"]
    a = scontrol_jobs("22.05/2node/after-end/scontrol-show-job-oneliner.txt")[job]
    assert a.state == "CANCELLED" and a.end is not None
    assert len(a.gpus) == 6 and all(g.index is None for g in a.gpus)


# --- history: sacct text vs JSON -------------------------------------------------------------------------

@pytest.mark.parametrize("capture", ["22.05/2node/running", "22.05/2node/after-end", "22.05/1node/after-cancel",
                                     "24.11/running"])
def test_sacct_text_and_json_agree(capture: str) -> None:
    p = Problems()
    cli = build("slurm", "allocations", {}, Context(C)).backend
    txt = by_id(list(cli.history_text(text(f"{capture}/sacct-X.txt"), p, {}, None)))
    js = by_id([jobs.from_json_db_job(j, C) for j in load(f"{capture}/sacct.json")["jobs"]])
    assert p.total == 0
    gpu_txt = {k: a for k, a in txt.items() if a.gpus}
    assert gpu_txt and set(gpu_txt) <= set(js)
    for k, a in gpu_txt.items():
        b = js[k]
        assert (a.user, a.account, a.partition, a.state, a.start, len(a.gpus), idx(a)) == (
            b.user, b.account, b.partition, b.state, b.start, len(b.gpus), idx(b)), k
        if a.end is not None:
            assert a.end == b.end


def test_sacct_arrays_counts_and_cpu_only() -> None:
    wl = workload("22.05/2node/workload-jobids.txt")
    p = Problems()
    cli = build("slurm", "allocations", {}, Context(C)).backend
    rows = list(cli.history_text(text("22.05/2node/running/sacct-X.txt"), p, {}, None))
    got = by_id(rows)
    arr = wl["array"]
    assert {k for k in got if k.startswith(f"{arr}_")} == {f"{arr}_0", f"{arr}_1", f"{arr}_2"}
    assert got[f"{arr}_0"].labels["job_id_raw"] != arr  # JobIDRaw differs from the array id
    assert got[wl["cpu-only"]].gpus == []
    assert len(got[wl["long-4gpu"]].gpus) == 4 and got[wl["long-4gpu"]].end is None
    assert got[wl["to-cancel"]].state == "CANCELLED"
    assert idx(got[wl["multinode-2x3"]]) == {"gpu-node-01": [None] * 3, "gpu-node-02": [None] * 3}
    assert got[wl["multinode-2x3"]].labels["gpu_placement"] == "even-split"


def test_reservation_id_resolved_through_sacctmgr() -> None:
    """22.05 sacct --json has a garbage reservation name; the id maps through sacctmgr's Name|ID."""
    names = {}
    for _, row in jobs.sacct_rows(text("22.05/2node/reservations/sacctmgr-show-reservation.txt")):
        names[row["ID"]] = row["Name"]
    for j in load("22.05/1node/before-multinode/sacct.json")["jobs"]:
        a = jobs.from_json_db_job(j, C, names)
        if a.labels.get("reservation_id"):
            assert a.reservation == names[a.labels["reservation_id"]]
            assert not isinstance(j["reservation"]["name"], str)


def test_malformed_sacct_line_is_skipped_and_reading_continues() -> None:
    lines = text("22.05/2node/running/sacct-X.txt").splitlines()
    lines.insert(3, "garbage|line")
    bad = lines[4].split("|")
    bad[lines[1].split("|").index("Start")] = "not-a-date"
    lines.insert(5, "|".join(bad))
    p = Problems()
    cli = build("slurm", "allocations", {}, Context(C)).backend
    got = list(cli.history_text("\n".join(lines), p, {}, None))
    assert p.total == 2 and len(got) == len(lines) - 1 - 2 - 2  # header, $/[rc] lines, two bad ones
    assert all("slurm:cli:sacct" == s for s, *_ in p.items)


# --- 25.11 (v0.0.44) ---------------------------------------------------------------------------------------

def test_2511_gpus_from_gres_detail_and_tres_per_x() -> None:
    """PROVENANCE: that cluster did not account gres/gpu, so GPUs are only in gres_detail / tres_per_*."""
    for name in ("running", "per-node", "per-task", "multi-nodes", "type"):
        (j,) = load(f"slurmrestd-25.11/slurm-job-gpus-{name}.json")["jobs"]
        a = jobs.from_json_job(j, C)
        detail = [gpu_items(s)[0] for s in j["gres_detail"]]
        assert len(a.gpus) == sum(g.count for g in detail) > 0
        assert idx(a) == {n: list(g.indices) for n, g in zip(expand_hostlist(j["nodes"]), detail, strict=True)}
    cancelled = by_id([jobs.from_json_job(j, C) for j in load("slurmrestd-25.11/slurm-jobs.json")["jobs"]])["5736"]
    assert cancelled.state == "CANCELLED" and len(cancelled.gpus) == 4  # tres_per_job gres/gpu:4
    assert all(g.index is None for g in cancelled.gpus)
    (db,) = load("slurmrestd-25.11/slurmdb-job-gpus-running.json")["jobs"]
    assert jobs.from_json_db_job(db, C).gpus == []  # no gres/gpu TRES in that accounting


# --- nodes and reservations ----------------------------------------------------------------------------------

def test_inventory_text_json_rest_agree() -> None:
    now = datetime(2026, 11, 29, tzinfo=UTC)
    txt = [g for r in scontrol_records(text("22.05/2node/running/scontrol-show-node.txt"))
           for g in inv.from_scontrol_node(r, C, now)]
    js = [g for n in load("22.05/2node/running/sinfo.json")["nodes"] for g in inv.from_json_node(n, C, now)]
    rest = [g for n in load("24.11/rest/slurm_v0.0.42_nodes.json")["nodes"] for g in inv.from_json_node(n, C, now)]
    key = sorted((g.host, g.gpu, g.model) for g in txt)
    assert key == sorted((g.host, g.gpu, g.model) for g in js) == sorted((g.host, g.gpu, g.model) for g in rest)
    assert len(txt) == 16 and inv.gpus_per_node(txt) == {"gpu-node-01": 8, "gpu-node-02": 8}
    nodes = [g for n in load("slurmrestd-25.11/slurm-nodes.json")["nodes"] for g in inv.from_json_node(n, C, now)]
    assert inv.gpus_per_node(nodes) == {n["name"]: sum(x.count for x in gpu_items(n["gres"]))
                                        for n in load("slurmrestd-25.11/slurm-nodes.json")["nodes"] if n["gres"]}


def test_reservations_2205_text_and_rest() -> None:
    now = datetime(2026, 11, 29, tzinfo=UTC)
    per_node = inv.gpus_per_node([g for r in scontrol_records(text("22.05/2node/running/scontrol-show-node.txt"))
                                  for g in inv.from_scontrol_node(r, C, now)])
    txt = {r.name: r for r in (inv.from_scontrol_reservation(x, C, per_node) for x in
                               scontrol_records(text("22.05/2node/reservations/scontrol-show-reservation-oneliner.txt")))}
    rest = {r.name: r for r in (inv.from_json_reservation(x, C, per_node) for x in
                                load("22.05/2node/rest/slurm_v0.0.38_reservations.json")["reservations"])}
    assert set(txt) == {"team-b-idle", "alice-used", "future-maint"}
    assert txt["team-b-idle"].accounts == ["team-b"] and txt["team-b-idle"].users == []
    assert txt["team-b-idle"].nodes == ["gpu-node-02"] and txt["team-b-idle"].gpu_count == 8
    assert txt["future-maint"].gpu_count == 16 and "MAINT" in txt["future-maint"].flags
    for name in set(txt) & set(rest):
        a, b = txt[name], rest[name]
        assert (a.nodes, a.gpu_count, a.users, a.accounts, a.start, a.end) == (
            b.nodes, b.gpu_count, b.users, b.accounts, b.start, b.end)


def test_reservation_gpu_tres_2411() -> None:
    per_node = {"gpu-node-01": 8, "gpu-node-02": 8}
    txt = {r.name: r for r in (inv.from_scontrol_reservation(x, C, per_node)
                               for x in scontrol_records(text("24.11/running/scontrol-show-reservation.txt")))}
    js = {r.name: r for r in (inv.from_json_reservation(x, C, per_node)
                              for x in load("24.11/running/scontrol-show-reservation.json")["reservations"])}
    assert txt["gpu-tres-typed-node"].gpu_count == 1 == js["gpu-tres-typed-node"].gpu_count  # TRES gres/gpu=1
    assert txt["alice-used"].gpu_count == 8 and txt["alice-used"].users == ["alice"]
    def shape(rs: dict[str, Reservation]) -> dict:
        return {k: (v.start, v.end, v.nodes) for k, v in rs.items()}

    assert shape(txt) == shape(js)


def test_sacctmgr_reservations() -> None:
    rows = [r for _, r in jobs.sacct_rows(text("22.05/sreport/sacctmgr-show-reservation.txt"))]
    res = [inv.from_sacctmgr_row(r, C, {"gpu-node-01": 8, "gpu-node-02": 8, "vm": 8}) for r in rows]
    assert {r.name: r.gpu_count for r in res}["future-maint"] == 16
    assert all(r.end >= r.start for r in res)


# --- every JSON capture parses --------------------------------------------------------------------------------

def test_every_json_capture_parses() -> None:
    n = 0
    for path in sorted(FX.rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue  # *.HTTP500.json error bodies
        for obj in data.get("jobs") or []:
            db = "state" in obj and "job_state" not in obj
            a = jobs.from_json_db_job(obj, C) if db else jobs.from_json_job(obj, C)
            assert a.external_id and (a.start is None or a.start.tzinfo == UTC)
            n += 1
        for node in data.get("nodes") if isinstance(data.get("nodes"), list) else []:
            inv.from_json_node(node, C, None)
        for r in data.get("reservations") or []:
            inv.from_json_reservation(r, C, {})
    assert n > 300


# --- assembly: merge, window, snapshot ------------------------------------------------------------------------

def test_assemble_merges_indices_filters_window_and_snapshot() -> None:
    running = [a for a in scontrol_jobs("22.05/2node/running/scontrol-show-job-oneliner.txt").values()
               if a.state in jobs.HOLDING and a.gpus]
    cli = build("slurm", "allocations", {}, Context(C)).backend
    history = list(cli.history_text(text("22.05/2node/running/sacct-X.txt"), Problems(), {}, None))
    win = Window(datetime(2026, 11, 29, 14, 28, tzinfo=UTC), datetime(2026, 11, 29, 15, 0, tzinfo=UTC))
    out = list(assemble(Reading(running=running, running_complete=True, history=history), win, C))
    allocs = by_id([r for r in out if isinstance(r, Allocation)])
    job = workload("22.05/2node/workload-jobids.txt")["multinode-2x3"]
    assert idx(allocs[job]) == {"gpu-node-01": [0, 1, 2], "gpu-node-02": [1, 2, 3]}
    assert all(a.end is None or a.end >= win.since for a in allocs.values())
    assert "3" not in allocs  # ended 14:23:54, before the window
    assert isinstance(out[-1], RunningSnapshot)
    incomplete = list(assemble(Reading(running=running, history=history), win, C))
    assert not any(isinstance(r, RunningSnapshot) for r in incomplete)
    # sacct says RUNNING but the whole running listing lacks it: not re-opened next to the snapshot
    without = [a for a in running if a.external_id != job]
    out2 = by_id([r for r in assemble(Reading(running=without, running_complete=True, history=history), win, C)
                  if isinstance(r, Allocation)])
    assert job not in out2 and job in by_id([r for r in incomplete if isinstance(r, Allocation)])
    again = [r for r in assemble(Reading(running=running, running_complete=True, history=history), win, C)
             if isinstance(r, Allocation)]
    assert [(a.external_id, idx(a)) for a in again] == [(a.external_id, idx(a)) for a in allocs.values()]


# --- pyslurm mapping (stand-ins shaped like pyslurm's documented attributes) ------------------------------------

def _core_job(**kw: object) -> SimpleNamespace:
    base = dict(id=23, array_id=None, array_task_id=None, heterogeneous_id=None, heterogeneous_offset=None,
                name="multinode-2x3", user_name="alice", account="team-a", partition="gpu", qos="normal",
                state="RUNNING", submit_time=1795962534, start_time=1795962539, end_time=1795966139,
                time_limit=60, reservation=None, allocated_nodes="gpu-node-[01-02]",
                gres_per_node={"gpu:h100": 3})
    base.update(kw)
    layout = {"gpu-node-01": {"gres": {"gpu:h100": {"count": "3", "indexes": "0-2"}}},
              "gpu-node-02": {"gres": {"gpu:h100": {"count": "3", "indexes": "1-3"}}}}
    return SimpleNamespace(**base, get_resource_layout_per_node=lambda: layout)


def test_pyslurm_mapping_matches_cli_view() -> None:
    cli_view = scontrol_jobs("22.05/2node/running/scontrol-show-job-oneliner.txt")["23"]
    a = psb.from_core_job(_core_job(), C)
    assert (idx(a), a.user, a.account, a.start, a.time_limit_s, a.end) == (
        idx(cli_view), cli_view.user, cli_view.account, cli_view.start, cli_view.time_limit_s, None)
    db = psb.from_db_job(SimpleNamespace(id=28, array_id=25, array_task_id=0, heterogeneous_id=0,
                                         heterogeneous_offset=None, name="array", user_name="alice",
                                         account="team-a", partition="gpu", qos="normal", state="COMPLETED",
                                         submit_time=1795962534, start_time=1795962539, end_time=1795962547,
                                         time_limit=5, reservation="", nodelist="gpu-node-02",
                                         gres={"gpu": 1, "gpu:h100": 1}), C)
    assert db.external_id == "25_0" and idx(db) == {"gpu-node-02": [None]} and db.gpus[0].model == "h100"
    node = SimpleNamespace(name="gpu-node-01", configured_gres={"gpu:h100": 8})
    assert [g.gpu for g in psb.from_node(node, C, datetime.now(UTC))] == list(range(8))


def test_pyslurm_backend_reads_through_module_api() -> None:
    win = Window(datetime(2026, 11, 29, 14, tzinfo=UTC), datetime(2026, 11, 29, 16, tzinfo=UTC))
    fake = SimpleNamespace(
        Nodes=SimpleNamespace(load=lambda: {"gpu-node-01": SimpleNamespace(name="gpu-node-01",
                                                                            configured_gres={"gpu:h100": 8})}),
        Jobs=SimpleNamespace(load=lambda: {23: _core_job()}),
        db=SimpleNamespace(JobFilter=lambda **kw: kw, Jobs=SimpleNamespace(load=lambda flt: {})),
    )
    conn = build("slurm", "allocations", {"backend": "pyslurm"}, Context(C))
    reading = conn.backend.read(win, Problems(), pyslurm=fake)
    assert reading.running_complete and len(reading.inventory) == 8
    assert idx(reading.running[0]) == {"gpu-node-01": [0, 1, 2], "gpu-node-02": [1, 2, 3]}
    with pytest.raises(SourceError) as exc:
        conn.backend.read(win, Problems())
    assert "pyslurm is not importable" in str(exc.value) and "\n" not in str(exc.value)


def test_records_are_typed() -> None:
    per_node = {"gpu-node-02": 8}
    r = inv.from_json_reservation(load("22.05/2node/rest/slurm_v0.0.38_reservations.json")["reservations"][0],
                                  C, per_node)
    assert isinstance(r, Reservation) and r.end - r.start == timedelta(hours=2)
    assert isinstance(inv.from_json_node({"name": "n", "gres": "gpu:2"}, C, None)[0], GpuInventory)


def test_every_option_is_documented() -> None:
    from connectors.slurm import SlurmOptions

    doc = (Path(__file__).parents[1] / "docs/slurm.md").read_text()
    rows = {line.split("|")[1].strip() for line in doc.splitlines() if line.startswith("| `slurm.")}
    assert rows == {f"`slurm.{name}`" for name in SlurmOptions.model_fields}
    assert all(f.description for f in SlurmOptions.model_fields.values())


def test_older_gres_idx_spelling_reads_like_gres() -> None:
    """Older slurmctld prints ``GRES_IDX=gpu(IDX:0,2-3,5)`` where 22.05 prints ``GRES=gpu:h100:3(IDX:0-2)``:
    job 23's real record, respelled, gives the same per-node indices (README §7.2: 0-2 and 1-3)."""
    job = workload("22.05/2node/workload-jobids.txt")["multinode-2x3"]
    rec = next(r for r in scontrol_records(text("22.05/2node/running/scontrol-show-job-oneliner.txt"))
               if r.startswith(f"JobId={job} "))
    old = rec.replace("GRES=gpu:h100:3(IDX:0-2)", "GRES_IDX=gpu(IDX:0-2)").replace(
        "GRES=gpu:h100:3(IDX:1-3)", "GRES_IDX=gpu(IDX:1,2-3)")
    assert old != rec and "GRES_IDX=gpu(IDX:1,2-3)" in old
    a = jobs.from_scontrol_job(old, C)
    assert idx(a) == {"gpu-node-01": [0, 1, 2], "gpu-node-02": [1, 2, 3]}
    assert a.labels["gpu_placement"] == "idx"
    sparse = jobs.from_scontrol_job(old.replace("GRES_IDX=gpu(IDX:0-2)", "GRES_IDX=gpu(IDX:0,2-3,5)"), C)
    assert idx(sparse)["gpu-node-01"] == [0, 2, 3, 5]


def _respell(job_name: str, gres: str, tres: str) -> str:
    """A real 22.05 running record (job ``job_name`` of the 2-node workload) with its GRES/TRES respelled."""
    job = workload("22.05/2node/workload-jobids.txt")[job_name]
    rec = next(r for r in scontrol_records(text("22.05/2node/running/scontrol-show-job-oneliner.txt"))
               if r.startswith(f"JobId={job} "))
    rec = re.sub(r"TRES=\S+", f"TRES={tres}", rec, count=1)
    return re.sub(r"GRES=gpu:h100:3\(IDX:0-2\)", gres, rec, count=1)


def test_mig_typed_gres_and_shards_get_shares() -> None:
    # MIG slices by index while running: 1g.10gb is 1 of 7 compute slices, 3g.40gb 3 of 7
    rec = _respell("multinode-2x3", "GRES=gpu:1g.10gb:1(IDX:3),gpu:3g.40gb:1(IDX:7)",
                   "cpu=2,node=2,billing=2,gres/gpu=4,gres/gpu:1g.10gb=2,gres/gpu:3g.40gb=2")
    a = jobs.from_scontrol_job(rec, C)
    node1 = [(g.index, round(g.share, 6), g.mig_profile) for g in a.gpus if g.node == "gpu-node-01"]
    assert node1 == [(3, round(1 / 7, 6), "1g.10gb"), (7, round(3 / 7, 6), "3g.40gb")]
    # history (sacct AllocTRES): both MIG types of a single-node job; A30's 2g.12gb is 2 of 4 slices
    row = {"JobID": "9", "JobIDRaw": "9", "State": "COMPLETED", "Start": "2026-11-29T10:00:00",
           "End": "2026-11-29T11:00:00", "NodeList": "mig-01",
           "AllocTRES": "cpu=1,gres/gpu=3,gres/gpu:1g.10gb=2,gres/gpu:3g.40gb=1"}
    h = jobs.from_sacct_row(row, C)
    assert sorted((round(g.share, 6), g.mig_profile) for g in h.gpus) == [
        (round(1 / 7, 6), "1g.10gb"), (round(1 / 7, 6), "1g.10gb"), (round(3 / 7, 6), "3g.40gb")]
    assert abs(h.gpu_count - 5 / 7) < 1e-9  # billed as 5/7 of a GPU, not 3 GPUs
    a30 = jobs.from_sacct_row({**row, "AllocTRES": "cpu=1,gres/gpu=1,gres/gpu:2g.12gb=1"}, C)
    assert [(g.share, g.mig_profile) for g in a30.gpus] == [(0.5, "2g.12gb")]
    # shards: 2 shards of a node whose GPUs carry 8 shards each -> 2/8 of a GPU, on the GPU IDX names
    node = "NodeName=gpu-node-01 Arch=x86_64 CoresPerSocket=16 Gres=gpu:h100:8,shard:h100:64 State=MIXED"
    assert inv.node_shards(node) == ("gpu-node-01", 8)
    srec = _respell("multinode-2x3", "GRES=shard:h100:2(IDX:0)", "cpu=2,node=2,billing=2,gres/shard=2")
    s = jobs.from_scontrol_job(srec, C)
    shard_gpus = [g for g in s.gpus if g.node == "gpu-node-01"]
    assert [(g.index, g.share, g.mig_profile) for g in shard_gpus] == [(0, 0.5, "shard"), (0, 0.5, "shard")]
    win = Window(datetime(2026, 11, 29, 14, 0, tzinfo=UTC), datetime(2026, 11, 29, 16, 0, tzinfo=UTC))
    out = [r for r in assemble(Reading(running=[s], shards={"gpu-node-01": 8}), win, C)
           if isinstance(r, Allocation)]
    assert [(g.index, g.share) for g in out[0].gpus if g.node == "gpu-node-01"] == [(0, 0.125), (0, 0.125)]
    acct = jobs.from_sacct_row({**row, "NodeList": "gpu-node-01", "AllocTRES": "cpu=1,gres/shard=3"}, C)
    assert [(g.node, g.mig_profile) for g in acct.gpus] == [("gpu-node-01", "shard")] * 3


def test_shard_and_mig_json_shapes_seen_on_the_mig_shard_testbed() -> None:
    """squeue --json fields as the real 22.05 testbed (variant mig-shard) printed them for three jobs."""
    base = {"job_state": "RUNNING", "start_time": 1795962539, "user_name": "bob", "account": "team-b"}
    shard = jobs.from_json_job({**base, "job_id": 32, "nodes": "gpu-node-02", "gres_detail": ["shard:2(IDX:0)"],
                                "tres_alloc_str": "cpu=1,node=1,billing=1,gres/shard=2",
                                "tres_per_node": "gres:shard:2"}, C)
    mig = jobs.from_json_job({**base, "job_id": 31, "nodes": "gpu-node-01",
                              "gres_detail": ["gpu:1g.10gb:2(IDX:0-1)"],
                              "tres_alloc_str": "cpu=1,node=1,billing=1,gres/gpu=2,gres/gpu:1g.10gb=2"}, C)
    assert [(g.index, g.share, g.mig_profile) for g in shard.gpus] == [(0, 0.5, "shard")] * 2
    assert [(g.index, round(g.share * 7, 6), g.mig_profile) for g in mig.gpus] == [(0, 1.0, "1g.10gb"),
                                                                                  (1, 1.0, "1g.10gb")]
    assert inv.node_shards({"name": "gpu-node-02", "gres": "gpu:h100:8,shard:h100:64"}) == ("gpu-node-02", 8)
    assert inv.node_shards({"name": "gpu-node-01", "gres": "gpu:1g.10gb:4,gpu:3g.40gb:2"}) is None
