"""The recursive corpus of trained-mini (docs/trained-mini.md): every file of a category's extensions
under a Python installation's standard library and site-packages, the licence of each file, the
held-out split by file, byte caps, and the manifest. Pure Python (no numpy, no torch), so it is
tested where torch is missing (tools/train_tiny/test_corpus.py).

Rules (each is recorded in meta.json by the caller):
- Roots: the interpreter's stdlib (sysconfig "stdlib") and its site directories
  (site.getsitepackages(), sysconfig "purelib" / "platlib"), each once (by real path). A root
  inside another root is scanned once, as its own root. Symlinks are not followed.
- Skipped folders: __pycache__, *.dist-info, *.egg-info (package metadata, read only for the
  licences), dot-folders, and site-packages / dist-packages inside the stdlib.
- A file belongs to the first category whose extensions it ends with (case-insensitive).
- Held out when crc32(relative path) % heldout_mod == 0 (the path relative to its root, '/'
  separated): a split by file that does not depend on which other files exist.
- Files are read in the order of sha256("root label:relative path") (a fixed pseudo-random order,
  independent of the split), and taken until the category's byte cap for that split is reached.
  A file is skipped when it is larger than max_file_bytes, is not UTF-8, repeats the content of a
  file already taken (exact duplicates never straddle the split), or, for a prose category, has
  fewer than min_letter_frac letters and spaces per character in its first 20000 (tables, data).
- Licence of a file: the stdlib's is PSF-2.0; a site-packages file's is its distribution's
  (the dist-info RECORD or egg-info installed-files.txt that lists it, else the distribution whose
  top_level.txt names its first path component): License-Expression, else the "License ::"
  classifiers, else the first line of License; "unknown" when no distribution claims the file.
"""

from __future__ import annotations

import email.parser
import hashlib
import os
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path

STDLIB_LICENCE = "PSF-2.0 (CPython standard library)"
STDLIB_DIST = "python-stdlib"
UNKNOWN = "unknown"
SKIP_DIR_SUFFIXES = (".dist-info", ".egg-info")


@dataclass
class Root:
    label: str       # "stdlib", "site0", "site1", ...
    path: Path


@dataclass
class Entry:
    root: Root
    rel: str          # relative to root.path, '/' separated
    category: str
    size: int         # from stat (bytes on disk)

    @property
    def name(self) -> str:
        return f"{self.root.label}:{self.rel}"


@dataclass
class Dist:
    name: str
    version: str
    licence: str


@dataclass
class Taken:
    entry: Entry
    text: str
    nbytes: int
    split: str        # "train" | "heldout"
    dist: str         # distribution name (STDLIB_DIST for the stdlib, UNKNOWN)
    licence: str


@dataclass
class Selection:
    taken: list[Taken] = field(default_factory=list)
    stats: dict = field(default_factory=dict)


def python_roots() -> list[Root]:
    """The running interpreter's stdlib and site directories that exist, each once."""
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    cands = [("stdlib", paths.get("stdlib")), ("stdlib", paths.get("platstdlib"))]
    sites = []
    try:
        sites += list(site.getsitepackages())
    except AttributeError:  # some virtualenvs' site lacks it
        pass
    sites += [paths.get("purelib"), paths.get("platlib")]
    cands += [("site", s) for s in sites]
    out, seen = [], set()
    n_site = 0
    for kind, p in cands:
        if not p or not os.path.isdir(p):
            continue
        real = os.path.realpath(p)
        if real in seen:
            continue
        seen.add(real)
        if kind == "stdlib":
            if any(r.label == "stdlib" for r in out):
                continue
            out.append(Root("stdlib", Path(p)))
        else:
            out.append(Root(f"site{n_site}", Path(p)))
            n_site += 1
    return out


def parse_roots(spec: str) -> list[Root]:
    """--corpus-roots: 'python' (python_roots()) or a comma list of folders (labelled by position:
    the first is 'stdlib' when it is named stdlib=DIR, else rootN; LABEL=DIR sets a label)."""
    if spec == "python":
        return python_roots()
    out = []
    for i, item in enumerate(s for s in spec.split(",") if s):
        label, _, path = item.rpartition("=")
        label = label or f"root{i}"
        if not os.path.isdir(path):
            raise SystemExit(f"corpus: --corpus-roots: {path} is not a folder")
        out.append(Root(label, Path(path)))
    if not out:
        raise SystemExit("corpus: --corpus-roots names no folder")
    return out


