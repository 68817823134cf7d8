#!/usr/bin/env python3
"""Sampled traces of the trained tiny target, and the acceptance its MTP layer reaches on them
under sampling verification (docs/acceptance.md, docs/trained-tiny.md "Sampled traces"):

  OUT/trace-T<T>.h5      the 16 held-out prompts of OUT/trace.h5, each continued by sampling the
                         trained target at temperature T (top_k 0, top_p 1.0 unless given),
                         docs/trace-format.md with the sampling attributes, plus the oracle's
                         figures as root attributes `oracle.<proposal>.k<k>.<figure>`
  OUT/sampled.json       provenance, the arguments, and every figure of the oracle

The oracle replays each trace with the PyTorch MTP layer (glm_tiny, BF16 numerics at the ops.hpp
rounding points, on the CPU) under mtplab's sampling verification (lib/harness/replay.hpp): draft
i + 1 is chained on the trace token t_{L+i} (not on the drafter's own draft), a_i = min(1, q_i(y_i)
/ p_i(y_i)) for a sampled proposal or [argmax q_i == y_i] for a greedy one, the step accepts
drafts while the coin u(seed, sequence, L + i) < a_i, and the expected accepted count of the step
is sum_i prod_{j <= i} a_j. The coins are mtplab's (harness::verify_uniform), so the oracle walks
the same steps as mtplab's replay and the realised figures agree too.

Sampling: tokens[t + 1] ~ softmax(bf16 logits(h_t) / T) after top-k / top-p, drawn by inverse CDF in
token-id order with the uniform of drafter::sampling_uniform(seed, sequence, t + 1) (the synthetic
target's sampler: the same rule in both places). h_t is the post-final-norm hidden after
tokens[0..t], taken from the very forward whose logits gave tokens[t + 1].

The prompts are the first prompt_length tokens of each sequence of OUT/trace.h5 (the greedy
trace): the same held-out excerpts (meta.json trace.prompts), without re-reading the corpus.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import artifacts as A  # noqa: E402
import glm_tiny as G  # noqa: E402
import mtp_replay as R  # noqa: E402

T0 = time.monotonic()
MASK = (1 << 64) - 1


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


# ---- counter-based uniforms (core/hash.hpp splitmix64_mix) --------------------------------------

def mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def counter_uniform(domain: int, seed: int, sequence: int, position: int) -> float:
    h = mix((seed & MASK) ^ domain)
    h = mix(h ^ ((sequence * 0x9E3779B97F4A7C15) & MASK))
    h = mix(h ^ ((position * 0xD1B54A32D192ED03) & MASK))
    return (h >> 11) * 2.0 ** -53


VERIFY_DOMAIN = 0x6D74706C61622D76     # harness::verify_uniform ("mtplab-v")
SAMPLING_DOMAIN = 0x73796E7468657469   # drafter::sampling_uniform ("syntheti")


# ---- the transform (docs/acceptance.md): temperature, top-k, top-p; ties at a threshold kept ----

def transformed_logprobs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """log q over the vocab (float64, -inf outside the truncated support) of BF16 logits [V]."""
    z = logits.double() / temperature
    keep = torch.ones_like(z, dtype=torch.bool)
    if 0 < top_k < z.numel():
        thr = torch.topk(z, top_k).values[-1]
        keep &= z >= thr
    if top_p < 1.0:
        zk = torch.where(keep, z, torch.full_like(z, -float("inf")))
        w = torch.exp(zk - zk.max())
        vals = torch.unique(zk[keep], sorted=True).flip(0)   # distinct kept logits, descending
        mass = torch.stack([w[zk == v].sum() for v in vals]).cumsum(0)
        reach = int(torch.nonzero(mass >= top_p * w.sum())[0])
        keep &= z >= vals[reach]
    z = torch.where(keep, z, torch.full_like(z, -float("inf")))
    return torch.log_softmax(z, dim=-1)


def sample_token(logp: torch.Tensor, u: float) -> int:
    """Inverse CDF in token-id order: the first id whose cumulative probability exceeds u."""
    cum = torch.cumsum(torch.exp(logp), dim=0)
    idx = int(torch.searchsorted(cum, torch.tensor([u], dtype=cum.dtype), right=True)[0])
    kept = torch.nonzero(torch.isfinite(logp)).flatten()
    return min(idx, int(kept[-1]))


# ---- sampled continuations -----------------------------------------------------------------------

@torch.no_grad()
def generate_sampled(p, c, prompts, gen_len, context, trunk_layers, transform, seed):
    """All sequences in lockstep, as train_tiny.generate_trace, each new token sampled."""
    nx = G.Numerics(bf16=True)
    toks = torch.as_tensor(np.stack(prompts), dtype=torch.long)
    B, P = toks.shape
    states = [G.BlockState(p, G.trunk_prefix(i), c, nx, B, context) for i in range(trunk_layers)]

    def step(new_tokens):
        x = p[c.embed_tokens][new_tokens]
        for st in states:
            x = st.forward_rows(x)
        return G.rmsnorm(x, p[G.FINAL_NORM], c.rms_norm_eps, nx)

    hiddens = [step(toks)]
    for i in range(gen_len):
        logits = G.head_logits(p, c, hiddens[-1][:, -1], nx)  # [B, V] BF16 values
        pos = P + i  # the new token's position
        nxt = torch.tensor([sample_token(transformed_logprobs(logits[b], *transform),
                                         counter_uniform(SAMPLING_DOMAIN, seed, b, pos)) for b in range(B)])
        toks = torch.cat([toks, nxt.unsqueeze(1)], dim=1)
        hiddens.append(step(nxt.unsqueeze(1)))
    h = torch.cat(hiddens, dim=1)
    return [(toks[s].numpy(), h[s], P) for s in range(B)]


# ---- the oracle ----------------------------------------------------------------------------------

@torch.no_grad()
def target_logprobs(p, c, sequences, transform):
    """log p(tokens[t]) from hidden t - 1 for t >= P (NaN before): the target's own head."""
    nx = G.Numerics(bf16=True)
    out = []
    for tokens, hiddens, P in sequences:
        lp = np.full(len(tokens), np.nan)
        logits = G.head_logits(p, c, hiddens[P - 1: len(tokens) - 1], nx)
        for t in range(P, len(tokens)):
            v = float(transformed_logprobs(logits[t - P], *transform)[int(tokens[t])])
            if not np.isfinite(v):
                raise SystemExit(f"sequence {len(out)}, position {t}: token outside the target's support")
            lp[t] = v
        out.append(lp)
    return out


