"""Storability of one record, decided the same way on SQLite and PostgreSQL before it reaches the store.

PostgreSQL refuses what SQLite takes silently: integers beyond 32 bits (``integer out of range``), NUL
characters in text, index keys over ~2,700 bytes. So every record is checked here first and the decision is
the engine's no longer: NUL characters are removed from every text value (they carry nothing and no
terminal shows them: documented in docs/reliability.md), and a record that still cannot be stored exactly
(an integer out of range, a non-finite number, a key over :data:`KEY_MAX` characters, a value of the wrong
type) is refused with a one-line reason the collector quarantines. What slips past (a driver limit not
foreseen) is caught by the row-by-row retry in :func:`auditor.store.ingest.ingest`.
"""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime
from typing import Any

from auditor.records import (
    LABEL_FIELDS,
    METRIC_FIELDS,
    NODE_EVENT_KINDS,
    NODE_FIELDS,
    Allocation,
    GpuBucket,
    GpuInventory,
    GpuQuota,
    GpuWait,
    InferenceBucket,
    KubeJob,
    NodeBucket,
    NodeEvent,
    PortBucket,
    Reservation,
)
from auditor.store.reservations import money_problem

INT_MIN, INT_MAX = -(2**31), 2**31 - 1  # INTEGER columns: PostgreSQL's int4
KEY_MAX = 512  # characters of a text value in a unique key (2,048 UTF-8 bytes, under PostgreSQL's index limit)
FLOAT_MAX = 1e300  # anything larger is an overflow in disguise
MAX_QUEUE_GPUS = 65536  # GPUs a waiting job may ask for or a quota allow (the largest real jobs: ~16k)


class Unstorable(ValueError):
    """The record cannot be stored exactly on every engine; the message says which field and why."""


