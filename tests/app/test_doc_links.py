#!/usr/bin/env python3
"""The documentation stands alone: every relative link of README.md and docs/*.md resolves to a
file or directory of the repository (and an anchor, when given, to a heading of the target page),
and no page mentions a file outside the repository.

  test_doc_links.py REPO_ROOT

What counts as a mention of an outside file: a name ending in .md that is neither a path (from the
page's directory or the repository root) nor the name of a Markdown file anywhere in the
repository, and any absolute path under /work/ or a path into ../shared/ (the places outside a
checkout where notes live). Links to http(s) and mailto addresses are not followed.
Exit 0 when everything resolves; 1 with one line per problem (file:line: what) otherwise.
"""
import os
import re
import sys
import unicodedata

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../.."))
skip_dirs = {".git", "build", "node_modules", "__pycache__", ".devsrc"}


def markdown_files():
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in skip_dirs and not x.startswith("build-") and not x.startswith(".")]
        out += [os.path.join(d, f) for f in files if f.endswith(".md")]
    return out


all_md = markdown_files()
md_basenames = {os.path.basename(p) for p in all_md}
pages = [os.path.join(root, "README.md")] + sorted(
    os.path.join(root, "docs", f) for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_LINK = re.compile(r"(?<!\!)\[([^\]]*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMAGE_LINK = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
REF_DEF = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)")
MD_NAME = re.compile(r"(?<![\w/.-])((?:\.{1,2}/)?[\w./-]*[\w-]\.md)\b")
OUTSIDE = [(re.compile(r"(?<![\w.])/work/"), "an absolute path under /work/"),
           (re.compile(r"\.\./shared/"), "a path into ../shared/"),
           (re.compile(r"\bshared/docs\b"), "the shared notes (shared/docs)")]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: link syntax and inline code marks dropped, lower case,
    punctuation removed (letters, digits, spaces, '-' and '_' kept), spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").strip().lower()
    kept = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in " -_" or cat[0] in "LN":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def headings(path: str):
    slugs, seen, fenced = set(), {}, False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                fenced = not fenced
                continue
            m = None if fenced else HEADING.match(line)
            if m:
                s = slug(m.group(2))
                n = seen.get(s, 0)
                seen[s] = n + 1
                slugs.add(s if n == 0 else f"{s}-{n}")
    return slugs


_heading_cache = {}


def anchors_of(path):
    if path not in _heading_cache:
        _heading_cache[path] = headings(path)
    return _heading_cache[path]


def inside(path: str) -> bool:
    real = os.path.realpath(path)
    return real == root or real.startswith(root + os.sep)


problems = []
links_checked = 0
for page in pages:
    rel_page = os.path.relpath(page, root)
    base = os.path.dirname(page)
    fenced = False
    with open(page, encoding="utf-8") as f:
        lines = f.readlines()
    for n, line in enumerate(lines, 1):
        where = f"{rel_page}:{n}"
        for rx, what in OUTSIDE:
            if rx.search(line):
                problems.append(f"{where}: mentions {what}: {line.strip()[:120]}")
        for m in MD_NAME.finditer(line):
            name = m.group(1)
            if name.startswith(("http", "www.")):
                continue
            candidates = [os.path.join(base, name), os.path.join(root, name)]
            if not any(os.path.exists(c) and inside(c) for c in candidates) and os.path.basename(name) not in md_basenames:
                problems.append(f"{where}: mentions {name}, which is not a file of the repository")
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        text = re.sub(r"`[^`]*`", "", line)  # links are not followed inside code spans
        targets = [m.group(2) for m in INLINE_LINK.finditer(text)] + [m.group(2) for m in IMAGE_LINK.finditer(text)]
        m = REF_DEF.match(text)
        if m:
            targets.append(m.group(1))
        for t in targets:
            if re.match(r"^[a-z][a-z0-9+.-]*:", t):  # http:, https:, mailto:
                continue
            links_checked += 1
            path_part, _, anchor = t.partition("#")
            target = page if not path_part else os.path.normpath(os.path.join(base, path_part))
            if not inside(target):
                problems.append(f"{where}: link {t} leaves the repository")
                continue
            if not os.path.exists(target):
                problems.append(f"{where}: link {t}: {os.path.relpath(target, root)} does not exist")
                continue
            if anchor:
                if not target.endswith(".md"):
                    problems.append(f"{where}: link {t}: an anchor into a file that is not Markdown")
                elif anchor not in anchors_of(target):
                    problems.append(f"{where}: link {t}: no heading with anchor #{anchor} in "
                                    f"{os.path.relpath(target, root)}")

for p in problems:
    print(p)
print(f"test_doc_links: {len(pages)} pages, {links_checked} relative links, {len(problems)} problem(s)")
sys.exit(1 if problems else 0)
