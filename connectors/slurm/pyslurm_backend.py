"""The ``pyslurm`` backend: the Python bindings (pyslurm >= 23.2 object API), imported lazily.

Mapped from pyslurm's documented attributes (pyslurm/core/job/job.pxd, pyslurm/db/job.pxd):
``pyslurm.Jobs.load()`` -> running jobs with ``get_resource_layout_per_node()`` (per node ``gres`` dict
``{"gpu:h100": {"count": "3", "indexes": "0-2"}}``), ``pyslurm.db.Jobs.load(pyslurm.db.JobFilter(...))``
-> history with ``gres``/``allocated_tres``, ``pyslurm.Nodes.load()`` -> ``configured_gres``. PyPI's pyslurm
targets Slurm 25.11 and cannot be built against Debian's 22.05, so only the mapping is tested (with
stand-in objects); see docs/slurm.md."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from auditor.errors import SourceError
from auditor.records import Allocation, GpuInventory, Reservation
from connectors.base import Problems, Window
from connectors.slurm import jobs
from connectors.slurm.parse import (
    Gres,
    expand_hostlist,
    is_null,
    parse_duration,
    parse_ranges,
    parse_state,
    parse_time,
    split_list,
)
from connectors.slurm.reading import Reading

if TYPE_CHECKING:
    from connectors.slurm import SlurmAllocations


def gres_dict_items(gres: Mapping[str, Any] | None) -> list[Gres]:
    """pyslurm's gres dict (``{"gpu:h100": 2}`` or ``{"gpu:h100": {"count": "3", "indexes": "0-2"}}``)."""
    out: list[Gres] = []
    for key, val in (gres or {}).items():
        name, _, gtype = str(key).partition(":")
        if name != "gpu":
            continue
        if isinstance(val, Mapping):
            idx = val.get("indexes")
            indices = tuple(parse_ranges(str(idx))) if idx is not None and not is_null(str(idx)) else None
            count = int(val.get("count") or (len(indices) if indices else 0))
        else:
            indices, count = None, int(val)
        out.append(Gres(name="gpu", type=gtype or None, count=count, indices=indices))
    return out


def _total(items: list[Gres]) -> tuple[int, str | None]:
    untyped = [g for g in items if g.type is None]
    typed = [g for g in items if g.type]
    types = {g.type for g in typed}
    total = sum(g.count for g in untyped) if untyped else sum(g.count for g in typed)
    return total, types.pop() if len(types) == 1 else None


def _ext_id(job: Any) -> str:
    return jobs.external_id(job.id, getattr(job, "array_id", None), getattr(job, "array_task_id", None),
                            getattr(job, "heterogeneous_id", None),
                            getattr(job, "heterogeneous_offset", None))


def _allocation(job: Any, cluster: str, state: str, nodes_text: str, gpus: list[Any], placement: str) -> Allocation:
    """The Allocation of a pyslurm job of either view (the fields both name alike)."""
    return Allocation(
        cluster=cluster, source=jobs.SOURCE, external_id=_ext_id(job), name=job.name or "",
        user=job.user_name or "", account=job.account or "", partition=job.partition or "",
        qos=job.qos or "", state=state, submit=parse_time(job.submit_time), start=parse_time(job.start_time),
        end=None if state in jobs.HOLDING else parse_time(job.end_time),
        reservation=getattr(job, "reservation", None) or "",
        time_limit_s=parse_duration(job.time_limit),
        labels={"nodes": nodes_text, "gpu_placement": placement, "job_id_raw": str(job.id)},
        gpus=gpus,
    )


def from_core_job(job: Any, cluster: str) -> Allocation:
    """A ``pyslurm.Job`` (slurmctld view)."""
    nodes_text = getattr(job, "allocated_nodes", None) or ""
    nodes = expand_hostlist(nodes_text)
    state = parse_state(job.state)
    layout = job.get_resource_layout_per_node() if state in jobs.HOLDING else {}
    per_node = [(node, gres_dict_items((info or {}).get("gres"))) for node, info in (layout or {}).items()]
    total, model = _total(gres_dict_items(getattr(job, "gres_per_node", None) or {}))
    total *= max(len(nodes), 1)
    gpus, placement = jobs.place_gpus(nodes, per_node, total, model)
    return _allocation(job, cluster, state, nodes_text, gpus, placement)