def _text(value: Any, what: str, key: bool = False, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise Unstorable(f"{what}: {type(value).__name__} where text belongs")
    if "\x00" in value:
        value = value.replace("\x00", "")
    if key and len(value) > KEY_MAX:
        raise Unstorable(f"{what}: {len(value):,} characters (a key holds at most {KEY_MAX})")
    return value


def _int(value: Any, what: str, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise Unstorable(f"{what}: {type(value).__name__} where an integer belongs")
    if not INT_MIN <= value <= INT_MAX:
        raise Unstorable(f"{what}: {value} is out of the storable range")
    return value


def _float(value: Any, what: str, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Unstorable(f"{what}: {type(value).__name__} where a number belongs")
    if not math.isfinite(value) or abs(value) > FLOAT_MAX:
        raise Unstorable(f"{what}: {value} is not a finite number")
    return float(value)


def _time(value: Any, what: str, optional: bool = True) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise Unstorable(f"{what}: not a time with a time zone")
    try:
        _int(int(value.timestamp()), what)
    except (OverflowError, ValueError) as exc:
        raise Unstorable(f"{what}: {value.isoformat()} is out of the storable range "
                         "(1901-12-13 .. 2038-01-19 UTC)") from exc
    return value


def _names(values: Any, what: str) -> list[str]:
    if not isinstance(values, list | tuple | set | frozenset):
        raise Unstorable(f"{what}: not a list")
    return [_text(v, what) for v in values]


def _labels(labels: Any) -> dict[str, str]:
    if not isinstance(labels, dict):
        raise Unstorable("labels: not a mapping")
    return {_text(k, "labels key"): _text(v, f"labels[{str(k)[:40]!r}]") for k, v in labels.items()}


def clean(rec: Any) -> Any:
    """``rec`` made storable (NUL characters removed), or :class:`Unstorable` naming the field."""
    if isinstance(rec, Allocation):
        for f in ("name", "user", "account", "partition", "qos", "state", "reservation", "owner_workload"):
            setattr(rec, f, _text(getattr(rec, f), f))
        rec.external_id = _text(rec.external_id, "id", key=True)
        for f in ("submit", "start", "end"):
            _time(getattr(rec, f), f)
        _int(rec.time_limit_s, "time_limit_s", optional=True)
        rec.exit_code = _text(rec.exit_code, "exit_code", optional=True)
        _int(rec.cpus, "cpus", optional=True)
        rec.cpu_time_s = _float(rec.cpu_time_s, "cpu_time_s", optional=True)
        _int(rec.restarts, "restarts", optional=True)
        rec.sluid = _text(rec.sluid, "sluid", optional=True)
        rec.failure_reason = _text(rec.failure_reason, "failure_reason")
        rec.job_uid = _text(rec.job_uid, "job_uid")
        rec.labels = _labels(rec.labels)
        gpus = []
        for g in rec.gpus:
            _int(g.index, "gpus: index", optional=True)
            _float(g.share, "gpus: share")
            gpus.append(dataclasses.replace(
                g, node=_text(g.node, "gpus: node", key=True), uuid=_text(g.uuid, "gpus: uuid", optional=True),
                model=_text(g.model, "gpus: model", optional=True),
                mig_profile=_text(g.mig_profile, "gpus: mig_profile", optional=True)))
        rec.gpus = gpus
        _float(rec.gpu_count, "gpu count")
    elif isinstance(rec, GpuBucket):
        rec.host = _text(rec.host, "host", key=True)
        rec.gpu_instance = _text(rec.gpu_instance, "gpu_instance", key=True)
        rec.job = _text(rec.job, "job", key=True, optional=True)  # part of the sub-row's primary key
        _float(rec.observed_s, "observed_s", optional=True)
        _time(rec.span_start, "span_start")
        _time(rec.span_end, "span_end")
        _int(rec.gpu, "gpu")
        _int(rec.seconds, "bucket seconds")
        _int(rec.samples, "samples")
        _time(rec.start, "bucket start", optional=False)
        rec.uuid = _text(rec.uuid, "uuid", optional=True)
        rec.model = _text(rec.model, "model", optional=True)
        for f in METRIC_FIELDS:
            _float(getattr(rec, f), f, optional=True)
        for f in LABEL_FIELDS:
            setattr(rec, f, _text(getattr(rec, f), f, optional=True))
        _text(rec.job_key(), "job key (hpc_job, or namespace/pod)", key=True)  # in gpu_buckets' primary key
    elif isinstance(rec, Reservation):
        rec.name = _text(rec.name, "name", key=True)
        _time(rec.start, "start", optional=False)
        _time(rec.end, "end", optional=False)
        _float(rec.gpu_count, "gpu_count")
        rec.nodes, rec.users = _names(rec.nodes, "nodes"), _names(rec.users, "users")
        rec.accounts, rec.flags = _names(rec.accounts, "accounts"), _names(rec.flags, "flags")
    elif isinstance(rec, GpuInventory):
        _int(rec.gpu, "gpu")
        _time(rec.seen_at, "seen_at")
        rec = dataclasses.replace(rec, host=_text(rec.host, "host", key=True),
                                  model=_text(rec.model, "model", optional=True),
                                  uuid=_text(rec.uuid, "uuid", optional=True),
                                  mig_layout=_text(rec.mig_layout, "mig_layout"))
    elif isinstance(rec, GpuWait):
        for f in ("name", "user", "account", "partition", "qos", "state"):
            setattr(rec, f, _text(getattr(rec, f), f))
        rec.external_id = _text(rec.external_id, "id", key=True)
        _time(rec.eligible, "eligible", optional=False)
        _time(rec.end, "end")
        _time(rec.submit, "submit")
        _float(rec.gpus, "gpus")
        if not 0 <= rec.gpus <= MAX_QUEUE_GPUS:
            raise Unstorable(f"gpus: {rec.gpus:g} requested is not a GPU count")
    elif isinstance(rec, GpuQuota):
        rec.name = _text(rec.name, "name", key=True)
        _time(rec.seen_at, "seen_at")
        _float(rec.gpus, "gpus")
        if not 0 <= rec.gpus <= MAX_QUEUE_GPUS:
            raise Unstorable(f"gpus: quota of {rec.gpus:g} GPUs is not a GPU count")
        _float(rec.reserved, "reserved", optional=True)
        if rec.reserved is not None and not 0 <= rec.reserved <= MAX_QUEUE_GPUS:
            raise Unstorable(f"reserved: {rec.reserved:g} reserved GPUs is not a GPU count")
    elif isinstance(rec, NodeEvent):
        rec.node = _text(rec.node, "node", key=True)
        if rec.kind not in NODE_EVENT_KINDS:
            raise Unstorable(f"kind: {str(rec.kind)[:40]!r} is not one of {', '.join(NODE_EVENT_KINDS)}")
        _time(rec.start, "start", optional=False)
        _time(rec.end, "end")
        if rec.end is not None and rec.end < rec.start:
            raise Unstorable("end: before start")
        _int(rec.gpu, "gpu", optional=True)
        if rec.gpu is not None and rec.gpu < 0:
            raise Unstorable(f"gpu: negative index {rec.gpu}")
        rec.reason = _text(rec.reason, "reason")
        rec.source = _text(rec.source, "source")[:32]
    elif isinstance(rec, NodeBucket):
        rec.node = _text(rec.node, "node", key=True)
        _time(rec.start, "bucket start", optional=False)
        _int(rec.seconds, "bucket seconds")
        _int(rec.samples, "samples")
        _float(rec.observed_s, "observed_s", optional=True)
        for f in NODE_FIELDS:
            _float(getattr(rec, f), f, optional=True)
    elif isinstance(rec, PortBucket):
        rec.node = _text(rec.node, "node", key=True)
        rec.device, rec.port = _text(rec.device, "device", key=True), _text(rec.port, "port", key=True)
        _time(rec.start, "bucket start", optional=False)
        _int(rec.seconds, "bucket seconds")
        _float(rec.wait_share, "wait_share", optional=True)
        _float(rec.link_errors, "link_errors", optional=True)
        _float(rec.ecn_share, "ecn_share", optional=True)
    elif isinstance(rec, KubeJob):
        rec.uid = _text(rec.uid, "uid", key=True)
        if not rec.uid or len(rec.uid) > 64:
            raise Unstorable(f"uid: {rec.uid[:70]!r} is not a Kubernetes uid")
        rec.namespace, rec.name = _text(rec.namespace, "namespace"), _text(rec.name, "name")
        rec.state, rec.reason = _text(rec.state, "state")[:16], _text(rec.reason, "reason")
        _int(rec.backoff_limit, "backoff_limit", optional=True)
        for f in ("failed", "succeeded", "active"):
            _int(getattr(rec, f), f)
            if getattr(rec, f) < 0:
                raise Unstorable(f"{f}: negative count {getattr(rec, f)}")
        for f in ("start", "end", "seen_at"):
            _time(getattr(rec, f), f)
    if why := money_problem(rec):  # storable, but money from it would be non-finite or absurd
        raise Unstorable(why)
    return rec


def describe(rec: Any) -> tuple[str, str]:
    """(location, excerpt) of a record for the quarantine: what it is, without its bulk."""
    if isinstance(rec, Allocation):
        return f"allocation {str(rec.external_id)[:80]}", f"{str(rec.name)[:80]} user={str(rec.user)[:40]}"
    if isinstance(rec, GpuBucket):
        start = rec.start.isoformat() if isinstance(rec.start, datetime) else str(rec.start)
        return f"gpu {str(rec.host)[:80]}/{rec.gpu} at {start}", f"samples={rec.samples}"
    if isinstance(rec, Reservation):
        return f"reservation {str(rec.name)[:80]}", ""
    if isinstance(rec, GpuWait):
        return f"waiting job {str(rec.external_id)[:80]}", f"{str(rec.name)[:80]} user={str(rec.user)[:40]}"
    if isinstance(rec, GpuQuota):
        return f"quota {rec.kind} {str(rec.name)[:80]}", f"gpus={rec.gpus}"
    if isinstance(rec, GpuInventory):
        return f"inventory {str(rec.host)[:80]}/{rec.gpu}", ""
    if isinstance(rec, NodeEvent):
        start = rec.start.isoformat() if isinstance(rec.start, datetime) else str(rec.start)
        where = str(rec.node)[:80] + ("" if rec.gpu is None else f"/{rec.gpu}")
        return f"node event {str(rec.kind)[:16]} {where} at {start}", str(rec.reason)[:80]
    if isinstance(rec, KubeJob):
        return f"kubernetes job {str(rec.namespace)[:60]}/{str(rec.name)[:80]}", f"failed={rec.failed!r}"
    if isinstance(rec, InferenceBucket):
        start = rec.start.isoformat() if isinstance(rec.start, datetime) else str(rec.start)
        return f"{str(rec.engine)[:16]} inference {str(rec.job)[:80]} at {start}", f"tokens={rec.generated_tokens!r}"
    if isinstance(rec, NodeBucket):
        start = rec.start.isoformat() if isinstance(rec.start, datetime) else str(rec.start)
        return f"node {str(rec.node)[:80]} at {start}", f"iowait={rec.cpu_iowait!r} busy={rec.cpu_busy!r}"
    if isinstance(rec, PortBucket):
        start = rec.start.isoformat() if isinstance(rec.start, datetime) else str(rec.start)
        return (f"port {str(rec.node)[:80]} {str(rec.device)[:40]}/{str(rec.port)[:8]} at {start}",
                f"wait_share={rec.wait_share!r} link_errors={rec.link_errors!r} ecn_share={rec.ecn_share!r}")
    return type(rec).__name__, ""
