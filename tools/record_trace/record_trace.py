#!/usr/bin/env python3
"""Records an mtplab trace (docs/trace-format.md) from any transformers causal LM.

For each prompt of a JSONL file (`{"prompt": "..."}`, or `{"messages": [...]}` rendered with the
tokenizer's chat template) the target continues for --max-new-tokens, greedily or by sampling
(temperature, top-k, top-p, seeded), and the post-final-norm hidden of every position is stored:
hiddens[t] is the state after consuming tokens[t], the one the target's head turned into
tokens[t + 1] (the row convention of docs/trace-format.md).

Invariants:
- The hidden is checked, on every forward, to be what the model's own lm_head turns into the
  model's logits (logits from the stored hidden equal the model's, to BF16 rounding, and have the
  same argmax wherever the top two are apart); a model whose last hidden_states entry is not the
  head's input (a pre-norm output, several residual streams, post-processed logits) is refused
  with the numbers, never recorded.
- Decoding is incremental with the model's cache: each stored hidden is exactly the one the next
  token was chosen from. Greedy takes the argmax (lowest id on ties); sampling draws from
  softmax(logits / T) truncated by top-k then top-p, sequence i with its own generator seeded
  with seed * 1000003 + i, so a sequence does not depend on the others.
- The trace's attributes say how it was made: sampling ("greedy" | "sampling"), temperature,
  top_k, top_p, sampling_seed, and the provenance (model path, transformers and torch versions,
  date, the command line, the prompts file and its sha256, the checks' results).

  python3 tools/record_trace/record_trace.py --model /ckpt/GLM-5.3-Flash --prompts prompts.jsonl \\
      --out trace.h5 --max-new-tokens 256 [--sampling sampling --temperature 0.7 --top-p 0.95 --seed 1]

tools/record_trace/README.md has every option.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trace_h5  # noqa: E402  (h5py + numpy only)

GENERATOR = "tools/record_trace"
# Logits from the stored hidden through lm_head must match the model's within this fraction of the
# largest |logit|: a few BF16 ulps (2^-8 relative each) cover GEMM-shape differences; a wrong hidden
# (pre-norm, one of several streams) misses by O(1).
LOGIT_RTOL = 1.0 / 64


def fail(msg: str) -> None:
    print(f"record_trace: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def log(msg: str) -> None:
    print(msg, flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="checkpoint directory (or hub name already in the cache)")
    p.add_argument("--tokenizer", help="tokenizer directory (default: --model)")
    p.add_argument("--prompts", required=True, help="JSONL: one {\"prompt\": str} or {\"messages\": [...]} per line")
    p.add_argument("--out", required=True, help="trace file to write (.h5)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--sampling", choices=["greedy", "sampling"], default="greedy")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling only; > 0")
    p.add_argument("--top-k", type=int, default=0, help="sampling only; 0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="sampling only; in (0, 1], 1 = off")
    p.add_argument("--seed", type=int, default=0, help="sampling only; sequence i uses seed * 1000003 + i")
    p.add_argument("--dtype", choices=["bf16", "f32"], default="bf16",
                   help="storage of /hiddens (bf16: what the drafter reads; f32: the model's values exactly)")
    p.add_argument("--torch-dtype", choices=["auto", "bfloat16", "float16", "float32"], default="auto",
                   help="the model's compute dtype (auto: the checkpoint's)")
    p.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda when available)")
    p.add_argument("--device-map", default=None, help="passed to from_pretrained (e.g. auto, to spread a large model)")
    p.add_argument("--attn-implementation", default=None, help="passed to from_pretrained (eager, sdpa, ...)")
    p.add_argument("--hidden-source", choices=["hidden_states", "lm_head_input"], default="hidden_states",
                   help="the last output_hidden_states entry, or the lm_head's input captured by a hook")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    p.add_argument("--no-cache", action="store_true",
                   help="recompute the whole sequence at each step (for models whose cache misbehaves)")
    p.add_argument("--no-special-tokens", action="store_true", help="tokenize prompts without BOS / special tokens")
    p.add_argument("--limit", type=int, default=0, help="only the first N prompts")
    p.add_argument("--trust-remote-code", action="store_true")
    a = p.parse_args(argv)
    if a.max_new_tokens < 1:
        p.error("--max-new-tokens must be >= 1")
    if a.sampling == "sampling":
        if not (math.isfinite(a.temperature) and a.temperature > 0):
            p.error("--temperature must be > 0")
        if a.top_k < 0:
            p.error("--top-k must be >= 0 (0 = off)")
        if not 0 < a.top_p <= 1:
            p.error("--top-p must be in (0, 1]")
    elif (a.temperature, a.top_k, a.top_p, a.seed) != (1.0, 0, 1.0, 0):
        p.error("--temperature / --top-k / --top-p / --seed need --sampling sampling")
    return a


def read_prompts(path: str, limit: int):
    """[(index, kind, value)] from the JSONL file; an error names the line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                fail(f"{path}:{n}: not JSON ({e})")
            if not isinstance(obj, dict) or ("prompt" in obj) == ("messages" in obj):
                fail(f"{path}:{n}: each line needs exactly one of \"prompt\" (a string) or \"messages\" (a list)")
            if "prompt" in obj:
                if not isinstance(obj["prompt"], str):
                    fail(f"{path}:{n}: \"prompt\" must be a string")
                out.append((n, "prompt", obj["prompt"]))
            else:
                if not isinstance(obj["messages"], list) or not obj["messages"]:
                    fail(f"{path}:{n}: \"messages\" must be a non-empty list of {{role, content}}")
                out.append((n, "messages", obj["messages"]))
            if limit and len(out) == limit:
                break
    if not out:
        fail(f"{path}: no prompts")
    return out


