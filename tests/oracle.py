"""Reference oracle of docs/definitions.md (README "Definitions"): slow, plain and obviously correct.

Plain Python over plain lists and dicts: no SQL and nothing from ``auditor`` but the record types and the
config models (thresholds, price card). It models the store (ingest merges, the hourly roll-up of
``db prune``) and the audit (attribution, applicable sub-rows, per-bucket verdicts, seconds per allocated
GPU and per allocation, money, findings). Unknown time is computed on its own (reserved time no applicable
row covers, plus the unobserved part of the covered buckets), never as the remainder of the other classes;
:meth:`Oracle.audit` checks the identity ``reserved = classes + unknown`` itself.

Where the definitions leave a choice open the oracle says which one it takes (search "CHOICE").
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from oracle_infra import ALL_KINDS, Events, touches
from oracle_rules import findings, price
from oracle_samples import Sample
from oracle_samples import rows as sample_rows

from auditor.audit.efficiency import HINT_DRAM_HIGH, HINT_IO_BPS, HINT_UTIL_PULSE_HIGH
from auditor.audit.waiting import (
    HOST_DISK_BUSY,
    HOST_FS_READ_BPS,
    HOST_IB_BPS,
    HOST_IOWAIT_SHARE,
    HOST_NFS_OPS,
    HOST_PEGGED_PER_GPU,
    STRAGGLER_LINK_BPS,
    STRAGGLER_PEER_SM,
)
from auditor.config import PriceCard, Thresholds
from auditor.records import METRIC_FIELDS, AllocatedGpu, Allocation, GpuBucket, GpuInventory, NodeBucket, NodeEvent

EPS = 1e-9  # definitions: "v < t means v < t - 1e-9; v >= t means v >= t - 1e-9"
HOUR = 3600
WEEK = 7 * 86400
CLASSES = ("idle", "idle_by_util", "mirage", "low", "working", "busy_unverified", "idle_by_counters",
           "busy_by_counters", "engine_spin")
IDLE_VERDICTS = ("idle", "idle_by_util", "mirage", "idle_by_counters")  # their memory is "held while idle"
WAIT_CLASSES = ("memory", "communication", "starved")  # the classes of "where the waiting goes" kept as sums
LINKS = ("pcie_tx_bps", "pcie_rx_bps", "nvlink_tx_bps", "nvlink_rx_bps")
SPARK_BINS = 48
CORE_FINDINGS = ("unmonitored", "idle_allocation", "util_mirage", "hung_collective", "ghost_busy", "idle_gpus")


def lt(v: float, t: float) -> bool:
    return v < t - EPS


def ge(v: float, t: float) -> bool:
    return v >= t - EPS


def epoch(v: Any) -> float | None:
    if v is None:
        return None
    return v.timestamp() if isinstance(v, datetime) else float(v)


def bucket_job(b: GpuBucket) -> str:
    """The telemetry job key: ``job`` when the record has it, else hpc_job, else namespace/pod, else ""."""
    j = getattr(b, "job", None)
    if j is not None:
        return j
    if b.hpc_job:
        return b.hpc_job
    if b.pod:
        return f"{b.namespace or ''}/{b.pod}"
    return ""


@dataclass
class Row:
    """One stored telemetry sub-row, normalised (observed_s and span never None)."""

    cluster: str
    host: str
    gpu: int
    instance: str
    ts: float
    job: str
    bucket_s: float
    samples: int
    observed_s: float
    span: tuple[float, float]
    metrics: dict[str, float | None]

    @property
    def key(self) -> tuple:
        return (self.cluster, self.host, self.gpu, self.instance, self.ts, self.job)


def row_of(b: GpuBucket) -> Row:
    ts, w = epoch(b.start), float(b.seconds)
    assert ts is not None
    obs = getattr(b, "observed_s", None)
    if obs is None:  # a connector that cannot tell: the whole bucket when sampled, else nothing
        obs = w if b.samples > 0 else 0.0
    obs = min(w, max(0.0, obs))
    s0, s1 = epoch(getattr(b, "span_start", None)), epoch(getattr(b, "span_end", None))
    span = (ts if s0 is None else s0, ts + w if s1 is None else s1)
    return Row(b.cluster, b.host, b.gpu, b.gpu_instance, ts, bucket_job(b), w, b.samples, float(obs), span,
               {m: getattr(b, m) for m in METRIC_FIELDS})


def merge(stored: Row, new: Row) -> Row:
    """Same key: field by field; both have a metric -> the row with more samples (tie: the stored one)."""
    newer = new.samples > stored.samples
    metrics = {}
    for m in METRIC_FIELDS:
        a, b = stored.metrics[m], new.metrics[m]
        metrics[m] = b if a is None else a if b is None else (b if newer else a)
    win = new if newer else stored
    return Row(stored.cluster, stored.host, stored.gpu, stored.instance, stored.ts, stored.job, win.bucket_s,
               max(stored.samples, new.samples), max(stored.observed_s, new.observed_s), win.span, metrics)


def names(job: str, alloc: Allocation) -> bool:
    """Does a telemetry job key name the allocation? Exact match of one comma-separated part."""
    want = alloc.external_id if alloc.source == "slurm" else f"{alloc.account}/{alloc.name}"
    return want in job.split(",")


def overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def union_length(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of ``intervals`` clipped to [lo, hi)."""
    total, end = 0.0, lo
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals):
        if e <= s:
            continue
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def combine(rows: list[Row]) -> Row:
    """Several applicable sub-rows of one bucket: observed_s = min(bucket_s, sum), metrics = observed_s-weighted
    mean over the rows that have them, span = hull, samples = sum."""
    if len(rows) == 1:
        return rows[0]
    w = rows[0].bucket_s
    assert all(r.bucket_s == w for r in rows), "sub-rows of one bucket with different widths"
    metrics: dict[str, float | None] = {}
    for m in METRIC_FIELDS:
        have = [r for r in rows if r.metrics[m] is not None]
        den = sum(r.observed_s for r in have)
        # CHOICE: a metric only rows without observed seconds carry has no weight: None
        metrics[m] = sum(r.observed_s * r.metrics[m] for r in have) / den if den > 0 else None  # type: ignore
    r0 = rows[0]
    return Row(r0.cluster, r0.host, r0.gpu, r0.instance, r0.ts, "+".join(r.job for r in rows), w,
               sum(r.samples for r in rows), min(w, sum(r.observed_s for r in rows)),
               (min(r.span[0] for r in rows), max(r.span[1] for r in rows)), metrics)


