"""The weekly email leads with this week's actions (who, what, how much, what to do, where to look further),
its words wrap whole at 375 px, its bars carry a scale, and the nudges say how to look further (issue 35).

The demo week's planted problems give the figures by hand (tests/test_demo.py derives them); the browser
checks run in the real Chromium (tests/chromium.py)."""

from __future__ import annotations

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
