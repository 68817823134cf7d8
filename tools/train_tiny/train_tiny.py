#!/usr/bin/env python3
"""Trains a tiny GLM-5.3-Flash-shaped target with its MTP layer, and writes what mtplab needs to
measure a drafter's acceptance on it (docs/trained-tiny.md):

  OUT/model.safetensors   BF16 weights under the checkpoint names mtplab loads (trunk included;
                          ape and the router bias fp32, as in the real checkpoints)
  OUT/trained-tiny.yaml   the model config (configs/tiny.yaml, renamed, max_seq_len = context)
  OUT/tokenizer.json      the byte-level BPE (vocab 4096) trained on the training files
  OUT/trace.h5            greedy decoding of the trained target from held-out prompts
                          (docs/trace-format.md; hiddens post-final-norm)
  OUT/meta.json           provenance, final losses, and the acceptance oracle's figures
  OUT/oracle_steps.json   the oracle's steps [sequence, L, accepted, drafts..., targets...] per k
  OUT/train_log.jsonl     one JSON object per log line; OUT/run.log: everything printed

Phases: corpus and split -> tokenizer -> training (time-limited) -> export -> trace -> oracle.
Training runs on --device (cuda when present); everything after training runs on the CPU in
BF16 numerics, so the trace and the oracle do not depend on GPU kernels. Exits non-zero on any
failure; an output file that exists is whole (written to a temporary name, then renamed).
"""

from __future__ import annotations

import time

T0 = time.monotonic()  # before the heavy imports: --total-minutes counts them too

import argparse  # noqa: E402
import datetime as dt  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import artifacts as A  # noqa: E402
import glm_tiny as G  # noqa: E402
import mtp_replay as R  # noqa: E402


class Log:
    """Prints with a flush (PYTHONUNBUFFERED or not), and keeps run.log / train_log.jsonl."""

    def __init__(self, out: Path):
        self.text = open(out / "run.log", "w")
        self.jsonl = open(out / "train_log.jsonl", "w")

    def __call__(self, msg: str) -> None:
        line = f"[{time.monotonic() - T0:7.1f}s] {msg}"
        print(line, flush=True)
        self.text.write(line + "\n")
        self.text.flush()

    def record(self, obj: dict) -> None:
        self.jsonl.write(json.dumps(obj) + "\n")
        self.jsonl.flush()


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="output folder (created; files are replaced)")
    ap.add_argument("--preset", type=Path, default=REPO / "configs" / "tiny.yaml")
    ap.add_argument("--corpus", type=Path, default=Path("/usr/lib/python3.12"),
                    help="folder whose *.py files (not recursive) are the text")
    ap.add_argument("--heldout-mod", type=int, default=10, help="hold out files with crc32(name) %% N == 0")
    ap.add_argument("--fallback-tokenizer", action="store_true",
                    help="byte-level ids instead of a trained BPE (smoke tests where `tokenizers` is missing)")
    ap.add_argument("--minutes", type=float, default=7.0, help="training wall time (the loop stops there)")
    ap.add_argument("--total-minutes", type=float, default=8.5,
                    help="wall-time guard for the whole run: training is cut short so that the phases after it "
                         "(about --reserve-seconds) still fit")
    ap.add_argument("--reserve-seconds", type=float, default=75.0)
    ap.add_argument("--device", default="auto", help="auto | cuda | cpu (training only)")
    ap.add_argument("--seed", type=int, default=20251130)
    ap.add_argument("--trunk-layers", type=int, default=2)
    ap.add_argument("--context", type=int, default=256, help="training context (tokens per window)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup-steps", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--mtp-weight", type=float, default=0.3, help="weight of the MTP loss")
    ap.add_argument("--indexer-weight", type=float, default=1.0,
                    help="weight of the indexer's KL loss (its own parameters only)")
    ap.add_argument("--bias-rate", type=float, default=1e-3, help="router bias update per step (load balance)")
    ap.add_argument("--eval-every", type=float, default=20.0, help="seconds between held-out evaluations")
    ap.add_argument("--eval-windows", type=int, default=64)
    ap.add_argument("--trace-seqs", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--ks", default="1,2,3", help="draft lengths the oracle replays")
    ap.add_argument("--cpu-threads", type=int, default=1,
                    help="torch CPU threads of the phases after training (row-at-a-time work: more threads "
                         "only add synchronisation)")
    ap.add_argument("--git-sha", default=os.environ.get("MTPLAB_GIT_SHA", ""),
                    help="recorded as provenance (default: git, else the tree's .mtplab-git-sha)")
    return ap.parse_args(argv)


def git_sha(override: str) -> str:
    if override:
        return override
    try:
        sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"], capture_output=True, text=True,
                               check=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        # A copied tree without .git: the sha its copier wrote (cmake/WriteBuildInfo.cmake reads it too).
        marker = REPO / ".mtplab-git-sha"
        return marker.read_text().splitlines()[0].strip() if marker.exists() and marker.read_text().strip() else ""


def versions() -> dict:
    v = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}
    for mod in ("tokenizers", "h5py"):
        try:
            v[mod] = __import__(mod).__version__
        except ImportError:
            v[mod] = None
    v["cuda"] = torch.version.cuda
    return v


# ---- training -----------------------------------------------------------------------------------

def set_matmul_precision(mode: str, log) -> None:
    """'high' (TF32) for training on the GPU, 'highest' for everything after it."""
    try:
        torch.set_float32_matmul_precision(mode)
    except (AttributeError, RuntimeError) as e:  # an API change must not end a run over a speed knob
        log(f"matmul precision {mode}: not set ({e})")


def lr_at(args, step: int, frac: float) -> float:
    warm = min(1.0, (step + 1) / max(1, args.warmup_steps))
    cos = args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))
    return args.lr * warm * cos


