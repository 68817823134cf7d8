#!/usr/bin/env python3
"""The recorder's format side without torch: traces written by trace_h5.TraceWriter (BF16 and f32
hiddens, sampling attributes) read back by mtplab's TraceReader (tests/io/trace_tool), the faults
the writer refuses, and record_trace.py's refusals of bad arguments and prompt files (which come
before it imports torch).

  check_writer.py TRACE_TOOL WORKDIR

Exits 0 when every check holds, 1 otherwise, 77 (skipped) without h5py / numpy.
"""
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
except ImportError:
    print("h5py / numpy not installed: skipped")
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import trace_h5  # noqa: E402

tool = sys.argv[1]
workdir = tempfile.mkdtemp(prefix="check_writer.", dir=sys.argv[2])  # fresh: nothing from an earlier run
failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)


def expect_raises(fn, part, what):
    try:
        fn()
    except ValueError as e:
        expect(part in str(e), f"{what}: message {str(e)!r} lacks {part!r}")
        return
    failures.append(f"{what}: nothing raised")


rng = np.random.default_rng()
for dtype in ("bf16", "f32"):
    hidden, vocab = int(rng.integers(4, 40)), int(rng.integers(10, 5000))
    seqs = []
    for _ in range(int(rng.integers(2, 6))):
        L = int(rng.integers(2, 60))
        seqs.append((rng.integers(0, vocab, L), rng.normal(0, 3, (L, hidden)).astype(np.float32),
                     int(rng.integers(2, L + 1))))
    path = f"{workdir}/writer-{dtype}.h5"
    w = trace_h5.TraceWriter(path, hidden, vocab, dtype=dtype,
                             provenance={"generator": "check_writer", "model": "m", "created_at": "2026-12-01T00:00:00Z"},
                             attrs={"sampling": "sampling", "temperature": 0.7, "top_k": 40, "top_p": 0.9,
                                    "sampling_seed": 5})
    for toks, hs, p in seqs:
        w.add(toks, hs, p)
    expect(not os.path.exists(path), f"{dtype}: the trace is visible before commit")
    w.commit()

    # mtplab's reader: dims, provenance, and per sequence the tokens and the BF16 bits it hands the
    # drafter (an f32 trace is rounded to nearest even on read, as the writer rounds a bf16 one).
    out = subprocess.run([tool, "check", path], capture_output=True, text=True)
    expect(out.returncode == 0, f"{dtype}: TraceReader refused the trace: {out.stderr.strip()}")
    lines = out.stdout.splitlines()
    total = sum(len(t) for t, _, _ in seqs)
    expect(f"dims {hidden} {vocab} {len(seqs)} {total}" in lines, f"{dtype}: dims line {lines[:1]}")
    expect("prov check_writer|m|" in lines, f"{dtype}: provenance line {lines[1:2]}")
    for s, (toks, hs, p) in enumerate(seqs):
        bits = trace_h5.to_bf16_bits(hs).reshape(-1).astype(np.int64)
        token_sum = int(((np.arange(len(toks)) + 1) * toks).sum())
        bits_sum = int(((np.arange(bits.size) % 1000 + 1) * bits).sum())
        expect(f"seq {s} {len(toks)} {p} {token_sum} {bits_sum}" in lines, f"{dtype}: seq {s}: {lines[2 + s:3 + s]}")

    with h5py.File(path, "r") as f:
        h = f["hiddens"]
        expect(h.attrs["dtype"] == dtype.encode(), f"{dtype}: /hiddens dtype attribute {h.attrs['dtype']!r}")
        expect(h.dtype == (np.uint16 if dtype == "bf16" else np.float32), f"{dtype}: /hiddens is {h.dtype}")
        if dtype == "f32":
            expect(np.array_equal(h[()], np.concatenate([x for _, x, _ in seqs])), "f32: values not stored exactly")
        a = f.attrs
        expect(a["sampling"] == b"sampling" and a["sampling_seed"].dtype == np.int64 and a["top_k"] == 40,
               f"{dtype}: sampling attributes {dict(a)}")
        expect(a["temperature"].dtype == np.float64 and a["temperature"] == 0.7 and a["top_p"] == 0.9,
               f"{dtype}: temperature / top_p {a['temperature']!r} {a['top_p']!r}")
        expect(a["format"] == b"mtplab-trace" and a["format_version"] == 1, f"{dtype}: format attributes")

# Routing: written by the writer, read by mtplab's reader (trace_tool's routing shape and sums).
layers, top_k, experts = 3, 2, int(rng.integers(8, 64))
path = f"{workdir}/writer-routing.h5"
w = trace_h5.TraceWriter(path, 8, 100, routing=(layers, top_k, experts))
route_seqs = []
for _ in range(3):
    L = int(rng.integers(3, 20))
    ids = np.stack([np.stack([rng.permutation(experts)[:top_k] for _ in range(layers)]) for _ in range(L)])
    ids[:, 0, :] = -1  # layer 0 dense
    route_seqs.append(ids)
    w.add(rng.integers(0, 100, L), rng.normal(0, 1, (L, 8)), 2, routing=ids)
