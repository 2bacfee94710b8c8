"""gpu_buckets: the comments of samples, observed_s and spans as the carried cover defines them; findings.kind
names the registry of finding kinds instead of a list that drifted (it named 11 of 13).

Each sample covers the time until its series' next sample, at most one scrape interval, carried across
bucket edges (docs/definitions.md "Observed seconds from samples"); a row without samples of its own may
hold that cover. No data changes: rows written before keep their observed seconds.

Revision ID: 0014_observed_cover
Revises: 0013_exemption_actor
Create Date: 2026-12-01
"""
from alembic import op

revision = "0014_observed_cover"
down_revision = "0013_exemption_actor"
branch_labels = None
depends_on = None

#: (table, column, comment before, comment now)
COMMENTS = [
    ('gpu_buckets', 'samples',
     'Raw samples behind the bucket; 0 = not observed.',
     "Raw samples in the bucket; 0 with observed_s > 0: only the cover of the series' sample before it."),
    ('gpu_buckets', 'observed_s',
     'Seconds of the bucket the samples cover (0..bucket_s; bucket_s when the source cannot tell).',
     "Seconds of the bucket its series' samples cover, each until the next at most one interval, carried "
     "across bucket edges (0..bucket_s; bucket_s when the source cannot tell)."),
    ('gpu_buckets', 'span_start',
     'First sample time; NULL = the whole bucket.',
     'Start of the covered seconds; NULL = the whole bucket.'),
    ('gpu_buckets', 'span_end',
     'Last sample time + sample interval; NULL = the whole bucket.',
     'End of the covered seconds; NULL = the whole bucket.'),
    ('findings', 'kind',
     'idle_allocation, idle_gpus, util_mirage, hung_collective, ghost_busy, idle_episode, '
     'low_efficiency, idle_reservation, unmonitored, idle_while_queued or idle_quota (no allocation: '
     "account = the quota's account, evidence.quota).",
     "A finding kind of the registry (auditor/audit/kinds.py; docs/definitions.md, Finding kinds). "
     "idle_quota has no allocation: account = the quota's account, evidence.quota."),
]


def _set(which: int) -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    for row in COMMENTS:
        table, column, text = row[0], row[1], row[which]
        op.execute(f"COMMENT ON COLUMN {table}.{column} IS '" + text.replace("'", "''") + "'")


def upgrade() -> None:
    _set(3)


def downgrade() -> None:
    _set(2)
