"""Findings beyond the per-allocation totals (idle episodes, idle reservations, low efficiency).

Kept apart from :mod:`auditor.rules` so they can grow without touching the core rules; this version
returns none until they are implemented (issue 6)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from auditor.config import Config, Thresholds


def extra_findings(conn: Connection, run_id: int, per_alloc: list[dict[str, Any]],
                   per_gpu: dict[int, list[dict[str, Any]]], th: Thresholds, cfg: Config, *,
                   since: int, until: int, horizon: int) -> list[dict[str, Any]]:
    return []
