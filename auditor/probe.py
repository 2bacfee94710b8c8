"""``gpu-audit config check --probe``: connect to the store and to every configured source once and say
which answer, so a wrong port is found when the config is written, not at the first 3 a.m. run.

A probe is cheap and read-only: the store's migration revision; a Prometheus build-info call; the files
(regular, readable; a pattern that matches none fails) of file, scrape and file-form node_exporter and
inference sources; the build info of a node_exporter or inference source's Prometheus API; the Slurm
commands on PATH or slurmrestd's port; the Kubernetes API server's port. No data is collected.
"""

from __future__ import annotations

import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from auditor.config import Config, SourceConfig, sqlite_file
from auditor.logs import redact_url, scrub

TIMEOUT_S = 5.0


@dataclass
class Probe:
    what: str  # "store" or "<cluster> <role>[i]:<kind>"
    target: str  # where it connected (redacted)
    ok: bool
    detail: str
    seconds: float = 0.0


def _tcp(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    with socket.create_connection((parts.hostname or "localhost", port), timeout=TIMEOUT_S):
        return f"port {port} answers"


#: per kind of Prometheus-read source: the series whose copies the probe counts (one name each, the one every
#: exporter of that kind has): dcgm-exporter's GPU-Util, node_exporter's CPU seconds, the engines' token counters
DUPLICATE_PROBES = {"prometheus": ("DCGM_FI_DEV_GPU_UTIL",), "node_exporter": ("node_cpu_seconds_total",),
                    "inference": ("vllm:generation_tokens_total", "tgi_request_generated_tokens_sum",
                                  "sglang:generation_tokens_total", "nv_llm_output_token_len_sum")}


def duplicates(conn: Any, names: tuple[str, ...], scrape_labels: list[str], at: float, span_s: int = 3600) -> str:
    """One sentence when a series of ``names`` is read twice (copies that only ``scrape_labels`` tell apart:
    one exporter scraped by two Prometheus jobs), "" otherwise; the connectors merge such copies, the probe
    says so. With no scrape label configured the copies cannot be told: "" (nothing to count)."""
    if not scrape_labels:
        return ""
    total, example = 0, ""
    by = ", ".join(scrape_labels)
    for name in names:
        sel = conn.selector([name])
        q = f"count without ({by}) (last_over_time({sel}[{span_s}s])) > 1"
        data = json_of(conn.request("/api/v1/query", {"query": q, "time": f"{at:.3f}"}))
        result = (data.get("data") or {}).get("result") or []
        total += len(result)
        if result and not example:
            m = result[0].get("metric") or {}
            example = f"{name} of {m.get('instance') or m.get('Hostname') or m.get('pod') or '?'}"
    if not total:
        return ""
    return (f"{total} series read twice (copies that only {by} tell apart: one exporter scraped by two jobs, "
            f"e.g. {example}): merged when collecting, never added; if they are two sources, narrow "
            f"scrape_labels")


def json_of(body: bytes) -> dict[str, Any]:
    import json

    got = json.loads(body)
    return got if isinstance(got, dict) else {}


def _prometheus(opts: dict[str, Any], base_dir: Path, cluster: str, kind: str = "prometheus") -> str:
    from auditor.contract import Context
    from connectors.prometheus import SCRAPE_LABELS, PrometheusTelemetry

    conn = PrometheusTelemetry(Context(cluster, base_dir), PrometheusTelemetry.Options.model_validate(
        # node_exporter and inference sources: their Prometheus options only (the rest are their own)
        {k: v for k, v in opts.items() if kind == "prometheus" or k in PrometheusTelemetry.Options.model_fields}
        | {"timeout_s": min(float(opts.get("timeout_s", TIMEOUT_S)), TIMEOUT_S), "retries": 0}))
    scrape = list(opts.get("scrape_labels", SCRAPE_LABELS))
    try:
        body = conn.request("/api/v1/status/buildinfo", {}, "GET")
        # what the GPU series carry, the setting that changes it
        labels = conn.workload_probe(time.time()) if kind == "prometheus" else ""
        twice = duplicates(conn, DUPLICATE_PROBES[kind], scrape, time.time())
    finally:
        conn.close()
    version = (json_of(body).get("data") or {}).get("version", "?")
    return "; ".join(x for x in (f"Prometheus API answers (version {version})", labels, twice) if x)


def _files(kind: str, opts: dict[str, Any], base_dir: Path, cluster: str) -> str:
    import glob

    from auditor.contract import Context
    from connectors._rows import check_regular, unmatched

    ctx, n = Context(cluster, base_dir), 0
    missing = unmatched(ctx, list(opts.get("paths", [])))
    if missing:  # a pattern that matches nothing is a source that would collect nothing, not one that answers
        raise RuntimeError(missing[0] + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    for pattern in opts.get("paths", []):
        p = ctx.path(pattern)
        matches = [Path(m) for m in glob.glob(str(p))] if glob.has_magic(str(p)) else [p]
        for m in matches:
            check_regular(m)
            n += 1
    return f"{n} readable file{'s' if n != 1 else ''}"


def _slurm(opts: dict[str, Any]) -> str:
    if opts.get("backend") == "rest" or opts.get("rest_url"):
        return "slurmrestd " + _tcp(str(opts.get("rest_url")))
    missing = [c for c in ("sacct", "squeue", "scontrol") if shutil.which(c) is None]
    if missing:
        raise RuntimeError(f"not on PATH: {', '.join(missing)}")
    return "sacct, squeue and scontrol found"


def probe_source(cluster: str, role: str, index: int, src: SourceConfig, base_dir: Path) -> Probe:
    opts = src.options()
    what = f"{cluster} {role}[{index}]:{src.kind}"
    target = redact_url(str(opts.get("url") or opts.get("rest_url") or opts.get("host") or
                            ", ".join(opts.get("paths", [])) or src.kind))
    t0 = time.monotonic()
    try:
        if src.kind == "prometheus" or (src.kind in DUPLICATE_PROBES and opts.get("url")):
            detail = _prometheus(opts, base_dir, cluster, src.kind)
        elif src.kind in ("file", "scrape") or (src.kind in ("node_exporter", "inference") and opts.get("paths")):
            detail = _files(src.kind, opts, base_dir, cluster)
        elif src.kind == "slurm":
            detail = _slurm(opts)
        elif src.kind == "kubernetes" and opts.get("host"):
            detail = "API server " + _tcp(str(opts["host"]))
        else:
            detail = "not probed (no address in the config: in-cluster or kubeconfig credentials)"
        ok = True
    except Exception as exc:  # a probe reports; it never fails the command with a traceback
        text = str(exc).strip()
        ok, detail = False, scrub(text.splitlines()[0] if text else type(exc).__name__)
    return Probe(what, target, ok, detail, round(time.monotonic() - t0, 3))


def probe_store(url: str) -> Probe:
    from auditor.store.engine import Store

    t0 = time.monotonic()
    target = redact_url(url)
    file = sqlite_file(url)
    if file is not None and not file.exists():  # a probe reads: it never creates the store
        return Probe("store", target, False, f"no store file {file.resolve()} (`gpu-audit db upgrade` creates it)",
                     round(time.monotonic() - t0, 3))
    try:
        store = Store.open(url)
        try:
            cur, head = store.current(), store.head()
        finally:
            store.engine.dispose()
        detail = f"answers, revision {cur or 'none'}" + ("" if cur == head else f" (head {head}: run `gpu-audit "
                                                                                  "db upgrade`)")
        ok = True
    except Exception as exc:
        text = str(exc).strip()
        ok, detail = False, scrub(text.splitlines()[0] if text else type(exc).__name__)
    return Probe("store", target, ok, detail, round(time.monotonic() - t0, 3))


def probe_all(cfg: Config, base_dir: Path) -> list[Probe]:
    out = [probe_store(cfg.store.resolved_url())]
    for cluster in cfg.clusters:
        for role in ("allocations", "telemetry"):
            for i, src in enumerate(getattr(cluster, role)):
                out.append(probe_source(cluster.name, role, i, src, base_dir))
    return out
