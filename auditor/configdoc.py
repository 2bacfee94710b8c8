"""Walk the settings models: the key paths the docs must cover, a generated reference table, and every
problem of a config file at once (``gpu-audit config check``; loading stops at the first)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from auditor import config as config_mod
from auditor.config import Config, SecretRef, SourceConfig
from auditor.errors import ConfigError


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        m = _model_of(arg)
        if m is not None:
            return m
    return None


def walk(model: type[BaseModel] = Config, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(key path, field info) for every setting; lists of tables are written ``clusters[].name``."""
    for name, info in model.model_fields.items():
        is_list = get_origin(info.annotation) is list
        path = f"{prefix}{name}" + ("[]" if is_list else "")
        yield path, info
        sub = _model_of(info.annotation)
        if sub is not None and sub is not SecretRef and sub is not SourceConfig:
            yield from walk(sub, path + ".")
        if sub is SourceConfig:
            yield f"{path}.kind", SourceConfig.model_fields["kind"]


#: option sets several connectors take, each documented once under the connector that owns it (the others' docs
#: point there): the Prometheus API connection of ``node_exporter`` and ``inference`` is ``prometheus``'s
SHARED_OPTIONS = {"connectors.prometheus:ApiOptions": "prometheus"}


def shared_option(kind: str, options: type[BaseModel], name: str) -> str | None:
    """The connector under which ``kind``'s option ``name`` is documented when it belongs to a shared option set
    (:data:`SHARED_OPTIONS`) of another connector, else None."""
    from importlib import import_module

    for ref, owner in SHARED_OPTIONS.items():
        mod, _, cls_name = ref.partition(":")
        base = getattr(import_module(mod), cls_name)
        if owner != kind and issubclass(options, base) and name in base.model_fields:
            return owner
    return None


def connector_keys() -> Iterator[tuple[str, Any]]:
    """``<kind>.<option>`` for every built-in connector's options, a shared option (:data:`SHARED_OPTIONS`) once,
    under the connector that owns it."""
    from connectors import ROLES, builtin_kinds, connector_class

    for kind in builtin_kinds():
        for role in ROLES:
            try:
                cls = connector_class(kind, role)
            except (KeyError, ImportError):
                continue
            for name, info in cls.Options.model_fields.items():
                if shared_option(kind, cls.Options, name) is None:
                    yield f"{kind}.{name}", info


def _default(info: Any) -> str:
    if info.default_factory is not None:
        value = info.default_factory()
        return "" if isinstance(value, BaseModel) else f"`{value!r}`"
    if info.is_required():
        return "required"
    return f"`{info.default!r}`"


def reference_table() -> str:
    rows = ["| key | default | description |", "|---|---|---|"]
    for path, info in walk():
        rows.append(f"| `{path}` | {_default(info)} | {info.description or ''} |")
    return "\n".join(rows)


@dataclass
class Checked:
    """What `config check` found: the config (None when it has errors), every error, and warnings."""

    path: Path | None
    config: Config | None = None
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def check(path: str | Path | None = None, *, files: bool = True) -> Checked:
    """Every error of the config ``path`` (else $GPU_AUDIT_CONFIG, else none): the settings models' and each
    source's connector options', all of them, each ``<file>: key.path: what is wrong``; a warning when no
    file was read (the built-in defaults were checked, which is rarely what was meant). ``files``: a file
    source whose paths name no file is an error too (``--probe`` says so per source instead)."""
    import connectors

    p = config_mod.config_path(path)
    out = Checked(p)
    if p is None:
        out.warnings.append(f"no config file read (no -c/--config and ${config_mod.ENV_VAR} unset): checked the "
                            "built-in defaults (an SQLite store gpu-audit.db in the current directory, no "
                            "clusters)")
        out.config = Config()
        return out
    origin = str(p)
    try:
        data = config_mod.read(p)
    except ConfigError as exc:
        out.errors.append(str(exc))
        return out
    from auditor.config.retired import retire

    data, retired_errors, retired_warnings = retire(data)
    out.errors += [f"{origin}: {e}" for e in retired_errors]
    out.warnings += [f"{origin}: {w}" for w in retired_warnings]
    try:
        cfg = Config.model_validate(data)
    except ValidationError as exc:
        out.errors += [f"{origin}: {e}" for e in config_mod.errors(exc, model=Config)]
        cfg = None
    clusters = data.get("clusters") if isinstance(data.get("clusters"), list) else []
    for ci, cluster in enumerate(clusters):
        if not isinstance(cluster, dict):
            continue
        for role in connectors.ROLES:
            sources = cluster.get(role) if isinstance(cluster.get(role), list) else []
            for si, src in enumerate(sources):
                if isinstance(src, dict) and isinstance(src.get("kind"), str):  # else the models said why
                    options = {k: v for k, v in src.items() if k != "kind"}
                    out.errors += [f"{origin}: {e}" for e in connectors.source_errors(
                        src["kind"], role, options, f"clusters[{ci}].{role}[{si}]")]
    if cfg is not None and not out.errors and files:
        out.errors += [f"{origin}: {e}" for e in _unmatched_paths(cfg, p.resolve().parent)]
    if cfg is not None and not out.errors:
        out.config = config_mod.resolved(cfg, p)
    return out


#: The kinds whose ``paths`` name files to read (jobstats' paths are saved command outputs, checked at collect)
FILE_KINDS = ("file", "scrape", "node_exporter", "inference")


def _unmatched_paths(cfg: Config, base_dir: Path) -> list[str]:
    """A file source whose pattern matches no file (or whose file is not there): it would collect nothing."""
    from auditor.contract import Context
    from connectors._rows import unmatched

    out = []
    for ci, cluster in enumerate(cfg.clusters):
        for role in ("allocations", "telemetry"):
            for si, src in enumerate(getattr(cluster, role)):
                paths = src.options().get("paths") if src.kind in FILE_KINDS else None
                if isinstance(paths, list):
                    out += [f"clusters[{ci}].{role}[{si}] ({src.kind}): {why}"
                            for why in unmatched(Context(cluster.name, base_dir), [str(x) for x in paths])]
    return out


if __name__ == "__main__":
    print(reference_table())
