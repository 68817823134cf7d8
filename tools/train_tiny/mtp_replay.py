"""The acceptance oracle: replays an mtplab trace with the PyTorch MTP layer under mtplab's replay
rules (lib/harness/replay.hpp, lib/drafter/drafter.hpp), in BF16 numerics (glm_tiny.Numerics).

For a sequence with tokens t_0..t_{N-1}, target hiddens h_0..h_{N-1} and prompt length P:
  prefill   context rows 0 .. P-2 = (embed(t_{r+1}), h_r), cache-only
  L = P; while L + k <= N - 1:
    propose   k chained drafts from (t_L, h_{L-1}) at rows L-1 ..: draft i+1 feeds (d_i, y_i),
              y = the post-shared_head.norm output
    verify    a = longest prefix with d_i == t_{L+i}
    after_verify(a), draft_rows = rewrite: keep the first (true-hidden) row, trim the rest
    catch-up  rows L .. L+a-1 from the true hiddens, cache-only
    L += a + 1
Statistics as vLLM defines them (harness::AcceptanceStats): rate = accepted / drafted,
tau = 1 + accepted / steps, per-position r_i = P(a >= i).

Invariant: the caches hold exactly what the C++ drafter's hold at every step (rows are dense,
row r = position r, a context row writes the same cache entries as a full forward of it), so the
drafts are the same function; only summation order differs (see docs/trained-tiny.md).
"""

from __future__ import annotations

import torch

import glm_tiny as G


def bf16_ulp(x: float) -> float:
    """The spacing of BF16 values at |x| (8 significant bits)."""
    import math
    ax = abs(x)
    if ax == 0.0:
        return 2.0 ** -133
    return 2.0 ** (math.floor(math.log2(ax)) - 7)


class AcceptanceStats:
    def __init__(self, k: int):
        self.k = k
        self.steps = 0
        self.drafted = 0
        self.accepted = 0
        self.at_least = [0] * k

    def add(self, a: int) -> None:
        self.steps += 1
        self.drafted += self.k
        self.accepted += a
        for i in range(a):
            self.at_least[i] += 1

    def summary(self) -> dict:
        return {
            "k": self.k,
            "steps": self.steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "tau": 1.0 + self.accepted / self.steps if self.steps else 0.0,
            "per_position": [n / self.steps if self.steps else 0.0 for n in self.at_least],
        }


@torch.no_grad()
def replay(p: dict, c: G.TinyConfig, sequences, k: int, max_rows: int, log=None):
    """sequences: list of (tokens int64 [N], hiddens fp32 [N, H] holding BF16 values, prompt length).
    Returns (summary dict, step records [seq, L, a, drafts..., targets...], near-tie counts)."""
    nx = G.Numerics(bf16=True)
    stats = AcceptanceStats(k)
    records = []
    deciding = 0      # drafts whose value decides a (drafts 1 .. min(a + 1, k))
    near_ties = 0     # of those, how many had a runner-up logit within 1 BF16 ulp of the top
    exact_ties = 0    # ... and how many an exact BF16 tie (lowest id won)
    for s, (tokens, hiddens, P) in enumerate(sequences):
        N = len(tokens)
        tok = torch.as_tensor(tokens, dtype=torch.long)
        hid = torch.as_tensor(hiddens, dtype=torch.float32)
        # Every true row's front, once: row r = (embed(t_{r+1}), h_r), r = 0 .. N-2.
        x0_true = G.mtp_front(p, c, tok[1:N].unsqueeze(0), hid[: N - 1].unsqueeze(0), nx)[0]
        st = G.BlockState(p, c.mtp_prefix, c, nx, 1, max_rows)
        st.append_context_rows(x0_true[: P - 1].unsqueeze(0))
        L = P
        while L + k <= N - 1:
            start = st.rows
            assert start == L - 1, (start, L)
            drafts, gaps = [], []
            x0 = x0_true[L - 1]
            for i in range(k):
                x1 = st.forward_rows(x0.reshape(1, 1, -1)).reshape(-1)
                y = G.rmsnorm(x1, p[c.mtp_prefix + "shared_head.norm.weight"], c.rms_norm_eps, nx)
                logits = G.head_logits(p, c, y, nx)
                d = int(torch.argmax(logits))  # first maximum: the lowest id wins a tie
                top2 = torch.topk(logits, 2).values
                gaps.append((float(top2[0]), float(top2[1])))
                drafts.append(d)
                if i + 1 < k:
                    x0 = G.mtp_front(p, c, torch.tensor(d), y, nx)
            targets = [int(t) for t in tokens[L + 1: L + 1 + k]]
            a = 0
            while a < k and drafts[a] == targets[a]:
                a += 1
            for top, second in gaps[: min(a + 1, k)]:
                deciding += 1
                if top - second <= bf16_ulp(top):
                    near_ties += 1
                if top == second:
                    exact_ties += 1
            # after_verify, draft_rows = rewrite: only the first row (built from the true hidden) stays.
            st.rows = start + 1
            # Catch-up: rows start+1 .. L+a-1 from the true hiddens.
            st.append_context_rows(x0_true[st.rows: L + a].unsqueeze(0))
            stats.add(a)
            records.append([s, L, a] + drafts + targets)
            L += a + 1
        if log:
            log(f"  oracle k={k}: sequence {s} done ({stats.steps} steps so far)")
    ties = {"deciding_drafts": deciding, "near_ties_within_1_ulp": near_ties, "exact_bf16_ties": exact_ties}
    return stats.summary(), records, ties


def summary_of_records(records, k: int, sequences: int) -> dict:
    """The summary of the steps of the first `sequences` sequences (records as replay() returns)."""
    stats = AcceptanceStats(k)
    for rec in records:
        if rec[0] < sequences:
            stats.add(rec[2])
    return stats.summary()


def replay_job(job):
    """replay() in a worker process: job = (checkpoint, model config, trace, k, max_rows); the weights are
    read back from the checkpoint (BF16 values, the fp32 tensors as stored: what the writer held).
    Returns (summary, records, near-tie counts, seconds)."""
    import time
    from pathlib import Path

    import artifacts as A

    torch.set_num_threads(1)
    torch.set_float32_matmul_precision("highest")
    checkpoint, config, trace, k, max_rows = job
    c = G.parse_preset(Path(config).read_text(), config)
    p = G.round_to_bf16({n: t.float() for n, t in A.read_safetensors(Path(checkpoint)).items()})
    seqs = A.read_trace(Path(trace))
    t = time.monotonic()
    summ, records, ties = replay(p, c, seqs, k, max_rows)
    return summ, records, ties, time.monotonic() - t
