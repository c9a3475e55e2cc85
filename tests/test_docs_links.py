"""Every relative link in README.md and docs/**/*.md resolves: the file exists, and a ``#anchor`` is a
heading of the target, slugged as GitHub slugs it (lower case; letters, digits, spaces, ``-`` and ``_``
kept, everything else dropped; spaces to ``-``; a repeated heading gets ``-1``, ``-2``...).

Links inside fenced code blocks and inline code are not links; ``http(s):`` and ``mailto:`` links are not
checked (no network in the tests)."""

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"`[^`]*`")
# [text](target) and ![alt](target); the target ends at the first space (a title may follow) or ")".
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def prose_lines(text: str):
    """The document's lines outside fenced code blocks, as (line number, line)."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (markdown emphasis and code marks dropped first)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.lower().replace("`", "").replace("*", "")
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: Counter = Counter()
    found = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        found.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
        seen[base] += 1
    return found


def links(path: Path):
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        for match in LINK.finditer(INLINE_CODE.sub("", line)):
            yield number, match.group(1)


def broken_links(path: Path) -> list[str]:
    problems = []
    for number, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        destination = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not destination.exists():
            problems.append(f"{where} (no such file)")
        elif anchor and (destination.suffix != ".md" or anchor not in anchors(destination)):
            problems.append(f"{where} (no heading with that anchor)")
    return problems


def test_slugs_are_githubs():
    assert slug("Pre-norm vs post-norm, LayerNorm vs ScaleNorm + FixNorm") == (
        "pre-norm-vs-post-norm-layernorm-vs-scalenorm--fixnorm"
    )
    assert slug("The demo: eSpeak NG voices, held-out voices") == "the-demo-espeak-ng-voices-held-out-voices"
    assert slug("`asr.study` over `model.layer_norm`") == "asrstudy-over-modellayer_norm"


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# A title\n\n## Part one\n")
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md#part-one) [file](missing.md) [anchor](a.md#part-two) [self](#b)\n"
        "```\n[in code](nowhere.md)\n```\n`[inline](nowhere.md)` [web](https://example.org/x)\n\n# B\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        problems = broken_links(page)
    finally:
        ROOT = saved
    assert problems == ["b.md:1: missing.md (no such file)", "b.md:1: a.md#part-two (no heading with that anchor)"]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(document):
    assert broken_links(document) == []
