"""The documentation holds together: every relative link in the repository's Markdown resolves
(to a file or folder, and to a heading when it names one, by GitHub's anchor rules), README
stays a page for the person who runs a node, and every committed study is written up in docs/."""

from __future__ import annotations

import re
import subprocess
import unicodedata
from pathlib import Path
from urllib.parse import unquote

from tests.support.repository_files import files_git_keeps

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250
FIRST_SCREEN_LINES = 40

FENCE = re.compile(r"^\s{0,3}(```|~~~)")
ATX_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_ANCHOR = re.compile(r"<a\s[^>]*(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:|^//")


def markdown_files(root: Path) -> list[Path]:
    """Every Markdown file of the project (tests/support/repository_files.py says which are)."""
    return files_git_keeps(root, "*.md")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code removed: links inside code
    are examples, not links."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, INLINE_CODE.sub("", line)))
    return lines


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its rendered text, lower-cased, with every character
    that is not a letter, digit, mark, space, hyphen or underscore dropped, spaces made hyphens."""
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"(?<!\w)_+|_+(?!\w)", "", text)  # emphasis markers, not snake_case
    kept = (c for c in text.lower() if c.isalnum() or c in " -_" or unicodedata.category(c).startswith("M"))
    return "".join(kept).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors a Markdown file offers: one per heading (repeats get -1, -2, ...), and any
    explicit <a name|id>."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    lines, fenced, previous = text.splitlines(), False, ""
    for line in lines:
        if FENCE.match(line):
            fenced, previous = not fenced, ""
            continue
        if fenced:
            continue
        heading = ATX_HEADING.match(line)
        title = heading.group(2) if heading else None
        if (
            title is None
            and previous.strip()
            and re.fullmatch(r"\s{0,3}(=+|-+)\s*", line)
            and not previous.lstrip().startswith(("|", "-", "*", ">"))
        ):
            title = previous.strip()  # a setext heading
        if title is not None:
            slug = github_slug(title)
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
        found.update(HTML_ANCHOR.findall(line))
        previous = line
    return found


def link_targets(text: str) -> list[tuple[int, str]]:
    targets = []
    for number, line in prose_lines(text):
        for match in INLINE_LINK.finditer(line):
            targets.append((number, match.group(1)))
        definition = REFERENCE_DEFINITION.match(line)
        if definition:
            targets.append((number, definition.group(1)))
    return [(number, target.strip("<>")) for number, target in targets]


def broken_links(root: Path) -> list[str]:
    """'file:line: target (why)' for every relative link that does not resolve."""
    broken = []
    for source in markdown_files(root):
        for number, target in link_targets(source.read_text(encoding="utf-8")):
            if SCHEME.match(target):
                continue  # a web address or mailto: not ours to check offline
            where = f"{source.relative_to(root)}:{number}: {target}"
            path_part, _, fragment = target.partition("#")
            if path_part.startswith("/"):
                resolved = (root / unquote(path_part).lstrip("/")).resolve()
            elif path_part:
                resolved = (source.parent / unquote(path_part)).resolve()
            else:
                resolved = source
            if root.resolve() not in (resolved, *resolved.parents):
                broken.append(f"{where} (outside the repository)")
            elif not resolved.exists():
                broken.append(f"{where} (no such file or folder)")
            elif (
                fragment
                and resolved.suffix == ".md"
                and unquote(fragment) not in anchors(resolved.read_text(encoding="utf-8"))
            ):
                broken.append(f"{where} (no heading with that anchor in {resolved.name})")
    return broken


def test_every_relative_link_resolves():
    broken = broken_links(ROOT)
    assert not broken, "broken links in the documentation:\n" + "\n".join(broken)


def test_the_link_check_finds_what_is_broken(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("build/\n")
    (tmp_path / "build" / "lib").mkdir(parents=True)  # an install's leftover copy: not checked
    (tmp_path / "build" / "lib" / "README.md").write_text("[gone](../docs/missing.md)\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text(
        "# The guide\n\n## Two `words` & more\n\n## Two words & more\n\nSetext title\n---\n"
    )
    (tmp_path / "README.md").write_text(
        "[ok](docs/guide.md) [ok](docs/guide.md#two-words--more) [ok](docs/guide.md#two-words--more-1)\n"
        "[ok](docs/guide.md#setext-title) [ok](docs/) [ok](#top) [web](https://example.org/x)\n"
        "[gone](docs/missing.md) [bad anchor](docs/guide.md#no-such-heading)\n"
        "[out](../elsewhere.md) `[in code](docs/missing.md)`\n\n"
        "```\n[in a fence](docs/missing.md)\n```\n\n"
        '<a name="top"></a>\n[ref]: docs/also-missing.md\n'
    )
    assert broken_links(tmp_path) == [
        "README.md:3: docs/missing.md (no such file or folder)",
        "README.md:3: docs/guide.md#no-such-heading (no heading with that anchor in guide.md)",
        "README.md:4: ../elsewhere.md (outside the repository)",
        "README.md:11: docs/also-missing.md (no such file or folder)",
    ]


def test_github_slugs():
    assert github_slug("Results: what sharing buys (bench/results/)") == "results-what-sharing-buys-benchresults"
    assert github_slug("`round.py`: one GRPO round, per model") == "roundpy-one-grpo-round-per-model"
    assert (
        github_slug("sapo against genrl 0.1.11, genrl 0.3.0 and TRL 1.16.0")
        == "sapo-against-genrl-0111-genrl-030-and-trl-1160"
    )
    assert (
        github_slug("What sharing does to the update (why 4/4 collapsed)")
        == "what-sharing-does-to-the-update-why-44-collapsed"
    )
    assert github_slug("snake_case and _emphasis_") == "snake_case-and-emphasis"


def test_readme_is_a_page_for_users():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; keep it under {README_MAX_LINES} and move details to docs/"
    )
    first_screen = "\n".join(lines[:FIRST_SCREEN_LINES])
    for command in ("make run", "make test"):
        assert command in first_screen, f"README's first {FIRST_SCREEN_LINES} lines must show `{command}`"


def test_every_committed_study_is_written_up_in_docs():
    """Each study's results directory is named in docs/science.md, next to the command that made
    it. (A study's directory holds its raw rows; the GPU check's and the long run's do not.)"""
    science = (ROOT / "docs" / "science.md").read_text(encoding="utf-8")
    results = sorted(p.parent.name for p in (ROOT / "bench" / "results").glob("*/raw.jsonl.gz"))
    assert len(results) >= 17
    missing = [name for name in results if f"bench/results/{name}/" not in science]
    assert not missing, f"docs/science.md does not link these results directories: {missing}"
