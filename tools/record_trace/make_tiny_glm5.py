#!/usr/bin/env python3
"""Builds a tiny random glm5_next checkpoint with transformers, for tools/record_trace/selftest.sh.

The trunk is transformers' own model class (whichever the installed version has:
Glm5NextForCausalLM, else Glm5NextForConditionalGeneration with a one-block vision tower), at the
tiny preset's sizes with 3 layers, saved with save_pretrained (config.json, sharded safetensors
with model.safetensors.index.json) beside a tokenizer (data/trained-tiny/tokenizer.json, with a
small chat template).

transformers has no MTP layer (it drops the MTP layer's tensors on load), so the MTP layer's
tensors are added with random values under the names the config implies: the trunk's tensor
prefix (read back from the saved files) + "layers.<num_hidden_layers>." + the names of
docs/model.md ("Checkpoint names"), in their own file, listed in the index like the trunk's.

  python3 tools/record_trace/make_tiny_glm5.py --out /tmp/glm5-tiny
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

TEXT = dict(vocab_size=4096, hidden_size=128, intermediate_size=64, moe_intermediate_size=64,
            num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=8, q_lora_rank=64, kv_lora_rank=64,
            qk_nope_head_dim=32, qk_rope_head_dim=0, v_head_dim=32, n_routed_experts=8, num_experts_per_tok=2,
            n_shared_experts=1, n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5,
            swiglu_limit=10.0, rms_norm_eps=1e-5, hidden_act="silu", index_n_heads=4, index_head_dim=32,
            index_topk=16, index_kpool=4, index_kpool_always_select_tail=True,
            layer_types=["full_attention"] * 3, indexer_types=["full"] * 3, mlp_layer_types=["sparse"] * 3,
            attention_bias=False, attention_dropout=0.0, pad_token_id=0, bos_token_id=None, eos_token_id=0,
            tie_word_embeddings=False, max_position_embeddings=4096)
VISION = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=128,
              projection_intermediate_size=64, patch_size=14, image_size=28, spatial_merge_size=2,
              temporal_patch_size=2)
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|> {% endif %}")


def log(msg):
    print(f"[make_tiny_glm5] {msg}", flush=True)


def construct(cls, kw: dict, what: str):
    """cls(**kw), dropping (and reporting) keywords the installed version rejects."""
    kw = dict(kw)
    for _ in range(len(kw) + 1):
        try:
            return cls(**kw)
        except (TypeError, ValueError) as exc:
            msg = str(exc)
            bad = next((k for k in kw if f"'{k}'" in msg or f"`{k}`" in msg), None)
            if bad is None:
                raise
            log(f"{what}: dropped {bad} ({msg.splitlines()[0][:160]})")
            kw.pop(bad)
    raise RuntimeError(f"could not construct {what}")


def mtp_tensors(prefix: str, c: dict, gen) -> dict:
    """The MTP layer's tensors (docs/model.md, "Checkpoint names") with random values: projections
    N(0, 1/fan_in), norm weights 1 + N(0, 0.1^2), the pool positions' ape N(0, 0.5^2), the router
    bias N(0, 0.05^2) in fp32 (as releases store it)."""
    H, V = c["hidden_size"], c["vocab_size"]
    nh, dn, dv = c["num_attention_heads"], c["qk_nope_head_dim"], c["v_head_dim"]
    ql, kl = c["q_lora_rank"], c["kv_lora_rank"]
    nI, D, P = c["index_n_heads"], c["index_head_dim"], c["index_kpool"]
    E, I, S = c["n_routed_experts"], c["moe_intermediate_size"], c["n_shared_experts"] * c["moe_intermediate_size"]

    def proj(rows, cols):
        return (torch.randn(rows, cols, generator=gen) / math.sqrt(cols)).to(torch.bfloat16)

    def norm(n):
        return (1 + 0.1 * torch.randn(n, generator=gen)).to(torch.bfloat16)

    t = {
        "enorm.weight": norm(H), "hnorm.weight": norm(H), "eh_proj.weight": proj(H, 2 * H),
        "shared_head.norm.weight": norm(H), "input_layernorm.weight": norm(H),
        "post_attention_layernorm.weight": norm(H),
        "self_attn.q_a_proj.weight": proj(ql, H), "self_attn.q_a_layernorm.weight": norm(ql),
        "self_attn.q_b_proj.weight": proj(nh * dn, ql), "self_attn.kv_a_proj_with_mqa.weight": proj(kl, H),
        "self_attn.kv_a_layernorm.weight": norm(kl), "self_attn.kv_b_proj.weight": proj(nh * (dn + dv), kl),
        "self_attn.o_proj.weight": proj(H, nh * dv),
        "self_attn.indexer.wq_b.weight": proj(nI * D, ql), "self_attn.indexer.wk.weight": proj(D, H),
        "self_attn.indexer.k_norm.weight": norm(D),
        "self_attn.indexer.k_norm.bias": (0.1 * torch.randn(D, generator=gen)).to(torch.bfloat16),
        "self_attn.indexer.weights_proj.weight": proj(nI, H),
        "self_attn.indexer.index_kpool_compress_gate": proj(D, H),
        "self_attn.indexer.index_kpool_compress_ape": 0.5 * torch.randn(P, D, generator=gen),
        "mlp.gate.weight": proj(E, H),
        "mlp.gate.e_score_correction_bias": 0.05 * torch.randn(E, generator=gen),
        "mlp.shared_experts.gate_proj.weight": proj(S, H), "mlp.shared_experts.up_proj.weight": proj(S, H),
        "mlp.shared_experts.down_proj.weight": proj(H, S),
    }
    for e in range(E):
        t[f"mlp.experts.{e}.gate_proj.weight"] = proj(I, H)
        t[f"mlp.experts.{e}.up_proj.weight"] = proj(I, H)
        t[f"mlp.experts.{e}.down_proj.weight"] = proj(H, I)
    assert V > 0
    return {prefix + k: v.contiguous() for k, v in t.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--tokenizer-json", default=str(ROOT / "data/trained-tiny/tokenizer.json"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import transformers
    from safetensors.torch import load_file, save_file

    names = sorted(n for n in dir(transformers) if n.startswith("Glm5Next"))
    log(f"transformers {transformers.__version__}, torch {torch.__version__}; Glm5Next* names: {names}")
    torch.manual_seed(args.seed)
    if hasattr(transformers, "Glm5NextForCausalLM"):
        cls = transformers.Glm5NextForCausalLM
        cfg_cls = getattr(cls, "config_class", None) or transformers.Glm5NextTextConfig
        config = construct(cfg_cls, TEXT, cfg_cls.__name__)
    else:
        cls = transformers.Glm5NextForConditionalGeneration
        text = construct(transformers.Glm5NextTextConfig, TEXT, "Glm5NextTextConfig")
        vision_cls = getattr(transformers, "Glm5NextVisionConfig", None)
        if vision_cls is None:  # older releases: the vision tower's config is glm_ocr_vision
            vision_cls = transformers.CONFIG_MAPPING.get("glm_ocr_vision") if hasattr(
                transformers, "CONFIG_MAPPING") else None
        vision = construct(vision_cls, VISION, vision_cls.__name__) if vision_cls else None
        log(f"vision config: {type(vision).__name__ if vision is not None else 'the default (large)'}")
        top = dict(text_config=text, vision_config=vision, tie_word_embeddings=False,
                   image_token_id=4090, video_token_id=4091, image_start_token_id=4092, image_end_token_id=4093,
                   video_start_token_id=4094, video_end_token_id=4095)
        config = construct(transformers.Glm5NextConfig, top, "Glm5NextConfig")
    log(f"model class {cls.__name__}, config {type(config).__name__} (model_type {config.model_type})")
    model = cls(config)
    # A peaked head (logit std ~3, as mtplab's synthetic weights) so greedy and sampled continuations
    # are not uniform noise; everything else as transformers initialises it.
    gen = torch.Generator().manual_seed(args.seed)
    H = TEXT["hidden_size"]
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head.copy_(torch.randn(head.shape, generator=gen) * (3 / math.sqrt(H)))
        emb = model.get_input_embeddings().weight
        emb.copy_(torch.randn(emb.shape, generator=gen))
    model = model.to(torch.bfloat16)
    model.generation_config.eos_token_id = 0
    model.save_pretrained(out, max_shard_size="2MB")

    tok_cls = getattr(transformers, "PreTrainedTokenizerFast", None) or getattr(transformers, "TokenizersBackend")
    tok = tok_cls(tokenizer_file=args.tokenizer_json, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)

    index_path = out / "model.safetensors.index.json"
    files = sorted(p.name for p in out.glob("*.safetensors"))
    saved = {}
    for f in files:
        saved.update({k: tuple(v.shape) for k, v in load_file(str(out / f)).items()})
    log(f"saved {len(saved)} tensors in {files}; index: {index_path.exists()}")
    trunk = [k for k in saved if ".layers.0." in k or k.startswith("layers.0.")]
    for k in sorted(saved)[:12]:
        log(f"  {k} {saved[k]}")
    embed = next((k for k in saved if k.endswith("embed_tokens.weight")), None)
    if embed is None or not trunk:
        sys.exit(f"make_tiny_glm5: cannot find the trunk's embed_tokens / layers.0 in {sorted(saved)[:20]}")
    prefix = embed[: -len("embed_tokens.weight")]
    mtp_prefix = f"{prefix}layers.{TEXT['num_hidden_layers']}."
    log(f"trunk prefix {prefix!r} (from {embed}); MTP layer prefix {mtp_prefix!r}; lm_head.weight in the "
        f"checkpoint: {'lm_head.weight' in saved}")
    mtp = mtp_tensors(mtp_prefix, TEXT, gen)
    save_file(mtp, str(out / "model-mtp.safetensors"), metadata={"format": "pt"})
    if index_path.exists():
        index = json.loads(index_path.read_text())
        index["weight_map"].update({k: "model-mtp.safetensors" for k in mtp})
        index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    log(f"added {len(mtp)} MTP tensors under {mtp_prefix} in model-mtp.safetensors")

    # transformers reads the checkpoint back (the MTP tensors are unexpected keys to it).
    status = 0
    try:
        again = cls.from_pretrained(out, dtype=torch.bfloat16)
        diff = max((a.float() - b.float()).abs().max().item()
                   for a, b in zip(model.state_dict().values(), again.state_dict().values()))
        log(f"from_pretrained reads it back: max |difference| over the trunk's tensors {diff}")
        status = 0 if diff == 0 else 4
    except Exception as exc:  # noqa: BLE001 - reported, and the exit status says so
        import traceback
        traceback.print_exc()
        log(f"from_pretrained could not read the checkpoint back: {exc!r}")
        status = 3
    json.dump({"class": cls.__name__, "trunk_prefix": prefix, "mtp_prefix": mtp_prefix, "tensors": len(saved),
               "mtp_tensors": len(mtp), "files": files}, open(out / "make_tiny_glm5.json", "w"), indent=1)
    sys.exit(status)


if __name__ == "__main__":
    main()
