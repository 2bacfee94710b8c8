"""Portable SQL scalar functions: SQLite spells GREATEST/LEAST as multi-argument max()/min()."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import GenericFunction
from sqlalchemy.types import Float


class greatest(GenericFunction):  # noqa: N801 - SQL function name
    type = Float()
    inherit_cache = True


class least(GenericFunction):  # noqa: N801 - SQL function name
    type = Float()
    inherit_cache = True


@compiles(greatest, "sqlite")
def _greatest_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    return f"max({compiler.process(element.clauses, **kw)})"


@compiles(least, "sqlite")
def _least_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    return f"min({compiler.process(element.clauses, **kw)})"
