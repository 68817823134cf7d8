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

With --corpus-roots (trained-mini, docs/trained-mini.md) the corpus is recursive and in categories
(tools/train_tiny/corpus.py), with one trace per category (OUT/trace-<category>.h5), the oracle's
figures under meta.json oracle.traces.<trace>, OUT/oracle_steps.json.gz, OUT/corpus-manifest.tsv.gz,
and OUT/<name>.yaml; --no-trunk-in-checkpoint ships only what mtplab loads.

Phases: corpus and split -> tokenizer -> training (time-limited) -> export -> trace -> oracle.
Training runs on --device (cuda when present); everything after training runs on the CPU in
BF16 numerics, so the trace and the oracle do not depend on GPU kernels. Exits non-zero on any
failure; an output file that exists is whole (written to a temporary name, then renamed).
"""

from __future__ import annotations

import time

T0 = time.monotonic()  # before the heavy imports: --total-minutes counts them too

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import datetime as dt  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import artifacts as A  # noqa: E402
import corpus as C  # noqa: E402
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
                    help="folder whose *.py files (not recursive) are the text (unless --corpus-roots)")
    ap.add_argument("--corpus-roots", default="",
                    help="recursive corpus instead of --corpus: 'python' (this interpreter's stdlib and site "
                         "directories) or LABEL=DIR,... (tools/train_tiny/corpus.py); one trace per category")
    ap.add_argument("--categories", default="code=.py;prose=.md,.rst,.txt",
                    help="with --corpus-roots: name=.ext,...;name=... (a file goes to the first that matches)")
    ap.add_argument("--train-cap-mb", default="", help="with --corpus-roots: training bytes per category, "
                    "e.g. code=128,prose=32 (MB; files read in a fixed pseudo-random order until the cap)")
    ap.add_argument("--heldout-cap-mb", default="", help="with --corpus-roots: held-out bytes per category")
    ap.add_argument("--max-file-kb", type=float, default=1024.0, help="with --corpus-roots: larger files are skipped")
    ap.add_argument("--prose-categories", default="prose",
                    help="with --corpus-roots: categories whose files need --min-letter-frac letters and spaces")
    ap.add_argument("--min-letter-frac", type=float, default=0.6)
    ap.add_argument("--tokenizer-sample-mb", type=float, default=0.0,
                    help="train the tokenizer on the first N MB of the training files (0: all of them)")
    ap.add_argument("--corpus-seconds", type=float, default=0.0,
                    help="with --corpus-roots: stop reading files after this many seconds of the run (0: no "
                         "limit; recorded when it cuts)")
    ap.add_argument("--name", default="trained-tiny", help="the model's name: OUT/<name>.yaml, trace provenance")
    ap.add_argument("--vocab", type=int, default=0, help="vocab size (0: the preset's); written to OUT/<name>.yaml")
    ap.add_argument("--no-trunk-in-checkpoint", action="store_true",
                    help="OUT/model.safetensors holds only what mtplab loads (embedding, lm_head, MTP layer); "
                         "the whole model goes to --full-checkpoint")
    ap.add_argument("--full-checkpoint", type=Path, default=None,
                    help="with --no-trunk-in-checkpoint: where the whole model (trunk included) is written, for "
                         "sample_traces.py --checkpoint")
    ap.add_argument("--oracle-jobs", type=int, default=1,
                    help="oracle replays in parallel processes (1: in this process, one after another)")
    ap.add_argument("--oracle-subset", type=int, default=0,
                    help="also record the oracle's figures over the first N sequences of each trace (0: no)")
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


def evaluate_all(p, c, args, eval_sets) -> dict:
    """evaluate() of one held-out set (a tensor), or of one per category (a dict): then the figures
    are the window-weighted means and by_category holds each category's."""
    if not isinstance(eval_sets, dict):
        return evaluate(p, c, args, eval_sets)
    per = {cat: evaluate(p, c, args, t) for cat, t in eval_sets.items()}
    n = {cat: t.shape[0] for cat, t in eval_sets.items()}
    total = sum(n.values())
    out = {k: sum(per[cat][k] * n[cat] for cat in per) / total for k in next(iter(per.values()))}
    out["by_category"] = per
    return out


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
    eval_toks = ({k: v.to(device) for k, v in eval_toks.items()} if isinstance(eval_toks, dict)
                 else eval_toks.to(device))
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
            ev = evaluate_all(params, c, args, eval_toks)
            ev_score = ev["loss_main"] + args.mtp_weight * ev["loss_mtp"]
            history.append({"step": step, "seconds": now - t_start, **ev})
            log(f"eval step {step}: held-out main {ev['loss_main']:.3f}  mtp {ev['loss_mtp']:.3f}  "
                f"agree {ev['agree']:.3f}  target acc {ev['target_acc']:.3f}"
                + "".join(f"  | {cat} main {e['loss_main']:.3f} agree {e['agree']:.3f}"
                          for cat, e in ev.get("by_category", {}).items()))
            log.record({"kind": "eval", "step": step, "seconds": now - t_start, **ev})
            if best is None or ev_score < best["score"]:
                best = {"score": ev_score, "step": step, "eval": ev,
                        "params": {k: v.detach().to("cpu", copy=True) for k, v in params.items()}}
    ema = {k: float(v) for k, v in ema_t.items()} if ema_t else None
    ev = evaluate_all(params, c, args, eval_toks)
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

