"""Jobs -> :class:`Allocation`, from every shape Slurm gives them: ``sacct -P`` rows, ``scontrol -d -o show
job`` records, ``squeue --json`` / REST ``/slurm/vX/jobs`` objects and ``sacct --json`` / REST
``/slurmdb/vX/jobs`` objects (22.05 ints and strings, 24.x+ ``{set, number}`` and lists).

GPU placement, best first: per-node ``IDX`` (running jobs only) -> per-node counts -> a single node holds
all -> an even split across nodes when the total divides (labelled, since Slurm did not say) -> node "".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from auditor.records import AllocatedGpu, Allocation
from connectors.slurm.parse import (
    Gres,
    expand_hostlist,
    gpu_items,
    gpu_or_shard_items,
    is_null,
    kv_pairs,
    mig_share,
    number,
    parse_duration,
    parse_state,
    parse_time,
    parse_tres,
    sluid,
    tres_gpus,
    tres_mig,
    tres_shards,
    user_name,
)

SOURCE = "slurm"
#: States in which a job holds its allocation (a complete listing of these closes the others).
HOLDING = frozenset({"RUNNING", "SUSPENDED", "COMPLETING", "STOPPED", "SIGNALING", "CONFIGURING",
                     "RESIZING", "STAGE_OUT"})
PENDING = "PENDING"

#: sacct columns the CLI asks for (``-o``); JobName last so a ``|`` inside a name cannot shift columns.
SACCT_FIELDS = ("JobID", "JobIDRaw", "User", "Account", "Partition", "QOS", "State", "Submit", "Start",
                "End", "ElapsedRaw", "TimelimitRaw", "NodeList", "AllocTRES", "ReservationId",
                "Reservation", "Eligible", "ReqTRES", "ExitCode", "TotalCPU", "JobName")
#: sacct columns that name a run of a job, by the Slurm release that added them (SchedMD/slurm
#: doc/man/man1/sacct.1; commits 60a7fbdefb "sacct - Add support for printing the SLUID field", in 24.11,
#: and b474f56f5a "sacct - Add OriginalSLUID format field", in 26.05). An older sacct refuses them, so the
#: cli backend asks for them only when ``sacct --version`` is that recent (:func:`sacct_fields`).
SLUID_FIELDS = (((24, 11), "SLUID"), ((26, 5), "OriginalSLUID"))


def sacct_fields(version: tuple[int, int] | None) -> tuple[str, ...]:
    """SACCT_FIELDS plus the SLUID columns this sacct version prints, before JobName (which stays last)."""
    extra = tuple(name for since, name in SLUID_FIELDS if version is not None and version >= since)
    return SACCT_FIELDS[:-1] + extra + SACCT_FIELDS[-1:]


def run_sluid(original: Any, record: Any) -> str | None:
    """The SLUID of the run from an accounting record. sacct's ``SLUID`` (``sluid`` in --json) is the
    record's own id (slurmdbd db_index), new on a requeue and also on a resize; ``OriginalSLUID``
    (``original_sluid``, 26.05+) is the job's SLUID that slurmctld and squeue show, new only on a requeue
    (src/common/job_record.c ``job_record_set_sluid``): preferred; where it is absent (24.11-25.11) the
    record's SLUID is the run's unless the job was resized."""
    return sluid(original) or sluid(record)


def exit_code(value: Any) -> str | None:
    """sacct ``ExitCode`` (``return code:signal``, e.g. ``0:0``, ``1:0``, ``0:9``) as printed; None when
    absent or not of that form."""
    text = "" if is_null(value) else str(value).strip()
    code, sep, sig = text.partition(":")
    return text if sep and code.isdigit() and sig.isdigit() else None


def json_exit_code(value: Any) -> str | None:
    """sacct --json ``exit_code`` -> ``return code:signal``: 22.05 ``{"return_code": 0}``, 24.x
    ``{"return_code": {"set", "number"}, "signal": {"id": {"set", "number"}}}``."""
    if not isinstance(value, dict):
        return None
    rc = number(value.get("return_code"))
    sig = value.get("signal")
    sn = number(sig.get("id")) if isinstance(sig, dict) else None
    return None if rc is None else f"{int(rc)}:{int(sn or 0)}"


def cpu_seconds(value: Any) -> float | None:
    """sacct ``TotalCPU`` (``[D-][HH:]MM:SS[.mmm]``) -> seconds; None when absent, malformed or 0 (sacct -X
    may print 0 for a job whose steps it did not read: 0 is "not said", never "no CPU used")."""
    text = "" if is_null(value) else str(value).strip()
    if not text:
        return None
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        if not d.isdigit():
            return None
        days = int(d)
    parts = text.split(":")
    if not 2 <= len(parts) <= 3 or not all(p.replace(".", "", 1).isdigit() for p in parts):
        return None
    secs = float(parts[-1]) + 60 * int(parts[-2]) + (3600 * int(parts[0]) if len(parts) == 3 else 0)
    total = days * 86400 + secs
    return total if total > 0 else None


def restart_count(value: Any) -> int | None:
    """scontrol ``Restarts=N`` / squeue --json ``restart_cnt`` (a number, or 24.x ``{"set": true, "number": N}``)
    -> N; None when absent or not a whole number >= 0."""
    n = number(value)
    return n if isinstance(n, int) and n >= 0 else None


def _cpus(tres: dict[str, str]) -> int | None:
    n = tres.get("cpu")
    return int(n) if n is not None and n.isdigit() and int(n) > 0 else None


def _json_cpu_seconds(t: dict[str, Any]) -> float | None:
    """sacct --json ``time.total`` (``{"seconds", "microseconds"}``) -> seconds; None when absent or 0."""
    total = t.get("total") if isinstance(t, dict) else None
    if not isinstance(total, dict):
        return None
    s = float(number(total.get("seconds")) or 0) + float(number(total.get("microseconds")) or 0) / 1e6
    return s if s > 0 else None


def external_id(job_id: Any, array_job: Any = None, array_task: Any = None, het_job: Any = None,
                het_offset: Any = None) -> str:
    """Slurm's display id: ``12_3`` for an array task, ``20+1`` for a heterogeneous part, else ``12``."""
    aj, at, hj, ho = (number(v) for v in (array_job, array_task, het_job, het_offset))
    if aj and at is not None:
        return f"{aj}_{at}"
    if hj and ho is not None:
        return f"{hj}+{ho}"
    return str(number(job_id) if not isinstance(job_id, str) else job_id)