def git_sha() -> str:
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return f"{sha}-dirty" if sha and dirty else sha
    except (OSError, subprocess.SubprocessError):
        return ""


def load(args, torch, transformers):
    """The model (the class its config names, else AutoModelForCausalLM) and its tokenizer."""
    kw = {"trust_remote_code": args.trust_remote_code}
    if args.torch_dtype != "auto":
        kw["dtype"] = getattr(torch, args.torch_dtype)
    else:
        kw["dtype"] = "auto"
    if args.device_map:
        kw["device_map"] = args.device_map
    if args.attn_implementation:
        kw["attn_implementation"] = args.attn_implementation
    config = transformers.AutoConfig.from_pretrained(args.model, trust_remote_code=args.trust_remote_code)
    archs = getattr(config, "architectures", None) or []
    cls = getattr(transformers, archs[0], None) if archs else None
    if cls is None:
        cls = transformers.AutoModelForCausalLM
    try:
        model = cls.from_pretrained(args.model, **kw)
    except TypeError:  # older transformers: torch_dtype
        kw["torch_dtype"] = kw.pop("dtype")
        model = cls.from_pretrained(args.model, **kw)
    if not args.device_map:
        model.to(args.device)
    model.eval()
    tok = transformers.AutoTokenizer.from_pretrained(args.tokenizer or args.model,
                                                     trust_remote_code=args.trust_remote_code)
    return model, tok, cls.__name__


def prompt_ids(tok, kind, value, args):
    if kind == "prompt":
        ids = tok(value, add_special_tokens=not args.no_special_tokens)["input_ids"]
    else:
        if not getattr(tok, "chat_template", None):
            fail("the tokenizer has no chat template: give \"prompt\" strings, or a tokenizer that has one")
        ids = tok.apply_chat_template(value, add_generation_prompt=True, tokenize=True, return_dict=False)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return [int(x) for x in ids]


