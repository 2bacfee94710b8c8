"""One line from a driver error, fit to show: its first line, rewritten by the store's modules that know more
than the driver says (:mod:`auditor.store.shards` names the shard behind a postgres_fdw foreign server), with
every secret this process resolved scrubbed out."""

from __future__ import annotations

from collections.abc import Callable

#: rewrites of a driver message's first line, registered by the modules that own what it names
REWRITES: list[Callable[[str], str]] = []


def first_line(exc: BaseException) -> str:
    from auditor.logs import scrub

    msg = str(getattr(exc, "orig", None) or exc)
    line = msg.strip().splitlines()[0] if msg.strip() else type(exc).__name__
    for rewrite in REWRITES:
        line = rewrite(line)
    return scrub(line)
