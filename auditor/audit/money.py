"""Teams and prices: who an allocation belongs to, and what its GPU-hours cost."""

from __future__ import annotations

import json
import math
from operator import itemgetter
from typing import Any

from auditor.config import Config

UNMAPPED = "(unmapped)"


class Pricing:
    """Team mapping and price card, precomputed once per audit (lookups per allocation, not per bucket)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.by_account = {a: t.name for t in cfg.teams for a in t.accounts}
        self.by_namespace = {n: t.name for t in cfg.teams for n in t.namespaces}
        self.by_user = {u: t.name for t in cfg.teams for u in t.users}
        self.models = sorted(((k.lower(), v) for k, v in cfg.prices.models.items()),
                             key=lambda kv: -len(kv[0]))
        self.mig = {k.lower(): v for k, v in cfg.prices.mig.items()}
        self.team_label = cfg.team_label
        self._model_prices: dict[str | None, float] = {}

    def team_of(self, row: dict[str, Any]) -> str:
        """``team_label`` (pod label) first, then the account/namespace and user mappings. Labels come back
        from the store as a dict on PostgreSQL and as JSON text on SQLite: both are read the same way; a row
        holding the label's value alone (``label_team``, read by the server:
        :func:`auditor.audit.totals.team_label_sql`) is taken as it is."""
        value = row["label_team"] if "label_team" in row else self.label_value(row.get("labels"))
        return self.team_for(value, row.get("source"), row.get("account"), row.get("user_name"))

    def label_value(self, labels: Any) -> Any:
        """The team label's value in ``labels`` (a dict, or its JSON text), else None."""
        if isinstance(labels, str):
            try:
                labels = json.loads(labels)
            except ValueError:
                labels = {}
        return labels.get(self.team_label) if isinstance(labels, dict) else None

    def team_for(self, value: Any, source: str | None, account: str | None, user_name: str | None) -> str:
        """The team of an allocation from its team label's ``value`` and its account and user (team_of)."""
        if value:
            return str(value)
        account = account or ""
        if source == "kubernetes":
            team = self.by_namespace.get(account) or self.by_account.get(account)
        else:
            team = self.by_account.get(account) or self.by_namespace.get(account)
        return team or self.by_user.get(user_name or "") or UNMAPPED

    def team_of_reservation(self, users: list[str], accounts: list[str]) -> str:
        """A reservation belongs to the team of its accounts, else of its users, in the order Slurm lists
        them (``-name`` entries are exclusions, not members)."""
        for a in accounts:
            if not a.startswith("-") and (self.by_account.get(a) or self.by_namespace.get(a)):
                return self.by_account.get(a) or self.by_namespace[a]
        for u in users:
            if not u.startswith("-") and u in self.by_user:
                return self.by_user[u]
        return UNMAPPED

    def model_price(self, model: str | None) -> float:
        """The price card's price of ``model`` (the longest key found in its name), else the default;
        looked up once per model name (an audit asks once per allocation)."""
        price = self._model_prices.get(model)
        if price is None:
            m = (model or "").lower()
            price = next((p for key, p in self.models if key and key in m), self.cfg.prices.default)
            self._model_prices[model] = price
        return price

    def price(self, model: str | None, mig_profile: str | None, gpu_count: float, gpus: int) -> float:
        """Price per full-GPU-hour equivalent. Usage seconds are already share-weighted, so a MIG slice
        priced per slice-hour converts to slice price / share."""
        if mig_profile and mig_profile.lower() in self.mig and gpus:
            share = (gpu_count or 0) / gpus
            if share > 0:
                return self.mig[mig_profile.lower()] / share
        return self.model_price(model)

    def price_rows(self, rows: list[dict[str, Any]], number_keys: list[str]
                   ) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], str]]]:
        """Team (where the row does not carry it yet) and price of each per-allocation row of an audit, and
        the check that its numbers and costs (:func:`costs`, not kept in the row) are finite. A row that is
        not (a corrupt share in an old store, say) is refused with a reason instead of failing the audit for
        everyone; :func:`auditor.audit.run.run_audit` quarantines it."""
        ok, refused = [], []
        keys = (*number_keys, "price")
        values = itemgetter(*keys)
        for r in rows:
            try:
                if "team" not in r:
                    r["team"] = self.team_of(r)
                r["price"] = self.price(r["gpu_model"], r["mig_profile"], r["gpu_count"], r["gpus"])
                cost = costs(r)
            except (ArithmeticError, TypeError, ValueError) as exc:
                refused.append((r, f"cost not computable: {type(exc).__name__}"))
                continue
            try:  # a finite sum means every number is finite (a NaN or an infinity makes the sum one)
                if math.isfinite(sum(values(r)) + cost[0] + cost[1]):
                    ok.append(r)
                    continue
            except (KeyError, TypeError):  # a None, a missing key or a non-number: the slow check says which
                pass
            named = {**{k: r.get(k) for k in keys}, **dict(zip(COST_KEYS, cost, strict=True))}
            bad = [k for k, v in named.items() if v is not None and not math.isfinite(float(v))]
            if bad:
                refused.append((r, f"not a finite number: {', '.join(bad)}"))
            else:  # finite numbers whose sum overflowed
                ok.append(r)
        return ok, refused


#: the money of a priced per-allocation row, in :func:`costs`' order (usage_allocation columns)
COST_KEYS = ("reserved_cost", "idle_cost")
#: the same money in SQL, over a row's columns (``{s}``: their table prefix) and its ``{price}``: how
#: usage_allocation is written (:mod:`auditor.audit.totals`). The one definition in two languages, operation
#: for operation (IEEE doubles give the same bits; tests/test_money_rows.py compares them on both engines)
COST_SQL = {"reserved_cost": "{s}reserved_s / 3600.0 * {price}",
            "idle_cost": "({s}idle_s + {s}mirage_s) / 3600.0 * {price}"}


def costs(r: dict[str, Any]) -> tuple[float, float]:
    """Reserved and idle (idle + mirage) cost of a priced per-allocation row (:data:`COST_SQL` in Python)."""
    return r["reserved_s"] / 3600 * r["price"], (r["idle_s"] + r["mirage_s"]) / 3600 * r["price"]