def losses(p, c, args, toks, nx, want_aux):
    """toks [B, T+1]. Next-token loss on the target, MTP loss (row r = (embed(t_{r+1}), hidden_r)
    predicts t_{r+2}), the indexers' KL losses, and the teacher-forced MTP figures."""
    T = toks.shape[1] - 1
    V = c.vocab
    hidden, auxes, ids_t = G.target_forward(p, c, args.trunk_layers, toks[:, :T], nx, want_aux)
    logits = G.head_logits(p, c, hidden, nx)
    loss_main = F.cross_entropy(logits.reshape(-1, V), toks[:, 1:].reshape(-1))
    y, aux_m, ids_m = G.mtp_forward(p, c, toks[:, 1:T], hidden[:, : T - 1], nx, want_aux)
    logits_m = G.head_logits(p, c, y, nx)
    loss_mtp = F.cross_entropy(logits_m.reshape(-1, V), toks[:, 2:].reshape(-1))
    aux = [a for a in auxes + [aux_m] if a is not None]
    loss_aux = torch.stack(aux).sum() if aux else torch.zeros((), device=toks.device)
    with torch.no_grad():
        draft = logits_m.argmax(-1)
        agree = (draft == logits[:, 1:].argmax(-1)).float().mean()  # MTP vs the target's greedy token
        acc_m = (draft == toks[:, 2:]).float().mean()
        acc_t = (logits.argmax(-1) == toks[:, 1:]).float().mean()
    return loss_main, loss_mtp, loss_aux, ids_t + [ids_m], {"agree": agree, "mtp_acc": acc_m, "target_acc": acc_t}


