"""The verification table: mtplab's target layer over B sequences x R new rows and its head over
the B x R rows (mtplab_bench_verify's CSV) next to the strong PyTorch peer's
(../shared/bench/torch_graph_peer_verify.py's JSON: one CUDA graph per shape), both measured in the
same run on the same GPU. Per (B, R): the layer's us, distinct experts, byte floor and x floor on
each side, and peer / mtplab (how many times faster mtplab is); per head and row count the same.
The two route with their own random weights, so their distinct experts (and floors) differ: the
last column compares them at equal bytes, the peer's x floor over mtplab's.

    python3 bench/peer/verify_ratio.py BENCH_VERIFY.csv PEER.json
"""
import csv
import json
import sys


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip())
        return 2
    with open(argv[1]) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    peer = json.load(open(argv[2]))
    layer = {(int(p["B"]), int(p["R"])): p for p in peer["layer"]}
    head = {(p["head"], int(p["rows"])): p for p in peer["head"]}
    print(f"mtplab_bench_verify vs the PyTorch peer; copy {peer.get('copy_GBps', float('nan')):.0f} GB/s in the "
          f"peer's run, context {peer.get('context')}")
    print(f"{'B':>4s} {'R':>2s} {'mt_us':>8s} {'experts':>7s} {'floor_us':>8s} {'x_floor':>7s} {'peer_us':>8s} "
          f"{'experts':>7s} {'x_floor':>7s} {'peer/mt':>7s} {'eq_bytes':>8s}")
    worst = None
    for r in rows:
        if r["part"] != "layer":
            continue
        B, R = int(r["B"]), int(r["R"])
        p = layer.get((B, R))
        mt, xf = float(r["median_us"]), float(r["x_floor"])
        if not p:
            print(f"{B:4d} {R:2d} {mt:8.1f} {float(r['distinct_experts']):7.0f} {float(r['floor_us']):8.1f} {xf:7.2f}"
                  f" {'-':>8s}")
            continue
        pxf = p["median_us"] / p["floor_us"]
        ratio = p["median_us"] / mt
        worst = ratio if worst is None else min(worst, ratio)
        print(f"{B:4d} {R:2d} {mt:8.1f} {float(r['distinct_experts']):7.0f} {float(r['floor_us']):8.1f} {xf:7.2f} "
              f"{p['median_us']:8.1f} {p['distinct_experts']:7.0f} {pxf:7.2f} {ratio:7.2f} {pxf / xf:8.2f}")
    print(f"{'head':5s} {'rows':>5s} {'mt_us':>8s} {'x_floor':>7s} {'x_roof':>7s} {'peer_us':>8s} {'x_floor':>7s} "
          f"{'peer/mt':>7s}")
    for r in rows:
        if r["part"] != "head":
            continue
        n, name = int(r["rows"]), r["head"]
        p = head.get((name, n))
        mt = float(r["median_us"])
        roof = f"{float(r['x_roofline']):7.2f}" if r.get("x_roofline") else f"{'-':>7s}"
        if not p:
            print(f"{name:5s} {n:5d} {mt:8.1f} {float(r['x_floor']):7.2f} {roof} {'-':>8s}")
            continue
        print(f"{name:5s} {n:5d} {mt:8.1f} {float(r['x_floor']):7.2f} {roof} {p['median_us']:8.1f} "
              f"{p['median_us'] / p['floor_us']:7.2f} {p['median_us'] / mt:7.2f}")
    if worst is not None:
        print(f"smallest peer / mtplab over the layer points: {worst:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
