"""A GPU starved by its own job's input is not idle (issue 44): usage_gpu and usage_allocation keep the
idle-by-SM seconds the job's own input explains (``input_wait_s``, taken out of ``idle_s``) and those whose
node host read busy on a node the job shared (``host_busy_idle_s``, still idle, never acted on). Written by
auditor/audit/starved.py after the judging; rows of earlier runs read 0 (the pass did not exist then).

Revision ID: 0035_starved_gpus
Revises: 0034_queue_quota_uuid
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = "0035_starved_gpus"
down_revision = "0034_queue_quota_uuid"
branch_labels = None
depends_on = None

#: (column, comment) in usage_gpu and usage_allocation (auditor.store.columns.STARVED)
COLUMNS = [
    ("input_wait_s", "GPU-seconds SM-idle while the job's own input was busy (input/storage wait, GPU starved): "
                     "the node's host read storage busy or pegged cores and the evidence is the job's own (it held "
                     "the whole node). Reserved time that did no math, never idle: taken out of idle_s (times "
                     "share)."),
    ("host_busy_idle_s", "Of idle_s, GPU-seconds SM-idle while the node's host read its input busy on a node the "
                         "job shared (the activity could be another job's): still idle, never acted on (times "
                         "share)."),
]


def upgrade() -> None:
    for table in ("usage_gpu", "usage_allocation"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            for name, text in COLUMNS:
                batch_op.add_column(sa.Column(name, sa.Float(), nullable=False, server_default="0", comment=text))


def downgrade() -> None:
    for table in ("usage_allocation", "usage_gpu"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            for name, _text in COLUMNS:
                batch_op.drop_column(name)
