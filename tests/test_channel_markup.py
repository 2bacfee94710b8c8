"""User text in chat messages is escaped for each channel's markup (issue 31 item 8), checked on the
payload each service receives over real HTTP(S): Mattermost, the generic JSON webhook and Teams workflows
at a loopback sink; Slack and Discord, whose hosts apprise fixes, through the same sink acting as the
HTTPS proxy (CONNECT answered with a self-signed certificate, ``?verify=no``). Expected texts are written
out by hand below, not computed by the code under test."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import need
from http_sink import Sink

from auditor.config import Channel, SecretRef
from auditor.report.channels import send_channel

# a user name from pod labels: a channel-wide mention, a markdown link to an attacker, a Slack/Discord
# mention, emphasis, and a terminal escape
EVIL = "mallory @channel [click](http://evil.example/x) <!here> <@U123> **bold**\x1b[2J"
Z = "\u200b"  # zero-width space: "@\u200bchannel" reads as @channel and notifies nobody
MD = (f"mallory @{Z}channel \\[click\\](http://evil.example/x) \\<!here\\> \\<@{Z}U123\\> "
      "\\*\\*bold\\*\\*\\\\x1b\\[2J")
SLACK = f"mallory @{Z}channel [click](http://evil.example/x) &lt;!here&gt; &lt;@{Z}U123&gt; **bold**\\x1b[2J"
PLAIN = "mallory @channel [click](http://evil.example/x) <!here> <@U123> **bold**\\x1b[2J"


@pytest.fixture
def sinks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[Sink, Sink]]:
    need(shutil.which("openssl") is not None, "openssl is needed for the HTTPS sink")
    with Sink(proxy_tls_dir=tmp_path) as plain, Sink(tls_dir=tmp_path) as tls:
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{plain.port}")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        yield plain, tls


def post(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("GPU_AUDIT_TEST_HOOK", url)
    send_channel(Channel(name="c", url=SecretRef(env="GPU_AUDIT_TEST_HOOK")), f"[gpu-audit] Pod {EVIL} is idle",
                 f"Pod ns/x (user {EVIL}) is idle.\nsecond line")


CASES: dict[str, tuple[str, Any]] = {
    # url (plain = the sink's port, tls = the HTTPS sink's), then how to read (title, text) from the payload
    "mattermost": ("mmost://127.0.0.1:{plain}/tok",
                   lambda b: tuple(b["text"].split("\r\n", 1))),
    "discord": ("discord://4174296324/tok?verify=no",
                lambda b: tuple(b["content"].split("\r\n", 1))),
    "teams": ("workflow://127.0.0.1:{tls}/wf1/sig?verify=no",
              lambda b: tuple(x["text"] for x in b["attachments"][0]["content"]["body"] if x["type"] == "TextBlock")),
    "slack": ("slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7?verify=no",
              lambda b: (b["attachments"][0]["title"], b["attachments"][0]["text"])),
    "json": ("json://127.0.0.1:{plain}/hook", lambda b: (b["title"], b["message"])),
}
EXPECTED = {
    "mattermost": (f"\\[gpu-audit\\] Pod {MD} is idle", f"Pod ns/x (user {MD}) is idle.\nsecond line"),
    "discord": (f"\\[gpu-audit\\] Pod {MD} is idle", f"Pod ns/x (user {MD}) is idle.\nsecond line"),
    "teams": (f"\\[gpu-audit\\] Pod {MD} is idle", f"Pod ns/x (user {MD}) is idle.\nsecond line"),
    "slack": (f"[gpu-audit] Pod {SLACK} is idle", f"Pod ns/x (user {SLACK}) is idle.\nsecond line"),
    "json": (f"[gpu-audit] Pod {PLAIN} is idle", f"Pod ns/x (user {PLAIN}) is idle.\nsecond line"),
}
HOSTS = {"discord": "discord.com", "slack": "hooks.slack.com"}


@pytest.mark.parametrize("channel", list(CASES))
def test_user_text_is_literal_in_each_channels_markup(sinks: tuple[Sink, Sink], channel: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    plain, tls = sinks
    url, read = CASES[channel]
    post(monkeypatch, url.format(plain=plain.port, tls=tls.port))
    (req,) = plain.requests + tls.requests
    if channel in HOSTS:  # really addressed to the service (through the proxy)
        assert req["host"] == HOSTS[channel]
    assert read(req["body"]) == EXPECTED[channel]
    if channel == "slack":
        assert req["body"].get("mrkdwn") is False  # no Slack formatting at all
    if channel == "discord":
        assert "allow_mentions" not in req["body"] or not any(req["body"]["allow_mentions"].values())
