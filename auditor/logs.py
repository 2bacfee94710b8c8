"""Logging: one line per event; user-controlled text has control characters escaped so a job name cannot
forge log lines. Secrets never reach a log line: URLs are redacted with :func:`redact_url`."""

from __future__ import annotations

import logging
import re

# C0 and DEL, C1 (U+0085 NEL among them), the Unicode line/paragraph separators and the bidi controls
# (embeddings, overrides, isolates, marks): each can break or visually reorder a log line.
_CTRL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u061c\u202a-\u202e\u2066-\u2069]")


def log_safe(text: object) -> str:
    """Escape control characters (newlines included) in text that came from users or schedulers.

    The one escaping for every line a terminal or a log shows (log records, the CLI's error line,
    ``enforce``, ``enforce-log``, ``exempt``, ``job``, ``jobs``): a newline cannot forge a second line, an
    escape sequence cannot repaint the screen, a bidi override cannot reorder what is read; what was there
    stays visible as ``\\xNN`` / ``\\uNNNN``."""
    def esc(m: re.Match[str]) -> str:
        c = ord(m.group())
        return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"

    return _CTRL.sub(esc, str(text))


def has_control(text: object) -> bool:
    """Whether :func:`log_safe` would change ``text`` (input that must be one plain line)."""
    return _CTRL.search(str(text)) is not None


_USERINFO = re.compile(r"^(\w[\w+.-]*://[^:/@?#]*):[^@]*@")  # the password of scheme://user:password@
# query parameters that carry a secret: libpq's password/sslpassword, tokens, keys, signatures
SECRET_PARAM = re.compile(r"pass|pwd|secret|token|key|auth|credential|sig", re.I)
_SECRET_PARAM = re.compile(rf"([?&;][^=&#;]*(?:{SECRET_PARAM.pattern})[^=&#;]*=)[^&#;]*", re.I)


def redact_url(url: str) -> str:
    """``url`` with its password and secret-bearing query parameters replaced by ``***``, in every form
    (``user:pw@host``, ``?password=``, ``&sslpassword=``, ``?api_key=``); the rest is left as written."""
    return _SECRET_PARAM.sub(r"\1***", _USERINFO.sub(r"\1:***@", str(url)))


_SECRETS: set[str] = set()
MIN_SECRET = 4  # shorter values would scrub ordinary words; such a secret is too weak to matter here


def register_secret(value: str | None) -> None:
    """Remember a secret this process resolved, so :func:`scrub` hides it wherever it turns up (an HTTP
    library quoting a header in an error, a traceback, a driver message)."""
    if not value:
        return
    for form in (value, *value.splitlines(), repr(value)[1:-1]):  # a library may quote a line, or its repr
        if len(form) >= MIN_SECRET:
            _SECRETS.add(form)


def scrub(text: str) -> str:
    """``text`` with every registered secret (and the password part of any URL) replaced by ``***``."""
    for secret in sorted(_SECRETS, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, "***")
    return _USERINFO_ANYWHERE.sub(r"\1:***@", text)


_USERINFO_ANYWHERE = re.compile(r"(\w[\w+.-]*://[^:/@?#\s]*):[^@\s]*@")


class _SafeFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        record.msg = log_safe(scrub(record.getMessage()))
        record.args = None
        return scrub(super().format(record))  # the traceback too, under --debug


def setup_logging(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(_SafeFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    root = logging.getLogger("gpu_audit")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = True  # handlers above (none in the CLI; pytest's caplog in tests) see records too
