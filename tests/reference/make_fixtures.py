#!/usr/bin/env python3
"""Reference fixtures for the MTP drafter, computed by Hugging Face transformers' `glm5_next`.

An independent check of mtplab's math (docs/model.md): the attention with its pooled lightning
indexer, the MoE and the RMSNorms are run by transformers' own modules; the MTP composition
around them (enorm / hnorm / eh_proj / plain residual / shared_head.norm / lm_head) is the few
lines docs/model.md writes, because transformers has no MTP layer (it drops `layers.45.*` on load).

Writes, under --out (default data/reference/tiny):
  weights.safetensors   every weight, under the GLM-5.3-Flash checkpoint names (docs/model.md)
  fixtures.safetensors  inputs, each piece's output, the indexer selection and scores, margins
  meta.json             config, seeds, versions, device, source line map, a description of
                        every tensor, and the status (or traceback) of every piece

Invariants:
- Every parameter and buffer is redrawn from a seeded CPU generator before anything runs (the
  constructors leave ape = 0, gate = 1, bias = 0, norms = 1: a wrong formula would pass on those).
- Floating tensors are stored in the dtype they were produced in: BF16 for activations and
  weights, F32 for router / indexer scores, margins and e_score_correction_bias. Integers are I32.
- A piece that fails is recorded with its traceback; the pieces that do not depend on it still
  run and everything computed is still written. Exit 0 = all pieces ran, 1 = some failed,
  2 = transformers' glm5_next could not be imported or configured (only meta.json then).

Run on a machine with torch + transformers (>= the version with glm5_next):
  python3 tests/reference/make_fixtures.py --out data/reference/tiny
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import platform
import struct
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

# ------------------------------------------------------------------------------------------------
# Presets (docs/model.md, "Sizes"). mtp_layer is the checkpoint index of the MTP layer (the trunk's
# num_hidden_layers); 45 for GLM-5.3-Flash, 2 for the tiny fixtures.
# ------------------------------------------------------------------------------------------------
PRESETS = {
    "tiny": dict(hidden=128, vocab=4096, n_heads=8, qk_nope=32, v_head=32, qk_rope=0, q_lora=64,
                 kv_lora=64, index_heads=4, index_dim=32, index_topk=16, index_kpool=4,
                 n_experts=8, top_k=2, n_shared=1, moe_inter=64, routed_scaling=2.5,
                 swiglu_limit=10.0, rms_eps=1e-5, mtp_layer=2, seq_len=40, chain=3),
    # Not for data/: about 400 MB of weights. Useful once to see the sparse regime at real K.
    "small": dict(hidden=1024, vocab=38912, n_heads=16, qk_nope=128, v_head=128, qk_rope=0,
                  q_lora=384, kv_lora=256, index_heads=8, index_dim=128, index_topk=512,
                  index_kpool=4, n_experts=64, top_k=4, n_shared=1, moe_inter=512,
                  routed_scaling=2.5, swiglu_limit=10.0, rms_eps=1e-5, mtp_layer=2, seq_len=600,
                  chain=3),
}

TOP_LOGITS = 8          # logits kept per row (full logits are recomputable from head.y + lm_head)
INDEX_NORM_EPS = 1e-6   # transformers' indexer LayerNorm eps (hard-coded there, checked below)

# Source claims that docs/reference-check.md relies on: (id, class or "" for the whole file,
# snippet). The run records the file and line of each in the INSTALLED transformers.
SOURCE_CHECKS = [
    ("rmsnorm_weight_after_cast", "Glm5NextTextRMSNorm", "return self.weight * hidden_states.to(input_dtype)"),
    ("indexer_k_norm_layernorm_eps", "Glm5NextTextIndexer", "LayerNorm(self.head_dim, eps=1e-6)"),
    ("indexer_softmax_scale", "Glm5NextTextIndexer", "self.softmax_scale = self.head_dim**-0.5"),
    ("indexer_q_from_q_resid", "Glm5NextTextIndexer", "q = self.wq_b(q_resid)"),
    ("indexer_gate_linear_bf16", "Glm5NextTextIndexer", "gate_scores = F.linear(hidden_states, self.index_kpool_compress_gate)"),
    ("indexer_pool_logits_fp32", "Glm5NextTextIndexer", "logits = grouped_gate_scores.float() + self.index_kpool_compress_ape.float()"),
    ("indexer_pool_probs_to_key_dtype", "Glm5NextTextIndexer", "probabilities = torch.nan_to_num(logits.softmax(dim=2)).to("),
    ("indexer_pool_key_sum", "Glm5NextTextIndexer", "pool_keys = (probabilities * grouped_keys).sum(dim=2)"),
    ("indexer_scores_fp32", "Glm5NextTextIndexer", "scores = torch.matmul(q.float(), pool_keys.transpose(-1, -2).float().unsqueeze(1))"),
    ("indexer_relu_after_scale", "Glm5NextTextIndexer", "scores = F.relu(scores * self.softmax_scale)"),
    ("indexer_weights_scale", "Glm5NextTextIndexer", "self.weights_proj(hidden_states.to(self.weights_proj.weight.dtype)).float() * (self.n_heads**-0.5)"),
    ("indexer_candidate_last_row_visible", "Glm5NextTextIndexer", "valid_candidates = pool_visible & pool_valid[:, None]"),
    ("indexer_select_k", "Glm5NextTextIndexer", "select_k = min(self.index_topk // self.index_kpool, index_scores.shape[-1])"),
    ("indexer_topk_unstable", "Glm5NextTextIndexer", "selected = index_scores.topk(select_k, dim=-1).indices"),
    ("indexer_tail_count", "Glm5NextTextIndexer", "tail_count = visible_count.remainder(self.index_kpool)"),
    ("indexer_output_width", "Glm5NextTextIndexer", "output_width += self.index_kpool - 1"),
    ("attn_q_resid", "Glm5NextTextAttention", "q_resid = self.q_a_layernorm(self.q_a_proj(hidden_states))"),
    ("attn_scaling", "Glm5NextTextAttention", "self.scaling = self.qk_head_dim ** (-0.5)"),
    ("attn_mask_from_topk_min", "Glm5NextTextAttention", "min_dtype = torch.finfo(query_states.dtype).min"),
    ("attn_uses_kpool_indexer", "Glm5NextTextAttention", "Glm5NextTextIndexer(config, layer_idx)"),
    ("eager_softmax_fp32_then_cast", "", "softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)"),
    ("router_logits_fp32", "Glm5NextTextTopkRouter", "F.linear(hidden_states.type(torch.float32), self.weight.type(torch.float32))"),
    ("router_weights_unbiased", "Glm5NextTextTopkRouter", "topk_weights = scores.gather(1, topk_indices)"),
    ("router_norm_eps", "Glm5NextTextTopkRouter", "denominator = topk_weights.sum(dim=-1, keepdim=True) + 1e-20"),
    ("router_topk_unsorted", "Glm5NextTextTopkRouter", "torch.topk(scores_for_choice, k=self.top_k, dim=-1, sorted=False)"),
    ("experts_gate_rows_first", "Glm5NextTextExperts", "gate, up = gate_up.chunk(2, dim=-1)"),
    ("experts_clamp_gate", "Glm5NextTextExperts", "gate = gate.clamp(min=None, max=self.swiglu_limit)"),
    ("experts_accumulate_bf16", "Glm5NextTextExperts", "final.index_add_(0, token_idx, current.to(final.dtype))"),
    ("shared_expert_clamp", "Glm5NextTextMLP", "up = up.clamp(min=-self.swiglu_limit, max=self.swiglu_limit)"),
    ("moe_shared_added", "Glm5NextTextMoE", "hidden_states = hidden_states + self.shared_experts(residuals)"),
    ("bias_kept_fp32", "", "_keep_in_fp32_modules_strict = [\"e_score_correction_bias\""),
    ("mtp_layer_dropped_on_load", "", "_keys_to_ignore_on_load_unexpected = [r\"layers\\.45\\.\""),
]


def log(msg: str = "") -> None:
    print(msg, flush=True)


class Recorder:
    """Collects output tensors with descriptions, and the status of every piece."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.desc: dict[str, str] = {}
        self.pieces: dict[str, dict] = {}

    def put(self, name: str, t: torch.Tensor, desc: str) -> None:
        # A private copy: no two stored tensors may share memory (safetensors refuses that).
        self.tensors[name] = t.detach().to("cpu").clone().contiguous()
        self.desc[name] = desc

    def run(self, name: str, fn, *needs: str):
        """Runs fn(); on failure records the traceback and returns None. Skipped when a piece
        it needs did not succeed."""
        missing = [n for n in needs if self.pieces.get(n, {}).get("status") != "ok"]
        if missing:
            self.pieces[name] = {"status": "skipped", "reason": f"needs {missing}"}
            log(f"[piece {name}] SKIPPED (needs {missing})")
            return None
        t0 = time.time()
        try:
            out = fn()
        except Exception as exc:  # noqa: BLE001 - every failure is reported, none is fatal
            tb = traceback.format_exc()
            self.pieces[name] = {"status": "error", "error": f"{type(exc).__name__}: {exc}",
                                 "traceback": tb}
            log(f"[piece {name}] ERROR {type(exc).__name__}: {exc}\n{tb}")
            return None
        self.pieces[name] = {"status": "ok", "seconds": round(time.time() - t0, 4)}
        return out

    def ok(self, name: str) -> bool:
        return self.pieces.get(name, {}).get("status") == "ok"