def verdict(m: dict[str, float | None], th: Thresholds) -> str:
    sm, util = m["sm_active"], m["gpu_util"]
    if sm is not None:
        dram, tensor, gr = m["dram_active"], m["tensor_active"], m["gr_engine"]
        if lt(sm, th.idle_sm) and (dram is None or lt(dram, th.idle_dram)) and \
                (tensor is None or lt(tensor, th.idle_tensor)):
            busy = (util is not None and ge(util, th.mirage_gpu_util)) or \
                (gr is not None and ge(gr, th.mirage_gr_engine))
            return "mirage" if busy else "idle"
        return "working" if ge(sm, th.working_sm) else "low"
    # evidence tier 2 (definitions "Evidence tiers"): the stock counters, when the GR engine and Tensor or DRAM
    # were read. Written from the definition, not from auditor/audit/verdict.py.
    gr, tensor, dram = m["gr_engine"], m["tensor_active"], m["dram_active"]
    if gr is not None and (tensor is not None or dram is not None):
        tensor_busy = tensor is not None and ge(tensor, th.idle_tensor)
        dram_busy = dram is not None and ge(dram, th.idle_dram)
        if tensor_busy or dram_busy:
            return "busy_by_counters"
        return "idle_by_counters" if lt(gr, th.idle_gr_engine) else "engine_spin"
    power = m["power_w"]
    if th.util_fallback and util is not None and lt(util, th.idle_util) and \
            (th.idle_power_w is None or (power is not None and lt(power, th.idle_power_w))):
        return "idle_by_util"
    return "busy_unverified"


