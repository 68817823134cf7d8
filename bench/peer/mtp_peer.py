"""The PyTorch peer's MTP step, free of transformers: weights, composition, cache, timing.

The MTP step of docs/model.md around two injected modules (attention with its indexer, MoE):

    e = enorm(E[t]); h = hnorm(hidden); x0 = eh_proj [e ; h]        embedding first
    r = x0 + attn(input_layernorm(x0))                              plain residual
    x1 = r + moe(post_attention_layernorm(r))
    y = shared_head.norm(x1); draft = argmax(lm_head y)             lowest id on ties

peer_step.py plugs in transformers' glm5_next modules; the self-test (selftest.py) plugs in the
small stand-ins at the bottom of this file, which keep transformers' parameter names, so the
checkpoint mapping, the composition and the timing code run anywhere (CPU, torch >= 1.13).

Invariants:
- Weights come from a safetensors checkpoint under the checkpoint names mtplab loads
  (docs/model.md, "Checkpoint names"; mtplab_export_weights writes it): the peer and mtplab run the
  same tensors. Experts are stored one tensor each and stacked here into transformers' fused
  layout (gate_up_proj [E, 2I, H], gate rows first; down_proj [E, H, I]).
- e_score_correction_bias and index_kpool_compress_ape stay fp32 (as the checkpoint stores them).
- A timed step reads its token and hidden from device tensors prepared beforehand: no host to
  device copy inside the timed region (mtplab's step timing excludes its uploads too).
"""

from __future__ import annotations

import json
import math
import struct
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

# docs/model.md, "Sizes"; mtp_layer is the checkpoint index of the MTP layer.
PRESETS = {
    "glm5.3-flash": dict(hidden=4096, vocab=154880, n_heads=64, qk_nope=256, v_head=256, q_lora=1536,
                         kv_lora=512, index_heads=32, index_dim=128, index_topk=2048, index_kpool=4,
                         n_experts=288, top_k=8, n_shared=1, moe_inter=2048, routed_scaling=2.5,
                         swiglu_limit=10.0, rms_eps=1e-5, mtp_layer=45),
    "small": dict(hidden=1024, vocab=38912, n_heads=16, qk_nope=128, v_head=128, q_lora=384, kv_lora=256,
                  index_heads=8, index_dim=128, index_topk=512, index_kpool=4, n_experts=64, top_k=4,
                  n_shared=1, moe_inter=512, routed_scaling=2.5, swiglu_limit=10.0, rms_eps=1e-5,
                  mtp_layer=45),
    "tiny": dict(hidden=128, vocab=4096, n_heads=8, qk_nope=32, v_head=32, q_lora=64, kv_lora=64,
                 index_heads=4, index_dim=32, index_topk=16, index_kpool=4, n_experts=8, top_k=2,
                 n_shared=1, moe_inter=64, routed_scaling=2.5, swiglu_limit=10.0, rms_eps=1e-5,
                 mtp_layer=45),
}

EMBED_NAME = "model.language_model.embed_tokens.weight"
LM_HEAD_NAME = "lm_head.weight"


def log(msg: str = "") -> None:
    print(msg, flush=True)


def mtp_prefix(p: dict) -> str:
    return f"model.language_model.layers.{p['mtp_layer']}."


# ------------------------------------------------------------------------------------------------
# safetensors reading (the library when present, else a reader of the same format)
# ------------------------------------------------------------------------------------------------
_DTYPES = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16, "I32": torch.int32,
           "I64": torch.int64, "U8": torch.uint8, "F8_E4M3": getattr(torch, "float8_e4m3fn", None)}


