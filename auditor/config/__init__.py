"""Configuration: one TOML file, validated on load, every key documented (docs/configuration.md).

Settings are data (pydantic models) so the docs test can walk them. Each connector owns the model of its
own options (``Options`` on the connector class); :func:`connectors.validate_sources` validates them under
the key path where they appear (``clusters[0].telemetry[1].url: field required``) once the file is loaded
here, so this layer needs no connector.
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from auditor.config.base import (
    SecretRef,
    Strict,
    check_store_url,
    check_timezone,
    store_url,
)
from auditor.config.thresholds import Thresholds
from auditor.energy import EnergyConfig
from auditor.errors import ConfigError

ENV_VAR = "GPU_AUDIT_CONFIG"
MAX_DAYS = 3660  # ten years: the bound of every span in days (larger ones overflow dates later)


#: The most processes one audit runs its clusters in (``store.audit_processes``)
MAX_AUDIT_PROCESSES = 64


class StoreConfig(Strict):
    url: str = Field("sqlite:///gpu-audit.db", description="SQLAlchemy URL of the store: `sqlite:///PATH` or "
                     "`postgresql+psycopg://USER@HOST/DB`.")
    url_env: str | None = Field(None, description="Environment variable holding the store URL "
                                "(use it when the URL carries a password); overrides `url`.")
    bucket_seconds: int = Field(300, ge=60, le=3600, description="Telemetry bucket length in seconds.")
    batch_rows: int = Field(50_000, ge=100, le=10_000_000, description="Rows per ingest transaction.")
    audit_processes: int = Field(1, ge=0, le=MAX_AUDIT_PROCESSES,
                                 description="PostgreSQL: processes one audit runs its clusters in, each on its "
                                 "own connection (attribution, judging, per-allocation totals and findings of "
                                 "its clusters; memory bounded by its own allocations); the run is stored only "
                                 "when every process succeeded. 1 = the audit's own process; 0 = one per CPU "
                                 "core, at most 8. Never more than the clusters. SQLite always audits in one "
                                 "(one writer at a time).")

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "judge_connections" in data:
            raise ValueError("store.judge_connections was removed: an audit runs its clusters in parallel "
                             "processes instead (store.audit_processes)")
        return data

    def resolved_url(self) -> str:
        if self.url_env:
            value = (os.environ.get(self.url_env) or "").strip()
            if not value:
                raise ConfigError(f"store.url_env: environment variable {self.url_env} is not set")
            try:
                check_store_url(value, "store.url_env")
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            return store_url(value)
        return self.url

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        check_store_url(v)  # the error's location names store.url
        return store_url(v)


class SourceConfig(BaseModel):
    """A connector: ``kind`` picks the class, the other keys are that connector's own options."""

    model_config = ConfigDict(extra="allow", frozen=True)
    kind: str = Field(description="Connector kind: see docs/configuration.md#connectors.")

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


def source_key(role: str, index: int, src: SourceConfig) -> str:
    """A configured source's key (``telemetry[0]:prometheus``): its watermark's and its health's name, read by
    collect, the daemon's health and enforcement's staleness rule."""
    return f"{role}[{index}]:{src.kind}"


class ClusterConfig(Strict):
    name: str = Field(description="Cluster name, as stored and reported.", pattern=r"^[A-Za-z0-9_.-]+$",
                      max_length=128)
    allocations: list[SourceConfig] = Field(default_factory=list,
                                            description="Allocation sources (Slurm, Kubernetes, files).")
    telemetry: list[SourceConfig] = Field(default_factory=list,
                                          description="Telemetry sources (Prometheus, files).")
    initial_days: float = Field(7, gt=0, le=MAX_DAYS, description="How far back the first collection reads.")
    fabric_nodes: list[Annotated[str, Field(min_length=1, max_length=255)]] = Field(
        default_factory=list, description="Nodes on the back-end fabric (InfiniBand or RoCE), as shell-style "
        "patterns of node names (`gpu-node-*`), beside those whose host telemetry reports an InfiniBand port: "
        "fabric fit (docs/definitions.md \"Fabric fit\").")


class CollectConfig(Strict):
    parallel: int = Field(1, ge=0, le=256, description="Clusters collected at once, each in its own worker "
                          "process that streams its records to the store in batches (`gpu-audit collect "
                          "--parallel N` overrides). 1: one cluster after another in this process (connector "
                          "state such as a Kubernetes watch is kept between a daemon's collections); 0: one "
                          "worker per cluster, at most the number of CPUs.")


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
    idle_budget_gpu_hours: float | None = Field(None, ge=0, description="Idle (and mirage) GPU-hours the team "
                                                "may leave idle per 7 days, prorated to the audit window; the "
                                                "report and the alert GpuAuditTeamOverIdleBudget say when it is "
                                                "passed. Unset: no budget.")