def links(apply: list[Row]) -> tuple[float | None, bool]:
    """PCIe + NVLink bytes/s of the applicable rows of a bucket and whether any link counter was read
    (definitions "Where the waiting goes"): per row the sum of its link counters (a missing one 0), rows
    combined weighted by observed seconds like every metric (one row: its own)."""
    io = [sum(r.metrics[k] or 0.0 for k in LINKS) for r in apply]
    measured = any(r.metrics[k] is not None for r in apply for k in LINKS)
    if len(apply) == 1:
        return io[0], measured
    den = sum(r.observed_s for r in apply)
    return (sum(r.observed_s * x for r, x in zip(apply, io, strict=True)) / den if den > 0 else None), measured


def wait_class(v: str, m: dict[str, float | None], io: float | None, measured: bool, th: Thresholds) -> str:
    """The class of an observed bucket (definitions "Where the waiting goes"), first match wins."""
    sm, dram = m["sm_active"], m["dram_active"]
    if v in IDLE_VERDICTS:
        return "idle"
    if sm is None:
        return "not_measured"
    if ge(sm, th.working_sm):
        return "compute"
    if dram is not None and ge(dram, HINT_DRAM_HIGH):
        return "memory"
    util = m["gpu_util"]  # a GPU-Util duty cycle under hint_util_pulse_high: idle part of the bucket, no link wait
    if measured and io is not None and ge(io, HINT_IO_BPS) and (util is None or ge(util, HINT_UTIL_PULSE_HIGH)):
        return "communication"
    if dram is not None and measured:
        return "starved"
    return "not_measured"


