"""The weekly email leads with this week's actions (who, what, how much, what to do, where to look further),
its words wrap whole at 375 px, its bars carry a scale, and the nudges say how to look further (issue 35).

The demo week's planted problems give the figures by hand (tests/test_demo.py derives them); the browser
checks run in the real Chromium (tests/chromium.py)."""

from __future__ import annotations

import email
import json
import re
import sys
from email import policy
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import ValidationError
from starlette.testclient import TestClient

from auditor.cli import main
from auditor.config import Config, WebConfig, load
from auditor.report import context as report
from auditor.report import notify, render
from auditor.report.words import judged_in_words
from auditor.store.engine import Store
from auditor.web.app import create_app

sys.path.insert(0, str(Path(__file__).parent))
from chromium import CONTRAST_JS, OVERFLOW_JS, artifacts_dir, browser  # noqa: E402
from test_email_layout import hostile_week, inline_cids  # noqa: E402

# Every place where a line break falls between two letters or digits of one word in a table cell: a word
# broken mid-word ("platf/orm", "GP/U-h"). Each character's box is measured with a Range; a break after a
# hyphen, a slash or a space is a normal one.
BROKEN_WORDS_JS = """() => {
  const out = [], word = /[\\p{L}\\p{N}]/u, range = document.createRange();
  const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    const el = n.parentElement;
    if (!el || !el.closest('td, th') || el.getBoundingClientRect().width === 0) continue;
    const s = n.textContent;
    let top = null, prev = '';
    for (let i = 0; i < s.length; i++) {
      const ch = s[i];
      if (/\\s/.test(ch)) { top = null; prev = ''; continue; }
      range.setStart(n, i); range.setEnd(n, i + 1);
      const r = range.getClientRects();
      if (!r.length) continue;
      if (top !== null && r[0].top > top + 2 && word.test(prev) && word.test(ch))
        out.push({at: s.slice(Math.max(0, i - 10), i) + '/' + s.slice(i, i + 10), tag: el.tagName,
                  id: (el.closest('[id]') || {}).id || ''});
      top = r[0].top; prev = ch;
    }
  }
  return out;
}"""

BASE = "https://gpu-audit.example.org/ga"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, Config, int, Path]:
    """The demo week (tests/test_demo.py's), its config with web.base_url set."""
    out = tmp_path_factory.mktemp("demo")
    res = CliRunner().invoke(main, ["--json", "demo", "--out", str(out), "--now", "2026-11-29T00:00"])
    assert res.exit_code == 0, res.output
    cfg = load(out / "demo.toml")
    cfg = cfg.model_copy(update={"web": cfg.web.model_copy(update={"base_url": BASE + "/"})})
    return Store.open(cfg.store.url), cfg, int(json.loads(res.stdout)["run_id"]), out


def allocation_id(store: Store, external_id: str) -> int:
    from sqlalchemy import text

    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT id FROM allocations WHERE external_id = :e"), {"e": external_id}).scalar())


def test_actions_are_the_planted_problems_by_hand(demo) -> None:  # noqa: ANN001
    store, cfg, rid, out = demo
    ctx = report.build_context(store, cfg, rid)
    a = ctx["actions"]
    got = [(r["scope"], r["ref"] or r["name"], r["user"], round(r["cost"], 6), round(r["idle_gpu_hours"], 6))
           for r in a["rows"]]
    # by hand (auditor/demo.py's plan and prices: H100 4.0, A100 2.5 per GPU-hour): the hackathon reservation
    # nobody used, 8 GPUs x 24 h = 192 x 4.0; 1003 uses 1 of 4 GPUs for 36 h: 3 x 36 = 108 x 4.0; 1002 spins
    # 2 GPUs for 48 h: 96 x 4.0; the notebook pod idles 120 h on one A100: 120 x 2.5; dana's notebook on the 2026
    # site idles 72 h on an H100: 72 x 4.0; cut: 96.0, twice (1004 hangs 2 GPUs for 12 h and 1001 stalls 8 GPUs
    # for 3 h, 24 x 4.0 each)
    assert got == [("reservation", "team-b-hackathon", "", 768.0, 192.0),
                   ("allocation", "hpc:1003", "carol", 432.0, 108.0),
                   ("allocation", "hpc:1002", "bob", 384.0, 96.0),
                   ("allocation", "k8s:research/notebook-alice-6d5f8b7c9-tx2lq", "alice", 300.0, 120.0),
                   ("allocation", "k8s-2026:research/dana-notebook-0", "dana", 288.0, 72.0)]
    # 1001 and 1004 both, and erin's notebook on a MIG slice of the 2026 site (96 h x 1/7 x 2.5): eight candidates
    assert a["shown"] == 5 and a["total"] == 8 and a["cut"]
    # the week's idle cost: 1596 of allocations (384 + 96 + 432 + 300 + 288 + 96) plus the reservation's 768
    assert a["totals"]["cost"] == pytest.approx(768 + 432 + 384 + 300 + 288)
    assert a["totals"]["week_idle_cost"] == pytest.approx(1596 + 96 / 7 * 2.5 + 768)
    assert a["totals"]["share"] == pytest.approx(2172 / (2364 + 96 / 7 * 2.5))
    first = a["rows"][1]
    assert first["command"] == "gpu-audit job hpc:1003" and first["team"] == "llm" and first["kind"] == "idle_gpus"
    assert first["advice"].startswith("Right-size")
    assert first["url"] == f"{BASE}/allocation/{allocation_id(store, '1003')}"
    assert a["rows"][0]["url"] == f"{BASE}/findings?kind=idle_reservation&run={rid}"
    # the REF and the link lead somewhere real: the CLI and the web UI show that job
    for row in a["rows"][1:]:
        res = CliRunner().invoke(main, ["-c", str(out / "demo.toml"), "job", row["ref"]])
        assert res.exit_code == 0 and row["job_id"] in res.output, res.output
    page = TestClient(create_app(store, cfg)).get(first["url"].removeprefix(BASE))
    assert page.status_code == 200 and "ddp-debug" in page.text