class Checkpoint:
    """Tensors by name from one .safetensors file or a directory of them (with or without
    model.safetensors.index.json). get(name, device) returns a tensor on `device`."""

    def __init__(self, path: str | Path):
        path = Path(path)
        files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
        if not files:
            raise FileNotFoundError(f"{path}: no .safetensors files")
        self.where: dict[str, tuple[Path, dict, int]] = {}
        for f in files:
            with open(f, "rb") as fh:
                n = struct.unpack("<Q", fh.read(8))[0]
                header = json.loads(fh.read(n))
            for name, h in header.items():
                if name != "__metadata__":
                    self.where[name] = (f, h, 8 + n)
        self.bytes_read = 0
        try:
            from safetensors import safe_open  # noqa: F401
            self._lib = True
        except ImportError:
            self._lib = False
        self._open: dict[Path, object] = {}

    def names(self) -> list[str]:
        return sorted(self.where)

    def shape(self, name: str) -> list[int]:
        return list(self._entry(name)[1]["shape"])

    def _entry(self, name: str):
        if name not in self.where:
            raise KeyError(f"checkpoint has no tensor {name!r} ({len(self.where)} tensors)")
        return self.where[name]

    def get(self, name: str, device="cpu") -> torch.Tensor:
        f, h, base = self._entry(name)
        a, b = h["data_offsets"]
        self.bytes_read += b - a
        if self._lib:
            from safetensors import safe_open
            if f not in self._open:
                self._open[f] = safe_open(str(f), framework="pt", device="cpu")
            t = self._open[f].get_tensor(name)
        else:
            dtype = _DTYPES[h["dtype"]]
            with open(f, "rb") as fh:
                fh.seek(base + a)
                raw = bytearray(fh.read(b - a))
            t = torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(h["shape"]) if raw else \
                torch.empty(h["shape"], dtype=dtype)
        return t.to(device)


