"""JSON that every parser accepts: Python writes NaN and Infinity by default, which strict JSON (and
finance's tooling) rejects. A non-finite number, which money never is by construction, becomes null."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any


def finite(obj: Any) -> Any:
    """``obj`` with every NaN/Infinity float or Decimal replaced by None (dicts, lists, tuples walked)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Decimal):
        return obj if obj.is_finite() else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


class Encoded(str):
    """JSON text already encoded by :func:`dumps` (or spliced from its output, see :func:`with_member`):
    :func:`dumps` returns it as it is, so a JSON column takes it without encoding it again."""

    __slots__ = ()


def with_member(obj_text: str, key: str, value_text: str) -> Encoded:
    """The JSON object text ``obj_text`` with ``key`` set to the JSON text ``value_text`` as its last
    member (``key`` must not be in it): a large value encoded once, or never decoded, goes in unchanged."""
    head = obj_text.rstrip()
    if not head.endswith("}"):
        raise ValueError("with_member: not a JSON object")
    sep = "" if head[:-1].rstrip().endswith("{") else ", "
    return Encoded(f"{head[:-1]}{sep}{json.dumps(key)}: {value_text}}}")


def dumps(obj: Any, **kw: Any) -> str:
    """json.dumps that never writes a NaN/Infinity token (the walk only when one is there: large reports
    and every evidence column go through here); :class:`Encoded` text is returned as it is."""
    if isinstance(obj, Encoded):
        return str(obj)
    try:
        return json.dumps(obj, allow_nan=False, **kw)
    except ValueError:
        return json.dumps(finite(obj), allow_nan=False, **kw)
