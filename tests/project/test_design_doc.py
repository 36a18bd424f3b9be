"""docs/design/ is navigable: one file per part, each short enough to read in one sitting, real
headings (no bold paragraph leads standing in for them), an index (docs/design/README.md) that lists
every file and section, and every link to it, from the design files themselves or from code, tests,
docs and the README, landing on a heading of the file it names; long explanations live there, not
atop a module."""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
DESIGN_DIR = ROOT / "docs" / "design"
INDEX = "README.md"
MAX_DOCSTRING_LINES = 11
MAX_PART_LINES = 600
# A reference from outside: docs/design/FILE.md#anchor, or a path without a file (the folder).
REFERENCE = re.compile(r"docs/design(?P<rest>[^\s)\]`'\",;]*)")


def anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def headings(text: str) -> list[tuple[int, str]]:
    body = re.sub(r"```.*?```", "", text, flags=re.S)
    return [(len(m.group(1)), m.group(2)) for m in re.finditer(r"^(#{1,6}) (.+)$", body, flags=re.M)]


def bold_leads(text: str) -> list[str]:
    """Paragraphs that open with a bold phrase: a heading in disguise, which no link can reach."""
    return [block.split("\n")[0] for block in text.split("\n\n") if block.startswith("**")]


def design_files() -> dict[str, str]:
    return {path.name: path.read_text(encoding="utf-8") for path in sorted(DESIGN_DIR.glob("*.md"))}


def anchors_by_file(files: dict[str, str]) -> dict[str, set[str]]:
    return {name: {anchor(title) for _, title in headings(text)} for name, text in files.items()}


def unresolved(reference: str, anchors: dict[str, set[str]]) -> str:
    """'' when `reference` (what follows `docs/design`: `/`, `/FILE.md` or `/FILE.md#anchor`) names
    an existing design file and, with an anchor, a heading in that file; else what is wrong."""
    reference = reference.rstrip(".:")
    if reference in ("/", ""):
        return "" if reference == "/" else "docs/design alone: name the folder (docs/design/) or a file in it"
    match = re.fullmatch(r"/([\w.-]+\.md)(?:#([\w-]+))?", reference)
    if not match:
        return f"docs/design{reference}: not a file of docs/design/ (docs/design.md was split into docs/design/)"
    name, target = match.groups()
    if name not in anchors:
        return f"docs/design/{name}: no such file"
    if target is not None and target not in anchors[name]:
        return f"docs/design/{name}#{target}: no such heading in that file"
    return ""


def tracked_text_files() -> list[pathlib.Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\n")
    paths = [ROOT / name for name in listed if name.endswith((".py", ".md", ".yml", ".toml", ".sh", ".txt"))]
    # This file names bad references on purpose, to check that they are caught.
    this = pathlib.Path(__file__).resolve()
    return [path for path in paths if path.is_file() and DESIGN_DIR not in path.parents and path != this]


def test_sections_are_headings_not_bold_paragraph_leads():
    for name, text in design_files().items():
        assert bold_leads(text) == [], name
    assert bold_leads("## A\n\n**Placement.** Ranks go where the OS puts them.") == ["**Placement.** Ranks go where the OS puts them."]


def test_each_part_reads_in_one_sitting():
    files = design_files()
    assert len(files) >= 8, sorted(files)
    long = {name: text.count("\n") for name, text in files.items() if text.count("\n") > MAX_PART_LINES}
    assert long == {}, f"split these parts (at most {MAX_PART_LINES} lines each)"
    for name, text in files.items():
        titles = [title for level, title in headings(text) if level == 1]
        assert len(titles) == 1, f"{name}: one title (# heading), found {titles}"


def test_the_index_lists_every_part_and_section_and_every_link_lands_on_a_heading():
    files = design_files()
    anchors = anchors_by_file(files)
    for name, text in files.items():
        found = [anchor(title) for _, title in headings(text)]
        assert len(found) == len(set(found)), f"{name}: two headings share an anchor"
    contents = files[INDEX].split("## Contents\n", 1)[1]
    listed = re.findall(r"\]\(([\w.-]+\.md(?:#[\w-]+)?)\)", contents)
    # The parts in the index's own order (the reading order), each followed by its sections.
    parts = re.findall(r"^\* \[[^]]+\]\(([\w.-]+\.md)\)", contents, flags=re.M)
    assert sorted(parts) == sorted(set(files) - {INDEX}), "the index lists every part once"
    expected = []
    for name in parts:
        text = files[name]
        expected.append(name)
        expected += [f"{name}#{anchor(title)}" for level, title in headings(text) if level in (2, 3)]
    assert listed == expected
    for name, text in files.items():
        for target in re.findall(r"\]\(([^)]+)\)", text):
            if target.startswith(("http://", "https://", "../")):
                assert target.startswith("http") or (DESIGN_DIR / target.split("#")[0]).resolve().exists(), (name, target)
                continue
            assert unresolved("/" + (name if target.startswith("#") else "") + target, anchors) == "", (name, target)


def test_every_reference_to_the_design_lands_on_a_heading_of_the_file_it_names():
    anchors = anchors_by_file(design_files())
    problems, cited = {}, 0
    for path in tracked_text_files():
        text = path.read_text(encoding="utf-8")
        # A reference broken over a comment's line: "docs/design/ab.md#the-\n    # looks-levels" is not one.
        for match in REFERENCE.finditer(text):
            cited += 1
            problem = unresolved(match.group("rest"), anchors)
            if problem:
                problems.setdefault(path.relative_to(ROOT).as_posix(), []).append(problem)
    assert cited > 40, "the modules and docs link the design's sections"
    assert problems == {}


def test_a_section_is_cited_by_its_link_not_its_name_in_prose():
    """'docs/design/ab.md, *Extra looks*' is unchecked: a renamed heading leaves it stale."""
    prose = re.compile(r"docs/design[\w/.-]*[,(]? *[*\"'(][A-Z][\w' ]+[*\"')]")
    found = {}
    for path in tracked_text_files():
        for match in prose.finditer(path.read_text(encoding="utf-8")):
            found.setdefault(path.relative_to(ROOT).as_posix(), []).append(match.group(0))
    assert found == {}


def test_the_checks_catch_a_stale_reference():
    anchors = anchors_by_file(design_files())
    assert unresolved("/ab.md#extra-looks", anchors) == ""
    assert unresolved("/", anchors) == ""
    assert "no such heading" in unresolved("/ab.md#rendezvous-and-security", anchors)
    assert "no such file" in unresolved("/rendezvous.md", anchors)
    assert "was split" in unresolved(".md#extra-looks", anchors)
    assert unresolved("/gates.md#gates.", anchors) == ""


def test_module_docstrings_are_short_and_the_explanations_live_in_the_design():
    long = {}
    for path in sorted((ROOT / "src" / "ddpbench").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        if len(doc.splitlines()) > MAX_DOCSTRING_LINES:
            long[path.relative_to(ROOT / "src" / "ddpbench").as_posix()] = len(doc.splitlines())
    assert long == {}, "move these explanations into docs/design/ and link the section"
