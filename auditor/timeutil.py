"""Time parsing and conversion in one place: everything stored is UTC epoch seconds."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta

#: Seconds per hour: GPU-seconds / H = GPU-hours (the one copy; the audit, reports and enforcement import it)
H = 3600.0

_REL = re.compile(r"^now(?:-([0-9]+(?:\.[0-9]+)?)\s*(days?|d|hours?|h|minutes?|min|m|weeks?|w))?$")
_UNITS = {"d": 86400, "day": 86400, "days": 86400, "h": 3600, "hour": 3600, "hours": 3600,
          "m": 60, "min": 60, "minute": 60, "minutes": 60, "w": 604800, "week": 604800, "weeks": 604800}


def utcnow() -> datetime:
    return datetime.now(UTC)


def to_epoch(dt: datetime | None) -> int | None:
    if dt is None:
        return None
    if dt.tzinfo is None:
        raise ValueError(f"naive datetime {dt.isoformat()} (times must carry a timezone)")
    return int(dt.timestamp())


def from_epoch(ts: int | float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC)


def from_epoch_any(s: str) -> datetime:
    """Epoch of any size: seconds up to 11 digits (traces start at 0), then milliseconds (12-14 digits),
    microseconds (15-17) and nanoseconds (18-19), as exporters and trace files write them."""
    digits = len(s.split(".", 1)[0])
    scale = 1 if digits <= 11 else 1e3 if digits <= 14 else 1e6 if digits <= 17 else 1e9
    try:
        return datetime.fromtimestamp(float(s) / scale, UTC)
    except (OverflowError, OSError, ValueError):
        raise ValueError(f"epoch time {s[:24]!r} is out of range") from None


def parse_time(text: str, *, now: datetime | None = None, assume_tz: object = UTC) -> datetime:
    """Parse sacct-style and ISO times: ``2026-11-22``, ``2026-11-22T08:00[:00]``, ``now``, ``now-7days``,
    ISO with ``Z``/offset, or epoch seconds. Naive times are taken in ``assume_tz`` (UTC by default)."""
    s = text.strip()
    now = now or utcnow()
    m = _REL.match(s.lower())
    if m:
        if not m.group(1):
            return now
        try:
            return now - timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])
        except OverflowError:
            raise ValueError(f"time {text!r} is out of range") from None
    if re.fullmatch(r"[0-9]{1,19}(\.[0-9]+)?", s):
        return from_epoch_any(s)
    if not s.isascii():
        raise ValueError(f"cannot parse time {text[:40]!r} (use YYYY-MM-DD[THH:MM[:SS]], now-7days or epoch)")
    try:
        if re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", s):
            d = date.fromisoformat(s)
            dt = datetime(d.year, d.month, d.day)
        else:
            dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"cannot parse time {text!r} (use YYYY-MM-DD[THH:MM[:SS]], now-7days or epoch)")\
            from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=assume_tz)  # type: ignore[arg-type]
    try:
        return dt.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00 is before year 1 in UTC
        raise ValueError(f"time {text[:40]!r} is out of range (before year 1 or after 9999 in UTC)") from None


def floor_to(dt: datetime, seconds: int) -> datetime:
    ts = int(dt.timestamp())
    return datetime.fromtimestamp(ts - ts % seconds, UTC)


def ceil_to(dt: datetime, seconds: int) -> datetime:
    ts = int(dt.timestamp())
    return datetime.fromtimestamp(ts + (-ts) % seconds, UTC)
