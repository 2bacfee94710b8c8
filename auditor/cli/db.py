"""``gpu-audit db``: the SQL store's migrations, documented schema and retention (:mod:`auditor.store.retention`)."""

from __future__ import annotations

import click

from auditor.cli.app import App, FiniteRange, pass_app, time_option
from auditor.errors import GpuAuditError


def register(main: click.Group) -> None:
    @main.group()
    def db() -> None:
        """The SQL store: migrations, schema and retention."""

    @db.command("upgrade")
    @click.option("--revision", default="head", show_default=True, help="Target Alembic revision.")
    @pass_app
    def db_upgrade(app: App, revision: str) -> None:
        """Create or migrate the store's tables."""
        store = app.store(migrate_check=False, create=True)
        store.upgrade(revision)
        app.emit({"store": store.redacted_url(), "revision": store.current()},
                 f"store {store.redacted_url()} at revision {store.current()}")

    @db.command("current")
    @pass_app
    def db_current(app: App) -> None:
        """Show the store's migration revision and the newest one this version knows."""
        store = app.store(migrate_check=False)
        cur, head = store.current(), store.head()
        app.emit({"store": store.redacted_url(), "current": cur, "head": head},
                 f"{store.redacted_url()}: revision {cur or 'none'} (head {head})"
                 + ("" if cur == head else " - run `gpu-audit db upgrade`"))

    @db.command("schema")
    @pass_app
    def db_schema(app: App) -> None:
        """Print the documented schema (Markdown) of every table and column."""
        from auditor.store.schemadoc import schema_markdown

        click.echo(schema_markdown())

    @db.command("prune")
    @click.option("--keep-weeks", default=8.0, show_default=True, type=FiniteRange(min=0, max=520),
                  help="Keep 5-minute buckets (GPU telemetry and inference servers) this many weeks; older "
                       "ones are rolled up to hourly buckets.")
    @click.option("--keep-runs-days", default=42.0, show_default=True, type=FiniteRange(min=0, max=3660),
                  help="Delete audit runs (with their usage and findings) started more than this many days ago; "
                       "the newest official run is always kept.")
    @click.option("--dry-run", is_flag=True, help="Only count what would be rolled up and deleted.")
    @time_option("--now", "Pretend it is this time (default: now).")
    @pass_app
    def db_prune(app: App, keep_weeks: float, keep_runs_days: float, dry_run: bool, now: str | None) -> None:
        """Roll old telemetry and inference buckets up to hourly ones and delete old audit runs."""
        from auditor.errors import GpuAuditError
        from auditor.store.retention import prune
        from auditor.timeutil import from_epoch, parse_time, utcnow

        try:
            when = parse_time(now) if now else utcnow()
        except ValueError as exc:
            raise GpuAuditError(str(exc)) from None
        res = prune(app.store(), now=int(when.timestamp()), keep_weeks=keep_weeks,
                    keep_runs_days=keep_runs_days, dry_run=dry_run)
        cut = from_epoch(res.cutoff_ts)
        verb = "would roll up" if dry_run else "rolled up"
        app.emit(res.as_dict(), f"{verb} {res.fine_rows_rolled:,} buckets older than {cut:%Y-%m-%d %H:%M} UTC"
                 + ("" if dry_run else f" into {res.hourly_rows_written:,} hourly buckets")
                 + f", {res.inference_rows_rolled:,} inference buckets"
                 + ("" if dry_run else f" into {res.inference_hourly_rows_written:,} hourly ones")
                 + f"; {'would delete' if dry_run else 'deleted'} {res.runs_deleted} audit runs")

    @db.command("shard", hidden=True, context_settings={"ignore_unknown_options": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def db_shard(args: tuple[str, ...]) -> None:
        """Removed: see docs/scale-out.md."""
        raise GpuAuditError(RETIRED.format("shard"))

    @db.command("shards", hidden=True, context_settings={"ignore_unknown_options": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def db_shards(args: tuple[str, ...]) -> None:
        """Removed: see docs/scale-out.md."""
        raise GpuAuditError(RETIRED.format("shards"))


#: `db shard` and `db shards` spread one store over postgres_fdw shards; the product scales by partition now
RETIRED = ("`gpu-audit db {}` was removed: past one PostgreSQL server run one store per cluster (or node group), "
           "each with its own daemon, and read them together from `gpu-audit export` (docs/scale-out.md)")
