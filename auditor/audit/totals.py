"""Per-allocation totals and money of a run, set-wise: ``usage_gpu`` -> ``usage_allocation`` in the store, and
the per-allocation rows the rules read, in batches, never all at once.

The totals of every allocation are grouped once into a temporary table (``_ua``); the team of each distinct
owner (team label value, source, account, user: :meth:`Pricing.team_for`, the one definition) and the price
of each distinct (model, MIG profile, GPUs reserved, GPU rows) (:meth:`Pricing.price`, the price card) are
computed in Python for those few distinct keys and joined in as two small temporary tables (``_ua_team``,
``_ua_price``); one ``INSERT ... SELECT`` writes ``usage_allocation`` with its costs
(:data:`auditor.audit.money.COST_SQL`). So memory follows the owners and the models, not the allocations.
A row whose numbers are not finite is refused before it is written (:meth:`Pricing.price_rows` decides, on
the few candidate rows SQL finds). :class:`AllocationRows` hands the rules the same rows as dicts
(:data:`ROW_KEYS`), in batches ordered by allocation id, or those of given ids.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

from sqlalchemy import Connection, insert, text

from auditor.audit.judging import SUMS, usage_columns
from auditor.audit.money import COST_KEYS, COST_SQL, Pricing
from auditor.store import schema

log = logging.getLogger("gpu_audit.audit")

SUM_COLS = [c for c in schema.usage_allocation.c.keys() if c.endswith("_s")]
#: usage columns a per-allocation row does not carry: effective_s is the SM sum by definition (one
#: expression writes both, checked below), so the row keeps sm_s alone and usage_allocation.effective_s is
#: written from it; max_gpu_mirage_s comes back as its MAX
_NOT_SUMMED = ("max_gpu_mirage_s", "effective_s")
_SAME = usage_columns({k: k for k in SUMS}, "share", "reserved")
assert _SAME["effective_s"] == _SAME["sm_s"], "effective_s is no longer the SM sum: the rows carry sm_s alone"
SUMMED = [c for c in SUM_COLS if c not in _NOT_SUMMED]

#: the numbers of a per-allocation row that must be finite (max_gpu_mirage_s comes back as its MAX)
NUMBER_KEYS = [*SUMMED, "max_gpu_mirage_s_max", "gpu_count"]

_GROUPED = ("CREATE TEMPORARY TABLE _ua AS SELECT u.allocation_id, COUNT(*) AS gpus, "
            "MAX(u.peak_fb_mib) AS peak_fb_mib, MAX(u.idle_peak_fb_mib) AS idle_peak_fb_mib, "
            "MAX(u.max_gpu_mirage_s) AS max_gpu_mirage_s_max, "
            + ", ".join(f"SUM(u.{c}) AS {c}" for c in SUMMED)
            + ", MIN(ag.model) AS gpu_model, MIN(ag.mig_profile) AS mig_profile "
            "FROM usage_gpu u JOIN allocated_gpus ag ON ag.id = u.allocated_gpu_id "
            "WHERE u.run_id = :run_id GROUP BY u.allocation_id")
_TEMP = ("_ua", "_ua_team", "_ua_price")
#: the owner and price keys of an allocation (NULL and '' mean the same to team_for and price)
_OWNER = ("COALESCE({label}, '')", "COALESCE(a.source, '')", "COALESCE(a.account, '')", "COALESCE(a.user_name, '')")
_PRICE = ("COALESCE(g.gpu_model, '')", "COALESCE(g.mig_profile, '')", "a.gpu_count", "g.gpus")
_TEAM_COLS = ("lab", "src", "acct", "usr")
_PRICE_COLS = ("model", "mig", "cnt", "gpus")
#: the texts of a per-allocation row from allocations
_ALLOC = ("cluster", "source", "external_id", "name", "user_name", "account", "gpu_count", "start_ts", "end_ts")
#: a per-allocation row's keys, in :func:`_select`'s order
ROW_KEYS = ("allocation_id", "gpus", "peak_fb_mib", "idle_peak_fb_mib", "max_gpu_mirage_s_max", *SUMMED, "gpu_model",
            "mig_profile", *_ALLOC, "team", "price")
#: usage_allocation column <- SQL of the row select (run_id and the costs aside)
_UA_COLS = {"allocation_id": "g.allocation_id", "team": "t.team", "gpu_model": "g.gpu_model",
            "price_per_gpu_hour": "p.price", **{c: f"g.{c}" for c in SUMMED}, "effective_s": "g.sm_s",
            "max_gpu_mirage_s": "g.max_gpu_mirage_s_max", "peak_fb_mib": "g.peak_fb_mib",
            "idle_peak_fb_mib": "g.idle_peak_fb_mib", "gpus": "g.gpus"}
#: a number that is not finite, or so large its cost might not be: a candidate for Pricing.price_rows' check
_BAD = "({x} IS NULL OR NOT ({x} BETWEEN -1e150 AND 1e150))"


def team_label_sql(dialect: str, team_label: str) -> tuple[str, dict[str, str], bool]:
    """The SQL of the team label's value and its parameter, read by the server (the audit never parses every
    allocation's labels as JSON): (expression, parameters, whole). ``whole``: a label name no JSON path can
    quote on SQLite: the expression is the whole ``labels`` text, read by :meth:`Pricing.label_value`."""
    if dialect == "postgresql":  # NULL where labels is not an object or lacks the key
        return "a.labels ->> :team_label", {"team_label": team_label}, False
    if dialect == "sqlite" and '"' not in team_label and "\\" not in team_label:
        return ("CASE WHEN json_valid(a.labels) AND json_type(a.labels) = 'object' THEN "
                "json_extract(a.labels, :team_path) END"), {"team_path": f'$."{team_label}"'}, False
    return "a.labels", {}, True


class AllocationRows:
    """The per-allocation totals of one run: written set-wise into usage_allocation (:meth:`write`), then
    read back as dicts with their team and price, in batches or by id."""

    def __init__(self, conn: Connection, run_id: int, pricing: Pricing) -> None:
        self.conn, self.run_id, self.pricing = conn, run_id, pricing
        self.label, self.params, self.whole = team_label_sql(conn.dialect.name, pricing.team_label)

    def _join(self, ua: str = "_ua") -> str:
        """The FROM clause of the rows: ``ua`` is ``_ua`` or a subquery of it (a page, ahead of the joins)."""
        owner = [k.format(label=self.label) for k in _OWNER]
        return (f"FROM {ua} g JOIN allocations a ON a.id = g.allocation_id JOIN _ua_team t ON "
                + " AND ".join(f"t.{c} = {e}" for c, e in zip(_TEAM_COLS, owner, strict=True))
                + " JOIN _ua_price p ON "
                + " AND ".join(f"p.{c} = {e}" for c, e in zip(_PRICE_COLS, _PRICE, strict=True)))

    def _select(self, where: str = "", ua: str = "_ua") -> str:
        cols = [f"g.{k}" for k in ROW_KEYS[:ROW_KEYS.index("cluster")]] + [f"a.{k}" for k in _ALLOC]
        return f"SELECT {', '.join(cols)}, t.team, p.price {self._join(ua)} {where}"

    def write(self, now: int) -> int:
        """Group the run's usage per allocation, price it, refuse rows that are not finite (:func:`refuse`:
        quarantined, their usage deleted) and write usage_allocation; returns the allocations refused."""
        conn, dialect = self.conn, self.conn.dialect.name
        self.drop()
        conn.execute(text(_GROUPED), {"run_id": self.run_id})
        conn.execute(text("CREATE UNIQUE INDEX ix_ua ON _ua (allocation_id)"))
        if dialect == "postgresql":
            conn.execute(text("ANALYZE _ua"))  # temporary tables are never analysed on their own
        typ = " TEXT" if dialect == "postgresql" else ""  # SQLite: the label's value keeps its JSON type
        conn.execute(text(f"CREATE TEMPORARY TABLE _ua_team (lab{typ}, src TEXT, acct TEXT, usr TEXT, team TEXT)"))
        owner = ", ".join(k.format(label=self.label) for k in _OWNER)
        teams = []
        for lab, src, acct, usr in conn.execute(text(f"SELECT DISTINCT {owner} FROM _ua g JOIN allocations a ON "
                                                     "a.id = g.allocation_id"), self.params):
            value = self.pricing.label_value(lab) if self.whole else lab
            teams.append({"lab": lab, "src": src, "acct": acct, "usr": usr,
                          "team": self.pricing.team_for(value, src, acct, usr)})
        _insert(conn, "_ua_team", _TEAM_COLS + ("team",), teams)
        conn.execute(text("CREATE TEMPORARY TABLE _ua_price (model TEXT, mig TEXT, cnt FLOAT, gpus INTEGER, "
                          "price FLOAT)"))
        prices = [{"model": m, "mig": mig, "cnt": cnt, "gpus": n, "price": self.pricing.price(m, mig, cnt, n)}
                  for m, mig, cnt, n in conn.execute(text(f"SELECT DISTINCT {', '.join(_PRICE)} FROM _ua g JOIN "
                                                          "allocations a ON a.id = g.allocation_id"))]
        _insert(conn, "_ua_price", _PRICE_COLS + ("price",), prices)
        if dialect == "sqlite":
            # SQLite joins by nested loops: without these, every row scanned every owner. Not on PostgreSQL:
            # it hash-joins, and a btree refuses an entry over 2,704 bytes (a 300 kB user name)
            conn.execute(text(f"CREATE UNIQUE INDEX ix_ua_team ON _ua_team ({', '.join(_TEAM_COLS)})"))
            conn.execute(text(f"CREATE UNIQUE INDEX ix_ua_price ON _ua_price ({', '.join(_PRICE_COLS)})"))
        else:
            conn.execute(text("ANALYZE _ua_team"))
            conn.execute(text("ANALYZE _ua_price"))
        bad = " OR ".join(_BAD.format(x=x) for x in [*(f"g.{c}" for c in SUMMED), "g.max_gpu_mirage_s_max",
                                                     "a.gpu_count", "p.price"])
        cands = [dict(zip(ROW_KEYS, r, strict=True))
                 for r in conn.execute(text(self._select(f"WHERE {bad}")), self.params)]
        refused = self.pricing.price_rows(cands, NUMBER_KEYS)[1] if cands else []
        if refused:
            refuse(conn, self.run_id, refused, now)
            ids = sorted({r["allocation_id"] for r, _ in refused})
            for i in range(0, len(ids), 1000):
                conn.execute(text(f"DELETE FROM _ua WHERE allocation_id IN ({', '.join(map(str, ids[i:i + 1000]))})"))
        cols = ["run_id", *_UA_COLS, *COST_KEYS]
        vals = [":run_id", *_UA_COLS.values(), *(COST_SQL[k].format(s="g.", price="p.price") for k in COST_KEYS)]
        conn.execute(text(f"INSERT INTO usage_allocation ({', '.join(cols)}) SELECT {', '.join(vals)} {self._join()}"),
                     {**self.params, "run_id": self.run_id})
        return len(refused)

    def batches(self, size: int = 5000) -> Iterator[list[dict[str, Any]]]:
        """Every row, ordered by allocation id, ``size`` at a time (keyset pages: each a short index range)."""
        last = -1
        # the page is cut from _ua first (an index range), then joined: a LIMIT over the joins had PostgreSQL
        # join every allocation for every page (84 s instead of 10 s of core rules at 100,000 GPUs)
        page = "(SELECT * FROM _ua WHERE allocation_id > :last ORDER BY allocation_id LIMIT :n)"
        sql = text(self._select("ORDER BY g.allocation_id", ua=page))
        while True:
            rows = [dict(zip(ROW_KEYS, r, strict=True)) for r in self.conn.execute(sql, {**self.params, "last": last,
                                                                                           "n": size})]
            if not rows:
                return
            yield rows
            last = rows[-1]["allocation_id"]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.batches():
            yield from batch

    def get(self, ids: Iterable[int]) -> dict[int, dict[str, Any]]:
        """The rows of these allocation ids (those the run holds), by id."""
        want = sorted({int(i) for i in ids})
        out: dict[int, dict[str, Any]] = {}
        for i in range(0, len(want), 1000):
            ids = ", ".join(map(str, want[i:i + 1000]))
            sql = self._select(ua=f"(SELECT * FROM _ua WHERE allocation_id IN ({ids}))")
            for r in self.conn.execute(text(sql), self.params):
                out[r[0]] = dict(zip(ROW_KEYS, r, strict=True))
        return out

    def drop(self) -> None:
        for t in _TEMP:
            self.conn.execute(text(f"DROP TABLE IF EXISTS {t}"))


def refuse(conn: Connection, run_id: int, refused: list[tuple[dict[str, Any], str]], now: int) -> None:
    """Allocations whose money is not finite: kept out of this run (no usage, no findings) and listed in
    quarantined_records, so one corrupt row never fails the audit for everyone."""
    if not refused:
        return
    ids = [r["allocation_id"] for r, _ in refused]
    log.warning("audit run %d: %d allocation(s) refused (not finite), e.g. %s: %s", run_id, len(ids),
                refused[0][0].get("external_id"), refused[0][1])
    conn.execute(schema.usage_gpu.delete().where(schema.usage_gpu.c.run_id == run_id,
                                                 schema.usage_gpu.c.allocation_id.in_(ids)))
    conn.execute(insert(schema.quarantined_records), [
        {"collected_ts": now, "cluster": str(r.get("cluster") or "")[:128], "source": f"audit run {run_id}",
         "location": f"allocation {r['allocation_id']} ({r.get('external_id')})"[:255], "reason": why,
         "excerpt": None} for r, why in refused])


def _insert(conn: Connection, table: str, cols: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    if rows:
        conn.execute(text(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join(':' + c for c in cols)})"),
                     rows)
