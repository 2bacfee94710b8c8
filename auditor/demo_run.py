"""The demo's pipeline as a library function: generate the simulated week (:mod:`auditor.demo`), collect it
through the file connectors, audit it and write the reports. ``gpu-audit demo`` parses its options, calls
:func:`run_demo` and prints; tests and notebooks call it the same way. It sits above the report stage (it
writes reports), so it is a module of its own beside the daemon, not part of :mod:`auditor.demo`, which the
fleet simulator below the audit reads."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from auditor.errors import GpuAuditError


@dataclass
class DemoRun:
    """What one demo run made: its config (for further commands), window, audit run and report files."""

    config: Path
    start: datetime
    end: datetime
    run_id: int
    summary: dict[str, Any]
    reports: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"config": str(self.config), "since": self.start.isoformat(), "until": self.end.isoformat(),
                "run_id": self.run_id, "seconds": round(self.seconds, 2), "reports": self.reports, **self.summary}


def run_demo(out_dir: Path, *, now: datetime | None = None, seed: int = 7, store_url: str | None = None,
             telemetry: str = "dcgm", fresh: bool = False,
             collecting: Callable[[Any], AbstractContextManager[Any]] | None = None,
             auditing: Callable[[], AbstractContextManager[Any]] | None = None) -> DemoRun:
    """Generate, collect, audit and report the demo week into ``out_dir`` (refused when it already holds a
    demo store, unless ``fresh``). ``collecting(config)`` and ``auditing()`` wrap the two long steps (the
    CLI's progress on a terminal); ``collecting`` yields the progress callback collect reports to."""
    import connectors
    from auditor.audit.run import run_audit
    from auditor.collect import collect
    from auditor.demo import clear_or_refuse, generate
    from auditor.store.engine import Store

    t0 = time.monotonic()
    clear_or_refuse(out_dir, store_url, fresh)
    cfg_path, start, end = generate(out_dir, now=now, seed=seed, store_url=store_url, telemetry=telemetry)
    cfg = connectors.load_config(cfg_path)
    store = Store.open(cfg.store.resolved_url(), cfg.store.batch_rows)
    store.upgrade()
    with (collecting or (lambda _cfg: nullcontext(None)))(cfg) as progress:
        cs = collect(store, cfg, base_dir=cfg_path.parent, until=end, progress=progress)
    if not cs.ok:
        raise GpuAuditError("demo collection failed: " + "; ".join(r.error for r in cs.failed))
    with (auditing or nullcontext)():
        result = run_audit(store, cfg, start, end)
    from auditor.report.render import write_reports

    files = [str(p) for p in write_reports(store, cfg, result.run_id, out_dir / "reports",
                                           ["html", "text", "md", "json"])]
    return DemoRun(cfg_path, start, end, result.run_id, result.summary, files, time.monotonic() - t0)
