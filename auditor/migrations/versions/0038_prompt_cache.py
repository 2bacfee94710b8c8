"""Prompt-cache hit rate (issue 48 §4): inference buckets gain the prefix cache's looked-up and found tokens
(vLLM's vllm:prefix_cache_queries_total and vllm:prefix_cache_hits_total, their increase over the bucket) and
the mean hit rate where an engine exports only a rate (SGLang's sglang:cache_hit_rate). NULL in rows stored
before: not measured. No data changes.

Revision ID: 0038_prompt_cache
Revises: 0037_quota_reserved
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = "0038_prompt_cache"
down_revision = "0037_quota_reserved"
branch_labels = None
depends_on = None

COLUMNS = [
    ("cache_queries", "Prompt-cache (prefix cache) tokens looked up in the bucket (vLLM: the increase of "
                      "vllm:prefix_cache_queries_total)."),
    ("cache_hits", "Of cache_queries, tokens found in the prefix cache (vLLM: the increase of "
                   "vllm:prefix_cache_hits_total)."),
    ("cache_hit_rate", "Mean prefix-cache hit rate, 0-1, where the engine exports only a rate (SGLang: "
                       "sglang:cache_hit_rate)."),
]


def upgrade() -> None:
    with op.batch_alter_table("inference_buckets", schema=None) as batch_op:
        for name, text in COLUMNS:
            batch_op.add_column(sa.Column(name, sa.Float(), nullable=True, comment=text))


def downgrade() -> None:
    with op.batch_alter_table("inference_buckets", schema=None) as batch_op:
        for name, _text in reversed(COLUMNS):
            batch_op.drop_column(name)
