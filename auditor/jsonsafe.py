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


def dumps(obj: Any, **kw: Any) -> str:
    """json.dumps that never writes a NaN/Infinity token (the walk only when one is there: large reports
    and every evidence column go through here)."""
    try:
        return json.dumps(obj, allow_nan=False, **kw)
    except ValueError:
        return json.dumps(finite(obj), allow_nan=False, **kw)