def pick_prompts(args, held_arrays, held_names, seed_offset: int = 0):
    """trace_seqs prompts of prompt_len tokens from the held-out files, round-robin over the files
    long enough, at seeded offsets."""
    rng = np.random.RandomState(args.seed + 1 + seed_offset)
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


def config_yaml(preset_text: str, context: int, name: str = "trained-tiny", preset: str = "configs/tiny.yaml",
                vocab: int = 0) -> str:
    """The preset renamed, with max_seq_len = the training context (rows past it were never
    trained), and vocab = --vocab when given."""
    out, seen = [], set()
    for line in preset_text.splitlines():
        if line.startswith("name:"):
            line, _ = f"name: {name}", seen.add("name")
        elif line.startswith("max_seq_len:"):
            line, _ = f"max_seq_len: {context}", seen.add("max_seq_len")
        elif vocab and line.startswith("vocab:"):
            line, _ = f"vocab: {vocab}", seen.add("vocab")
        out.append(line)
    want = {"name", "max_seq_len"} | ({"vocab"} if vocab else set())
    if seen != want:
        raise SystemExit(f"config: the preset lacks a top-level {sorted(want - seen)}")
    differ = ("name, max_seq_len (the training context) and vocab" if vocab else
              "name and max_seq_len (the training context)")
    head = (f"# {name}: {preset} with the weights of tools/train_tiny (docs/{name}.md).\n"
            f"# Only {differ} differ from the preset.\n")
    while out and out[0].startswith("#"):  # the preset's own header comment
        out.pop(0)
    return head + "\n".join(out) + "\n"


# ---- main ---------------------------------------------------------------------------------------