MAX_GPUS = 65536  # the largest real jobs hold ~16k GPUs


def _gpu(node: str, index: int | None, gtype: str | None, model: str | None) -> AllocatedGpu:
    """One allocated GPU; a MIG-typed GRES (``gpu:1g.10gb``) is a slice: its share and profile."""
    share = mig_share(gtype) if gtype else mig_share(model)
    if share is not None:
        return AllocatedGpu(node=node, index=index, share=share, mig_profile=gtype or model)
    return AllocatedGpu(node=node, index=index, model=gtype or model)


def _shards(node: str, item: Gres) -> list[AllocatedGpu]:
    """``shard:k`` on one node: k shares of one GPU (1/k each until the node's shards per GPU are known,
    see :func:`connectors.slurm.assemble`), on the GPU IDX names when it names exactly one."""
    index = item.indices[0] if item.indices and len(set(item.indices)) == 1 else None
    return [AllocatedGpu(node=node, index=index, share=1.0 / item.count, mig_profile=SHARD)
            for _ in range(item.count)]


SHARD = "shard"  # mig_profile of a Slurm GPU shard (its price-card entry is [prices].mig.shard)


def place_gpus(nodes: list[str], per_node: list[tuple[str, list[Gres]]] | None, total: int,
               model: str | None, shards: int = 0) -> tuple[list[AllocatedGpu], str]:
    """One AllocatedGpu per GPU, with the node and index when Slurm said; see the module docstring.
    A count above MAX_GPUS is a corrupt or hostile value, not a job: ValueError (the caller quarantines)."""
    claimed = total + shards + sum(g.count for _, items in (per_node or []) for g in items)
    if claimed > MAX_GPUS:
        raise ValueError(f"{claimed} GPUs in one job (more than {MAX_GPUS})")
    if per_node and any(items for _, items in per_node):
        gpus: list[AllocatedGpu] = []
        with_idx = True
        for node, items in per_node:
            for g in items:
                if g.name == SHARD:
                    gpus.extend(_shards(node, g))
                elif g.indices is not None and len(g.indices) == g.count:
                    gpus.extend(_gpu(node, i, g.type, model) for i in g.indices)
                else:
                    with_idx = False
                    gpus.extend(_gpu(node, None, g.type, model) for _ in range(g.count))
        if gpus:
            return gpus, "idx" if with_idx else "per-node"
    if total <= 0 and shards > 0:
        where = nodes if len(nodes) == 1 else [""]
        return _shards(where[0], Gres(SHARD, None, shards)), "node" if len(nodes) == 1 else "unknown-node"
    if total <= 0:
        return [], "none"
    if len(nodes) == 1:
        return [_gpu(nodes[0], None, None, model) for _ in range(total)], "node"
    if nodes and total % len(nodes) == 0:
        each = total // len(nodes)
        return [_gpu(n, None, None, model) for n in nodes for _ in range(each)], "even-split"
    return [_gpu("", None, None, model) for _ in range(total)], "unknown-node"


