"""The inference side's table: what each serving pod (vLLM, TGI) generated per bucket, read by the
inference rule (auditor/audit/inference.py; docs/definitions.md "Inference services"). Registered on the shared
MetaData; :mod:`auditor.store.schema` re-exports it."""

from __future__ import annotations

from sqlalchemy import Column, Float, Index, Integer, PrimaryKeyConstraint, String, Table, Text

from auditor.store.schema_base import _ts, metadata

inference_buckets = Table(
    "inference_buckets", metadata,
    Column("cluster", String(128), nullable=False, comment="Cluster name."),
    Column("engine", String(16), nullable=False, comment="Inference server: vllm or tgi."),
    Column("job", String(255), nullable=False, comment="Telemetry job key of the serving pod: namespace/pod "
           "(the key GPU telemetry ties to an allocation)."),
    _ts("start_ts", "Bucket start", nullable=False),
    Column("seconds", Integer, nullable=False, comment="Bucket length, seconds."),
    Column("instance", Text, nullable=False, default="", comment="Scrape target(s) of the series (host:port)."),
    Column("model", Text, nullable=False, default="", comment="Model served, where the engine labels it "
           "(vLLM model_name)."),
    Column("generated_tokens", Float, comment="Tokens generated in the bucket (the counter's increase)."),
    Column("running_mean", Float, comment="Mean requests running (the concurrency; TGI: the batch size)."),
    Column("waiting_mean", Float, comment="Mean requests waiting in the server's queue."),
    Column("batch_mean", Float, comment="Mean batch size where the engine reports one (TGI)."),
    PrimaryKeyConstraint("cluster", "engine", "job", "start_ts"),
    Index(None, "cluster", "start_ts"),
    comment="Per serving pod and bucket: tokens generated, mean requests running and waiting, batch size.",
)
