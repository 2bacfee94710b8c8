"""Reservations in the ledger: one row per reservation with its latest definition, and the names of
reservations that jobs give only by id (docs/slurm.md "Reservations that change"); and the records whose
money would not be finite, quarantined at ingest (docs/chargeback.md "Money is always finite")."""

from __future__ import annotations

import json
import math
from typing import Any

from sqlalchemy import Connection, select, tuple_, update

from auditor.records import Allocation, Reservation
from auditor.store import cascade, schema
from auditor.timeutil import to_epoch

#: More GPUs than this in one reservation is a corrupt record, not a reservation.
MAX_RESERVED_GPUS = 1_000_000.0


def money_problem(rec: Any) -> str | None:
    """Why a record would make money non-finite or absurd (it is quarantined instead of stored): a GPU
    share outside (0, 1] or not a number, a reservation GPU count outside [0, 1,000,000]."""
    if isinstance(rec, Allocation):
        for g in rec.gpus:
            share = g.share
            if not isinstance(share, int | float) or not math.isfinite(share) or not 0 < share <= 1:
                return f"GPU share {share!r} on node {g.node!r} is not a number in (0, 1]"
    elif isinstance(rec, Reservation):
        n = rec.gpu_count
        if not isinstance(n, int | float) or not math.isfinite(n) or not 0 <= n <= MAX_RESERVED_GPUS:
            return f"reserved GPU count {n!r} is not a number from 0 to {MAX_RESERVED_GPUS:,.0f}"
    return None


def quarantine_rows(bad: list[tuple[Any, str]], seen: int) -> list[dict[str, Any]]:
    return [{"collected_ts": seen, "cluster": r.cluster[:128],
             "source": ("slurm reservation" if isinstance(r, Reservation) else f"{r.source} allocation")[:255],
             "location": (r.name if isinstance(r, Reservation) else r.external_id)[:255], "reason": why,
             "excerpt": repr(r)[:200]} for r, why in bad]


def _same_reservation(stored: Any, row: dict[str, Any], seen: int) -> bool:
    """Is this sighting the stored reservation (same cluster and name)? The same Slurm id when both have
    one; else spans that overlap or touch (slurmdbd ends a modified piece one second before the next), or
    both still current at ``seen`` (Slurm holds one reservation per name at a time: the stored definition
    was moved or replaced)."""
    if stored.slurm_id and row["slurm_id"]:
        return bool(stored.slurm_id == row["slurm_id"])
    if row["start_ts"] <= stored.end_ts + 1 and stored.start_ts <= row["end_ts"] + 1:
        return True
    return bool(stored.end_ts > seen and row["end_ts"] > seen)


def ingest_reservations(conn: Connection, items: list[Reservation], seen: int) -> int:
    """One row per reservation with its latest definition (never two overlapping ones counted twice).
    Accounting pieces of a reservation that had already ended when seen widen its span (a narrower query
    window never shortens it); a current definition replaces the stored one (start or end moved). Users
    and accounts, which accounting does not list, are kept from an earlier live sighting."""
    t = schema.reservations
    for r in items:
        row = {"cluster": r.cluster, "name": r.name, "slurm_id": r.slurm_id or None, "start_ts": to_epoch(r.start),
               "end_ts": to_epoch(r.end), "nodes": sorted(r.nodes), "gpu_count": r.gpu_count,
               "users": sorted(r.users), "accounts": sorted(r.accounts), "flags": sorted(r.flags),
               "last_seen_ts": seen}
        stored = list(conn.execute(select(t).where(t.c.cluster == r.cluster, t.c.name == r.name)))
        same = [s for s in stored if _same_reservation(s, row, seen)]
        if not same:
            conn.execute(t.insert().values(**row))
            continue
        keep, *extra = sorted(same, key=lambda s: s.id)
        cascade.delete_reservations(conn, [s.id for s in extra])
        history = row["end_ts"] <= seen and all(s.end_ts <= (s.last_seen_ts or 0) for s in same)
        if history and row["slurm_id"] and all(s.slurm_id == row["slurm_id"] for s in same):
            row["start_ts"] = min(row["start_ts"], *(s.start_ts for s in same))
            row["end_ts"] = max(row["end_ts"], *(s.end_ts for s in same))
        row["slurm_id"] = row["slurm_id"] or next((s.slurm_id for s in same if s.slurm_id), None)
        for col in ("users", "accounts"):
            if not row[col]:
                row[col] = next((_json(getattr(s, col)) for s in same if _json(getattr(s, col))), [])
        row["last_seen_ts"] = max(seen, *(s.last_seen_ts or 0 for s in same))
        conn.execute(update(t).where(t.c.id == keep.id).values(**row))
    return len(items)


def _json(v: Any) -> list[Any]:
    if isinstance(v, str):
        v = json.loads(v)
    return list(v or [])


def name_reservations(conn: Connection, allocs: list[Allocation]) -> None:
    """A job whose source gave only a reservation id (22.05 slurmdbd) takes the name of the stored
    reservation with that id, so the audit counts it inside its reservation."""
    t = schema.reservations
    want = {(a.cluster, str(a.labels.get("reservation_id")))
            for a in allocs if not a.reservation and a.labels.get("reservation_id") not in (None, "", "0", 0)}
    if not want:
        return
    names = {(r.cluster, r.slurm_id): r.name for r in conn.execute(
        select(t.c.cluster, t.c.slurm_id, t.c.name).where(tuple_(t.c.cluster, t.c.slurm_id).in_(sorted(want))))}
    for a in allocs:
        if not a.reservation and a.labels.get("reservation_id") not in (None, "", "0", 0):
            a.reservation = names.get((a.cluster, str(a.labels["reservation_id"])), "")