def place_tres(nodes: list[str], tres: dict[str, str]) -> tuple[list[AllocatedGpu], str]:
    """GPUs of an accounting record (no indices): per MIG type on a single-node job (a job may hold
    ``1g.10gb`` and ``3g.40gb`` slices at once), else by the untyped count."""
    total, model = tres_gpus(tres)
    mig = tres_mig(tres)
    if mig and len(nodes) == 1 and sum(n for _, n in mig) == total:
        return [_gpu(nodes[0], None, t, None) for t, n in mig for _ in range(n)], "node"
    return place_gpus(nodes, None, total, model, tres_shards(tres))


def _labels(nodes_text: str, placement: str, **more: Any) -> dict[str, str]:
    labels = {"nodes": nodes_text or "", "gpu_placement": placement}
    labels.update({k: str(v) for k, v in more.items() if v not in (None, "", 0)})
    return labels


# --- sacct -P --------------------------------------------------------------------------------------------

def sacct_rows(text: str,
               fields: tuple[str, ...] | None = None) -> Iterator[tuple[int, dict[str, str] | str]]:
    """(line number, row dict) per data line of ``sacct -P`` output; with ``fields`` None the first line is
    the header. A line with too few columns yields its raw text instead of a dict (caller quarantines)."""
    header = list(fields) if fields else None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("$ ") or line.strip().startswith("[rc="):
            continue
        parts = line.split("|")
        if header is None:
            header = parts
            continue
        if len(parts) > len(header) and "JobName" in header:  # a '|' inside the job name
            i, extra = header.index("JobName"), len(parts) - len(header)
            parts[i:i + extra + 1] = ["|".join(parts[i:i + extra + 1])]
        if len(parts) != len(header):
            yield lineno, line
            continue
        yield lineno, dict(zip(header, parts, strict=True))


