#!/usr/bin/env python3
"""The documentation and the scripts describe the system, not the way it was made: no
working-process words in README.md, docs/*.md, experiments/ and scripts/ (file names included).

  test_doc_words.py REPO_ROOT

Working-process words: "session", the names of the machine kinds a run was lent
(nvidia-h100-x1, nvidia-h200-x8, ...), a "call" as a unit of work on a remote machine ("device
call", "one call", "in the same call", "before the call", ...), "device time", "lease", "lent",
"worktree". What stays true when the history is deleted says "run", "the GPU node", "H200" instead.
Not checked: docs/perf-manifest.tsv (a record of old files and the commands of their commit).
Exit 0 when clean; 1 with one line per hit (file:line: word: the line) otherwise.
"""
import os
import re
import sys

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../.."))

WORDS = [
    (re.compile(r"\bsessions?\b", re.I), "session"),
    (re.compile(r"\bnvidia-h[12]00(-x\d+)?\b", re.I), "a machine kind"),
    (re.compile(r"\bdevice[- ]calls?\b", re.I), "device call"),
    (re.compile(r"\b(one|same|second|next|earlier|later|previous|each|this|that|another)\s+calls?\b(?!\s+(of|to|into)\b)",
                re.I), "a call as a unit of work"),
    (re.compile(r"\b(before|after|within|per)\s+(the|a|one)\s+call\b", re.I), "a call as a unit of work"),
    (re.compile(r"\b(the|a)\s+call's\b", re.I), "a call as a unit of work"),
    (re.compile(r"\bdevice time\b", re.I), "device time"),
    (re.compile(r"\b(lease|leased|lent)\b", re.I), "lease / lent"),
    (re.compile(r"\bworktrees?\b", re.I), "worktree"),
]
SKIP_FILES = {os.path.join("docs", "perf-manifest.tsv")}


def files():
    out = [os.path.join(root, "README.md")]
    for top in ("docs", "experiments", "scripts"):
        for d, dirs, names in os.walk(os.path.join(root, top)):
            dirs[:] = [x for x in dirs if not x.startswith(".") and x != "__pycache__"]
            out += [os.path.join(d, n) for n in names]
    return sorted(p for p in out if os.path.relpath(p, root) not in SKIP_FILES)


problems = []
for path in files():
    rel = os.path.relpath(path, root)
    for rx, what in WORDS:
        if rx.search(rel):
            problems.append(f"{rel}: {what} in the file name")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (UnicodeDecodeError, OSError):
        continue
    for i, line in enumerate(lines, 1):
        for rx, what in WORDS:
            m = rx.search(line)
            if m:
                problems.append(f"{rel}:{i}: {what} ('{m.group(0)}'): {line.strip()[:120]}")

for p in problems:
    print(p)
print(f"test_doc_words: {len(files())} files, {len(problems)} problem(s)")
sys.exit(1 if problems else 0)
