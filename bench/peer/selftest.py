#!/usr/bin/env python3
"""CPU self-test of the peer's transformers-free part (mtp_peer.py), at the tiny preset, on a
checkpoint written by mtplab_export_weights:

    mtplab_export_weights --preset tiny --out /tmp/tiny.safetensors
    python3 bench/peer/selftest.py /tmp/tiny.safetensors

Checks (each could fail):
- every checkpoint tensor is used and every parameter loaded (meta -> materialise -> load, the
  path the GPU peer takes), with the fp32 tensors kept fp32;
- experts are stacked gate rows first: gate_up_proj[e, :I] is mlp.experts.{e}.gate_proj;
- the step's decode of row S with a cache of S rows equals the last row of a cache-less
  recomputation of all S+1 rows (the cache and the composition agree);
- the draft is the argmax of lm_head(shared_head.norm(x1)), recomputed by hand from the pieces;
- swapping gate and up in the stacking changes the output (the mapping is observable);
- the timing helper returns one figure per timed step.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mtp_peer as mp  # noqa: E402


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    torch.manual_seed(0)
    p = dict(mp.PRESETS["tiny"])
    ckpt = mp.Checkpoint(sys.argv[1])
    fails = []

    def check(cond: bool, what: str):
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        if not cond:
            fails.append(what)

    with torch.device("meta") if hasattr(torch, "get_default_device") else _NullCtx():
        step = mp.standin_step(p)
    mp.materialise(step, "cpu")
    loaded = mp.load_weights(step, ckpt, p, "cpu")
    check(len(loaded) == len(ckpt.names()), f"every checkpoint tensor used ({len(loaded)} of {len(ckpt.names())})")
    check(step.moe.gate.e_score_correction_bias.dtype == torch.float32, "router bias kept fp32")
    check(step.attn.indexer.index_kpool_compress_ape.dtype == torch.float32, "pool ape kept fp32")
    check(step.eh_proj.dtype == torch.bfloat16, "eh_proj BF16")
    pre = mp.mtp_prefix(p)
    I = p["moe_inter"]
    e = p["n_experts"] - 1
    check(torch.equal(step.moe.experts.gate_up_proj[e, :I], ckpt.get(pre + f"mlp.experts.{e}.gate_proj.weight")),
          "gate_up_proj[e, :I] is gate_proj (gate rows first)")
    check(torch.equal(step.moe.experts.gate_up_proj[e, I:], ckpt.get(pre + f"mlp.experts.{e}.up_proj.weight")),
          "gate_up_proj[e, I:] is up_proj")

    S = 23
    tokens, hiddens = mp.step_inputs(p, S + 1, "cpu", 3)
    tokens, hiddens = tokens[:, 0], hiddens[:, 0]
    with torch.no_grad():
        cache: list = []
        step.context(tokens[:S], hiddens[:S], cache)
        draft, y = step(tokens[S:S + 1], hiddens[S:S + 1], cache)
        check(cache[0].shape[2] == S + 1, f"cache holds {S + 1} rows after the step")
        # Cache-less recomputation of all rows: the last row is the decode.
        fresh: list = []
        x0 = step.front(tokens, hiddens)
        mask = torch.ones(1, S + 1, dtype=torch.bool)
        r = x0 + step.attn(step.input_layernorm(x0), mask, fresh)
        x1 = r[:, -1:] + step.moe(step.post_attention_layernorm(r[:, -1:]))
        y_full = step.shared_head_norm(x1)[0]
        diff = (y.float() - y_full.float()).abs().max().item()
        check(diff <= 2 ** -6 * y_full.float().abs().max().item(), f"decode with cache = full recompute (max diff {diff:.3g})")
        logits = F.linear(y, step.lm_head).float()
        check(int(draft[0]) == int(torch.argmax(logits[0])), f"draft {int(draft[0])} is the argmax of the head")
        check(0 <= int(draft[0]) < p["vocab"], "draft inside the vocab")

        # The mapping is observable: swap gate and up of every expert, the output moves.
        gu = step.moe.experts.gate_up_proj
        swapped = torch.cat([gu[:, I:], gu[:, :I]], dim=1)
        v = step.post_attention_layernorm(r[:, -1:])
        before = step.moe(v).float()
        gu.data.copy_(swapped)
        after = step.moe(v).float()
        gu.data.copy_(torch.cat([gu[:, I:], gu[:, :I]], dim=1))
        check((before - after).abs().max().item() > 1e-2, "swapping gate and up changes the MoE output")

    timer = mp.StepTimer("cpu")
    us = []
    with torch.no_grad():
        for i in range(5):
            t, h = mp.step_inputs(p, 1, "cpu", 100 + i)
            us.append(timer.time_us(lambda: step(t[0], h[0], cache)))
    row = mp.summary_row("cpu-standin", us)
    check(row["reps"] == 5 and row["median_us"] > 0, f"timing: median {row['median_us']:.0f} us over 5 steps")
    print(f"{len(fails)} failed" if fails else "all passed")
    return 1 if fails else 0


class _NullCtx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


if __name__ == "__main__":
    sys.exit(main())
