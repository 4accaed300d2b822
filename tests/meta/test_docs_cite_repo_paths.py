"""Documents and code cite only paths inside the repository or public URLs, and every relative markdown link resolves.

A user has the repository and the internet, nothing else: a citation of the project's private research notes, of a
folder next to the checkout, or of an absolute path on the machine a note was written on points at nothing for them.
The facts those notes held live in ``docs/anchors.md`` (the GPG authors' code) and ``docs/theory.md`` (derivations).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path, PurePosixPath

import pytest

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())  # wherever tests/ nests this
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".txt", ".cfg", ".ini", ".json"}
# Built from pieces so that this file does not match itself.
FORBIDDEN = ("shared" + "/research", ".." + "/shared", "/" + "work/")


def tracked_files() -> list[str]:
    """The repository's files: tracked, plus new ones git does not ignore (so a page not yet added is seen too)."""
    cmd = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    try:
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return sorted({f for f in out.split("\0") if f and (REPO / f).is_file()})


def is_text_file(rel: str) -> bool:
    path = REPO / rel
    if path.suffix in TEXT_SUFFIXES:
        return True
    if path.suffix == "" and path.is_file():  # extension-less scripts such as .ci/run
        with path.open("rb") as f:
            return f.read(2) == b"#!"
    return False


def forbidden_citations(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` for every line that names a path outside the repository."""
    return [(i, line.strip()) for i, line in enumerate(text.splitlines(), 1) if any(p in line for p in FORBIDDEN)]


def test_the_citation_scan_sees_each_forbidden_form():
    for pattern in FORBIDDEN:
        assert forbidden_citations(f"ok\nsee {pattern}notes.md §2\n") == [(2, f"see {pattern}notes.md §2")]
    assert forbidden_citations("docs/anchors.md §2.5; https://github.com/AMAP-ML/GPG; /shared/runs/geoqa\n") == []


def test_no_tracked_file_cites_a_path_outside_the_repository():
    found = []
    for rel in tracked_files():
        if not is_text_file(rel):
            continue
        text = (REPO / rel).read_text(encoding="utf-8", errors="replace")
        found += [f"{rel}:{i}: {line}" for i, line in forbidden_citations(text)]
    assert not found, ("cite a repository path (docs/anchors.md, docs/theory.md) or a public URL instead of:\n"
                       + "\n".join(found))


# ---- relative links in README.md and docs/ ---------------------------------------------------------------------------

INLINE_LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]\n]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
CODE_SPAN = re.compile(r"(`+).*?\1")
EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def prose_lines(text: str, code: str = ""):
    """``(line number, line)`` outside fenced code blocks, each inline code span replaced by ``code`` (``"text"``:
    by its content, as in a heading's anchor)."""
    fence = None
    for i, line in enumerate(text.splitlines(), 1):
        marker = re.match(r"^\s{0,3}(`{3,}|~{3,})", line)
        if marker:
            if fence is None:
                fence = marker.group(1)[0] * len(marker.group(1))
                continue
            if line.strip().startswith(fence):
                fence = None
                continue
        if fence is None:
            yield i, CODE_SPAN.sub((lambda m: m.group(0).strip("`")) if code == "text" else (lambda m: code), line)


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a markdown file's headings (``-1``, ``-2`` for repeats) and its explicit anchors."""
    anchors, seen = set(), {}
    for _, line in prose_lines(text, code="text"):
        anchors.update(EXPLICIT_ANCHOR.findall(line))
        m = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def link_targets(text: str):
    for i, line in prose_lines(text):
        for m in INLINE_LINK.finditer(line):
            yield i, m.group(1)
        m = REFERENCE_LINK.match(line)
        if m:
            yield i, m.group(1)


def broken_links(rel: str, text: str, tracked: set[str], read=lambda rel: (REPO / rel).read_text()) -> list[str]:
    """``"line: target (why)"`` for every relative link of ``rel`` that does not resolve to a tracked file or folder
    (or, with a ``#fragment`` into a markdown file, to one of its headings)."""
    folders = {str(PurePosixPath(f).parent) for f in tracked} | {
        str(p) for f in tracked for p in PurePosixPath(f).parents}
    out = []
    for i, target in link_targets(text):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path, _, fragment = target.partition("#")
        if path.startswith("/"):
            out.append(f"{i}: {target} (absolute path)")
            continue
        parts: list[str] = []
        for part in (PurePosixPath(rel).parent / path).parts if path else PurePosixPath(rel).parts:
            if part == "..":
                if not parts:
                    break
                parts.pop()
            elif part != ".":
                parts.append(part)
        else:
            resolved = "/".join(parts)
            if resolved not in tracked and resolved.rstrip("/") not in folders:
                out.append(f"{i}: {target} (no tracked file {resolved})")
            elif fragment and resolved.endswith(".md") and fragment not in heading_anchors(read(resolved)):
                out.append(f"{i}: {target} (no heading #{fragment} in {resolved})")
            continue
        out.append(f"{i}: {target} (outside the repository)")
    return out


def test_the_link_check_sees_broken_links():
    tracked = {"README.md", "docs/a.md", "docs/img/x.png", "tests/t.py"}
    pages = {"docs/a.md": "# Title\n\n## How it works (`x.y*`)\n\n```bash\n# not a heading\n```\n"}
    text = ("[ok](a.md) [ok](../tests/t.py) [ok](img/x.png) [ok](img/) [ok](a.md#how-it-works-xy) "
            "[ok](https://example.org/x) [ok](#title)\n"
            "[gone](missing.md) [far](../../x.md) [abs](/etc/passwd) [frag](a.md#not-a-heading) `[code](nope.md)`\n"
            "```\n[fenced](nope.md)\n```\n"
            "[ref]: gone.md\n")
    assert broken_links("docs/a.md", text, tracked, read=pages.__getitem__) == [
        "2: missing.md (no tracked file docs/missing.md)",
        "2: ../../x.md (outside the repository)",
        "2: /etc/passwd (absolute path)",
        "2: a.md#not-a-heading (no heading #not-a-heading in docs/a.md)",
        "6: gone.md (no tracked file docs/gone.md)",
    ]


def test_every_relative_link_in_the_readme_and_docs_resolves():
    tracked = set(tracked_files())
    pages = [f for f in sorted(tracked) if f.endswith(".md") and (f == "README.md" or f.startswith("docs/"))]
    assert "docs/anchors.md" in pages
    found = [f"{rel}:{line}" for rel in pages for line in broken_links(rel, (REPO / rel).read_text(), tracked)]
    assert not found, "broken relative links:\n" + "\n".join(found)