def test_every_surface_says_the_actions_figures(demo) -> None:  # noqa: ANN001
    """The HTML, text and Markdown reports lead with the actions; the nudge about the same job says the same
    cost and the same look-further line (one computation: context.actions_section, allocation_links)."""
    store, cfg, rid, _ = demo
    ctx = report.build_context(store, cfg, rid)
    html, txt, md = render.render_html(ctx)[0], render.render_text(ctx), render.render_md(ctx)
    for body, title, numbers in ((html, "This week's actions", "The week in numbers"),
                                 (txt, "THIS WEEK'S ACTIONS", "HEADLINE"), (md, "## This week's actions",
                                                                            "## The week in numbers")):
        lead = body[body.index(title):body.index(numbers)]
        for want in ("USD 768.00", "team-b-hackathon", "USD 432.00", "carol", "ddp-debug",
                     "gpu-audit job hpc:1003", f"{BASE}/allocation/{allocation_id(store, '1003')}",
                     "Right-size"):
            assert want in lead, (title, want)
    msgs, _ = notify.build_messages(store, cfg, rid)
    carol = next(o.message for o in msgs if o.recipient == "carol@example.com")
    text_part = carol.get_body(("plain",)).get_content()
    nhtml = carol.get_body(("html",)).get_content()
    url = f"{BASE}/allocation/{allocation_id(store, '1003')}"
    assert "USD 432.00" in text_part and f"Look further: gpu-audit job hpc:1003 or {url}" in text_part
    assert f'href="{url}"' in nhtml and "gpu-audit job hpc:1003" in nhtml
    # without web.base_url: the command only, no link anywhere
    plain_cfg = cfg.model_copy(update={"web": WebConfig()})
    bare = report.build_context(store, plain_cfg, rid)
    assert all(r["url"] is None for r in bare["actions"]["rows"])
    assert "href=" not in render.render_html(bare)[0]


def test_a_user_with_many_idle_allocations_is_one_action(tmp_path: Path) -> None:
    store, cfg, rid = hostile_week(tmp_path)
    rows = report.build_context(store, cfg, rid)["actions"]["rows"]
    alice = [r for r in rows if r["user"] == "alice"]
    # alice's four idle jobs (tests/test_email_layout.py, tests/test_report.py): 101 idle 8 h, 201 6 h,
    # 202 3 h, 204 48 h, one GPU each at the default price 2.0: 65 GPU-hours, 130.00
    assert len(alice) == 1 and alice[0]["scope"] == "user" and alice[0]["allocations"] == 4
    assert (alice[0]["idle_gpu_hours"], alice[0]["cost"]) == (65.0, 130.0)
    assert alice[0]["job_id"] == "204" and alice[0]["command"] == "gpu-audit jobs --user alice"
    assert rows[0] is alice[0]  # the costliest action
    assert [r["job_id"] for r in rows[1:]] == ["102", "104", "203"]  # 12.0, 10.0, 4.0: one each


