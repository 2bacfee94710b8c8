"""Walk the settings models: the key paths the docs must cover, and a generated reference table."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, get_args, get_origin

from pydantic import BaseModel

from auditor.config import Config, SecretRef, SourceConfig


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


def connector_keys() -> Iterator[tuple[str, Any]]:
    """``<kind>.<option>`` for every built-in connector's options."""
    from connectors import ROLES, builtin_kinds, connector_class

    for kind in builtin_kinds():
        for role in ROLES:
            try:
                cls = connector_class(kind, role)
            except (KeyError, ImportError):
                continue
            for name, info in cls.Options.model_fields.items():
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


if __name__ == "__main__":
    print(reference_table())
