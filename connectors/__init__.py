"""Connector registry: kinds are found through the ``gpu_audit.connectors`` entry-point group.

A connector is a module (or package) exposing ``ALLOCATIONS`` and/or ``TELEMETRY`` classes that satisfy the
protocols of :mod:`connectors.base`. The built-in kinds are registered in gpu-audit's own ``pyproject.toml``;
a site adds one from its own package without editing gpu-audit::

    [project.entry-points."gpu_audit.connectors"]
    lsf = "mysite.lsf_connector"

This module imports nothing from :mod:`auditor` at import time, so ``auditor.config`` can validate a source's
options here without an import cycle.
"""

from __future__ import annotations

import importlib
import logging
import re
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the typed contract of every connector (connectors/base.py)
    from connectors.base import AllocationSource, TelemetrySource

log = logging.getLogger("gpu_audit.input")

ENTRY_POINT_GROUP = "gpu_audit.connectors"
ROLES = {"allocations": "ALLOCATIONS", "telemetry": "TELEMETRY"}

#: Kinds shipped with gpu-audit, each registered under ENTRY_POINT_GROUP in pyproject.toml (the list drives
#: the documentation test).
BUILTIN_KINDS = ("file", "scrape", "slurm", "kubernetes", "prometheus", "jobstats")


@cache
def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def kinds() -> list[str]:
    """Every connector kind this installation can build: the built-in ones and those sites registered."""
    return sorted(set(_entry_points()) | set(BUILTIN_KINDS))


def _module(kind: str) -> Any:
    ep = _entry_points().get(kind)
    if ep is not None:
        return ep.load()
    # not registered: a module connectors/<kind>.py of this checkout (an install whose metadata predates it)
    try:
        module = importlib.import_module(f"connectors.{kind}")
    except ModuleNotFoundError as exc:
        if exc.name == f"connectors.{kind}":
            raise KeyError(f"unknown connector kind {kind!r}") from None
        raise
    log.debug("connector %r is not registered under %s; using module connectors.%s", kind, ENTRY_POINT_GROUP,
              kind)
    return module


def connector_class(kind: str, role: str) -> type[AllocationSource] | type[TelemetrySource]:
    """The class implementing ``kind`` for ``role`` ("allocations" or "telemetry")."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", kind or ""):
        raise KeyError(f"invalid connector kind {kind!r}")
    cls = getattr(_module(kind), ROLES[role], None)
    if cls is None:
        raise KeyError(f"connector {kind!r} provides no {role} source")
    return cls


def build(kind: str, role: str, options: dict[str, Any], context: Any) -> AllocationSource | TelemetrySource:
    """An instance of ``kind`` for ``role``, its options validated by the connector's own ``Options`` model."""
    cls = connector_class(kind, role)
    return cls(context, cls.Options.model_validate(options))  # type: ignore[call-arg]
