"""The ``gpu-audit`` command: a thin layer over the library API (sqlite-utils style).

Named errors become one line on stderr and a non-zero exit; ``--debug`` shows the traceback. Feature areas
add their commands from their own modules, each exposing ``register(group)`` and listed once in
``COMMAND_MODULES``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from auditor.cli import core, db, deploy, enforce, jobs, money, report, serve, web
from auditor.cli.app import CONFIG_ENV, App, pass_app, time_option, window  # noqa: F401
from auditor.errors import EXIT_ERROR, GpuAuditError
from auditor.logs import log_safe

#: The one registration list: every command module, each with ``register(group)`` (they import only
#: auditor.cli.app, so importing them here first is no cycle)
COMMAND_MODULES = (core, money, serve, report, db, jobs, web, enforce, deploy)


class OneLineError(click.ClickException):
    """A click error (a usage error: an unknown option, a missing argument, a bad value) shown as one line like
    every other error, naming where help is, instead of click's usage block; its exit code is kept (2 for
    usage errors)."""

    def __init__(self, exc: click.ClickException) -> None:
        super().__init__(" ".join(exc.format_message().split()))
        self.exit_code = exc.exit_code
        ctx = getattr(exc, "ctx", None)
        self.where = ctx.command_path if isinstance(exc, click.UsageError) and ctx is not None else ""

    def show(self, file: Any = None) -> None:
        hint = f" (see `{self.where} --help`)" if self.where else ""
        click.echo(f"gpu-audit: error: {log_safe(self.message)}{hint}", err=True)


def one_line_error(exc: click.ClickException) -> click.ClickException:
    """``exc`` as :class:`OneLineError`, except help shown for a group called without a command."""
    if isinstance(exc, (OneLineError, click.exceptions.NoArgsIsHelpError)):
        return exc
    return OneLineError(exc)


class Cli(click.Group):
    """Turns GpuAuditError and click's usage errors into one line (exit 1, and 2 for usage); everything else
    keeps its traceback under --debug."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.ClickException as exc:  # the group's own options: `gpu-audit --bogus`
            raise one_line_error(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        from auditor.logs import scrub

        try:
            return super().invoke(ctx)
        except click.ClickException as exc:  # a subcommand's options and arguments, and errors it raised
            raise one_line_error(exc) from None
        except (click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            if _debug(ctx):  # the traceback, with every secret this process resolved scrubbed out of it
                import traceback

                click.echo(scrub("".join(traceback.format_exception(exc))), err=True, nl=False)
            named = _store_failure(ctx, exc)
            if named is not None:
                exc = named
            text = scrub(str(exc).strip())
            first = log_safe(text.splitlines()[0]) if text else ""
            if isinstance(exc, GpuAuditError):
                click.echo(f"gpu-audit: error: {first}", err=True)
            else:
                click.echo(f"gpu-audit: unexpected {type(exc).__name__}: {first}"
                           " (run with --debug for the traceback)", err=True)
            ctx.exit(EXIT_ERROR)


def _store_failure(ctx: click.Context, exc: Exception) -> GpuAuditError | None:
    """The database driver's answer when the store cannot be reached or used (a PostgreSQL database that does
    not exist, a refused password, a server that is down) as a named one-line error naming the store, not
    "unexpected OperationalError"."""
    from sqlalchemy.exc import InterfaceError, OperationalError

    if not isinstance(exc, (OperationalError, InterfaceError)):
        return None
    from auditor.errors import StoreError

    app = ctx.find_object(App)
    where = "the store"
    if app is not None and app._store is not None:
        where = f"store {app._store.redacted_url()}"
    reason = " ".join(str(getattr(exc, "orig", None) or exc).split())
    return StoreError(f"cannot use {where}: {reason or type(exc).__name__}")


def _debug(ctx: click.Context) -> bool:
    app = ctx.find_object(App)
    return bool(app and app.debug) or "--debug" in sys.argv


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "-c", "config_path", envvar=CONFIG_ENV, type=click.Path(dir_okay=False),
              help="TOML config file (default: $GPU_AUDIT_CONFIG, else built-in defaults).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.option("--quiet", "-q", is_flag=True, help="Only warnings and errors in the log.")
@click.version_option(package_name="gpu-audit")
@click.pass_context
def main(ctx: click.Context, config_path: str | None, as_json: bool, debug: bool, quiet: bool) -> None:
    """gpu-audit: find reserved GPUs that did no work, prove it with SM activity, and price it."""
    from auditor.logs import setup_logging

    setup_logging(logging.DEBUG if debug else logging.WARNING if quiet else logging.INFO)
    ctx.obj = App(config_path, as_json=as_json, debug=debug)


@main.group("config")
def config_group() -> None:
    """Configuration."""


@config_group.command("check")
@click.option("--probe", is_flag=True, help="Also connect to the store and to every source once and say which "
              "answer (exit 1 when one does not).")
@pass_app
def config_check(app: App, probe: bool) -> None:
    """Validate the config file (every connector's options included): every error on its own line, an unknown
    key or connector kind with the nearest known one; else a summary. Warns when no config file was read."""
    from auditor.configdoc import check

    checked = check(app.config_path, files=not probe)  # --probe: a source naming no file is its FAIL line
    if checked.config is None:
        if app.as_json:
            app.emit({"ok": False, "errors": checked.errors, "warnings": checked.warnings}, "")
        else:
            for line in checked.errors:
                click.echo(f"gpu-audit: error: {log_safe(line)}", err=True)
        raise click.exceptions.Exit(EXIT_ERROR)
    if not app.as_json:
        for line in checked.warnings:
            click.echo(f"gpu-audit: warning: {line}", err=True)
    app._cfg = cfg = checked.config
    data = {"clusters": [{"name": c.name, "allocations": [s.kind for s in c.allocations],
                          "telemetry": [s.kind for s in c.telemetry]} for c in cfg.clusters],
            "store": _redacted(cfg.store.url) if not cfg.store.url_env else f"${cfg.store.url_env}",
            "teams": [t.name for t in cfg.teams], "warnings": checked.warnings}
    if probe:
        from dataclasses import asdict

        from auditor.probe import probe_all

        probes = probe_all(cfg, app.base_dir)
        ok = all(p.ok for p in probes)
        app.emit({"ok": ok, **data, "probes": [asdict(p) for p in probes]}, lambda: "\n".join(
            f"{'ok  ' if p.ok else 'FAIL'} {p.what} ({p.target}): {p.detail}" for p in probes)
            + ("\nconfig ok, everything answers" if ok else
               f"\nconfig valid, but {sum(not p.ok for p in probes)} of {len(probes)} do not answer"))
        if not ok:
            raise click.exceptions.Exit(EXIT_ERROR)
        return
    app.emit({"ok": True, **data}, lambda: "config ok: " + ", ".join(
        f"{c['name']} (allocations: {', '.join(c['allocations']) or '-'}; telemetry: "
        f"{', '.join(c['telemetry']) or '-'})" for c in data["clusters"]) if data["clusters"]
        else "config ok (no clusters configured)")


def _redacted(url: str) -> str:
    """A store URL fit to print: the password, in userinfo or query parameters, replaced by ***."""
    from auditor.logs import redact_url

    return redact_url(url)


for _module in COMMAND_MODULES:
    _module.register(main)


def _late_config(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """``-c FILE`` given after the command: the same as before it (the later one wins)."""
    app = ctx.find_object(App)
    if value is not None and app is not None:
        app.config_path, app._cfg, app._store = value, None, None
    return value


def _accept_config_after(cmd: click.Command) -> None:
    """Every command takes -c/--config after its name too (`gpu-audit report -c site.toml`), as users type it."""
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            _accept_config_after(sub)
        return
    if not any(o in ("-c", "--config") for p in cmd.params for o in getattr(p, "opts", ())):
        cmd.params.insert(0, click.Option(["--config", "-c", "late_config"], type=click.Path(dir_okay=False),
                                          expose_value=False, is_eager=True, callback=_late_config,
                                          help="TOML config file, as the global -c/--config (given here too)."))


_accept_config_after(main)
