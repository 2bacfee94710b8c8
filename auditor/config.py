"""Configuration: one TOML file, validated on load, every key documented (docs/configuration.md).

Settings are data (pydantic models) so the docs test can walk them. Each connector owns the model of its
own options (``Options`` on the connector class); this module validates them under the key path where they
appear, so an error reads ``clusters[0].telemetry[1].url: field required``.
"""

from __future__ import annotations

import os
import stat
import tomllib
import warnings
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from auditor.energy import EnergyConfig
from auditor.errors import ConfigError

ENV_VAR = "GPU_AUDIT_CONFIG"
MAX_DAYS = 3660  # ten years: the bound of every span in days (larger ones overflow dates later)


def check_timezone(name: str) -> str:
    """An IANA time zone name, checked now so the daemon and the reports cannot fail on it later."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"unknown time zone {name[:60]!r} (an IANA name such as Europe/Berlin)") from None
    return name


def check_url(value: str, what: str) -> None:
    """A URL whose port is a number in 1..65535 (urllib only notices when a request is made)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value.strip())
        parts.port  # noqa: B018 - raises ValueError on a port out of range or not a number
    except ValueError:
        raise ConfigError(f"{what}: bad port in URL (a number from 1 to 65535)") from None
    if parts.port == 0:
        raise ConfigError(f"{what}: bad port in URL (a number from 1 to 65535)")


def check_store_url(value: str, what: str) -> None:
    """A SQLAlchemy URL that parses, with a valid port; never echoes the URL (it may hold a password)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        u = make_url(value.strip())
    except (ArgumentError, ValueError):
        raise ValueError(f"{what} is not a valid SQLAlchemy URL (value not shown)") from None
    if u.port is not None and not 1 <= u.port <= 65535:
        raise ValueError(f"{what}: port {u.port} is not in 1..65535")


class Strict(BaseModel):
    """Unknown keys are errors: a typo must not silently fall back to a default."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # no NaN/inf anywhere


class SecretRef(Strict):
    """Where a secret lives: an environment variable or a file. Never the secret itself."""

    env: str | None = Field(None, description="Environment variable holding the secret.")
    file: Path | None = Field(None, description="File holding the secret (first line, stripped).")

    def resolve(self, what: str) -> str | None:
        """Read the secret now; the value never goes into config dumps, logs or exceptions."""
        if self.env:
            value = os.environ.get(self.env)
            if value is None:
                raise ConfigError(f"{what}: environment variable {self.env} is not set")
            return remember_secret(value.strip())  # a trailing newline would end up in a header
        if self.file:
            return remember_secret(read_secret_file(self.file, what))
        return None

    def __repr__(self) -> str:
        return f"SecretRef(env={self.env!r}, file={str(self.file) if self.file else None!r})"


def remember_secret(value: str) -> str:
    """Register a resolved secret so every log line and CLI error scrubs it (see auditor.logs.scrub)."""
    from auditor.logs import register_secret

    register_secret(value)
    return value


def read_secret_file(path: Path, what: str) -> str:
    """Read a secrets file, warning when others can read it (the value itself is never shown)."""
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read secret file {path}: {exc.strerror}") from None
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        warnings.warn(f"{what}: secret file {path} is readable by group/others; chmod 600 it",
                      stacklevel=2)
    return text.strip().splitlines()[0].strip() if text.strip() else ""


#: The most connections an audit judges in (``store.judge_connections``); the store sizes its pool by it
MAX_JUDGE_CONNECTIONS = 16


