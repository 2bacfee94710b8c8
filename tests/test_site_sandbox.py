"""Site templates (report.templates_dir) run in Jinja's sandbox with only the documented context (issue 44):
a template that reaches for the process's environment, Python's globals or a command stops with one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from auditor.errors import GpuAuditError
from auditor.report import render

SECRET = "s3cr3t-smtp-password"
HOSTILE = {
    "env-lipsum": "{{ lipsum.__globals__['os'].environ['GPU_AUDIT_SMTP_PASSWORD'] }}",
    "env-cycler": "{{ cycler.__init__.__globals__.os.environ.GPU_AUDIT_SMTP_PASSWORD }}",
    "env-namespace": "{{ namespace.__init__.__globals__['os'].environ['GPU_AUDIT_SMTP_PASSWORD'] }}",
    "cmd-namespace": "{{ namespace.__init__.__globals__['os'].popen('touch PWNED').read() }}",
    "cmd-mro": "{% for c in ''.__class__.__mro__[1].__subclasses__() %}{% if c.__name__ == 'Popen' %}"
               "{{ c(['touch', 'PWNED']) }}{% endif %}{% endfor %}",
    "context": "{{ self._TemplateReference__context }}",
    "format": "{{ '{0.__class__.__init__.__globals__}'.format(dict) }}",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
@pytest.mark.parametrize("kind", ["text", "html", "md"])
def test_a_hostile_site_template_fails_with_one_line(name: str, kind: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the first printed the password and the fourth ran a command."""
    monkeypatch.setenv("GPU_AUDIT_SMTP_PASSWORD", SECRET)
    monkeypatch.chdir(tmp_path)
    site = tmp_path / "site"
    site.mkdir()
    (site / "t.j2").write_text(HOSTILE[name].replace("PWNED", str(tmp_path / "pwned")), encoding="utf-8")
    with pytest.raises(GpuAuditError) as got:
        out = (render.render_html({}, template="t.j2", templates=str(site))[0] if kind == "html" else
               render.render_text({}, "t.j2", templates=str(site)) if kind == "text" else
               render.render_md({}, "t.j2", templates=str(site)))
        assert SECRET not in out
    msg = str(got.value)
    assert msg.startswith(f"template {site / 't.j2'}: ") and len(msg.splitlines()) == 1, msg
    assert SECRET not in msg and not (tmp_path / "pwned").exists()


def test_a_site_template_keeps_the_documented_context(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "t.j2").write_text("{% set ns = namespace(n=0) %}{% for i in range(3) %}{% set ns.n = ns.n + i %}"
                               "{% endfor %}{{ who }} {{ ns.n }} {{ dict(a=1).a }} {{ 2.5|money('USD') }}",
                               encoding="utf-8")
    assert render.render_text({"who": "bob"}, "t.j2", templates=str(site)) == "bob 3 1 USD 2.50"