def parse_categories(spec: str) -> list[tuple[str, tuple[str, ...]]]:
    """'code=.py;prose=.md,.rst,.txt' -> [("code", (".py",)), ("prose", (".md", ".rst", ".txt"))]."""
    out = []
    for part in (p for p in spec.split(";") if p.strip()):
        name, sep, exts = part.partition("=")
        name = name.strip()
        ext_list = tuple(e.strip().lower() for e in exts.split(",") if e.strip())
        if not sep or not name or not ext_list or any(not e.startswith(".") for e in ext_list):
            raise SystemExit(f"corpus: --categories: cannot read '{part}' (want name=.ext,.ext)")
        if any(name == n for n, _ in out):
            raise SystemExit(f"corpus: --categories: '{name}' given twice")
        out.append((name, ext_list))
    if not out:
        raise SystemExit("corpus: --categories names no category")
    return out


def parse_caps(spec: str, names: list[str], what: str) -> dict[str, int]:
    """'code=128,prose=32' (MB, 1e6 bytes) -> bytes per category; a category not named has no cap
    (0 = none)."""
    caps = {n: 0 for n in names}
    for item in (s for s in spec.split(",") if s.strip()):
        name, sep, mb = item.partition("=")
        if not sep or name.strip() not in caps:
            raise SystemExit(f"corpus: {what}: cannot read '{item}' (categories: {', '.join(names)})")
        try:
            caps[name.strip()] = int(float(mb) * 1e6)
        except ValueError:
            raise SystemExit(f"corpus: {what}: '{mb}' is not a number of MB") from None
    return caps


def scan(roots: list[Root], categories) -> tuple[list[Entry], dict]:
    """Every file of a category under the roots (sorted walk, no symlinks followed). Returns the
    entries and counts of what the walk passed over."""
    real_roots = {os.path.realpath(r.path) for r in roots}
    entries: list[Entry] = []
    seen_real: set[str] = set()
    skipped = {"symlinks": 0, "other_extensions": 0, "nested_roots": 0}
    for root in roots:
        base = os.path.realpath(root.path)
        for dirpath, dirnames, filenames in os.walk(root.path, followlinks=False):
            keep = []
            for d in sorted(dirnames):
                full = os.path.join(dirpath, d)
                if d == "__pycache__" or d.startswith(".") or d.endswith(SKIP_DIR_SUFFIXES):
                    continue
                if root.label == "stdlib" and d in ("site-packages", "dist-packages"):
                    skipped["nested_roots"] += 1  # installed packages are not the stdlib's (nor PSF)
                    continue
                if os.path.realpath(full) in real_roots and os.path.realpath(full) != base:
                    skipped["nested_roots"] += 1
                    continue
                keep.append(d)
            dirnames[:] = keep
            for f in sorted(filenames):
                low = f.lower()
                cat = next((n for n, exts in categories if low.endswith(exts)), None)
                if cat is None:
                    skipped["other_extensions"] += 1
                    continue
                full = os.path.join(dirpath, f)
                if os.path.islink(full):
                    skipped["symlinks"] += 1
                    continue
                real = os.path.realpath(full)
                if real in seen_real:
                    continue
                seen_real.add(real)
                try:
                    size = os.stat(full).st_size
                except OSError:
                    continue
                rel = os.path.relpath(full, root.path).replace(os.sep, "/")
                entries.append(Entry(root, rel, cat, size))
    return entries, skipped


def heldout(rel: str, mod: int) -> bool:
    return zlib.crc32(rel.encode()) % mod == 0


def order_key(e: Entry) -> str:
    return hashlib.sha256(e.name.encode()).hexdigest()


# ---- licences -----------------------------------------------------------------------------------

def licence_from_metadata(text: str) -> str:
    """License-Expression, else the 'License ::' classifiers, else the first line of License."""
    msg = email.parser.HeaderParser().parsestr(text)
    expr = (msg.get("License-Expression") or "").strip()
    if expr:
        return expr
    classifiers = [c.strip() for c in msg.get_all("Classifier") or [] if c.strip().startswith("License ::")]
    classifiers = [c[len("License ::"):].strip() for c in classifiers]
    classifiers = [c[len("OSI Approved ::"):].strip() if c.startswith("OSI Approved ::") else c for c in classifiers]
    if classifiers:
        return " / ".join(sorted(set(classifiers)))
    lic = (msg.get("License") or "").strip()
    if lic and lic.upper() != "UNKNOWN":
        first = lic.splitlines()[0].strip()
        return first[:80] + ("..." if len(first) > 80 else "")
    return UNKNOWN


