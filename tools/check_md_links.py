"""Check that every relative link in the repository's Markdown resolves.

For each Markdown file git tracks, every inline link `[text](target)`, image
and reference definition `[name]: target` whose target is not a URL must
name a path inside the repository that git tracks (a file, or a folder
holding one), and an `#anchor` must name a heading of the Markdown file it
points at (or of the file itself, for `#anchor` alone), with the anchor
GitHub gives that heading. Code blocks and code spans are skipped: a link
shown as code is not a link.

Run from anywhere inside the repository: `python tools/check_md_links.py`.
It prints one line per broken link (`file:line: target: why`) and exits 1
if there was any; `make lint` runs it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import unicodedata
from pathlib import Path, PurePosixPath

# A target that has a scheme (https:, mailto:) or starts with `//` is not
# ours to check: the rule is about links into the repository.
EXTERNAL = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//)")
# `[text](target)` or `![alt](target)`, the target optionally in <…> and
# followed by a title. Nested brackets one level deep cover `[`x`](y)` and
# badges; the target stops at whitespace or the closing parenthesis.
INLINE = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]*)(?:\s+\"[^\"]*\")?\s*\)"
)
# `[name]: target` at the start of a line.
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def repo_root() -> Path:
    out = subprocess.run(
        ["git", "rev-parse", "--show-toplevel"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def tracked(root: Path) -> set[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True, check=True
    )
    return {p for p in out.stdout.split("\0") if p}


def lines_outside_code(text: str):
    """Yield (line number, line) for the lines outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), start=1):
        m = FENCE.match(line)
        if m:
            mark = m.group(1)
            if fence is None:
                fence = mark
                continue
            if mark[0] == fence[0] and len(mark) >= len(fence):
                fence = None
                continue
        if fence is None:
            yield number, line


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text as rendered, lower-cased,
    with everything but letters, digits, `_`, `-` and spaces dropped and
    each space made a `-`."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.replace("*", "")  # emphasis markers
    kept = []
    for ch in text.lower():
        cat = unicodedata.category(ch)
        if ch in " -" or cat[0] in "LMN" or cat == "Pc":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a Markdown file offers: its headings' (a repeated one gets
    `-1`, `-2`, … as GitHub numbers them) and explicit `<a id>`/`<a name>`."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in lines_outside_code(text):
        found.update(HTML_ANCHOR.findall(line))
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(text: str):
    """Yield (line number, target) for every link outside code."""
    for number, line in lines_outside_code(text):
        bare = CODE_SPAN.sub("", line)
        for m in INLINE.finditer(bare):
            yield number, m.group(1).strip("<>")
        m = REFERENCE.match(bare)
        if m:
            yield number, m.group(1).strip("<>")


def check(root: Path) -> list[str]:
    files = tracked(root)
    folders = {str(PurePosixPath(p).parent) for p in files}
    folders |= {str(parent) for p in files for parent in PurePosixPath(p).parents}
    anchor_cache: dict[str, set[str]] = {}

    def anchors_of(path: str) -> set[str]:
        if path not in anchor_cache:
            anchor_cache[path] = anchors((root / path).read_text(encoding="utf-8"))
        return anchor_cache[path]

    problems = []
    for source in sorted(p for p in files if p.endswith(".md")):
        if not (root / source).is_file():
            continue  # deleted in the work tree, not yet in the index
        text = (root / source).read_text(encoding="utf-8")
        here = PurePosixPath(source).parent
        for number, target in links(text):
            if not target or EXTERNAL.match(target):
                continue
            path_part, _, anchor = target.partition("#")
            path_part = path_part.split("?", 1)[0]
            if path_part:
                if path_part.startswith("/"):
                    problems.append(
                        f"{source}:{number}: {target}: an absolute path; link relative to the file"
                    )
                    continue
                parts: list[str] = []
                escaped = False
                for piece in (here / path_part).parts:
                    if piece == "..":
                        if not parts:
                            escaped = True
                            break
                        parts.pop()
                    elif piece != ".":
                        parts.append(piece)
                if escaped:
                    problems.append(
                        f"{source}:{number}: {target}: outside the repository"
                    )
                    continue
                resolved = "/".join(parts) or "."
                if resolved not in files and resolved not in folders:
                    problems.append(
                        f"{source}:{number}: {target}: no such file in the repository"
                    )
                    continue
            else:
                resolved = source
            if not anchor:
                continue
            if not resolved.endswith(".md"):
                if re.fullmatch(r"L\d+(?:-L\d+)?", anchor):
                    continue  # GitHub's line anchors in a source file
                problems.append(
                    f"{source}:{number}: {target}: an anchor into a file that is not Markdown"
                )
                continue
            if anchor not in anchors_of(resolved):
                problems.append(
                    f"{source}:{number}: {target}: no heading with anchor #{anchor} in {resolved}"
                )
    return problems


def main() -> int:
    problems = check(repo_root())
    for line in problems:
        print(line)
    if problems:
        print(f"{len(problems)} broken link(s) in Markdown files", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
