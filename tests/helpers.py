"""Helpers shared by several test modules (fixtures stay in conftest.py): one copy of each."""

from __future__ import annotations

import sys
import types
from functools import cache
from importlib.metadata import EntryPoint

import pytest

import connectors


def add_connector(monkeypatch: pytest.MonkeyPatch, kind: str, module: types.ModuleType) -> None:
    """Register an in-memory ``module`` as connector ``kind`` for one test, through the entry-point group as
    an installed package would (``connectors`` finds kinds nowhere else). Undone with ``monkeypatch``."""
    monkeypatch.setitem(sys.modules, module.__name__, module)
    ep = EntryPoint(kind, module.__name__, connectors.ENTRY_POINT_GROUP)
    registered = connectors._entry_points.__wrapped__

    @cache
    def with_kind() -> dict[str, EntryPoint]:
        return {**registered(), kind: ep}

    monkeypatch.setattr(connectors, "_entry_points", with_kind)
