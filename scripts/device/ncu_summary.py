#!/usr/bin/env python3
"""Per-kernel time of each draft step from an ncu CSV of mtplab_bench_step --profile.

  ncu --profile-from-start off --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,... \
      mtplab_bench_step --graphs off --profile --reps R ... > ncu.csv
  ncu_summary.py ncu.csv --reps R --labels bf16:1,bf16:2,fp8:1,fp8:2

The profiled kernels are cut into steps at every launch of the first kernel seen (every step
starts with the same kernel); steps are given, in order, R at a time, to the labels (the order in
which the benchmark ran its points). Prints, per label, every kernel's median time per step over
the label's steps, its share of the step, its DRAM bytes and their rate, and the step's total.
Exits 1 when the step count is not R x the number of labels (the cut is then not trustworthy).
"""
import argparse
import csv
import statistics
import sys
from collections import OrderedDict, defaultdict


def short(name):
    """The kernel's own name: no return type, namespaces, template or argument lists."""
    for anon in ("(anonymous namespace)", "<unnamed>"):
        name = name.replace(anon, "anon")
    name = name.removeprefix("void ").strip()
    name = name.split("<")[0].split("(")[0]
    return name.split("::")[-1] or name


def read(path):
    kernels = OrderedDict()  # ID -> dict
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for row in csv.DictReader(lines):
        k = kernels.setdefault(row["ID"], {"name": short(row["Kernel Name"]), "grid": row.get("Grid Size", "")})
        val = row["Metric Value"].replace(",", "")
        try:
            v = float(val)
        except ValueError:
            continue
        unit = row.get("Metric Unit", "")
        name = row["Metric Name"]
        if name == "gpu__time_duration.sum":
            v *= {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(unit, 1e-3)
            k["us"] = v
        elif name.startswith("dram__bytes"):
            v *= {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}.get(unit, 1)
            k["bytes"] = k.get("bytes", 0.0) + v
    return list(kernels.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--reps", type=int, required=True)
    ap.add_argument("--labels", required=True, help="comma-separated, in the benchmark's order")
    a = ap.parse_args()
    labels = a.labels.split(",")
    ks = [k for k in read(a.csv) if "us" in k]
    if not ks:
        sys.exit(f"{a.csv}: no kernel with gpu__time_duration.sum")
    first = ks[0]["name"]
    steps = []
    for k in ks:
        if k["name"] == first:
            steps.append([])
        steps[-1].append(k)
    if len(steps) != a.reps * len(labels):
        print(f"{a.csv}: {len(steps)} steps (cut at {first}), expected {a.reps} x {len(labels)}", file=sys.stderr)
        sys.exit(1)
    for li, label in enumerate(labels):
        mine = steps[li * a.reps:(li + 1) * a.reps]
        per = defaultdict(list)  # name -> [(us, bytes, calls) per step]
        order = []
        for st in mine:
            acc = OrderedDict()
            for k in st:
                e = acc.setdefault(k["name"], [0.0, 0.0, 0])
                e[0] += k["us"]
                e[1] += k.get("bytes", 0.0)
                e[2] += 1
            for n, e in acc.items():
                if n not in per:
                    order.append(n)
                per[n].append(e)
        totals = [sum(k["us"] for k in st) for st in mine]
        tot = statistics.median(totals)
        print(f"\n{label}: {len(mine)} steps, kernels {statistics.median(len(st) for st in mine):.0f} per step, "
              f"kernel time {tot:.1f} us per step (median)")
        print(f"{'kernel':<34} {'calls':>5} {'us':>9} {'share':>6} {'MB':>9} {'GB/s':>7}")
        for n in sorted(order, key=lambda n: -statistics.median(e[0] for e in per[n])):
            us = statistics.median(e[0] for e in per[n])
            mb = statistics.median(e[1] for e in per[n]) / 1e6
            calls = statistics.median(e[2] for e in per[n])
            print(f"{n[:34]:<34} {calls:>5.0f} {us:>9.1f} {100 * us / tot:>5.1f}% {mb:>9.1f} "
                  f"{(mb * 1e6 / (us * 1e-6) / 1e9) if us > 0 else 0:>7.0f}")


if __name__ == "__main__":
    main()
