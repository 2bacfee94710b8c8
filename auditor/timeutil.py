"""Time parsing and conversion in one place: everything stored is UTC epoch seconds."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta

#: Seconds per hour: GPU-seconds / H = GPU-hours (the one copy; the audit, reports and enforcement import it)
H = 3600.0

_REL = re.compile(r"^now(?:([-+])([0-9]+(?:\.[0-9]+)?)\s*(days?|d|hours?|h|minutes?|min|m|weeks?|w|seconds?|s))?$")
_UNITS = {"d": 86400, "day": 86400, "days": 86400, "h": 3600, "hour": 3600, "hours": 3600,
          "m": 60, "min": 60, "minute": 60, "minutes": 60, "w": 604800, "week": 604800, "weeks": 604800,
          "s": 1, "second": 1, "seconds": 1}
#: sacct's named times of day (hour), each the latest such time at or before now (sacct reads them as past times)
_NAMED = {"today": 0, "midnight": 0, "noon": 12, "elevenses": 11, "fika": 15, "teatime": 16}
#: sacct's MM/DD[/YY][-HH:MM[:SS]]; without a year, the latest such date at or before now
_SLASH = re.compile(r"^([0-9]{1,2})/([0-9]{1,2})(?:/([0-9]{2}|[0-9]{4}))?"
                    r"(?:-([0-9]{1,2}):([0-9]{2})(?::([0-9]{2}))?)?$")
FORMS = ("YYYY-MM-DD[THH:MM[:SS]], YYYYMMDD[THHMM[SS]], MM/DD[/YY][-HH:MM], today, midnight, now, now-7days or "
         "epoch seconds")


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
    """Parse sacct-style and ISO times (the one parser of every time the CLI takes): ``2026-11-22``,
    ``2026-11-22T08:00[:00]``, ISO with ``Z``/offset, epoch seconds, and sacct's ``now``, ``now-7days``
    (``now+1h``), ``today``/``midnight`` (this day's 00:00), ``noon``, ``MM/DD``, ``MM/DD/YY`` and
    ``MM/DD[/YY]-HH:MM[:SS]``. Naive times, and the days of the named ones, are taken in ``assume_tz`` (UTC by
    default); ``now`` (default: the clock) is what the relative and named forms count from."""
    s = text.strip()
    now = now or utcnow()
    low = s.lower()
    m = _REL.match(low)
    if m:
        if not m.group(1):
            return now
        try:
            delta = timedelta(seconds=float(m.group(2)) * _UNITS[m.group(3)])
            return now - delta if m.group(1) == "-" else now + delta
        except OverflowError:
            raise ValueError(f"time {text!r} is out of range") from None
    if low in _NAMED or _SLASH.match(s):
        return _sacct(s, low, now, assume_tz)
    if re.fullmatch(r"[0-9]{8}", s):  # ISO 8601 basic date (20261122): never epoch seconds (1970-08-24)
        s = f"{s[:4]}-{s[4:6]}-{s[6:]}"
    elif re.fullmatch(r"[0-9]{1,19}(\.[0-9]+)?", s):
        return from_epoch_any(s)
    if not s.isascii():
        raise ValueError(f"cannot parse time {text[:40]!r} (use {FORMS})")
    try:
        if re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", s):
            d = date.fromisoformat(s)
            dt = datetime(d.year, d.month, d.day)
        else:  # extended or ISO 8601 basic (20261122T0800, 20261122T080000Z): Python >= 3.11 reads both
            dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"cannot parse time {text!r} (use {FORMS})") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=assume_tz)  # type: ignore[arg-type]
    return _utc(dt, text)


def _utc(dt: datetime, text: str) -> datetime:
    try:
        return dt.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00 is before year 1 in UTC
        raise ValueError(f"time {text[:40]!r} is out of range (before year 1 or after 9999 in UTC)") from None


def _sacct(s: str, low: str, now: datetime, tz: object) -> datetime:
    """A named time of day or an MM/DD date, in ``tz``, as sacct reads them: the latest at or before ``now``."""
    local = now.astimezone(tz)  # type: ignore[arg-type]
    try:
        if low in _NAMED:
            dt = local.replace(hour=_NAMED[low], minute=0, second=0, microsecond=0)
            return _utc(dt - timedelta(days=1) if dt > local else dt, s)
        m = _SLASH.match(s)
        assert m is not None
        month, day, year = int(m.group(1)), int(m.group(2)), m.group(3)
        hms = (int(m.group(4) or 0), int(m.group(5) or 0), int(m.group(6) or 0))
        if year is not None:
            y = int(year) + (2000 if len(year) == 2 else 0)
            return _utc(datetime(y, month, day, *hms, tzinfo=tz), s)  # type: ignore[arg-type]
        dt = datetime(local.year, month, day, *hms, tzinfo=tz)  # type: ignore[arg-type]
        return _utc(dt.replace(year=local.year - 1) if dt > local else dt, s)
    except (ValueError, OverflowError):  # 02/30, 13/01, 25:00; the day before year 1
        raise ValueError(f"cannot parse time {s[:40]!r}: no such date or time (use {FORMS})") from None


def floor_to(dt: datetime, seconds: int) -> datetime:
    ts = int(dt.timestamp())
    return datetime.fromtimestamp(ts - ts % seconds, UTC)


def ceil_to(dt: datetime, seconds: int) -> datetime:
    ts = int(dt.timestamp())
    return datetime.fromtimestamp(ts + (-ts) % seconds, UTC)
