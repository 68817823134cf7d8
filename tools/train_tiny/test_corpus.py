#!/usr/bin/env python3
"""Tests of tools/train_tiny/corpus.py (pure Python: runs without torch). ctest app.train_tiny_corpus.

A small installation is built in a temporary folder: a stdlib root and a site-packages root with
a dist-info (RECORD), a dist-info known only by top_level.txt, an egg-info (installed-files.txt)
and a file that no distribution claims; the walk, the categories, the skips, the split, the
caps, the licences and the manifest are checked on it.
"""

from __future__ import annotations

import sys
import tempfile
import unittest
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import corpus as C  # noqa: E402

CATS = C.parse_categories("code=.py;prose=.md,.rst,.txt")


def write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8")


class Installation:
    def __init__(self, base: Path):
        self.stdlib = base / "lib" / "python3.x"
        self.site = base / "site-packages"
        s, p = self.stdlib, self.site
        write(s / "alpha.py", "def alpha():\n    return 1\n")
        write(s / "json" / "decoder.py", "class Decoder:\n    pass\n" * 20)
        write(s / "json" / "__pycache__" / "decoder.cpython.py", "cached = True\n")
        write(s / "copy_of_alpha.py", "def alpha():\n    return 1\n")      # a repeat of alpha.py
        write(s / "latin.py", b"name = '\xe9t\xe9'\n")                     # not UTF-8
        write(s / "huge.py", "x = 1\n" * 400)                              # over max_file_bytes below
        write(s / "README.txt", "The standard library of this test installation.\n")
        write(s / "numbers.txt", "0123 4567 89,;\n" * 10)                  # not prose
        write(s / "data.bin", b"\0\1\2")                                     # no category
        write(s / ".hidden" / "h.py", "hidden = 1\n")
        write(s / "site-packages" / "stray.py", "stray = 1\n")                # not the stdlib's
        write(p / "foo" / "__init__.py", "from .core import run\n")
        write(p / "foo" / "core.py", "def run():\n    return 'foo'\n")
        write(p / "foo" / "GUIDE.md", "# Foo\n\nFoo runs things, and this guide says how.\n")
        write(p / "foo-1.0.dist-info" / "METADATA",
              "Metadata-Version: 2.4\nName: foo\nVersion: 1.0\nLicense-Expression: MIT\n\nlong text\n")
        write(p / "foo-1.0.dist-info" / "RECORD",
              "foo/__init__.py,sha256=x,10\nfoo/core.py,sha256=y,20\nfoo/GUIDE.md,,\n"
              "foo-1.0.dist-info/METADATA,,\n")
        write(p / "bar" / "thing.py", "THING = 'bar'\n")
        write(p / "bar-2.0.dist-info" / "METADATA",
              "Metadata-Version: 2.1\nName: bar\nVersion: 2.0\n"
              "Classifier: Programming Language :: Python\n"
              "Classifier: License :: OSI Approved :: BSD License\n")
        write(p / "bar-2.0.dist-info" / "top_level.txt", "bar\n")
        write(p / "qux" / "q.py", "Q = 3\n")
        write(p / "qux-0.1.egg-info" / "PKG-INFO",
              "Metadata-Version: 1.1\nName: qux\nVersion: 0.1\nLicense: Apache 2.0\n")
        write(p / "qux-0.1.egg-info" / "installed-files.txt", "../qux/q.py\n")
        write(p / "orphan.py", "orphan = True\n")
        self.roots = [C.Root("stdlib", s), C.Root("site0", p)]


def select(inst, train_caps=None, held_caps=None, mod=10, deadline=None, clock=None):
    entries, skipped = C.scan(inst.roots, CATS)
    sel = C.select(entries, C.Licences(inst.roots), mod, train_caps or {}, held_caps or {}, 1000, {"prose"}, 0.6,
                   deadline, clock)
    return entries, skipped, sel


class CorpusTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.inst = Installation(Path(self.tmp.name))

    def tearDown(self):
        self.tmp.cleanup()

    def test_walk_categories_and_skips(self):
        entries, skipped, sel = select(self.inst, mod=1 << 30)  # nothing held out but crc32 == 0
        names = {e.name: e.category for e in entries}
        self.assertEqual(names["stdlib:json/decoder.py"], "code")
        self.assertEqual(names["site0:foo/GUIDE.md"], "prose")
        self.assertNotIn("stdlib:json/__pycache__/decoder.cpython.py", names)
        self.assertNotIn("stdlib:.hidden/h.py", names)
        self.assertNotIn("stdlib:site-packages/stray.py", names)
        self.assertEqual(skipped["nested_roots"], 1)
        self.assertFalse(any("dist-info" in n or "egg-info" in n for n in names))
        self.assertEqual(skipped["other_extensions"], 1)  # data.bin (dist-info files are never walked)
        taken = {t.entry.name for t in sel.taken}
        st = sel.stats["by_category"]
        self.assertEqual(st["code"]["skipped_not_utf8"], 1)
        self.assertEqual(st["code"]["skipped_too_large"], 1)
        self.assertEqual(st["code"]["skipped_duplicate"], 1)
        self.assertEqual(st["prose"]["skipped_not_prose"], 1)
        self.assertNotIn("stdlib:latin.py", taken)
        self.assertNotIn("stdlib:huge.py", taken)
        self.assertNotIn("stdlib:numbers.txt", taken)
        self.assertEqual(len({"stdlib:alpha.py", "stdlib:copy_of_alpha.py"} & taken), 1)  # one of the two
        self.assertEqual(st["code"]["found_files"], 10)
        self.assertEqual(st["code"]["train_files"] + st["code"]["heldout_files"], 7)

    def test_split_is_crc32_of_the_relative_path(self):
        entries, _, sel = select(self.inst, mod=3)
        for t in sel.taken:
            want = "heldout" if zlib.crc32(t.entry.rel.encode()) % 3 == 0 else "train"
            self.assertEqual(t.split, want, t.entry.name)
        self.assertTrue(any(t.split == "heldout" for t in sel.taken))
        self.assertTrue(any(t.split == "train" for t in sel.taken))
        # The split of a file does not depend on which other files exist.
        (self.inst.stdlib / "json" / "decoder.py").unlink()
        _, _, sel2 = select(self.inst, mod=3)
        before = {t.entry.name: t.split for t in sel.taken}
        for t in sel2.taken:
            self.assertEqual(before[t.entry.name], t.split)

    def test_caps_stop_reading_in_a_fixed_order(self):
        _, _, full = select(self.inst, mod=1 << 30)
        order = [t.entry.name for t in full.taken if t.entry.category == "code"]
        self.assertEqual(order, sorted(order, key=lambda n: C.order_key(next(
            t.entry for t in full.taken if t.entry.name == n))))
        cap = 30
        _, _, capped = select(self.inst, train_caps={"code": cap}, mod=1 << 30)
        code = [t for t in capped.taken if t.entry.category == "code"]
        self.assertGreater(len(full.taken), len(capped.taken))
        # Files are taken until the cap is reached: all but the last stay below it.
        self.assertLess(sum(t.nbytes for t in code[:-1]), cap)
        self.assertGreaterEqual(sum(t.nbytes for t in code), cap)
        self.assertEqual([t.entry.name for t in code], order[: len(code)])
        self.assertGreater(capped.stats["by_category"]["code"]["not_read_cap"], 0)
        # Prose is not capped by the code cap.
        self.assertEqual(sum(t.entry.category == "prose" for t in capped.taken),
                         sum(t.entry.category == "prose" for t in full.taken))

    def test_deadline_stops_reading_and_says_so(self):
        ticks = iter(range(1000))
        _, _, sel = select(self.inst, deadline=3, clock=lambda: next(ticks))
        self.assertTrue(sel.stats["deadline_hit"])
        self.assertLessEqual(len(sel.taken), 3)
        _, _, sel = select(self.inst)
        self.assertFalse(sel.stats["deadline_hit"])

    def test_licences(self):
        _, _, sel = select(self.inst, mod=1 << 30)
        lic = {t.entry.name: (t.dist, t.licence) for t in sel.taken}
        self.assertEqual(lic["site0:foo/core.py"], ("foo 1.0", "MIT"))
        self.assertEqual(lic["site0:foo/GUIDE.md"], ("foo 1.0", "MIT"))
        self.assertEqual(lic["site0:bar/thing.py"], ("bar 2.0", "BSD License"))
        self.assertEqual(lic["site0:qux/q.py"], ("qux 0.1", "Apache 2.0"))
        self.assertEqual(lic["site0:orphan.py"], (C.UNKNOWN, C.UNKNOWN))
        self.assertEqual(lic["stdlib:README.txt"], (C.STDLIB_DIST, C.STDLIB_LICENCE))
        mix = C.licence_mix(sel.taken)
        self.assertEqual(mix["total_bytes"], sum(t.nbytes for t in sel.taken))
        self.assertAlmostEqual(sum(r["fraction"] for r in mix["by_licence"]), 1.0)
        by = {r["licence"]: r for r in mix["by_licence"]}
        self.assertEqual(by["MIT"]["files"], 3)
        self.assertEqual(by["MIT"]["distributions"], ["foo"])
        self.assertEqual(by[C.STDLIB_LICENCE]["bytes"], sum(t.nbytes for t in sel.taken if t.dist == C.STDLIB_DIST))
        self.assertEqual(mix["by_licence"][0]["licence"], C.STDLIB_LICENCE)  # the largest first

    def test_licence_from_metadata(self):
        self.assertEqual(C.licence_from_metadata("Name: a\nLicense-Expression: Apache-2.0 OR MIT\nLicense: x\n"),
                         "Apache-2.0 OR MIT")
        self.assertEqual(C.licence_from_metadata(
            "Name: a\nClassifier: License :: OSI Approved :: MIT License\n"
            "Classifier: License :: Public Domain\n"), "MIT License / Public Domain")
        self.assertEqual(C.licence_from_metadata("Name: a\nLicense: BSD 3-Clause\n        more lines\n"),
                         "BSD 3-Clause")
        self.assertEqual(C.licence_from_metadata("Name: a\nLicense: UNKNOWN\n"), C.UNKNOWN)

    def test_manifest_and_hash(self):
        _, _, sel = select(self.inst, mod=3)
        lines = C.manifest_lines(sel.taken)
        self.assertTrue(lines[0].startswith("#"))
        self.assertEqual(len(lines), len(sel.taken) + 1)
        first = lines[1].split("\t")
        t = sel.taken[0]
        self.assertEqual(first, [t.split, t.entry.category, str(t.nbytes), t.dist, t.entry.name])
        h = C.corpus_sha256(sel.taken)
        (self.inst.site / "foo" / "core.py").write_text("def run():\n    return 'changed'\n")
        _, _, sel2 = select(self.inst, mod=3)
        self.assertNotEqual(C.corpus_sha256(sel2.taken), h)

    def test_option_parsing(self):
        self.assertEqual(CATS, [("code", (".py",)), ("prose", (".md", ".rst", ".txt"))])
        for bad in ("code", "code=py", "=.py", "code=.py;code=.pyi", ""):
            with self.assertRaises(SystemExit, msg=bad):
                C.parse_categories(bad)
        self.assertEqual(C.parse_caps("code=1.5", ["code", "prose"], "--x"), {"code": 1500000, "prose": 0})
        for bad in ("docs=1", "code=x", "code"):
            with self.assertRaises(SystemExit, msg=bad):
                C.parse_caps(bad, ["code", "prose"], "--x")
        roots = C.parse_roots(f"stdlib={self.inst.stdlib},{self.inst.site}")
        self.assertEqual([r.label for r in roots], ["stdlib", "root1"])
        with self.assertRaises(SystemExit):
            C.parse_roots(str(Path(self.tmp.name) / "missing"))

    def test_python_roots_of_this_interpreter(self):
        roots = C.python_roots()
        self.assertEqual(roots[0].label, "stdlib")
        self.assertTrue((roots[0].path / "os.py").exists())
        self.assertEqual(len({str(r.path) for r in roots}), len(roots))


if __name__ == "__main__":
    unittest.main()
