"""One line from a driver error, fit to show: its first line, with every secret this process resolved
scrubbed out."""

from __future__ import annotations


def first_line(exc: BaseException) -> str:
    from auditor.logs import scrub

    msg = str(getattr(exc, "orig", None) or exc)
    line = msg.strip().splitlines()[0] if msg.strip() else type(exc).__name__
    return scrub(line)
