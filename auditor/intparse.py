"""The one reader of whole numbers from outside text: CLI options, web parameters, scheduler and exporter
output. ASCII digits only, the whole string, bounded.

Python's own tools accept more than a scheduler or a database does: ``int()`` takes full-width and other
Unicode digits, surrounding blanks and ``_``; ``str.isdigit()`` is true for ``"²"``, which ``int()`` then
refuses; a regex ``\\d`` is Unicode and ``$`` matches before a trailing newline. Text that passed such a
check reached ``scancel``'s argv as ``"104\\n"`` and made a web page answer HTTP 500. Everything that reads
an integer from text an outsider wrote goes through :func:`parse_uint` (or matches :data:`UINT`).
"""

from __future__ import annotations

import re

MAX_DIGITS = 19
#: the regex of one unsigned integer, for patterns built on it (a Slurm job id is ``UINT(_UINT)?(+UINT)?``);
#: always use it with ``re.fullmatch``
UINT = rf"[0-9]{{1,{MAX_DIGITS}}}"
INT64_MAX = 2**63 - 1  # the store's BIGINT; SQLite's INTEGER; anything larger is no id we hold
INT32_MAX = 2**31 - 1  # the store's INTEGER columns on PostgreSQL (ids, GPU indices)
_UINT = re.compile(UINT)


def parse_uint(text: object, *, hi: int = INT64_MAX, what: str = "value") -> int:
    """``text`` as a non-negative integer no larger than ``hi``, or ValueError with one line saying why."""
    s = text if isinstance(text, str) else str(text)
    if not _UINT.fullmatch(s):
        shown = s if len(s) <= 24 else s[:20] + "..."
        raise ValueError(f"{what} {shown!r} is not a whole number (ASCII digits 0-9, at most {MAX_DIGITS})")
    n = int(s)
    if n > hi:
        raise ValueError(f"{what} {s} is out of range (at most {hi})")
    return n


def uint_or_none(text: object, *, hi: int = INT64_MAX) -> int | None:
    """:func:`parse_uint`, or None where the text is not such a number (for optional labels)."""
    try:
        return parse_uint(text, hi=hi)
    except ValueError:
        return None