@torch.no_grad()
def sampling_replay(p, c, sequences, logp_target, k, proposal, transform, verify_seed, max_rows, subset=0):
    """mtplab's replay under sampling verification (lib/harness/replay.hpp), draft_rows rewrite,
    context_rows cache_only, unsharded BF16 head. Returns the summary dict; with subset > 0 it also
    holds the figures of the first `subset` sequences alone (summary["subset"])."""
    nx = G.Numerics(bf16=True)
    stats = R.AcceptanceStats(k)
    expected_sum = 0.0
    sub_stats, sub_expected = R.AcceptanceStats(k), 0.0
    for s, (tokens, hiddens, P) in enumerate(sequences):
        N = len(tokens)
        tok = torch.as_tensor(tokens, dtype=torch.long)
        x0_true = G.mtp_front(p, c, tok[1:N].unsqueeze(0), hiddens[: N - 1].unsqueeze(0), nx)[0]
        st = G.BlockState(p, c.mtp_prefix, c, nx, 1, max_rows)
        st.append_context_rows(x0_true[: P - 1].unsqueeze(0))
        L = P
        while L + k <= N - 1:
            start = st.rows
            assert start == L - 1, (start, L)
            x0 = x0_true[L - 1]
            a = []
            for i in range(k):
                x1 = st.forward_rows(x0.reshape(1, 1, -1)).reshape(-1)
                y = G.rmsnorm(x1, p[c.mtp_prefix + "shared_head.norm.weight"], c.rms_norm_eps, nx)
                logits = G.head_logits(p, c, y, nx)
                t = L + 1 + i
                target = int(tokens[t])
                if proposal == "greedy":
                    ai = 1.0 if int(torch.argmax(logits)) == target else 0.0  # first maximum: lowest id
                else:
                    lq = float(transformed_logprobs(logits, *transform)[target])
                    ai = 0.0 if lq == -float("inf") else min(1.0, float(np.exp(lq - logp_target[s][t])))
                a.append(float(np.float32(ai)))  # mtplab keeps a_i as fp32
                if i + 1 < k:
                    x0 = G.mtp_front(p, c, torch.tensor(target), y, nx)  # chained on the trace token
            acc = 0
            while acc < k and counter_uniform(VERIFY_DOMAIN, verify_seed, s, L + 1 + acc) < a[acc]:
                acc += 1
            prod, e = 1.0, 0.0
            for ai in a:
                prod *= ai
                e += prod
            expected_sum += e
            if s < subset:
                sub_stats.add(acc)
                sub_expected += e
            st.rows = start + 1  # after_verify, draft_rows rewrite
            st.append_context_rows(x0_true[st.rows: L + acc].unsqueeze(0))
            stats.add(acc)
            L += acc + 1
    out = stats.summary()
    out["expected_accepted"] = expected_sum
    out["expected_acceptance_rate"] = expected_sum / stats.drafted if stats.drafted else 0.0
    out["expected_tau"] = 1.0 + expected_sum / stats.steps if stats.steps else 0.0
    if subset > 0:
        sub = sub_stats.summary()
        sub["sequences"] = min(subset, len(sequences))
        sub["expected_accepted"] = sub_expected
        sub["expected_acceptance_rate"] = sub_expected / sub_stats.drafted if sub_stats.drafted else 0.0
        sub["expected_tau"] = 1.0 + sub_expected / sub_stats.steps if sub_stats.steps else 0.0
        out["subset"] = sub
    return out


