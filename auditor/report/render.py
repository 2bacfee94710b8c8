"""Rendering the report context (:mod:`auditor.report.context`) as HTML, plain text, Markdown and JSON.

One Jinja2 environment per output kind, each escaping by default: HTML autoescapes; Markdown escapes every
``{{ }}`` for table cells; text strips control characters. User-controlled strings (job names, users,
labels) therefore cannot inject markup, table columns or terminal escapes whichever template prints them.
"""

from __future__ import annotations

import copy
import csv
import re
from collections.abc import Iterable
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox
import markupsafe

from auditor import jsonsafe, owned
from auditor.audit import kinds
from auditor.config import Config
from auditor.errors import GpuAuditError
from auditor.report import charts
from auditor.report.context import build_context
from auditor.report.outfile import write_text
from auditor.resources import resource_dir
from auditor.store.engine import Store

FORMATS = ("html", "text", "md", "json")
EXT = {"html": "html", "text": "txt", "md": "md", "json": "json"}
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|<>~])")


class Raw(str):
    """Output the template built itself (macro output, bars), exempt from escaping."""


SHOWN_MAX = 256  # characters of one user-controlled value shown in HTML, text, Markdown and email


def cap_shown(value: Any) -> Any:
    """A value too long to show, cut in the middle (the tail of a path or name is kept) with its full
    length said: a 10 MB job name makes a readable row, not a 20 MB email. The store and the JSON export
    keep it whole. Template-built output (Raw, Markup) and non-text values pass unchanged."""
    if isinstance(value, str) and not isinstance(value, Raw | markupsafe.Markup) and len(value) > SHOWN_MAX:
        return f"{value[:SHOWN_MAX - 64]}…[{len(value):,} characters]…{value[-40:]}"
    return value


def plain(value: Any) -> str:
    """Text-safe: no control characters (terminal escapes, bidi overrides); newlines become spaces."""
    if value is None or isinstance(value, jinja2.runtime.Undefined):
        return ""
    if type(value) is str and len(value) <= SHOWN_MAX and value.isprintable():
        return value  # the common case: nothing to cut or strip (control, bidi and separator characters
        # and newlines are all non-printable)
    if isinstance(value, Raw):
        return str(value)
    s = str(cap_shown(value)).replace("\r\n", " ").replace("\n", " ").replace("\r", " ").replace("\t", " ")
    return _CONTROL.sub("", s)


def md(value: Any) -> str:
    """Markdown-table-safe: text-safe plus every Markdown/HTML special character backslash-escaped."""
    if isinstance(value, Raw):
        return str(value)
    return _MD_SPECIAL.sub(r"\\\1", plain(value))


def shorten(value: Any, limit: int = 48) -> str:
    """One line of text-safe user text (job, user, team names) at most ``limit`` characters long.

    Hostile names (HTML, bidi overrides, 10,000 characters) must not break a layout: the start and the end
    are kept around an ellipsis so two long names that differ at the end stay apart. HTML templates still
    autoescape the result; the full name goes in a ``title`` attribute."""
    s = plain(value)
    if len(s) <= limit:
        return s
    head = (limit - 1) * 2 // 3
    return s[:head] + "\u2026" + s[len(s) - (limit - 1 - head):]


LONG_TOKEN = 20  # characters: a name with a longer run (no space or hyphen to break at) may break anywhere
_BREAKS = re.compile(r"[\s-]+")


def wrap_css(value: Any) -> str:
    """How a user-controlled name may wrap in the email: like any word (``break-word``: table columns keep
    it whole, so "platform" never reads "platf/orm" at 375 px), unless it holds a run of more than
    LONG_TOKEN characters with nowhere to break, which may then break anywhere (no sideways scrolling)."""
    s = plain(value)
    return "overflow-wrap:anywhere;" if any(len(t) > LONG_TOKEN for t in _BREAKS.split(s)) \
        else "overflow-wrap:break-word;"


def fmt_hours(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.1f}"


def fmt_pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 100:.0f}%"


def fmt_money(v: float | None, currency: str = "") -> str:
    if v is None:
        return "n/a"
    return f"{plain(currency)} {v:,.2f}".strip()


def fmt_signed(v: float | None) -> str:
    return "" if v is None else f"{v:+,.1f}"