w.commit()
out = subprocess.run([tool, "check", path], capture_output=True, text=True)
expect(out.returncode == 0, f"routing: TraceReader refused the trace: {out.stderr.strip()}")
lines = out.stdout.splitlines()
expect(f"routing {layers} {top_k} {experts}" in lines, f"routing: shape line missing in {lines}")
for s, ids in enumerate(route_seqs):
    flat = ids.reshape(-1).astype(np.int64)
    route_sum = int(((np.arange(flat.size) % 997 + 1) * (flat + 2)).sum())
    expect(f"route {s} {route_sum}" in lines, f"routing: sequence {s}'s sum not in {lines}")
w = trace_h5.TraceWriter(f"{workdir}/bad-routing.h5", 4, 10, routing=(2, 2, 8))
good = np.array([[[-1, -1], [1, 2]]] * 2)
bad_id = good.copy()
bad_id[1, 1, 0] = 8
expect_raises(lambda: w.add([1, 2], np.zeros((2, 4)), 2, routing=bad_id),
              "routing of position 1, layer 1: expert id 8 is outside [0, 8)", "routing id")
mixed = good.copy()
mixed[0, 0, 1] = 3
expect_raises(lambda: w.add([1, 2], np.zeros((2, 4)), 2, routing=mixed),
              "routing of position 0, layer 0: expert id -1 is outside [0, 8)", "routing -1 beside an expert")
expect_raises(lambda: w.add([1, 2], np.zeros((2, 4)), 2), "add(..., routing=) is required", "routing missing")
expect_raises(lambda: w.add([1, 2], np.zeros((2, 4)), 2, routing=good[:1]), "routing of shape", "routing shape")
w.abandon()

# What the writer refuses, naming the sequence and position.
w = trace_h5.TraceWriter(f"{workdir}/bad.h5", 4, 10)
expect_raises(lambda: w.add([1, 2, 10], np.zeros((3, 4)), 2), "position 2: token id 10 is outside [0, 10)", "token")
expect_raises(lambda: w.add([1, 2, 3], np.zeros((3, 4)), 1), "prompt length 1 must be in [2, 3]", "prompt length")
expect_raises(lambda: w.add([1, 2], np.zeros((2, 5)), 2), "hiddens have shape (2, 5), expected (2, 4)", "shape")
nan = np.zeros((2, 4), np.float32)
nan[1, 3] = np.nan
expect_raises(lambda: w.add([1, 2], nan, 2), "position 1, element 3: hidden is nan", "NaN")
big = np.zeros((2, 4), np.float32)
big[0, 1] = 3.4e38  # finite in fp32, past BF16's largest finite value: rounds to infinity
expect_raises(lambda: w.add([1, 2], big, 2), "position 0, element 1: hidden is inf (not finite after BF16 rounding)",
              "BF16 overflow")
expect_raises(lambda: w.commit(), "a trace needs at least one sequence", "empty")
w.abandon()
expect(not any(n.startswith("bad.h5") for n in os.listdir(workdir)), "abandon left a file")

# record_trace.py refuses bad arguments and prompt files before it needs torch.
rec = [sys.executable, os.path.join(here, "record_trace.py"), "--model", "unused", "--out", f"{workdir}/x.h5"]
bad = f"{workdir}/bad.jsonl"
with open(bad, "w") as f:
    f.write('{"prompt": "fine"}\n\n{"prompt": "a", "messages": []}\n')
r = subprocess.run(rec + ["--prompts", bad], capture_output=True, text=True)
expect(r.returncode == 1 and f"{bad}:3: each line needs exactly one of" in r.stderr, f"bad prompts: {r.stderr!r}")
with open(bad, "w") as f:
    f.write('{"prompt": 3}\n')
r = subprocess.run(rec + ["--prompts", bad], capture_output=True, text=True)
expect(r.returncode == 1 and f"{bad}:1: \"prompt\" must be a string" in r.stderr, f"non-string prompt: {r.stderr!r}")
r = subprocess.run(rec + ["--prompts", bad, "--temperature", "0.5"], capture_output=True, text=True)
expect(r.returncode == 2 and "need --sampling sampling" in r.stderr, f"temperature without sampling: {r.stderr!r}")
r = subprocess.run(rec + ["--prompts", bad, "--sampling", "sampling", "--top-p", "0"], capture_output=True, text=True)
expect(r.returncode == 2 and "--top-p must be in (0, 1]" in r.stderr, f"top-p 0: {r.stderr!r}")

if not failures:
    shutil.rmtree(workdir, ignore_errors=True)
for f in failures:
    print("FAIL:", f)
print(f"check_writer: {'failed' if failures else 'passed'} ({len(failures)} failure(s))")
sys.exit(1 if failures else 0)
