"""The postgres_fdw sharded store is retired (docs/scale-out.md): its commands answer in one line naming the
replacement, and a store that was sharded is refused by the migration that drops its table, never half
migrated. Both engines."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from conftest import run_cli
from sqlalchemy import text

from auditor.errors import GpuAuditError
from auditor.store.engine import Store

DROP = "0031_drop_shards"


@pytest.mark.parametrize("cmd", [["db", "shard", "postgresql+psycopg://u@h/db"], ["db", "shards"]])
def test_shard_commands_name_the_replacement(cmd: list[str], tmp_path: Path) -> None:
    res = run_cli(*cmd, cwd=tmp_path)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "was removed" in lines[0] and "gpu-audit export" in lines[0], res.stderr
    assert not list(tmp_path.iterdir())  # no store created on the way
    assert "shard" not in run_cli("db", "--help", cwd=tmp_path).stdout  # hidden from the help


def _before_drop(store: Store) -> str:
    return ScriptDirectory.from_config(store.alembic_config()).get_revision(DROP).down_revision


def test_a_sharded_store_is_refused_not_half_migrated(store_url: str) -> None:
    s = Store.open(store_url)
    prev = _before_drop(s)
    s.upgrade(prev)
    with s.begin() as conn:
        conn.execute(text("INSERT INTO store_shards (shard, server, location, schema_name, added_ts) "
                          "VALUES (1, 'gpu_audit_shard1_x', 'h:5432/db', 'public', 0)"))
    with pytest.raises(GpuAuditError, match="sharded over postgres_fdw"):
        s.upgrade()
    assert s.current() == prev  # nothing applied past it
    with s.begin() as conn:  # an unsharded store (the table empty) upgrades and loses the table
        conn.execute(text("DELETE FROM store_shards"))
    s.upgrade()
    assert s.current() == s.head()
    with s.engine.connect() as conn:
        with pytest.raises(Exception, match="store_shards"):
            conn.execute(text("SELECT 1 FROM store_shards")).all()
