"""``gpu-audit db``: the SQL store's migrations, documented schema and retention (:mod:`auditor.store.retention`)."""

from __future__ import annotations

import click

from auditor.cli.app import App, FiniteRange, pass_app, time_option


def register(main: click.Group) -> None:
    @main.group()
    def db() -> None:
        """The SQL store: migrations, schema and retention."""

    @db.command("upgrade")
    @click.option("--revision", default="head", show_default=True, help="Target Alembic revision.")
    @pass_app
    def db_upgrade(app: App, revision: str) -> None:
        """Create or migrate the store's tables."""
        from auditor.store import sharding

        store = app.store(migrate_check=False, create=True)
        sharding.upgrade(store, revision)  # a sharded store: its shards first
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

    @db.command("shard")
    @click.argument("urls", nargs=-1)
    @click.option("--urls-file", type=click.Path(dir_okay=False, exists=True),
                  help="File with one shard URL per line (# comments); the way to give URLs with passwords.")
    @click.option("--urls-env", metavar="NAME",
                  help="Environment variable holding the shard URLs, separated by whitespace.")
    @pass_app
    def db_shard(app: App, urls: tuple[str, ...], urls_file: str | None, urls_env: str | None) -> None:
        """Spread the per-GPU tables over PostgreSQL shards (postgres_fdw; docs/scale-out.md).

        URLS are postgresql+psycopg://USER@HOST:PORT/DB (add ?options=-csearch_path%3DSCHEMA for a schema), shard
        1 first. Idempotent: run it again with the same URLs to check them or change a host or password; a
        database that is not empty and not a shard of this store is refused."""
        from auditor.store import sharding, shards

        given = _shard_urls(urls, urls_file, urls_env)
        res = sharding.setup(app.store(), given)
        app.emit(res, lambda: "\n".join(
            [f"shard {s['shard']}: {s['location']}: {s['state']}" for s in res["shards"]]
            + [f"{', '.join(shards.SHARDED)}: foreign partitions over {len(res['shards'])} shards"
               + (f"; {res['moved_rows']:,} bucket rows moved to the shards" if res["moved_rows"] else "")]))

    @db.command("shards")
    @pass_app
    def db_shards(app: App) -> None:
        """Each server of the store (the coordinator, then each shard): rows of the per-GPU tables and size."""
        from auditor.store import sharding, shards

        rows = sharding.sizes(app.store())

        def human() -> str:
            out = []
            for r in rows:
                counts = ", ".join(f"{t} {r[t]:,}" for t in shards.SHARDED if t in r)
                gpus = f", {r['gpus']:,} GPUs" if "gpus" in r else ""
                out.append(f"{r['server']}: {r['location']}: {r['bytes'] / 2**20:,.1f} MiB{gpus}"
                           + (f"; {counts}" if counts else ""))
            return "\n".join(out)

        app.emit(rows, human)


def _shard_urls(urls: tuple[str, ...], urls_file: str | None, urls_env: str | None) -> list[str]:
    """The shard URLs from the arguments, a file or an environment variable (one source). A password given
    as an argument is refused: every user of the machine can read a process's arguments."""
    import os

    from auditor.config.base import read_secret_file
    from auditor.errors import GpuAuditError
    from auditor.store.sharding import parse_target

    if sum(map(bool, (urls, urls_file, urls_env))) != 1:
        raise GpuAuditError("give the shard URLs one way: as arguments, --urls-file or --urls-env")
    if urls_file:
        from pathlib import Path

        read_secret_file(Path(urls_file), "--urls-file")  # warns when others can read it
        text = Path(urls_file).read_text(encoding="utf-8")
        found = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    elif urls_env:
        if urls_env not in os.environ:
            raise GpuAuditError(f"--urls-env: environment variable {urls_env} is not set")
        found = os.environ[urls_env].split()
    else:
        found = list(urls)
        if any(parse_target(u).url.password for u in found):
            raise GpuAuditError("a shard URL with a password on the command line: put the URLs in a file "
                                "(--urls-file, mode 600) or an environment variable (--urls-env)")
    for u in found:
        parse_target(u)  # its secret is registered before anything could print it
    return found
