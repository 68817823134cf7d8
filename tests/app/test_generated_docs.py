#!/usr/bin/env python3
"""The generated documentation is current: every file scripts/gen-docs.py writes is byte for byte
what it would write now, and experiments/README.md has an entry for every experiments/*.yaml.

  test_generated_docs.py REPO_ROOT [GEN_DOCS_OPTION ...]

The options go to `scripts/gen-docs.py --check` (--only FILE, --doc-tables PATH: app.generated_docs
checks experiments/README.md, app.kernel_tables docs/kernels.md with the built mtplab_doc_tables).
Changes nothing. Exit 0 when current; 1 with one line per problem (and the start of a diff)
otherwise. The fix is always: scripts/gen-docs.py, then commit the result.
"""
import os
import re
import subprocess
import sys

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../.."))
problems = []

readme = os.path.join(root, "experiments", "README.md")
listed = set()
if os.path.exists(readme):
    with open(readme, encoding="utf-8") as f:
        listed = {m.group(1) for m in re.finditer(r"^## ([\w.-]+\.yaml)$", f.read(), re.M)}
else:
    problems.append("experiments/README.md: missing")
for name in sorted(os.listdir(os.path.join(root, "experiments"))):
    if name.endswith(".yaml") and name not in listed:
        problems.append(f"experiments/README.md: no entry for experiments/{name}")
for name in sorted(listed):
    if not os.path.exists(os.path.join(root, "experiments", name)):
        problems.append(f"experiments/README.md: an entry for experiments/{name}, which does not exist")

gen = subprocess.run([sys.executable, os.path.join(root, "scripts", "gen-docs.py"), "--check"] + sys.argv[2:],
                     capture_output=True, text=True)
if "skipped" in gen.stdout and "--doc-tables" in sys.argv[2:]:
    problems.append("scripts/gen-docs.py skipped a file it was given the generator of:\n" + gen.stdout)
if gen.returncode != 0:
    problems.append("scripts/gen-docs.py --check exited %d:\n%s%s" % (gen.returncode, gen.stdout, gen.stderr))

for p in problems:
    print(p)
if problems:
    print("fix: scripts/gen-docs.py (in a CUDA build: --doc-tables build/bin/mtplab_doc_tables), "
          "then commit the files it wrote")
sys.exit(1 if problems else 0)
