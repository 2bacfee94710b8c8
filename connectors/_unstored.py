"""GPUs a telemetry source showed only through metrics gpu-audit does not store (temperatures, clocks, ...).

Such a GPU leaves no bucket, so without a word it would look like a GPU the exporter never saw. Each one is
warned about (host, index, UUID) with the metric names it had, and the warnings go into the collect output."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

from auditor.logs import log_safe

log = logging.getLogger("gpu_audit.telemetry")

#: per source and collect: a fleet-wide exporter misconfiguration is one screen of warnings, not 1,000
MAX_GPU_WARNINGS = 20


@dataclass
class UnstoredGpus:
    """Metric names seen per GPU that are not stored, and the GPUs that did give a stored metric."""

    names: dict[tuple[str, int | None, str], Counter[str]] = field(default_factory=dict)
    kept: set[tuple[str, object]] = field(default_factory=set)

    def seen(self, host: str, gpu: int | None, uuid: str | None, name: str) -> None:
        self.names.setdefault((host, gpu, uuid or ""), Counter())[name] += 1

    def stored(self, host: str, gpu: int | None, uuid: str | None) -> None:
        if gpu is not None:
            self.kept.add((host, gpu))
        if uuid:
            self.kept.add((host, uuid))

    def missing(self) -> list[tuple[str, int | None, str, list[str]]]:
        """(host, index, UUID, metric names) of every GPU without a stored metric, by host and index."""
        out = [(h, g, u, sorted(c)) for (h, g, u), c in self.names.items()
               if not ((g is not None and (h, g) in self.kept) or (u and (h, u) in self.kept))]
        return sorted(out, key=lambda r: (r[0], -1 if r[1] is None else r[1], r[2]))

    def report(self, source: str, limit: int = MAX_GPU_WARNINGS) -> list[str]:
        """One warning per such GPU (the first ``limit``, then a count); returned for the collect output."""
        gone = self.missing()
        notes = []
        for host, gpu, uuid, names in gone[:limit]:
            shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
            where = f"{host}/{'?' if gpu is None else gpu} (UUID {uuid or 'unknown'})"
            notes.append(log_safe(f"GPU {where} has only metrics gpu-audit does not store: {shown}; no bucket "
                                  "for it"))
        if len(gone) > limit:
            notes.append(f"{len(gone) - limit} more GPUs have only metrics gpu-audit does not store")
        for n in notes:
            log.warning("%s: %s", source, n)
        return notes