def sparkline(gpus: list[GpuResult], a_s: float, a_e: float) -> dict[str, Any] | None:
    """definitions "Sparklines": the clock hours [a_s, a_e) touches in at most 48 bins of k whole hours; per bin
    SM activity and GPU-Util weighted by share x observed seconds; None when no bin has a reading."""
    h0 = int(a_s // HOUR)
    n = int((a_e - 1) // HOUR) - h0 + 1
    k = max(1, -(-n // SPARK_BINS))
    bins = [[0.0, 0.0, 0.0, 0.0] for _ in range(-(-n // k))]
    for g in gpus:
        for h, v in g.hours.items():
            b = bins[min(len(bins) - 1, max(0, (h - h0) // k))]
            for i in range(4):
                b[i] += v[i]
    sm = [b[0] / b[1] if b[1] > 0 else None for b in bins]
    util = [b[2] / b[3] if b[3] > 0 else None for b in bins]
    if all(x is None for x in sm + util):
        return None
    return {"sm": sm, "util": util, "bin_hours": k}


@dataclass
class GpuResult:
    """One allocated GPU: seconds x share; ``tied`` is the telemetry GPU it was attributed to."""

    node: str
    slot: int
    share: float
    attribution: str = "unattributed"
    tied: tuple[str, str, int, str] | None = None
    index: int | None = None  # the GPU index it was judged as (scheduler's, else the attributed one)
    infra: float = 0.0  # infrastructure-affected seconds x share
    reserved: float = 0.0
    observed: float = 0.0
    unknown: float = 0.0
    effective: float = 0.0
    mirage_raw: float = 0.0  # mirage wall seconds, not share-weighted (util_mirage's "single GPU" minutes)
    mirage_util: float = 0.0  # share x obs x GPU-Util over mirage seconds (hung_collective, ghost_busy)
    mirage_power: float = 0.0  # share x obs x power over mirage seconds with power
    mirage_power_obs: float = 0.0  # share x mirage seconds with power
    held: float | None = None  # max fb_used_mib over idle, idle_by_util and mirage seconds
    cls: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0.0))
    #: share x observed seconds per class of "where the waiting goes" that is no verdict (definitions)
    wait: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WAIT_CLASSES, 0.0))
    lead: float = 0.0  # share x obs of rows with SM that compute or run the link saturated (stragglers)
    input_wait: float = 0.0  # share x obs of SM-idle rows its own job's input starved (never idle)
    host_busy: float = 0.0  # share x obs of SM-idle rows whose shared node's host read the input busy (idle)
    waitable: float = 0.0  # share x obs of rows with SM below straggler_peer_sm
    waits: float = 0.0  # share x obs of rows not busy with idle_sm <= SM < straggler_peer_sm
    #: clock hour (of the bucket's start) -> share x [obs x SM, obs with SM, obs x GPU-Util, obs with GPU-Util]
    hours: dict[int, list[float]] = field(default_factory=dict)

    def sums(self) -> dict[str, float]:
        """The audit's columns: idle includes idle_by_util and idle_by_counters."""
        c = self.cls
        return {"reserved": self.reserved, "observed": self.observed,
                "idle": c["idle"] + c["idle_by_util"] + c["idle_by_counters"], "idle_by_util": c["idle_by_util"],
                "idle_by_counters": c["idle_by_counters"], "busy_by_counters": c["busy_by_counters"],
                "engine_spin": c["engine_spin"],
                "mirage": c["mirage"], "low": c["low"], "working": c["working"],
                "busy_unverified": c["busy_unverified"], "unknown": self.unknown, "effective": self.effective,
                "infra": self.infra, **self.wait, "lead": self.lead, "waitable": self.waitable, "waits": self.waits,
                "input_wait": self.input_wait, "host_busy_idle": self.host_busy}


@dataclass
class AllocResult:
    key: tuple
    alloc: Allocation
    gpus: list[GpuResult]
    totals: dict[str, float]
    price: float
    reserved_cost: float
    idle_cost: float
    findings: set[str]
    near_boundary: bool  # a finding rule compared a value within rounding of its threshold
    sparkline: dict[str, Any] | None = None  # the sparkline of a finding about it (definitions "Sparklines")


def alloc_key(a: Allocation) -> tuple:
    # CHOICE: jobs are keyed by cluster, source, id and start time (issue 13: job ids are reused)
    return (a.cluster, a.source, a.external_id, epoch(a.start))


def slots(a: Allocation) -> list[tuple[AllocatedGpu, int]]:
    """Each allocated GPU with its slot: ordinal on its node, GPUs with an index first (by index)."""
    out: list[tuple[AllocatedGpu, int]] = []
    by_node: dict[str, list[AllocatedGpu]] = defaultdict(list)
    for g in a.gpus:
        by_node[g.node].append(g)
    for node in sorted(by_node):
        gs = sorted(by_node[node], key=lambda g: (g.index is None, g.index if g.index is not None else 0))
        out += [(g, k) for k, g in enumerate(gs)]
    return out


class Oracle:
    """The store and the audit in plain Python."""

    def __init__(self) -> None:
        self.allocs: dict[tuple, Allocation] = {}
        self.rows: dict[tuple, Row] = {}
        self.inventory: set[tuple[str, str, int]] = set()
        self.tgpus: set[tuple[str, str, int, str]] = set()
        self.tuuid: dict[tuple[str, str, str], int] = {}  # (cluster, host, uuid) -> lowest index (whole GPUs)
        self.seen: Counter[str] = Counter()  # which rules this fleet exercised (coverage of the generator)
        self.rolled_before: float | None = None  # cutoff of the latest roll-up
        self.hourly: set[tuple] = set()  # (cluster, host, gpu, instance, hour) holding a rolled-up row
        self.events = Events()
        self.nodes: dict[tuple[str, str, float], NodeBucket] = {}  # host rows: a re-read replaces

    # -- store ------------------------------------------------------------------------------------
    def ingest(self, records: list[Any]) -> None:
        raw = [r for r in records if isinstance(r, Sample)]  # raw samples: bucket rows by the definitions
        if raw:
            self.seen["raw samples made into bucket rows"] += 1
            records = [r for r in records if not isinstance(r, Sample)] + sample_rows(raw)
        for r in records:
            if isinstance(r, GpuBucket):
                row = row_of(r)
                self.tgpus.add((row.cluster, row.host, row.gpu, row.instance))
                if r.uuid and row.instance == "":  # the store keeps a GPU's last known UUID; the demo never changes it
                    key = (row.cluster, row.host, r.uuid)
                    self.tuuid[key] = min(self.tuuid.get(key, row.gpu), row.gpu)
                # CHOICE (issue 13 "a backfill after a prune double counts"): a fine row re-collected for a GPU
                # hour that a roll-up already holds is dropped; the hourly row keeps that hour
                if row.bucket_s < HOUR and self.rolled_before is not None and row.ts < self.rolled_before and \
                        (row.cluster, row.host, row.gpu, row.instance, row.ts // HOUR * HOUR) in self.hourly:
                    self.seen["re-collected fine row for a rolled-up hour dropped"] += 1
                    continue
                old = self.rows.get(row.key)
                if old is not None and old != row:
                    self.seen["merge of differing rows"] += 1
                self.rows[row.key] = row if old is None else merge(old, row)
            elif isinstance(r, Allocation):
                k = alloc_key(r)
                old = self.allocs.get(k)
                if old is not None and r.end is None and old.end is not None:
                    r = dataclasses.replace(r, end=old.end)  # an end once known stays
                self.allocs[k] = r
            elif isinstance(r, GpuInventory):
                self.inventory.add((r.cluster, r.host, r.gpu))
            elif isinstance(r, NodeEvent):
                self.events.add(r)
            elif isinstance(r, NodeBucket):
                self.nodes[(r.cluster, r.node, r.start.timestamp())] = r

    def prune(self, now: float, keep_weeks: float) -> None:
        """Roll fine rows older than the cutoff into hourly rows per (GPU, hour, job): samples and observed
        seconds add up (at most the hour), metrics are observed-seconds-weighted means (CHOICE: the
        definitions do not say; time-weighted like the combination of sub-rows), fb_used_mib the maximum,
        span the hull of the sampled rows' spans ("first sample time to last sample time + interval": a row
        without samples has no sample times). An hourly row already there is folded in."""
        cutoff = int(now - keep_weeks * WEEK) // HOUR * HOUR
        self.rolled_before = max(cutoff, self.rolled_before or cutoff)
        groups: dict[tuple, list[Row]] = defaultdict(list)
        for r in list(self.rows.values()):
            if r.ts < cutoff:
                hk = (r.cluster, r.host, r.gpu, r.instance, r.ts // HOUR * HOUR, r.job)
                groups[hk].append(r)
        for hk, rows in groups.items():
            if all(r.bucket_s >= HOUR for r in rows):
                continue
            metrics: dict[str, float | None] = {}
            for m in METRIC_FIELDS:
                have = [r for r in rows if r.metrics[m] is not None and r.observed_s > 0]
                if m == "fb_used_mib":
                    have = [r for r in rows if r.metrics[m] is not None]
                    metrics[m] = max(r.metrics[m] for r in have) if have else None  # type: ignore
                    continue
                n = sum(r.observed_s for r in have)
                metrics[m] = sum(r.observed_s * r.metrics[m] for r in have) / n if n else None  # type: ignore
            sampled = [r for r in rows if r.observed_s > 0]
            span = (min(r.span[0] for r in sampled), max(r.span[1] for r in sampled)) if sampled \
                else (hk[4], hk[4] + HOUR)
            for r in rows:
                del self.rows[r.key]
            self.seen["hourly roll-up rows"] += 1
            new = Row(hk[0], hk[1], hk[2], hk[3], hk[4], hk[5], HOUR, sum(r.samples for r in rows),
                      min(float(HOUR), sum(r.observed_s for r in rows)), span, metrics)
            self.rows[new.key] = new
            self.hourly.add(hk[:5])

    # -- audit ------------------------------------------------------------------------------------
    def _by_gpu(self) -> dict[tuple, dict[float, list[Row]]]:
        out: dict[tuple, dict[float, list[Row]]] = defaultdict(lambda: defaultdict(list))
        for r in self.rows.values():
            out[(r.cluster, r.host, r.gpu, r.instance)][r.ts].append(r)
        return out

    def _node_gpus(self, cluster: str, node: str) -> int:
        inv = sum(1 for c, h, _ in self.inventory if (c, h) == (cluster, node))
        tel = sum(1 for c, h, _, i in self.tgpus if (c, h, i) == (cluster, node, ""))
        return max(inv, tel)

    def input_busy(self, a: Allocation, node: str, ts: float, w: float, th: Thresholds) -> bool | None:
        """Definitions "A starved GPU is not idle", for an SM-idle bucket [ts, ts + w) of ``a`` on ``node``:
        None when the node's host row (same start and length) does not read the input busy (storage, else
        InfiniBand, else pegged cores: input busy is storage or pegged cores); True when the job held the
        whole node then (every GPU of the node is one of its whole GPUs, no other allocation held a GPU there,
        its CPUs, where both are known, all the node's cores); False when it shared it."""
        n = self.nodes.get((a.cluster, node, ts))
        if n is None or n.seconds != w:
            return None
        mine_all = sum(1 for g in a.gpus if g.node == node)

        def ge_(x: float | None, t: float) -> bool:
            return x is not None and ge(x, t)
        storage = (n.cpu_iowait is not None and n.cpus and ge(n.cpu_iowait / n.cpus, HOST_IOWAIT_SHARE)) or \
            ge_(n.disk_busy, HOST_DISK_BUSY) or ge_(n.nfs_read_bps, HOST_FS_READ_BPS) or \
            ge_(n.lustre_read_bps, HOST_FS_READ_BPS) or ge_(n.nfs_ops, HOST_NFS_OPS)
        ib = ge((n.ib_rx_bps or 0.0) + (n.ib_tx_bps or 0.0), HOST_IB_BPS)
        pegged = n.cpu_pegged is not None and mine_all > 0 and ge(n.cpu_pegged / mine_all, HOST_PEGGED_PER_GPU)
        if not (storage or (not ib and pegged)):
            return None
        mine = sum(1 for g in a.gpus if g.node == node and g.share >= 1)
        others = any(b is not a and b.cluster == a.cluster and b.start is not None
                     and any(g.node == node for g in b.gpus) and b.start.timestamp() < ts + w
                     and (b.end is None or b.end.timestamp() > ts) for b in self.allocs.values())
        cores = a.cpus is None or n.cpus is None or a.cpus >= n.cpus - 0.5
        return mine >= self._node_gpus(a.cluster, node) and not others and cores

    def attribute(self, a: Allocation, a_s: float, a_e: float, by_gpu: dict) -> list[GpuResult]:
        """Index, UUID, whole node, labels, else unattributed (definitions "Attribution")."""
        res = [GpuResult(g.node, k, g.share, index=g.index) for g, k in slots(a)]
        gs = [g for g, _ in slots(a)]
        for r, g in zip(res, gs, strict=True):  # 1. index
            if g.index is not None:
                r.attribution = "index"
                t = (a.cluster, g.node, g.index, "")
                r.tied = t if t in self.tgpus else None
        for r, g in zip(res, gs, strict=True):  # 2. UUID (whole GPUs)
            if g.index is None and g.uuid and g.mig_profile is None and (a.cluster, g.node, g.uuid) in self.tuuid:
                idx = self.tuuid[(a.cluster, g.node, g.uuid)]
                r.attribution, r.tied, r.index = "uuid", (a.cluster, g.node, idx, ""), idx
                self.seen["attributed: uuid"] += 1
        for node in {g.node for g in gs}:  # 3. whole node
            held = [(r, g) for r, g in zip(res, gs, strict=True)
                    if g.node == node and g.index is None and g.share >= 1]
            if held and len(held) >= self._node_gpus(a.cluster, node):
                for r, _ in held:
                    if r.attribution != "unattributed":
                        continue
                    t = (a.cluster, node, r.slot, "")
                    if t in self.tgpus:
                        r.attribution, r.tied, r.index = "node", t, r.slot
                        self.seen["attributed: whole node"] += 1
        for node in {g.node for g in gs}:  # 4. labels: slot k takes the k-th GPU (by index) naming the job;
            # a MIG instance whose series name the pod is such a GPU (definitions "Attribution")
            cands = sorted(t[2:] for t in self.tgpus if t[:2] == (a.cluster, node) and any(
                overlap(ts, ts + row.bucket_s, a_s, a_e) > 0 and names(row.job, a)
                for ts, rows in by_gpu.get(t, {}).items() for row in rows))
            for r, g in zip(res, gs, strict=True):
                if g.node == node and g.index is None and r.attribution == "unattributed" and r.slot < len(cands):
                    idx, inst = cands[r.slot]
                    r.attribution, r.tied, r.index = "label", (a.cluster, node, idx, inst), idx
                    self.seen["attributed: label" + (" (MIG instance)" if inst else "")] += 1
        return res

    def judge(self, a: Allocation, r: GpuResult, a_s: float, a_e: float, th: Thresholds,
              by_gpu: dict, window: tuple[float, float] = (-math.inf, math.inf)) -> None:
        r.reserved = r.share * (a_e - a_s)
        kinds = getattr(th, "infra_kinds", ALL_KINDS)
        mine = self.events.intervals(a.cluster, r.node, r.index, kinds, *window)  # the allocated GPU's
        tied = self.events.intervals(*r.tied[:3], kinds, *window) if r.tied else []  # its telemetry GPU's
        r.infra = r.share * union_length(mine, a_s, a_e)
        if r.infra > 0:
            self.seen["infrastructure-affected time"] += 1
        covered: list[tuple[float, float]] = []
        unobserved = 0.0
        for ts, sub in sorted(by_gpu.get(r.tied, {}).items()) if r.tied else []:
            w = sub[0].bucket_s
            ov = overlap(ts, ts + w, a_s, a_e)
            if ov <= 0:
                continue
            labelled = any(x.job for x in sub)
            apply = [x for x in sub if names(x.job, a)] if labelled else [x for x in sub if not x.job]
            if not apply:
                continue
            if touches(tied, max(ts, a_s), min(ts + w, a_e)):  # its reserved part infrastructure-affected:
                # judged by no verdict
                self.seen["bucket skipped: infrastructure event"] += 1
                continue
            row = combine(apply)
            self.seen["bucket judged"] += 1
            if labelled and len(apply) < len(sub):
                self.seen["sub-rows of other jobs/unlabelled left out"] += 1
            if len(apply) > 1:
                self.seen["several sub-rows combined"] += 1
            if w != 300:
                self.seen["hourly bucket judged"] += 1
                if ts + 300 <= a_s:
                    self.seen["hourly bucket starting > 5 min before the reservation"] += 1
            covered.append((ts, ts + w))
            inside = overlap(row.span[0], row.span[1], a_s, a_e)
            if row.observed_s <= 0:
                obs = 0.0
            elif labelled:  # the job's own samples: as many as fit in the reserved part of the span
                obs = min(inside, row.observed_s)
            else:  # unlabelled: maybe a free GPU's samples before or after the job; count only those that
                # cannot all lie in the span's part outside the reservation (definitions: clipped edges)
                outside = (row.span[1] - row.span[0]) - inside
                obs = min(inside, max(0.0, row.observed_s - outside))
            unobserved += ov - obs
            if 0 < obs < ov:
                self.seen["partially observed bucket"] += 1
            if obs <= 0:
                continue
            v = verdict(row.metrics, th)
            self.seen[f"verdict {v}"] += 1
            io, measured = links(apply)
            c = wait_class(v, row.metrics, io, measured, th)
            self.seen[f"waiting class {c}"] += 1
            if c in r.wait:
                r.wait[c] += r.share * obs
            sm, util = row.metrics["sm_active"], row.metrics["gpu_util"]
            busy = sm is not None and (ge(sm, th.working_sm) or (io is not None and ge(io, STRAGGLER_LINK_BPS)))
            if busy:
                r.lead += r.share * obs
            if sm is not None and not busy and lt(sm, STRAGGLER_PEER_SM) and ge(sm, th.idle_sm):
                r.waits += r.share * obs
            if sm is not None and lt(sm, STRAGGLER_PEER_SM):
                r.waitable += r.share * obs
            hour = r.hours.setdefault(int(ts // HOUR), [0.0, 0.0, 0.0, 0.0])
            if sm is not None:
                hour[0] += r.share * obs * sm
                hour[1] += r.share * obs
            if util is not None:
                hour[2] += r.share * obs * util
                hour[3] += r.share * obs
            if any(row.metrics[m] is not None and 0 < abs(row.metrics[m] - t) < 1e-6 for m, t in (  # type: ignore
                    ("sm_active", th.idle_sm), ("sm_active", th.working_sm), ("gpu_util", th.idle_util),
                    ("gpu_util", th.mirage_gpu_util), ("dram_active", th.idle_dram))):
                self.seen["value a rounding step off a threshold"] += 1
            r.observed += r.share * obs
            own = self.input_busy(a, r.node, ts, w, th) if v == "idle" else None
            if own:  # definitions "A starved GPU is not idle": input/storage wait
                self.seen["idle bucket its own input starved: input wait"] += 1
                r.input_wait += r.share * obs
            else:
                if own is False:  # the host activity could be another job's: still idle
                    self.seen["idle bucket, shared node's host busy: still idle"] += 1
                    r.host_busy += r.share * obs
                r.cls[v] += r.share * obs
            if v == "mirage":
                r.mirage_raw += obs
                m = row.metrics
                r.mirage_util += r.share * obs * (m["gpu_util"] or 0.0)
                if m["power_w"] is not None:
                    r.mirage_power += r.share * obs * m["power_w"]
                    r.mirage_power_obs += r.share * obs
            if v in IDLE_VERDICTS and row.metrics["fb_used_mib"] is not None:
                r.held = max(r.held if r.held is not None else -math.inf, row.metrics["fb_used_mib"])
            if row.metrics["sm_active"] is not None:
                r.effective += r.share * obs * row.metrics["sm_active"]
        untouched = (a_e - a_s) - union_length(covered + mine, a_s, a_e)
        r.unknown = r.share * (unobserved + untouched)
        parts = sum(r.cls.values()) + r.input_wait + r.unknown + r.infra
        assert math.isclose(parts, r.reserved, rel_tol=1e-9, abs_tol=1e-6), \
            f"oracle identity broken (overlapping buckets?): {parts} != {r.reserved}"

    def audit(self, th: Thresholds, prices: PriceCard, since: float, until: float, now: float,
              min_finding_gpu_hours: float = 0.1) -> dict[tuple, AllocResult]:
        horizon = min(until, now)
        by_gpu = self._by_gpu()
        out: dict[tuple, AllocResult] = {}
        for key, a in self.allocs.items():
            start, end = epoch(a.start), epoch(a.end)
            if start is None or not a.gpus:
                continue
            a_s, a_e = max(start, since), min(horizon if end is None else end, horizon)
            if a_e <= a_s:
                continue
            gpus = self.attribute(a, a_s, a_e, by_gpu)
            for r in gpus:
                self.judge(a, r, a_s, a_e, th, by_gpu, (since, horizon))
            tot = {k: sum(g.sums()[k] for g in gpus) for k in gpus[0].sums()}
            p = price(prices, a)
            kinds, near = findings(tot, gpus, th, min_finding_gpu_hours)
            out[key] = AllocResult(key, a, gpus, tot, p, tot["reserved"] / HOUR * p,
                                   (tot["idle"] + tot["mirage"]) / HOUR * p, kinds, near, sparkline(gpus, a_s, a_e))
        return out