# ------------------------------------------------------------------------------------------------
# safetensors output (the library when present; a plain writer of the same format otherwise)
# ------------------------------------------------------------------------------------------------
_ST_DTYPE = {torch.bfloat16: "BF16", torch.float32: "F32", torch.int32: "I32", torch.int64: "I64",
             torch.float16: "F16", torch.uint8: "U8"}


def _raw_bytes(t: torch.Tensor) -> bytes:
    t = t.contiguous().cpu()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def save_safetensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> str:
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    try:
        from safetensors.torch import save_file
        save_file(tensors, str(path), metadata=metadata)
        return "safetensors"
    except ImportError:
        pass
    header: dict = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name]
        data = _raw_bytes(t)
        header[name] = {"dtype": _ST_DTYPE[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)
    return "builtin-writer"


def check_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Reads the file back (header + bytes) and compares every tensor bit for bit."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        base = 8 + n
        for name, t in tensors.items():
            h = header[name]
            if h["dtype"] != _ST_DTYPE[t.dtype] or h["shape"] != list(t.shape):
                raise RuntimeError(f"{path}: {name} header {h} does not match {t.dtype} {list(t.shape)}")
            a, b = h["data_offsets"]
            f.seek(base + a)
            if f.read(b - a) != _raw_bytes(t):
                raise RuntimeError(f"{path}: {name} bytes differ after the round trip")


# ------------------------------------------------------------------------------------------------
# transformers discovery
# ------------------------------------------------------------------------------------------------
def import_glm5_next():
    import transformers
    from transformers.models.glm5_next import modeling_glm5_next as M
    try:
        from transformers.models.glm5_next import configuration_glm5_next as C
    except ImportError:
        C = M
    return transformers, M, C


def source_map(M) -> dict:
    """File, sha256 and line numbers of the pieces used, plus the SOURCE_CHECKS results."""
    out: dict = {"file": None, "sha256": None, "classes": {}, "checks": {}}
    try:
        path = inspect.getsourcefile(M)
        out["file"] = path
        text = Path(path).read_text()
        out["sha256"] = hashlib.sha256(text.encode()).hexdigest()
    except Exception as exc:  # noqa: BLE001
        out["error"] = repr(exc)
        return out
    lines = text.splitlines()
    for name in sorted(dir(M)):
        obj = getattr(M, name)
        if inspect.isclass(obj) and name.startswith("Glm5NextText") and obj.__module__ == M.__name__:
            try:
                src, start = inspect.getsourcelines(obj)
                entry = {"line": start, "end": start + len(src) - 1, "bases": [b.__name__ for b in obj.__bases__]}
                methods = {}
                for mname, fn in inspect.getmembers(obj, inspect.isfunction):
                    if fn.__qualname__.startswith(name + "."):
                        try:
                            methods[mname] = inspect.getsourcelines(fn)[1]
                        except (OSError, TypeError):
                            pass
                entry["methods"] = methods
                out["classes"][name] = entry
            except (OSError, TypeError):
                pass
    for cid, cls, snippet in SOURCE_CHECKS:
        lo, hi = 1, len(lines)
        if cls and cls in out["classes"]:
            lo, hi = out["classes"][cls]["line"], out["classes"][cls]["end"]
        hits = [i + 1 for i in range(lo - 1, hi) if snippet in lines[i]]
        if not hits and cls:
            # The claim may live in a parent class or elsewhere in the file: say so.
            hits_any = [i + 1 for i, ln in enumerate(lines) if snippet in ln]
            out["checks"][cid] = {"found": bool(hits_any), "in_class": False, "lines": hits_any,
                                  "class": cls, "snippet": snippet}
        else:
            out["checks"][cid] = {"found": bool(hits), "in_class": bool(cls), "lines": hits,
                                  "class": cls, "snippet": snippet}
    return out


def make_config(M, C, p: dict, n_layers: int):
    """Glm5NextTextConfig for preset p; keys the installed version rejects are dropped and
    reported (a dropped key that matters shows up as a mismatch afterwards)."""
    cls = getattr(C, "Glm5NextTextConfig", None) or getattr(M, "Glm5NextTextConfig")
    kw = dict(
        vocab_size=p["vocab"], hidden_size=p["hidden"],
        # The shared expert falls back to intermediate_size in some versions: keep both equal.
        intermediate_size=p["moe_inter"] * p["n_shared"], moe_intermediate_size=p["moe_inter"],
        num_hidden_layers=n_layers, num_attention_heads=p["n_heads"], num_key_value_heads=p["n_heads"],
        q_lora_rank=p["q_lora"], kv_lora_rank=p["kv_lora"], qk_nope_head_dim=p["qk_nope"],
        qk_rope_head_dim=p["qk_rope"], v_head_dim=p["v_head"],
        n_routed_experts=p["n_experts"], num_experts_per_tok=p["top_k"], n_shared_experts=p["n_shared"],
        n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=p["routed_scaling"],
        swiglu_limit=p["swiglu_limit"], rms_norm_eps=p["rms_eps"], hidden_act="silu",
        index_n_heads=p["index_heads"], index_head_dim=p["index_dim"], index_topk=p["index_topk"],
        index_kpool=p["index_kpool"], index_kpool_always_select_tail=True,
        layer_types=["full_attention"] * n_layers, indexer_types=["full"] * n_layers,
        mlp_layer_types=["sparse"] * n_layers, attention_bias=False, attention_dropout=0.0,
        pad_token_id=0, bos_token_id=None, eos_token_id=None, tie_word_embeddings=False,
        max_position_embeddings=max(4096, 4 * p["seq_len"]),
    )
    dropped = []
    for _ in range(len(kw)):
        try:
            cfg = cls(**kw)
            break
        except (TypeError, ValueError) as exc:  # unknown keyword, or a strict-field rejection
            msg = str(exc)
            bad = next((k for k in kw if f"'{k}'" in msg or f"`{k}`" in msg), None)
            if bad is None:
                raise
            dropped.append(bad)
            kw.pop(bad)
    else:
        raise RuntimeError("could not construct Glm5NextTextConfig")
    for attr in ("_attn_implementation", "_experts_implementation"):
        try:
            setattr(cfg, attr, "eager")
        except Exception as exc:  # noqa: BLE001
            log(f"[config] could not set {attr}: {exc!r}")
    want = {k: v for k, v in kw.items() if k not in ("layer_types",)}
    mismatches = {k: [v, getattr(cfg, k, "<missing>")] for k, v in want.items()
                  if getattr(cfg, k, "<missing>") != v}
    return cfg, dropped, mismatches


# ------------------------------------------------------------------------------------------------
# Randomisation: every parameter and buffer, realistic scales, CPU generator (device-independent)
# ------------------------------------------------------------------------------------------------
def randomise(named: list[tuple[str, torch.Tensor]], gen: torch.Generator, clamp_boost: float) -> dict:
    """Redraws every tensor in place. Returns {name: rule} for meta.json."""
    rules = {}

    def normal(shape, std):
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    for name, t in named:
        shape = tuple(t.shape)
        leaf = name.rsplit(".", 1)[-1]
        if name == "embed_tokens":
            # Embedding-like scale: mean(x^2) ~ 4e-4, so enorm's eps (1e-5) moves the result by
            # ~1%: an eps in the wrong place is visible.
            val, rule = normal(shape, 0.02), "N(0, 0.02^2) (embedding scale: eps matters)"
        elif name.endswith("e_score_correction_bias"):
            val, rule = normal(shape, 0.1), "N(0, 0.1^2) router bias (fp32)"
        elif name.endswith("index_kpool_compress_ape"):
            val, rule = normal(shape, 0.5), "N(0, 0.5^2)"
        elif name.endswith("index_kpool_compress_gate"):
            val, rule = normal(shape, shape[-1] ** -0.5), "N(0, 1/fan_in)"
        elif name.endswith("k_norm.bias") or (leaf == "bias" and len(shape) == 1):
            val, rule = normal(shape, 0.1), "N(0, 0.1^2)"
        elif len(shape) == 1:
            # Norm weights: ~1 with noise, so a missing weight multiply shows up.
            val, rule = 1.0 + normal(shape, 0.1), "1 + N(0, 0.1^2)"
        elif name.endswith("experts.gate_up_proj") and len(shape) == 3:
            val = normal(shape, shape[-1] ** -0.5)
            # One row in 8 of every expert is boosted so that some pre-activations pass
            # swiglu_limit: without it the clamp is never exercised and a wrong clamp passes.
            boost = torch.rand(shape[0], shape[1], generator=gen) < 0.125
            val[boost] *= clamp_boost
            rule = f"N(0, 1/H), 1/8 of rows x{clamp_boost} (exercise the swiglu clamp)"
        elif name.endswith("experts.down_proj") and len(shape) == 3:
            val, rule = normal(shape, shape[-1] ** -0.5), "N(0, 1/fan_in)"
        elif len(shape) == 2:
            val = normal(shape, shape[-1] ** -0.5)
            rule = "N(0, 1/fan_in)"
            if "shared_experts" in name and (name.endswith("gate_proj.weight") or name.endswith("up_proj.weight")):
                boost = torch.rand(shape[0], generator=gen) < 0.125
                val[boost] *= clamp_boost
                rule += f", 1/8 of rows x{clamp_boost} (exercise the swiglu clamp)"
        else:
            val = normal(shape, max(shape[-1], 1) ** -0.5)
            rule = "N(0, 1/last_dim) (unrecognised parameter)"
            log(f"[randomise] WARNING: unrecognised parameter {name} {shape}: generic rule")
        with torch.no_grad():
            t.copy_(val.to(t.dtype))
        rules[name] = rule
    return rules


# ------------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------------
class DenseCausalIndexer(nn.Module):
    """Stand-in indexer selecting every row 0..p: the dense causal attention, to show which rows
    the sparse selection actually changes."""

    def forward(self, hidden_states, q_resid=None, attention_mask=None, past_key_values=None, **_):
        b, s = hidden_states.shape[:2]
        idx = torch.arange(s, device=hidden_states.device)
        sel = torch.where(idx[None, :] <= idx[:, None], idx[None, :], torch.full_like(idx[None, :], -1))
        return sel[None].expand(b, s, s).to(torch.int32)


def first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def build_modules(M, cfg, p: dict, device, dtype, rec_meta: dict, verbose: bool):
    L = p["mtp_layer"]
    H = p["hidden"]
    attn = M.Glm5NextTextAttention(cfg, L)
    ix = getattr(attn, "indexer", None)
    rec_meta["indexer_class_constructed"] = type(ix).__name__ if ix is not None else None
    kpool_cls = getattr(M, "Glm5NextTextIndexer", None)
    if ix is None:
        raise RuntimeError("Glm5NextTextAttention built no indexer (indexer_types not honoured?)")
    if kpool_cls is not None and type(ix) is not kpool_cls and isinstance(ix, kpool_cls):
        # A subclass (e.g. an IVF / k-means indexer) replaced the pooled one as the default:
        # the pooled selection is what docs/model.md specifies, so use the base class with the same
        # parameters.
        new = kpool_cls(cfg, L)
        new.load_state_dict(ix.state_dict())
        attn.indexer = new
        log(f"[build] attention constructed {type(ix).__name__}; replaced by {kpool_cls.__name__}")
    rec_meta["indexer_class_used"] = type(attn.indexer).__name__
    sig = list(inspect.signature(attn.indexer.forward).parameters)
    rec_meta["indexer_forward_signature"] = sig
    if "position_embeddings" in sig:
        log("[build] WARNING: the indexer takes position_embeddings: this is not the pooled "
            "(k-pool) indexer of GLM-5.3-Flash; selection pieces will likely fail")

    moe = M.Glm5NextTextMoE(cfg)
    norms = {n: M.Glm5NextTextRMSNorm(H, eps=p["rms_eps"]) for n in
             ("enorm", "hnorm", "input_layernorm", "post_attention_layernorm", "shared_head.norm")}
    front = nn.ParameterDict({
        "embed_tokens": nn.Parameter(torch.empty(p["vocab"], H)),
        "lm_head": nn.Parameter(torch.empty(p["vocab"], H)),
        "eh_proj": nn.Parameter(torch.empty(H, 2 * H)),
    })
    if verbose:
        log("=" * 100)
        log("MODULE TREE")
        log(f"attention ({type(attn).__module__}.{type(attn).__name__}):\n{attn}")
        log(f"moe ({type(moe).__module__}.{type(moe).__name__}):\n{moe}")
        log(f"norm: {norms['enorm']}")
        log(f"experts class: {type(moe.experts).__name__}, router class: {type(moe.gate).__name__}, "
            f"shared: {type(moe.shared_experts).__name__}")
        for attr in ("_attn_implementation", "_experts_implementation"):
            log(f"config.{attr} = {getattr(cfg, attr, '<missing>')!r}")
    return attn, moe, norms, front


def named_all(attn, moe, norms, front):
    named = []
    for prefix, mod in (("self_attn", attn), ("mlp", moe)):
        for n, t in mod.named_parameters():
            named.append((f"{prefix}.{n}", t.data))
        for n, t in mod.named_buffers():
            if t is not None and t.is_floating_point():
                named.append((f"{prefix}.{n}", t))
    for k, mod in norms.items():
        named.append((f"{k}.weight", mod.weight.data))
    for k, prm in front.items():
        named.append((k, prm.data))
    return named


def checkpoint_weights(attn, moe, norms, front, p: dict) -> tuple[dict, dict]:
    """The weights under the GLM-5.3-Flash checkpoint names (docs/model.md, "Checkpoint names")."""
    L, I = p["mtp_layer"], p["moe_inter"]
    pre = f"model.language_model.layers.{L}."
    w = {"model.language_model.embed_tokens.weight": front["embed_tokens"].data,
         "lm_head.weight": front["lm_head"].data,
         pre + "eh_proj.weight": front["eh_proj"].data}
    for k, mod in norms.items():
        w[pre + f"{k}.weight"] = mod.weight.data
    notes = {}
    for n, t in list(attn.state_dict().items()):
        w[pre + "self_attn." + n] = t
    for n, t in list(moe.state_dict().items()):
        if n == "experts.gate_up_proj":
            for e in range(t.shape[0]):
                w[pre + f"mlp.experts.{e}.gate_proj.weight"] = t[e, :I, :]   # gate rows first
                w[pre + f"mlp.experts.{e}.up_proj.weight"] = t[e, I:, :]
            notes["experts"] = "fused gate_up_proj [E, 2I, H] split: rows [0, I) gate, [I, 2I) up"
        elif n == "experts.down_proj":
            for e in range(t.shape[0]):
                w[pre + f"mlp.experts.{e}.down_proj.weight"] = t[e]
        else:
            w[pre + "mlp." + n] = t
    w = {k: v.detach().cpu().clone().contiguous() for k, v in w.items()}
    return w, notes


def canonical_selection(scores: torch.Tensor, cand: torch.Tensor, pool_rows: torch.Tensor,
                        K: int, P: int):
    """docs/model.md's rule from the scores: top min(K/P, #candidates) pools (ties: lower pool index),
    rows in ascending pool order, then the tail P*floor((p+1)/P) .. p; width K+P-1, -1 padded.
    Also the boundary margin (k-th minus (k+1)-th candidate score; +inf without a boundary)."""
    T, npools = scores.shape
    kk = K // P
    width = K + P - 1
    sel_rows = torch.full((T, width), -1, dtype=torch.int32)
    sel_pools = torch.full((T, kk), -1, dtype=torch.int32)
    margin = torch.full((T,), float("inf"), dtype=torch.float32)
    n_cand = torch.zeros(T, dtype=torch.int32)
    for p in range(T):
        c = [j for j in range(npools) if bool(cand[p, j])]
        n_cand[p] = len(c)
        order = sorted(c, key=lambda j: (-float(scores[p, j]), j))
        chosen = sorted(order[:kk])
        if len(order) > kk:
            margin[p] = float(scores[p, order[kk - 1]]) - float(scores[p, order[kk]])
        rows = [int(r) for j in chosen for r in pool_rows[j].tolist() if r >= 0]
        tail_start = P * ((p + 1) // P)
        rows += list(range(tail_start, p + 1))
        sel_rows[p, :len(rows)] = torch.tensor(rows, dtype=torch.int32)
        sel_pools[p, :len(chosen)] = torch.tensor(chosen, dtype=torch.int32)
    return sel_rows, sel_pools, margin, n_cand


def sorted_rows(raw: torch.Tensor) -> torch.Tensor:
    """A selection as a set: valid entries ascending, -1 padded (the module orders by score)."""
    out = torch.full_like(raw, -1)
    for p in range(raw.shape[0]):
        v = sorted(int(x) for x in raw[p].tolist() if x >= 0)
        out[p, :len(v)] = torch.tensor(v, dtype=raw.dtype)
    return out


def head_stats(logits: torch.Tensor):
    """Top logits (value desc, id asc on ties), argmax (lowest id), top-2 margin, max ties."""
    lf = logits.float().cpu()
    # A stable descending sort keeps equal values in index order: ties go to the lowest id.
    order = torch.sort(lf, dim=-1, descending=True, stable=True).indices[:, :TOP_LOGITS]
    top_vals = torch.gather(logits.cpu(), 1, order)
    argmax = order[:, 0].to(torch.int32)
    margin = (top_vals[:, 0].float() - top_vals[:, 1].float()).to(torch.float32)
    ties = (lf == lf.max(dim=-1, keepdim=True).values).sum(-1).to(torch.int32)
    return order.to(torch.int32), top_vals, argmax, margin, ties


def run_attempt(M, cfg, p: dict, seed: int, device, dtype, args, verbose: bool):
    rec = Recorder()
    meta: dict = {"seed": seed}
    T, H, P, K = p["seq_len"], p["hidden"], p["index_kpool"], p["index_topk"]
    wgen = torch.Generator().manual_seed(seed * 1000 + 1)
    dgen = torch.Generator().manual_seed(seed * 1000 + 2)

    built = rec.run("build", lambda: build_modules(M, cfg, p, device, dtype, meta, verbose))
    if built is None:
        return rec, meta, None
    attn, moe, norms, front = built

    def do_randomise():
        named = named_all(attn, moe, norms, front)
        rules = randomise(named, wgen, args.clamp_boost)
        for mod in (attn, moe, *norms.values(), front):
            mod.to(device=device, dtype=dtype)
        # The router bias stays fp32, as transformers keeps it (_keep_in_fp32_modules_strict)
        # and as the checkpoint stores it; .to(dtype) above rounded it, so restore the draw.
        bias_val = dict(named).get("mlp.gate.e_score_correction_bias")
        if bias_val is not None:
            moe.gate.e_score_correction_bias = bias_val.to(device=device, dtype=torch.float32)
        for mod in (attn, moe, *norms.values()):
            mod.eval()
        return rules

    rules = rec.run("randomise", do_randomise, "build")
    if rules is None:
        return rec, meta, None
    meta["randomisation"] = rules
    if verbose:
        log("=" * 100)
        log("PARAMETERS AND BUFFERS (after randomisation and the cast)")
        for n, t in named_all(attn, moe, norms, front):
            log(f"  {n:55s} {str(tuple(t.shape)):22s} {str(t.dtype):15s} "
                f"mean {t.float().mean().item():+.4f} std {t.float().std().item():.4f}")
        log("=" * 100)

    # ---- inputs --------------------------------------------------------------------------------
    n_rows = T
    tokens = torch.randint(0, p["vocab"], (T + 1,), generator=dgen)
    g = torch.randn(T, H, generator=dgen)
    final_norm_w = 1.0 + 0.1 * torch.randn(H, generator=dgen)
    hidden = (g / g.pow(2).mean(-1, keepdim=True).sqrt() * final_norm_w).to(dtype)
    rec.put("input.tokens", tokens.to(torch.int32),
            "[T+1] token ids; MTP row t pairs embed(tokens[t+1]) with hidden[t]")
    rec.put("input.hidden", hidden,
            "[T, H] BF16 target post-final-norm-like hidden rows: unit-RMS rows times a fixed 1+N(0,0.1^2) weight")
    tok_d = tokens.to(device)
    hid_d = hidden.to(device)
    mask = torch.ones(1, n_rows, dtype=torch.bool, device=device)

    st: dict = {}

    with torch.no_grad():
        # ---- MTP front -------------------------------------------------------------------------
        def front_piece():
            e_in = front["embed_tokens"][tok_d[1:T + 1]]
            e = norms["enorm"](e_in)
            h = norms["hnorm"](hid_d)
            x0 = F.linear(torch.cat([e, h], dim=-1), front["eh_proj"])
            st.update(e_in=e_in, e=e, h=h, x0=x0)
            rec.put("front.embed", e_in, "[T, H] BF16 embed_tokens[tokens[t+1]] (enorm input)")
            rec.put("front.e", e, "[T, H] BF16 enorm(embed) (transformers RMSNorm)")
            rec.put("front.h", h, "[T, H] BF16 hnorm(hidden) (transformers RMSNorm)")
            rec.put("front.x0", x0, "[T, H] BF16 eh_proj([e ; h]) (embedding first)")
        rec.run("front", front_piece)

        def input_norm_piece():
            st["u"] = norms["input_layernorm"](st["x0"])
            rec.put("block.u", st["u"], "[T, H] BF16 input_layernorm(x0): the attention input")
        rec.run("input_norm", input_norm_piece, "front")

        # ---- indexer, called directly ----------------------------------------------------------
        def indexer_piece():
            u = st["u"][None]
            q_resid = attn.q_a_layernorm(attn.q_a_proj(u))
            raw = attn.indexer(hidden_states=u, q_resid=q_resid, attention_mask=mask, past_key_values=None)
            raw = first(raw)[0].to(torch.int32).cpu()
            st.update(q_resid=q_resid, index_raw=raw)
            rec.put("indexer.topk_raw", raw,
                    "[T, K+P-1] I32 the module's output as is: selected pools' rows in score order, then "
                    "the tail, -1 padded")
            rec.put("indexer.selected_rows", sorted_rows(raw),
                    "[T, K+P-1] I32 the module's selection as a set: valid rows ascending, -1 padded")
        rec.run("indexer", indexer_piece, "input_norm")

        # ---- indexer scores, recomputed with the module's own helpers --------------------------
        def scores_piece():
            ix = attn.indexer
            u = st["u"][None]
            D = ix.head_dim
            q = ix.wq_b(st["q_resid"]).view(1, n_rows, -1, D)
            k = ix.k_norm(ix.wk(u)).view(1, n_rows, -1, D).squeeze(2)
            gate = F.linear(u, ix.index_kpool_compress_gate)
            packed = torch.cat([k, gate, mask.to(k.dtype)[..., None]], dim=-1)
            pool_keys, pool_idx, pool_valid = ix.get_pooled_states(packed_states=packed)
            sc = torch.matmul(q.float(), pool_keys.transpose(-1, -2).float().unsqueeze(1))
            sc = F.relu(sc * ix.softmax_scale)
            w = ix.weights_proj(u.to(ix.weights_proj.weight.dtype)).float() * (ix.n_heads ** -0.5)
            index_scores = torch.matmul(w.unsqueeze(-2), sc).squeeze(-2)[0]
            visible = ix.get_visible_tokens(valid_keys=packed[..., -1].bool(), q_length=n_rows,
                                            current_length=n_rows)
            pool_end = pool_idx[..., -1].clamp(0, n_rows - 1)
            cand = visible.gather(-1, pool_end[:, None, :].expand(1, n_rows, -1)) & pool_valid[:, None]
            cand = cand[0].cpu()
            scores_c = index_scores.cpu().masked_fill(~cand, float("-inf"))
            sel_rows, sel_pools, margin, n_cand = canonical_selection(scores_c, cand, pool_idx[0].cpu(), K, P)
            agree = (sel_rows == sorted_rows(st["index_raw"])).all(-1).to(torch.int32)
            st.update(index_margin=margin, index_agree=agree, n_cand=n_cand)
            rec.put("indexer.q", q[0].reshape(n_rows, -1), "[T, n_I*D] BF16 wq_b(c_q) (indexer queries)")
            rec.put("indexer.k_normed", k[0], "[T, D] BF16 LayerNorm(wk u) (eps 1e-6, weight and bias)")
            rec.put("indexer.gate", gate[0], "[T, D] BF16 index_kpool_compress_gate u (as transformers rounds it)")
            rec.put("indexer.weights", w[0], "[T, n_I] F32 weights_proj(u) / sqrt(n_I) (BF16 linear, then fp32)")
            rec.put("indexer.pool_keys", pool_keys[0], "[n_pools, D] BF16 pooled keys of the complete pools")
            rec.put("indexer.pool_rows", pool_idx[0].to(torch.int32), "[n_pools, P] I32 rows of each pool")
            rec.put("indexer.scores", scores_c,
                    "[T, n_pools] F32 index score I_j of every pool for query row t; -inf where pool j is not "
                    "a candidate (incomplete, or its last row > t)")
            rec.put("indexer.candidates", n_cand, "[T] I32 number of candidate pools for row t")
            rec.put("indexer.selected_rows_canonical", sel_rows,
                    "[T, K+P-1] I32 docs/model.md's selection from indexer.scores (ties: lower pool index): "
                    "rows ascending, -1 padded")
            rec.put("indexer.selected_pools_canonical", sel_pools,
                    "[T, K/P] I32 selected pool ids ascending, -1 padded")
            rec.put("indexer.boundary_margin", margin,
                    "[T] F32 k-th minus (k+1)-th best candidate score (+inf: every candidate kept); "
                    "a row whose margin is below the comparison's score error may legitimately differ")
            rec.put("indexer.module_agrees", agree,
                    "[T] I32 1 where the module's selection equals the canonical one as a set")
        rec.run("indexer_scores", scores_piece, "indexer")

        # ---- attention (full causal prefill through the pooled selection) ----------------------
        def attention_piece():
            u = st["u"][None]
            captured = []
            hook = attn.indexer.register_forward_hook(lambda _m, _i, o: captured.append(first(o)))
            try:
                out = first(attn(u, attention_mask=mask))[0]
            finally:
                hook.remove()
            st["attn"] = out
            c_kv = attn.kv_a_layernorm(attn.kv_a_proj_with_mqa(u)[..., :attn.kv_lora_rank])[0]
            rec.put("attn.c_q", attn.q_a_layernorm(attn.q_a_proj(u))[0], "[T, q_lora] BF16 q_a_layernorm(q_a_proj u)")
            rec.put("attn.c_kv", c_kv, "[T, kv_lora] BF16 kv_a_layernorm(kv_a_proj u): the cached latent rows")
            rec.put("attn.out", out, "[T, H] BF16 attention output (o_proj applied), row t over S(t)")
            if captured:
                inner = captured[0][0].to(torch.int32).cpu()
                same = bool(torch.equal(inner, st["index_raw"])) if "index_raw" in st else None
                meta["attention_indexer_matches_direct_call"] = same
                if same is False:
                    log("[attention] WARNING: the selection inside attention differs from the direct call")
        rec.run("attention", attention_piece, "input_norm")

        def dense_piece():
            saved = attn.indexer
            attn.indexer = DenseCausalIndexer()
            try:
                dense = first(attn(st["u"][None], attention_mask=mask))[0]
            finally:
                attn.indexer = saved
            diff = (dense.float() - st["attn"].float()).abs().amax(-1).cpu()
            st["sparse_rows"] = [int(r) for r in torch.nonzero(diff > 0).flatten().tolist()]
            rec.put("attn.out_dense", dense, "[T, H] BF16 the same attention over all rows 0..t (no sparsity)")
        rec.run("attention_dense", dense_piece, "attention")

        def residual1_piece():
            st["r"] = st["x0"] + st["attn"]
            st["v"] = norms["post_attention_layernorm"](st["r"])
            rec.put("block.r", st["r"], "[T, H] BF16 x0 + attn (plain residual, BF16 add)")
            rec.put("block.v", st["v"], "[T, H] BF16 post_attention_layernorm(r): the MoE input")
        rec.run("residual1", residual1_piece, "attention")

        # ---- MoE ------------------------------------------------------------------------------
        def router_piece():
            v = st["v"]
            res = moe.gate(v)
            if isinstance(res, (tuple, list)) and len(res) == 3:
                logits, weights, idx = res
            else:
                logits = first(res)
                idx, weights = moe.route_tokens_to_experts(logits)
            s = logits.float().sigmoid().cpu()
            sb = s + moe.gate.e_score_correction_bias.float().cpu()
            idx, weights = idx.cpu(), weights.float().cpu()
            order = torch.argsort(idx, dim=-1)  # sorted=False in the module: canonical = by id
            idx_c = torch.gather(idx, 1, order).to(torch.int32)
            w_c = torch.gather(weights, 1, order)
            srt = torch.sort(sb, dim=-1, descending=True).values
            kk = p["top_k"]
            margin = (srt[:, kk - 1] - srt[:, kk]) if sb.shape[1] > kk else torch.full((n_rows,), float("inf"))
            st["router_margin"] = margin
            rec.put("moe.router_logits", logits.float(), "[T, E] F32 W_g v in fp32")
            rec.put("moe.scores", s, "[T, E] F32 sigmoid(router logits)")
            rec.put("moe.topk_ids", idx_c, "[T, k] I32 selected experts, ascending id")
            rec.put("moe.topk_weights", w_c, "[T, k] F32 s[idx]/sum(s[idx]) * routed_scaling, same order")
            rec.put("moe.router_margin", margin.float(),
                    "[T] F32 k-th minus (k+1)-th biased score s' (a near-tie may route differently)")
        rec.run("router", router_piece, "residual1")

        def moe_piece():
            v = st["v"]
            captured = []
            hook = moe.gate.register_forward_hook(lambda _m, _i, o: captured.append(o))
            try:
                out = first(moe(v[None]))[0]
            finally:
                hook.remove()
            shared = moe.shared_experts(v)
            st["moe"] = out
            # How often the swiglu clamp bites, so the fixture provably exercises it.
            sh_g = moe.shared_experts.gate_proj(v).float()
            sh_u = moe.shared_experts.up_proj(v).float()
            Lm = p["swiglu_limit"]
            meta["shared_clamp_fraction"] = {"gate_above": float((sh_g > Lm).float().mean()),
                                             "up_outside": float((sh_u.abs() > Lm).float().mean())}
            gu = moe.experts.gate_up_proj if hasattr(moe.experts, "gate_up_proj") else None
            if gu is not None:
                pre = torch.einsum("th,eih->tei", v.float(), gu.float())
                I = p["moe_inter"]
                meta["routed_clamp_fraction_all_experts"] = {
                    "gate_above": float((pre[..., :I] > Lm).float().mean()),
                    "up_outside": float((pre[..., I:].abs() > Lm).float().mean())}
            rec.put("moe.shared_out", shared, "[T, H] BF16 the shared expert alone (with the swiglu clamp)")
            rec.put("moe.out", out, "[T, H] BF16 MoE(v) = routed (weighted) + shared")
        rec.run("moe", moe_piece, "residual1")

        # ---- head -------------------------------------------------------------------------------
        def head_piece():
            x1 = st["r"] + st["moe"]
            y = norms["shared_head.norm"](x1)
            logits = F.linear(y, front["lm_head"])
            ids, vals, argmax, margin, ties = head_stats(logits)
            st.update(x1=x1, y=y, head_margin=margin, argmax=argmax)
            rec.put("block.x1", x1, "[T, H] BF16 r + moe (plain residual, BF16 add)")
            rec.put("head.y", y, "[T, H] BF16 shared_head.norm(x1): what chaining recycles as the hidden")
            rec.put("head.top_ids", ids, f"[T, {TOP_LOGITS}] I32 token ids of the largest BF16 logits (value desc, id asc)")
            rec.put("head.top_logits", vals, f"[T, {TOP_LOGITS}] BF16 those logits")
            rec.put("head.argmax", argmax, "[T] I32 the draft token of row t (lowest id among equal maxima)")
            rec.put("head.margin", margin, "[T] F32 top-1 minus top-2 BF16 logit (0: a tie)")
            rec.put("head.max_ties", ties, "[T] I32 how many tokens share the max logit")
        rec.run("head", head_piece, "moe")

        # ---- chaining: k drafts after the last context row ----------------------------------------
        def chain_piece():
            # Draft i+1 is row T-1+i = (embed(draft_i), y of the previous row) at position T-1+i;
            # computed as a full prefill of the extended rows (causal: earlier rows unchanged).
            e_rows, h_rows = [st["e_in"]], [hid_d]
            drafts, y_prev, d = [], st["y"][-1:], int(st["argmax"][-1])
            for _ in range(p["chain"]):
                drafts.append(d)
                e_rows.append(front["embed_tokens"][torch.tensor([d], device=device)])
                h_rows.append(y_prev)
                e_in = torch.cat(e_rows)
                hh = torch.cat(h_rows)
                x0 = F.linear(torch.cat([norms["enorm"](e_in), norms["hnorm"](hh)], -1), front["eh_proj"])
                u = norms["input_layernorm"](x0)
                m = torch.ones(1, x0.shape[0], dtype=torch.bool, device=device)
                r = x0 + first(attn(u[None], attention_mask=m))[0]
                x1 = r + first(moe(norms["post_attention_layernorm"](r)[None]))[0]
                y = norms["shared_head.norm"](x1)
                y_prev = y[-1:]
                logits = F.linear(y_prev, front["lm_head"])
                ids, vals, argmax, margin, _ = head_stats(logits)
                d = int(argmax[0])
                st.setdefault("chain_rows", []).append((ids[0], vals[0], argmax[0], margin[0], y_prev[0]))
            rows = st["chain_rows"]
            rec.put("chain.input_tokens", torch.tensor(drafts, dtype=torch.int32),
                    f"[{p['chain']}] I32 chained row T+i embeds input_tokens[i] and recycles the y of row "
                    "T+i-1; input_tokens[0] = head.argmax[T-1]")
            rec.put("chain.argmax", torch.stack([r[2] for r in rows]).to(torch.int32),
                    f"[{p['chain']}] I32 the draft produced by chained row T+i (= input_tokens[i+1])")
            rec.put("chain.top_ids", torch.stack([r[0] for r in rows]), f"[{p['chain']}, {TOP_LOGITS}] I32")
            rec.put("chain.top_logits", torch.stack([r[1] for r in rows]), f"[{p['chain']}, {TOP_LOGITS}] BF16")
            rec.put("chain.margin", torch.stack([r[3] for r in rows]).float(), f"[{p['chain']}] F32 top-2 margin")
            rec.put("chain.y", torch.stack([r[4] for r in rows]), f"[{p['chain']}, H] BF16 y of each chained row")
        if p.get("chain", 0) > 0:
            rec.run("chain", chain_piece, "head")

    return rec, meta, (attn, moe, norms, front, st)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("data/reference/tiny"))
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--seq-len", type=int, default=None, help="rows T (default: the preset's)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--max-attempts", type=int, default=48,
                    help="seeds seed, seed+1, ... are tried until the indexer and router margins clear "
                         "--min-index-margin and --min-router-margin (the best one is kept otherwise)")
    ap.add_argument("--min-index-margin", type=float, default=0.01,
                    help="indexer scores are O(0.5); the BF16 rounding differences between "
                         "implementations move them by ~0.003")
    ap.add_argument("--min-router-margin", type=float, default=0.002,
                    help="biased router scores s' are in (0, 1) plus the bias")
    ap.add_argument("--clamp-boost", type=float, default=6.0)
    args = ap.parse_args()

    p = dict(PRESETS[args.preset])
    if args.seq_len is not None:
        p["seq_len"] = args.seq_len
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    dtype = torch.bfloat16
    # fp32 matmuls (router, indexer scores) stay true fp32; BF16 GEMMs keep fp32 reductions.
    for flag in ("allow_tf32", "allow_bf16_reduced_precision_reduction"):
        try:
            setattr(torch.backends.cuda.matmul, flag, False)
        except (AttributeError, AssertionError):  # older torch: the flag does not exist
            pass
    torch.set_float32_matmul_precision("highest")

    out_dir = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    meta: dict = {
        "what": "mtplab reference fixtures from transformers glm5_next (docs/reference-check.md)",
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "created_unix": int(time.time()),
        "preset": args.preset, "config": p, "dtype": "bfloat16",
        "seed_base": args.seed,
        "seed_derivation": "weights: torch.Generator(cpu).manual_seed(seed*1000+1); "
                           "inputs: manual_seed(seed*1000+2)",
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
        "matmul": {"allow_tf32": False, "allow_bf16_reduced_precision_reduction": False},
        "storage": "floating tensors in the dtype produced (BF16 activations and weights; F32 scores, "
                   "margins, router weights and e_score_correction_bias); integers I32",
    }
    log(f"mtplab reference fixtures: preset {args.preset}, device {device} ({meta['device_name']}), "
        f"torch {torch.__version__}, python {platform.python_version()}")

    try:
        transformers, M, C = import_glm5_next()
    except Exception as exc:  # noqa: BLE001
        meta["fatal"] = f"cannot import transformers glm5_next: {exc!r}"
        meta["traceback"] = traceback.format_exc()
        try:
            import transformers as tf_mod
            meta["versions"]["transformers"] = tf_mod.__version__
            models = Path(tf_mod.__file__).parent / "models"
            meta["glm_models_present"] = sorted(d.name for d in models.iterdir() if "glm" in d.name)
        except Exception:  # noqa: BLE001
            pass
        (out_dir / "meta.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
        log(meta["fatal"])
        log(meta["traceback"])
        return 2
    meta["versions"]["transformers"] = transformers.__version__
    try:
        import safetensors
        meta["versions"]["safetensors"] = safetensors.__version__
    except ImportError:
        meta["versions"]["safetensors"] = None
    log(f"transformers {transformers.__version__} from {Path(transformers.__file__).parent}")

    src = source_map(M)
    meta["source"] = src
    log("=" * 100)
    log(f"SOURCE {src.get('file')} sha256 {src.get('sha256')}")
    for name, e in src["classes"].items():
        log(f"  {name:38s} line {e['line']:5d}-{e['end']:5d} bases {e['bases']}")
    for cid, c in src["checks"].items():
        where = f"lines {c['lines']}" if c["found"] else "NOT FOUND"
        note = "" if c["in_class"] or not c["class"] else f" (outside {c['class']})"
        log(f"  check {cid:38s} {where}{note}")

    n_layers = p["mtp_layer"] + 1  # so that layer_idx = mtp_layer is valid in the per-layer lists
    try:
        cfg, dropped, mismatches = make_config(M, C, p, n_layers)
    except Exception as exc:  # noqa: BLE001
        meta["fatal"] = f"cannot build Glm5NextTextConfig: {exc!r}"
        meta["traceback"] = traceback.format_exc()
        (out_dir / "meta.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
        log(meta["fatal"])
        log(meta["traceback"])
        return 2
    meta["config_dropped_keys"] = dropped
    meta["config_mismatches"] = {k: [str(a), str(b)] for k, (a, b) in mismatches.items()}
    try:
        meta["transformers_config"] = json.loads(cfg.to_json_string())
    except Exception:  # noqa: BLE001
        meta["transformers_config"] = {k: str(v) for k, v in vars(cfg).items()}
    if dropped:
        log(f"[config] keys the installed config rejected: {dropped}")
    if mismatches:
        log(f"[config] WARNING values differ from the preset: {meta['config_mismatches']}")

    # Seeds seed, seed+1, ... until no comparison sits on a knife edge: every sparse row's indexer
    # boundary margin and every row's router margin clear their thresholds. Exact ties and
    # near-ties are legal but make the reference's choice arbitrary (torch.topk does not promise
    # an order among equals); tie-breaking is tested with constructed ties on the C++ side.
    best = None
    attempts = []
    for attempt in range(max(1, args.max_attempts)):
        seed = args.seed + attempt
        rec, ameta, state = run_attempt(M, cfg, p, seed, device, dtype, args, verbose=(attempt == 0))
        st = state[4] if state else {}
        margin = st.get("index_margin")
        sparse = [float(m) for m in margin.tolist() if math.isfinite(m)] if margin is not None else []
        min_index = min(sparse) if sparse else None
        rmargin = st.get("router_margin")
        min_router = float(rmargin.min()) if rmargin is not None else None
        attempts.append({"seed": seed, "min_index_margin": min_index, "min_router_margin": min_router,
                         "pieces": {k: v["status"] for k, v in rec.pieces.items()}})
        log(f"[attempt {attempt}] seed {seed}: min indexer boundary margin {min_index} over "
            f"{len(sparse)} sparse rows, min router margin {min_router}")
        ratios = []
        if min_index is not None:
            ratios.append(min_index / args.min_index_margin)
        if min_router is not None:
            ratios.append(min_router / args.min_router_margin)
        score = min(ratios) if ratios else float("-inf")
        if best is None or score > best[0]:
            best = (score, rec, ameta, state, seed)
        if not ratios or score >= 1.0:
            break  # good enough, or nothing to search on (a piece failed): keep this one
    score, rec, ameta, state, seed = best
    meta["attempts"] = attempts
    meta["seed_used"] = seed
    meta["margin_thresholds"] = {"index": args.min_index_margin, "router": args.min_router_margin,
                                 "met": best[0] >= 1.0}
    meta.update(ameta)
    meta["pieces"] = rec.pieces

    # ---- write ----------------------------------------------------------------------------------
    written = {}
    if state is not None and rec.ok("randomise"):
        attn, moe, norms, front, st = state
        weights, notes = checkpoint_weights(attn, moe, norms, front, p)
        meta["weights"] = {k: {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")}
                           for k, v in sorted(weights.items())}
        meta["weights_notes"] = notes
        meta["mtp_layer"] = p["mtp_layer"]
        wmeta = {"format": "pt", "mtplab": "reference weights", "preset": args.preset,
                 "mtp_layer": str(p["mtp_layer"]), "seed": str(seed)}
        written["weights.safetensors"] = save_safetensors(weights, out_dir / "weights.safetensors", wmeta)
        check_safetensors(out_dir / "weights.safetensors", weights)
    if rec.tensors:
        fmeta = {"format": "pt", "mtplab": "reference fixtures", "preset": args.preset, "seed": str(seed)}
        written["fixtures.safetensors"] = save_safetensors(rec.tensors, out_dir / "fixtures.safetensors", fmeta)
        check_safetensors(out_dir / "fixtures.safetensors", rec.tensors)
    meta["written_with"] = written
    meta["tensors"] = {k: {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                           "description": rec.desc[k]} for k, t in sorted(rec.tensors.items())}

    # ---- summary --------------------------------------------------------------------------------
    summary: dict = {}
    st = state[4] if state else {}
    if "index_margin" in st:
        m = st["index_margin"]
        fin = torch.isfinite(m)
        summary["indexer_sparse_rows"] = int(fin.sum())
        summary["indexer_min_boundary_margin"] = float(m[fin].min()) if fin.any() else None
        summary["indexer_exact_boundary_ties"] = int((m == 0).sum())
        summary["indexer_module_agrees_rows"] = int(st["index_agree"].sum())
        summary["indexer_module_disagrees_at"] = [int(i) for i in torch.nonzero(st["index_agree"] == 0).flatten()]
    if "sparse_rows" in st:
        summary["attention_rows_differing_from_dense"] = st["sparse_rows"]
    if "router_margin" in st:
        summary["router_min_margin"] = float(st["router_margin"].min())
    if "head_margin" in st:
        hm = st["head_margin"]
        summary["head_min_margin"] = float(hm.min())
        summary["head_rows_with_margin_below_0.0625"] = int((hm < 0.0625).sum())
        summary["drafts"] = [int(x) for x in st["argmax"].tolist()]
    for k in ("shared_clamp_fraction", "routed_clamp_fraction_all_experts"):
        if k in meta:
            summary[k] = meta[k]
    summary["pieces_failed"] = [k for k, v in rec.pieces.items() if v["status"] != "ok"]
    total = sum(f.stat().st_size for f in out_dir.iterdir() if f.is_file())
    summary["bytes_written"] = total
    meta["summary"] = summary
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
    total = sum(f.stat().st_size for f in out_dir.iterdir() if f.is_file())

    log("=" * 100)
    log("SUMMARY")
    for k, v in summary.items():
        log(f"  {k}: {v}")
    for k, v in rec.pieces.items():
        log(f"  piece {k:16s} {v['status']}" + (f"  {v.get('error', v.get('reason', ''))}" if v["status"] != "ok" else ""))
    log(f"  wrote {out_dir}: {sorted(f.name for f in out_dir.iterdir())}, {total / 1e6:.2f} MB")
    if total > 3.2e6 and args.preset == "tiny":
        log("  WARNING: more than ~3 MB: data/reference/ is meant to stay small")
    return 0 if not summary["pieces_failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
