"""A GLM-5.3-Flash-shaped model at the tiny preset, in plain PyTorch, following docs/model.md.

What this file holds: the sizes (read from configs/tiny.yaml), the parameters under their
checkpoint names, and one set of functions for a DSA-attention + routed-MoE block that serves
three uses:
  - training (fp32, differentiable, `Numerics(bf16=False)`),
  - greedy decoding of the target for the trace, and
  - the MTP acceptance oracle (mtp_replay.py),
the last two with `Numerics(bf16=True)`: fp32 arithmetic with a round to BF16 (nearest even) at
exactly the points lib/ops/ops.hpp names, so that mtplab's C++ CPU drafter computes the same
function up to summation order.

Invariants that matter:
- Rows are positions: row r of a block's cache is position r. Attention of a query at position p
  reads only the rows of its selection S(p) (docs/model.md, "The pooled indexer"): the top
  min(K/P, #candidates) complete pools by indexer score (ties: lower pool index), plus the
  query's incomplete tail. For p <= K + P - 2 this is dense causal attention.
- The selection is not differentiable; gradient flows through the selected rows' attention.
- MTP front: x0 = eh_proj [enorm(E[token]) ; hnorm(hidden)], embedding FIRST; hidden is the
  target's post-final-norm hidden (or, when chaining, the MTP's own post-shared_head.norm y).
- Shared expert clamped like the routed ones (docs/reference-check.md, point 20).
- Attention uses the absorbed form (q_abs = W_k^T q, scores against the latent rows, W_v after
  the weighted sum), as mtplab's ops do; in fp32 it is the same function as the plain form.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F


# ---- configuration ------------------------------------------------------------------------------

@dataclass
class TinyConfig:
    hidden: int
    vocab: int
    rms_norm_eps: float
    n_heads: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int
    kv_lora_rank: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    index_kpool: int
    index_norm_eps: float
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    moe_intermediate_size: int
    n_group: int
    topk_group: int
    routed_scaling_factor: float
    swiglu_limit: float
    embed_tokens: str
    lm_head: str
    mtp_prefix: str

    @property
    def shared_inter(self) -> int:
        return self.n_shared_experts * self.moe_intermediate_size


def parse_preset(text: str, source: str) -> TinyConfig:
    """Reads the flat keys and the one-level `checkpoint:` mapping of a preset such as
    configs/tiny.yaml (no YAML library is assumed to exist where this runs)."""
    values: dict[str, str] = {}
    section = ""
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        m = re.match(r"^(\s*)([A-Za-z_][A-Za-z0-9_.]*):\s*(.*)$", line)
        if not m:
            raise ValueError(f"{source}:{lineno}: cannot read '{raw}'")
        indent, key, value = m.groups()
        if not indent:
            section = key if value == "" else ""
            if value != "":
                values[key] = value
        elif section:
            values[f"{section}.{key}"] = value
        else:
            raise ValueError(f"{source}:{lineno}: indented key '{key}' outside a mapping")
    if int(values.get("qk_rope_head_dim", "0")) != 0:
        raise ValueError(f"{source}: qk_rope_head_dim must be 0 (GLM-5.3-Flash has no RoPE)")
    try:
        cfg = TinyConfig(
            hidden=int(values["hidden"]), vocab=int(values["vocab"]),
            rms_norm_eps=float(values["rms_norm_eps"]), n_heads=int(values["n_heads"]),
            qk_nope_head_dim=int(values["qk_nope_head_dim"]), v_head_dim=int(values["v_head_dim"]),
            q_lora_rank=int(values["q_lora_rank"]), kv_lora_rank=int(values["kv_lora_rank"]),
            index_n_heads=int(values["index_n_heads"]), index_head_dim=int(values["index_head_dim"]),
            index_topk=int(values["index_topk"]), index_kpool=int(values["index_kpool"]),
            index_norm_eps=float(values.get("index_norm_eps", "1e-6")),
            n_routed_experts=int(values["n_routed_experts"]),
            num_experts_per_tok=int(values["num_experts_per_tok"]),
            n_shared_experts=int(values["n_shared_experts"]),
            moe_intermediate_size=int(values["moe_intermediate_size"]),
            n_group=int(values.get("n_group", "1")), topk_group=int(values.get("topk_group", "1")),
            routed_scaling_factor=float(values["routed_scaling_factor"]),
            swiglu_limit=float(values["swiglu_limit"]),
            embed_tokens=values.get("checkpoint.embed_tokens", "model.language_model.embed_tokens.weight"),
            lm_head=values.get("checkpoint.lm_head", "lm_head.weight"),
            mtp_prefix=values.get("checkpoint.mtp_prefix", "model.language_model.layers.45."),
        )
    except KeyError as e:
        raise ValueError(f"{source}: required key {e} is missing") from None
    if cfg.index_topk % cfg.index_kpool:
        raise ValueError(f"{source}: index_topk {cfg.index_topk} is not a multiple of index_kpool")
    if cfg.n_group != 1:
        raise ValueError(f"{source}: n_group {cfg.n_group}: only n_group 1 is implemented here")
    return cfg


def trunk_prefix(layer: int) -> str:
    return f"model.language_model.layers.{layer}."


FINAL_NORM = "model.language_model.norm.weight"


# ---- parameters ---------------------------------------------------------------------------------

# Tensors kept in fp32 in the checkpoint and by mtplab's loader (docs/weights.md).
FP32_SUFFIXES = ("index_kpool_compress_ape", "e_score_correction_bias")
# Not trained by the optimiser: updated by the load-balancing rule.
BUFFER_SUFFIXES = ("e_score_correction_bias",)


def block_shapes(c: TinyConfig) -> dict[str, tuple[int, ...]]:
    """Relative name -> shape of one DSA + MoE block (docs/model.md, "Checkpoint names")."""
    H, nh, dqk, dv = c.hidden, c.n_heads, c.qk_nope_head_dim, c.v_head_dim
    nI, D, P, E, I = c.index_n_heads, c.index_head_dim, c.index_kpool, c.n_routed_experts, c.moe_intermediate_size
    s = {
        "input_layernorm.weight": (H,),
        "post_attention_layernorm.weight": (H,),
        "self_attn.q_a_proj.weight": (c.q_lora_rank, H),
        "self_attn.q_a_layernorm.weight": (c.q_lora_rank,),
        "self_attn.q_b_proj.weight": (nh * dqk, c.q_lora_rank),
        "self_attn.kv_a_proj_with_mqa.weight": (c.kv_lora_rank, H),
        "self_attn.kv_a_layernorm.weight": (c.kv_lora_rank,),
        "self_attn.kv_b_proj.weight": (nh * (dqk + dv), c.kv_lora_rank),
        "self_attn.o_proj.weight": (H, nh * dv),
        "self_attn.indexer.wq_b.weight": (nI * D, c.q_lora_rank),
        "self_attn.indexer.wk.weight": (D, H),
        "self_attn.indexer.k_norm.weight": (D,),
        "self_attn.indexer.k_norm.bias": (D,),
        "self_attn.indexer.weights_proj.weight": (nI, H),
        "self_attn.indexer.index_kpool_compress_gate": (D, H),
        "self_attn.indexer.index_kpool_compress_ape": (P, D),
        "mlp.gate.weight": (E, H),
        "mlp.gate.e_score_correction_bias": (E,),
        "mlp.shared_experts.gate_proj.weight": (c.shared_inter, H),
        "mlp.shared_experts.up_proj.weight": (c.shared_inter, H),
        "mlp.shared_experts.down_proj.weight": (H, c.shared_inter),
    }
    for e in range(E):
        s[f"mlp.experts.{e}.gate_proj.weight"] = (I, H)
        s[f"mlp.experts.{e}.up_proj.weight"] = (I, H)
        s[f"mlp.experts.{e}.down_proj.weight"] = (H, I)
    return s


def all_shapes(c: TinyConfig, trunk_layers: int) -> dict[str, tuple[int, ...]]:
    H = c.hidden
    s = {c.embed_tokens: (c.vocab, H), c.lm_head: (c.vocab, H), FINAL_NORM: (H,)}
    for i in range(trunk_layers):
        for k, v in block_shapes(c).items():
            s[trunk_prefix(i) + k] = v
    p = c.mtp_prefix
    s[p + "enorm.weight"] = (H,)
    s[p + "hnorm.weight"] = (H,)
    s[p + "eh_proj.weight"] = (H, 2 * H)
    s[p + "shared_head.norm.weight"] = (H,)
    for k, v in block_shapes(c).items():
        s[p + k] = v
    return s


def init_params(c: TinyConfig, trunk_layers: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Training initialisation (fp32): projections N(0, 1/fan_in), output projections of each
    residual branch scaled down by sqrt(2 * blocks), norms 1, LayerNorm bias 0, ape small."""
    blocks = trunk_layers + 1
    out = {}
    for name, shape in all_shapes(c, trunk_layers).items():
        if name.endswith("e_score_correction_bias") or name.endswith("k_norm.bias"):
            t = torch.zeros(shape)
        elif len(shape) == 1:
            t = torch.ones(shape)
        elif name.endswith("index_kpool_compress_ape"):
            t = torch.randn(shape, generator=gen) * 0.1
        elif name == c.embed_tokens:
            t = torch.randn(shape, generator=gen)
        else:
            t = torch.randn(shape, generator=gen) / math.sqrt(shape[1])
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                t /= math.sqrt(2 * blocks)
        out[name] = t.float()
    return out