class StoreConfig(Strict):
    url: str = Field("sqlite:///gpu-audit.db", description="SQLAlchemy URL of the store.")
    url_env: str | None = Field(None, description="Environment variable holding the store URL "
                                "(use it when the URL carries a password); overrides `url`.")
    bucket_seconds: int = Field(300, ge=60, le=3600, description="Telemetry bucket length in seconds.")
    batch_rows: int = Field(50_000, ge=100, le=10_000_000, description="Rows per ingest transaction.")
    judge_connections: int = Field(0, ge=0, le=MAX_JUDGE_CONNECTIONS,
                                   description="PostgreSQL: connections that attribute and judge an audit's "
                                   "allocations at once, each a share of them (0 = one per CPU core, at most 4; "
                                   "1 = the audit's own connection only). Above 1, read-only finding queries "
                                   "(sparklines, ghosts on unallocated GPUs) also run on extra connections while "
                                   "the audit works on. SQLite always judges in one.")

    def resolved_url(self) -> str:
        if self.url_env:
            value = (os.environ.get(self.url_env) or "").strip()
            if not value:
                raise ConfigError(f"store.url_env: environment variable {self.url_env} is not set")
            try:
                check_store_url(value, "store.url_env")
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            return value
        return self.url

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        check_store_url(v, "store.url")
        return v.strip()


class SourceConfig(BaseModel):
    """A connector: ``kind`` picks the class, the other keys are that connector's own options."""

    model_config = ConfigDict(extra="allow", frozen=True)
    kind: str = Field(description="Connector kind: see docs/configuration.md#connectors.")

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ClusterConfig(Strict):
    name: str = Field(description="Cluster name, as stored and reported.", pattern=r"^[A-Za-z0-9_.-]+$",
                      max_length=128)
    allocations: list[SourceConfig] = Field(default_factory=list,
                                            description="Allocation sources (Slurm, Kubernetes, files).")
    telemetry: list[SourceConfig] = Field(default_factory=list,
                                          description="Telemetry sources (Prometheus, files).")
    overlap_minutes: int = Field(30, ge=0, le=MAX_DAYS * 1440, description="Each collection re-reads this "
                                 "much before the watermark, so late data is picked up; ingest is idempotent.")
    initial_days: float = Field(7, gt=0, le=MAX_DAYS, description="How far back the first collection reads.")


#: Node event kinds (:data:`auditor.records.NODE_EVENT_KINDS`)
InfraKind = Literal["xid", "throttle", "ecc_dbe", "row_remap", "drain", "down", "not_ready", "cordoned"]
class CollectConfig(Strict):
    parallel: int = Field(1, ge=0, le=256, description="Clusters collected at once, each in its own worker "
                          "process that streams its records to the store in batches (`gpu-audit collect "
                          "--parallel N` overrides). 1: one cluster after another in this process (connector "
                          "state such as a Kubernetes watch is kept between a daemon's collections); 0: one "
                          "worker per cluster, at most the number of CPUs.")


