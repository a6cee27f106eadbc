"""The HTML report renders for a browser: real tables, coloured verdicts, a table of contents whose
links land on anchors, embedded charts, and no Markdown syntax left in the text."""

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

from gpubench.report.page import write_report

COMMITTED = Path(__file__).resolve().parent / "data" / "cpu-run.json"  # a frozen CPU run


class Page(HTMLParser):
    """Tags, ids, links, image sources and the visible text of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.images: list[str] = []
        self.verdicts: list[tuple[str, str]] = []
        self.text: list[str] = []
        self._skip = 0
        self._verdict: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "a" and "href" in attrs:
            self.links.append(attrs["href"])
        if tag == "img":
            self.images.append(attrs.get("src", ""))
        if tag in ("style", "script"):
            self._skip += 1
        if "verdict" in (attrs.get("class") or "").split():
            self._verdict = attrs["class"]

    def handle_endtag(self, tag):
        if tag in ("style", "script"):
            self._skip -= 1

    def handle_data(self, data):
        if self._verdict:
            self.verdicts.append((self._verdict, data))
            self._verdict = None
        if not self._skip:
            self.text.append(data)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, Page]:
    """The report of one model of the committed CPU results (resnet18: every chart)."""
    data = json.loads(COMMITTED.read_text())
    data["benchmarks"] = [b for b in data["benchmarks"]
                          if (b.get("extra_info") or {}).get("model") == "resnet18"]
    folder = tmp_path_factory.mktemp("report")
    src = folder / "bert.json"
    src.write_text(json.dumps(data))
    write_report([src], folder)
    page = Page()
    page.feed((folder / "report.html").read_text())
    return folder, page


def test_tables_are_html_tables_not_markdown(report):
    _, page = report
    assert page.tags.count("table") >= 3  # runs, advice, summary
    assert page.tags.count("th") > 10 and page.tags.count("td") > 50
    assert "pre" not in page.tags
    text = "".join(page.text)
    assert "| --- |" not in text and "|---|" not in text and "---:" not in text
    assert "**" not in text
    assert "](" not in text  # no Markdown links or images left


def test_verdicts_are_coloured(report):
    _, page = report
    verdicts = dict((word, cls) for cls, word in page.verdicts)
    assert {"does not hold", "inconclusive", "not testable here"} <= set(verdicts)
    assert "bad" in verdicts["does not hold"]
    assert "good" in verdicts.get("holds", "good")
    assert len({verdicts[w] for w in ("does not hold", "inconclusive",
                                      "not testable here")}) == 3


def test_contents_link_to_anchors_and_charts_are_embedded(report):
    folder, page = report
    internal = [link[1:] for link in page.links if link.startswith("#")]
    for anchor in ("speedup", "memory", "pareto", "advice", "summary"):
        assert anchor in internal and anchor in page.ids
    assert set(internal) <= page.ids
    assert not [link for link in page.links if link.endswith(".png")]  # chart links jump in page
    assert len(page.images) == len(list(folder.glob("*.png"))) >= 5
    assert all(src.startswith("data:image/png;base64,") for src in page.images)


def test_reading_guide_defines_speedup_as_throughput_ratio(report):
    folder, page = report
    text = " ".join("".join(page.text).split())
    definition = ("the case's samples/s divided by the samples/s of the FP32 baseline of the "
                  "same model, profile and device measured alongside it")
    assert definition in text
    assert "step time divided" not in text
    md = " ".join((folder / "report.md").read_text().split()).replace("*", "")
    assert md.count(definition) == 1  # printed once


def test_record_without_its_model_is_skipped_not_a_crash(tmp_path):
    """A record lacking ``model`` loads with a warning that charts skip it; the memory chart
    then failed with numpy's 'zero-size array to reduction operation maximum' (fault
    campaign)."""
    data = json.loads(COMMITTED.read_text())
    benches = [b for b in data["benchmarks"] if b["extra_info"].get("model") == "bert"][:4]
    del benches[0]["extra_info"]["model"]
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**data, "benchmarks": benches}))
    with pytest.warns(UserWarning, match="lack model"):
        written = write_report([path], tmp_path / "out")
    assert tmp_path / "out" / "report.html" in written
