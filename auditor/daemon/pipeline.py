"""One pass of the steps (collect, audit, report, notify, enforce, chargeback): what `gpu-audit run` and the daemon
call. Each step's failure is recorded and the later steps that do not depend on it still run."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from auditor.config import Config
from auditor.daemon.steps import STEPS
from auditor.errors import EXIT_ERROR, EXIT_OK, EXIT_PARTIAL, GpuAuditError
from auditor.store.engine import Store
from auditor.timeutil import utcnow

log = logging.getLogger("gpu_audit.run")


@dataclass
class StepResult:
    name: str
    ok: bool
    seconds: float = 0.0
    error: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunSummary:
    steps: list[StepResult] = field(default_factory=list)
    run_id: int | None = None

    @property
    def exit_code(self) -> int:
        """0 all ok; 1 a step failed; 3 every step ran but some cluster sources failed (partial)."""
        if any(not s.ok and s.name != "collect" for s in self.steps):
            return EXIT_ERROR
        collect = next((s for s in self.steps if s.name == "collect"), None)
        if collect and not collect.ok:
            return EXIT_ERROR if not collect.detail.get("sources") or all(
                not r["ok"] for r in collect.detail["sources"]) else EXIT_PARTIAL
        return EXIT_OK

    def as_dict(self) -> dict[str, Any]:
        return {"exit_code": self.exit_code, "run_id": self.run_id,
                "steps": [vars(s) for s in self.steps]}


def parse_steps(text: str | Sequence[str]) -> list[str]:
    items = [s.strip() for s in (text.split(",") if isinstance(text, str) else text) if s.strip()]
    bad = [s for s in items if s not in STEPS]
    if bad:
        raise GpuAuditError(f"unknown step {bad[0]!r} (steps: {', '.join(STEPS)})")
    return items


def run_steps(store: Store, cfg: Config, steps: Sequence[str], *, base_dir: Path,
              since: datetime | None = None, until: datetime | None = None, dry_run: bool = False,
              out_dir: Path | None = None, formats: Sequence[str] = ("html", "text", "md", "json"),
              clusters: list[str] | None = None, keep_going: Callable[[], bool] | None = None) -> RunSummary:
    """Run ``steps`` in order once. The audit window defaults to the last ``report.days`` days.

    ``keep_going`` is asked before each step (the daemon: "is the lease still ours?"); when it says no, the
    remaining steps are not run and are reported failed, so nothing is sent twice."""
    # the stages load when a pass runs, not when the daemon module is imported
    from auditor.audit.run import latest_run, run_audit
    from auditor.collect import collect
    from auditor.enforce.policy import enforce
    from auditor.report.chargeback import write_previous_month
    from auditor.report.notify import notify
    from auditor.report.render import write_reports

    summary = RunSummary()
    end = until or utcnow()
    start = since or end - timedelta(days=cfg.report.days)
    out = out_dir or cfg.report.out_dir
    for name in STEPS:
        if name not in steps:
            continue
        t0 = time.monotonic()
        res = StepResult(name, True)
        if keep_going is not None and not keep_going():
            res.ok, res.error = False, "not run: the job's lease was lost to another daemon"
            log.error("step %s %s", name, res.error)
            summary.steps.append(res)
            continue
        try:
            if name == "collect":
                cs = collect(store, cfg, base_dir=base_dir, clusters=clusters)
                res.ok, res.detail = cs.ok, cs.as_dict()
                res.error = "; ".join(f"{r.cluster} {r.source}: {r.error}" for r in cs.failed)
            elif name == "audit":
                result = run_audit(store, cfg, start, end, clusters=clusters)
                summary.run_id = result.run_id
                res.detail = {"run_id": result.run_id, **result.summary}
            elif name == "report":
                run_id = summary.run_id or latest_run(store)
                if run_id is None:
                    raise GpuAuditError("no audit run to report on: run the audit step first")
                paths = write_reports(store, cfg, run_id, Path(out), list(formats))
                res.detail = {"files": [str(p) for p in paths]}
            elif name == "notify":
                run_id = summary.run_id or latest_run(store)
                if run_id is None:
                    raise GpuAuditError("no audit run to notify about: run the audit step first")
                res.detail = notify(store, cfg, run_id, dry_run=dry_run, out_dir=Path(out) / "outbox")
            elif name == "enforce":
                # --dry-run (or a dry-run daemon) never acts, whatever enforce.apply says
                run_cfg = cfg.model_copy(update={"enforce": cfg.enforce.model_copy(update={"apply": False})}) \
                    if dry_run else cfg
                res.detail = enforce(store, run_cfg, base_dir=base_dir)
            elif name == "chargeback":
                res.detail = write_previous_month(store, cfg, Path(out), end)
        except GpuAuditError as exc:
            res.ok, res.error = False, str(exc)
            log.error("step %s failed: %s", name, exc)
        res.seconds = round(time.monotonic() - t0, 3)
        summary.steps.append(res)
        log.info("%s", step_line(res))
    return summary


def step_line(res: StepResult) -> str:
    """One log line saying what a step did (records per source, findings, mails sent and skipped, files),
    so a cron log alone shows whether the weekly mail went out."""
    d = res.detail or {}
    head = f"step {res.name} {'ok' if res.ok else 'FAILED'} in {res.seconds:.1f} s"
    if res.name == "collect":
        parts = [f"{r['cluster']} {r['source']}: " + (
            f"{sum(v for k, v in r['stats'].items() if k != 'closed')} records, {r['skipped']} quarantined"
            if r["ok"] else "failed") for r in d.get("sources", [])]
        return f"{head}: " + ("; ".join(parts) or "no sources")
    if res.name == "audit" and res.ok:
        found = d.get("findings") or {}
        total = sum(found.values()) if isinstance(found, dict) else found
        return f"{head}: run {d.get('run_id')}, {total} findings" + (
            f" ({', '.join(f'{k} {v}' for k, v in found.items())})" if isinstance(found, dict) and found else "")
    if res.name == "notify" and res.ok:
        return f"{head}: {len(d.get('sent', []))} mails sent, {len(d.get('skipped', []))} skipped"
    if res.name == "enforce" and res.ok:
        acts = [x for x in d.get("decisions", []) if x.get("decision") in ("done", "dry_run")]
        return (f"{head}: {'dry run, ' if d.get('dry_run') else ''}{len(acts)} warnings/actions decided, "
                f"{d.get('acted', 0)} acted") + (f" ({d['note']})" if d.get("note") else "")
    if res.name in ("report", "chargeback") and res.ok:
        return f"{head}: {len(d.get('files', []))} files written"
    return head + (f": {res.error}" if res.error else "")