def read_recursive_corpus(args, log):
    """--corpus-roots: the files of each category under the roots (tools/train_tiny/corpus.py), capped
    per category and split. Returns (train [(name, text)], held {category: [(name, text)]},
    corpus meta dict, manifest text)."""
    roots = C.parse_roots(args.corpus_roots)
    cats = C.parse_categories(args.categories)
    names = [n for n, _ in cats]
    entries, walk_skipped = C.scan(roots, cats)
    licences = C.Licences(roots)
    deadline = T0 + args.corpus_seconds if args.corpus_seconds > 0 else None
    sel = C.select(entries, licences, args.heldout_mod, C.parse_caps(args.train_cap_mb, names, "--train-cap-mb"),
                   C.parse_caps(args.heldout_cap_mb, names, "--heldout-cap-mb"), int(args.max_file_kb * 1024),
                   {p for p in args.prose_categories.split(",") if p}, args.min_letter_frac, deadline)
    train = [(t.entry.name, t.text) for t in sel.taken if t.split == "train"]
    held = {n: [(t.entry.name, t.text) for t in sel.taken if t.split == "heldout" and t.entry.category == n]
            for n in names}
    for n in names:
        st = sel.stats["by_category"][n]
        log(f"corpus: {n}: {st['found_files']} files ({st['found_bytes'] / 1e6:.1f} MB) found; "
            f"{st['train_files']} training files ({st['train_bytes'] / 1e6:.1f} MB), {st['heldout_files']} held out "
            f"({st['heldout_bytes'] / 1e6:.1f} MB); {st['not_read_cap']} not read (caps), skipped: "
            f"{st['skipped_duplicate']} duplicates, {st['skipped_too_large']} too large, "
            f"{st['skipped_not_utf8']} not UTF-8, {st['skipped_not_prose']} not prose")
        if not held[n] or not any(t.entry.category == n and t.split == "train" for t in sel.taken):
            raise SystemExit(f"corpus: category {n}: the split left an empty side")
    if sel.stats["deadline_hit"]:
        log(f"corpus: --corpus-seconds {args.corpus_seconds} stopped the reading (recorded in meta.json)")
    manifest = "\n".join(C.manifest_lines(sel.taken)) + "\n"
    meta = {"roots": C.describe_roots(roots), "categories": {n: list(e) for n, e in cats},
            "rules": "recursive; skipped folders __pycache__, *.dist-info, *.egg-info, dot-folders, site-packages "
                     "in the stdlib; symlinks not followed; held out when crc32(path relative to its root) % "
                     "heldout_mod == 0; files read in sha256('root:path') order until the per-category caps; "
                     "skipped: larger than max_file_kb, not UTF-8, a repeat of a file already taken, prose with "
                     "fewer than min_letter_frac letters and spaces per character in its first 20000",
            "heldout_mod": args.heldout_mod, "train_cap_mb": args.train_cap_mb, "heldout_cap_mb": args.heldout_cap_mb,
            "max_file_kb": args.max_file_kb, "min_letter_frac": args.min_letter_frac,
            "corpus_seconds": args.corpus_seconds, "deadline_hit": sel.stats["deadline_hit"],
            "walk_skipped": walk_skipped, "by_category": sel.stats["by_category"],
            "sha256": C.corpus_sha256(sel.taken), "manifest": "corpus-manifest.tsv.gz",
            "manifest_sha256": A.sha256_bytes(manifest.encode()),
            "licences": C.licence_mix(sel.taken),
            "heldout_files": {n: [name for name, _ in held[n]] for n in names}}
    return train, held, meta, manifest


def oracle_for_trace(p, c, args, ks, trace_path):
    """The greedy oracle on one trace, k by k, in this process: {k: (summary, records, ties, seconds)}."""
    replayed = A.read_trace(trace_path)
    results = {}
    for k in ks:
        t = time.monotonic()
        summ, records, ties = R.replay(p, c, replayed, k, args.context)
        results[k] = (summ, records, ties, time.monotonic() - t)
    return results


def oracle_parallel(args, jobs):
    """jobs: (checkpoint, config, trace, k, max_rows) -> {(trace, k): (summ, records, ties, seconds)}, in
    spawned processes of one CPU thread each (the checkpoint is read back from its file: the same
    BF16 values as in this process)."""
    import multiprocessing as mp
    with mp.get_context("spawn").Pool(min(args.oracle_jobs, len(jobs))) as pool:
        out = pool.map(R.replay_job, jobs, chunksize=1)
    return {(Path(j[2]).name, j[3]): r for j, r in zip(jobs, out)}


