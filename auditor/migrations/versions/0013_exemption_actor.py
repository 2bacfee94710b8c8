"""exemptions.actor: who ran `gpu-audit exempt` (login@host of the process, as enforcement_log.actor),
kept beside requested_by, which is --by as typed (free text) and so proves nothing. Rows recorded before
this revision have no actor (NULL).

Revision ID: 0013_exemption_actor
Revises: 0012_column_comments
Create Date: 2026-12-01
"""
import sqlalchemy as sa
from alembic import op

revision = "0013_exemption_actor"
down_revision = "0012_column_comments"
branch_labels = None
depends_on = None

ACTOR = ("Who ran `gpu-audit exempt` (login@host of the process, not typed); NULL for exemptions "
         "recorded before this column.")
REQUESTED_BEFORE = "Who asked (login of whoever ran `gpu-audit exempt`, or --by)."
REQUESTED_NOW = "Who asked: --by as given (free text), else the actor."


def _comment(text: str) -> None:
    if op.get_context().dialect.name == "postgresql":  # SQLite keeps no comments
        op.execute("COMMENT ON COLUMN exemptions.requested_by IS '" + text.replace("'", "''") + "'")


def upgrade() -> None:
    with op.batch_alter_table("exemptions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("actor", sa.Text(), nullable=True, comment=ACTOR))
    _comment(REQUESTED_NOW)


def downgrade() -> None:
    with op.batch_alter_table("exemptions", schema=None) as batch_op:
        batch_op.drop_column("actor")
    _comment(REQUESTED_BEFORE)