def from_sacct_row(row: dict[str, str], cluster: str, resv_names: dict[str, str] | None = None) -> Allocation:
    """A ``sacct -P -X`` row (any column order; missing columns stay empty). Raises ValueError/KeyError
    on malformed values."""
    job_id = row.get("JobID") or row["JobIDRaw"]
    nodes_text = "" if is_null(row.get("NodeList")) else row.get("NodeList", "")
    nodes = expand_hostlist(nodes_text)
    gpus, placement = place_tres(nodes, parse_tres(row.get("AllocTRES")))
    resv = row.get("Reservation", "")
    resv_id = row.get("ReservationId", "")
    if is_null(resv) and not is_null(resv_id) and resv_id != "0":
        resv = (resv_names or {}).get(resv_id, "")
    limit = row.get("TimelimitRaw")
    state = parse_state(row.get("State"))
    start, end = parse_time(row.get("Start")), parse_time(row.get("End"))
    if start and end and state not in HOLDING and end < start:
        raise ValueError(f"End {row.get('End')} is before Start {row.get('Start')}")
    return Allocation(
        cluster=cluster, source=SOURCE, external_id=job_id, name=row.get("JobName", ""),
        user=row.get("User", ""), account=row.get("Account", ""), partition=row.get("Partition", ""),
        qos=row.get("QOS", ""), state=state, submit=parse_time(row.get("Submit")),
        start=parse_time(row.get("Start")),
        end=None if state in HOLDING else parse_time(row.get("End")),
        reservation="" if is_null(resv) else resv,
        time_limit_s=parse_duration(limit) if limit else parse_duration(row.get("Timelimit")),
        labels=_labels(nodes_text, placement, job_id_raw=row.get("JobIDRaw"),
                       reservation_id=None if resv_id in ("", "0") else resv_id),
        gpus=gpus, eligible=parse_time(row.get("Eligible")),
        gpus_requested=float(tres_gpus(parse_tres(row.get("ReqTRES")))[0]),
        exit_code=None if state in HOLDING else exit_code(row.get("ExitCode")),
        cpus=_cpus(parse_tres(row.get("AllocTRES"))),
        cpu_time_s=None if state in HOLDING else cpu_seconds(row.get("TotalCPU")),
        sluid=run_sluid(row.get("OriginalSLUID"), row.get("SLUID")),
    )


# --- scontrol -d -o show job ------------------------------------------------------------------------------

def from_scontrol_job(record: str, cluster: str) -> Allocation:
    """One ``scontrol -d [-o] show job`` record. ``Nodes=… GRES=…(IDX:…)`` segments give per-node indices
    while the job runs (a collapsed ``Nodes=gpu-node-[01-02]`` segment applies to each node)."""
    pairs = kv_pairs(record)
    d: dict[str, str] = {}
    per_node: list[tuple[str, list[Gres]]] = []
    pending_nodes: str | None = None
    for k, v in pairs:
        if k == "Nodes":
            pending_nodes = v
        elif k in ("GRES", "GRES_IDX") and pending_nodes is not None:  # GRES_IDX: older Slurm
            items = gpu_or_shard_items(v)
            per_node.extend((n, items) for n in expand_hostlist(pending_nodes))
            pending_nodes = None
        else:
            d.setdefault(k, v)
    if "JobId" not in d:
        raise ValueError("no JobId")
    nodes_text = "" if is_null(d.get("NodeList")) else d.get("NodeList", "")
    nodes = expand_hostlist(nodes_text)
    tres = parse_tres(d.get("AllocTRES") or d.get("TRES"))
    total, model = tres_gpus(tres)
    if total == 0:
        total, model = _tres_per(d.get("TresPerJob"), d.get("TresPerNode"), None, len(nodes), 0, model)
    if model is None:
        typed = {g.type for _, items in per_node for g in items if g.type} | {
            g.type for g in gpu_items(d.get("JOB_GRES")) if g.type}
        model = typed.pop() if len(typed) == 1 else None
    state = parse_state(d.get("JobState"))
    gpus, placement = place_gpus(nodes, per_node if state in HOLDING else None, total, model,
                                 tres_shards(tres))
    return Allocation(
        cluster=cluster, source=SOURCE,
        external_id=external_id(int(d["JobId"]), d.get("ArrayJobId"), d.get("ArrayTaskId"),
                                d.get("HetJobId"), d.get("HetJobOffset")),
        name=d.get("JobName", ""), user=user_name(d.get("UserId", "")), account=d.get("Account", ""),
        partition=d.get("Partition", ""), qos=d.get("QOS", ""), state=state,
        eligible=parse_time(d.get("EligibleTime")), gpus_requested=float(total),
        # a pending job's StartTime is the scheduler's forecast, not a start
        submit=parse_time(d.get("SubmitTime")), start=None if state == PENDING else parse_time(d.get("StartTime")),
        end=None if state in HOLDING else parse_time(d.get("EndTime")),
        reservation="" if is_null(d.get("Reservation")) else d.get("Reservation", ""),
        time_limit_s=parse_duration(d.get("TimeLimit")),
        labels=_labels(nodes_text, placement, job_id_raw=d["JobId"]),
        gpus=gpus, restarts=restart_count(d.get("Restarts")),
        sluid=sluid(d.get("SLUID")),  # 25.11+ ``scontrol -d show job`` (src/scontrol/info_job.c, 41163083af)
    )


