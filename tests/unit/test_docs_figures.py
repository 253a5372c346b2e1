"""Every measured figure in README.md and docs/ is in the committed report it names.

A block (a paragraph, a list item, or a table together with the paragraph that introduces it) that
links one or more reports makes claims of them: each figure in it (a number with a decimal point, or
of three digits or more) must appear in one of those reports, as written or as a rounding of a number
there to the figure's precision (a report's 196.12 is the docs' 196.1, its 34088.5 the docs' 34,089).
A figure written as a percentage may also be a report's fraction (0.9917 is 99.2%). The docs' sign is
not part of a figure: "-6.8%" is the figure 6.8, and a report's -6.8 holds it.

A report is a folder under benchmarks/reports/ (its text files) or a model's
models/<name>/training_report.json. Dates, folder names and numbers inside links and code spans are
not figures.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache

import pytest

from serving.repo import REPO_ROOT

pytestmark = pytest.mark.unit

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
# A link's target, resolved to a report: benchmarks/reports/<folder> or models/<name>/training_report.json.
REPORT_LINK = re.compile(r"\]\([^)\s]*?((?:benchmarks/reports/[^/)\s#]+)|(?:models/[^/)\s]+/training_report\.json))[^)\s]*\)")
REPORT_SUFFIXES = (".md", ".json", ".csv", ".txt", ".properties")
NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?![\w])(%?)")
REPORT_NUMBER = re.compile(r"\d[\d,]*\.?\d*(?:e-?\d+)?")
NOT_FIGURES = (re.compile(r"`[^`]*`"), re.compile(r"\]\([^)]*\)"), re.compile(r"\b20\d\d-\d\d-\d\d\b"),
               re.compile(r"\b\d{8}-\d{6}\b"))


def is_table(block: str) -> bool:
    return block.lstrip().startswith("|")


def blocks(text: str) -> Iterator[str]:
    """Paragraphs and list items; a table is one block with the paragraph just before it."""
    previous = ""
    for block in _raw_blocks(text):
        yield f"{previous}\n\n{block}" if is_table(block) and previous and not is_table(previous) else block
        previous = block


def _raw_blocks(text: str) -> Iterator[str]:
    current: list[str] = []
    for line in text.splitlines() + [""]:
        starts_item = bool(re.match(r"\s*([-*]|\d+\.)\s", line))
        if not line.strip() or (starts_item and current and not current[-1].lstrip().startswith("|")):
            if current:
                yield "\n".join(current)
            current = [] if not line.strip() else [line]
            continue
        current.append(line)


def figures(block: str) -> set[str]:
    """The block's figures, a percentage with its `%` (`99.2%`)."""
    for pattern in NOT_FIGURES:
        block = pattern.sub(" ", block)
    found = set()
    for whole, fraction, percent in NUMBER.findall(block):
        value = whole.replace(",", "")
        if fraction or len(value) >= 3:
            found.add(value + (fraction or "") + percent)
    return found


def reports(block: str) -> set[str]:
    """The reports the block links that exist: folders under benchmarks/reports/, training reports."""
    found = {m.group(1) for m in REPORT_LINK.finditer(block)}
    return {r for r in found if (REPO_ROOT / r).is_dir() or (r.startswith("models/") and (REPO_ROOT / r).is_file())}


@cache
def report_numbers(report: str) -> tuple[float, ...]:
    path = REPO_ROOT / report
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.suffix in REPORT_SUFFIXES]
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in files]
    numbers = []
    for text in texts:
        for m in REPORT_NUMBER.finditer(text):
            try:
                numbers.append(float(m.group(0).replace(",", "").rstrip(".")))
            except ValueError:
                continue
    return tuple(numbers)


def in_report(figure: str, sources: set[str]) -> bool:
    percent = figure.endswith("%")
    figure = figure.rstrip("%")
    decimals = len(figure.split(".")[1]) if "." in figure else 0
    target, half_step = float(figure), 0.5 * 10 ** -decimals + 1e-9
    for source in sources:
        for value in report_numbers(source):
            if abs(value - target) <= half_step or (percent and value <= 1 and abs(100 * value - target) <= half_step):
                return True
    return False


def claims() -> list[tuple[str, str, str]]:
    out = []
    for page in PAGES:
        for block in blocks(page.read_text(encoding="utf-8")):
            sources = reports(block)
            if sources:
                out += [(page.name, figure, block) for figure in sorted(figures(block)) if not in_report(figure, sources)]
    return out


def test_every_figure_next_to_a_report_link_is_in_that_report():
    missing = claims()
    assert not missing, "\n\n".join(f"{page}: {figure} is in none of the linked reports:\n{block[:400]}"
                                    for page, figure, block in missing[:40]) + f"\n\n({len(missing)} in all)"


def test_the_check_finds_a_figure_its_report_does_not_hold():
    folder = next(p.name for p in (REPO_ROOT / "benchmarks" / "reports").iterdir() if p.is_dir())
    block = f"Measured 123456.7 req/s ([report](benchmarks/reports/{folder}/report.md))."
    assert figures(block) == {"123456.7"}
    assert reports(block) == {f"benchmarks/reports/{folder}"}
    assert not in_report("123456.7", reports(block))


def test_a_training_report_is_a_report_and_a_percentage_may_be_its_fraction():
    block = "99.2% held-out accuracy ([training report](../models/digits/training_report.json))."
    assert figures(block) == {"99.2%"}
    assert reports(block) == {"models/digits/training_report.json"}
    assert in_report("99.2%", reports(block))
    assert not in_report("98.2%", reports(block))


def test_a_table_is_checked_against_the_links_of_the_paragraph_above_it():
    text = "Intro ([r](benchmarks/reports/x/report.md)).\n\n| a | b |\n|---|---|\n| 1 | 123.4 |\n\nNext paragraph."
    found = list(blocks(text))
    assert any("123.4" in b and "benchmarks/reports/x" in b for b in found)
    assert not any("Next paragraph" in b and "123.4" in b for b in found)
