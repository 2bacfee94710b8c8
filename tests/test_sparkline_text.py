"""The findings' sparklines are kept as the store's JSON text and spliced into the evidence
(auditor.audit.sparklines, auditor.jsonsafe.with_member): what a reader parses must be what the numbers were,
and strict JSON (no NaN token) whatever the store returned."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from auditor import jsonsafe
from auditor.audit.sparklines import SPARK_BINS, sparkline_json


def strict(s: str) -> Any:
    def bad(token: str) -> None:
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(s, parse_constant=bad)


def test_bin_text_is_what_python_writes() -> None:
    """Reports copy the stored evidence text (SQLite's json_remove) or parse and re-encode it (the in-memory
    path): the same bytes only if each bin is written as json.dumps writes that float. Every value with 3
    decimals in [-2, 2], and some large ones, in the stores' forms (SQLite printf %.3f, PostgreSQL
    round(numeric, 3)::text)."""
    from auditor.audit.sparklines import _number

    for i in range(-2000, 2001):
        text = f"{i / 1000:.3f}"
        assert _number(text) == json.dumps(float(text)), text
    for text in ("-0.000", "100.000", "123456789.125", "12345678901234567.000", "1e+20"):
        assert _number(text) == json.dumps(float(text)), text


def test_sparkline_text_parses_to_the_bins() -> None:
    # by hand: bin 0 = 0.12 / 0.5; bin 3 has no SM reading (''), GPU-Util 0.25; bin 47 read NaN (no JSON
    # number: null) and -0.000 (minus zero); bin 48 is outside the 48 bins (0..47) and ignored; all else null
    packed = "0:0.120:0.500;3::0.250;47:NaN:-0.000;48:1.000:1.000;5:Infinity:inf"
    got = strict(sparkline_json(packed))
    assert len(got["sm"]) == len(got["util"]) == SPARK_BINS
    assert got["sm"][0] == 0.12 and got["util"][0] == 0.5
    assert got["sm"][3] is None and got["util"][3] == 0.25
    assert got["sm"][47] is None and got["util"][47] == 0.0 and math.copysign(1, got["util"][47]) == -1
    assert got["sm"][5] is None and got["util"][5] is None
    assert [i for i, v in enumerate(got["sm"]) if v is not None] == [0]
    assert strict(sparkline_json("")) == {"sm": [None] * SPARK_BINS, "util": [None] * SPARK_BINS, "bin_hours": 1}
    # 3 bins of 4 hours (a 12-hour job): bin 3 is past them
    got = strict(sparkline_json("0:0.500:0.900;2:0.250:;3:1.000:1.000", 3, 4))
    assert got == {"sm": [0.5, None, 0.25], "util": [0.9, None, None], "bin_hours": 4}


@pytest.mark.parametrize(("obj", "want"), [
    ({}, {"sparkline": [1, None]}),
    ({"a": {}}, {"a": {}, "sparkline": [1, None]}),
    ({"rule": 'say "}" {', "n": [1.5]}, {"rule": 'say "}" {', "n": [1.5], "sparkline": [1, None]}),
])
def test_with_member_appends_the_text(obj: dict[str, Any], want: dict[str, Any]) -> None:
    text = jsonsafe.with_member(jsonsafe.dumps(obj), "sparkline", "[1, null]")
    assert strict(text) == want and list(strict(text))[-1] == "sparkline"
    assert jsonsafe.dumps(text) == text  # Encoded: a JSON column stores it as it is, not as a JSON string


def test_with_member_refuses_what_is_no_object() -> None:
    with pytest.raises(ValueError, match="not a JSON object"):
        jsonsafe.with_member("[1, 2]", "k", "1")