def round_to_bf16(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inference weights: BF16 values (held in fp32 tensors), except the fp32 tensors."""
    return {k: (v.detach().float() if k.endswith(FP32_SUFFIXES) else v.detach().bfloat16().float())
            for k, v in params.items()}


# ---- numerics -----------------------------------------------------------------------------------

class Numerics:
    """bf16=True rounds to BF16 (nearest even) where lib/ops/ops.hpp does; bf16=False is plain fp32
    (training). All arithmetic is fp32 either way."""

    def __init__(self, bf16: bool):
        self.bf16 = bf16

    def r(self, x: torch.Tensor) -> torch.Tensor:
        return x.bfloat16().float() if self.bf16 else x


def rmsnorm(x, w, eps, nx: Numerics):
    # ops rmsnorm: bf16(w * (x * r)), r = 1/sqrt(mean(x^2) + eps), fp32 inside, one rounding.
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return nx.r(w * (x * r))


def layernorm(x, w, b, eps, nx: Numerics):
    # ops layernorm: bf16((x - mean) / sqrt(var + eps) * w + b), biased variance, fp32 inside.
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    return nx.r((x - mean) * torch.rsqrt(var + eps) * w + b)


def linear(x, W, nx: Numerics):
    """ops linear: fp32 accumulate, BF16 out."""
    return nx.r(x @ W.t())


def linear_f32(x, W):
    """ops linear_f32: fp32 out, no rounding (indexer q / weights / gate, router, o_proj partial)."""
    return x @ W.t()


# ---- the pooled lightning indexer and sparse MLA -------------------------------------------------

@dataclass
class RowCaches:
    """What a block caches per row (docs/model.md, the seed's Glm5NextDsaState): the latent KV row,
    the normalised indexer key and the fp32 gate. Shapes [B, R, .]."""
    ckv: torch.Tensor
    k_normed: torch.Tensor
    gate: torch.Tensor


def row_caches(p: dict, pre: str, c: TinyConfig, u: torch.Tensor, nx: Numerics,
               detach_indexer: bool = False) -> RowCaches:
    """The cache-only context row (ops: latent write + indexer row) for every row of u [B, R, H].
    detach_indexer (training): the indexer's keys and gates see u detached, like its query side."""
    ckv = rmsnorm(linear(u, p[pre + "self_attn.kv_a_proj_with_mqa.weight"], nx),
                  p[pre + "self_attn.kv_a_layernorm.weight"], c.rms_norm_eps, nx)
    if detach_indexer:
        u = u.detach()
    k_pre = linear(u, p[pre + "self_attn.indexer.wk.weight"], nx)
    k_normed = layernorm(k_pre, p[pre + "self_attn.indexer.k_norm.weight"], p[pre + "self_attn.indexer.k_norm.bias"],
                         c.index_norm_eps, nx)
    gate = linear_f32(u, p[pre + "self_attn.indexer.index_kpool_compress_gate"])
    return RowCaches(ckv, k_normed, gate)


def pool_keys(k_normed: torch.Tensor, gate: torch.Tensor, ape: torch.Tensor, P: int) -> torch.Tensor:
    """K_j[c] = sum_m softmax_m(gate[jP+m, c] + ape[m, c]) k_normed[jP+m, c] over the complete pools,
    fp32. [B, R, D] -> [B, R // P, D]."""
    B, R, D = k_normed.shape
    npool = R // P
    k = k_normed[:, : npool * P].reshape(B, npool, P, D)
    g = gate[:, : npool * P].reshape(B, npool, P, D) + ape
    return (torch.softmax(g, dim=2) * k).sum(dim=2)


def indexer_scores(q_idx, w_idx, keys, c: TinyConfig):
    """I_j = sum_h w_h relu(q_h . K_j / sqrt(D)), fp32. q_idx [B, T, nI, D], w_idx [B, T, nI],
    keys [B, NP, D] -> [B, T, NP]."""
    qk = torch.einsum("bthd,bjd->bthj", q_idx, keys) / math.sqrt(c.index_head_dim)
    return (w_idx.unsqueeze(-1) * torch.relu(qk)).sum(dim=2)


def selection_mask(scores: torch.Tensor, pos: torch.Tensor, R: int, c: TinyConfig):
    """Rows each query attends (docs/model.md): the top min(K/P, #candidates) complete pools whose last
    row is <= pos (ties: lower pool index, by a stable descending sort), expanded to rows, plus
    the incomplete tail P*floor((pos+1)/P) .. pos. scores [B, T, NP], pos [T] -> bool [B, T, R],
    and the candidate mask [T, NP]."""
    B, T, NP = scores.shape
    P, n_sel = c.index_kpool, c.index_topk // c.index_kpool
    pools = torch.arange(NP, device=scores.device)
    cand = (pools * P + P - 1).unsqueeze(0) <= pos.unsqueeze(1)  # [T, NP]
    rows = torch.arange(R, device=scores.device)
    tail_start = (pos + 1) // P * P
    mask = (rows.unsqueeze(0) >= tail_start.unsqueeze(1)) & (rows.unsqueeze(0) <= pos.unsqueeze(1))  # [T, R]
    mask = mask.unsqueeze(0).expand(B, T, R).clone()
    if NP == 0:
        return mask, cand
    masked = scores.masked_fill(~cand, float("-inf"))
    order = torch.sort(masked, dim=-1, descending=True, stable=True).indices[..., : min(n_sel, NP)]
    chosen = torch.gather(cand.unsqueeze(0).expand(B, T, NP), -1, order)
    pool_sel = torch.zeros(B, T, NP, dtype=torch.bool, device=scores.device)
    pool_sel.scatter_(-1, order, chosen)
    row_sel = pool_sel.repeat_interleave(P, dim=-1)
    mask[..., : NP * P] |= row_sel
    return mask, cand


def dsa_attention(p: dict, pre: str, c: TinyConfig, u: torch.Tensor, pos: torch.Tensor, cache: RowCaches,
                  nx: Numerics, want_aux: bool = False):
    """DSA attention of the queries u [B, T, H] at positions pos [T] over the cached rows
    [B, R, .] (rows 0..R-1, each query's own row among them). Returns the fp32 partial
    W_o [o_1; ...] [B, T, H] (ops linear_f32; the caller adds the residual), and the indexer
    auxiliary loss when want_aux (else None)."""
    B, T, _ = u.shape
    R = cache.ckv.shape[1]
    nh, dqk, dv, L = c.n_heads, c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank
    cq = rmsnorm(linear(u, p[pre + "self_attn.q_a_proj.weight"], nx), p[pre + "self_attn.q_a_layernorm.weight"],
                 c.rms_norm_eps, nx)
    q = linear(cq, p[pre + "self_attn.q_b_proj.weight"], nx).reshape(B, T, nh, dqk)

    # Indexer query side. In training its inputs are detached: the indexer learns only from the
    # auxiliary loss (the selection itself passes no gradient).
    ix = pre + "self_attn.indexer."
    cq_i, u_i = (cq.detach(), u.detach()) if want_aux else (cq, u)
    q_idx = linear_f32(cq_i, p[ix + "wq_b.weight"]).reshape(B, T, c.index_n_heads, c.index_head_dim)
    w_idx = linear_f32(u_i, p[ix + "weights_proj.weight"]) * (1.0 / math.sqrt(c.index_n_heads))
    keys = pool_keys(cache.k_normed, cache.gate, p[ix + "index_kpool_compress_ape"], c.index_kpool)
    scores_i = indexer_scores(q_idx, w_idx, keys, c)
    mask, cand = selection_mask(scores_i.detach(), pos, R, c)

    # Absorbed MLA: q_abs = bf16(W_k,h^T q_h); scores against latent rows, fp32 softmax;
    # o_lat = bf16(sum p c); o = bf16(W_v,h o_lat).
    W = p[pre + "self_attn.kv_b_proj.weight"].reshape(nh, dqk + dv, L)
    q_abs = nx.r(torch.einsum("btnd,ndc->btnc", q, W[:, :dqk]))
    logits = torch.einsum("btnc,brc->bntr", q_abs, cache.ckv) * (1.0 / math.sqrt(dqk))
    probs = torch.softmax(logits.masked_fill(~mask.unsqueeze(1), float("-inf")), dim=-1)
    o_lat = nx.r(torch.einsum("bntr,brc->btnc", probs, cache.ckv))
    o = nx.r(torch.einsum("btnc,ndc->btnd", o_lat, W[:, dqk:])).reshape(B, T, nh * dv)
    partial = linear_f32(o, p[pre + "self_attn.o_proj.weight"])

    aux = None
    if want_aux and keys.shape[1] >= 2:
        # Target: the dense causal attention's mass per candidate pool (mean over heads),
        # renormalised over the candidates; the indexer's softmax over candidates should match it
        # (KL). Rows with fewer than two candidates carry no signal.
        with torch.no_grad():
            rows = torch.arange(R, device=u.device)
            causal = rows.unsqueeze(0) <= pos.unsqueeze(1)
            dense = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1).mean(dim=1)  # [B, T, R]
            NP = keys.shape[1]
            mass = dense[..., : NP * c.index_kpool].reshape(B, T, NP, c.index_kpool).sum(-1)
            mass = mass.masked_fill(~cand, 0.0)
            target = mass / mass.sum(-1, keepdim=True).clamp_min(1e-20)
            use = cand.sum(-1) >= 2  # [T]
        logp = torch.log_softmax(scores_i.masked_fill(~cand, float("-inf")), dim=-1)
        kl = (target * (torch.log(target.clamp_min(1e-20)) - logp.masked_fill(~cand, 0.0))).sum(-1)  # [B, T]
        aux = (kl * use).sum() / (use.sum() * B).clamp_min(1)
    return partial, aux


# ---- MoE ----------------------------------------------------------------------------------------

def moe(p: dict, pre: str, c: TinyConfig, v: torch.Tensor, nx: Numerics):
    """Routed experts (sigmoid router, fp32; choice by s + bias, weights from the unbiased s,
    ties to the lower expert id) plus the shared expert, both with the clamped SwiGLU. v [N, H] ->
    (fp32 partial [N, H], expert ids [N, k]). In BF16 mode each expert's gate, up, activation and
    down output are rounded, and the weighted sum stays fp32 (ops moe_experts)."""
    E, k, Lim = c.n_routed_experts, c.num_experts_per_tok, c.swiglu_limit
    logits = linear_f32(v, p[pre + "mlp.gate.weight"])
    s = torch.sigmoid(logits)
    biased = s.detach() + p[pre + "mlp.gate.e_score_correction_bias"]
    idx = torch.sort(biased, dim=-1, descending=True, stable=True).indices[:, :k]
    sel = torch.gather(s, -1, idx)
    weights = sel / sel.sum(-1, keepdim=True) * c.routed_scaling_factor
    combine = torch.zeros(v.shape[0], E, device=v.device, dtype=v.dtype).scatter(-1, idx, weights)

    def swiglu(g, up):
        if Lim > 0:
            g = g.clamp(max=Lim)
            up = up.clamp(-Lim, Lim)
        return nx.r(F.silu(g) * up)

    gate_w = torch.stack([p[f"{pre}mlp.experts.{e}.gate_proj.weight"] for e in range(E)])  # [E, I, H]
    up_w = torch.stack([p[f"{pre}mlp.experts.{e}.up_proj.weight"] for e in range(E)])
    down_w = torch.stack([p[f"{pre}mlp.experts.{e}.down_proj.weight"] for e in range(E)])  # [E, H, I]
    g = nx.r(torch.einsum("nh,eih->nei", v, gate_w))
    up = nx.r(torch.einsum("nh,eih->nei", v, up_w))
    d = nx.r(torch.einsum("nei,ehi->neh", swiglu(g, up), down_w))
    out = torch.einsum("ne,neh->nh", combine, d)
    sg = linear(v, p[pre + "mlp.shared_experts.gate_proj.weight"], nx)
    su = linear(v, p[pre + "mlp.shared_experts.up_proj.weight"], nx)
    out = out + linear(swiglu(sg, su), p[pre + "mlp.shared_experts.down_proj.weight"], nx)
    return out, idx


# ---- blocks, target, MTP ------------------------------------------------------------------------

def block_forward(p: dict, pre: str, c: TinyConfig, x: torch.Tensor, nx: Numerics, want_aux: bool = False):
    """A whole causal block over rows 0..T-1 of x [B, T, H] (prefill / training): every row is
    written to the caches and queried. Returns (x_out, aux, expert ids [B*T, k])."""
    B, T, H = x.shape
    u = rmsnorm(x, p[pre + "input_layernorm.weight"], c.rms_norm_eps, nx)
    cache = row_caches(p, pre, c, u, nx, detach_indexer=want_aux)
    pos = torch.arange(T, device=x.device)
    partial, aux = dsa_attention(p, pre, c, u, pos, cache, nx, want_aux)
    x1 = nx.r(x + partial)
    v = rmsnorm(x1, p[pre + "post_attention_layernorm.weight"], c.rms_norm_eps, nx)
    m, idx = moe(p, pre, c, v.reshape(B * T, H), nx)
    return nx.r(x1 + m.reshape(B, T, H)), aux, idx


def target_forward(p: dict, c: TinyConfig, trunk_layers: int, tokens: torch.Tensor, nx: Numerics,
                   want_aux: bool = False):
    """The target over tokens [B, T]: embedding, the trunk blocks (plain residual), final norm.
    Returns (post-final-norm hidden [B, T, H], list of aux losses, list of expert ids)."""
    x = p[c.embed_tokens][tokens]
    auxes, ids = [], []
    for i in range(trunk_layers):
        x, aux, idx = block_forward(p, trunk_prefix(i), c, x, nx, want_aux)
        auxes.append(aux)
        ids.append(idx)
    return rmsnorm(x, p[FINAL_NORM], c.rms_norm_eps, nx), auxes, ids


def head_logits(p: dict, c: TinyConfig, y: torch.Tensor, nx: Numerics):
    """lm_head, BF16 logits in BF16 mode (ops head_argmax)."""
    return linear(y, p[c.lm_head], nx)


def mtp_front(p: dict, c: TinyConfig, next_tokens: torch.Tensor, hidden: torch.Tensor, nx: Numerics):
    """x0 = eh_proj [enorm(E[token]) ; hnorm(hidden)]: embedding first, hidden second."""
    pre = c.mtp_prefix
    e = rmsnorm(p[c.embed_tokens][next_tokens], p[pre + "enorm.weight"], c.rms_norm_eps, nx)
    h = rmsnorm(hidden, p[pre + "hnorm.weight"], c.rms_norm_eps, nx)
    return linear(torch.cat([e, h], dim=-1), p[pre + "eh_proj.weight"], nx)


def mtp_forward(p: dict, c: TinyConfig, next_tokens: torch.Tensor, hidden: torch.Tensor, nx: Numerics,
                want_aux: bool = False):
    """The MTP layer over its rows r = 0..T-1 (row r = (embed(tokens[r+1]), hidden[r])), all causal.
    Returns (y = shared_head.norm output [B, T, H], aux, expert ids)."""
    x0 = mtp_front(p, c, next_tokens, hidden, nx)
    x1, aux, idx = block_forward(p, c.mtp_prefix, c, x0, nx, want_aux)
    return rmsnorm(x1, p[c.mtp_prefix + "shared_head.norm.weight"], c.rms_norm_eps, nx), aux, idx


class BlockState:
    """Per-sequence caches of one block for B sequences decoded in lockstep, written densely from
    row 0 (the C++ LayerCache): a row's cache entries depend only on that row's input, so a
    context row (cache-only) and a full forward of the same row leave the same cache."""

    def __init__(self, p: dict, pre: str, c: TinyConfig, nx: Numerics, batch: int, max_rows: int):
        self.p, self.pre, self.c, self.nx = p, pre, c, nx
        self.ckv = torch.zeros(batch, max_rows, c.kv_lora_rank)
        self.k_normed = torch.zeros(batch, max_rows, c.index_head_dim)
        self.gate = torch.zeros(batch, max_rows, c.index_head_dim)
        self.rows = 0
        self.max_rows = max_rows

    def _write(self, x: torch.Tensor) -> torch.Tensor:
        """Writes the cache entries of x [B, n, H] at rows self.rows.. ; returns u = input norm."""
        n = x.shape[1]
        if self.rows + n > self.max_rows:
            raise RuntimeError(f"block {self.pre}: rows {self.rows}..{self.rows + n - 1} pass the capacity "
                               f"of {self.max_rows}")
        u = rmsnorm(x, self.p[self.pre + "input_layernorm.weight"], self.c.rms_norm_eps, self.nx)
        rc = row_caches(self.p, self.pre, self.c, u, self.nx)
        self.ckv[:, self.rows: self.rows + n] = rc.ckv
        self.k_normed[:, self.rows: self.rows + n] = rc.k_normed
        self.gate[:, self.rows: self.rows + n] = rc.gate
        self.rows += n
        return u

    def cache(self) -> RowCaches:
        r = self.rows
        return RowCaches(self.ckv[:, :r], self.k_normed[:, :r], self.gate[:, :r])

    def append_context_rows(self, x: torch.Tensor) -> None:
        """context_rows: cache_only. x [B, n, H]."""
        if x.shape[1]:
            self._write(x)

    def forward_rows(self, x: torch.Tensor) -> torch.Tensor:
        """The full block on rows self.rows .. self.rows + n - 1 (each attends the rows before it and
        itself); x [B, n, H] -> x_out [B, n, H]."""
        first = self.rows
        u = self._write(x)
        pos = torch.arange(first, self.rows)
        partial, _ = dsa_attention(self.p, self.pre, self.c, u, pos, self.cache(), self.nx)
        x1 = self.nx.r(x + partial)
        B, n, H = x.shape
        v = rmsnorm(x1, self.p[self.pre + "post_attention_layernorm.weight"], self.c.rms_norm_eps, self.nx)
        m, _ = moe(self.p, self.pre, self.c, v.reshape(B * n, H), self.nx)
        return self.nx.r(x1 + m.reshape(B, n, H))
