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
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from auditor.errors import ConfigError

ENV_VAR = "GPU_AUDIT_CONFIG"


class Strict(BaseModel):
    """Unknown keys are errors: a typo must not silently fall back to a default."""

    model_config = ConfigDict(extra="forbid", frozen=True)


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
            return value
        if self.file:
            return read_secret_file(self.file, what)
        return None

    def __repr__(self) -> str:
        return f"SecretRef(env={self.env!r}, file={str(self.file) if self.file else None!r})"


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
    return text.strip().splitlines()[0] if text.strip() else ""


class StoreConfig(Strict):
    url: str = Field("sqlite:///gpu-audit.db", description="SQLAlchemy URL of the store.")
    url_env: str | None = Field(None, description="Environment variable holding the store URL "
                                "(use it when the URL carries a password); overrides `url`.")
    bucket_seconds: int = Field(300, ge=60, le=3600, description="Telemetry bucket length in seconds.")
    batch_rows: int = Field(50_000, ge=100, description="Rows per ingest transaction.")

    def resolved_url(self) -> str:
        if self.url_env:
            value = os.environ.get(self.url_env)
            if not value:
                raise ConfigError(f"store.url_env: environment variable {self.url_env} is not set")
            return value
        return self.url


class SourceConfig(BaseModel):
    """A connector: ``kind`` picks the class, the other keys are that connector's own options."""

    model_config = ConfigDict(extra="allow", frozen=True)
    kind: str = Field(description="Connector kind: see docs/configuration.md#connectors.")

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ClusterConfig(Strict):
    name: str = Field(description="Cluster name, as stored and reported.", pattern=r"^[A-Za-z0-9_.-]+$")
    allocations: list[SourceConfig] = Field(default_factory=list,
                                            description="Allocation sources (Slurm, Kubernetes, files).")
    telemetry: list[SourceConfig] = Field(default_factory=list,
                                          description="Telemetry sources (Prometheus, files).")
    overlap_minutes: int = Field(30, ge=0, description="Each collection re-reads this much before the "
                                 "watermark, so late data is picked up; ingest is idempotent.")
    initial_days: float = Field(7, gt=0, description="How far back the first collection reads.")


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
    mirage_min_minutes: float = Field(30, ge=0, description="util_mirage: minimum mirage minutes.")
    unmonitored_coverage: float = Field(0.5, ge=0, le=1, description="unmonitored: observed share of "
                                        "reserved time below this.")
    episode_hours: float = Field(2.0, gt=0, description="idle_episode: minimum contiguous idle span.")
    low_efficiency_sm: float = Field(0.25, ge=0, le=1, description="low_efficiency: mean SM activity "
                                     "below this.")
    low_efficiency_min_gpu_hours: float = Field(4.0, ge=0, description="low_efficiency: minimum observed "
                                                "GPU-hours.")
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


class PriceCard(Strict):
    currency: str = Field("USD", description="Currency code printed with every cost.")
    default: float = Field(2.0, ge=0, description="Price per GPU-hour of a model not listed.")
    models: dict[str, float] = Field(default_factory=dict, description="Price per GPU-hour by GPU model "
                                     "(matched case-insensitively as a substring, longest first).")
    mig: dict[str, float] = Field(default_factory=dict, description="Price per hour of a MIG profile, e.g. "
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
    timeout_s: float = Field(30, gt=0, description="SMTP timeout in seconds.")
    sender: str = Field("gpu-audit@localhost", description="From address.")
    reply_to: str | None = Field(None, description="Reply-To address.")
    admin_to: list[str] = Field(default_factory=list, description="Recipients of the weekly admin report.")
    cc: list[str] = Field(default_factory=list, description="Cc on every message.")
    user_domain: str | None = Field(None, description="User nudges go to user@this domain; unset = no "
                                    "user nudges.")
    nudge_min_days: float = Field(7, ge=0, description="Minimum days between two nudges to one person.")
    verify_tls: bool = Field(True, description="Verify the SMTP server's certificate.")


class ScheduleConfig(Strict):
    timezone: str = Field("UTC", description="Timezone of the cron expressions and reports.")
    collect: str = Field("*/5 * * * *", description="Cron: collect from every cluster.")
    audit: str = Field("7 * * * *", description="Cron: audit the last days.")
    report: str = Field("0 8 * * mon", description="Cron: weekly report and nudges.")
    chargeback: str = Field("0 6 1 * *", description="Cron: monthly chargeback files.")
    misfire_grace_s: int = Field(600, ge=1, description="A job this late still runs (once).")


class ReportConfig(Strict):
    out_dir: Path = Field(Path("reports"), description="Where report and chargeback files are written "
                          "(relative to the config file's directory).")
    timezone: str = Field("UTC", description="Timezone for times shown in reports.")
    top_n: int = Field(25, ge=1, description="Rows in each report table before it is cut.")
    days: float = Field(7, gt=0, description="Default audit/report window in days.")


class Config(Strict):
    store: StoreConfig = Field(default_factory=StoreConfig, description="The SQL store.")
    clusters: list[ClusterConfig] = Field(default_factory=list, description="Clusters to audit.")
    thresholds: Thresholds = Field(default_factory=Thresholds, description="Verdict and finding rules.")
    prices: PriceCard = Field(default_factory=PriceCard, description="Price card.")
    teams: list[Team] = Field(default_factory=list, description="Team mapping.")
    team_label: str = Field("team", description="Kubernetes pod label naming the team (checked before "
                            "the namespace mapping).")
    email: EmailConfig = Field(default_factory=EmailConfig, description="Email settings.")
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig, description="Daemon schedule.")
    report: ReportConfig = Field(default_factory=ReportConfig, description="Report output.")

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
    msg = first["msg"].replace("Extra inputs are not permitted", "unknown key")
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