class Target:
    """Runs the model one forward at a time and hands back (hidden [T, H], logits [T, V]), checked."""

    def __init__(self, model, args, torch):
        self.model, self.args, self.torch = model, args, torch
        self.head = model.get_output_embeddings()
        if self.head is None:
            fail("the model has no output embeddings (lm_head): not a causal LM")
        cfg = model.config
        text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        self.hidden_size = int(getattr(text_cfg, "hidden_size"))
        self.vocab = int(self.head.weight.shape[0])
        self.captured = None
        if args.hidden_source == "lm_head_input":
            self.head.register_forward_pre_hook(self._capture)
        self.checks = {"forwards": 0, "positions": 0, "max_rel_logit_diff": 0.0, "argmax_checked": 0}
        self.cache = None

    def _capture(self, _module, inputs):
        self.captured = inputs[0]

    @property
    def device(self):
        return self.head.weight.device

    def forward(self, ids, use_cache: bool):
        torch = self.torch
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        kw = {"output_hidden_states": self.args.hidden_source == "hidden_states", "return_dict": True}
        if use_cache:
            kw["use_cache"] = True
            if self.cache is not None:
                kw["past_key_values"] = self.cache
        else:
            kw["use_cache"] = False
        with torch.no_grad():
            out = self.model(input_ids=x, **kw)
        if use_cache:
            self.cache = out.past_key_values
        if self.args.hidden_source == "hidden_states":
            states = getattr(out, "hidden_states", None)
            if not states:
                fail("the model returned no hidden_states for output_hidden_states=True "
                     "(try --hidden-source lm_head_input)")
            h = states[-1]
        else:
            h = self.captured
        logits = out.logits
        self.check(h, logits, len(ids))
        return h[0], logits[0]

    def check(self, h, logits, T):
        torch = self.torch
        if h is None or tuple(h.shape) != (1, T, self.hidden_size):
            fail(f"the hidden ({self.args.hidden_source}) has shape {None if h is None else tuple(h.shape)}, "
                 f"expected (1, {T}, {self.hidden_size}): it is not one post-norm state per position "
                 f"(try --hidden-source lm_head_input)")
        if tuple(logits.shape[:2]) != (1, T):
            fail(f"the model returned logits of shape {tuple(logits.shape)} for {T} positions")
        with torch.no_grad():
            again = self.head(h)
        ref = logits.float()
        diff = (again.float() - ref).abs().max().item()
        scale = max(ref.abs().max().item(), 1e-6)
        rel = diff / scale
        # The argmax must agree wherever the top two are clearly apart.
        top2 = ref.topk(2, dim=-1).values
        clear = (top2[..., 0] - top2[..., 1]) > 4 * LOGIT_RTOL * scale
        agree = (again.float().argmax(-1) == ref.argmax(-1)) | ~clear
        if rel > LOGIT_RTOL or not bool(agree.all()):
            fail(f"logits from the stored hidden through the model's own lm_head differ from the model's "
                 f"logits: max |diff| {diff:.4g} = {rel:.3g} of the largest |logit| (tolerance {LOGIT_RTOL}), "
                 f"argmax disagreements at clear margins: {int((~agree).sum())}. The "
                 f"{self.args.hidden_source} tensor is not the input of the head (a pre-norm output, several "
                 f"residual streams, or logits post-processed after the head): such a trace would be wrong. "
                 f"Try --hidden-source lm_head_input, or check the model's forward.")
        c = self.checks
        c["forwards"] += 1
        c["positions"] += T
        c["max_rel_logit_diff"] = max(c["max_rel_logit_diff"], rel)
        c["argmax_checked"] += int(clear.sum())

    def reset(self):
        self.cache = None


