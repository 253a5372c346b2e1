"""Every measured figure in README.md and docs/ is in the committed report it names.

A block (a paragraph, a list item or a table with the paragraph that introduces it) that links one or
more report folders under benchmarks/reports/ makes claims of them: each figure in it (a number with
a decimal point, or of three digits or more) must appear in one of those reports' text files, as
written or as the rounding of a number there to the figure's precision (a report's 196.12 is the
docs' 196.1). Dates, folder names and numbers inside links and code spans are not figures.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache

import pytest

from serving.repo import REPO_ROOT

pytestmark = pytest.mark.unit

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
REPORT_LINK = re.compile(r"\]\(([^)\s]*benchmarks/reports/([^/)\s]+)[^)\s]*)\)")
NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?![\w])")
NOT_FIGURES = (re.compile(r"`[^`]*`"), re.compile(r"\]\([^)]*\)"), re.compile(r"\b20\d\d-\d\d-\d\d\b"),
               re.compile(r"\b\d{8}-\d{6}\b"))


def blocks(text: str) -> Iterator[str]:
    """Paragraphs and list items; a table is one block with the paragraph just before it."""
    current: list[str] = []
    for line in text.splitlines() + [""]:
        starts_item = bool(re.match(r"\s*([-*]|\d+\.)\s", line))
        table = line.lstrip().startswith("|")
        if not line.strip() or (starts_item and current and not current[-1].lstrip().startswith("|")):
            if current:
                yield "\n".join(current)
            current = [] if not line.strip() else [line]
            continue
        if table and current and not current[-1].lstrip().startswith("|") and starts_item:
            yield "\n".join(current)
            current = []
        current.append(line)


def figures(block: str) -> set[str]:
    for pattern in NOT_FIGURES:
        block = pattern.sub(" ", block)
    found = set()
    for whole, fraction in NUMBER.findall(block):
        value = whole.replace(",", "")
        if fraction or len(value) >= 3:
            found.add(value + (fraction or ""))
    return found


@cache
def report_numbers(folder: str) -> tuple[str, ...]:
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in (REPO_ROOT / "benchmarks" / "reports" / folder)
             .rglob("*") if p.suffix in (".md", ".json", ".csv", ".txt", ".properties")]
    return tuple(m.group(0).replace(",", "") for t in texts for m in re.finditer(r"-?\d[\d,]*\.?\d*(?:e-?\d+)?", t))


def in_report(figure: str, folders: set[str]) -> bool:
    decimals = len(figure.split(".")[1]) if "." in figure else 0
    target = float(figure)
    for folder in folders:
        for raw in report_numbers(folder):
            try:
                value = float(raw.rstrip("."))
            except ValueError:
                continue
            if raw.rstrip(".") == figure or round(value, decimals) == target:
                return True
    return False


def claims() -> list[tuple[str, str, str]]:
    out = []
    for page in PAGES:
        for block in blocks(page.read_text(encoding="utf-8")):
            folders = {m.group(2) for m in REPORT_LINK.finditer(block)
                       if (REPO_ROOT / "benchmarks" / "reports" / m.group(2)).is_dir()}
            if folders:
                out += [(page.name, figure, block) for figure in sorted(figures(block))
                        if not in_report(figure, folders)]
    return out


def test_every_figure_next_to_a_report_link_is_in_that_report():
    missing = claims()
    assert not missing, "\n\n".join(f"{page}: {figure} is in none of the linked reports:\n{block[:400]}"
                                    for page, figure, block in missing[:40]) + f"\n\n({len(missing)} in all)"


def test_the_check_finds_a_figure_its_report_does_not_hold(tmp_path):
    folder = next(p.name for p in (REPO_ROOT / "benchmarks" / "reports").iterdir() if p.is_dir())
    block = f"Measured 123456.7 req/s ([report](benchmarks/reports/{folder}/report.md))."
    assert figures(block) == {"123456.7"}
    assert not in_report("123456.7", {folder})