def plural(n: int | None, word: str, many: str | None = None) -> str:
    """``1 episode``, ``2 episodes``, ``0 episodes``: a count with its noun (``many`` for irregular plurals)."""
    n = int(n or 0)
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def _filters(env: jinja2.Environment) -> None:
    env.filters.update(hours=fmt_hours, shorten=shorten, plural=plural,
                       pct=fmt_pct, money=fmt_money, signed=fmt_signed, plain=plain, raw=Raw,
                       mdbar=lambda v, w=12: Raw("`" + charts.text_bar(v, 1.0, width=w) + "`"),
                       textbar=lambda v, w=20: charts.text_bar(v, 1.0, width=w),
                       barpct=lambda v: charts.bar_width(v, 1.0), kind_label=kinds.label, wrapcss=wrap_css,
                       kneesvg=charts.knee_svg, kneetext=charts.knee_text)


class SiteSandbox(jinja2.sandbox.SandboxedEnvironment):
    """Jinja's sandbox, where an unsafe attribute stops the render at once (the sandbox's own answer, an
    undefined value, would print as nothing through the text and Markdown finalizers)."""

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        raise jinja2.sandbox.SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object "
                                           "is unsafe")


@lru_cache(maxsize=8)
def environment(kind: str, template_dir: str | None = None) -> jinja2.Environment:
    """The Jinja2 environment for ``kind`` (html, text or md) over the shipped templates, with a site's
    ``template_dir`` (``report.templates_dir``) looked in first: a file there named like a shipped one
    replaces it, the rest stay the shipped ones (escaping is the environment's, whoever wrote the file)."""
    shipped = jinja2.FileSystemLoader(str(resource_dir("templates")))
    loader: jinja2.BaseLoader = shipped if not template_dir else jinja2.ChoiceLoader(
        [jinja2.FileSystemLoader(template_dir), shipped])
    # a site's templates are code gpu-audit did not ship: Jinja's sandbox (no attribute of an underscore, no
    # unsafe method: no way to the process's environment, files or commands) with only the documented context
    # and the globals the shipped templates use (issue 44)
    make = SiteSandbox if template_dir else jinja2.Environment
    if kind == "html":
        env = make(loader=loader, autoescape=True, undefined=jinja2.StrictUndefined,
                   trim_blocks=True, lstrip_blocks=True, finalize=cap_shown)
    elif kind == "md":
        env = make(loader=loader, autoescape=False, finalize=md, trim_blocks=True,
                   lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    elif kind == "text":
        env = make(loader=loader, autoescape=False, finalize=plain, trim_blocks=True,
                   lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    else:
        raise ValueError(f"no template environment for {kind!r}")
    if template_dir:
        env.globals = {k: env.globals[k] for k in SITE_GLOBALS}
    _filters(env)
    return env


#: The globals a site template has besides the documented context (Jinja's lipsum, cycler and joiner are not
#: offered: the path to Python's globals an unsandboxed template took)
SITE_GLOBALS = ("range", "dict", "namespace")


def attach_images(ctx: dict[str, Any], *, mode: str) -> tuple[dict[str, Any], list[charts.Image]]:
    """A copy of ``ctx`` whose finding rows carry ``image`` (src, alt, size) for their sparkline.

    ``mode`` "data" embeds the PNG (a browser, a saved file); "cid" refers to a MIME part (email)."""
    out = copy.copy(ctx)
    images: list[charts.Image] = []
    for key in ("top_idle", "episodes", "reservations", "low_efficiency", "unmonitored", "findings", "stragglers"):
        table = ctx.get(key)
        if not table:
            continue
        rows = []
        for row in table["rows"]:
            row = dict(row)
            img = charts.sparkline_image(f"spark-{key}-{row.get('id')}@gpu-audit", row.get("sparkline"))
            if img is not None:
                images.append(img)
                row["image"] = {"src": img.data_uri if mode == "data" else "cid:" + img.cid, "alt": img.alt,
                                "short_alt": img.short_alt, "width": img.width, "height": img.height}
            else:
                row["image"] = None
            rows.append(row)
        out[key] = {**table, "rows": rows}
    return out, images


def site_templates(cfg: Config) -> str | None:
    """``report.templates_dir`` as the directory to look in first, or None; one line when it is no directory."""
    d = cfg.report.templates_dir
    if d is None:
        return None
    if not Path(d).is_dir():
        raise GpuAuditError(f"report.templates_dir {d}: not a directory")
    return str(d)


def get_template(kind: str, name: str, templates: str | None = None) -> jinja2.Template:
    """Template ``name`` of environment ``kind``; a site template that does not parse is one line naming it."""
    try:
        return environment(kind, templates).get_template(name)
    except jinja2.TemplateSyntaxError as exc:
        raise GpuAuditError(f"template {exc.filename or name} line {exc.lineno}: {exc.message}") from None
    except jinja2.TemplateNotFound:
        raise GpuAuditError(f"template {name} not found") from None


def _render(t: jinja2.Template, values: dict[str, Any]) -> str:
    """A site template that names a value the report has not is one line, not a traceback."""
    try:
        return t.render(**values)
    except jinja2.sandbox.SecurityError as exc:
        raise GpuAuditError(f"template {t.filename or t.name}: refused by the sandbox site templates run in: "
                            f"{exc}") from None
    except jinja2.UndefinedError as exc:
        raise GpuAuditError(f"template {t.filename or t.name}: {exc.message}") from None


def render_html(ctx: dict[str, Any], *, template: str = "report.html.j2", mode: str = "data",
                templates: str | None = None) -> tuple[str, list[charts.Image]]:
    """HTML plus the images it refers to (needed as MIME parts when ``mode`` is "cid")."""
    c, images = attach_images(ctx, mode=mode)
    return _render(get_template("html", template, templates), c), images


def render_text(ctx: dict[str, Any], template: str = "report.txt.j2", *, templates: str | None = None) -> str:
    return _render(get_template("text", template, templates), ctx)


def render_md(ctx: dict[str, Any], template: str = "report.md.j2", *, templates: str | None = None) -> str:
    return _render(get_template("md", template, templates), ctx)


def render_json(ctx: dict[str, Any], *, compact: bool = False) -> str:
    """JSON of the report; ``compact`` for the full export file (every finding: size and speed matter)."""
    if compact:
        return jsonsafe.dumps(ctx, separators=(",", ":"), default=str, ensure_ascii=False) + "\n"
    return jsonsafe.dumps(ctx, indent=2, default=str, ensure_ascii=False) + "\n"


def render(ctx: dict[str, Any], fmt: str, *, templates: str | None = None) -> str:
    if fmt == "html":
        return render_html(ctx, templates=templates)[0]
    if fmt == "text":
        return render_text(ctx, templates=templates)
    if fmt == "md":
        return render_md(ctx, templates=templates)
    if fmt == "json":
        return render_json(ctx)
    raise GpuAuditError(f"unknown report format {fmt!r} (choose from {', '.join(FORMATS)})")


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """Findings as CSV; cells that a spreadsheet would run as a formula get a leading quote."""
    fields = list(rows[0].keys()) if rows else ["id", "kind", "cluster", "job_id", "job_name", "user",
                                                "account", "team", "gpu_hours", "idle_gpu_hours", "cost"]
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: csv_cell(v) for k, v in r.items()})


