"""The store's shared MetaData (naming convention) and the time-column helper, apart from the table modules
(:mod:`auditor.store.schema`, :mod:`auditor.store.schema_queue`) so each stays short."""

from __future__ import annotations

from sqlalchemy import Column, Integer, MetaData

metadata = MetaData(naming_convention={
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
})


def _ts(name: str, comment: str, nullable: bool = True) -> Column:
    return Column(name, Integer, nullable=nullable, comment=comment + " (UTC epoch seconds)")