# ------------------------------------------------------------------------------------------------
# The step
# ------------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    """Stand-in with transformers' Glm5NextTextRMSNorm arithmetic (normalise in fp32, round,
    multiply by the weight)."""

    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.variance_epsilon = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dt)


class MtpStep(nn.Module):
    """The MTP layer around `attn` (called as attn(u, mask, cache) -> out [1, S, H]) and `moe`
    (moe(v) -> out). make_norm(n, eps) builds each RMSNorm (transformers' class in the peer)."""

    def __init__(self, p: dict, attn: nn.Module, moe: nn.Module, make_norm, call_attn):
        super().__init__()
        H, V = p["hidden"], p["vocab"]
        self.p = p
        self.attn = attn
        self.moe = moe
        self.call_attn = call_attn
        self.enorm = make_norm(H, p["rms_eps"])
        self.hnorm = make_norm(H, p["rms_eps"])
        self.input_layernorm = make_norm(H, p["rms_eps"])
        self.post_attention_layernorm = make_norm(H, p["rms_eps"])
        self.shared_head_norm = make_norm(H, p["rms_eps"])
        self.embed_tokens = nn.Parameter(torch.empty(V, H))
        self.lm_head = nn.Parameter(torch.empty(V, H))
        self.eh_proj = nn.Parameter(torch.empty(H, 2 * H))

    def front(self, tokens: torch.Tensor, hiddens: torch.Tensor) -> torch.Tensor:
        """x0 [1, S, H] from tokens [S] and hiddens [S, H]."""
        e = self.enorm(F.embedding(tokens, self.embed_tokens))
        h = self.hnorm(hiddens)
        return F.linear(torch.cat([e, h], dim=-1), self.eh_proj)[None]

    def context(self, tokens: torch.Tensor, hiddens: torch.Tensor, cache) -> None:
        """Writes context rows into the cache (mtplab's context_rows: cache_only: only the
        attention runs, its output is discarded)."""
        u = self.input_layernorm(self.front(tokens, hiddens))
        mask = torch.ones(1, u.shape[1], dtype=torch.bool, device=u.device)
        self.call_attn(self.attn, u, mask, cache)

    def forward(self, token: torch.Tensor, hidden: torch.Tensor, cache):
        """One draft: token [1], hidden [1, H] -> (draft [1] int64, y [1, H])."""
        x0 = self.front(token, hidden)
        mask = torch.ones(1, 1, dtype=torch.bool, device=x0.device)
        r = x0 + self.call_attn(self.attn, self.input_layernorm(x0), mask, cache)
        x1 = r + self.moe(self.post_attention_layernorm(r))
        y = self.shared_head_norm(x1)[0]
        logits = F.linear(y, self.lm_head)
        return torch.argmax(logits, dim=-1), y


def load_weights(step: MtpStep, ckpt: Checkpoint, p: dict, device, dtype=torch.bfloat16) -> dict:
    """Copies the checkpoint into the step's parameters (created on `device` beforehand) and
    returns {checkpoint name: module path} of what was loaded. Every parameter must be covered."""
    pre = mtp_prefix(p)
    loaded = {}
    targets = dict(step.named_parameters())
    targets.update({n: b for n, b in step.named_buffers() if b is not None and b.is_floating_point()})

    def put(module_name: str, t: torch.Tensor, src: str):
        dst = targets.pop(module_name)
        if tuple(dst.shape) != tuple(t.shape):
            raise ValueError(f"{src}: shape {tuple(t.shape)} but {module_name} is {tuple(dst.shape)}")
        with torch.no_grad():
            dst.copy_(t.to(device=dst.device, dtype=dst.dtype))
        loaded[src] = module_name

    put("embed_tokens", ckpt.get(EMBED_NAME), EMBED_NAME)
    put("lm_head", ckpt.get(LM_HEAD_NAME), LM_HEAD_NAME)
    put("eh_proj", ckpt.get(pre + "eh_proj.weight"), pre + "eh_proj.weight")
    for mine, theirs in (("enorm", "enorm"), ("hnorm", "hnorm"), ("input_layernorm", "input_layernorm"),
                         ("post_attention_layernorm", "post_attention_layernorm"),
                         ("shared_head_norm", "shared_head.norm")):
        put(f"{mine}.weight", ckpt.get(pre + f"{theirs}.weight"), pre + f"{theirs}.weight")
    for name in list(targets):
        if name.startswith("attn."):
            src = pre + "self_attn." + name[len("attn."):]
            put(name, ckpt.get(src), src)
    E, I = p["n_experts"], p["moe_inter"]
    if "moe.experts.gate_up_proj" in targets:
        gu = targets["moe.experts.gate_up_proj"]
        dn = targets["moe.experts.down_proj"]
        with torch.no_grad():
            for e in range(E):
                g = pre + f"mlp.experts.{e}.gate_proj.weight"
                u = pre + f"mlp.experts.{e}.up_proj.weight"
                d = pre + f"mlp.experts.{e}.down_proj.weight"
                gu[e, :I].copy_(ckpt.get(g).to(device))   # gate rows first
                gu[e, I:].copy_(ckpt.get(u).to(device))
                dn[e].copy_(ckpt.get(d).to(device))
                loaded[g] = loaded[u] = "moe.experts.gate_up_proj"
                loaded[d] = "moe.experts.down_proj"
        targets.pop("moe.experts.gate_up_proj")
        targets.pop("moe.experts.down_proj")
    for name in list(targets):
        if name.startswith("moe."):
            src = pre + "mlp." + name[len("moe."):]
            put(name, ckpt.get(src), src)
    if targets:
        raise ValueError(f"parameters not in the checkpoint: {sorted(targets)}")
    missing = [n for n in ckpt.names() if n not in loaded]
    if missing:
        raise ValueError(f"checkpoint tensors not used ({len(missing)}): {missing[:8]}")
    return loaded


def materialise(module: nn.Module, device, dtype=torch.bfloat16, fp32_suffixes=("e_score_correction_bias",
                                                                               "index_kpool_compress_ape")):
    """Meta-device parameters and buffers -> uninitialised storage on `device` (BF16, fp32 for
    the router bias and the pool ape). Nothing is initialised: load_weights fills every tensor."""
    module.to(dtype=dtype)  # on the meta device: no storage yet, so no cost
    module.to_empty(device=device)
    for name, prm in list(module.named_parameters()):
        want = torch.float32 if name.endswith(fp32_suffixes) else dtype
        if prm.dtype != want:
            prm.data = prm.data.to(want)
    for mod_name, mod in module.named_modules():
        for bname, buf in list(mod.named_buffers(recurse=False)):
            full = f"{mod_name}.{bname}" if mod_name else bname
            want = torch.float32 if full.endswith(fp32_suffixes) else dtype
            if buf is not None and buf.is_floating_point() and buf.dtype != want:
                setattr(mod, bname, buf.to(want))


# ------------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------------
def quantile(v: list[float], q: float) -> float:
    v = sorted(v)
    if not v:
        return float("nan")
    pos = q * (len(v) - 1)
    i = int(pos)
    f = pos - i
    return v[i] * (1 - f) + v[i + 1] * f if i + 1 < len(v) else v[i]


class StepTimer:
    """CUDA events on a GPU, perf_counter (after a synchronize) on the CPU."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"

    def time_us(self, fn) -> float:
        if self.cuda:
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            return e0.elapsed_time(e1) * 1e3
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6


def step_inputs(p: dict, n: int, device, seed: int):
    """n fresh (token, hidden) pairs on the device: unit-RMS hiddens (post-final-norm-like)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, p["vocab"], (n, 1), generator=g)
    hid = torch.randn(n, 1, p["hidden"], generator=g)
    hid = hid / hid.pow(2).mean(-1, keepdim=True).sqrt()
    return tokens.to(device), hid.to(device=device, dtype=torch.bfloat16)


