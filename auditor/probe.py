"""``gpu-audit config check --probe``: connect to the store and to every configured source once and say
which answer, so a wrong port is found when the config is written, not at the first 3 a.m. run.

A probe is cheap and read-only: the store's migration revision; a Prometheus build-info call; the files
(regular, readable) of file and scrape sources; the Slurm commands on PATH or slurmrestd's port; the
Kubernetes API server's port. No data is collected.
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


def _prometheus(opts: dict[str, Any], base_dir: Path, cluster: str) -> str:
    from auditor.contract import Context
    from connectors.prometheus import PrometheusTelemetry

    conn = PrometheusTelemetry(Context(cluster, base_dir), PrometheusTelemetry.Options.model_validate(
        {**opts, "timeout_s": min(float(opts.get("timeout_s", TIMEOUT_S)), TIMEOUT_S), "retries": 0}))
    try:
        body = conn.request("/api/v1/status/buildinfo", {}, "GET")
    finally:
        conn.close()
    import json

    version = (json.loads(body).get("data") or {}).get("version", "?")
    return f"Prometheus API answers (version {version})"


def _files(kind: str, opts: dict[str, Any], base_dir: Path, cluster: str) -> str:
    import glob

    from auditor.contract import Context
    from connectors._rows import check_regular

    ctx, n = Context(cluster, base_dir), 0
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
        if src.kind == "prometheus":
            detail = _prometheus(opts, base_dir, cluster)
        elif src.kind in ("file", "scrape"):
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
