"""The emailed report and nudges as a mail client shows them: one column that fits 375, 640 and 1024 px in
the real Chromium (no element past the viewport, screenshots kept), readable colours in light and dark
themes, a well-formed MIME message (plain text + HTML with CID images and alt text), a nudge that leads
with a job still holding idle GPUs, hostile names escaped and shortened, short jobs' sparklines legible."""

from __future__ import annotations

import base64
import email
import re
import shutil
import sys
from datetime import timedelta
from email import policy
from pathlib import Path

import pytest

from auditor.audit.run import run_audit
from auditor.records import AllocatedGpu, Allocation
from auditor.report import charts, notify, render
from auditor.report import context as report

sys.path.insert(0, str(Path(__file__).parent))
from chromium import CONTRAST_JS, OVERFLOW_JS, artifacts_dir, browser  # noqa: E402
from test_report import T0, WEEK, buckets, make_cfg, new_store, week_records  # noqa: E402

LONG = "very-long-job-name-" * 300 + "<b>END</b>"
RTL = "\u202egnp.exe-evil"
WIDTHS = (375, 640, 1024)


def hostile_week(tmp_path: Path):  # noqa: ANN201 - (store, cfg, run_id)
    """week_records plus: a 5,700-character name, an RTL override, a 4-GPU 30-minute idle job and a job
    still running (no end) whose GPUs are idle to the end of the window."""
    cfg = make_cfg()
    store = new_store(tmp_path)
    t = T0 + timedelta(hours=1)
    recs: list = week_records(t)
    recs.append(Allocation("c1", "slurm", "201", name=LONG, user="alice", account="acct-ml", start=t,
                           end=t + timedelta(hours=6), gpus=[AllocatedGpu("n4", 0)]))
    recs += buckets("n4", 0, t, 6, 0.0, 0.0)
    recs.append(Allocation("c1", "slurm", "202", name=RTL, user="alice", account="acct-ml", start=t,
                           end=t + timedelta(hours=3), gpus=[AllocatedGpu("n4", 1)]))
    recs += buckets("n4", 1, t, 3, 0.0, 0.0)
    short = T0 + timedelta(days=2)
    recs.append(Allocation("c1", "slurm", "203", name="short", user="bob", account="acct-vis", start=short,
                           end=short + timedelta(minutes=30), gpus=[AllocatedGpu("n8", i) for i in range(4)]))
    for i in range(4):
        recs += buckets("n8", i, short, 0.5, 0.0, 0.0)
    run = T0 + timedelta(days=5)
    recs.append(Allocation("c1", "slurm", "204", name="notebook", user="alice", account="acct-ml", start=run,
                           end=None, gpus=[AllocatedGpu("n5", 0)]))
    recs += buckets("n5", 0, run, 48, 0.0, 0.0)  # one bucket width per store (auditor.store.meta)
    store.ingest(recs)
    return store, cfg, run_audit(store, cfg, T0, T0 + WEEK).run_id


@pytest.fixture
def world(tmp_path: Path):  # noqa: ANN201
    return hostile_week(tmp_path)


def inline_cids(msg: email.message.EmailMessage) -> str:
    """The HTML part with each cid: reference replaced by its MIME image part (what a mail client shows);
    fails if a reference has no part."""
    html = msg.get_body(("html",)).get_content()
    images = {p["Content-ID"].strip("<>"): p.get_content() for p in msg.walk()
              if p.get_content_type() == "image/png"}
    for cid in re.findall(r'src="cid:([^"]+)"', html):
        assert cid in images, f"cid:{cid} has no image part"
        html = html.replace(f"cid:{cid}", "data:image/png;base64," + base64.b64encode(images[cid]).decode())
    return html


def messages(store, cfg, run_id):  # noqa: ANN001, ANN201
    out, _ = notify.build_messages(store, cfg, run_id, now=T0 + WEEK + timedelta(hours=1))
    return {(o.kind, o.recipient): email.message_from_bytes(o.message.as_bytes(),
                                                             policy=policy.default) for o in out}, out


@pytest.mark.service
def test_email_fits_375_640_1024_px(world, tmp_path: Path) -> None:
    store, cfg, run_id = world
    msgs, _ = messages(store, cfg, run_id)
    pages = {"report": inline_cids(msgs[("admin_report", "ops@example.org")]),
             "nudge": inline_cids(msgs[("user_nudge", "alice@example.org")])}
    art = artifacts_dir(tmp_path)
    with browser(tmp_path) as ctx:
        page = ctx.new_page()
        for name, html in pages.items():
            path = tmp_path / f"{name}.html"
            path.write_text(html, encoding="utf-8")
            for w in WIDTHS:
                page.set_viewport_size({"width": w, "height": 800})
                page.goto(path.as_uri())
                probe = page.evaluate(OVERFLOW_JS)
                assert probe["n"] == 0 and probe["scroll"] <= w, (name, w, probe["offenders"])
                shot = art / f"email-{name}-{w}.png"
                page.screenshot(path=str(shot), full_page=True)
                assert charts.png_size(shot.read_bytes())[0] == w
                imgs = page.evaluate("() => [...document.images].map(i => [i.alt, i.naturalWidth])")
                assert imgs and all(alt and nw > 0 for alt, nw in imgs)  # every CID image resolved, alt set
            text = page.evaluate("() => document.body.innerText")
            assert "<b>END</b>" in text  # shown as text...
            assert page.evaluate("() => [...document.querySelectorAll('b')].filter(b => b.textContent === 'END')"
                                 ".length") == 0  # ...never parsed as markup
            assert LONG not in text and "very-long-job-name-very-long" in text  # shortened, still recognisable
            if name == "nudge":
                assert "still running" in text and "scancel" in text
    keep = Path(shutil.copy(art / "email-report-640.png", art / "email-640.png"))
    assert keep.stat().st_size > 10_000