class Licences:
    """Which distribution installed each file of a site directory, and its licence."""

    def __init__(self, roots: list[Root]):
        self.by_file: dict[tuple[str, str], str] = {}      # (root label, rel) -> dist name
        self.by_top: dict[tuple[str, str], str] = {}       # (root label, top-level name) -> dist name
        self.dists: dict[str, Dist] = {}
        self.stdlib_labels = {r.label for r in roots if r.label == "stdlib"}
        for r in roots:
            if r.label in self.stdlib_labels:
                continue
            try:
                names = sorted(os.listdir(r.path))
            except OSError:
                continue
            for d in names:
                if d.endswith(".dist-info"):
                    self._read(r, Path(r.path) / d, "METADATA", "RECORD", rel_to_root=True)
                elif d.endswith(".egg-info"):
                    self._read(r, Path(r.path) / d, "PKG-INFO", "installed-files.txt", rel_to_root=False)

    def _read(self, root: Root, meta_dir: Path, meta_name: str, files_name: str, rel_to_root: bool) -> None:
        meta_path = meta_dir / meta_name if meta_dir.is_dir() else meta_dir  # an egg-info can be a file
        try:
            text = meta_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return
        msg = email.parser.HeaderParser().parsestr(text)
        name = (msg.get("Name") or meta_dir.name.split("-")[0]).strip()
        version = (msg.get("Version") or "").strip()
        key = f"{name} {version}".strip()
        self.dists[key] = Dist(name, version, licence_from_metadata(text))
        if not meta_dir.is_dir():
            return
        listing = meta_dir / files_name
        if listing.exists():
            for line in listing.read_text(encoding="utf-8", errors="replace").splitlines():
                path = line.split(",")[0].strip() if rel_to_root else line.strip()
                if not path:
                    continue
                full = os.path.normpath(path if rel_to_root else os.path.join(meta_dir.name, path))
                full = full.replace(os.sep, "/")
                if not full.startswith("../"):
                    self.by_file.setdefault((root.label, full), key)
        top = meta_dir / "top_level.txt"
        if top.exists():
            for t in top.read_text(encoding="utf-8", errors="replace").split():
                self.by_top.setdefault((root.label, t.strip()), key)

    def of(self, e: Entry) -> tuple[str, str]:
        """(distribution, licence) of an entry."""
        if e.root.label in self.stdlib_labels:
            return STDLIB_DIST, STDLIB_LICENCE
        key = self.by_file.get((e.root.label, e.rel))
        if key is None:
            first = e.rel.split("/")[0]
            stem = first[:-3] if first.endswith(".py") else first
            key = self.by_top.get((e.root.label, stem))
        if key is None:
            return UNKNOWN, UNKNOWN
        return key, self.dists[key].licence


# ---- selection ----------------------------------------------------------------------------------

def letter_frac(text: str, probe: int = 20000) -> float:
    """Letters and spaces per character of the first `probe` characters."""
    head = text[:probe]
    if not head:
        return 0.0
    return sum(1 for ch in head if ch.isalpha() or ch.isspace()) / len(head)