def windows(stream: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
    return stream[starts.unsqueeze(1) + torch.arange(length, device=stream.device)]


@torch.no_grad()
def evaluate(p, c, args, eval_toks: torch.Tensor) -> dict:
    nx = G.Numerics(bf16=False)
    tot = {"loss_main": 0.0, "loss_mtp": 0.0, "agree": 0.0, "mtp_acc": 0.0, "target_acc": 0.0}
    n = 0
    for i in range(0, eval_toks.shape[0], args.batch):
        toks = eval_toks[i: i + args.batch]
        lm, lt, _, _, figs = losses(p, c, args, toks, nx, want_aux=False)
        w = toks.shape[0]
        tot["loss_main"] += float(lm) * w
        tot["loss_mtp"] += float(lt) * w
        for k in ("agree", "mtp_acc", "target_acc"):
            tot[k] += float(figs[k]) * w
        n += w
    return {k: v / n for k, v in tot.items()}


def train(args, c, train_stream, eval_toks, device, log):
    gen = torch.Generator().manual_seed(args.seed)
    params = {k: v.to(device) for k, v in G.init_params(c, args.trunk_layers, gen).items()}
    buffers = {k for k in params if k.endswith(G.BUFFER_SUFFIXES)}
    decay, no_decay = [], []
    for k, v in params.items():
        if k in buffers:
            continue
        v.requires_grad_(True)
        (decay if v.dim() >= 2 and not k.endswith("index_kpool_compress_ape") else no_decay).append(v)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    n_params = sum(v.numel() for v in params.values())
    log(f"train: {n_params} parameters ({args.trunk_layers} trunk blocks + MTP block), device {device}, "
        f"batch {args.batch} x {args.context} tokens, {args.minutes} min")
    blocks = [G.trunk_prefix(i) for i in range(args.trunk_layers)] + [c.mtp_prefix]
    nx = G.Numerics(bf16=False)
    stream = train_stream.to(device)
    eval_toks = eval_toks.to(device)
    budget = min(args.minutes * 60.0, args.total_minutes * 60.0 - (time.monotonic() - T0) - args.reserve_seconds)
    if budget < min(10.0, args.minutes * 60.0):
        raise SystemExit(f"train: only {budget:.0f}s left for training within --total-minutes {args.total_minutes}")
    if budget < args.minutes * 60.0:
        log(f"train: budget cut to {budget:.0f}s by --total-minutes {args.total_minutes}")
    if str(device).startswith("cuda"):
        set_matmul_precision("high", log)  # TF32 for training only
    t_start = time.monotonic()
    last_log = last_eval = t_start
    step, tokens_seen = 0, 0
    best = None
    ema, ema_t = None, None
    history = []
    while True:
        elapsed = time.monotonic() - t_start
        if elapsed >= budget:
            break
        lr = lr_at(args, step, elapsed / budget)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(train_stream) - args.context - 1, (args.batch,), generator=gen).to(device)
        toks = windows(stream, starts, args.context + 1)
        lm, lt, la, ids, figs = losses(params, c, args, toks, nx, want_aux=True)
        loss = lm + args.mtp_weight * lt + args.indexer_weight * la
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([v for v in params.values() if v.requires_grad], 1.0)
        opt.step()
        with torch.no_grad():
            # Auxiliary-loss-free load balancing (DeepSeek-V3): raise the bias of under-loaded experts.
            for pre, idx in zip(blocks, ids):
                flat = idx.reshape(-1)
                load = torch.zeros(c.n_routed_experts, device=flat.device).scatter_add_(
                    0, flat, torch.ones(flat.shape, device=flat.device))
                params[pre + "mlp.gate.e_score_correction_bias"] += args.bias_rate * torch.sign(load.mean() - load)
        step += 1
        tokens_seen += args.batch * args.context
        # Running means stay on the device: a host read every step would stall the launch queue.
        cur = {"loss_main": lm.detach(), "loss_mtp": lt.detach(), "loss_indexer": la.detach(), "agree": figs["agree"]}
        ema_t = cur if ema_t is None else {k: 0.95 * ema_t[k] + 0.05 * cur[k] for k in cur}
        now = time.monotonic()
        if now - last_log >= 10.0 or step == 1:
            last_log = now
            ema = {k: float(v) for k, v in ema_t.items()}
            rate = tokens_seen / (now - t_start)
            log(f"step {step:6d}  {now - t_start:6.1f}s  lr {lr:.2e}  main {ema['loss_main']:.3f}  "
                f"mtp {ema['loss_mtp']:.3f}  indexer {ema['loss_indexer']:.3f}  agree {ema['agree']:.3f}  "
                f"{rate / 1e3:.0f}k tok/s")
            log.record({"kind": "train", "step": step, "seconds": now - t_start, "lr": lr, **ema})
        if now - last_eval >= args.eval_every or now - t_start >= budget:
            last_eval = now
            ev = evaluate(params, c, args, eval_toks)
            ev_score = ev["loss_main"] + args.mtp_weight * ev["loss_mtp"]
            history.append({"step": step, "seconds": now - t_start, **ev})
            log(f"eval step {step}: held-out main {ev['loss_main']:.3f}  mtp {ev['loss_mtp']:.3f}  "
                f"agree {ev['agree']:.3f}  target acc {ev['target_acc']:.3f}")
            log.record({"kind": "eval", "step": step, "seconds": now - t_start, **ev})
            if best is None or ev_score < best["score"]:
                best = {"score": ev_score, "step": step, "eval": ev,
                        "params": {k: v.detach().to("cpu", copy=True) for k, v in params.items()}}
    ema = {k: float(v) for k, v in ema_t.items()} if ema_t else None
    ev = evaluate(params, c, args, eval_toks)
    history.append({"step": step, "seconds": time.monotonic() - t_start, **ev})
    log.record({"kind": "eval", "step": step, "final": True, **ev})
    if best is None or ev["loss_main"] + args.mtp_weight * ev["loss_mtp"] < best["score"]:
        best = {"score": ev["loss_main"] + args.mtp_weight * ev["loss_mtp"], "step": step, "eval": ev,
                "params": {k: v.detach().to("cpu", copy=True) for k, v in params.items()}}
    set_matmul_precision("highest", log)  # every later phase is plain fp32 + BF16 rounding
    log(f"train: {step} steps, {tokens_seen / 1e6:.1f}M tokens in {time.monotonic() - t_start:.0f}s; "
        f"kept step {best['step']} (held-out main {best['eval']['loss_main']:.3f}, mtp {best['eval']['loss_mtp']:.3f})")
    summary = {"steps": step, "tokens_seen": tokens_seen, "seconds": time.monotonic() - t_start,
               "parameters": n_params, "kept_step": best["step"], "final_train_ema": ema,
               "heldout_at_kept_step": best["eval"], "heldout_last": ev, "eval_history": history}
    return best["params"], summary