def test_text_report_reads_cleanly(demo) -> None:  # noqa: ANN001
    store, cfg, rid, _ = demo
    txt = render.render_text(report.build_context(store, cfg, rid))
    # the reservation has no user: said, not left blank ("on hpc -  (team-b / platform)")
    assert "reservation team-b-hackathon on hpc - (no user) (team-b / platform)" in txt
    assert " -  (" not in txt
    for line in txt.splitlines():  # no double space but the aligned columns (labels, names, bars)
        rest = re.sub(r"^\s*[A-Z][A-Za-z -]*:\s+", "", line.strip())  # "Idle cost:            USD ..."
        rest = re.sub(r"^\S.{0,40}?\s+[#.]{20}\s+", "", rest)  # "llm          ##....  12% idle: ..."
        assert "  " not in rest, line
    # bars on a 0-100 % scale, aligned: idle share by hand, 20 characters each
    teams = txt[txt.index("BY TEAM"):txt.index("BY ACCOUNT")].splitlines()[1:4]
    accounts = txt[txt.index("BY ACCOUNT"):txt.index("TOP IDLE")].splitlines()[1:6]
    for block in (teams, accounts):
        cols = {ln.index(re.search(r"[#.]{20}", ln).group(0)) for ln in block}
        assert len(cols) == 1, block
    bars = {ln.split()[0]: re.search(r"[#.]{20}", ln).group(0).count("#") for ln in teams + accounts}
    # llm 156 / 1288 = 12 % -> 2 of 20; platform 96 / 634 = 15 % -> 3; research (120 + 72) / (320 + 168) = 39 %
    # -> 8; k8s/research 120 / 120 -> 20; k8s-2026/research 72 / 72 -> 20; k8s/inference 0 / 336 -> 0
    assert bars == {"llm": 2, "platform": 3, "research": 8, "hpc/team-a": 2, "hpc/team-b": 6,
                    "k8s/research": 20, "k8s-2026/research": 20, "k8s/inference": 0}
    # one GPU-hour, singular
    assert "at least 1 GPU-hour." in txt and "1 GPU-hours" not in txt
    words = " ".join(judged_in_words({"idle_allocation_min_gpu_hours": 2, "episode_hours": 1,
                                      "mirage_min_minutes": 1, "low_efficiency_min_gpu_hours": 1}))
    assert "at least 2 GPU-hours." in words and "Idle spells of 1 hour or more" in words
    assert "lasts 1 minute." in words and "at least 1 observed GPU-hour are" in words


def test_web_base_url_is_an_http_address() -> None:
    assert WebConfig(base_url="https://x.example.org/ga/").base_url == "https://x.example.org/ga"
    assert WebConfig(base_url="").base_url is None
    for bad in ("javascript:alert(1)", "https://x.org/?a=1", "ftp://x.org", "https://x.org/a b", "x.org"):
        with pytest.raises(ValidationError, match="expected http"):
            WebConfig(base_url=bad)


BOX_JS = """sel => { const e = document.querySelector(sel); if (!e) return null;
  const r = e.getBoundingClientRect(); return {top: r.top, bottom: r.bottom, text: e.innerText}; }"""


@pytest.mark.service
def test_first_screen_holds_the_actions_and_no_word_breaks(demo, tmp_path: Path) -> None:  # noqa: ANN001
    store, cfg, rid, _ = demo
    msgs, _ = notify.build_messages(store, cfg, rid)
    by = {(o.kind, o.recipient): email.message_from_bytes(o.message.as_bytes(), policy=policy.default)
          for o in msgs}
    report_html = inline_cids(by[("admin_report", "gpu-platform@example.com")])
    nudge = by[("user_nudge", "alice@example.com")]
    pages = {"report": report_html, "nudge": inline_cids(nudge),
             # images blocked: every cid: left unresolved, the mail client shows the alt text
             "nudge-noimg": nudge.get_body(("html",)).get_content()}
    art = artifacts_dir(tmp_path)
    with browser(tmp_path) as ctx:
        page = ctx.new_page()
        for name, html in pages.items():
            path = tmp_path / f"{name}.html"
            path.write_text(html, encoding="utf-8")
            for w in (640, 375):
                page.set_viewport_size({"width": w, "height": 800})
                page.goto(path.as_uri())
                page.screenshot(path=str(art / f"email-actions-{name}-{w}.png"))
                probe = page.evaluate(OVERFLOW_JS)
                assert probe["n"] == 0 and probe["scroll"] <= w, (name, w, probe["offenders"])
                broken = page.evaluate(BROKEN_WORDS_JS)
                assert broken == [], (name, w, broken[:10])
                if name == "report" and w == 640:
                    # the first screen (800 px) holds the title and the first actions: who, what, how much
                    title = page.evaluate(BOX_JS, "#actions-title")
                    cards = page.evaluate("() => [...document.querySelectorAll('#actions td.action')].map("
                                          "e => [e.getBoundingClientRect().bottom, e.innerText])")
                    assert title["bottom"] < 200 and len(cards) == 5
                    seen = " ".join(t for bottom, t in cards if bottom <= 800)
                    for want in ("USD 768.00", "team-b-hackathon", "USD 432.00", "carol", "ddp-debug",
                                 "gpu-audit job hpc:1003", "USD 384.00", "bob"):
                        assert want in seen, want
                    headline = page.evaluate(BOX_JS, "#idle-cost")
                    assert headline["top"] > cards[2][0]  # the headline comes after the actions