def http_url(v: str | None, key: str) -> str | None:
    """An http(s) address with a host and no query: it becomes links in emails (never a javascript: or mailto:
    one); the trailing slash dropped. Empty = unset."""
    if v is None or not v.strip():
        return None
    from urllib.parse import urlsplit

    u = urlsplit(v.strip())
    if u.scheme not in ("http", "https") or not u.netloc or u.query or u.fragment or any(
            c.isspace() or c in "\"<>'" for c in v.strip()):
        raise ValueError(f"{key} {v[:80]!r}: expected http(s)://HOST[/PATH], no query")
    return v.strip().rstrip("/")


class EmailConfig(Strict):
    smtp_host: str = Field("localhost", description="SMTP server.")
    smtp_port: int = Field(25, ge=1, le=65535, description="SMTP port.")
    security: Literal["none", "starttls", "ssl"] = Field("starttls", description="Transport security.")
    username: str | None = Field(None, description="SMTP user (password from `email.password`).")
    password: SecretRef = Field(default_factory=SecretRef, description="SMTP password: "
                                "`{env = \"VAR\"}` or `{file = \"/path\"}`.")
    sender: str = Field("gpu-audit@localhost", description="From address.")
    reply_to: str | None = Field(None, description="Reply-To address.")
    admin_to: list[str] = Field(default_factory=list, description="Recipients of the weekly admin report.")
    cc: list[str] = Field(default_factory=list, description="Cc on every message.")
    user_domain: str | None = Field(None, description="User nudges go to user@this domain; unset = no "
                                    "user nudges.")
    nudge_min_days: float = Field(7, ge=0, le=MAX_DAYS, description="Minimum days between two nudges to one person.")
    verify_tls: bool = Field(True, description="Verify the SMTP server's certificate.")
    help_url: str | None = Field(None, description="A page of your site's advice on using GPUs well (a "
                                 "knowledge-base article, e.g. https://kb.example.org/gpu-jobs): nudges link to "
                                 "it under \"What to do\".")

    @field_validator("help_url")
    @classmethod
    def _help_url(cls, v: str | None) -> str | None:
        return http_url(v, "email.help_url")


class ScheduleConfig(Strict):
    timezone: str = Field("UTC", description="Timezone of the cron expressions and reports.")
    collect: str = Field("*/5 * * * *", description="Cron: collect from every cluster.")
    audit: str = Field("7 * * * *", description="Cron: audit the last days.")
    report: str = Field("0 8 * * mon", description="Cron: weekly report and nudges.")
    chargeback: str = Field("0 6 1 * *", description="Cron: monthly chargeback files.")

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
    templates_dir: Path | None = Field(None, description="A directory of site templates (relative to the "
                                       "config file's directory): a file there named like a shipped one "
                                       "(`report.html.j2`, `nudge.html.j2`, `nudge.txt.j2`, `_macros.html.j2`, "
                                       "`report.txt.j2`, `report.md.j2`) is used instead of it in reports and "
                                       "emails; the others stay the shipped ones (docs/reports.md).")

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
    base_url: str | None = Field(None, description="Address readers reach the web UI at, e.g. "
                                 "https://gpu-audit.example.org (behind your proxy). Set: the weekly email's "
                                 "actions and the nudges link to each job's page there; unset: they name the "
                                 "`gpu-audit job REF` command only.")
    allow_unauthenticated: bool = Field(False, description="Serve the web UI on a non-loopback address "
                                        "without `user_header` (everyone who reaches the port sees every "
                                        "user's jobs and costs). Off: such a `listen` is refused.")

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, v: str | None) -> str | None:
        return http_url(v, "web.base_url")


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
    act_on_util_only: bool = Field(False, description="Let idle time judged without SM activity (idle-by-util, "
                                   "the GPU-Util fallback, and idle-by-counters, the stock counters) count as "
                                   "idle for the act stage; off = only SM-verified idle.")
    act_on_mirage: bool = Field(False, description="Let mirage time (GPU-Util busy while SM activity is idle) "
                                "count as idle for the act stage, once a GPU's mirage lasted "
                                "`thresholds.mirage_min_minutes`; off = mirage warns and escalates, never acts "
                                "(the owner sees a busy dashboard).")
    act_in_reservations: bool = Field(False, description="Act on allocations inside an advance reservation; "
                                      "off = leave them to the reservation (stopping one frees nothing the "
                                      "reservation does not hold): they are warned, never stopped.")
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


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The settings model inside an annotation (``list[Team]``, ``X | None``), if any."""
    from typing import get_args

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        m = _model_in(arg)
        if m is not None:
            return m
    return None


def keys_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys the table at ``loc`` (a validation error's location, less its last part) accepts: what an
    unknown key there may have been meant as. Empty where ``loc`` leaves the models (a dict of prices)."""
    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, int):
            continue  # an item of a list of tables: the model stays the item's
        info = current.model_fields.get(part) if current is not None else None
        current = _model_in(info.annotation) if info is not None else None
        if current is None:
            return []
    return list(current.model_fields) if current is not None else []


def _tokens(word: str) -> list[str]:
    return [t for t in re.split(r"[_\-.\s]+", word.lower()) if t]