# ---- trace --------------------------------------------------------------------------------------

def pick_prompts(args, held_arrays, held_names):
    """trace_seqs prompts of prompt_len tokens from the held-out files, round-robin over the files
    long enough, at seeded offsets."""
    rng = np.random.RandomState(args.seed + 1)
    usable = [(n, a) for n, a in zip(held_names, held_arrays) if len(a) >= args.prompt_len + 1]
    if not usable:
        raise SystemExit(f"trace: no held-out file has {args.prompt_len} tokens")
    prompts = []
    for i in range(args.trace_seqs):
        name, arr = usable[i % len(usable)]
        start = int(rng.randint(0, len(arr) - args.prompt_len + 1))
        prompts.append((name, start, arr[start: start + args.prompt_len].copy()))
    return prompts


@torch.no_grad()
def generate_trace(p, c, args, prompts, log):
    """Greedy decoding in BF16 numerics on the CPU, all sequences in lockstep with per-block row
    caches (prefill of the prompt, then one row per token). hiddens[t] is the post-final-norm
    hidden after tokens[0..t], from the very forward whose argmax produced tokens[t+1]."""
    nx = G.Numerics(bf16=True)
    toks = torch.as_tensor(np.stack([pr for _, _, pr in prompts]), dtype=torch.long)
    B = toks.shape[0]
    states = [G.BlockState(p, G.trunk_prefix(i), c, nx, B, args.context) for i in range(args.trunk_layers)]

    def step(new_tokens):
        x = p[c.embed_tokens][new_tokens]
        for st in states:
            x = st.forward_rows(x)
        return G.rmsnorm(x, p[G.FINAL_NORM], c.rms_norm_eps, nx)

    hiddens = [step(toks)]
    for i in range(args.gen_len):
        nxt = torch.argmax(G.head_logits(p, c, hiddens[-1][:, -1], nx), dim=-1)  # first maximum: lowest id
        toks = torch.cat([toks, nxt.unsqueeze(1)], dim=1)
        hiddens.append(step(nxt.unsqueeze(1)))
        if (i + 1) % 32 == 0:
            log(f"trace: {i + 1}/{args.gen_len} tokens generated")
    h = torch.cat(hiddens, dim=1)
    assert h.shape[1] == toks.shape[1]
    return [(toks[s].numpy(), h[s], args.prompt_len) for s in range(B)]


def config_yaml(preset_text: str, context: int) -> str:
    """configs/tiny.yaml renamed, with max_seq_len = the training context (rows past it were never
    trained)."""
    out, seen = [], set()
    for line in preset_text.splitlines():
        if line.startswith("name:"):
            line, _ = "name: trained-tiny", seen.add("name")
        elif line.startswith("max_seq_len:"):
            line, _ = f"max_seq_len: {context}", seen.add("max_seq_len")
        out.append(line)
    if seen != {"name", "max_seq_len"}:
        raise SystemExit(f"config: the preset lacks a top-level {sorted({'name', 'max_seq_len'} - seen)}")
    head = ("# trained-tiny: configs/tiny.yaml with the weights of tools/train_tiny (docs/trained-tiny.md).\n"
            "# Only name and max_seq_len (the training context) differ from the preset.\n")
    while out and out[0].startswith("#"):  # the preset's own header comment
        out.pop(0)
    return head + "\n".join(out) + "\n"