def truncate(logits, args, torch):
    """softmax(logits / T) support after top-k then top-p, ties at either threshold kept (as
    mtplab's replay truncates, docs/acceptance.md): top-k keeps every logit >= the k-th largest;
    top-p then keeps the largest logits down to the first whose cumulative mass reaches top_p."""
    x = logits.double() / args.temperature
    if 0 < args.top_k < x.shape[-1]:
        kth = torch.topk(x, args.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if args.top_p < 1.0:
        sorted_x, _ = torch.sort(x, descending=True)
        cum = torch.softmax(sorted_x, dim=-1).cumsum(-1)
        m = min(int((cum < args.top_p).sum().item()) + 1, x.shape[-1])
        x = x.masked_fill(x < sorted_x[m - 1], float("-inf"))
    return x


def choose(logits_row, args, gen, torch):
    if args.sampling == "greedy":
        return int(torch.argmax(logits_row.float()).item())  # the first maximum: lowest id on ties
    probs = torch.softmax(truncate(logits_row, args, torch), dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen).item())


def bf16_effect(h, head, next_tokens, args, torch, stats, rows=256):
    """What rounding the stored hidden to BF16 changes on the target side: logits through the head
    in fp32 from h and from bf16(h); argmax flips, the largest logit change, and the change of
    log p(next token) at the trace's temperature (1 for greedy). In chunks of `rows` positions."""
    T = args.temperature if args.sampling == "sampling" else 1.0
    with torch.no_grad():
        w = head.weight.float()
        for r0 in range(0, h.shape[0], rows):
            hf = h[r0:r0 + rows].float()
            a = hf @ w.T
            b = hf.to(torch.bfloat16).float() @ w.T
            stats["positions"] += int(a.shape[0])
            stats["argmax_flips"] += int((a.argmax(-1) != b.argmax(-1)).sum())
            stats["max_abs_logit_change"] = max(stats["max_abs_logit_change"], float((a - b).abs().max()))
            nxt = next_tokens[r0:r0 + rows]
            if not nxt:
                continue
            n = len(nxt)
            idx = torch.tensor(nxt, device=a.device)[:, None]
            d = (torch.log_softmax(a[:n] / T, -1).gather(1, idx) - torch.log_softmax(b[:n] / T, -1).gather(1, idx)).abs()
            stats["sum_abs_dlogp"] += float(d.sum())
            stats["max_abs_dlogp"] = max(stats["max_abs_dlogp"], float(d.max()))
            stats["dlogp_count"] += n


