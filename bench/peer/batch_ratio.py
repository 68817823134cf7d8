"""The batch-scaling table: mtplab's batched draft step (mtplab_bench_step --batch's CSV) next to
the strong PyTorch peer's (its JSON: the whole step in one CUDA graph, torch._grouped_mm MoE, the
absorbed MLA decode over the indexer's selection, head GEMM + argmax), both measured in the same
device call. Per head and B: step us, per-sequence us, mtplab's byte floor and x floor, the peer's
step, and how many times faster mtplab is (peer / mtplab).

    python3 bench/peer/batch_ratio.py BENCH_STEP_BATCH.csv PEER.json [--graph on] [--k 1]
"""
import csv
import json
import sys


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip())
        return 2
    graph = argv[argv.index("--graph") + 1] if "--graph" in argv else "on"
    k = argv[argv.index("--k") + 1] if "--k" in argv else "1"
    with open(argv[1]) as f:
        rows = [r for r in csv.DictReader(line for line in f if not line.startswith("#"))]
    peer = json.load(open(argv[2]))
    by = {(p["head"], int(p["B"])): p for p in peer["points"]}
    print(f"mtplab (cuda_graph {graph}, k = {k}) vs the PyTorch peer (one CUDA graph per step); "
          f"copy {peer.get('copy_GBps', float('nan')):.0f} GB/s in the peer's run")
    print(f"{'head':5s} {'B':>4s} {'step_us':>9s} {'per_seq':>8s} {'floor_us':>9s} {'x_floor':>7s} "
          f"{'peer_us':>9s} {'peer/mt':>8s}")
    worst = None
    for r in rows:
        if r["cuda_graph"] != graph or r["k"] != k:
            continue
        B, head = int(r["B"]), r["head"]
        step = float(r["median_us"]) / int(k)
        p = by.get((head, B))
        ratio = p["median_us"] / step if p else float("nan")
        if p:
            worst = ratio if worst is None else min(worst, ratio)
        print(f"{head:5s} {B:4d} {step:9.1f} {step / B:8.1f} {float(r['floor_us']) / int(k):9.1f} "
              f"{float(r['x_floor']):7.2f} {p['median_us'] if p else float('nan'):9.1f} {ratio:8.2f}")
    if worst is not None:
        print(f"smallest peer/mtplab ratio: {worst:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
