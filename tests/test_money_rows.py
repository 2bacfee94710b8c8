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
