"""The docs hold together: every relative link and image in README.md, docs/*.md and the reports'
index points at a file that exists (and, for `page.md#anchor`, at a heading of that page), and the
README stays one page.

Anchors follow GitHub's rule: the heading's text, lower-cased, without punctuation other than `-`
and `_`, spaces turned into `-`, and `-1`, `-2`, ... for repeated headings.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest

from serving.repo import REPO_ROOT

pytestmark = pytest.mark.unit

README_MAX_LINES = 220
# [text](target) and ![alt](target); the target ends at the first space (a title may follow).
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"`+[^`]*`+")
EXTERNAL = ("http://", "https://", "mailto:")


def pages() -> list[Path]:
    """README.md, docs/*.md and the reports' index (it links every committed report folder)."""
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")),
            REPO_ROOT / "benchmarks" / "reports" / "README.md"]


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) outside fenced code blocks: links and headings in code are not links."""
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays, its target goes
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps letters, digits and `_`
    return text.replace(" ", "-")


def anchors(page: Path) -> set:
    seen: dict = {}
    found = set()
    for _, line in prose_lines(page.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> Iterator[tuple[int, str]]:
    for number, line in prose_lines(page.read_text(encoding="utf-8")):
        for match in LINK.finditer(INLINE_CODE.sub("", line)):
            yield number, match.group(1)


def broken_links(page: Path) -> list[str]:
    problems = []
    for number, target in links(page):
        if target.startswith(EXTERNAL):
            continue
        path_part, _, anchor = target.partition("#")
        where = f"{page.relative_to(REPO_ROOT)}:{number}: {target}"
        linked = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not linked.exists():
            problems.append(f"{where}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{where}: no heading #{anchor} in {linked.name}")
    return problems


def test_docs_exist():
    assert (REPO_ROOT / "docs").is_dir()
    assert len(pages()) > 1


def test_every_relative_link_resolves():
    problems = [problem for page in pages() for problem in broken_links(page)]
    assert problems == [], "broken links:\n" + "\n".join(problems)


def test_readme_is_one_page():
    lines = (REPO_ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


def test_slug_follows_githubs_rule():
    assert slug("Variants: TorchScript, ONNX, int8") == "variants-torchscript-onnx-int8"
    assert slug("`make tune` MIX") == "make-tune-mix"
    assert slug("torch.compile") == "torchcompile"
    assert slug("causal_lm") == "causal_lm"
    assert slug("make serve, make stop") == "make-serve-make-stop"
    assert slug("See [the API](api.md)") == "see-the-api"


def test_repeated_headings_get_numbered_anchors(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n## Setup\n```\n## not a heading\n```\n## Setup\n", encoding="utf-8")
    assert anchors(page) == {"title", "setup", "setup-1"}
