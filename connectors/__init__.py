"""Connector registry. A connector is a module ``connectors/<kind>.py`` (or package) that exposes
``ALLOCATIONS`` and/or ``TELEMETRY`` classes; adding a scheduler or exporter means adding a file."""

from __future__ import annotations

import importlib
import re
from typing import Any

ROLES = {"allocations": "ALLOCATIONS", "telemetry": "TELEMETRY"}

#: Kinds shipped with gpu-audit (others can be added as modules without editing this list; it only
#: drives the documentation test).
BUILTIN_KINDS = ("file", "scrape", "slurm", "kubernetes", "prometheus", "jobstats")


def connector_class(kind: str, role: str) -> Any:
    """The class implementing ``kind`` for ``role`` ("allocations" or "telemetry")."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", kind or ""):
        raise KeyError(f"invalid connector kind {kind!r}")
    try:
        module = importlib.import_module(f"connectors.{kind}")
    except ModuleNotFoundError as exc:
        if exc.name == f"connectors.{kind}":
            raise KeyError(f"unknown connector kind {kind!r}") from None
        raise
    cls = getattr(module, ROLES[role], None)
    if cls is None:
        raise KeyError(f"connector {kind!r} provides no {role} source")
    return cls


def build(kind: str, role: str, options: dict[str, Any], context: Any) -> Any:
    cls = connector_class(kind, role)
    return cls(context, cls.Options.model_validate(options))
