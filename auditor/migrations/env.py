"""Alembic environment: the engine comes from gpu-audit (Store.alembic_config) or -x url=..."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from auditor.store.schema import metadata

config = context.config


def run_migrations_online() -> None:
    engine = config.attributes.get("engine")
    if engine is None:
        url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
        engine = create_engine(url)
    with engine.begin() as connection:
        context.configure(connection=connection, target_metadata=metadata,
                          render_as_batch=connection.dialect.name == "sqlite", compare_type=True)
        context.run_migrations()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=metadata,
                      literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
