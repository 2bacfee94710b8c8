"""Hypothesis fleets for the differential test (tests/test_oracle.py): allocations placed on physical GPUs,
telemetry those GPUs would emit, the operations a store sees (ingest batches, re-ingest, a second source,
``db prune``), and an audit window.

Features the code may not implement yet are switched on by markers in the code (``FEATURES`` below) or by
``GPU_AUDIT_ORACLE_FEATURES`` (``all``, or ``+name``/``-name`` items). With a feature off the generator only
makes fleets on which the old and the new semantics agree, so the oracle (always the definitions) can be
compared with the code today.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import math
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import strategies as st
from oracle_samples import Sample

from auditor.config import Thresholds
from auditor.records import AllocatedGpu, Allocation, GpuBucket, GpuInventory, NodeBucket

T0 = int(datetime(2026, 11, 2, tzinfo=UTC).timestamp())
HOURS = 4
B = 300
NB = HOURS * 3600 // B
END = T0 + HOURS * 3600

ALL_FEATURES = {
    "partial": "observed_s and spans on buckets (partial buckets, samples after release)",
    "busy_unverified": "the busy_unverified class (GPU-Util-only busy, no utilisation field)",
    "boundary": "values a rounding step below a threshold (5 % GPU-Util as 0.049999...)",
    "subrows": "one sub-row per job label (consecutive jobs in one bucket, extra unlabelled source)",
    "exact_labels": "look-alike labels (12314 next to array job 123_4)",
    "merge": "two telemetry sources for one GPU with different fields",
    "rollup": "db prune roll-ups to hourly buckets before the audit",
    "min_finding": "findings below min_finding_gpu_hours are not listed",
    "id_reuse": "a job id reused by a later job",
    "backfill": "telemetry re-collected after a prune for hours already rolled up (dropped, never counted twice)",
    "rollup_unsampled": "rows without samples in an hour that is rolled up (the hourly span must not cover them)",
    "infra": "node events (GPU faults, drained/NotReady nodes) that make reserved time infrastructure-affected",
    "cadence": "raw samples at misaligned cadences (57 s, 15 s, 30 s with dropped scrapes, 60 s with jitter) "
               "made into bucket rows by the scrape connector (coverage carried across bucket edges)",
    "starved": "node host rows (disk busy, I/O wait, pegged cores, InfiniBand; some buckets without one) and jobs "
               "with CPU counts: an SM-idle GPU its own job's input starved (whole node) or a shared node's "
               "busy host",
    "stock": "a stock GPU Operator fleet: GPUs with the GR engine, Tensor, DRAM and GPU-Util but no SM activity, "
             "and Kubernetes pods on MIG slices whose instance series carry the pod (no GPU-Util on MIG), judged "
             "per instance on the evidence tiers",
    "waiting": "high DRAM activity and PCIe/NVLink counters (the classes of where the waiting goes: memory-bound, "
               "communication wait, host/input wait; a saturated link, a straggler candidate)",
}


def detect() -> frozenset[str]:
    """Features the code has, by markers; the environment can add (+x), remove (-x) or force ``all``."""
    from auditor.store import schema

    bucket_fields = {f.name for f in dataclasses.fields(GpuBucket)}
    on: set[str] = set()
    if "observed_s" in bucket_fields:
        on.add("partial")
    if "busy_unverified_s" in schema.usage_gpu.c:
        on |= {"busy_unverified", "boundary"}
    if "job" in bucket_fields or "job" in schema.gpu_buckets.c:
        on |= {"subrows", "exact_labels"}
    if "observed_s" in schema.gpu_buckets.c:
        on |= {"merge", "rollup", "rollup_unsampled"}
    if hasattr(importlib.import_module("auditor.store.meta") if importlib.util.find_spec("auditor.store.meta") else None,  # noqa: E501 (module path)
               "rolled_up_before"):
        on.add("backfill")
    if "min_finding_gpu_hours" in Thresholds.model_fields:
        on.add("min_finding")
    if "node_events" in schema.metadata.tables:
        on.add("infra")
    if "memory_s" in schema.usage_gpu.c:
        on.add("waiting")
    if "input_wait_s" in schema.usage_gpu.c:
        on.add("starved")
    if "engine_spin_s" in schema.usage_gpu.c:
        on.add("stock")
    if hasattr(importlib.import_module("connectors._coverage"), "covers"):
        on.add("cadence")
    uniq = [c for c in schema.allocations.constraints if c.__class__.__name__ == "UniqueConstraint"]
    if any({"start_ts", "submit_ts", "instance_ts"} & {col.name for col in c.columns} for c in uniq):
        on.add("id_reuse")
    for item in filter(None, (x.strip() for x in os.environ.get("GPU_AUDIT_ORACLE_FEATURES", "").split(","))):
        if item == "all":
            on |= set(ALL_FEATURES)
        elif item.lstrip("+-") in ALL_FEATURES:
            (on.discard if item.startswith("-") else on.add)(item.lstrip("+-"))
        else:
            raise ValueError(f"GPU_AUDIT_ORACLE_FEATURES: unknown feature {item!r}")
    return frozenset(on)


def dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


@dataclass
class Job:
    alloc: Allocation
    place: list[tuple[str, int]]  # physical GPUs it really runs on
    profile: dict[str, float | None]
    shared: bool
    start: int
    end: int  # occupancy end (fleet end while running)
    instance: str = ""  # the MIG instance it runs on ("" = the whole GPU)

    @property
    def key(self) -> str:
        a = self.alloc
        return a.external_id if a.source == "slurm" else f"{a.account}/{a.name}"


class Fleet:
    """What the store sees (``ops``: ("ingest", records) | ("prune", now, keep_weeks)) and the audit window.
    A plain class, so hypothesis prints a falsifying fleet with the short :meth:`__repr__`."""

    def __init__(self, ops: list[tuple[Any, ...]], th: Thresholds, since: int, until: int, now: int,
                 features: frozenset[str]) -> None:
        self.ops, self.th, self.since, self.until, self.now, self.features = ops, th, since, until, now, features

    def __repr__(self) -> str:
        lines = [f"Fleet(since=T0{self.since - T0:+d}s until=T0{self.until - T0:+d}s now=T0{self.now - T0:+d}s "
                 f"th={ {k: v for k, v in self.th.model_dump().items() if v != Thresholds().model_dump()[k]} })"]
        for op in self.ops:
            if op[0] == "prune":
                lines.append(f"  prune(now=T0{op[1] - T0:+d}s, keep_weeks={op[2]})")
                continue
            lines.append(f"  ingest {len(op[1])} records:")
            raw: dict[tuple[str, str, int], list[Sample]] = {}
            for r in op[1]:
                if isinstance(r, Sample):
                    raw.setdefault((r.cluster, r.host, r.gpu), []).append(r)
                else:
                    lines.append("    " + short(r))
            for (c, h, g), ss in raw.items():
                ts = sorted(x.ts for x in ss)
                lines.append(f"    {len(ss)} samples of {c}/{h}:{g} T0{ts[0] - T0:+.3f}..T0{ts[-1] - T0:+.3f} "
                             f"first gaps {[round(b - a, 3) for a, b in zip(ts, ts[1:8], strict=False)]}")
        return "\n".join(lines)


def short(r: Any) -> str:
    if isinstance(r, Allocation):
        end = "running" if r.end is None else f"T0{int(r.end.timestamp()) - T0:+d}"
        gs = ", ".join(f"{g.node}:{g.index}x{g.share:.3g}{'/' + g.mig_profile if g.mig_profile else ''}"
                       for g in r.gpus)
        return (f"Allocation {r.cluster}/{r.source} {r.external_id} {r.account}/{r.name} "
                f"[T0{int(r.start.timestamp()) - T0:+d}, {end}) [{gs}] model={r.gpus[0].model}")
    if isinstance(r, GpuBucket):
        m = {k: getattr(r, k) for k in ("sm_active", "dram_active", "tensor_active", "gpu_util", "gr_engine",
                                         "power_w") if getattr(r, k) is not None}
        extra = {k: getattr(r, k, None) for k in ("observed_s", "span_start", "span_end", "job", "hpc_job",
                                                   "pod") if getattr(r, k, None) is not None}
        for k in ("span_start", "span_end"):
            if k in extra and isinstance(extra[k], datetime):
                extra[k] = f"T0{int(extra[k].timestamp()) - T0:+d}"
        return (f"Bucket {r.cluster}/{r.host}:{r.gpu}{r.gpu_instance and '/' + r.gpu_instance} "
                f"T0{int(r.start.timestamp()) - T0:+d}"
                f" w={r.seconds} n={r.samples} {m} {extra}")
    return repr(r)


def make_bucket(host: str, gpu: int, ts: int, *, samples: int, metrics: dict[str, Any], jobs: list[Job],
                observed_s: float | None = None, span: tuple[int, int] | None = None,
                instance: str = "", width: int = B, label: str | None = None, cluster: str = "c") -> GpuBucket:
    """A GpuBucket with the fields this version of the record type has (job, observed_s, span). ``jobs``
    label it (Slurm ids comma-joined, or one pod); ``label`` is a raw hpc_job value instead."""
    names = {f.name: f for f in dataclasses.fields(GpuBucket)}
    kw: dict[str, Any] = {k: v for k, v in metrics.items() if v is not None}
    if jobs or label:
        key = label or ",".join(j.key for j in jobs)
        if label or all(j.alloc.source == "slurm" for j in jobs):
            kw["hpc_job"] = key
        else:
            kw["pod"], kw["namespace"] = jobs[0].alloc.name, jobs[0].alloc.account
        if "job" in names:
            kw["job"] = key
    if observed_s is not None and "observed_s" in names:
        kw["observed_s"] = observed_s
    if span is not None and "span_start" in names:
        as_dt = "datetime" in str(names["span_start"].type)
        kw["span_start"], kw["span_end"] = (dt(span[0]), dt(span[1])) if as_dt else span
    return GpuBucket(cluster, host, gpu, dt(ts), width, samples, gpu_instance=instance, **kw)


SM = [None, 0.0, 0.03, 0.05, 0.2, 0.5, 0.9]
DRAM = [None, 0.0, 0.04, 0.3]
TENSOR = [None, 0.0, 0.005, 0.2]
UTIL = [None, 0.0, 0.03, 0.05, 0.6, 1.0]
GR = [None, 0.0, 0.7]
#: the stock counters (no SM activity): values at and around the tier's thresholds (idle_gr_engine 0.05,
#: idle_tensor 0.01, idle_dram 0.05)
STOCK_GR = [0.0, 0.03, 0.05, 0.7]
STOCK_TENSOR = [None, 0.0, 0.005, 0.01, 0.2]
STOCK_DRAM = [None, 0.0, 0.04, 0.05, 0.3]
POWER = [None, 60.0, 250.0]
LINK_BPS = [None, 0.0, 2e9, 3e10]  # hint_io_bps 1e9, straggler_link_bps 2e10
PROFILING = ("sm_active", "dram_active", "tensor_active", "gr_engine")


@st.composite
def profiles(draw: st.DrawFn, features: frozenset[str]) -> dict[str, float | None]:
    if "stock" in features and draw(st.integers(0, 3)) == 0:
        return stock_profile(draw)
    if draw(st.integers(0, 2)) == 0:  # an idle job (mirage when GPU-Util or GR engine read busy)
        return {"sm_active": draw(st.sampled_from([0.0, 0.03, None])),
                "dram_active": draw(st.sampled_from([None, 0.0])),
                "tensor_active": None, "gpu_util": draw(st.sampled_from([None, 0.0, 0.95])),
                "gr_engine": draw(st.sampled_from([None, 0.7])), "power_w": draw(st.sampled_from([60.0, None])),
                "fb_used_mib": draw(st.sampled_from([1024.0, 0.0]))}  # hung_collective, ghost_busy
    p = {"sm_active": draw(st.sampled_from(SM)), "dram_active": draw(st.sampled_from(DRAM)),
         "tensor_active": draw(st.sampled_from(TENSOR)), "gpu_util": draw(st.sampled_from(UTIL)),
         "gr_engine": draw(st.sampled_from(GR)), "power_w": draw(st.sampled_from(POWER)),
         "fb_used_mib": draw(st.sampled_from([None, 2048.0]))}
    if "waiting" in features and draw(st.booleans()):  # memory-bound, links read (quiet, busy or saturated)
        p["dram_active"] = draw(st.sampled_from([p["dram_active"], 0.5]))
        for k in ("pcie_tx_bps", "nvlink_rx_bps"):
            p[k] = draw(st.sampled_from(LINK_BPS))
    if "boundary" in features and draw(st.booleans()):
        k = draw(st.sampled_from(["sm_active", "gpu_util", "dram_active"]))
        if p[k] is not None:
            p[k] = math.nextafter(p[k], 0.0) if p[k] > 0 else p[k]
    return p


def stock_profile(draw: st.DrawFn, mig: bool = False) -> dict[str, float | None]:
    """What the GPU Operator's dcgm-exporter reports by default: GR engine, Tensor, DRAM, GPU-Util (none on a
    MIG instance), no SM activity."""
    return {"sm_active": None, "gr_engine": draw(st.sampled_from(STOCK_GR)),
            "tensor_active": draw(st.sampled_from(STOCK_TENSOR)), "dram_active": draw(st.sampled_from(STOCK_DRAM)),
            "gpu_util": None if mig else draw(st.sampled_from([None, 0.0, 0.6])),
            "power_w": None if mig else draw(st.sampled_from(POWER)),
            "fb_used_mib": draw(st.sampled_from([None, 512.0]))}


def compat(p: dict[str, Any], th: Thresholds, features: frozenset[str]) -> dict[str, Any]:
    """Without busy_unverified the code of today has no class for a sampled bucket without SM activity
    that the fallback cannot call idle: give such profiles an SM reading."""
    if "busy_unverified" in features or p.get("sm_active") is not None:
        return p
    u, pw = p.get("gpu_util"), p.get("power_w")
    if th.util_fallback and u is not None and u < th.idle_util and (th.idle_power_w is None or (
            pw is not None and pw < th.idle_power_w)):
        return p
    return {**p, "sm_active": 0.0}


@st.composite
def thresholds(draw: st.DrawFn, features: frozenset[str]) -> Thresholds:
    kw: dict[str, Any] = {}
    if draw(st.booleans()):
        kw = {"util_fallback": draw(st.sampled_from([True, True, False])),
              "idle_power_w": draw(st.sampled_from([None, 100.0])),
              "idle_allocation_min_gpu_hours": draw(st.sampled_from([1.0, 0.2, 0.0])),
              "mirage_min_minutes": draw(st.sampled_from([30, 10])),
              "unmonitored_coverage": draw(st.sampled_from([0.5, 0.3])),
              "idle_allocation_fraction": draw(st.sampled_from([0.8, 0.6])),
              "idle_gpus_fraction": draw(st.sampled_from([0.8, 0.6])),
              "idle_sm": draw(st.sampled_from([0.05, 0.1])), "working_sm": draw(st.sampled_from([0.5, 0.3]))}
    if "min_finding" in features and "min_finding_gpu_hours" in Thresholds.model_fields:
        kw["min_finding_gpu_hours"] = draw(st.sampled_from([0.1, 0.1, 0.0, 0.5]))
    if "infra" in features and draw(st.integers(0, 3)) == 0:  # a kind left out is judged as usual
        kw["infra_kinds"] = draw(st.sampled_from([["drain", "not_ready"], ["xid"], []]))
    return Thresholds(**kw)


def node_events(draw: st.DrawFn, nodes: list[dict[str, Any]]) -> list[Any]:
    """0-3 node events at any second (not on bucket boundaries): a GPU's XID, a drained node, a NotReady node
    still ongoing (a stale ongoing sighting of an ended one is ingested later, see fleets)."""
    from auditor.records import NodeEvent

    out: list[Any] = []
    for _ in range(draw(st.integers(0, 3))):
        nd = draw(st.sampled_from(nodes))
        kind = draw(st.sampled_from(["xid", "drain", "not_ready"]))
        start = T0 + draw(st.integers(-3600, HOURS * 3600))
        end = None if kind == "not_ready" and draw(st.booleans()) else start + draw(st.integers(1, 7200))
        gpu = draw(st.integers(0, nd["gpus"])) if kind == "xid" else None  # gpu == gpus: a GPU no job holds
        out.append(NodeEvent(nd["cluster"], nd["name"], kind, dt(start), None if end is None else dt(end), gpu,
                             f"{kind} on {nd['name']}"))
    return out


MODELS = [None, "NVIDIA-H100-80GB-HBM3", "a100", "L40S"]


@st.composite
def jobs(draw: st.DrawFn, nodes: list[dict[str, Any]], features: frozenset[str]) -> list[Job]:
    """Allocations placed on physical GPUs, never two exclusive ones on one GPU at one time."""
    out: list[Job] = []
    busy: dict[tuple[str, int], list[tuple[int, int, bool]]] = {}
    for i in range(draw(st.integers(2, 8))):
        kind = draw(st.sampled_from(["index", "index", "shared", "count", "count", "whole", "multi"]
                                    + (["mig"] if "stock" in features else [])))
        if kind == "mig":  # a pod on a MIG slice of a stock fleet (its own instance series, labelled with it)
            mig_job = mig_slice(draw, nodes, i, out)
            if mig_job is not None:
                out.append(mig_job)
            continue
        node = nodes[0] if kind == "shared" else draw(st.sampled_from(nodes))  # shared GPUs meet more often
        n = node["gpus"]
        start = T0 + draw(st.integers(-1800, HOURS * 3600 - 300))
        dur = draw(st.integers(120, 3 * 3600))
        running = draw(st.integers(0, 6)) == 0
        end = END + 600 if running else start + dur
        source = "kubernetes" if kind in ("index", "count", "shared") and draw(st.integers(0, 3)) == 0 else "slurm"
        base = str(1000 + i)
        ext = draw(st.sampled_from([base, base, f"{base}_{i + 3}", f"{base}+1"])) if source == "slurm" \
            else f"uid-{i}"
        if "id_reuse" in features and out and source == "slurm" and draw(st.integers(0, 3)) == 0:
            ext = out[0].alloc.external_id if out[0].alloc.source == "slurm" else ext
        model = draw(st.sampled_from(MODELS))
        share, mig, shared = 1.0, None, False
        if kind == "shared":
            share, mig = draw(st.sampled_from([(0.5, None), (1 / 7, "1g.10gb"), (2 / 7, "2g.20gb")]))
            shared = True
            prev = [j for j in out if j.shared]
            if prev and draw(st.booleans()):  # time-sliced with the previous one: overlapping on one GPU
                start = prev[-1].start + draw(st.integers(0, max(0, min(prev[-1].end, END) - prev[-1].start - 60)))
                end = END + 600 if running else start + dur
        if kind in ("index", "shared"):
            k = 1 if kind == "shared" else draw(st.integers(1, n))
            idx = [0] if kind == "shared" else sorted(draw(st.permutations(range(n)))[:k])
            place = [(node["cluster"], node["name"], x) for x in idx]
            gpus = [AllocatedGpu(node["name"], x, model=model, share=share, mig_profile=mig) for x in idx]
        elif kind == "multi":
            other = draw(st.sampled_from([nd for nd in nodes if nd["cluster"] == node["cluster"]]))
            place = [(node["cluster"], node["name"], 0)] + (
                [(other["cluster"], other["name"], 0)] if other is not node else [])
            gpus = [AllocatedGpu(h, x, model=model) for _, h, x in place]
        else:
            k = n if kind == "whole" else draw(st.integers(1, max(1, n - 1)))
            place = [(node["cluster"], node["name"], x) for x in sorted(draw(st.permutations(range(n)))[:k])]
            gpus = [AllocatedGpu(node["name"], None, model=model) for _ in place]
        clash = [e for p in place for s, e, sh in busy.get(p, []) if s < end and start < e and not (shared and sh)]
        if clash:  # start after the jobs in the way instead (once)
            start = max(clash) + draw(st.integers(0, 900))
            end = END + 600 if running else start + dur
            if start >= END or any(s < end and start < e and not (shared and sh) for p in place
                                   for s, e, sh in busy.get(p, [])):
                continue
        for p in place:
            busy.setdefault(p, []).append((start, end, shared))
        if node["cluster"] == "d" and out and out[-1].alloc.cluster == "c" and out[-1].alloc.source == source:
            ext = out[-1].alloc.external_id  # the same job id in another cluster: a different job
        a = Allocation(node["cluster"], source, ext, name=f"job{i}", user=f"u{i % 3}", account=f"acct{i % 2}",
                       start=dt(start), end=None if running else dt(end), gpus=gpus)
        out.append(Job(a, place, draw(profiles(features)), shared, start, end))
    return out


def mig_slice(draw: st.DrawFn, nodes: list[dict[str, Any]], i: int, out: list[Job]) -> Job | None:
    """A Kubernetes pod holding one 1g.10gb slice (count-only, share 1/7) on its own MIG instance of a node's
    GPU; its instance reports the stock counters without GPU-Util. One pod per instance at a time."""
    node = draw(st.sampled_from(nodes))
    x = draw(st.integers(0, node["gpus"] - 1))
    inst = str(draw(st.integers(7, 9)))
    start = T0 + draw(st.integers(-1800, HOURS * 3600 - 300))
    end = start + draw(st.integers(600, 3 * 3600))
    if any(j.instance == inst and (node["cluster"], node["name"], x) in j.place and j.start < end
           and start < j.end for j in out):
        return None
    a = Allocation(node["cluster"], "kubernetes", f"uid-{i}", name=f"job{i}", user=f"u{i % 3}",
                   account=f"acct{i % 2}", start=dt(start), end=dt(end),
                   gpus=[AllocatedGpu(node["name"], None, model="a100", share=1 / 7, mig_profile="1g.10gb")])
    return Job(a, [(node["cluster"], node["name"], x)], stock_profile(draw, mig=True), True, start, end, inst)


@st.composite
def fleets(draw: st.DrawFn, features: frozenset[str]) -> Fleet:
    th = draw(thresholds(features))
    nodes = []
    for k in range(draw(st.integers(1, 3))):
        # a second cluster "d" whose node and job names repeat cluster c's: nothing may cross clusters
        cl = "d" if k and draw(st.integers(0, 2)) == 0 else "c"
        nodes.append({"cluster": cl, "name": f"n{k}" if cl == "c" else f"n{k - 1}", "gpus": draw(st.integers(1, 4)),
                      "labels": draw(st.booleans()), "interval": draw(st.sampled_from([15, 30, 60])),
                      "inventory": draw(st.booleans())})
    js = draw(jobs(nodes, features))
    if "starved" in features:
        for j in js:  # the scheduler's CPU count (Slurm AllocTRES cpu), or none said
            j.alloc.cpus = draw(st.sampled_from([None, None, 8, 64]))
    records: list[Any] = [j.alloc for j in js]
    events = node_events(draw, nodes) if "infra" in features else []
    records += [GpuInventory(nd["cluster"], nd["name"], g) for nd in nodes if nd["inventory"]
                for g in range(nd["gpus"])]
    second: list[Any] = []  # a second telemetry source (other fields, other interval)
    for nd in nodes:
        for g in range(nd["gpus"]):
            if draw(st.integers(0, 9)) == 0:
                continue  # this GPU's exporter never reported
            rows, extra = gpu_rows(draw, nd, g, js, th, features)
            records += rows
            second += extra
    allocs = [r for r in records if isinstance(r, Allocation)]
    tele = [r for r in records if not isinstance(r, Allocation)]
    running = [a for a in allocs if a.end is None]
    cutoff = T0 + 3600 * draw(st.integers(1, HOURS - 1)) if "rollup" in features and draw(st.booleans()) else None
    if "starved" in features and cutoff is None:  # CHOICE: host rows only in fleets not rolled up (the oracle
        # does not roll node rows up)
        tele += host_rows(draw, nodes)

    def old(rs: list[Any]) -> list[Any]:
        return [r for r in rs if cutoff is None or not isinstance(r, GpuBucket) or (
            r.start.timestamp() < cutoff and (r.samples > 0 or "rollup_unsampled" in features))]

    def new(rs: list[Any]) -> list[Any]:
        return [r for r in rs if cutoff is not None and isinstance(r, GpuBucket) and r.start.timestamp() >= cutoff]

    # the second source before or after the first (ties keep the stored row); never a backfill after a prune
    first = [("ingest", allocs + old(tele) + events)]
    first.insert(draw(st.integers(0, 1)), ("ingest", old(second)))
    ops: list[tuple[Any, ...]] = first
    if cutoff is not None:
        ops.append(("prune", cutoff + 1800, 0.0))
        later = [("ingest", new(tele))]
        later.insert(draw(st.integers(0, 1)), ("ingest", new(second)))
        ops += later
        if "backfill" in features and draw(st.integers(0, 2)) == 0:  # an overlapping re-collection
            back = [r for r in old(tele) if isinstance(r, GpuBucket)]
            ops.insert(len(ops) - draw(st.integers(0, 2)), ("ingest", back[draw(st.integers(0, len(back))):]))
    if draw(st.integers(0, 3)) == 0:  # re-collection: the same rows again change nothing
        again = [r for r in tele if isinstance(r, GpuBucket)]
        again = new(again) if cutoff is not None else again
        ops.append(("ingest", again[: draw(st.integers(0, len(again)))]))
    ended = [e for e in events if e.end is not None]
    if ended and draw(st.booleans()):  # a stale "still ongoing" sighting of an ended event: the end stays
        ops.append(("ingest", [dataclasses.replace(ended[0], end=None)]))
    if running and draw(st.booleans()):  # later sighting: it has ended
        ops.append(("ingest", [dataclasses.replace(a, end=dt(END + 600)) for a in running]))
    if cutoff is not None and cutoff + 3600 < END and draw(st.integers(0, 2)) == 0:
        ops.append(("prune", cutoff + 3600 + 1800, 0.0))  # a second prune rolls the next hour too
    ops = [op for op in ops if op[0] != "ingest" or op[1]]
    since = T0 + draw(st.integers(-3600, 2 * 3600))
    until = since + draw(st.integers(1800, 6 * 3600))
    now = END + 86400 if draw(st.booleans()) else since + draw(st.integers(600, until - since))
    return Fleet(ops, th, since, until, now, features)


def host_rows(draw: st.DrawFn, nodes: list[dict[str, Any]]) -> list[NodeBucket]:
    """Some nodes' host rows (node_exporter), 5-minute buckets, some missing: each bucket quiet or one cause
    busy (disk, I/O wait, pegged cores, InfiniBand, or InfiniBand with pegged cores), cores sometimes unknown."""
    out: list[NodeBucket] = []
    for nd in nodes:
        if not draw(st.booleans()):
            continue
        cpus = draw(st.sampled_from([None, 8.0, 64.0]))
        for b in range(NB):
            if draw(st.integers(0, 5)) == 0:
                continue
            cause = draw(st.sampled_from(["quiet", "quiet", "disk", "iowait", "pegged", "ib", "ib_pegged"]))
            f: dict[str, float | None] = {"cpus": cpus, "disk_busy": 0.9 if cause == "disk" else 0.1}
            if cpus is not None:
                f["cpu_iowait"] = cpus / 2 if cause == "iowait" else 0.0
            f["cpu_pegged"] = 4.0 if cause in ("pegged", "ib_pegged") else 0.0
            f["ib_rx_bps"] = 2e9 if cause in ("ib", "ib_pegged") else 0.0
            out.append(NodeBucket(nd["cluster"], nd["name"], dt(T0 + b * B), B, 10, float(B), **f))
    return out


def gpu_rows(draw: st.DrawFn, nd: dict[str, Any], g: int, js: list[Job], th: Thresholds,
             features: frozenset[str]) -> tuple[list[GpuBucket], list[GpuBucket]]:
    """The buckets one GPU's exporter(s) would emit: segments of ok / gap / no-sample / partial buckets; or
    (feature ``cadence``) its raw samples, made into rows by the connector (code) and the definitions (oracle)."""
    if "cadence" in features and draw(st.integers(0, 2)) == 0:
        return gpu_samples(draw, nd, g, js, th, features), []
    host, iv = nd["name"], nd["interval"]
    mk = functools.partial(make_bucket, cluster=nd["cluster"])
    segs: list[tuple[str, dict[str, Any] | None]] = []
    for _ in range(draw(st.integers(1, 4))):
        mode = draw(st.sampled_from(["ok"] * 6 + ["gap", "zero", "partial", "partial"]))
        own = draw(profiles(features)) if draw(st.booleans()) else None
        segs += [(mode, own)] * draw(st.integers(1, NB))
    segs = (segs * (NB // len(segs) + 1))[:NB]
    split = "merge" in features and draw(st.integers(0, 3)) == 0
    mig = draw(st.integers(0, 5)) == 0
    rows: list[GpuBucket] = []
    extra: list[GpuBucket] = []
    for b, (mode, own) in enumerate(segs):
        ts = T0 + b * B
        occ = [j for j in js if (nd["cluster"], host, g) in j.place and j.start < ts + B and ts < j.end
               and not j.instance]
        for j in (j for j in js if j.instance and (nd["cluster"], host, g) in j.place and j.start < ts + B
                  and ts < j.end and mode != "gap"):  # its MIG instance's series, labelled with the pod
            n = B // iv if mode != "zero" else 0
            rows.append(mk(host, g, ts, samples=n, metrics=j.profile, jobs=[j], instance=j.instance))
        if mode == "gap":
            continue
        if mode == "zero":
            p = own or (occ[-1].profile if occ else {})
            rows.append(mk(host, g, ts, samples=0, metrics=p if draw(st.booleans()) else {}, jobs=[]))
            continue
        partial = mode == "partial" and "partial" in features
        sub: list[tuple[list[Job], dict[str, Any], tuple[int, int] | None, str | None]] = []
        if not nd["labels"] or not occ:
            sub.append(([], own or (occ[-1].profile if occ else {"sm_active": 0.0}), None, None))
        elif "subrows" in features:
            slurm = [j for j in occ if j.alloc.source == "slurm"]
            if len(slurm) >= 2 and draw(st.booleans()):  # time-sliced: the exporter lists both jobs
                sub.append((slurm, own or slurm[-1].profile, None, None))
                # ... and sometimes one of them also on its own replica series: two sub-rows apply to it
                occ = [j for j in occ if j not in slurm] + ([slurm[0]] if draw(st.booleans()) else [])
            for j in occ:
                sp = (max(ts, j.start), min(ts + B, j.end)) if draw(st.integers(0, 3)) else None
                sub.append(([j], own if own and draw(st.booleans()) else j.profile, sp, None))
            if draw(st.integers(0, 5)) == 0:  # a second, unlabelled source: ignored where jobs are labelled
                sub.append(([], own or {"sm_active": 0.9}, None, None))
            looks = sorted({j.key for j in js if "_" in j.key})
            if "exact_labels" in features and looks and draw(st.integers(0, 2)) == 0:
                fake = draw(st.sampled_from(looks)).replace("_", "1")  # 1003_6 -> 100316 (a SQL LIKE match)
                sub.append(([], {"sm_active": 0.95}, None, fake))
        elif len(occ) >= 2 and any(j.alloc.source != "slurm" for j in occ):
            sub.append(([], own or occ[-1].profile, None, None))
        else:
            sub.append((occ, own or occ[-1].profile, None, None))
        for jobs_, p, sp, label in sub:
            p = compat(p, th, features)
            obs: float | None = None
            if partial or (sp is not None and "partial" in features):
                if sp is None:
                    a = draw(st.integers(0, B - iv))
                    sp = (ts + a, ts + draw(st.integers(a + iv, B)))
                n = max(1, min(B // iv, draw(st.integers(1, max(1, (sp[1] - sp[0]) // iv)))))
                obs = float(n * iv)
            else:
                sp, n = None, B // iv
            if split:
                prof = {k: v for k, v in p.items() if k in PROFILING}
                rest = {k: v for k, v in p.items() if k not in PROFILING}
                if draw(st.booleans()):
                    rest["sm_active"] = draw(st.sampled_from(SM))  # the other source also says something
                rows.append(mk(host, g, ts, samples=n, metrics=prof, jobs=jobs_, observed_s=obs, span=sp,
                                        label=label))
                iv2 = draw(st.sampled_from([10, 30, 60]))
                n2 = max(1, int((obs or B) // iv2))
                extra.append(mk(host, g, ts, samples=n2, metrics=compat(rest, th, features), jobs=jobs_,
                                         observed_s=None if obs is None else float(min(B, n2 * iv2)), span=sp,
                                         label=label))
            else:
                rows.append(mk(host, g, ts, samples=n, metrics=p, jobs=jobs_, observed_s=obs, span=sp,
                                        label=label))
        if mig:  # MIG instance rows: never tied to an allocation (attribution uses the whole GPU's rows)
            rows.append(mk(host, g, ts, samples=10, metrics={"sm_active": 0.99}, jobs=[], instance="1"))
    return rows, extra


def gpu_samples(draw: st.DrawFn, nd: dict[str, Any], g: int, js: list[Job], th: Thresholds,
                features: frozenset[str]) -> list[Any]:
    """One GPU's raw samples at a cadence that does not divide the bucket: 57 s, 15 s, 30 s with dropped
    scrapes, 60 s with +-2 s jitter (millisecond timestamps); sometimes an outage. Each sample carries the
    job(s) on the GPU at that instant (a job-following exporter: nothing of a job after its end)."""
    import random

    cadence = draw(st.sampled_from(["57", "15", "30drop", "60jitter"]))
    rng = random.Random(draw(st.integers(0, 2**20)))
    phase = draw(st.integers(0, 59))
    step = {"57": 57, "15": 15, "30drop": 30, "60jitter": 60}[cadence]
    outage = (T0 + draw(st.integers(0, HOURS * 3600)), draw(st.sampled_from([0, 0, 90, 700, 3600])))
    host, cl = nd["name"], nd["cluster"]
    out: list[Any] = []
    for k in range((END - T0 - phase) // step):
        t = float(T0 + phase + k * step)
        if cadence == "30drop" and rng.random() < 0.15:
            continue
        if cadence == "60jitter":
            t = round(t + rng.uniform(-2.0, 2.0), 3)
        if outage[0] <= t < outage[0] + outage[1] or not T0 <= t < END:
            continue
        occ = [j for j in js if (cl, host, g) in j.place and j.start <= t < j.end and not j.instance]
        labels: dict[str, str] = {}
        if nd["labels"] and occ:
            if all(j.alloc.source == "slurm" for j in occ):
                labels = {"hpc_job": ",".join(j.key for j in occ)}
            elif len(occ) == 1:
                labels = {"pod": occ[0].alloc.name, "namespace": occ[0].alloc.account}
        p = compat(occ[-1].profile if occ else {"sm_active": 0.0, "gpu_util": 0.0}, th, features)
        values = {k2: v for k2, v in p.items() if v is not None}
        if values:  # a scrape has a sample instant only where some series has a value
            out.append(Sample(cl, host, g, t, values, labels))
    return out


def when(ts: int) -> datetime:
    return dt(ts)


__all__ = ["Fleet", "fleets", "detect", "ALL_FEATURES", "T0", "END", "when", "timedelta"]
