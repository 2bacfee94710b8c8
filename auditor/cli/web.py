"""``gpu-audit web``: the read-only web UI on its own (``gpu-audit serve --web`` mounts the same app)."""

from __future__ import annotations

import click

from auditor.cli.app import App, pass_app


def register(main: click.Group) -> None:
    @main.command()
    @click.option("--listen", default=None, help="HOST:PORT to serve on [default: web.listen, 127.0.0.1:8080].")
    @pass_app
    def web(app: App, listen: str | None) -> None:
        """Serve the read-only web UI (overview, teams, users, clusters, findings, allocations, chargeback and
        their JSON API) until interrupted."""
        from auditor.web.app import listen_address, serve

        where = listen or app.cfg.web.listen
        addr = listen_address(where, app.cfg)  # a bad or open address fails before the store is opened
        serve(app.store(), app.cfg, where, addr)
