"""The README a newcomer reads first (short, its two commands the ones CI runs, its links alive)
and the documentation site (``mkdocs build --strict``: a broken link or a missing page fails),
whose reference pages are generated from the code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def test_the_readme_is_short_and_opens_with_the_two_commands():
    assert len(README.encode()) <= 12 * 1024
    first_section = README.split("\n## ", 2)[1]
    assert first_section.startswith("The two commands")
    run, test = (b.strip() for b in _bash_blocks(first_section)[:2])
    assert run.endswith("&& gpubench run") and test.endswith("&& pytest")
    # .ci/run installs and tests exactly as command 2 says.
    install = test.split(" && ")[2]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert install in ci and "pytest" in ci


def test_every_relative_link_of_the_readme_exists():
    links = re.findall(r"\]\(([^)#\s]+)[^)]*\)", README)
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert local, "the README links to its documentation"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, missing


def test_every_docs_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = [p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")]
    assert pages and all(page in nav for page in pages), [p for p in pages if p not in nav]


@pytest.mark.slow
def test_the_site_builds_strictly_with_its_generated_reference(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is in the test extras: pip install -e '.[test]'")
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                           "-d", str(site)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1",
                                            "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    commands = (site / "reference" / "commands" / "index.html").read_text()
    for option in ("--no-hygiene", "--resume", "--timeout"):
        assert option in commands, option
    techniques = (site / "reference" / "techniques" / "index.html").read_text()
    from gpubench.train.techniques import TECHNIQUES

    assert all(f"<code>{t.field}</code>" in techniques or f"loader.{t.field}" in techniques
               for t in TECHNIQUES)
    metrics = (site / "reference" / "metrics" / "index.html").read_text()
    from gpubench.analysis.schema import METRICS

    assert all(f"<code>{f}</code>" in metrics for m in METRICS for f in m.fields)
    claims = (site / "reference" / "claims" / "index.html").read_text()
    from gpubench.analysis.advice import JUDGES
    from gpubench.suite.claims import CLAIMS, SOURCES

    assert set(JUDGES) == set(CLAIMS)  # every claim has its judge, and only claims have one
    for key, claim in CLAIMS.items():
        assert claim.sources and set(claim.sources) <= set(SOURCES), key
        assert f"<code>{key}</code>" in claims and f"<code>{JUDGES[key].__name__}</code>" in claims
    assert all(title.split(" (")[0] in claims for title in SOURCES.values())
    assert (site / "images" / "speedup.png").stat().st_size > 1000