def _oracle_job(job):
    torch.set_num_threads(1)
    torch.set_float32_matmul_precision("highest")
    (params_path, preset, trace_path, k, proposal, transform, verify_seed, max_rows, subset) = job
    c = G.parse_preset(Path(preset).read_text(), preset)
    p = G.round_to_bf16({n: t.float() for n, t in A.read_safetensors(Path(params_path)).items()})
    seqs = A.read_trace(Path(trace_path))
    logp = target_logprobs(p, c, seqs, transform)
    t = time.monotonic()
    summ = sampling_replay(p, c, seqs, logp, k, proposal, transform, verify_seed, max_rows, subset)
    summ["seconds"] = time.monotonic() - t
    return (Path(trace_path).name, proposal, k, summ)


# ---- main ----------------------------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=HERE.parent.parent / "data" / "trained-tiny",
                    help="the model's directory (model.safetensors, <name>.yaml, meta.json, the greedy trace)")
    ap.add_argument("--trace", default="trace.h5",
                    help="the greedy trace whose prompts are continued; the sampled traces are named "
                         "trace-T<T>.h5 for trace.h5, else <trace stem>-T<T>.h5")
    ap.add_argument("--checkpoint", type=Path, default=None,
                    help="the whole model, trunk included, for sampling (default: --data/model.safetensors); "
                         "the oracle reads --data/model.safetensors")
    ap.add_argument("--subset", type=int, default=0,
                    help="also record the oracle's figures over the first N sequences (root attributes "
                         "oracle.subset.*; 0: no)")
    ap.add_argument("--out", type=Path, default=None, help="where the traces go (default: --data)")
    ap.add_argument("--temperatures", default="0.7,1.0")
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=20251201, help="the sampler's seed (trace attribute sampling_seed)")
    ap.add_argument("--verify-seed", type=int, default=1,
                    help="the oracle's acceptance coins: mtplab's sampling_seed arm (default 1, the arm's default)")
    ap.add_argument("--ks", default="1,2,3,4")
    ap.add_argument("--proposals", default="greedy,sampled")
    ap.add_argument("--jobs", type=int, default=max(1, min(16, os.cpu_count() or 1)),
                    help="oracle replays run in parallel processes, one CPU thread each")
    ap.add_argument("--git-sha", default=os.environ.get("MTPLAB_GIT_SHA", ""))
    return ap.parse_args(argv)


