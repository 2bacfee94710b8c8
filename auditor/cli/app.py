"""What every command shares: the App object (config, store, output mode), time options and the window.

Kept out of :mod:`auditor.cli` so command modules can import it without importing the group that registers
them (no import cycle whichever module is imported first)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from auditor import jsonsafe
from auditor.errors import GpuAuditError
from auditor.timeutil import parse_time, utcnow

if TYPE_CHECKING:
    from auditor import config as config_mod

#: auditor.config.ENV_VAR, spelled here so that `gpu-audit --help` does not import the config models
#: (pydantic); tests/test_cli.py checks the two agree
CONFIG_ENV = "GPU_AUDIT_CONFIG"


@dataclass
class App:
    """What every command gets: config, the store (opened on first use), output mode."""

    config_path: str | None
    as_json: bool = False
    debug: bool = False
    _cfg: config_mod.Config | None = None
    _store: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cfg(self) -> config_mod.Config:
        """The config, every source's options validated by its connector."""
        if self._cfg is None:
            import connectors

            self._cfg = connectors.load_config(self.config_path)
        return self._cfg

    @property
    def base_dir(self) -> Path:
        import os

        path = self.config_path or os.environ.get(CONFIG_ENV)
        return Path(path).resolve().parent if path else Path.cwd()

    @property
    def origin(self) -> str:
        """Where the settings came from, for messages: the config file, or the built-in defaults."""
        from auditor import config as config_mod

        path = config_mod.config_path(self.config_path)
        return f"config {path}" if path else (f"the built-in defaults, no config file read: pass -c FILE or set "
                                              f"${config_mod.ENV_VAR}")

    def store(self, *, migrate_check: bool = True, create: bool = False) -> Any:
        """The store. Only a command that writes passes ``create``: one that reads and finds no SQLite file
        says which config and file it looked for instead of creating an empty store (and its directories)
        from a typo or a forgotten -c. ``create`` with ``migrate_check`` migrates a store it just created."""
        if self._store is None:
            from auditor import config as config_mod
            from auditor.errors import StoreError
            from auditor.store.engine import Store

            url = self.cfg.store.resolved_url()
            file = config_mod.sqlite_file(url)
            new = file is not None and not file.exists()
            if new and not create:
                raise StoreError(f"no store at {file.resolve()} (store.url of {self.origin}): run `gpu-audit db "
                                 "upgrade` to create it")
            self._store = Store.open(url, self.cfg.store.batch_rows)
            if new and migrate_check:
                import logging

                self._store.upgrade()
                logging.getLogger("gpu_audit.store").info("created the store %s", self._store.redacted_url())
            elif migrate_check:
                self._store.require_current()
        return self._store

    def emit(self, data: Any, human: str | Callable[[], str]) -> None:
        """Print ``data`` as JSON with --json, else the human-readable text."""
        if self.as_json:
            click.echo(jsonsafe.dumps(data, indent=2, default=str, sort_keys=False))
        else:
            click.echo(human() if callable(human) else human)


pass_app = click.make_pass_decorator(App)


class FiniteRange(click.FloatRange):
    """A float option within [min, max] that is a real number: NaN and infinity are refused on one line
    (click's FloatRange lets NaN through, and both overflow later as "unexpected OverflowError")."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        import math

        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return rv


def time_option(name: str, help_text: str) -> Callable:
    return click.option(name, metavar="TIME", help=help_text + " sacct-style: 2026-11-22, 2026-11-22T08:00, "
                        "ISO 8601 basic 20261122, 20261122T0800, "
                        "11/22, 11/22/26, today, midnight, now, now-7days (UTC unless an offset is given).")


def check_time(dt: datetime | None, option: str) -> datetime | None:
    """A time option the store can hold (32-bit epoch seconds), else one line naming the option."""
    from auditor.store.guard import INT_MAX

    if dt is not None and not 0 <= dt.timestamp() <= INT_MAX:
        raise GpuAuditError(f"{option} {dt.isoformat()} is out of range (times from 1970-01-01 to "
                            "2038-01-19 UTC)")
    return dt


#: A window longer than this is refused without --long-window: a slip such as an epoch read for a date asked
#: for an audit of 56 years (issue 44)
MAX_WINDOW_DAYS = 400
#: ...and so is a --since further than this before the store's first allocation (a month: a calendar period
#: begun before a new store's first collection is normal)
EARLY_DAYS = 31


def long_window_option(f: Callable) -> Callable:
    return click.option("--long-window", is_flag=True, help=f"Allow a window longer than {MAX_WINDOW_DAYS} days "
                        f"or starting more than {EARLY_DAYS} days before the store's first allocation (refused "
                        "otherwise, in one line: usually a mistyped --since).")(f)


def plausible(app: App, start: datetime, end: datetime) -> None:
    """Refuse (one line) a window implausibly long, or starting long before the store's first data."""
    days = (end - start).total_seconds() / 86400
    if days > MAX_WINDOW_DAYS:
        raise GpuAuditError(f"the window {start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M} UTC is {days:,.0f} days "
                            f"long (more than {MAX_WINDOW_DAYS}): check --since, or pass --long-window")
    from sqlalchemy import func, select

    from auditor.store import schema

    with app.store().engine.connect() as conn:
        first = conn.execute(select(func.min(schema.allocations.c.start_ts))).scalar()
    if first is not None and start.timestamp() < first - EARLY_DAYS * 86400:
        shown = datetime.fromtimestamp(first, UTC)
        raise GpuAuditError(f"--since {start:%Y-%m-%d %H:%M} UTC is more than {EARLY_DAYS} days before the store's "
                            f"first allocation ({shown:%Y-%m-%d %H:%M} UTC): check --since, or pass --long-window")


def window(app: App, since: str | None, until: str | None, *,
           long_window: bool | None = None) -> tuple[datetime, datetime]:
    """--since/--until, defaulting to the last `report.days` days. ``long_window`` False (a command that
    stores an audit of the window, without --long-window): refuse an implausible window (:func:`plausible`)."""
    try:
        end = parse_time(until) if until else utcnow()
        start = parse_time(since, now=end) if since else end - timedelta(days=app.cfg.report.days)
    except (ValueError, OverflowError) as exc:
        raise GpuAuditError(str(exc)) from None
    check_time(start, "--since")
    check_time(end, "--until")
    if end <= start:
        raise GpuAuditError(f"--until {end.isoformat()} is not after --since {start.isoformat()}")
    if long_window is False:
        plausible(app, start, end)
    return start, end