def closeness(word: str, choice: str) -> float:
    """How near ``choice`` is to a mistyped ``word``, 0..1: the better of difflib's character ratio (a typo
    inside a word: ``idle_smm``) and the share of words the two names have in common, a word counting when
    difflib finds it 80 % alike (a key with a word added or dropped: ``idle_sm_activity`` is ``idle_sm``, not
    ``idle_gpus_fraction``, whose letters happen to line up more)."""
    import difflib

    chars = difflib.SequenceMatcher(None, word.lower(), choice.lower()).ratio()
    a, b = _tokens(word), _tokens(choice)
    if not a or not b:
        return chars
    same = sum(1 for t in a if any(t == u or difflib.SequenceMatcher(None, t, u).ratio() >= 0.8 for u in b))
    return max(chars, 2 * same / (len(a) + len(b)))


def suggest(word: str, choices: list[str], cutoff: float = 0.6) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` to a mistyped ``word`` (:func:`closeness`, at
    least ``cutoff``), else ""."""
    best = max(choices, key=lambda c: (closeness(word, c), -abs(len(c) - len(word))), default=None)
    return f" (did you mean {best!r}?)" if best is not None and closeness(word, best) >= cutoff else ""


def errors(exc: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> list[str]:
    """Every validation error as ``key.path: what is wrong``; an unknown key of ``model`` (the model that was
    validated) names the nearest known key, when one is near."""
    out = []
    for err in exc.errors():
        loc_t = tuple(err["loc"])
        loc = _loc(loc_t)
        path = f"{prefix}.{loc}" if prefix and loc != "(top level)" else (prefix or loc)
        msg = err["msg"].replace("Extra inputs are not permitted", "unknown key").removeprefix("Value error, ")
        if err["type"] == "extra_forbidden" and model is not None and loc_t and isinstance(loc_t[-1], str):
            msg += suggest(loc_t[-1], keys_at(model, loc_t[:-1]))
        out.append(f"{path}: {msg}")
    return out


def one_line(exc: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> str:
    """The first validation error as ``key.path: what is wrong``, saying how many more there are (all of
    them: ``gpu-audit config check``)."""
    errs = errors(exc, prefix, model)
    more = f" (and {len(errs) - 1} more: `gpu-audit config check` lists them)" if len(errs) > 1 else ""
    return f"{errs[0]}{more}"


def parse(data: dict[str, Any], origin: str = "config") -> Config:
    """``data`` validated; a retired key (:mod:`auditor.config.retired`) is an error naming its constant when its
    value differs from it, else a warning."""
    from auditor.config.retired import retire

    data, retired_errors, retired_warnings = retire(data)
    if retired_errors:
        more = (f" (and {len(retired_errors) - 1} more: `gpu-audit config check` lists them)"
                if len(retired_errors) > 1 else "")
        raise ConfigError(f"{origin}: {retired_errors[0]}{more}")
    for line in retired_warnings:
        logging.getLogger("gpu_audit.config").warning("%s: %s", origin, line)
    try:
        cfg = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{origin}: {one_line(exc, model=Config)}") from None
    return cfg


def sqlite_file(url: str) -> Path | None:
    """The file an SQLite store URL names (None for another backend or an in-memory database): what a command
    that only reads must find, not create."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        u = make_url(url)
    except (ArgumentError, ValueError):
        return None
    db = u.database or ""
    if u.get_backend_name() != "sqlite" or db in ("", ":memory:") or db.startswith("file:"):
        return None
    return Path(db).expanduser()


def config_path(path: str | Path | None = None) -> Path | None:
    """The config file a command reads: ``path`` (-c), else $GPU_AUDIT_CONFIG, else none (defaults)."""
    path = path or os.environ.get(ENV_VAR) or None
    return Path(path) if path else None


def read(path: str | Path) -> dict[str, Any]:
    """The TOML document at ``path``; an unreadable or malformed file is one ConfigError line."""
    p = Path(path)
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such config file") from None
    except IsADirectoryError:
        raise ConfigError(f"{p}: is a directory, not a config file") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text (byte {exc.start})") from None


def load(path: str | Path | None = None) -> Config:
    """Load ``path``, else $GPU_AUDIT_CONFIG, else defaults (a store in the current directory)."""
    p = config_path(path)
    if p is None:
        return Config()
    return resolved(parse(read(p), str(p)), p)


def resolved(cfg: Config, p: Path) -> Config:
    """``cfg`` read from ``p`` with its relative paths taken relative to the file, like sources' paths."""
    if not cfg.report.out_dir.is_absolute():
        report = cfg.report.model_copy(update={"out_dir": p.resolve().parent / cfg.report.out_dir})
        cfg = cfg.model_copy(update={"report": report})
    if cfg.report.templates_dir is not None and not cfg.report.templates_dir.is_absolute():
        report = cfg.report.model_copy(update={"templates_dir": p.resolve().parent / cfg.report.templates_dir})
        cfg = cfg.model_copy(update={"report": report})
    return cfg
