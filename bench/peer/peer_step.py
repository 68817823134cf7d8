#!/usr/bin/env python3
"""The PyTorch peer of mtplab_bench_step: one MTP draft step built from Hugging Face
transformers' glm5_next modules (Glm5NextTextAttention with its pooled indexer, Glm5NextTextMoE,
Glm5NextTextRMSNorm; eager attention and experts), composed as docs/model.md writes it (mtp_peer.py),
on the weights mtplab runs (a checkpoint written by mtplab_export_weights), timed with CUDA events.

    python3 bench/peer/peer_step.py --weights W.safetensors [--preset glm5.3-flash] [--experts E]
        [--context 4096] [--reps 30] [--warmup 4] [--variants eager,compile,graph]
        [--deadline-s S] [--mtplab-csv bench_step.csv] [--out DIR]

Method: the context is --context cache-only rows (random tokens, unit-RMS hiddens, as
mtplab_bench_step), written by one prefill through the attention into transformers' own cache
(DynamicCache: expanded per-head K/V plus the indexer's packed rows). Then each timed step is
one draft (decode of one token given the cache) between two CUDA events, from a fresh token and
hidden already on the device; the cache grows by one row per step, as mtplab's does
(after_verify(0) keeps the step's first row). Variants, each caught and reported when it fails:
  eager    the modules as they are;
  compile  torch.compile(step) (default mode), warm-up steps include the compilation;
  graph    torch.cuda.graph capture of one step (transformers' eager experts and indexer
           synchronise with the host, so a failure is the expected answer; it is reported).
Every variant runs against the time left before --deadline-s (seconds since start); a variant
that would start too late is skipped and says so. Writes DIR/peer_step.csv and, with
--mtplab-csv, prints the peer's median next to mtplab's (BF16 head, k = 1) and the ratio.

Exit: 0 when the eager variant ran; 1 when it did not; 2 when transformers' glm5_next is missing.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mtp_peer as mp  # noqa: E402

T0 = time.time()


def elapsed() -> float:
    return time.time() - T0


# ------------------------------------------------------------------------------------------------
# transformers (the only part that needs it)
# ------------------------------------------------------------------------------------------------
def import_glm5_next():
    import transformers
    from transformers.models.glm5_next import modeling_glm5_next as M
    try:
        from transformers.models.glm5_next import configuration_glm5_next as C
    except ImportError:
        C = M
    return transformers, M, C


def make_config(M, C, p: dict, max_positions: int):
    """Glm5NextTextConfig with one layer (index 0) of DSA attention with its own pooled indexer
    and a sparse MoE; keys this version rejects are dropped and reported (as make_fixtures.py)."""
    cls = getattr(C, "Glm5NextTextConfig", None) or getattr(M, "Glm5NextTextConfig")
    kw = dict(
        vocab_size=p["vocab"], hidden_size=p["hidden"],
        intermediate_size=p["moe_inter"] * p["n_shared"], moe_intermediate_size=p["moe_inter"],
        num_hidden_layers=1, num_attention_heads=p["n_heads"], num_key_value_heads=p["n_heads"],
        q_lora_rank=p["q_lora"], kv_lora_rank=p["kv_lora"], qk_nope_head_dim=p["qk_nope"],
        qk_rope_head_dim=0, v_head_dim=p["v_head"],
        n_routed_experts=p["n_experts"], num_local_experts=p["n_experts"], num_experts_per_tok=p["top_k"],
        n_shared_experts=p["n_shared"], n_group=1, topk_group=1, norm_topk_prob=True,
        routed_scaling_factor=p["routed_scaling"], swiglu_limit=p["swiglu_limit"], rms_norm_eps=p["rms_eps"],
        hidden_act="silu", index_n_heads=p["index_heads"], index_head_dim=p["index_dim"],
        index_topk=p["index_topk"], index_kpool=p["index_kpool"], index_kpool_always_select_tail=True,
        layer_types=["full_attention"], indexer_types=["full"], mlp_layer_types=["sparse"],
        attention_bias=False, attention_dropout=0.0, pad_token_id=0, bos_token_id=None, eos_token_id=None,
        tie_word_embeddings=False, max_position_embeddings=max_positions,
    )
    dropped = []
    for _ in range(len(kw)):
        try:
            cfg = cls(**kw)
            break
        except (TypeError, ValueError) as exc:
            msg = str(exc)
            bad = next((k for k in kw if f"'{k}'" in msg or f"`{k}`" in msg), None)
            if bad is None:
                raise
            dropped.append(bad)
            kw.pop(bad)
    else:
        raise RuntimeError("could not construct Glm5NextTextConfig")
    for attr in ("_attn_implementation", "_experts_implementation"):
        setattr(cfg, attr, "eager")
    if dropped:
        mp.log(f"[config] keys rejected by this transformers and dropped: {dropped}")
    for key in ("num_local_experts", "n_routed_experts"):
        if hasattr(cfg, key) and getattr(cfg, key) != p["n_experts"]:
            raise RuntimeError(f"config.{key} = {getattr(cfg, key)}, expected {p['n_experts']}")
    return cfg


def build_step(M, cfg, p: dict, device) -> mp.MtpStep:
    """transformers' modules on the meta device, then uninitialised storage on `device` (the
    checkpoint fills every tensor: no 18 GB of CPU initialisation)."""
    with torch.device("meta"):
        attn = M.Glm5NextTextAttention(cfg, 0)
        ix = attn.indexer
        base = getattr(M, "Glm5NextTextIndexer", None)
        if base is not None and type(ix) is not base and isinstance(ix, base):
            mp.log(f"[build] attention constructed {type(ix).__name__}: using the pooled {base.__name__}")
            attn.indexer = base(cfg, 0)
        moe = M.Glm5NextTextMoE(cfg)
        step = mp.MtpStep(p, attn, moe, lambda n, eps: M.Glm5NextTextRMSNorm(n, eps=eps), call_attention)
    mp.materialise(step, device)
    step.eval()
    mp.log(f"[build] {type(attn).__name__} + {type(attn.indexer).__name__}, {type(moe).__name__} "
           f"({type(moe.experts).__name__}, {p['n_experts']} experts), {type(step.enorm).__name__}; "
           f"attn {cfg._attn_implementation!r}, experts {getattr(cfg, '_experts_implementation', '?')!r}")
    return step


def call_attention(attn, u, mask, cache):
    return attn(u, attention_mask=mask, past_key_values=cache)[0]


def make_cache(cfg, kind: str, max_len: int):
    """transformers' cache for one DSA layer: DynamicCache (what generate() uses by default) or
    StaticCache (fixed shapes, for graph capture). Must offer update_indexer."""
    from transformers import cache_utils as cu
    if kind == "dynamic":
        cache = cu.DynamicCache(config=cfg)
    else:
        cache = cu.StaticCache(config=cfg, max_cache_len=max_len)
    if not hasattr(cache, "update_indexer"):
        raise RuntimeError(f"{type(cache).__name__} has no update_indexer: this transformers cannot cache the "
                           "DSA indexer rows")
    return cache


# ------------------------------------------------------------------------------------------------
# Variants
# ------------------------------------------------------------------------------------------------
def prefill(step, p, cfg, kind, args, device):
    cache = make_cache(cfg, kind, args.context + args.warmup + args.reps + 16)
    g = torch.Generator().manual_seed(1234)
    tokens = torch.randint(0, p["vocab"], (args.context,), generator=g).to(device)
    hid = torch.randn(args.context, p["hidden"], generator=g)
    hid = (hid / hid.pow(2).mean(-1, keepdim=True).sqrt()).to(device=device, dtype=torch.bfloat16)
    t0 = time.time()
    with torch.no_grad():
        # Chunks bound the prefill's attention matrix ([heads, chunk, rows] per chunk).
        for c0 in range(0, args.context, args.prefill_chunk):
            step.context(tokens[c0:c0 + args.prefill_chunk], hid[c0:c0 + args.prefill_chunk], cache)
    torch.cuda.synchronize()
    mp.log(f"[prefill] {kind} cache, {args.context} rows in {time.time() - t0:.2f} s")
    return cache


def time_steps(fn, p, args, device, seed):
    tokens, hiddens = mp.step_inputs(p, args.warmup + args.reps, device, seed)
    timer = mp.StepTimer(device)
    us, drafts = [], []
    with torch.no_grad():
        for i in range(args.warmup + args.reps):
            out = {}
            t = timer.time_us(lambda: out.setdefault("r", fn(tokens[i], hiddens[i])))
            if i >= args.warmup:
                us.append(t)
            drafts.append(int(out["r"][0][0]))
    return us, drafts


def variant_eager(step, p, cfg, args, device):
    cache = prefill(step, p, cfg, "dynamic", args, device)
    return time_steps(lambda t, h: step(t, h, cache), p, args, device, 77)


def variant_compile(step, p, cfg, args, device):
    cache = prefill(step, p, cfg, "dynamic", args, device)
    compiled = torch.compile(step)
    t0 = time.time()
    with torch.no_grad():
        tk, hd = mp.step_inputs(p, 1, device, 5)
        compiled(tk[0], hd[0], cache)
    torch.cuda.synchronize()
    mp.log(f"[compile] first call (compilation) {time.time() - t0:.1f} s")
    return time_steps(lambda t, h: compiled(t, h, cache), p, args, device, 77)


def variant_graph(step, p, cfg, args, device):
    cache = prefill(step, p, cfg, "static", args, device)
    tok_in = torch.zeros(1, dtype=torch.long, device=device)
    hid_in = torch.zeros(1, p["hidden"], dtype=torch.bfloat16, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(2):
            step(tok_in, hid_in, cache)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        out = step(tok_in, hid_in, cache)

    def replay(t, h):
        tok_in.copy_(t)
        hid_in.copy_(h)
        graph.replay()
        return out

    return time_steps(replay, p, args, device, 77)


VARIANTS = {"eager": variant_eager, "compile": variant_compile, "graph": variant_graph}
# Rough seconds each needs beyond its steps, to decide whether to start it before the deadline.
VARIANT_BUDGET_S = {"eager": 20, "compile": 90, "graph": 20}


def mtplab_median(path: str):
    """mtplab_bench_step's median for the BF16 head, k = 1, per cuda_graph value."""
    out = {}
    with open(path) as f:
        rows = [r for r in csv.DictReader(line for line in f if not line.startswith("#"))]
    for r in rows:
        if r["head"] == "bf16" and r["k"] == "1":
            out[r["cuda_graph"]] = float(r["median_us"])
    return out



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", required=True, help="checkpoint from mtplab_export_weights")
    ap.add_argument("--preset", default="glm5.3-flash", choices=sorted(mp.PRESETS))
    ap.add_argument("--experts", type=int, default=0, help="routed experts (0: the preset's)")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--prefill-chunk", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--variants", default="eager,compile,graph")
    ap.add_argument("--deadline-s", type=float, default=1e9, help="no variant starts later than its budget allows")
    ap.add_argument("--mtplab-csv", default="")
    ap.add_argument("--out", default="peer-out")
    args = ap.parse_args()

    p = dict(mp.PRESETS[args.preset])
    if args.experts:
        p["n_experts"] = args.experts
    device = torch.device("cuda")
    Path(args.out).mkdir(parents=True, exist_ok=True)

    try:
        transformers, M, C = import_glm5_next()
    except Exception as exc:  # noqa: BLE001
        mp.log(f"transformers' glm5_next is not importable: {type(exc).__name__}: {exc}")
        return 2
    mp.log(f"peer_step: torch {torch.__version__}, transformers {transformers.__version__}, "
           f"{torch.cuda.get_device_name(0)}; preset {args.preset} with {p['n_experts']} routed experts, "
           f"context {args.context}, {args.reps} timed steps after {args.warmup} warm-up")
    cfg = make_config(M, C, p, max(8192, 2 * args.context))
    step = build_step(M, cfg, p, device)
    t0 = time.time()
    ckpt = mp.Checkpoint(args.weights)
    mp.load_weights(step, ckpt, p, device)
    torch.cuda.synchronize()
    mp.log(f"[load] {ckpt.bytes_read / 1e9:.2f} GB from {args.weights} in {time.time() - t0:.1f} s "
           f"(every tensor of the checkpoint used, every parameter loaded)")
    mp.log(f"[note] {mp.attention_flops_note(p, args.context)}")

    rows = []
    csv_path = Path(args.out) / "peer_step.csv"

    def flush():
        with open(csv_path, "w", newline="") as f:
            f.write(f"# peer_step torch {torch.__version__} transformers {transformers.__version__} "
                    f"device {torch.cuda.get_device_name(0)} preset {args.preset} experts {p['n_experts']} "
                    f"context {args.context} weights {args.weights}\n")
            w = csv.DictWriter(f, fieldnames=["variant", "reps", "median_us", "p10_us", "p90_us", "note"])
            w.writeheader()
            w.writerows(rows)

    eager_drafts = None
    for name in [v for v in args.variants.split(",") if v]:
        left = args.deadline_s - elapsed()
        if left < VARIANT_BUDGET_S[name]:
            rows.append(mp.summary_row(name, [], f"skipped: {left:.0f} s left before the deadline"))
            mp.log(f"[{name}] SKIPPED: {left:.0f} s left before the deadline")
            flush()
            continue
        t0 = time.time()
        try:
            us, drafts = VARIANTS[name](step, p, cfg, args, device)
            note = f"{time.time() - t0:.0f} s in all"
            if eager_drafts is None:
                eager_drafts = drafts
            elif name != "graph":
                same = sum(a == b for a, b in zip(drafts, eager_drafts))
                note += f"; drafts equal to eager's {same}/{len(drafts)}"
            rows.append(mp.summary_row(name, us, note))
            r = rows[-1]
            mp.log(f"[{name}] median {r['median_us']:.1f} us, p10 {r['p10_us']:.1f}, p90 {r['p90_us']:.1f} "
                   f"({r['reps']} steps; {note}); first drafts {drafts[:6]}")
        except Exception as exc:  # noqa: BLE001 - every failure is a result
            tb = traceback.format_exc(limit=6)
            msg = f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            rows.append(mp.summary_row(name, [], msg))
            mp.log(f"[{name}] {msg}\n{tb}")
            try:
                torch.cuda.synchronize()
            except Exception as exc2:  # noqa: BLE001
                mp.log(f"[{name}] the CUDA context is unusable after the failure ({exc2}); stopping")
                flush()
                break
        flush()

    mine = {}
    if args.mtplab_csv and Path(args.mtplab_csv).exists():
        mine = mtplab_median(args.mtplab_csv)
    mp.log("")
    mp.log(f"{'draft step (k=1, BF16 head)':34s} {'median_us':>10s} {'p10_us':>8s} {'p90_us':>8s}  "
           f"{'peer / mtplab graph':>19s}  note")
    for label, key in (("mtplab cuda_graph off", "off"), ("mtplab cuda_graph on", "on")):
        if key in mine:
            mp.log(f"{label:34s} {mine[key]:10.1f} {'':>8s} {'':>8s}  {'':>19s}")
    for r in rows:
        ratio = ""
        if r["reps"] and "on" in mine:
            ratio = f"{r['median_us'] / mine['on']:.2f}x"
        med = f"{r['median_us']:10.1f}" if r["reps"] else f"{'-':>10s}"
        p10 = f"{r['p10_us']:8.1f}" if r["reps"] else f"{'-':>8s}"
        p90 = f"{r['p90_us']:8.1f}" if r["reps"] else f"{'-':>8s}"
        mp.log(f"{'peer ' + r['variant']:34s} {med} {p10} {p90}  {ratio:>19s}  {r['note']}")
    mp.log(f"wrote {csv_path}")
    return 0 if any(r["variant"] == "eager" and r["reps"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