def _tres_per(per_job: Any, per_node: Any, per_task: Any, n_nodes: int, n_tasks: int,
              model: str | None) -> tuple[int, str | None]:
    """GPU count from the request strings when AllocTRES has none (site not accounting gres/gpu)."""
    for text, mult in ((per_job, 1), (per_node, max(n_nodes, 1)), (per_task, max(n_tasks, 1))):
        items = gpu_items(text) if isinstance(text, str) else []
        if items:
            types = {g.type for g in items if g.type}
            return sum(g.count for g in items) * mult, model or (types.pop() if len(types) == 1 else None)
    return 0, model


# --- JSON: squeue --json, REST /slurm/vX/jobs, scontrol show job --json -----------------------------------

def from_json_job(job: dict[str, Any], cluster: str) -> Allocation:
    """A slurmctld job object (v0.0.38 … v0.0.46). From v0.0.44 (25.11) ``step_id`` is a
    ``slurm_step_id`` object whose ``sluid`` is the job's SLUID (data_parser v0.0.44-46 parsers.c,
    ``PARSER_ARRAY(JOB_INFO)`` -> ``SLURM_STEP_ID``)."""
    nodes_text = job.get("nodes") or ""
    nodes = expand_hostlist(nodes_text)
    state = parse_state(job.get("job_state"))
    detail = job.get("gres_detail") or []
    per_node = [(nodes[i], gpu_or_shard_items(s)) for i, s in enumerate(detail) if i < len(nodes)]
    tres = parse_tres(job.get("tres_alloc_str"))
    total, model = tres_gpus(tres)
    if per_node and state in HOLDING:
        total = max(total, sum(g.count for _, items in per_node for g in items if g.name == "gpu"))
    if total == 0:
        total, model = _tres_per(job.get("tres_per_job"), job.get("tres_per_node"), job.get("tres_per_task"),
                                 len(nodes) or int(number(job.get("node_count")) or 0),
                                 int(number(job.get("tasks")) or 0), model)
    gpus, placement = place_gpus(nodes, per_node if state in HOLDING else None, total, model,
                                 tres_shards(tres))
    return Allocation(
        cluster=cluster, source=SOURCE,
        external_id=external_id(job["job_id"], job.get("array_job_id"), job.get("array_task_id"),
                                job.get("het_job_id"), job.get("het_job_offset")),
        name=job.get("name") or "", user=job.get("user_name") or "", account=job.get("account") or "",
        partition=job.get("partition") or "", qos=job.get("qos") or "", state=state,
        eligible=parse_time(job.get("eligible_time")), gpus_requested=float(total),
        # a pending job's start_time is the scheduler's forecast, not a start
        submit=parse_time(job.get("submit_time")),
        start=None if state == PENDING else parse_time(job.get("start_time")),
        end=None if state in HOLDING else parse_time(job.get("end_time")),
        reservation=job.get("resv_name") or "",
        time_limit_s=parse_duration(job.get("time_limit")),
        labels=_labels(nodes_text, placement, job_id_raw=number(job.get("job_id"))),
        gpus=gpus, restarts=restart_count(job.get("restart_cnt")),
        sluid=sluid((job.get("step_id") or {}).get("sluid") if isinstance(job.get("step_id"), dict) else None),
    )