class Thresholds(Strict):
    """Verdict and finding rules (docs/definitions.md). Comparisons use a 1e-9 tolerance: a value exactly at
    a threshold is not below it, even after a unit conversion."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    idle_sm: float = Field(0.05, ge=0, le=1, description="SM activity below this is idle.")
    idle_dram: float = Field(0.05, ge=0, le=1, description="...and DRAM activity below this.")
    idle_tensor: float = Field(0.01, ge=0, le=1, description="...and Tensor activity below this.")
    mirage_gpu_util: float = Field(0.5, ge=0, le=1, description="An idle bucket whose GPU-Util (0-1) is "
                                   "at least this is a mirage: reads busy, does no work.")
    mirage_gr_engine: float = Field(0.5, ge=0, le=1, description="...or whose GR engine activity is.")
    working_sm: float = Field(0.5, ge=0, le=1, description="SM activity at or above this is working; "
                              "between idle_sm and this is low.")
    util_fallback: bool = Field(True, description="Judge GPUs without profiling fields by GPU-Util "
                                "(low-confidence verdict idle-by-util). Off: such buckets are "
                                "busy_unverified (observed, never idle).")
    idle_util: float = Field(0.05, ge=0, le=1, description="Fallback: GPU-Util below this is idle-by-util.")
    idle_power_w: float | None = Field(None, ge=0, description="Fallback: and power below this (W); "
                                       "unset = power not required.")
    idle_allocation_fraction: float = Field(0.8, ge=0, le=1, description="idle_allocation: share of "
                                            "observed reserved time that is idle or mirage.")
    idle_allocation_min_gpu_hours: float = Field(1.0, ge=0, description="idle_allocation: minimum "
                                                 "reserved GPU-hours.")
    idle_gpus_fraction: float = Field(0.8, ge=0, le=1, description="idle_gpus: a GPU idle this share of "
                                      "its observed time while another GPU of the allocation works.")
    idle_gpus_worked_fraction: float = Field(0.5, ge=0, le=1, description="idle_gpus: a GPU counts as "
                                             "busy when low, working or busy-unverified this share of its "
                                             "observed time.")
    mirage_min_minutes: float = Field(30, ge=0, description="util_mirage (and hung_collective, ghost_busy): "
                                      "minimum mirage minutes of one GPU.")
    hung_gpu_util: float = Field(0.9, ge=0, le=1, description="hung_collective: mean GPU-Util (0-1) over the "
                                 "mirage time at least this...")
    hung_max_power_w: float = Field(150.0, ge=0, description="...mean power over the mirage time at most this "
                                    "(W, near idle; no power reading: not hung)...")
    hung_held_mib: float = Field(1024.0, ge=0, description="...memory held while idle or mirage at least this "
                                 "(MiB), in an allocation of 2 or more GPUs: a hung collective (NCCL).")
    ghost_gpu_util: float = Field(0.9, ge=0, le=1, description="ghost_busy: mean GPU-Util over the mirage time "
                                  "at least this...")
    ghost_max_fb_mib: float = Field(16.0, ge=0, description="...while at most this much memory (MiB) was used "
                                    "in idle and mirage time: no process, a driver or hardware state.")
    unmonitored_coverage: float = Field(0.5, ge=0, le=1, description="unmonitored: observed share of "
                                        "reserved time below this.")
    episode_hours: float = Field(2.0, gt=0, description="idle_episode: minimum contiguous idle span.")
    low_efficiency_sm: float = Field(0.25, ge=0, le=1, description="low_efficiency: mean SM activity "
                                     "below this.")
    low_efficiency_min_gpu_hours: float = Field(4.0, ge=0, description="low_efficiency: minimum observed "
                                                "GPU-hours.")
    queue_min_idle_gpu_hours: float = Field(1.0, ge=0, description="idle_while_queued: minimum idle GPU-hours "
                                            "of an allocation while GPU jobs of its partition waited.")
    idle_quota_min_gpus: float = Field(1.0, ge=0, description="idle_quota: minimum unused GPUs of a quota "
                                       "(quota - average GPUs in use)...")
    idle_quota_fraction: float = Field(0.5, ge=0, le=1, description="...and minimum unused share of the "
                                       "quota.")
    min_finding_gpu_hours: float = Field(0.1, ge=0, description="Findings about fewer reserved GPU-hours "
                                         "than this are not listed (e.g. unmonitored 9-second array tasks).")
    hint_dram_high: float = Field(0.4, ge=0, le=1, description="low_efficiency hint memory-bound: mean DRAM "
                                  "activity at least this.")
    hint_tensor_share: float = Field(0.5, ge=0, description="...compute-bound (tensor): mean Tensor activity "
                                     "at least this share of mean SM activity.")
    hint_io_bps: float = Field(1e9, ge=0, description="...input/communication wait: PCIe + NVLink bytes/s at "
                               "least this while DRAM is below hint_dram_low.")
    hint_dram_low: float = Field(0.1, ge=0, le=1, description="...DRAM activity below this counts as low.")
    hint_util_pulse_low: float = Field(0.1, ge=0, le=1, description="...input wait: mean GPU-Util at least "
                                       "this (kernels in bursts)...")
    hint_util_pulse_high: float = Field(0.9, ge=0, le=1, description="...and below this.")
    hint_held_mib: float = Field(1024.0, ge=0, description="...memory held, no compute: peak memory at least "
                                 "this (MiB) while GPU-Util is below hint_util_pulse_low.")
    # issue 19: ghosts on GPUs nobody held, right-sizing to a smaller model, Slurm request hygiene
    ghost_unallocated_min_minutes: float = Field(30, ge=0, description="ghost_busy on a GPU with no "
                                                 "allocation: minimum minutes of GPU-Util >= ghost_gpu_util "
                                                 "(summed over the window) before it is reported.")
    rightsize_model_max_sm: float = Field(0.5, ge=0, le=1, description="Right-sizing to a smaller model: an "
                                          "allocation whose mean SM activity is at most this (and whose peak "
                                          "memory fits) would have fit the cheapest such model in its cluster.")
    hygiene_min_jobs: int = Field(5, ge=1, description="request_hygiene: a user is judged on at least this "
                                  "many ended Slurm GPU jobs in the window (per cluster).")
    hygiene_runtime_ratio: float = Field(0.25, ge=0, le=1, description="request_hygiene: flagged when the "
                                         "median of runtime / time limit over the user's jobs is below this...")
    hygiene_unused_gpus: float = Field(0.25, ge=0, le=1, description="...or when at least this share of the "
                                       "GPUs the user's jobs requested (and telemetry saw) never worked (no "
                                       "low, working or busy-unverified second).")
    infra_kinds: list[InfraKind] = Field(["xid", "throttle", "ecc_dbe", "row_remap", "drain", "down", "not_ready",
                                          "cordoned"], description="Node event kinds whose intervals are "
                                         "infrastructure-affected (their reserved time is `infra`, never idle "
                                         "and in no user finding); leave one out to judge its time as usual.")
    lemon_min_faults: int = Field(3, ge=1, description="lemon_node: a node with at least this many "
                                  "infrastructure events (of the kinds above, distinct intervals, any of its "
                                  "GPUs) in the audit window.")


#: A price per GPU-hour above this is a typo (in any currency: ~1,000x a cloud H100 hour in VND or IDR).
MAX_PRICE = 1_000_000.0
Price = Annotated[float, Field(ge=0, le=MAX_PRICE, allow_inf_nan=False)]


class PriceCard(Strict):
    currency: str = Field("USD", description="Currency code printed with every cost.")
    default: Price = Field(2.0, description="Price per GPU-hour of a model not listed (a finite number from "
                           "0 to 1,000,000, like every price).")
    models: dict[str, Price] = Field(default_factory=dict, description="Price per GPU-hour by GPU model "
                                     "(matched case-insensitively as a substring, longest first).")
    mig: dict[str, Price] = Field(default_factory=dict, description="Price per hour of a MIG profile, e.g. "
                                  "\"1g.10gb\"; unset profiles pay their share of the full GPU.")


class Team(Strict):
    name: str = Field(description="Team name, as reported and charged.")
    accounts: list[str] = Field(default_factory=list, description="Slurm accounts of the team.")
    namespaces: list[str] = Field(default_factory=list, description="Kubernetes namespaces of the team.")
    users: list[str] = Field(default_factory=list, description="Users of the team (when no account "
                             "matches).")
    emails: list[str] = Field(default_factory=list, description="Where team nudges go.")


class EmailConfig(Strict):
    smtp_host: str = Field("localhost", description="SMTP server.")
    smtp_port: int = Field(25, ge=1, le=65535, description="SMTP port.")
    security: Literal["none", "starttls", "ssl"] = Field("starttls", description="Transport security.")
    username: str | None = Field(None, description="SMTP user (password from `email.password`).")
    password: SecretRef = Field(default_factory=SecretRef, description="SMTP password: "
                                "`{env = \"VAR\"}` or `{file = \"/path\"}`.")
    timeout_s: float = Field(30, gt=0, le=3600, description="SMTP timeout in seconds.")
    sender: str = Field("gpu-audit@localhost", description="From address.")
    reply_to: str | None = Field(None, description="Reply-To address.")
    admin_to: list[str] = Field(default_factory=list, description="Recipients of the weekly admin report.")
    cc: list[str] = Field(default_factory=list, description="Cc on every message.")
    user_domain: str | None = Field(None, description="User nudges go to user@this domain; unset = no "
                                    "user nudges.")
    nudge_min_days: float = Field(7, ge=0, le=MAX_DAYS, description="Minimum days between two nudges to one person.")
    verify_tls: bool = Field(True, description="Verify the SMTP server's certificate.")


class ScheduleConfig(Strict):
    timezone: str = Field("UTC", description="Timezone of the cron expressions and reports.")
    collect: str = Field("*/5 * * * *", description="Cron: collect from every cluster.")
    audit: str = Field("7 * * * *", description="Cron: audit the last days.")
    report: str = Field("0 8 * * mon", description="Cron: weekly report and nudges.")
    chargeback: str = Field("0 6 1 * *", description="Cron: monthly chargeback files.")
    misfire_grace_s: int = Field(600, ge=1, le=86_400 * 31, description="A job this late still runs (once).")

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        return check_timezone(v)

    @field_validator("collect", "audit", "report", "chargeback")
    @classmethod
    def _cron(cls, v: str) -> str:
        from datetime import UTC, datetime

        from apscheduler.triggers.cron import CronTrigger

        try:
            trigger = CronTrigger.from_crontab(v, timezone="UTC")
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"bad cron expression {v[:80]!r}: {str(exc).splitlines()[0][:120]}") from None
        if trigger.get_next_fire_time(None, datetime.now(UTC)) is None:
            raise ValueError(f"cron expression {v[:80]!r} never fires (an impossible date such as 31 February)")
        return v


class ReportConfig(Strict):
    out_dir: Path = Field(Path("reports"), description="Where report and chargeback files are written "
                          "(relative to the config file's directory).")
    timezone: str = Field("UTC", description="Timezone for times shown in reports.")
    top_n: int = Field(25, ge=1, le=100_000, description="Rows in each report table before it is cut.")
    days: float = Field(7, gt=0, le=MAX_DAYS, description="Default audit/report window in days.")

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        return check_timezone(v)


class WebConfig(Strict):
    listen: str = Field("127.0.0.1:8080", description="HOST:PORT the read-only web UI (`gpu-audit web`, "
                        "`gpu-audit serve --web`) listens on; loopback unless you put it behind a proxy.")
    user_header: str | None = Field(None, description="Request header carrying the user a reverse proxy "
                                    "authenticated (like Grafana's auth proxy, e.g. X-WEBAUTH-USER). Set: "
                                    "requests without it are refused and non-admins see only their own "
                                    "allocations. Unset: everyone who can reach the port sees everything.")
    groups_header: str | None = Field(None, description="Request header with the user's groups, "
                                      "comma-separated (e.g. X-WEBAUTH-GROUPS).")
    admins: list[str] = Field(default_factory=list, description="Users who see every allocation.")
    admin_groups: list[str] = Field(default_factory=list, description="Groups whose members see every "
                                    "allocation.")
    page_rows: int = Field(100, ge=1, le=10000, description="Rows per page in the web UI's lists.")


class Policy(Strict):
    """When to nudge, escalate and act on an idle allocation (docs/enforcement.md). The first policy whose
    scope matches an allocation applies; an empty scope list matches everything."""

    name: str = Field(description="Policy name, recorded in the audit log.", pattern=r"^[A-Za-z0-9_.-]+$")
    clusters: list[str] = Field(default_factory=list, description="Only these clusters (empty = all).")
    partitions: list[str] = Field(default_factory=list, description="Only these Slurm partitions.")
    accounts: list[str] = Field(default_factory=list, description="Only these Slurm accounts.")
    namespaces: list[str] = Field(default_factory=list, description="Only these Kubernetes namespaces.")
    warn_after_hours: float | None = Field(1.0, gt=0, description="Nudge the owner after this many hours "
                                           "idle (unset = no warning).")
    escalate_after_hours: float | None = Field(None, gt=0, description="Tell the team lead / sponsor after "
                                               "this many hours idle (unset = no escalation).")
    escalate_to: list[str] = Field(default_factory=list, description="Escalation recipients: email "
                                   "addresses or channel names (`[[channels]]`); the team's `emails` too.")
    act_after_hours: float | None = Field(None, gt=0, description="Act after this many hours idle "
                                          "(unset = never act, only notify).")
    idle_fraction: float = Field(0.95, gt=0, le=1, description="Share of the reserved GPU time of the "
                                 "trailing window that must be judged idle (or mirage) for a stage to fire; "
                                 "unknown and busy_unverified time never count as idle.")
    min_coverage: float = Field(0.8, ge=0, le=1, description="Never act (or warn) when telemetry covers "
                                "less than this share of the window's reserved time.")
    act_on_util_only: bool = Field(False, description="Let idle-by-util time (GPU-Util fallback, no SM "
                                   "activity) count as idle for the act stage; off = only SM-verified idle.")
    warn_first: bool = Field(False, description="Act only on an allocation whose owner was really warned "
                             "(a warning sent in an earlier run); until then the act stage warns instead.")
    slurm_action: Literal["cancel", "requeue"] = Field("cancel", description="Slurm: `scancel` the job or "
                                                       "`scontrol requeue` it.")
    job_action: Literal["suspend", "delete"] = Field("suspend", description="Kubernetes Jobs: set "
                                                     "`spec.suspend` or delete the Job.")
    notify_reservations: bool = Field(True, description="Tell the owners of idle advance reservations "
                                      "(reservations are never changed).")


class ExemptionRule(Strict):
    """A standing exemption from enforcement; every non-empty criterion must match (lists: any of)."""

    reason: str = Field(description="Why, shown in reports and the audit log.")
    until: datetime | None = Field(None, description="Expiry (TOML date-time, UTC if no offset); unset = "
                                   "no expiry.")
    clusters: list[str] = Field(default_factory=list, description="Only in these clusters.")
    users: list[str] = Field(default_factory=list, description="These users.")
    accounts: list[str] = Field(default_factory=list, description="These Slurm accounts.")
    qos: list[str] = Field(default_factory=list, description="These Slurm QOS names.")
    namespaces: list[str] = Field(default_factory=list, description="These Kubernetes namespaces.")
    labels: dict[str, str] = Field(default_factory=dict, description="Pods carrying all these labels.")


class EnforceConfig(Strict):
    apply: bool = Field(False, description="Act for real without `--apply` (default: dry-run, decisions "
                        "are logged but nothing is changed or sent).")
    max_actions_per_run: int = Field(10, ge=0, description="At most this many acts per run; the rest are "
                                     "logged as skipped (cap reached).")
    scancel: str = Field("scancel", description="Path or name of scancel (Slurm cli backend).")
    exempt_annotation: str = Field("gpu-audit.io/exempt-until", description="Pod annotation holding an "
                                   "exemption expiry (ISO time), read when deciding.")
    exempt_reason_annotation: str = Field("gpu-audit.io/exempt-reason", description="Pod annotation "
                                          "holding the exemption's reason.")
    infra_node_states: list[str] = Field(
        ["DOWN", "DRAIN", "DRAINING", "DRAINED", "FAIL", "FAILING", "MAINT", "NOT_RESPONDING", "REBOOT",
         "POWER_DOWN", "POWERING_DOWN"], description="Slurm node states that mark infrastructure trouble: "
        "an allocation on such a node is never acted on.")


class Channel(Strict):
    """A chat or webhook destination through apprise (Slack, Teams, Mattermost, generic JSON webhooks)."""

    name: str = Field(description="Channel name (used in `policies[].escalate_to`).",
                      pattern=r"^[A-Za-z0-9_.-]+$")
    url: SecretRef = Field(description="The apprise URL, which holds the webhook secret: "
                           "`{env = \"VAR\"}` or `{file = \"/path\"}`; never in the config file.")
    teams: list[str] = Field(default_factory=list, description="Messages about these teams go here.")
    users: list[str] = Field(default_factory=list, description="Messages about these users go here.")
    kinds: list[Literal["warn", "escalate", "action", "nudge"]] = Field(
        ["warn", "escalate", "action", "nudge"], description="Which messages: enforcement warn / escalate "
        "/ action notices and weekly nudges.")
    timeout_s: float = Field(10, gt=0, description="HTTP timeout in seconds.")


class Config(Strict):
    store: StoreConfig = Field(default_factory=StoreConfig, description="The SQL store.")
    clusters: list[ClusterConfig] = Field(default_factory=list, description="Clusters to audit.")
    collect: CollectConfig = Field(default_factory=CollectConfig, description="How clusters are collected.")
    thresholds: Thresholds = Field(default_factory=Thresholds, description="Verdict and finding rules.")
    prices: PriceCard = Field(default_factory=PriceCard, description="Price card.")
    energy: EnergyConfig = Field(default_factory=EnergyConfig, description="Energy and carbon: idle power "
                                 "per GPU model, grid intensity per cluster (auditor/energy.py).")
    teams: list[Team] = Field(default_factory=list, description="Team mapping.")
    team_label: str = Field("team", description="Kubernetes pod label naming the team (checked before "
                            "the namespace mapping).")
    email: EmailConfig = Field(default_factory=EmailConfig, description="Email settings.")
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig, description="Daemon schedule.")
    report: ReportConfig = Field(default_factory=ReportConfig, description="Report output.")
    web: WebConfig = Field(default_factory=WebConfig, description="The read-only web UI.")
    policies: list[Policy] = Field(default_factory=list, description="Enforcement policies, first match "
                                   "wins (docs/enforcement.md).")
    exemptions: list[ExemptionRule] = Field(default_factory=list, description="Standing exemptions from "
                                            "enforcement.")
    enforce: EnforceConfig = Field(default_factory=EnforceConfig, description="Enforcement settings.")
    channels: list[Channel] = Field(default_factory=list, description="Chat and webhook channels (apprise).")

    @field_validator("clusters")
    @classmethod
    def _unique_clusters(cls, v: list[ClusterConfig]) -> list[ClusterConfig]:
        names = [c.name for c in v]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate cluster name {dupes[0]!r}")
        return v


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def one_line(exc: ValidationError, prefix: str = "") -> str:
    """The first validation error as ``key.path: what is wrong`` (plus how many more)."""
    errs = exc.errors()
    first = errs[0]
    loc = _loc(tuple(first["loc"]))
    path = f"{prefix}.{loc}" if prefix and loc != "(top level)" else (prefix or loc)
    msg = first["msg"].replace("Extra inputs are not permitted", "unknown key").removeprefix("Value error, ")
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    return f"{path}: {msg}{more}"


def validate_sources(cfg: Config) -> None:
    """Validate each connector's own options now, so a bad key fails `config check`, not a 3 a.m. run."""
    from connectors import connector_class

    for ci, cluster in enumerate(cfg.clusters):
        for role in ("allocations", "telemetry"):
            for si, src in enumerate(getattr(cluster, role)):
                where = f"clusters[{ci}].{role}[{si}]"
                try:
                    cls = connector_class(src.kind, role)
                except KeyError as exc:
                    raise ConfigError(f"{where}.kind: {exc.args[0]}") from None
                try:
                    cls.Options.model_validate(src.options())
                except ValidationError as exc:
                    raise ConfigError(one_line(exc, where)) from None
                for key, value in src.options().items():
                    if isinstance(value, str) and (key.endswith("url") or key == "host") and "://" in value:
                        check_url(value, f"{where}.{key}")


def parse(data: dict[str, Any], origin: str = "config") -> Config:
    try:
        cfg = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{origin}: {one_line(exc)}") from None
    try:
        validate_sources(cfg)
    except ConfigError as exc:
        raise ConfigError(f"{origin}: {exc}") from None
    return cfg


def load(path: str | Path | None = None) -> Config:
    """Load ``path``, else $GPU_AUDIT_CONFIG, else defaults (a store in the current directory)."""
    if path is None:
        path = os.environ.get(ENV_VAR) or None
    if path is None:
        return Config()
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such config file") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text (byte {exc.start})") from None
    cfg = parse(data, str(p))
    if not cfg.report.out_dir.is_absolute():  # relative paths are relative to the config file, like sources
        report = cfg.report.model_copy(update={"out_dir": p.resolve().parent / cfg.report.out_dir})
        cfg = cfg.model_copy(update={"report": report})
    return cfg