@pytest.mark.service
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_email_colours_readable(world, tmp_path: Path, scheme: str) -> None:
    store, cfg, run_id = world
    msgs, _ = messages(store, cfg, run_id)
    path = tmp_path / "nudge.html"
    path.write_text(inline_cids(msgs[("user_nudge", "alice@example.org")]), encoding="utf-8")
    rpath = tmp_path / "report.html"
    rpath.write_text(inline_cids(msgs[("admin_report", "ops@example.org")]), encoding="utf-8")
    with browser(tmp_path, color_scheme=scheme) as ctx:
        page = ctx.new_page()
        for p in (path, rpath):
            page.goto(p.as_uri())
            bg = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
            assert bg == ("rgb(255, 255, 255)" if scheme == "light" else "rgb(15, 23, 42)")
            worst = min(page.evaluate(CONTRAST_JS), key=lambda r: r["ratio"])
            assert worst["ratio"] >= 4.5, worst  # WCAG AA for body text
        page.screenshot(path=str(artifacts_dir(tmp_path) / f"email-report-{scheme}.png"), full_page=True)


def test_mime_parts_subjects_and_words(world) -> None:
    store, cfg, run_id = world
    msgs, out = messages(store, cfg, run_id)
    nudge = msgs[("user_nudge", "alice@example.org")]
    assert nudge.get_content_type() == "multipart/alternative"
    text_part, related = nudge.get_payload()
    assert text_part.get_content_type() == "text/plain" and related.get_content_type() == "multipart/related"
    html = nudge.get_body(("html",)).get_content()
    assert "<script" not in html and "<link" not in html and not re.search(r"(src|href)=\"https?:", html)
    assert all(re.search(r'alt="[^"]+"', tag) for tag in re.findall(r"<img[^>]*>", html))
    assert len(re.findall(r'src="cid:', html)) == sum(1 for p in nudge.walk() if p.get_content_type() == "image/png")
    # job 204 has no end and was idle to the end of the window: the nudge leads with it
    body = text_part.get_content()
    assert body.lstrip().startswith("STILL RUNNING") and "scancel 204" in body
    assert 'id="still-running"' in html and "scancel 204" in html
    assert str(nudge["Subject"]).startswith("[gpu-audit] 1 still running with idle GPUs; user alice:")
    for o in out:  # never folded right after "Subject:" (some clients then show an empty subject)
        raw = o.message.as_bytes().decode("ascii")
        line = next(ln for ln in raw.split("\r\n") if ln.startswith("Subject:"))
        assert len(line.strip()) > len("Subject:") + 10, line
    # "how this was judged" in words: default idle_sm 0.05 -> "less than 5%"; no raw keys
    admin = msgs[("admin_report", "ops@example.org")]
    for b in (admin.get_body(("html",)).get_content(), admin.get_body(("plain",)).get_content()):
        assert "active less than 5% of the time" in b and "at least 80% of its observed time" in b
        assert "idle_sm" not in b and "idle_allocation_fraction" not in b
    # hostile names: escaped, shortened, bidi override stripped
    ahtml = admin.get_body(("html",)).get_content()
    assert LONG not in ahtml and "&lt;b&gt;END&lt;/b&gt;" in ahtml and "<b>END" not in ahtml
    assert "\u202e" not in ahtml and "gnp.exe-evil" in ahtml
    assert len(render.shorten(LONG)) == 48 and render.shorten(LONG).endswith("<b>END</b>")


def test_short_job_sparkline_is_legible(world) -> None:
    store, cfg, run_id = world
    ctx = report.build_context(store, cfg, run_id, full=True)
    f = next(r for r in ctx["top_idle"]["rows"] if r["job_id"] == "203")
    # 30 minutes inside one clock hour: one bin of one hour (bins are whole clock hours)
    assert f["sparkline"]["bin_hours"] == 1 and len(f["sparkline"]["sm"]) == 1 and f["sparkline"]["sm"][0] is not None
    img = charts.sparkline_image("x@y", f["sparkline"])
    # the one bin drawn 144 px wide (MIN_SPARK_WIDTH), and no grey "no data" pixel
    assert (img.width, img.height) == (144, 28)
    assert "without data" not in img.alt
    png = charts.sparkline(f["sparkline"]["sm"], f["sparkline"]["util"], bin_px=144)[0]
    assert png == img.png
    # an hour without data is a gap in a longer job's chart, drawn as such (bins are whole hours)
    gap = charts.sparkline_image("x@y", {"sm": [0.5, None, 0.5], "util": [0.9, None, 0.9], "bin_hours": 1})
    assert gap is not None and gap.width == 144 and "without data" in gap.alt