def select(entries: list[Entry], licences: Licences, heldout_mod: int, train_caps: dict[str, int],
           held_caps: dict[str, int], max_file_bytes: int, prose: set[str], min_letter_frac: float,
           deadline: float | None = None, clock=None) -> Selection:
    """Reads files in order_key order and takes them until the caps (0 = no cap). deadline (a clock()
    value) stops reading early; the selection says so (stats["deadline_hit"])."""
    import time
    clock = clock or time.monotonic
    cats = sorted({e.category for e in entries} | set(train_caps))
    st = {c: {"found_files": 0, "found_bytes": 0, "train_files": 0, "train_bytes": 0, "heldout_files": 0,
              "heldout_bytes": 0, "skipped_too_large": 0, "skipped_not_utf8": 0, "skipped_duplicate": 0,
              "skipped_not_prose": 0, "not_read_cap": 0, "not_read_cap_bytes": 0} for c in cats}
    for e in entries:
        st[e.category]["found_files"] += 1
        st[e.category]["found_bytes"] += e.size
    sel = Selection()
    seen: set[str] = set()
    deadline_hit = False
    for e in sorted(entries, key=order_key):
        s = st[e.category]
        split = "heldout" if heldout(e.rel, heldout_mod) else "train"
        cap = (held_caps if split == "heldout" else train_caps).get(e.category, 0)
        if cap and s[f"{split}_bytes"] >= cap:
            s["not_read_cap"] += 1
            s["not_read_cap_bytes"] += e.size
            continue
        if deadline is not None and clock() >= deadline:
            deadline_hit = True
            s["not_read_cap"] += 1
            s["not_read_cap_bytes"] += e.size
            continue
        if e.size > max_file_bytes:
            s["skipped_too_large"] += 1
            continue
        try:
            raw = (e.root.path / e.rel).read_bytes()
        except OSError:
            s["skipped_not_utf8"] += 1
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            s["skipped_not_utf8"] += 1
            continue
        if "\0" in text:
            s["skipped_not_utf8"] += 1
            continue
        digest = hashlib.sha256(raw).hexdigest()
        if digest in seen:
            s["skipped_duplicate"] += 1
            continue
        if e.category in prose and letter_frac(text) < min_letter_frac:
            s["skipped_not_prose"] += 1
            continue
        seen.add(digest)
        dist, lic = licences.of(e)
        sel.taken.append(Taken(e, text, len(raw), split, dist, lic))
        s[f"{split}_files"] += 1
        s[f"{split}_bytes"] += len(raw)
    sel.stats = {"by_category": st, "deadline_hit": deadline_hit}
    return sel


def licence_mix(taken: list[Taken]) -> dict:
    """Bytes and files per licence (all splits and categories), largest first; and per category."""
    mix: dict[str, dict] = {}
    per_cat: dict[str, dict[str, int]] = {}
    for t in taken:
        m = mix.setdefault(t.licence, {"bytes": 0, "files": 0, "distributions": set()})
        m["bytes"] += t.nbytes
        m["files"] += 1
        m["distributions"].add(t.dist.split(" ")[0])
        pc = per_cat.setdefault(t.entry.category, {})
        pc[t.licence] = pc.get(t.licence, 0) + t.nbytes
    total = sum(m["bytes"] for m in mix.values()) or 1
    out = []
    for lic, m in sorted(mix.items(), key=lambda kv: (-kv[1]["bytes"], kv[0])):
        ds = sorted(m["distributions"])
        out.append({"licence": lic, "bytes": m["bytes"], "fraction": m["bytes"] / total, "files": m["files"],
                    "distributions": ds[:40] + ([f"... {len(ds) - 40} more"] if len(ds) > 40 else [])})
    return {"total_bytes": total if taken else 0, "by_licence": out,
            "by_category": {c: dict(sorted(v.items(), key=lambda kv: -kv[1])) for c, v in per_cat.items()}}


def manifest_lines(taken: list[Taken]) -> list[str]:
    """One tab-separated line per file taken, in the order read: split, category, bytes,
    distribution, root:relative path."""
    head = "# split\tcategory\tbytes\tdistribution\tfile (root label:path relative to the root)"
    return [head] + [f"{t.split}\t{t.entry.category}\t{t.nbytes}\t{t.dist}\t{t.entry.name}" for t in taken]


def corpus_sha256(taken: list[Taken]) -> str:
    """sha256 over (name NUL content NUL) of every file taken, in manifest order."""
    h = hashlib.sha256()
    for t in taken:
        h.update(t.entry.name.encode() + b"\0" + t.text.encode("utf-8") + b"\0")
    return h.hexdigest()


def describe_roots(roots: list[Root]) -> list[dict]:
    return [{"label": r.label, "path": str(r.path)} for r in roots]


if __name__ == "__main__":  # a dry run: what would be read from this interpreter's installation
    rs = python_roots()
    cats = parse_categories("code=.py;prose=.md,.rst,.txt")
    ents, skipped = scan(rs, cats)
    lic = Licences(rs)
    sel = select(ents, lic, 10, {"code": 0, "prose": 0}, {}, 1 << 20, {"prose"}, 0.6)
    for r in rs:
        print(r.label, r.path, file=sys.stderr)
    for c, s in sel.stats["by_category"].items():
        print(c, s)
    for row in licence_mix(sel.taken)["by_licence"][:20]:
        print(f"{row['bytes'] / 1e6:9.2f} MB {row['fraction']:6.1%} {row['files']:6d} files  {row['licence']}")
