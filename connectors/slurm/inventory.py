"""Nodes -> :class:`GpuInventory` and advance reservations -> :class:`Reservation`, from ``scontrol -o show
node|reservation`` text, REST/``--json`` objects and ``sacctmgr -P show reservation`` rows.

A reservation's GPU count is the ``gres/gpu`` in its TRES when Slurm put one there (24.x accepts GPU TRES
with ``Nodes=``), else every GPU of its nodes (22.05 rejects GPU TRES: reserving a node reserves its GPUs).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from auditor.records import GpuInventory, Reservation
from connectors.slurm.parse import (
    expand_hostlist,
    gpu_items,
    is_null,
    kv_pairs,
    parse_time,
    parse_tres,
    shards_per_gpu,
    split_list,
    tres_gpus,
)


def _inventory(cluster: str, host: str, gres: str | None, seen_at: datetime | None) -> list[GpuInventory]:
    """GPU indices follow gres.conf order: each typed group continues where the previous one ended."""
    out: list[GpuInventory] = []
    i = 0
    for g in gpu_items(gres):
        for _ in range(g.count):
            out.append(GpuInventory(cluster=cluster, host=host, gpu=i, model=g.type, seen_at=seen_at))
            i += 1
    return out


def from_scontrol_node(record: str, cluster: str, seen_at: datetime | None) -> list[GpuInventory]:
    d: dict[str, str] = {}
    for k, v in kv_pairs(record):
        d.setdefault(k, v)
    if "NodeName" not in d:
        raise ValueError("no NodeName")
    return _inventory(cluster, d["NodeName"], d.get("Gres"), seen_at)


def node_shards(record: str | dict[str, Any]) -> tuple[str, int] | None:
    """(node, shards per GPU) of a ``scontrol -o show node`` record or a node object with shards."""
    if isinstance(record, dict):
        name, gres = record.get("name"), record.get("gres")
    else:
        d: dict[str, str] = {}
        for k, v in kv_pairs(record):
            d.setdefault(k, v)
        name, gres = d.get("NodeName"), d.get("Gres")
    n = shards_per_gpu(gres) if name else None
    return (str(name), n) if n else None


def from_json_node(node: dict[str, Any], cluster: str, seen_at: datetime | None) -> list[GpuInventory]:
    return _inventory(cluster, node["name"], node.get("gres"), seen_at)


def gpus_per_node(inventory: list[GpuInventory]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for g in inventory:
        counts[g.host] = counts.get(g.host, 0) + 1
    return counts


def _gpu_count(tres_text: str | None, nodes: list[str], per_node: dict[str, int]) -> float:
    count, _ = tres_gpus(parse_tres(tres_text))
    return float(count) if count else float(sum(per_node.get(n, 0) for n in nodes))


def from_scontrol_reservation(record: str, cluster: str, per_node: dict[str, int]) -> Reservation:
    d: dict[str, str] = {}
    for k, v in kv_pairs(record):
        d.setdefault(k, v)
    if "ReservationName" not in d:
        raise ValueError("no ReservationName")
    start, end = parse_time(d.get("StartTime")), parse_time(d.get("EndTime"))
    if start is None or end is None:
        raise ValueError("reservation without start/end time")
    nodes = expand_hostlist(d.get("Nodes"))
    return Reservation(cluster=cluster, name=d["ReservationName"], start=start, end=end, nodes=nodes,
                       gpu_count=_gpu_count(d.get("TRES"), nodes, per_node),
                       users=split_list(d.get("Users")), accounts=split_list(d.get("Accounts")),
                       flags=split_list(d.get("Flags")))


def from_json_reservation(r: dict[str, Any], cluster: str, per_node: dict[str, int]) -> Reservation:
    start, end = parse_time(r.get("start_time")), parse_time(r.get("end_time"))
    if start is None or end is None:
        raise ValueError("reservation without start/end time")
    nodes = expand_hostlist(r.get("node_list"))
    return Reservation(cluster=cluster, name=r["name"], start=start, end=end, nodes=nodes,
                       gpu_count=_gpu_count(r.get("tres"), nodes, per_node),
                       users=split_list(r.get("users")), accounts=split_list(r.get("accounts")),
                       flags=split_list(r.get("flags")))


def from_json_db_reservation(r: dict[str, Any], cluster: str, per_node: dict[str, int]) -> Reservation:
    """A ``/slurmdb/vX/reservations`` object (v0.0.39+; times plain or under ``time``), the REST copy of
    ``sacctmgr show reservation``."""
    t = r.get("time") if isinstance(r.get("time"), dict) else {}
    start = parse_time(t.get("start", r.get("time_start", r.get("start_time"))))
    end = parse_time(t.get("end", r.get("time_end", r.get("end_time"))))
    if start is None or end is None or is_null(r.get("name")):
        raise ValueError("reservation without name/start/end")
    nodes = expand_hostlist(r.get("node_list") or r.get("nodes"))
    tres = r.get("tres")
    if isinstance(tres, list):  # [{"type": "gres", "name": "gpu", "count": 2}, ...]
        tres = ",".join(f"{x.get('type')}/{x.get('name')}={x.get('count')}" if x.get("name")
                        else f"{x.get('type')}={x.get('count')}" for x in tres if isinstance(x, dict))
    flags = r.get("flags")
    rid = r.get("id")
    return Reservation(cluster=cluster, name=str(r["name"]), start=start, end=end, nodes=nodes,
                       gpu_count=_gpu_count(tres, nodes, per_node),
                       flags=flags if isinstance(flags, list) else split_list(flags),
                       slurm_id="" if rid in (None, 0, "") else str(rid))


def from_sacctmgr_row(row: dict[str, str], cluster: str, per_node: dict[str, int]) -> Reservation:
    """``sacctmgr -P show reservation format=Name,ID,TRES,TimeStart,TimeEnd,NodeNames,Flags``: the
    accounting copy, which also remembers reservations that ended (users/accounts are not in it)."""
    start, end = parse_time(row.get("TimeStart")), parse_time(row.get("TimeEnd"))
    if start is None or end is None or is_null(row.get("Name")):
        raise ValueError("reservation row without name/start/end")
    nodes = expand_hostlist(row.get("NodeName") or row.get("NodeNames"))
    rid = row.get("ID") or ""
    return Reservation(cluster=cluster, name=row["Name"], start=start, end=end, nodes=nodes,
                       gpu_count=_gpu_count(row.get("TRES"), nodes, per_node),
                       flags=split_list(row.get("Flags")), slurm_id="" if is_null(rid) else rid)


def assemble_pieces(pieces: list[Reservation]) -> list[Reservation]:
    """slurmdbd keeps one row per modification of a started reservation (a ``scontrol update`` of its
    users, nodes or flags ends the current row one second before the update and inserts a new one with the
    same id): one reservation per id (per name where the id is unknown), spanning all its pieces, with the
    latest piece's definition (nodes, GPUs, flags). Keeping only the first piece turns a 40-minute
    reservation updated after 18 seconds into an 18-second one."""
    groups: dict[tuple[str, str], list[Reservation]] = {}
    for r in pieces:
        groups.setdefault((r.name, r.slurm_id or ""), []).append(r)
    out = []
    for group in groups.values():
        group.sort(key=lambda r: (r.start, r.end))
        last = group[-1]
        out.append(Reservation(cluster=last.cluster, name=last.name, start=group[0].start,
                               end=max(r.end for r in group), nodes=list(last.nodes), gpu_count=last.gpu_count,
                               users=list(last.users), accounts=list(last.accounts), flags=list(last.flags),
                               slurm_id=last.slurm_id))
    return out


def same_reservation(live: Reservation, hist: Reservation, now: datetime) -> bool:
    """Is accounting's (assembled) reservation the one slurmctld shows now? Slurm allows one reservation of
    a name at a time: yes when accounting's has not ended yet or the two spans overlap (an earlier
    reservation that reused the name ended before this one began)."""
    return hist.end > now or (hist.start <= live.end and live.start <= hist.end)


def merge_reservations(live: list, history: list, window: Any, now: datetime) -> list:
    """slurmctld's current definitions (with users and accounts) win; accounting's assembled ones that are
    the same reservation only lend them their id; the others (ended, or a name used again) stay apart."""
    by_name = {r.name: r for r in live}
    out = list(live)
    for h in history:
        cur = by_name.get(h.name)
        if cur is not None and same_reservation(cur, h, now):
            cur.slurm_id = cur.slurm_id or h.slurm_id
            continue
        out.append(h)
    return [r for r in out if r.start < window.until and r.end > window.since]