def from_db_job(job: Any, cluster: str) -> Allocation:
    """A ``pyslurm.db.Job`` (slurmdbd view): counts only, never indices."""
    nodes_text = "" if is_null(getattr(job, "nodelist", None)) else job.nodelist
    nodes = expand_hostlist(nodes_text)
    total, model = _total(gres_dict_items(getattr(job, "gres", None)))
    gpus, placement = jobs.place_gpus(nodes, None, total, model)
    return _allocation(job, cluster, parse_state(job.state), nodes_text, gpus, placement)


def from_node(node: Any, cluster: str, seen_at: datetime) -> list[GpuInventory]:
    out, i = [], 0
    for g in gres_dict_items(getattr(node, "configured_gres", None)):
        for _ in range(g.count):
            out.append(GpuInventory(cluster=cluster, host=node.name, gpu=i, model=g.type, seen_at=seen_at))
            i += 1
    return out


def from_reservation(r: Any, cluster: str, per_node: dict[str, int]) -> Reservation:
    nodes = expand_hostlist(getattr(r, "nodes", None))
    return Reservation(cluster=cluster, name=r.name, start=parse_time(r.start_time),  # type: ignore[arg-type]
                       end=parse_time(r.end_time), nodes=nodes,  # type: ignore[arg-type]
                       gpu_count=float(sum(per_node.get(n, 0) for n in nodes)),
                       users=split_list(getattr(r, "users", None)),
                       accounts=split_list(getattr(r, "accounts", None)),
                       flags=split_list(getattr(r, "flags", None)))


class PyslurmBackend:
    """Reads one cluster through pyslurm; the module is imported on first use, not at config load."""

    def __init__(self, owner: SlurmAllocations) -> None:
        self.cluster = owner.context.cluster
        self.name = owner.name
        self._mod: Any = None

    def module(self) -> Any:
        if self._mod is None:
            try:
                self._mod = importlib.import_module("pyslurm")
            except ImportError as exc:
                raise SourceError(self.name, f"pyslurm is not importable ({exc.msg})",
                                  transient=False) from None
        return self._mod

    def read(self, window: Window, problems: Problems, pyslurm: Any = None) -> Reading:
        ps = pyslurm or self.module()
        now = datetime.now(UTC)
        reading = Reading()
        try:
            for node in _values(ps.Nodes.load()):
                reading.inventory.extend(from_node(node, self.cluster, now))
            reading.running_at = datetime.now(UTC)
            ok = True
            for job in _values(ps.Jobs.load()):
                try:
                    a = from_core_job(job, self.cluster)
                except (ValueError, TypeError, AttributeError) as exc:
                    ok = False
                    problems.skip(f"{self.name}:Jobs", f"job {getattr(job, 'id', '?')}", str(exc))
                    continue
                reading.add_live(a)
            reading.running_complete = ok
            flt = ps.db.JobFilter(start_time=window.since, end_time=window.until)
            for job in _values(ps.db.Jobs.load(flt)):
                try:
                    reading.history.append(from_db_job(job, self.cluster))
                except (ValueError, TypeError, AttributeError) as exc:
                    problems.skip(f"{self.name}:db.Jobs", f"job {getattr(job, 'id', '?')}", str(exc))
            per_node: dict[str, int] = {}
            for g in reading.inventory:
                per_node[g.host] = per_node.get(g.host, 0) + 1
            resv_api = getattr(ps, "Reservations", None)
            for r in _values(resv_api.load()) if resv_api else []:
                res = from_reservation(r, self.cluster, per_node)
                if res.start and res.end and res.start < window.until and res.end > window.since:
                    reading.reservations.append(res)
        except SourceError:
            raise
        except Exception as exc:  # pyslurm raises its own RPCError etc.; one line, no traceback
            raise SourceError(self.name, f"pyslurm: {type(exc).__name__}: {str(exc)[:200]}",
                              transient=True) from None
        return reading


def _values(collection: Any) -> list[Any]:
    """pyslurm collections are dict-like (id -> object), multi-cluster ones nest per cluster."""
    if isinstance(collection, Mapping):
        vals = list(collection.values())
        if vals and all(isinstance(v, Mapping) for v in vals):
            return [x for v in vals for x in v.values()]
        return vals
    return list(collection or [])