def log_oracle(log, label, k, summ, ties, seconds):
    log(f"oracle{label} k={k}: acceptance {summ['acceptance_rate']:.4f}  tau {summ['tau']:.3f}  per-position "
        + " ".join(f"{r:.3f}" for r in summ["per_position"])
        + f"  ({summ['steps']} steps, {ties['near_ties_within_1_ulp']} near-tie drafts, {seconds:.1f}s)")


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
    if args.no_trunk_in_checkpoint and args.full_checkpoint is None:
        raise SystemExit("--no-trunk-in-checkpoint needs --full-checkpoint (sample_traces.py needs the trunk)")

    preset_text = args.preset.read_text()
    c = G.parse_preset(preset_text, str(args.preset))
    if args.vocab:
        c = dataclasses.replace(c, vocab=args.vocab)
    if args.context < c.index_topk + c.index_kpool:
        raise SystemExit(f"--context {args.context} never reaches the sparse selection (K + P - 1 = "
                         f"{c.index_topk + c.index_kpool - 1})")
    if args.prompt_len + args.gen_len > args.context:
        raise SystemExit(f"trace length {args.prompt_len + args.gen_len} exceeds the training context {args.context}")
    try:
        preset_name = str(args.preset.resolve().relative_to(REPO))
    except ValueError:
        preset_name = str(args.preset)

    # Corpus, split, tokenizer. Categories: None for v1's flat corpus (one trace, trace.h5), else
    # one trace per category (trace-<category>.h5).
    t_phase = time.monotonic()
    if args.corpus_roots:
        train_files, held_by_cat, corpus_meta, manifest = read_recursive_corpus(args, log)
        A.write_atomic(args.out / "corpus-manifest.tsv.gz", gzip.compress(manifest.encode(), mtime=0))
        log(f"corpus: {len(train_files)} training files, {sum(len(v) for v in held_by_cat.values())} held out, "
            f"{sum(len(t) for _, t in train_files) / 1e6:.2f} MB of training text ({time.monotonic() - t_phase:.1f}s)")
    else:
        train_files, held_files, corpus_sha = A.read_corpus(args.corpus, args.heldout_mod)
        held_by_cat = {None: held_files}
        log(f"corpus: {args.corpus}: {len(train_files)} training files, {len(held_files)} held out, "
            f"{sum(len(t) for _, t in train_files) / 1e6:.2f} MB of training text")
    tok_texts = [t for _, t in train_files]
    if args.tokenizer_sample_mb > 0:
        limit, n = int(args.tokenizer_sample_mb * 1e6), 0
        for i, t in enumerate(tok_texts):
            n += len(t)
            if n >= limit:
                tok_texts = tok_texts[: i + 1]
                break
    t_phase = time.monotonic()
    tok = A.make_tokenizer(tok_texts, c.vocab, args.fallback_tokenizer)
    tok_json = tok.to_json()
    A.write_atomic(args.out / "tokenizer.json", tok_json.encode())
    if args.corpus_roots:
        log(f"tokenizer: trained on {len(tok_texts)} files ({sum(len(t) for t in tok_texts) / 1e6:.1f} M characters) "
            f"in {time.monotonic() - t_phase:.1f}s")
    t_phase = time.monotonic()
    train_arrays = A.encode_files(tok, train_files)
    held_arrays = {cat: A.encode_files(tok, files) for cat, files in held_by_cat.items()}
    train_stream = torch.from_numpy(A.join_with_eot(train_arrays, tok.eot))
    held_streams = {cat: torch.from_numpy(A.join_with_eot(a, tok.eot)) for cat, a in held_arrays.items()}
    log(f"tokenizer: {tok.kind}, {len(train_stream)} training tokens, "
        f"{sum(len(h) for h in held_streams.values())} held-out tokens"
        + ("" if None in held_streams else
           " (" + ", ".join(f"{cat} {len(h)}" for cat, h in held_streams.items())
           + f"; {time.monotonic() - t_phase:.1f}s)"))
    egen = torch.Generator().manual_seed(args.seed + 2)
    eval_sets = {}
    for cat, held_stream in held_streams.items():
        n_eval = min(args.eval_windows, max(1, (len(held_stream) - 1) // (args.context + 1)))
        estarts = torch.randint(0, len(held_stream) - args.context - 1, (n_eval,), generator=egen)
        eval_sets[cat] = windows(held_stream, estarts, args.context + 1)
    eval_toks = eval_sets[None] if None in eval_sets else eval_sets

    # Training.
    trained, train_summary = train(args, c, train_stream, eval_toks, device, log)

    # Export: BF16 (ape and router bias fp32), every tensor of the target and the MTP layer (or, with
    # --no-trunk-in-checkpoint, only what mtplab loads; the whole model to --full-checkpoint).
    t_phase = time.monotonic()
    p = G.round_to_bf16(trained)
    tensors = {k: (v.clone() if k.endswith(G.FP32_SUFFIXES) else v.bfloat16()) for k, v in p.items()}
    st_path = args.out / "model.safetensors"
    st_meta = {"format": "pt", "mtplab_model": args.name}
    if args.no_trunk_in_checkpoint:
        A.write_safetensors(args.full_checkpoint, tensors, st_meta)
        tensors = {k: v for k, v in tensors.items()
                   if k in (c.embed_tokens, c.lm_head) or k.startswith(c.mtp_prefix)}
    A.write_safetensors(st_path, tensors, st_meta)
    back = A.read_safetensors(st_path)
    for k, v in tensors.items():
        if not torch.equal(back[k].float(), v.float()):
            raise SystemExit(f"export: {k} does not read back equal")
    log(f"export: {st_path} ({st_path.stat().st_size / 1e6:.2f} MB, {len(tensors)} tensors)"
        + (f"; the whole model in {args.full_checkpoint} ({args.full_checkpoint.stat().st_size / 1e6:.2f} MB)"
           if args.no_trunk_in_checkpoint else ""))
    yaml_name = f"{args.name}.yaml"
    yaml_text = config_yaml(preset_text, args.context, args.name, preset_name, args.vocab)
    A.write_atomic(args.out / yaml_name, yaml_text.encode())

    # Traces: one (trace.h5) for the flat corpus, one per category (trace-<category>.h5) else.
    torch.set_num_threads(args.cpu_threads)
    sha = git_sha(args.git_sha)
    created = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    run_cfg = {"args": {k: str(v) for k, v in vars(args).items()}, "model_config": yaml_text}
    traces = {}  # file name -> (category, prompts, sequences)
    for i, (cat, held_files) in enumerate(held_by_cat.items()):
        t_phase = time.monotonic()
        prompts = pick_prompts(args, held_arrays[cat], [n for n, _ in held_files], seed_offset=10 * i)
        sequences = generate_trace(p, c, args, prompts, log)
        trace_name = "trace.h5" if cat is None else f"trace-{cat}.h5"
        trace_path = args.out / trace_name
        A.write_trace(trace_path, sequences, c.hidden, c.vocab, {
            "generator": "tools/train_tiny/train_tiny.py", "model": args.name, "seed": "",
            "created_at": created, "git_sha": sha, "config": json.dumps(run_cfg, indent=1)})
        log(f"trace: {trace_path}: {len(sequences)} sequences x ({args.prompt_len} + {args.gen_len})"
            + ("" if cat is None else f" ({time.monotonic() - t_phase:.1f}s)"))
        try:  # cosmetic: never let it end the run
            log("trace: sequence 0 continues with: "
                + repr(tok.decode(sequences[0][0][args.prompt_len:][:64])[:200]))
        except Exception as e:  # noqa: BLE001
            log(f"trace: (sample not decodable: {e})")
        traces[trace_name] = (cat, prompts, sequences)

    def trace_meta(name, prompts, sequences):
        return {"file": name, "sequences": len(sequences), "prompt_len": args.prompt_len,
                "gen_len": args.gen_len, "prompts": [{"file": n, "token_offset": s} for n, s, _ in prompts],
                "numerics": "BF16 at the ops.hpp rounding points, CPU, greedy (lowest id on ties)"}

    if args.corpus_roots:
        what = (f"{args.name}: a GLM-5.3-Flash-shaped target ({args.trunk_layers} DSA + MoE trunk blocks) and its "
                f"MTP layer at {preset_name}, trained jointly on Python sources (code) and documentation (prose)")
        corpus = {**corpus_meta, "train_files": len(train_files), "train_tokens": int(len(train_stream)),
                  "heldout_tokens": {cat: int(len(h)) for cat, h in held_streams.items()}}
        trace_info = {name: {"category": cat, **trace_meta(name, pr, sq)} for name, (cat, pr, sq) in traces.items()}
    else:
        what = "tiny GLM-5.3-Flash-shaped target (2 DSA + MoE trunk blocks) and its MTP layer, trained jointly"
        corpus = {"dir": str(args.corpus), "glob": "*.py (not recursive)", "sha256": corpus_sha,
                  "licence": "Python Software Foundation License Version 2 (CPython standard library sources)",
                  "train_files": len(train_files), "heldout_files": [n for n, _ in held_by_cat[None]],
                  "train_tokens": int(len(train_stream)), "heldout_tokens": int(len(held_streams[None]))}
        trace_info = trace_meta("trace.h5", traces["trace.h5"][1], traces["trace.h5"][2])
    meta = {
        "what": what,
        "created_at": created,
        "git_sha": sha,
        "argv": sys.argv,
        "args": {k: str(v) for k, v in vars(args).items()},
        "versions": versions(),
        "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else platform.processor() or "cpu",
        "corpus": corpus,
        "tokenizer": {"kind": tok.kind, "vocab": c.vocab, "eot_id": int(tok.eot),
                      "sha256": A.sha256_bytes(tok_json.encode())},
        "model": {"preset": str(args.preset), "trunk_layers": args.trunk_layers,
                  "trunk_residual": "plain (no hyper-connections), like the MTP layer",
                  "mtp_hidden_fed": "target post-final-norm hidden (hnorm input)",
                  "mtp_hidden_recycled_when_chaining": "post-shared_head.norm output y",
                  "indexer": "trained with a KL loss to the dense attention's per-pool mass (inputs detached)",
                  "router_bias": "auxiliary-loss-free load balancing, sign update per step"},
        "training": train_summary,
        ("traces" if args.corpus_roots else "trace"): trace_info,
        "oracle": {"status": "not run yet"},
        "files": {},
    }
    if args.corpus_roots:
        meta["name"] = args.name
        meta["model"]["checkpoint"] = ("embedding, lm_head and the MTP layer only (the trunk is not shipped)"
                                       if args.no_trunk_in_checkpoint else "every tensor, trunk included")
    # With --corpus-roots the step records are gzipped (two traces of a larger model: the data folder
    # has a size budget).
    steps_name = "oracle_steps.json.gz" if args.corpus_roots else "oracle_steps.json"
    file_names = ["model.safetensors", yaml_name, "tokenizer.json", *traces, steps_name]
    if args.corpus_roots:
        file_names.append("corpus-manifest.tsv.gz")

    def write_meta():
        for name in file_names:
            if (args.out / name).exists():
                b = (args.out / name).read_bytes()
                meta["files"][name] = {"bytes": len(b), "sha256": A.sha256_bytes(b)}
        meta["wall_seconds"] = time.monotonic() - T0
        A.write_atomic(args.out / "meta.json", json.dumps(meta, indent=1).encode())

    write_meta()  # a run cut short in the oracle still leaves its provenance

    # Oracle: replay each trace as written (read back: the stored BF16 hiddens).
    t_phase = time.monotonic()
    if args.oracle_jobs > 1:
        jobs = [(str(st_path), str(args.out / yaml_name), str(args.out / name), k, args.context)
                for name in traces for k in ks]
        log(f"oracle: {len(jobs)} replays on {min(args.oracle_jobs, len(jobs))} process(es)")
        done = oracle_parallel(args, jobs)
        results = {name: {k: done[(name, k)] for k in ks} for name in traces}
    else:
        results = {name: oracle_for_trace(p, c, args, ks, args.out / name) for name in traces}
    per_trace, steps_per_trace = {}, {}
    for name, by_k in results.items():
        oracle, steps_out = {}, {}
        label = "" if len(traces) == 1 and name == "trace.h5" else f" {name}"
        for k in ks:
            summ, records, ties, seconds = by_k[k]
            summ["draft_logit_ties"] = ties
            oracle[f"k{k}"] = summ
            steps_out[f"k{k}"] = records
            log_oracle(log, label, k, summ, ties, seconds)
        if args.oracle_subset > 0:
            n = min(args.oracle_subset, len(traces[name][2]))
            oracle["subset"] = {"sequences": n, **{f"k{k}": R.summary_of_records(by_k[k][1], k, n) for k in ks}}
            for k in ks:
                sub = oracle["subset"][f"k{k}"]
                log(f"oracle{label} k={k}, first {n} sequences: acceptance {sub['acceptance_rate']:.4f}  "
                    f"tau {sub['tau']:.3f}  ({sub['steps']} steps)")
        per_trace[name], steps_per_trace[name] = oracle, steps_out
    if args.corpus_roots:
        log(f"oracle: {time.monotonic() - t_phase:.1f}s")
    columns = "sequence, L, accepted, drafts[k], targets[k]"
    rules = {"rules": "lib/harness/replay.hpp; draft_rows rewrite; context_rows cache_only; head_sharding none; "
                      "head_fp8 off; BF16 numerics at the ops.hpp rounding points (CPU)",
             "definitions": "rate = accepted/drafted; tau = 1 + accepted/steps; per_position[i] = P(a >= i+1)"}
    if args.corpus_roots:
        A.write_atomic(args.out / steps_name,
                       gzip.compress(json.dumps({"columns": columns, **steps_per_trace}).encode(), mtime=0))
        meta["oracle"] = {**rules, "traces": per_trace}
    else:
        A.write_atomic(args.out / "oracle_steps.json",
                       json.dumps({"columns": columns, **steps_per_trace["trace.h5"]}).encode())
        meta["oracle"] = {**rules, **per_trace["trace.h5"]}
    write_meta()
    log(f"done in {time.monotonic() - T0:.0f}s: {args.out}")
    return 0


if __name__ == "__main__":
    A.run_main(main)