def test_site_templates_come_first_and_still_escape(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "nudge.txt.j2").write_text("Site nudge for {{ who }}: {{ findings.totals.cost|money(currency) }}\n"
                                       "{% for f in findings.rows %}{{ f.command }}\n{% endfor %}", encoding="utf-8")
    (site / "t.html.j2").write_text("<p>{{ x }}</p>", encoding="utf-8")
    (site / "bad.html.j2").write_text("{% if %}", encoding="utf-8")
    (site / "typo.html.j2").write_text("{{ nosuchvalue.x }}", encoding="utf-8")
    store, cfg, rid = hostile_week(tmp_path / "w")
    cfg = cfg.model_copy(update={
        "report": cfg.report.model_copy(update={"templates_dir": site}),
        "email": cfg.email.model_copy(update={"help_url": "https://kb.example.org/gpu-jobs"})})
    msgs, _ = notify.build_messages(store, cfg, rid)
    bob = next(o.message for o in msgs if o.recipient == "bob@example.org")
    # bob's two idle jobs (tests/test_email_actions.py above): 104 5.0 h and 203 2.0 h at 2.0 = 14.00
    assert bob.get_body(("plain",)).get_content() == ("Site nudge for bob: USD 14.00\ngpu-audit job c1:104\n"
                                                      "gpu-audit job c1:203\n")
    html = bob.get_body(("html",)).get_content()  # not overridden: the shipped one, with the advice page
    assert "Hello" in html and 'href="https://kb.example.org/gpu-jobs"' in html
    assert render.render_html({"x": "<script>"}, template="t.html.j2", templates=str(site))[0] == \
        "<p>&lt;script&gt;</p>"
    with pytest.raises(render.GpuAuditError, match=r"^template .*bad.html.j2 line 1: "):
        render.render_html({}, template="bad.html.j2", templates=str(site))
    with pytest.raises(render.GpuAuditError, match=r"^template .*typo.html.j2: 'nosuchvalue' is undefined"):
        render.render_html({}, template="typo.html.j2", templates=str(site))
    gone = cfg.model_copy(update={"report": cfg.report.model_copy(update={"templates_dir": tmp_path / "nope"})})
    with pytest.raises(render.GpuAuditError, match="report.templates_dir .*nope: not a directory"):
        notify.build_messages(store, gone, rid)


def test_site_settings_load_and_validate(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text('[report]\ntemplates_dir = "site"\n[email]\nhelp_url = "https://kb.example.org/gpu/"\n'
                 '[web]\nbase_url = "https://ga.example.org"\n', encoding="utf-8")
    cfg = load(p)
    assert cfg.report.templates_dir == tmp_path.resolve() / "site"  # relative to the config file
    assert cfg.email.help_url == "https://kb.example.org/gpu" and cfg.web.base_url == "https://ga.example.org"
    p.write_text('[email]\nhelp_url = "javascript:alert(1)"\n', encoding="utf-8")
    with pytest.raises(Exception, match=r"email.help_url 'javascript:alert\(1\)': expected http"):
        load(p)


@pytest.mark.service
def test_links_and_actions_readable_in_dark_mode(demo, tmp_path: Path) -> None:  # noqa: ANN001
    """With web.base_url the emails carry links: readable on the dark theme too (WCAG AA), as is every
    other text the demo's report shows (lemon nodes, action cards)."""
    store, cfg, rid, _ = demo
    msgs, _ = notify.build_messages(store, cfg, rid)
    by = {o.recipient: o.message for o in msgs}
    with browser(tmp_path, color_scheme="dark") as ctx:
        page = ctx.new_page()
        for rcpt in ("gpu-platform@example.com", "carol@example.com"):
            path = tmp_path / f"{rcpt}.html"
            path.write_text(inline_cids(email.message_from_bytes(by[rcpt].as_bytes(), policy=policy.default)),
                            encoding="utf-8")
            page.goto(path.as_uri())
            assert page.evaluate("() => document.links.length") > 0
            worst = min(page.evaluate(CONTRAST_JS), key=lambda r: r["ratio"])
            assert worst["ratio"] >= 4.5, (rcpt, worst)
