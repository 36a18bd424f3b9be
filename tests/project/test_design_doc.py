"""docs/design.md is navigable: real headings (no bold paragraph leads standing in for them), a
table of contents that lists every section, links that land on a heading, and the modules' short
docstrings pointing at sections that exist; long explanations live there, not atop a module."""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
DESIGN = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
MAX_DOCSTRING_LINES = 11


def anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def headings(text: str) -> list[tuple[int, str]]:
    body = re.sub(r"```.*?```", "", text, flags=re.S)
    return [(len(m.group(1)), m.group(2)) for m in re.finditer(r"^(#{1,6}) (.+)$", body, flags=re.M)]


def bold_leads(text: str) -> list[str]:
    """Paragraphs that open with a bold phrase: a heading in disguise, which no link can reach."""
    return [block.split("\n")[0] for block in text.split("\n\n") if block.startswith("**")]


def test_sections_are_headings_not_bold_paragraph_leads():
    assert bold_leads(DESIGN) == []
    assert bold_leads("## A\n\n**Placement.** Ranks go where the OS puts them.") == ["**Placement.** Ranks go where the OS puts them."]


def test_the_contents_list_every_section_and_every_link_lands_on_a_heading():
    anchors = [anchor(title) for _, title in headings(DESIGN)]
    assert len(anchors) == len(set(anchors)), "two headings share an anchor"
    contents = DESIGN.split("## Contents\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"\]\(#([^)]+)\)", contents)
    assert listed == [anchor(title) for level, title in headings(DESIGN) if level in (2, 3) and title != "Contents"]
    links = set(re.findall(r"\]\(#([^)]+)\)", DESIGN))
    assert links and links <= set(anchors), sorted(links - set(anchors))


def test_the_modules_point_at_sections_that_exist():
    anchors = {anchor(title) for _, title in headings(DESIGN)}
    cited = {}
    for path in sorted((ROOT / "src").rglob("*.py")):
        for target in re.findall(r"docs/design\.md#([\w-]+)", path.read_text(encoding="utf-8")):
            cited.setdefault(target, path.relative_to(ROOT).as_posix())
    assert cited, "no module links a section of docs/design.md"
    assert {target: where for target, where in cited.items() if target not in anchors} == {}


def test_module_docstrings_are_short_and_the_explanations_live_in_the_design():
    long = {}
    for path in sorted((ROOT / "src" / "ddpbench").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        if len(doc.splitlines()) > MAX_DOCSTRING_LINES:
            long[path.relative_to(ROOT / "src" / "ddpbench").as_posix()] = len(doc.splitlines())
    assert long == {}, "move these explanations into docs/design.md and link the section"