def main(argv=None):
    args = parse_args(argv if argv is not None else sys.argv[1:])
    prompts = read_prompts(args.prompts, args.limit)
    try:
        import torch
        import transformers
    except ImportError as e:
        fail(f"needs torch and transformers ({e})")
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None

    t0 = time.time()
    model, tok, cls_name = load(args, torch, transformers)
    target = Target(model, args, torch)
    eos = set()
    if not args.ignore_eos:
        for src in (getattr(model, "generation_config", None), model.config):
            e = getattr(src, "eos_token_id", None) if src is not None else None
            if e is not None:
                eos.update(e if isinstance(e, (list, tuple)) else [e])
    log(f"record_trace: {cls_name} from {args.model} ({next(model.parameters()).dtype}, {target.device}), "
        f"hidden {target.hidden_size}, vocab {target.vocab}, {len(prompts)} prompt(s), "
        f"{args.sampling}, up to {args.max_new_tokens} new tokens, hiddens stored {args.dtype}; "
        f"loaded in {time.time() - t0:.1f} s")

    sampling_attrs = {"sampling": args.sampling}
    if args.sampling == "sampling":
        sampling_attrs.update(temperature=float(args.temperature), top_k=int(args.top_k),
                              top_p=float(args.top_p), sampling_seed=int(args.seed))
    prompts_sha = hashlib.sha256(Path(args.prompts).read_bytes()).hexdigest()
    created = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    command = " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv])
    provenance_attrs = {
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "command_line": command, "prompts_file": os.path.abspath(args.prompts), "prompts_sha256": prompts_sha,
        "model_class": cls_name, "model_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "hidden_source": args.hidden_source, "max_new_tokens": int(args.max_new_tokens),
    }
    writer = trace_h5.TraceWriter(
        args.out, target.hidden_size, target.vocab, dtype=args.dtype,
        provenance={"generator": GENERATOR, "model": os.path.abspath(args.model) if os.path.exists(args.model)
                    else args.model, "seed": "", "created_at": created, "git_sha": git_sha()},
        attrs={**sampling_attrs, **provenance_attrs})
    effect = {"positions": 0, "argmax_flips": 0, "max_abs_logit_change": 0.0, "sum_abs_dlogp": 0.0,
              "max_abs_dlogp": 0.0, "dlogp_count": 0}
    bar = tqdm(total=len(prompts), unit="prompt") if tqdm else None
    total_new = 0
    try:
        for i, (line, kind, value) in enumerate(prompts):
            ids = prompt_ids(tok, kind, value, args)
            if len(ids) < 2:
                fail(f"{args.prompts}:{line}: the prompt has {len(ids)} token(s); a trace needs at least 2 "
                     "(drafter row 0 pairs token 1 with hidden 0)")
            if max(ids) >= target.vocab:
                fail(f"{args.prompts}:{line}: token id {max(ids)} is outside the head's vocab {target.vocab}")
            gen = None
            if args.sampling == "sampling":
                gen = torch.Generator(device=target.device)
                gen.manual_seed((args.seed * 1000003 + i) % (2**63))
            ts = time.time()
            tokens = list(ids)
            target.reset()
            h, logits = target.forward(ids, use_cache=not args.no_cache)
            hiddens = [h]
            for _ in range(args.max_new_tokens):
                nxt = choose(logits[-1], args, gen, torch)
                tokens.append(nxt)
                if args.no_cache:
                    h, logits = target.forward(tokens, use_cache=False)
                    hiddens = [h]
                else:
                    h, logits = target.forward([nxt], use_cache=True)
                    hiddens.append(h)
                if nxt in eos:
                    break
            H = torch.cat(hiddens, 0)
            assert H.shape[0] == len(tokens)
            bf16_effect(H, target.head, tokens[1:], args, torch, effect)
            writer.add(tokens, H.float().cpu().numpy(), len(ids))
            new = len(tokens) - len(ids)
            total_new += new
            rate = new / max(time.time() - ts, 1e-9)
            if bar:
                bar.set_postfix_str(f"{len(ids)}+{new} tokens, {rate:.1f} tok/s")
                bar.update(1)
            else:
                log(f"prompt {i + 1}/{len(prompts)} (line {line}): {len(ids)} prompt + {new} new tokens, "
                    f"{rate:.1f} tok/s")
        checks = dict(target.checks)
        effect["mean_abs_dlogp"] = effect["sum_abs_dlogp"] / max(effect["dlogp_count"], 1)
        writer.set_attr("hidden_check", json.dumps({"lm_head_check": checks, "bf16_effect": effect}))
        writer.set_attr("config", json.dumps({**provenance_attrs, **sampling_attrs, "dtype": args.dtype,
                                              "device": str(target.device)}, indent=1))
        writer.commit()
    except BaseException:
        writer.abandon()
        raise
    finally:
        if bar:
            bar.close()
    log(f"record_trace: wrote {args.out}: {len(prompts)} sequence(s), {total_new} generated tokens, "
        f"{time.time() - t0:.1f} s")
    log(f"record_trace: lm_head check: {checks['forwards']} forwards, {checks['positions']} positions, "
        f"max |logit diff| {checks['max_rel_logit_diff']:.3g} of max |logit|, "
        f"{checks['argmax_checked']} argmaxes at clear margins agree")
    log(f"record_trace: BF16 rounding of the hidden (target side, fp32 head): {effect['argmax_flips']} argmax "
        f"flips in {effect['positions']} positions, max |logit change| {effect['max_abs_logit_change']:.3g}, "
        f"|d log p(next)| mean {effect['mean_abs_dlogp']:.3g} max {effect['max_abs_dlogp']:.3g}")


if __name__ == "__main__":
    main()
