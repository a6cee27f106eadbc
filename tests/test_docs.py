"""The README a newcomer reads first (short, its two commands the ones CI runs, its links alive)
and the documentation site (``mkdocs build --strict``: a broken link or a missing page fails),
whose reference pages are generated from the code: each hand-written page opens with the command
that does its thing, then headings; no paragraph runs on; commands fit the page; the README's
workload example, the CI workflows and the repository's address are on the site."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PAGES = sorted((ROOT / "docs").glob("*.md"))
"""The hand-written pages (the reference pages are generated when the site is built)."""
SNIPPET = re.compile(r'^--8<-- "([^"]+)"$', flags=re.M)


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def test_the_readme_is_short_and_opens_with_the_two_commands():
    assert len(README.encode()) <= 12 * 1024
    first_section = README.split("\n## ", 2)[1]
    assert first_section.startswith("The two commands")
    run, test = (b.strip() for b in _bash_blocks(first_section)[:2])
    assert run.endswith("&& gpubench run") and test.split(" && ")[-1].startswith("pytest")
    # .ci/run installs and tests exactly as command 2 says.
    install, tests = test.split(" && ")[2], test.split(" && ")[-1]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert install in ci and tests in ci  # the README's test command, as it is written
    # ... then a quick run whose compare with the committed baseline confirms a flag first
    # (report only: a shared machine is too noisy to fail on time)
    compare = " ".join(ci[ci.index(next(x for x in ci if x.startswith("gpubench compare"))):])
    assert "--confirm" in compare and "--report-only" in compare


def test_the_example_workflow_gates_on_a_confirmed_regression():
    """Its compare step fails the job (no --report-only) and re-measures a flag first."""
    for path in (ROOT / "examples" / "github-actions").glob("*.yml"):
        text = path.read_text()
        compares = re.findall(r"gpubench compare (?:[^\n]*\\\n)*[^\n]*", text)
        assert compares, path.name
        for command in compares:
            assert "--confirm" in command and "--report-only" not in command, command


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


def _fenced(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block, files a snippet line includes expanded."""
    return [(lang, SNIPPET.sub(lambda m: (ROOT / m[1]).read_text().rstrip("\n"), body))
            for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)]


def test_every_page_opens_with_its_command_then_headings():
    """The command (or code) that does the page's thing comes before its first section, and
    the page is cut into sections after it."""
    assert len(PAGES) >= 16
    for page in PAGES:
        text = page.read_text()
        assert text.startswith("# "), page.name
        first_section = re.search(r"^## ", text, flags=re.M)
        assert first_section, f"{page.name} has no headings"
        head = text[:first_section.start()]
        assert re.search(r"^```\w+\n", head, flags=re.M), f"{page.name}: no command on top"
        assert len(head.split()) < 250, f"{page.name}: {len(head.split())} words before a heading"


def test_no_paragraph_of_the_site_runs_on():
    """A missing blank line merges a paragraph with the list that follows it (cases.md once
    had five technique groups in one 584-word paragraph): no paragraph or list item over 300
    words, as Markdown renders it."""
    import markdown

    for page in PAGES:
        html = markdown.markdown(page.read_text(), extensions=["tables", "fenced_code"])
        for block in re.findall(r"<(?:p|li)>(.*?)</(?:p|li)>", html, flags=re.S):
            words = len(re.sub(r"<[^>]+>", " ", block).split())
            assert words <= 300, f"{page.name}: {words} words: {block[:120]}"


def test_commands_and_examples_fit_the_page():
    """At 1400 px the code box of a page holds 100 characters a line; the README's one-line
    commands (122 characters) were cut off. Every line of a page's commands and code, included
    files too (output, ``text``, wraps on the page like a terminal's)."""
    for page in PAGES:
        for lang, body in _fenced(page.read_text()):
            if lang == "text":
                continue
            long = [line for line in body.splitlines() if len(line) > 100]
            assert not long, (page.name, lang, long)


def test_getting_started_runs_the_readmes_two_commands():
    """The site's first commands are the README's, one step a line."""
    ours = [" && ".join(b.strip().splitlines())
            for b in _bash_blocks((ROOT / "docs" / "getting-started.md").read_text())]
    theirs = [b.strip() for b in _bash_blocks(README.split("\n## ", 2)[1])[:2]]
    assert all(command in ours for command in theirs), (theirs, ours)


