"""inference_buckets: what each serving pod (vLLM, TGI) generated per bucket (tokens, requests running and
waiting, batch size), for the cost per million generated tokens and the batching_headroom finding (issue 36).

Revision ID: 0018_inference
Revises: 0017_goodput
Create Date: 2026-12-02
"""
import sqlalchemy as sa
from alembic import op

revision = "0018_inference"
down_revision = "0017_goodput"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "inference_buckets",
        sa.Column("cluster", sa.String(length=128), nullable=False,
                  comment='Cluster name.'),
        sa.Column("engine", sa.String(length=16), nullable=False,
                  comment='Inference server: vllm or tgi.'),
        sa.Column("job", sa.String(length=255), nullable=False,
                  comment='Telemetry job key of the serving pod: namespace/pod (the key GPU telemetry ties to an allocation).'),
        sa.Column("start_ts", sa.Integer(), nullable=False,
                  comment='Bucket start (UTC epoch seconds)'),
        sa.Column("seconds", sa.Integer(), nullable=False,
                  comment='Bucket length, seconds.'),
        sa.Column("instance", sa.Text(), nullable=False,
                  comment='Scrape target(s) of the series (host:port).'),
        sa.Column("model", sa.Text(), nullable=False,
                  comment='Model served, where the engine labels it (vLLM model_name).'),
        sa.Column("generated_tokens", sa.Float(), nullable=True,
                  comment="Tokens generated in the bucket (the counter's increase)."),
        sa.Column("running_mean", sa.Float(), nullable=True,
                  comment='Mean requests running (the concurrency; TGI: the batch size).'),
        sa.Column("waiting_mean", sa.Float(), nullable=True,
                  comment="Mean requests waiting in the server's queue."),
        sa.Column("batch_mean", sa.Float(), nullable=True,
                  comment='Mean batch size where the engine reports one (TGI).'),
        sa.PrimaryKeyConstraint("cluster", "engine", "job", "start_ts", name=op.f("pk_inference_buckets")),
        comment='Per serving pod and bucket: tokens generated, mean requests running and waiting, batch size.',
    )
    with op.batch_alter_table("inference_buckets", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_inference_buckets_cluster_start_ts"), ["cluster", "start_ts"],
                              unique=False)


def downgrade() -> None:
    with op.batch_alter_table("inference_buckets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_inference_buckets_cluster_start_ts"))
    op.drop_table("inference_buckets")
