"""Connector registry: kinds are found through the ``gpu_audit.connectors`` entry-point group, and each
source of a config is validated against its kind's own ``Options`` model.

A connector is a module (or package) exposing ``ALLOCATIONS`` and/or ``TELEMETRY`` classes that satisfy the
protocols of :mod:`connectors.base`. The built-in kinds are registered in gpu-audit's own ``pyproject.toml``
like any other; a site adds one from its own package without editing gpu-audit::

    [project.entry-points."gpu_audit.connectors"]
    lsf = "mysite.lsf_connector"
"""

from __future__ import annotations

import logging
import os
import re
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from auditor import config as config_mod
from auditor.config import Config
from auditor.config.base import check_url
from auditor.errors import ConfigError

if TYPE_CHECKING:  # the typed contract of every connector (connectors/base.py)
    from connectors.base import AllocationSource, TelemetrySource

log = logging.getLogger("gpu_audit.input")

ENTRY_POINT_GROUP = "gpu_audit.connectors"
ROLES = {"allocations": "ALLOCATIONS", "telemetry": "TELEMETRY"}


@cache
def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def kinds() -> list[str]:
    """Every connector kind this installation can build: the registered entry points."""
    return sorted(_entry_points())


def builtin_kinds() -> list[str]:
    """The kinds gpu-audit ships: the entry points whose module is in this package."""
    return sorted(name for name, ep in _entry_points().items()
                  if ep.module == __name__ or ep.module.startswith(f"{__name__}."))


def connector_class(kind: str, role: str) -> type[AllocationSource] | type[TelemetrySource]:
    """The class implementing ``kind`` for ``role`` ("allocations" or "telemetry")."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", kind or ""):
        raise KeyError(f"invalid connector kind {kind!r}")
    ep = _entry_points().get(kind)
    if ep is None:
        raise KeyError(f"unknown connector kind {kind!r}")
    cls = getattr(ep.load(), ROLES[role], None)
    if cls is None:
        raise KeyError(f"connector {kind!r} provides no {role} source")
    return cls


def build(kind: str, role: str, options: dict[str, Any], context: Any) -> AllocationSource | TelemetrySource:
    """An instance of ``kind`` for ``role``, its options validated by the connector's own ``Options`` model."""
    cls = connector_class(kind, role)
    return cls(context, cls.Options.model_validate(options))  # type: ignore[call-arg]


def source_errors(kind: Any, role: str, options: dict[str, Any], where: str) -> list[str]:
    """Every problem of one source's settings (``where``: its key path, ``clusters[0].telemetry[1]``): an
    unknown kind (naming the nearest known one), each option its connector's model refuses (an unknown
    option naming the nearest known one), a URL with a bad port."""
    try:
        cls = connector_class(kind, role)
    except KeyError as exc:
        near = config_mod.suggest(kind, kinds()) if isinstance(kind, str) else ""
        return [f"{where}.kind: {exc.args[0]}{near}"]
    try:
        cls.Options.model_validate(options)
    except ValidationError as exc:
        return config_mod.errors(exc, where, cls.Options)
    out = []
    for key, value in options.items():
        if isinstance(value, str) and (key.endswith("url") or key == "host") and "://" in value:
            try:
                check_url(value, f"{where}.{key}")
            except ConfigError as exc:
                out.append(str(exc))
    return out


def validate_sources(cfg: Config, origin: str = "config") -> Config:
    """``cfg`` once each source's options passed its connector's own model, so a bad key fails `config
    check`, not a 3 a.m. run. Errors name the key path: ``<origin>: clusters[0].telemetry[1].url: ...``;
    the first is raised (``gpu-audit config check`` lists them all)."""
    for ci, cluster in enumerate(cfg.clusters):
        for role in ROLES:
            for si, src in enumerate(getattr(cluster, role)):
                errs = source_errors(src.kind, role, src.options(), f"clusters[{ci}].{role}[{si}]")
                if errs:
                    more = f" (and {len(errs) - 1} more: `gpu-audit config check` lists them)" if len(errs) > 1 \
                        else ""
                    raise ConfigError(f"{origin}: {errs[0]}{more}")
    return cfg


def load_config(path: str | Path | None = None) -> Config:
    """The config as the CLI loads it: :func:`auditor.config.load` (``path``, else $GPU_AUDIT_CONFIG, else
    defaults), then every source checked by :func:`validate_sources`."""
    path = path or os.environ.get(config_mod.ENV_VAR) or None
    return validate_sources(config_mod.load(path), str(Path(path)) if path else "config")