def test_the_workloads_pages_first_example_builds_a_workload(tmp_path):
    """The example the README's workload link leads to (``my_model.py:workload``)."""
    page = (ROOT / "docs" / "workloads.md").read_text()
    example = re.search(r"```python\n(.*?)```", page, flags=re.S)[1]
    assert "Workload(" in example and "def workload(" in example
    assert "my_model.py:workload" in README and "my_model.py" in page
    namespace: dict = {}
    exec(compile(example, "my_model.py", "exec"), namespace)
    from gpubench import Workload

    workload = namespace["workload"]()
    assert isinstance(workload, Workload)
    import torch

    inputs, targets = workload.make_batch(4, torch.Generator().manual_seed(0))
    loss = workload.loss_fn(workload.build_model()(inputs), targets)
    assert loss.ndim == 0 and torch.isfinite(loss)


def test_the_ci_page_shows_every_workflow_whole():
    """docs/ci.md includes each example workflow and the project's CI job as they are (mkdocs'
    snippets: the page cannot drift from the files), and links to each."""
    ci = (ROOT / "docs" / "ci.md").read_text()
    files = sorted(p.relative_to(ROOT).as_posix()
                   for p in (ROOT / "examples" / "github-actions").glob("*.yml"))
    assert files and ".ci/run" not in files
    for name in [*files, ".ci/run"]:
        assert f'--8<-- "{name}"' in ci, name
        assert f"](../{name})" in ci, name
    included = "\n".join(body for _, body in _fenced(ci))
    assert all((ROOT / name).read_text().strip() in included for name in [*files, ".ci/run"])
    assert re.search(r"^\s+- pymdownx\.snippets:", (ROOT / "mkdocs.yml").read_text(), re.M)


def test_the_site_links_to_the_repository():
    """repo_url is set (the header's link, each page's edit link), and a page's link to a file
    outside docs/ becomes a link to it there; a link to a missing file fails the build."""
    config = (ROOT / "mkdocs.yml").read_text()
    repo_url = re.search(r"^repo_url: (\S+)$", config, flags=re.M)[1]
    edit_uri = re.search(r"^edit_uri: (\S+)$", config, flags=re.M)[1]
    assert re.match(r"https://[^/]+/.+", repo_url) and edit_uri.startswith("edit/")
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from docs_reference import repository_link
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    link = repository_link("../examples/custom-model/workload.py", "workloads.md", repo_url,
                           edit_uri)
    branch = edit_uri.split("/")[1]
    assert link == f"{repo_url}/blob/{branch}/examples/custom-model/workload.py"
    assert repository_link("../examples", "ci.md", repo_url, edit_uri).endswith(
        f"/tree/{branch}/examples")
    assert repository_link("parity.md", "advice.md", repo_url, edit_uri) is None
    assert repository_link("https://pytorch.org", "memory.md", repo_url, edit_uri) is None
    with pytest.raises(ValueError, match="does not exist"):
        repository_link("../examples/nothing.yml", "ci.md", repo_url, edit_uri)


def test_the_home_page_shows_a_command_and_the_answer_it_ends_with():
    """The first screen: the command, then real output, the committed CPU run's answer, read
    from its report when the site is built (so it cannot drift from it)."""
    index = (ROOT / "docs" / "index.md").read_text()
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from docs_reference import ANSWER_MARK, committed_answer
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    first_section = index.index("\n## ")
    assert index.index("```bash") < index.index(ANSWER_MARK) < first_section
    answer, where = committed_answer((ROOT / "results" / "cpu" / "report.md").read_text())
    assert re.match(r"\*\*\w+\*\*: train with ", answer) and answer.count(": train with ") == 1
    assert "torch" in where and re.search(r"\d{4}-\d\d-\d\d", where)
    with pytest.raises(ValueError, match="no answer section"):
        committed_answer("# gpubench report\n\n## Runs\n")


@pytest.mark.slow
def test_the_site_builds_strictly_with_its_generated_reference(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is in the test extras: pip install -e '.[test]'")
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                           "-d", str(site)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1",
                                            "HOME": str(tmp_path),
                                            # the session's workload facts: no probe builds
                                            "GPUBENCH_CACHE_DIR": os.environ["GPUBENCH_CACHE_DIR"]})
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
    home = (site / "index.html").read_text()
    assert ": train with" in home and "admonition example" in home
    ci = html.unescape(re.sub(r"<[^>]+>", "", (site / "ci" / "index.html").read_text()))
    assert "benchmark-action/github-action-benchmark@v1" in ci and "set -euo pipefail" in ci
    workloads = (site / "workloads" / "index.html").read_text()
    assert 'href="https://' in workloads and "/blob/" in workloads  # the example, at its home
