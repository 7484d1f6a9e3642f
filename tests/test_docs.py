"""The docs hold together (issue 29 item 6): the README stays on two screens and leads to every topic doc, and
every relative link of README.md, docs/*.md and docs/journal/*.md names a file of the checkout and, with a #fragment, a heading or
<a id> of that file. Nothing is run; only the markdown is read."""
from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

LINK = re.compile(r"\]\(([^)\s]+)\)")


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "docs" / "journal").glob("*.md"))]


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def prose(path: Path) -> str:
    """The file without its fenced code blocks (a `# comment` there is no heading, a `](x)` no link)."""
    return re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set(re.findall(r'<a id="([^"]+)"', prose(path)))
    for heading in re.findall(r"^#{1,6} (.+)$", prose(path), re.M):
        s = slug(heading)
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


def links(path: Path) -> list[tuple[Path, str, str]]:
    """(target file, fragment, the link as written) of every relative link of a markdown file."""
    out = []
    for target in LINK.findall(prose(path)):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, fragment = target.partition("#")
        out.append(((path.parent / file).resolve() if file else path, fragment, target))
    return out


def test_every_relative_link_and_anchor_of_the_docs_resolves():
    bad = []
    for path in doc_files():
        for target, fragment, written in links(path):
            if not target.exists():
                bad.append(f"{path.relative_to(REPO)}: {written}: no such file")
            elif fragment and target.suffix == ".md" and fragment not in anchors(target):
                bad.append(f"{path.relative_to(REPO)}: {written}: no such heading")
    assert not bad, "\n".join(bad)


def test_the_readme_fits_on_two_screens_and_leads_to_every_doc():
    readme = REPO / "README.md"
    assert len(readme.read_text(encoding="utf-8").splitlines()) <= 100
    reached = {target for target, _, _ in links(readme)}
    for target in list(reached):  # one step further: the journal is reached from BENCHMARKS.md
        if target.suffix == ".md" and target.exists():
            reached |= {t for t, _, _ in links(target)}
    missing = [p.name for p in (REPO / "docs").glob("*.md") if p.resolve() not in reached]
    assert (REPO / "docs" / "journal" / "README.md").resolve() in reached  # from BENCHMARKS.md
    assert not missing, f"docs the README does not lead to: {missing}"


def test_the_link_checker_sees_a_broken_link_and_a_missing_heading(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A title: `x`\n\n[ok](#a-title-x) [gone](nope.md) [bad](#b)\n```\n# no heading\n```\n")
    assert anchors(page) == {"a-title-x"}
    assert [(t.name, f) for t, f, _ in links(page)] == [("page.md", "a-title-x"), ("nope.md", ""), ("page.md", "b")]