def summary_row(name: str, us: list[float], note: str = "") -> dict:
    return {"variant": name, "reps": len(us), "median_us": quantile(us, 0.5), "p10_us": quantile(us, 0.1),
            "p90_us": quantile(us, 0.9), "note": note}


# ------------------------------------------------------------------------------------------------
# Stand-ins with transformers' parameter names (self-test only; not the reference)
# ------------------------------------------------------------------------------------------------
class StandInIndexer(nn.Module):
    def __init__(self, p: dict):
        super().__init__()
        H, D, nI, P = p["hidden"], p["index_dim"], p["index_heads"], p["index_kpool"]
        self.wq_b = nn.Linear(p["q_lora"], nI * D, bias=False)
        self.wk = nn.Linear(H, D, bias=False)
        self.k_norm = nn.LayerNorm(D, eps=1e-6)
        self.weights_proj = nn.Linear(H, nI, bias=False)
        self.index_kpool_compress_ape = nn.Parameter(torch.zeros(P, D))
        self.index_kpool_compress_gate = nn.Parameter(torch.zeros(D, H))


class StandInAttention(nn.Module):
    """Dense causal MLA over a growing list cache (no sparse selection): enough to exercise the
    composition, the cache and the parameter mapping."""

    def __init__(self, p: dict):
        super().__init__()
        H, nh, dqk, dv = p["hidden"], p["n_heads"], p["qk_nope"], p["v_head"]
        self.p = p
        self.q_a_proj = nn.Linear(H, p["q_lora"], bias=False)
        self.q_a_layernorm = RMSNorm(p["q_lora"], p["rms_eps"])
        self.q_b_proj = nn.Linear(p["q_lora"], nh * dqk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(H, p["kv_lora"], bias=False)
        self.kv_a_layernorm = RMSNorm(p["kv_lora"], p["rms_eps"])
        self.kv_b_proj = nn.Linear(p["kv_lora"], nh * (dqk + dv), bias=False)
        self.o_proj = nn.Linear(nh * dv, H, bias=False)
        self.indexer = StandInIndexer(p)

    def forward(self, x, mask, cache: list):
        nh, dqk, dv = self.p["n_heads"], self.p["qk_nope"], self.p["v_head"]
        S = x.shape[1]
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(1, S, nh, dqk).transpose(1, 2)
        kv = self.kv_b_proj(self.kv_a_layernorm(self.kv_a_proj_with_mqa(x))).view(1, S, nh, dqk + dv)
        k, v = kv.transpose(1, 2).split([dqk, dv], dim=-1)
        past = len(cache) and cache[0].shape[2]
        cache[:] = [torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)] if cache else [k, v]
        K, Vv = cache
        T = K.shape[2]
        s = torch.matmul(q, K.transpose(2, 3)).float() * dqk ** -0.5
        causal = torch.arange(T, device=x.device)[None, :] <= (past + torch.arange(S, device=x.device))[:, None]
        s = s.masked_fill(~causal, float("-inf"))
        o = torch.matmul(torch.softmax(s, -1).to(x.dtype), Vv).transpose(1, 2).reshape(1, S, nh * dv)
        return self.o_proj(o)


