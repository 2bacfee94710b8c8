"""Pricing.price_rows refuses exactly the per-allocation rows holding a number that is not finite, naming
it, and accepts rows of finite numbers, also when their sum would overflow (the check sums first)."""

from __future__ import annotations

import math

from auditor.audit.money import Pricing, costs
from auditor.config import Config

KEYS = ["reserved_s", "idle_s", "mirage_s", "working_s", "gpu_count"]


def _row(**over: float | None) -> dict:
    r = {"allocation_id": 1, "gpu_model": "h100", "mig_profile": None, "gpus": 1, "labels": None,
         "account": "a", "source": "slurm", "user_name": "u",
         "reserved_s": 7200.0, "idle_s": 3600.0, "mirage_s": 0.0, "working_s": 3600.0, "gpu_count": 1}
    r.update(over)
    return r


def test_only_rows_with_a_non_finite_number_are_refused_and_the_key_is_named() -> None:
    p = Pricing(Config(prices={"default": 2.0}))
    rows = [_row(), _row(working_s=math.nan), _row(mirage_s=math.inf), _row(working_s=1e308, idle_s=1e308),
            _row(gpu_count=None)]
    ok, refused = p.price_rows(rows, KEYS)
    # 2 h at 2.0 = 4.0 reserved; 1 h idle = 2.0 idle cost
    assert [costs(r) for r in ok[:1]] == [(4.0, 2.0)]
    assert len(ok) == 3 and ok[1]["working_s"] == 1e308 and ok[2]["gpu_count"] is None
    assert [why for _, why in refused] == ["not a finite number: working_s",
                                           "not a finite number: mirage_s, idle_cost"]


def test_the_sql_costs_are_the_python_costs_bit_for_bit(store) -> None:  # type: ignore[no-untyped-def]
    """usage_allocation's costs are computed in SQL (money.COST_SQL, auditor/audit/totals.py) and the rules'
    figures in Python (money.costs): the same operations give the same doubles on both engines, on values
    whose roundings differ between operation orders (x / 3600 * p is not x * p / 3600 for these)."""
    from sqlalchemy import text

    from auditor.audit.money import COST_KEYS, COST_SQL

    cases = [(7200.0, 3600.0, 0.0, 2.0), (1.0, 0.1, 0.2, 3.7), (86399.9, 1234.5, 678.9, 1.1 / 3),
             (123456.789, 1e-3, 7.77, 4.35), (2.5e7, 1.25e7, 3.3e6, 0.07)]
    sel = ", ".join(f"{COST_SQL[k].format(s='', price='price')} AS {k}" for k in COST_KEYS)
    with store.engine.connect() as conn:
        for reserved, idle, mirage, price in cases:
            row = conn.execute(text(f"SELECT {sel} FROM (SELECT CAST(:r AS FLOAT) AS reserved_s, CAST(:i AS FLOAT) "
                                    "AS idle_s, CAST(:m AS FLOAT) AS mirage_s, CAST(:p AS FLOAT) AS price) x"),
                               {"r": reserved, "i": idle, "m": mirage, "p": price}).one()
            want = costs({"reserved_s": reserved, "idle_s": idle, "mirage_s": mirage, "price": price})
            assert tuple(row) == want, (reserved, idle, mirage, price)