def main(argv) -> int:
    args = parse_args(argv)
    out = args.out or args.data
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    torch.set_float32_matmul_precision("highest")
    meta = json.loads((args.data / "meta.json").read_text())
    model_name = meta.get("name", "trained-tiny")
    preset = args.data / f"{model_name}.yaml"
    c = G.parse_preset(preset.read_text(), str(preset))
    context = int(meta["args"]["context"])
    trunk_layers = int(meta["model"]["trunk_layers"])
    checkpoint = args.checkpoint or args.data / "model.safetensors"
    p = G.round_to_bf16({n: t.float() for n, t in A.read_safetensors(checkpoint).items()})
    missing = [G.trunk_prefix(i) for i in range(trunk_layers) if not any(n.startswith(G.trunk_prefix(i)) for n in p)]
    if missing or G.FINAL_NORM not in p:
        raise SystemExit(f"{checkpoint}: no trunk ({', '.join(missing) or G.FINAL_NORM} missing): sampling needs the "
                         "whole model (--checkpoint)")
    greedy = A.read_trace(args.data / args.trace)
    prompts = [tokens[:P].copy() for tokens, _, P in greedy]
    gen_len = len(greedy[0][0]) - greedy[0][2]
    stem = Path(args.trace).stem
    log(f"prompts: {len(prompts)} x {len(prompts[0])} tokens from {args.data / args.trace}; {gen_len} new tokens each")
    created = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    ks = [int(k) for k in args.ks.split(",")]
    proposals = args.proposals.split(",")
    temps = [float(t) for t in args.temperatures.split(",")]

    pending, jobs = {}, []
    for T in temps:
        transform = (T, args.top_k, args.top_p)
        t = time.monotonic()
        seqs = generate_sampled(p, c, prompts, gen_len, context, trunk_layers, transform, args.seed)
        name = f"{stem}-T{T:.1f}.h5" if abs(T * 10 - round(T * 10)) < 1e-9 else f"{stem}-T{T:g}.h5"
        path = out / (name + ".pending")
        attrs = {"sampling": "sampling", "temperature": float(T), "top_k": int(args.top_k),
                 "top_p": float(args.top_p), "sampling_seed": int(args.seed)}
        A.write_trace(path, seqs, c.hidden, c.vocab, {
            "generator": "tools/train_tiny/sample_traces.py", "model": model_name, "seed": "",
            "created_at": created, "git_sha": args.git_sha,
            "config": json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "temperature": T})},
            attrs=attrs)
        pending[name] = (path, T)
        log(f"trace: {name}: {len(seqs)} sequences sampled at T {T} in {time.monotonic() - t:.1f}s")
        for proposal in proposals:
            for k in ks:
                jobs.append((str(args.data / "model.safetensors"), str(preset), str(path), k, proposal, transform,
                             args.verify_seed, context, args.subset))

    log(f"oracle: {len(jobs)} replays on {args.jobs} process(es)")
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        results = pool.map(_oracle_job, jobs, chunksize=1)
    oracle = {}
    for trace_name, proposal, k, summ in results:
        name = trace_name[: -len(".pending")]
        oracle.setdefault(name, {}).setdefault(proposal, {})[f"k{k}"] = summ
        log(f"oracle {name} {proposal:7s} k={k}: expected rate {summ['expected_acceptance_rate']:.4f} "
            f"tau {summ['expected_tau']:.3f} | realised rate {summ['acceptance_rate']:.4f} tau {summ['tau']:.3f} "
            f"({summ['steps']} steps, {summ['seconds']:.1f}s)")

    files = {}
    for name, (path, T) in pending.items():
        with h5py.File(path, "r+") as f:
            f.attrs["oracle.verify_seed"] = np.int64(args.verify_seed)
            f.attrs["oracle.rules"] = np.bytes_(
                b"lib/harness/replay.hpp sampling verification; draft_rows rewrite; context_rows cache_only; "
                b"head_sharding none; head_fp8 off; BF16 numerics at the ops.hpp rounding points (CPU)")
            for proposal, per_k in oracle[name].items():
                for kk, summ in per_k.items():
                    for fig in ("expected_acceptance_rate", "expected_tau", "acceptance_rate", "tau"):
                        f.attrs[f"oracle.{proposal}.{kk}.{fig}"] = np.float64(summ[fig])
                    f.attrs[f"oracle.{proposal}.{kk}.steps"] = np.int64(summ["steps"])
                    if "subset" in summ:
                        sub = summ["subset"]
                        f.attrs["oracle.subset.sequences"] = np.int64(sub["sequences"])
                        for fig in ("expected_acceptance_rate", "expected_tau", "acceptance_rate", "tau"):
                            f.attrs[f"oracle.subset.{proposal}.{kk}.{fig}"] = np.float64(sub[fig])
                        f.attrs[f"oracle.subset.{proposal}.{kk}.steps"] = np.int64(sub["steps"])
        os.replace(path, out / name)
        b = (out / name).read_bytes()
        files[name] = {"bytes": len(b), "sha256": A.sha256_bytes(b), "temperature": T}
        log(f"wrote {out / name} ({len(b) / 1e3:.0f} kB)")
    summary = {
        "what": f"the {model_name} target's held-out prompts"
                + ("" if args.trace == "trace.h5" else f" ({args.trace})")
                + " continued by sampling; the MTP layer's acceptance under sampling verification (PyTorch oracle)",
        "created_at": created, "git_sha": args.git_sha, "argv": sys.argv,
        "args": {k: str(v) for k, v in vars(args).items()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
                     "h5py": h5py.__version__},
        "transform": {"top_k": args.top_k, "top_p": args.top_p, "temperatures": temps},
        "sampling": "tokens[t+1] by inverse CDF in id order of softmax(bf16 logits(h_t)/T) (top-k/top-p), uniform "
                    "drafter::sampling_uniform(seed, sequence, t+1)",
        "definitions": "a_i = min(1, q_i(y_i)/p_i(y_i)) (sampled) or [argmax q_i == y_i] (greedy); expected accepted "
                       "per step = sum_i prod_{j<=i} a_j; expected_tau = 1 + mean; expected rate = sum / drafted; "
                       "realised: coins harness::verify_uniform(verify_seed, sequence, position) < a_i",
        "oracle": oracle, "files": files, "wall_seconds": time.monotonic() - T0,
    }
    A.write_atomic(out / "sampled.json", json.dumps(summary, indent=1).encode())
    log(f"done in {time.monotonic() - T0:.0f}s")
    return 0


if __name__ == "__main__":
    A.run_main(main)