class StandInExperts(nn.Module):
    def __init__(self, p: dict):
        super().__init__()
        E, I, H = p["n_experts"], p["moe_inter"], p["hidden"]
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * I, H))
        self.down_proj = nn.Parameter(torch.empty(E, H, I))


class StandInRouter(nn.Module):
    def __init__(self, p: dict):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(p["n_experts"], p["hidden"]))
        self.register_buffer("e_score_correction_bias", torch.zeros(p["n_experts"]))


class StandInMLP(nn.Module):
    def __init__(self, H: int, I: int):
        super().__init__()
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)


class StandInMoE(nn.Module):
    """docs/model.md's MoE (sigmoid router with bias, top-k, normalised weights x scaling, clamped
    SwiGLU experts, shared expert) with transformers' parameter names."""

    def __init__(self, p: dict):
        super().__init__()
        self.p = p
        self.experts = StandInExperts(p)
        self.gate = StandInRouter(p)
        self.shared_experts = StandInMLP(p["hidden"], p["moe_inter"] * p["n_shared"])

    def _swiglu(self, g, u):
        L = self.p["swiglu_limit"]
        return F.silu(g.clamp(max=L)) * u.clamp(-L, L)

    def forward(self, x):
        p = self.p
        v = x.view(-1, x.shape[-1])
        s = torch.sigmoid(F.linear(v.float(), self.gate.weight.float()))
        idx = torch.topk(s + self.gate.e_score_correction_bias, p["top_k"], dim=-1).indices
        w = s.gather(1, idx)
        w = w / w.sum(-1, keepdim=True) * p["routed_scaling"]
        out = torch.zeros_like(v, dtype=torch.float32)
        I = p["moe_inter"]
        for j in range(p["top_k"]):
            e = idx[0, j]
            gu = F.linear(v, self.experts.gate_up_proj[e])
            a = self._swiglu(gu[:, :I], gu[:, I:])
            out += w[:, j:j + 1] * F.linear(a, self.experts.down_proj[e]).float()
        se = self.shared_experts
        out += F.linear(self._swiglu(se.gate_proj(v), se.up_proj(v)), se.down_proj.weight).float()
        return out.to(x.dtype).view_as(x)


def standin_step(p: dict) -> MtpStep:
    return MtpStep(p, StandInAttention(p), StandInMoE(p), lambda n, eps: RMSNorm(n, eps),
                   lambda attn, u, mask, cache: attn(u, mask, cache))


def attention_flops_note(p: dict, context: int) -> str:
    return (f"transformers' eager decode reads the expanded K/V cache: {context} rows x {p['n_heads']} heads x "
            f"{p['qk_nope'] + p['v_head']} BF16 = {context * p['n_heads'] * (p['qk_nope'] + p['v_head']) * 2 / 1e6:.0f} MB "
            f"per step (mtplab reads {min(context, p['index_topk'] + p['index_kpool'] - 1)} latent rows x "
            f"{p['kv_lora']} = {min(context, p['index_topk'] + p['index_kpool'] - 1) * p['kv_lora'] * 2 / 1e6:.1f} MB)")