# --- JSON: sacct --json, REST /slurmdb/vX/jobs ------------------------------------------------------------

def from_json_db_job(job: dict[str, Any], cluster: str,
                     resv_names: dict[str, str] | None = None) -> Allocation:
    """A slurmdbd job object. 22.05's ``reservation.name`` is garbage (an int), so the id is resolved
    through ``resv_names`` (from sacctmgr) when the name is not a string."""
    nodes_text = "" if is_null(job.get("nodes")) else job.get("nodes") or ""
    nodes = expand_hostlist(nodes_text)
    tres = {}
    for t in (job.get("tres") or {}).get("allocated") or []:
        if t.get("type") == "gres" and t.get("count") is not None:
            tres[f"gres/{t.get('name')}"] = str(t["count"])
    gpus, placement = place_tres(nodes, tres)
    req = {f"gres/{r.get('name')}": str(r["count"]) for r in (job.get("tres") or {}).get("requested") or []
           if r.get("type") == "gres" and r.get("count") is not None}
    t = job.get("time") or {}
    state = parse_state(job.get("state"))
    resv = job.get("reservation") or {}
    rid = number(resv.get("id"))
    rname = resv.get("name") if isinstance(resv.get("name"), str) else ""
    if not rname and rid:
        rname = (resv_names or {}).get(str(rid), "")
    array, het = job.get("array") or {}, job.get("het") or {}
    return Allocation(
        cluster=cluster, source=SOURCE,
        external_id=external_id(job["job_id"], array.get("job_id"), array.get("task_id"),
                                het.get("job_id"), het.get("job_offset")),
        name=job.get("name") or "", user=job.get("user") or "", account=job.get("account") or "",
        partition=job.get("partition") or "", qos=job.get("qos") or "", state=state,
        submit=parse_time(t.get("submission")), start=parse_time(t.get("start")),
        end=None if state in HOLDING else parse_time(t.get("end")),
        eligible=parse_time(t.get("eligible")), gpus_requested=float(tres_gpus(req)[0]),
        reservation=rname, time_limit_s=parse_duration(t.get("limit")),
        labels=_labels(nodes_text, placement, job_id_raw=number(job.get("job_id")), reservation_id=rid),
        gpus=gpus, exit_code=None if state in HOLDING else json_exit_code(job.get("exit_code")),
        cpus=next((int(c["count"]) for c in (job.get("tres") or {}).get("allocated") or []
                   if c.get("type") == "cpu" and isinstance(c.get("count"), int) and c["count"] > 0), None),
        cpu_time_s=None if state in HOLDING else _json_cpu_seconds(t),
        # v0.0.45+ (26.05): ``original_sluid`` (the job's) and ``sluid`` (the record's); data_parser
        # v0.0.45/v0.0.46 parsers.c PARSER_ARRAY(JOB); v0.0.44 and older give neither
        sluid=run_sluid(job.get("original_sluid"), job.get("sluid")),
    )


def merge(history: Allocation, running: Allocation) -> Allocation:
    """The running view carries GPU indices; the accounting view carries QOS, limits and names Slurm may
    print differently. Keep the running GPUs and fill blanks from history."""
    for attr in ("name", "user", "account", "partition", "qos", "reservation"):
        if not getattr(running, attr):
            setattr(running, attr, getattr(history, attr))
    running.submit = running.submit or history.submit
    running.start = running.start or history.start
    running.time_limit_s = running.time_limit_s or history.time_limit_s
    running.cpus = running.cpus or history.cpus
    running.restarts = running.restarts if running.restarts is not None else history.restarts
    running.sluid = running.sluid or history.sluid  # slurmctld's is the job's own (a resize keeps it)
    if not running.gpus or running.labels.get("gpu_placement") not in ("idx", "per-node"):
        running.gpus = history.gpus or running.gpus
        running.labels["gpu_placement"] = history.labels.get("gpu_placement", "")
    for k, v in history.labels.items():
        running.labels.setdefault(k, v)
    return running
