"""``gpu-audit serve``: the scheduling daemon (see docs/operations.md)."""

from __future__ import annotations

import logging
from datetime import timedelta

import click

from auditor.cli.app import App, FiniteRange, pass_app
from auditor.errors import GpuAuditError

log = logging.getLogger("gpu_audit.serve")


def collect_period_s(trigger: object, now: object) -> float:
    """Seconds between two collect firings (the default health max age is three of them)."""
    first = trigger.get_next_fire_time(None, now)  # type: ignore[attr-defined]
    second = trigger.get_next_fire_time(first, first + timedelta(seconds=1))  # type: ignore[attr-defined]
    return (second - first).total_seconds() if first and second else 300.0


def register(main: click.Group) -> None:
    @main.command()
    @click.option("--listen", default="127.0.0.1:9464", show_default=True,
                  help="HOST:PORT of /healthz and /metrics; 'off' disables the HTTP server.")
    @click.option("--once-now", is_flag=True, help="Also run collect and audit once right at start-up.")
    @click.option("--per-cluster", is_flag=True, help="One collect job per cluster (same cron, own lease), "
                  "so a slow cluster does not delay the others.")
    @click.option("--dry-run", is_flag=True, help="The weekly notify step writes .eml files, sends nothing.")
    @click.option("--lease-ttl", default=300, show_default=True, type=click.IntRange(min=5),
                  help="Seconds a job lease lasts if its daemon dies (renewed every third of it).")
    @click.option("--health-max-age", type=FiniteRange(min=1, max=86_400 * 31), default=None,
                  help="Seconds after which a source's last successful collect is stale for /healthz "
                  "[default: 3 collect periods, at least 900].")
    @click.option("--every", type=FiniteRange(min=0.1, max=86_400 * 31), default=None,
                  help="Testing and demos: run collect and audit every this many seconds instead of their "
                  "cron expressions (report and chargeback keep theirs).")
    @click.option("--upgrade-db", is_flag=True, help="Run the store's migrations before starting.")
    @click.option("--web", "web_listen", default="off", show_default=True,
                  help="Also serve the read-only web UI on HOST:PORT ('config' = web.listen); 'off' does not.")
    @pass_app
    def serve(app: App, listen: str, once_now: bool, per_cluster: bool, dry_run: bool, lease_ttl: int,
              health_max_age: float | None, every: float | None, upgrade_db: bool, web_listen: str) -> None:
        """Run collect, audit, the weekly report and the monthly chargeback on the [schedule] crons until
        SIGTERM/SIGINT; serve /healthz and /metrics. Exits 0 after a clean shutdown."""
        from apscheduler.triggers.interval import IntervalTrigger

        from auditor.config.base import parse_listen
        from auditor.daemon.health import HealthServer, health
        from auditor.daemon.schedule import Daemon, zone
        from auditor.timeutil import utcnow

        try:
            addr = parse_listen(listen)
        except ValueError as exc:
            raise GpuAuditError(str(exc)) from None
        if upgrade_db:
            app.store(migrate_check=False, create=True).upgrade()
        store, cfg = app.store(), app.cfg
        ours = logging.getLogger("gpu_audit")
        aps = logging.getLogger("apscheduler")  # its warnings (e.g. a skipped overlapping run) in our format
        aps.handlers[:], aps.propagate = list(ours.handlers), False
        aps.setLevel(logging.DEBUG if app.debug else logging.WARNING)
        triggers = None
        if every is not None:
            triggers = {"collect": IntervalTrigger(seconds=every), "audit": IntervalTrigger(seconds=every)}
        daemon = Daemon(store, cfg, base_dir=app.base_dir, dry_run=dry_run, per_cluster=per_cluster,
                        triggers=triggers, lease_ttl_s=lease_ttl)
        max_age = health_max_age or (max(60.0, 3 * every) if every else
                                     max(900.0, 3 * collect_period_s(daemon.triggers["collect"],
                                                                      utcnow().astimezone(zone(cfg.schedule.timezone)))))
        server = None
        if addr is not None:
            try:
                server = HealthServer(addr[0], addr[1], daemon.metrics,
                                      lambda: health(store, cfg, max_age, scheduler_running=daemon.running)).start()
            except OSError as exc:
                raise GpuAuditError(f"--listen {listen}: {exc.strerror or exc}") from None
            log.info("serving /healthz and /metrics on http://%s:%d", addr[0], server.port)
        web_server = None
        if web_listen.strip().lower() not in ("", "off", "none"):
            from auditor.web.app import start_in_thread

            where = cfg.web.listen if web_listen == "config" else web_listen
            try:
                web_server = start_in_thread(store, cfg, where)
            except OSError as exc:
                raise GpuAuditError(f"--web {where}: {exc.strerror or exc}") from None
            log.info("serving the read-only web UI on http://%s", where)

        def stop() -> None:
            if server:
                server.stop()
            if web_server is not None:
                web_server.should_exit = True

        log.info("daemon %s on store %s; clusters: %s", daemon.holder, store.redacted_url(),
                 ", ".join(c.name for c in cfg.clusters) or "none")
        daemon.run_until_signalled(once_now=once_now, on_stop=stop)
