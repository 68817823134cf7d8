#!/usr/bin/env python3
"""Runs the h5py snippets of docs/trace-format.md against the C++ trace code, both ways.

  check_trace_h5py.py TRACE_TOOL DOC WORKDIR

1. trace_tool writes a sample trace; the doc's read_sequence() must return the formula's values.
2. the doc's write_trace() writes a random trace; trace_tool (TraceReader) must read back the
   same tokens and BF16 bits (position-weighted integer sums, exact on both sides).
Exits 77 (skipped) when h5py is missing.
"""
import re
import subprocess
import sys

try:
    import h5py  # noqa: F401
    import numpy as np
except ImportError:
    print("h5py / numpy not installed: skipped")
    sys.exit(77)

tool, doc, workdir = sys.argv[1:4]
text_md = open(doc, encoding="utf-8").read()


def snippet(name):
    m = re.search(r"<!-- snippet: " + name + r"\b.*?-->\s*```python\n(.*?)```", text_md, re.S)
    if not m:
        sys.exit(f"{doc}: no snippet '{name}'")
    return m.group(1)


env = {}
exec(snippet("read"), env)
exec(snippet("write"), env)
failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)


# 1. C++ writes, the doc's reader reads.
sample = f"{workdir}/sample.h5"
subprocess.run([tool, "write-sample", sample], check=True)
lengths, prompts = [5, 9, 3], [2, 4, 3]
for s in range(3):
    tokens, hiddens, prompt = env["read_sequence"](sample, s)
    t = np.arange(lengths[s])[:, None]
    j = np.arange(16)[None, :]
    want = ((s * 131 + t * 17 + j * 7) % 251 - 125) / 8.0
    expect(hiddens.dtype == np.float32 and hiddens.shape == (lengths[s], 16), f"seq {s}: shape {hiddens.shape}")
    expect(np.array_equal(hiddens, want.astype(np.float32)), f"seq {s}: hidden values differ")
    expect(np.array_equal(tokens, (s * 1000 + np.arange(lengths[s]) * 37) % 1000), f"seq {s}: tokens differ")
    expect(prompt == prompts[s], f"seq {s}: prompt {prompt}")
with h5py.File(sample, "r") as f:
    expect(env["text"](f.attrs["model"]) == "sample-model", "model attribute")
    expect(env["text"](f["hiddens"].attrs["dtype"]) == "bf16", "dtype attribute")

# 2. The doc's writer writes, TraceReader reads.
rng = np.random.default_rng()
hidden, vocab = int(rng.integers(4, 40)), int(rng.integers(10, 5000))
seqs = []
for s in range(int(rng.integers(2, 6))):
    L = int(rng.integers(2, 60))
    toks = rng.integers(0, vocab, L)
    hs = rng.normal(0, 3, (L, hidden)).astype(np.float32)
    seqs.append((toks, hs, int(rng.integers(2, L + 1))))
written = f"{workdir}/from_h5py.h5"
env["write_trace"](written, seqs, hidden, vocab, {"generator": "check_trace_h5py", "model": "m", "seed": ""})
out = subprocess.run([tool, "check", written], capture_output=True, text=True)
expect(out.returncode == 0, f"TraceReader refused the h5py trace: {out.stderr.strip()}")
lines = out.stdout.splitlines()
total = sum(len(t) for t, _, _ in seqs)
expect(f"dims {hidden} {vocab} {len(seqs)} {total}" in lines, f"dims line: {lines[:1]}")
expect("prov check_trace_h5py|m|" in lines, f"provenance line: {lines[1:2]}")
for s, (toks, hs, p) in enumerate(seqs):
    bits = env["to_bf16_bits"](hs).reshape(-1).astype(np.int64)
    token_sum = int(((np.arange(len(toks)) + 1) * toks).sum())
    bits_sum = int(((np.arange(bits.size) % 1000 + 1) * bits).sum())
    expect(f"seq {s} {len(toks)} {p} {token_sum} {bits_sum}" in lines, f"seq {s}: {lines[2 + s:3 + s]}")

# The doc's BF16 rounding is round-to-nearest-even: 1 + 2^-8 is a tie that goes to 1.0.
tie = np.array([1 + 2**-8, 1 + 3 * 2**-8], np.float32)
expect(list(env["to_bf16_bits"](tie)) == [0x3F80, 0x3F82], "to_bf16_bits is not round-to-nearest-even")

for f in failures:
    print("FAIL:", f)
print(f"check_trace_h5py: {'failed' if failures else 'passed'} (hidden {hidden}, vocab {vocab}, {len(seqs)} sequences)")
sys.exit(1 if failures else 0)
