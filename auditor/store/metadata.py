"""The store's shared MetaData (naming convention) and the time-column helper: every table module registers
on it (:mod:`auditor.store.schema`, and each concept's own module: :mod:`auditor.store.queue`,
:mod:`auditor.store.inference`, :mod:`auditor.store.node`, :mod:`auditor.store.kube_jobs`)."""

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
