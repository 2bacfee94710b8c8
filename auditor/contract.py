"""What the core hands every connector: the window to read, the context it is built with, the quarantine
for bad input, and the base of its options model.

Bottom layer, beside the records (DESIGN.md "The flow"), so the core below collect never imports a
connector; :mod:`connectors.base` adds the protocols a connector implements against these types.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict

log = logging.getLogger("gpu_audit.input")


class Options(BaseModel):
    """Base of every connector's options: unknown keys are config errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


@dataclass(frozen=True, slots=True)
class Window:
    """The half-open time range [since, until) a collection covers, in UTC."""

    since: datetime
    until: datetime
    bucket_seconds: int = 300


@dataclass
class Problems:
    """Quarantine for bad input: one log line per record naming source and location, counted per source.

    Parsers call :meth:`skip` and carry on, so one bad line never costs the good ones.
    """

    max_kept: int = 1000
    max_logged: int = 20  # per source; the rest are counted and summarised
    counts: Counter[str] = field(default_factory=Counter)
    clamped: Counter[str] = field(default_factory=Counter)
    items: list[tuple[str, str, str, str]] = field(default_factory=list)

    def skip(self, source: str, location: str, reason: str, excerpt: str = "") -> None:
        self.counts[source] += 1
        n = self.counts[source]
        if n <= self.max_logged:
            log.warning("%s:%s: %s (record skipped)", source, location, reason)
        elif n == self.max_logged + 1:
            log.warning("%s: more bad records; further ones are counted, not logged", source)
        if len(self.items) < self.max_kept:
            self.items.append((source, location, reason, excerpt[:200]))

    def clamp(self, source: str, what: str) -> None:
        """Count an out-of-range value that was clamped (e.g. MIG SM activity above 1)."""
        self.clamped[f"{source}:{what}"] += 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True, slots=True)
class Context:
    """What every connector is built with: its cluster name and the directory relative paths start from
    (the config file's directory), so tests can point a connector at checked-in data."""

    cluster: str
    base_dir: Path = Path(".")

    def path(self, p: str | Path) -> Path:
        q = Path(p).expanduser()
        return q if q.is_absolute() else self.base_dir / q