# ---- main ---------------------------------------------------------------------------------------

def main(argv) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    log = Log(args.out)
    log(f"train_tiny: {' '.join(sys.argv)}")
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device.startswith("cuda"):
        log(f"device: {torch.cuda.get_device_name(0)}")
    ks = [int(k) for k in args.ks.split(",")]

    preset_text = args.preset.read_text()
    c = G.parse_preset(preset_text, str(args.preset))
    if args.context < c.index_topk + c.index_kpool:
        raise SystemExit(f"--context {args.context} never reaches the sparse selection (K + P - 1 = "
                         f"{c.index_topk + c.index_kpool - 1})")
    if args.prompt_len + args.gen_len > args.context:
        raise SystemExit(f"trace length {args.prompt_len + args.gen_len} exceeds the training context {args.context}")

    # Corpus, split, tokenizer.
    train_files, held_files, corpus_sha = A.read_corpus(args.corpus, args.heldout_mod)
    log(f"corpus: {args.corpus}: {len(train_files)} training files, {len(held_files)} held out, "
        f"{sum(len(t) for _, t in train_files) / 1e6:.2f} MB of training text")
    tok = A.make_tokenizer([t for _, t in train_files], c.vocab, args.fallback_tokenizer)
    tok_json = tok.to_json()
    A.write_atomic(args.out / "tokenizer.json", tok_json.encode())
    train_arrays = A.encode_files(tok, train_files)
    held_arrays = A.encode_files(tok, held_files)
    train_stream = torch.from_numpy(A.join_with_eot(train_arrays, tok.eot))
    held_stream = torch.from_numpy(A.join_with_eot(held_arrays, tok.eot))
    log(f"tokenizer: {tok.kind}, {len(train_stream)} training tokens, {len(held_stream)} held-out tokens")
    egen = torch.Generator().manual_seed(args.seed + 2)
    n_eval = min(args.eval_windows, max(1, (len(held_stream) - 1) // (args.context + 1)))
    estarts = torch.randint(0, len(held_stream) - args.context - 1, (n_eval,), generator=egen)
    eval_toks = windows(held_stream, estarts, args.context + 1)

    # Training.
    trained, train_summary = train(args, c, train_stream, eval_toks, device, log)

    # Export: BF16 (ape and router bias fp32), every tensor of the target and the MTP layer.
    p = G.round_to_bf16(trained)
    tensors = {k: (v.clone() if k.endswith(G.FP32_SUFFIXES) else v.bfloat16()) for k, v in p.items()}
    st_path = args.out / "model.safetensors"
    A.write_safetensors(st_path, tensors, {"format": "pt", "mtplab_model": "trained-tiny"})
    back = A.read_safetensors(st_path)
    for k, v in tensors.items():
        if not torch.equal(back[k].float(), v.float()):
            raise SystemExit(f"export: {k} does not read back equal")
    log(f"export: {st_path} ({st_path.stat().st_size / 1e6:.2f} MB, {len(tensors)} tensors)")
    yaml_text = config_yaml(preset_text, args.context)
    A.write_atomic(args.out / "trained-tiny.yaml", yaml_text.encode())

    # Trace.
    torch.set_num_threads(args.cpu_threads)
    prompts = pick_prompts(args, held_arrays, [n for n, _ in held_files])
    sequences = generate_trace(p, c, args, prompts, log)
    sha = git_sha(args.git_sha)
    created = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    run_cfg = {"args": {k: str(v) for k, v in vars(args).items()}, "model_config": yaml_text}
    trace_path = args.out / "trace.h5"
    A.write_trace(trace_path, sequences, c.hidden, c.vocab, {
        "generator": "tools/train_tiny/train_tiny.py", "model": "trained-tiny", "seed": "",
        "created_at": created, "git_sha": sha, "config": json.dumps(run_cfg, indent=1)})
    log(f"trace: {trace_path}: {len(sequences)} sequences x ({args.prompt_len} + {args.gen_len})")
    try:  # cosmetic: never let it end the run
        log("trace: sequence 0 continues with: " + repr(tok.decode(sequences[0][0][args.prompt_len:][:64])[:200]))
    except Exception as e:  # noqa: BLE001
        log(f"trace: (sample not decodable: {e})")

    meta = {
        "what": "tiny GLM-5.3-Flash-shaped target (2 DSA + MoE trunk blocks) and its MTP layer, trained jointly",
        "created_at": created,
        "git_sha": sha,
        "argv": sys.argv,
        "args": {k: str(v) for k, v in vars(args).items()},
        "versions": versions(),
        "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else platform.processor() or "cpu",
        "corpus": {"dir": str(args.corpus), "glob": "*.py (not recursive)", "sha256": corpus_sha,
                   "licence": "Python Software Foundation License Version 2 (CPython standard library sources)",
                   "train_files": len(train_files), "heldout_files": [n for n, _ in held_files],
                   "train_tokens": int(len(train_stream)), "heldout_tokens": int(len(held_stream))},
        "tokenizer": {"kind": tok.kind, "vocab": c.vocab, "eot_id": int(tok.eot),
                      "sha256": A.sha256_bytes(tok_json.encode())},
        "model": {"preset": str(args.preset), "trunk_layers": args.trunk_layers,
                  "trunk_residual": "plain (no hyper-connections), like the MTP layer",
                  "mtp_hidden_fed": "target post-final-norm hidden (hnorm input)",
                  "mtp_hidden_recycled_when_chaining": "post-shared_head.norm output y",
                  "indexer": "trained with a KL loss to the dense attention's per-pool mass (inputs detached)",
                  "router_bias": "auxiliary-loss-free load balancing, sign update per step"},
        "training": train_summary,
        "trace": {"file": "trace.h5", "sequences": len(sequences), "prompt_len": args.prompt_len,
                  "gen_len": args.gen_len, "prompts": [{"file": n, "token_offset": s} for n, s, _ in prompts],
                  "numerics": "BF16 at the ops.hpp rounding points, CPU, greedy (lowest id on ties)"},
        "oracle": {"status": "not run yet"},
        "files": {},
    }

    def write_meta():
        for name in ("model.safetensors", "trained-tiny.yaml", "tokenizer.json", "trace.h5", "oracle_steps.json"):
            if (args.out / name).exists():
                b = (args.out / name).read_bytes()
                meta["files"][name] = {"bytes": len(b), "sha256": A.sha256_bytes(b)}
        meta["wall_seconds"] = time.monotonic() - T0
        A.write_atomic(args.out / "meta.json", json.dumps(meta, indent=1).encode())

    write_meta()  # a run cut short in the oracle still leaves its provenance

    # Oracle: replay the trace as written (read back: the stored BF16 hiddens).
    replayed = A.read_trace(trace_path)
    oracle, steps_out = {}, {}
    for k in ks:
        t = time.monotonic()
        summ, records, ties = R.replay(p, c, replayed, k, args.context)
        summ["draft_logit_ties"] = ties
        oracle[f"k{k}"] = summ
        steps_out[f"k{k}"] = records
        log(f"oracle k={k}: acceptance {summ['acceptance_rate']:.4f}  tau {summ['tau']:.3f}  per-position "
            + " ".join(f"{r:.3f}" for r in summ["per_position"])
            + f"  ({summ['steps']} steps, {ties['near_ties_within_1_ulp']} near-tie drafts, {time.monotonic() - t:.1f}s)")
    A.write_atomic(args.out / "oracle_steps.json", json.dumps(
        {"columns": "sequence, L, accepted, drafts[k], targets[k]", **steps_out}).encode())
    meta["oracle"] = {
        "rules": "lib/harness/replay.hpp; draft_rows rewrite; context_rows cache_only; head_sharding none; "
                 "head_fp8 off; BF16 numerics at the ops.hpp rounding points (CPU)",
        "definitions": "rate = accepted/drafted; tau = 1 + accepted/steps; per_position[i] = P(a >= i+1)",
        **oracle}
    write_meta()
    log(f"done in {time.monotonic() - T0:.0f}s: {args.out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - any failure must end the run with a non-zero status
        traceback.print_exc()
        sys.stdout.flush()
        sys.exit(1)
