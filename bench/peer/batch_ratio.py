"""The batch-scaling table: mtplab's batched draft step (mtplab_bench_step --batch's CSV) next to
the strong PyTorch peer's (its JSON: the whole step in one CUDA graph, torch._grouped_mm MoE, the
absorbed MLA decode over the indexer's selection, head GEMM + argmax), both measured in the same
run on the same GPU. Per head and B: step us, per-sequence us, mtplab's byte floor and x floor, the peer's
step, and how many times faster mtplab is (peer / mtplab).

The two route with their own random weights, so a step of theirs need not touch the same number of
distinct experts (the `experts` columns: mtplab's from its router, the peer's from its own), and the
bytes each must read differ with them. The last column compares the two at equal bytes: the peer's
x floor over mtplab's (each step against its own byte floor at the same copy rate), which is what
the ratio would be had both routed to the same experts. The peer's x floor is also the most any
step reading the same bytes could gain on it (a step at exactly its floor): the last line names
its smallest, the bound on the smallest equal-bytes ratio on this GPU.

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
    print(f"{'head':5s} {'B':>4s} {'step_us':>9s} {'per_seq':>8s} {'experts':>7s} {'floor_us':>9s} "
          f"{'x_floor':>7s} {'peer_us':>9s} {'experts':>7s} {'x_floor':>7s} {'peer/mt':>8s} {'eq_bytes':>8s}")
    worst = worst_eq = bound = None
    for r in rows:
        if r["cuda_graph"] != graph or r["k"] != k:
            continue
        B, head = int(r["B"]), r["head"]
        step = float(r["median_us"]) / int(k)
        p = by.get((head, B))
        nan = float("nan")
        ratio = p["median_us"] / step if p else nan
        x_floor = float(r["x_floor"])
        peer_x = p["median_us"] / p["floor_us"] if p else nan
        eq = peer_x / x_floor if p else nan
        if p:
            worst = ratio if worst is None else min(worst, ratio)
            worst_eq = eq if worst_eq is None else min(worst_eq, eq)
            if bound is None or peer_x < bound[0]:
                bound = (peer_x, head, B)
        print(f"{head:5s} {B:4d} {step:9.1f} {step / B:8.1f} {float(r['distinct_experts']):7.1f} "
              f"{float(r['floor_us']) / int(k):9.1f} {x_floor:7.2f} {p['median_us'] if p else nan:9.1f} "
              f"{p['distinct_experts'] if p else nan:7.1f} {peer_x:7.2f} {ratio:8.2f} {eq:8.2f}")
    if worst is not None:
        print(f"smallest peer/mtplab ratio: {worst:.2f}; at equal bytes (peer x floor / mtplab x floor): "
              f"{worst_eq:.2f}\nbound: at {bound[1]} B = {bound[2]} a step exactly at its byte floor would be "
              f"{bound[0]:.2f}x faster than the peer at equal bytes (the peer's smallest x floor)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
