"""slurmctld's own ``/metrics`` (Slurm 25.11+, ``MetricsType=metrics/openmetrics``) as a cross-check of the
allocations read: from 26.05, ``GET /metrics/nodes`` gives ``slurm_node_gpus_alloc{node="…"}``, the GPUs
slurmctld counts as allocated on each node (SchedMD/slurm @ 284c3b95f0: src/plugins/metrics/openmetrics/
openmetrics.c ``node_gpus_alloc`` from src/slurmctld/statistics.c ``gres_cnt_alloc``; doc/html/metrics.shtml;
testsuite/python/tests/test_153_2.py; CHANGELOG/slurm-26.05.md "Add gpu statistics to metrics endpoints").
The per-node sum of the GPUs the running jobs hold should equal it; where it does not, the source's note
says so (the allocations are still stored as read: slurmctld's count is a check, never a replacement).
25.11 serves the endpoint without GPU gauges: then the note says the check cannot be made."""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Iterable

import httpx

from auditor.records import Allocation
from connectors.slurm.jobs import SHARD

log = logging.getLogger("gpu_audit.slurm")

_LINE = re.compile(r'^slurm_node_gpus_alloc\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)')
_NODE = re.compile(r'(?:^|,)\s*node="(?P<node>(?:[^"\\]|\\.)*)"')


def node_gpus_alloc(text: str) -> dict[str, float] | None:
    """``slurm_node_gpus_alloc`` per node of a ``/metrics/nodes`` page; None when the page has none."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if not m:
            continue
        n = _NODE.search(m.group("labels"))
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        if n and value == value and value >= 0:
            out[n.group("node")] = value
    return out or None


def held(running: Iterable[Allocation]) -> dict[str, float]:
    """GPUs the running jobs hold per node, as slurmctld counts gres/gpu (a MIG slice is one gpu GRES;
    shards are their own GRES, not counted)."""
    out: dict[str, float] = defaultdict(float)
    for a in running:
        for g in a.gpus:
            if g.mig_profile != SHARD and g.node:
                out[g.node] += 1
    return out


def cross_check(url: str, running: list[Allocation], timeout_s: float, verify: bool | str = True) -> str:
    """'' when slurmctld's per-node GPU count equals the running jobs', else the note to show."""
    path = url.rstrip("/") + "/metrics/nodes"
    try:
        resp = httpx.get(path, timeout=timeout_s, verify=verify, follow_redirects=True)  # 303 from a standby
    except httpx.HTTPError as exc:
        return f"slurmctld metrics cross-check skipped: GET {path}: {type(exc).__name__}"
    if resp.status_code != 200:
        return f"slurmctld metrics cross-check skipped: GET {path}: HTTP {resp.status_code}"
    ctld = node_gpus_alloc(resp.text)
    if ctld is None:
        return (f"slurmctld metrics cross-check skipped: {path} has no slurm_node_gpus_alloc (GPU gauges come "
                "with Slurm 26.05)")
    ours = held(running)
    off = sorted(n for n in set(ctld) | set(ours) if abs(ctld.get(n, 0.0) - ours.get(n, 0.0)) > 1e-9)
    if not off:
        return ""
    shown = "; ".join(f"{n}: slurmctld {ctld.get(n, 0):g}, jobs read {ours.get(n, 0):g}" for n in off[:5])
    more = f" and {len(off) - 5} more" if len(off) > 5 else ""
    return (f"slurmctld /metrics counts other GPU allocations than the running jobs read on {len(off)} nodes "
            f"({shown}{more}): a job slurmctld lists was not read whole, or the listing changed between the "
            "two reads")