_FORMULA = ("=", "+", "-", "@")


def csv_cell(v: Any) -> Any:
    """A CSV cell: text-safe, and a leading = + - @ (a spreadsheet formula) neutralised by a quote."""
    if type(v) is str and len(v) <= SHOWN_MAX and v.isprintable():  # plain(v) is v itself
        return "'" + v if v[:1] in _FORMULA else v
    if isinstance(v, str):
        v = plain(v)
        if v[:1] in _FORMULA:
            return "'" + v
    return v


def write_reports(store: Store, cfg: Config, run_id: int, out_dir: Path | str,
                  formats: Iterable[str] = FORMATS, *, now: datetime | None = None) -> list[Path]:
    """Write report-<run>.<ext> for each format plus findings-<run>.csv (what cut tables point to).

    The report context is built once for every format; the JSON export (every row of every table) and the
    CSV are streamed from the store in chunks (:mod:`auditor.report.export`), so memory stays bounded."""
    from auditor.report.export import write_exports

    fmts = list(dict.fromkeys(formats)) or list(FORMATS)
    for f in fmts:
        if f not in FORMATS:
            raise GpuAuditError(f"unknown report format {f!r} (choose from {', '.join(FORMATS)})")
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GpuAuditError(f"cannot create report directory {out}: {exc.strerror}") from None
    groups: dict[str, Any] = {}
    site = site_templates(cfg)
    ctx = build_context(store, cfg, run_id, now=now, keep=groups)
    # every file this writes is absent or gpu-audit's own, checked before the first is written (auditor.owned)
    owned.check(out, [*(out / f"report-{run_id}.{EXT[f]}" for f in fmts), out / ctx["files"]["csv"]])
    paths = []
    for f in fmts:
        p = out / f"report-{run_id}.{EXT[f]}"
        if f != "json":
            write_text(p, render(ctx, f, templates=site), named=False)
        paths.append(p)
    csv_path = out / ctx["files"]["csv"]
    write_exports(store, cfg, run_id, ctx, csv_path=csv_path, cell=csv_cell, groups=groups,
                  json_path=out / f"report-{run_id}.json" if "json" in fmts else None)
    paths.append(csv_path)
    return paths
