"""The inference side's table: what each serving pod (vLLM, TGI, SGLang, Triton) generated per bucket, read by the
inference rule (auditor/audit/inference.py; docs/definitions.md "Inference services"). Registered on the shared
MetaData; :mod:`auditor.store.schema` re-exports it."""

from __future__ import annotations

from sqlalchemy import Column, Float, Index, Integer, PrimaryKeyConstraint, String, Table, Text

from auditor.store.schema_base import _ts, metadata

inference_buckets = Table(
    "inference_buckets", metadata,
    Column("cluster", String(128), nullable=False, comment="Cluster name."),
    Column("engine", String(16), nullable=False, comment="Inference server: vllm, tgi, sglang or triton."),
    Column("job", String(255), nullable=False, comment="Telemetry job key of the serving pod: namespace/pod "
           "(the key GPU telemetry ties to an allocation)."),
    _ts("start_ts", "Bucket start", nullable=False),
    Column("seconds", Integer, nullable=False, comment="Bucket length, seconds (3600: an hour rolled up by "
           "`gpu-audit db prune`)."),
    Column("observed_s", Float, comment="Rolled-up hour: the seconds of the buckets it was made of; NULL for a "
           "bucket as collected (= seconds)."),
    _ts("span_start", "Rolled-up hour: the start of the first bucket it was made of; NULL for a bucket as "
        "collected"),
    _ts("span_end", "Rolled-up hour: the end of the last bucket it was made of; NULL for a bucket as collected"),
    Column("instance", Text, nullable=False, default="", comment="Scrape target(s) of the series (host:port)."),
    Column("model", Text, nullable=False, default="", comment="Model served, where the engine labels it "
           "(model_name; Triton: model)."),
    Column("generated_tokens", Float, comment="Tokens generated in the bucket (the counter's increase)."),
    Column("running_mean", Float, comment="Mean requests running (the concurrency; TGI: the batch size; Triton: "
           "TensorRT-LLM's active requests)."),
    Column("waiting_mean", Float, comment="Mean requests waiting in the server's queue."),
    Column("batch_mean", Float, comment="Mean batch size where the engine reports one (TGI; Triton: TensorRT-LLM's "
           "scheduled requests)."),
    PrimaryKeyConstraint("cluster", "engine", "job", "start_ts"),
    Index(None, "cluster", "start_ts"),
    comment="Per serving pod and bucket: tokens generated, mean requests running and waiting, batch size.",
)
