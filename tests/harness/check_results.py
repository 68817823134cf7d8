"""Checks a results file written by `mtplab run` (docs/results-schema.md) with the analysis reader.

    check_results.py FILE --points N     every point present and consistent
                                         (a file written by `mtplab upgrade` may lack the columns
                                         that its old file lacked: steps/stats_ms, steps/batch_experts)
    check_results.py FILE --at-most N    a file left by an interrupted run: valid, 1..N-1 points
    check_results.py FILE --points N --sharding-invariant
        also: points that differ only in head_sharding or context_rows have identical drafts
    check_results.py FILE --points N --sampling [--reference OTHER]
        also: sampling verification (docs/acceptance.md): across head_sharding and batch_size the
        same accepted counts and (to fp32 summation order) acceptance probabilities; with
        --reference (the same experiment on another rank count) the steps agree wherever the
        acceptance probabilities do
    check_results.py FILE --points N --qidx
        also: the batch_qidx selection check (CPU run): counted on every context row where
        batch_qidx applies (context_rows full), with no difference (the CPU's batched linear is
        the per-row one); absent, and batch_qidx in arms_not_applied, at context_rows cache_only
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "analysis"))
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import mtplab_results as mr  # noqa: E402

failures = []
MASK = (1 << 64) - 1


def _mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def verify_uniform(seed, sequence, position):
    """harness::verify_uniform (lib/harness/replay.hpp), as docs/acceptance.md states it."""
    h = _mix((seed & MASK) ^ 0x6D74706C61622D76)
    h = _mix(h ^ ((sequence * 0x9E3779B97F4A7C15) & MASK))
    h = _mix(h ^ ((position * 0xD1B54A32D192ED03) & MASK))
    return (h >> 11) * 2.0 ** -53


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def check_point(res, name):
    g = res.group(name)
    s = res.steps(name)
    # The schema's promise: the step columns read as one table.
    steps_group = g["steps"]
    df = pd.DataFrame({k: steps_group[k][()] for k in steps_group})
    check(len(df) == len(s) and len(df) > 0, f"{name}: steps table has {len(df)} rows")
    upgraded = "upgraded_from" in res.attrs
    for c in mr.TIMING_COLUMNS:
        if c == "stats_ms" and upgraded and c not in df.columns:
            continue  # upgraded from a file written before the stats pass had its own column
        check(c in df.columns, f"{name}: steps/{c} missing")
        if c in df.columns:
            check(bool((df[c] >= 0).all()), f"{name}: negative {c}")
    k = int(g.attrs["draft_len"])
    drafts, targets = res.drafts(name), res.targets(name)
    check(drafts.shape == (len(df), k) and targets.shape == (len(df), k), f"{name}: drafts {drafts.shape}")
    # Greedy verification (or a greedy proposal): accepted = longest prefix of drafts equal to
    # targets, and a_i = [draft == target]. Sampling verification: accepted = the drafts before the
    # first coin u(seed, sequence, L + i) >= a_i.
    verify = mr._s(g.attrs["verify"])
    proposal = mr._s(g.attrs["draft_proposal"])
    eq = drafts == targets
    prefix = np.where(eq.all(axis=1), k, np.argmin(eq, axis=1))
    ap = g["accept_prob"][()]
    check(ap.shape == (len(df), k) and ap.dtype == np.float32, f"{name}: accept_prob {ap.shape} {ap.dtype}")
    if verify == "greedy" or proposal == "greedy":
        check(bool((prefix == df["accepted"].values).all()), f"{name}: accepted is not the matching prefix")
        check(bool(((ap == 1) == eq).all() and ((ap == 0) | (ap == 1)).all()), f"{name}: accept_prob is not [d == t]")
    if verify == "sampling":
        seed = int(g.attrs["sampling_seed"])
        coins = np.array([[verify_uniform(seed, int(sq), int(L) + 1 + i) for i in range(k)]
                          for sq, L in zip(df["sequence"].values, df["position"].values)]).reshape(len(df), k)
        passed = coins < ap.astype(np.float64)
        by_coins = np.where(passed.all(axis=1), k, np.argmin(passed, axis=1))
        check(bool((by_coins == df["accepted"].values).all()), f"{name}: accepted does not follow the coins")
        check(bool(((ap >= 0) & (ap <= 1)).all()), f"{name}: accept_prob outside [0, 1]")
    expected = np.cumprod(ap.astype(np.float64), axis=1).sum(axis=1)
    check(np.allclose(expected, df["expected_accepted"].values, rtol=1e-6, atol=1e-6), f"{name}: steps/expected_accepted")
    r0 = df[df["repeat"] == 0]
    e0 = df["expected_accepted"].values[(df["repeat"] == 0).values]
    check(abs(float(g.attrs["expected_tau"]) - (1 + e0.mean())) < 1e-9, f"{name}: expected_tau")
    check(abs(float(g.attrs["expected_acceptance_rate"]) - e0.sum() / (k * len(e0))) < 1e-9,
          f"{name}: expected_acceptance_rate")
    if verify == "greedy":
        check(float(g.attrs["expected_tau"]) == float(g.attrs["tau"]), f"{name}: greedy expected_tau != tau")
    steps = int(g.attrs["steps"])
    check(steps == len(r0), f"{name}: steps attr {steps} vs {len(r0)} repeat-0 rows")
    acc = r0["accepted"].values
    check(abs(float(g.attrs["acceptance_rate"]) - acc.sum() / (k * len(acc))) < 1e-12, f"{name}: acceptance_rate")
    check(abs(float(g.attrs["tau"]) - (1 + acc.mean())) < 1e-12, f"{name}: tau")
    pp = res.per_position(name)
    want = np.array([(acc >= i + 1).mean() for i in range(k)])
    check(np.allclose(pp, want), f"{name}: per_position {pp} vs {want}")
    # The summary median is the median of the measured (non-warm-up) steps.
    # Summaries count each (batched) step once: its first row (every row of a step has its times).
    first_rows = np.concatenate([[True], np.diff(df["batch_step"].values) != 0]) if len(df) else np.array([], bool)
    m = df[(df["warmup"] == 0).values & first_rows]["step_ms"].values
    summ = res.summary(name)
    check(len(m) == 0 or abs(summ.loc["step_ms", "median"] - np.median(m)) < 1e-9, f"{name}: step_ms median")
    check(len(m) == 0 or summ.loc["step_ms", "ci95_lo"] <= summ.loc["step_ms", "median"] <= summ.loc["step_ms", "ci95_hi"],
          f"{name}: CI does not bracket the median")
    check(int(g.attrs["ranks_agree"]) == 1, f"{name}: ranks disagree on drafts")
    check(mr._s(g.attrs["status"]) == "ok", f"{name}: status")
    check_kernels(res, name, g, upgraded)
    # Rows of one batched step share a batch_step; batch_rows counts them.
    bs, rows = df["batch_step"].values, df["batch_rows"].values
    check(bool((np.diff(bs) >= 0).all()), f"{name}: batch_step decreases")
    _, first, counts = np.unique(bs, return_index=True, return_counts=True)
    check(bool((rows[first] == counts).all()), f"{name}: batch_rows is not the rows of its batched step")
    check(int(rows.max(initial=1)) <= int(g.attrs["batch_size"]), f"{name}: a step drafted for more than batch_size")
    check_batch_experts(name, g, df)
    check_uncertainty(res, name, df, k)
    check_draft_stats(res, name, df, k)
    check_replay_mode(res, name, df, k)


def check_kernels(res, name, g, upgraded):
    """kernels: the kernel each op ran, never empty where the run recorded it (an upgraded file's
    says it was not recorded); on the CPU backend every op's is "cpu"."""
    kernels = res.kernels(name)
    if upgraded:
        check(kernels or mr._s(g.attrs["kernels"])[0].startswith("not recorded"), f"{name}: kernels")
        return
    check(len(kernels) > 0, f"{name}: no kernel record ({mr._s(g.attrs['kernels'])})")
    if mr._s(g.attrs["backend"]) == "cpu":
        check(all(v == "cpu" for v in kernels.values()), f"{name}: a CPU point ran {kernels}")


def check_batch_experts(name, g, df):
    """steps/batch_experts: one count per batched step, between the top_k of one row and
    min(E, rows x top_k) (exactly top_k at one row: a row's picks are distinct), 0 under skip: block;
    absent only in a file upgraded from one written before it."""
    if "batch_experts" not in df.columns:
        check("upgraded_from" in res_attrs(g), f"{name}: steps/batch_experts missing")
        return
    cfg = mr.config_dict(g.attrs["config"])
    E, k = int(cfg["model.n_routed_experts"]), int(cfg["model.num_experts_per_tok"])
    ex, rows, bs = df["batch_experts"].values, df["batch_rows"].values, df["batch_step"].values
    _, first, inv = np.unique(bs, return_index=True, return_inverse=True)
    check(bool((ex == ex[first][inv]).all()), f"{name}: batch_experts differs within a batched step")
    if cfg.get("skip", "none") == "block":
        check(bool((ex == 0).all()), f"{name}: batch_experts {sorted(set(ex.tolist()))} under skip: block")
        return
    hi = np.minimum(E, rows * k)
    check(bool(((ex >= k) & (ex <= hi)).all()),
          f"{name}: batch_experts outside [top_k {k}, min(E {E}, rows x top_k)]: {sorted(set(ex.tolist()))[:8]}")
    check(bool((ex[rows == 1] == k).all()), f"{name}: a one-row step with batch_experts != top_k {k}")


def attr_str(g, key):
    return mr._s(g.attrs[key])


def res_attrs(g):
    return g.file.attrs


def check_uncertainty(res, name, df, k):
    """accepted_hist and the bootstrap intervals over sequences, recomputed here with the documented
    algorithm (mtplab_results.bootstrap_ratio_intervals reproduces mtplab's resamples)."""
    g = res.group(name)
    r0 = df[df["repeat"] == 0]
    acc = r0["accepted"].values
    check("accepted_hist" in g.attrs, f"{name}: accepted_hist missing")
    hist = res.accepted_hist(name)
    check(hist.shape == (k + 1,) and bool((hist == np.bincount(acc, minlength=k + 1)).all()),
          f"{name}: accepted_hist {hist} vs the steps' {np.bincount(acc, minlength=k + 1)}")
    for key in ("acceptance_rate_ci", "tau_ci", "bootstrap_seed", "bootstrap_resamples"):
        check(key in g.attrs, f"{name}: {key} missing")
    check(int(g.attrs["bootstrap_seed"]) == mr.acceptance_bootstrap_seed(int(g.attrs["index"])),
          f"{name}: bootstrap_seed {g.attrs['bootstrap_seed']} is not the point's documented seed")
    steps, accepted = {}, {}
    for q, a in zip(r0["sequence"].values, acc):
        steps[q] = steps.get(q, 0.0) + 1
        accepted[q] = accepted.get(q, 0.0) + float(a)
    units = list(steps)
    [(lo, hi)] = mr.bootstrap_ratio_intervals([steps[u] for u in units], [[accepted[u] for u in units]],
                                              int(g.attrs["bootstrap_seed"]), int(g.attrs["bootstrap_resamples"]))
    rate, tau = res.interval(name, "acceptance_rate"), res.interval(name, "tau")
    check(np.allclose(rate, (lo / k, hi / k), rtol=0, atol=1e-12), f"{name}: acceptance_rate_ci {rate} vs {(lo / k, hi / k)}")
    check(np.allclose(tau, (1 + lo, 1 + hi), rtol=0, atol=1e-12), f"{name}: tau_ci {tau} vs {(1 + lo, 1 + hi)}")
    check(tau[0] - 1e-12 <= float(g.attrs["tau"]) <= tau[1] + 1e-12, f"{name}: tau {g.attrs['tau']} outside tau_ci {tau}")
    check(1 <= tau[0] <= tau[1] <= k + 1, f"{name}: tau_ci {tau} outside [1, {k + 1}]")
    # The expected figures' intervals: the same resamples with each sequence's summed expected
    # lengths as a second numerator; the expected tau lies inside its interval.
    check("expected_tau_ci" in g.attrs and "expected_acceptance_rate_ci" in g.attrs,
          f"{name}: expected_tau_ci / expected_acceptance_rate_ci missing")
    expected = {}
    for q, e in zip(r0["sequence"].values, r0["expected_accepted"].values):
        expected[q] = expected.get(q, 0.0) + float(e)
    [_, (elo, ehi)] = mr.bootstrap_ratio_intervals(
        [steps[u] for u in units], [[accepted[u] for u in units], [expected[u] for u in units]],
        int(g.attrs["bootstrap_seed"]), int(g.attrs["bootstrap_resamples"]))
    etau = res.interval(name, "expected_tau")
    erate = res.interval(name, "expected_acceptance_rate")
    check(np.allclose(etau, (1 + elo, 1 + ehi), rtol=0, atol=1e-9), f"{name}: expected_tau_ci {etau} vs {(1 + elo, 1 + ehi)}")
    check(np.allclose(erate, (elo / k, ehi / k), rtol=0, atol=1e-9),
          f"{name}: expected_acceptance_rate_ci {erate} vs {(elo / k, ehi / k)}")
    check(etau[0] - 1e-9 <= float(g.attrs["expected_tau"]) <= etau[1] + 1e-9,
          f"{name}: expected_tau {g.attrs['expected_tau']} outside expected_tau_ci {etau}")


def check_draft_stats(res, name, df, k):
    """draft_margin / draft_logprob: present exactly where the point recorded them, [steps, k],
    margins >= 0, log-probabilities <= 0, and every repeat equal to repeat 0 at the same step."""
    g = res.group(name)
    want = attr_str(g, "record_margins") == "on" and attr_str(g, "skip") != "head"
    m, lp = res.draft_margins(name), res.draft_logprobs(name)
    check((m is not None) == want and (lp is not None) == want, f"{name}: draft_margin present {m is not None}, expected {want}")
    if m is None or lp is None:
        return
    check(m.shape == (len(df), k) and lp.shape == (len(df), k), f"{name}: draft_margin {m.shape}, draft_logprob {lp.shape}")
    check(m.dtype == np.float32 and lp.dtype == np.float32, f"{name}: draft stats are not f32")
    check(bool(np.isfinite(m).all() and (m >= 0).all()), f"{name}: a margin is negative or not finite")
    check(bool(np.isfinite(lp).all() and (lp <= 0).all()), f"{name}: a log-probability is positive or not finite")
    # Draft 1's head input is the same in every arm that leaves the block alone; here only the
    # repeats' agreement is checked (the CPU is deterministic).
    first = {}
    for i, (q, p, rep) in enumerate(zip(df["sequence"].values, df["position"].values, df["repeat"].values)):
        if rep == 0:
            first[(q, p)] = i
        elif (q, p) in first:
            j = first[(q, p)]
            check(bool((m[i] == m[j]).all() and (lp[i] == lp[j]).all()), f"{name}: repeat {rep} stats differ at {(q, p)}")


def check_replay_mode(res, name, df, k):
    """replay: teacher_forced: every position of every sequence once per repeat, per-depth accuracy
    from the drafts, depth 1 equal to P(accepted >= 1) and every depth at least P(accepted >= j)."""
    g = res.group(name)
    teacher = attr_str(g, "replay") == "teacher_forced"
    tf = res.teacher_forced_rate(name)
    check((tf is not None) == teacher, f"{name}: teacher_forced_rate present {tf is not None}, replay teacher_forced {teacher}")
    if not teacher or tf is None:
        return
    rate, lo, hi = tf
    r0 = df[df["repeat"] == 0]
    for q, pos in r0.groupby("sequence")["position"]:
        pos = pos.values
        check(bool((np.diff(pos) == 1).all()), f"{name}: sequence {q}: positions {pos[:5]}... are not consecutive")
    keep = df["repeat"].values == 0
    hits = (res.drafts(name)[keep] == res.targets(name)[keep]).mean(axis=0)
    check(np.allclose(rate, hits, rtol=0, atol=1e-12), f"{name}: teacher_forced_rate {rate} vs {hits}")
    pp = res.per_position(name)
    check(abs(rate[0] - pp[0]) < 1e-12, f"{name}: depth-1 accuracy {rate[0]} vs P(accepted >= 1) {pp[0]}")
    check(bool((rate >= pp - 1e-12).all()), f"{name}: a depth's accuracy {rate} below P(accepted >= j) {pp}")
    check(bool((lo <= rate + 1e-12).all() and (rate <= hi + 1e-12).all()), f"{name}: teacher_forced_rate outside its CI")


def check_batch(res, names):
    """batch_size: drafts per (sequence, position) equal at every B (the CPU batched step is the
    single-row one row by row), every sequence replayed whole, continuous batching."""
    div = res.divergence()
    inv = div[div["axis"] == "batch_size"]
    pts = res.points
    batched = [n for n in names if int(res.group(n).attrs["batch_size"]) > 1]
    check(len(batched) > 0, "no point with batch_size > 1")
    check(len(inv) == len(batched), f"{len(inv)} batch_size divergence rows for {len(batched)} batched points")
    check(bool((inv["differ_any"] == 0).all()), f"drafts differ across batch sizes:\n{inv}")
    check(bool((inv["common_steps"] == inv["steps"]).all()), "steps do not align across batch sizes")
    for n in names:
        g = res.group(n)
        b = int(g.attrs["batch_size"])
        row = pts.loc[int(g.attrs["index"])]
        want = 0 if b > 1 else -1
        check(int(row["batch_draft_mismatches"]) == want, f"{n}: /index batch_draft_mismatches {row['batch_draft_mismatches']}")
        s = res.steps(n)
        nseq = len(g["sequences"]["sequence"][()])
        rows = s["batch_rows"].values
        check(int(rows.max()) == min(b, nseq), f"{n}: widest step {rows.max()} rows, expected min({b}, {nseq})")
        # Continuous batching: a step drafts for min(B, sequences not yet finished).
        if b > 1:
            check(int(rows[0]) == min(b, nseq), f"{n}: the first step drafts for {rows[0]} rows")


def step_table(res, name):
    """Repeat-0 steps keyed by (sequence, position): accepted and the acceptance probabilities."""
    s = res.steps(name)
    ap = res.group(name)["accept_prob"][()]
    keep = (s["repeat"] == 0).values
    return {(int(q), int(L)): (int(a), p) for q, L, a, p in
            zip(s["sequence"].values[keep], s["position"].values[keep], s["accepted"].values[keep], ap[keep])}


def same_steps(a, b, what, tol):
    """Steps of two replays: the same positions and accepted counts, the a_i within tol (None: not
    compared)."""
    check(a.keys() == b.keys(), f"{what}: the steps are at different positions")
    common = a.keys() & b.keys()
    acc = sum(a[key][0] != b[key][0] for key in common)
    check(acc == 0, f"{what}: {acc} of {len(common)} steps accept differently")
    if tol is not None:
        worst = max((float(np.abs(a[key][1].astype(np.float64) - b[key][1]).max()) for key in common), default=0.0)
        check(worst <= tol, f"{what}: acceptance probabilities differ by {worst}")


def check_sampling(res, names, reference):
    """Sampling verification: the arms that must not change acceptance do not."""
    pts = {n: res.group(n) for n in names}
    sampling = [n for n in names if mr._s(pts[n].attrs["verify"]) == "sampling"]
    check(len(sampling) > 0, "no sampling point")
    key = lambda n, drop: tuple((a, mr._s(pts[n].attrs[a])) for a in
                                ("verify", "draft_proposal", "head_sharding", "batch_size") if a != drop)
    # head_sharding: the head's log-sum-exp combined over ranks sums in another order (fp32).
    # batch_size: the CPU's batched step is the single-row one, bit for bit.
    for axis, tol in (("head_sharding", 1e-5), ("batch_size", 0.0)):
        groups = {}
        for n in names:
            groups.setdefault(key(n, axis), []).append(n)
        pairs = [g for g in groups.values() if len(g) > 1]
        check(len(pairs) > 0, f"no points that differ in {axis} only")
        for g in pairs:
            t0 = step_table(res, g[0])
            for other in g[1:]:
                same_steps(t0, step_table(res, other), f"{g[0]} vs {other} ({axis})", tol)
    # A greedy proposal accepts what greedy verification accepts.
    for n in sampling:
        if mr._s(pts[n].attrs["draft_proposal"]) != "greedy":
            continue
        twin = [m for m in names if key(m, "verify")[1:] == key(n, "verify")[1:] and m != n and
                mr._s(pts[m].attrs["verify"]) == "greedy"]
        check(len(twin) == 1, f"{n}: no greedy-verification twin")
        for m in twin:
            # (the a_i after the first rejection differ: greedy verification chains on its own drafts)
            same_steps(step_table(res, n), step_table(res, m), f"{n} (greedy proposal) vs {m} (verify greedy)", None)
    if reference:
        ref = mr.Results(reference)
        by_label = {mr._s(ref.group(m).attrs["label"]): m for m in ref.point_names}
        for n in sampling:
            m = by_label.get(mr._s(pts[n].attrs["label"]))
            check(m is not None, f"{n}: not in {reference}")
            if m is None:
                continue
            a, b = step_table(res, n), step_table(ref, m)
            # Another rank count splits the experts and o_proj over other ranks: fp32 partial sums
            # in another order, which moves a BF16 value (a hidden, a logit) by an ulp now and then;
            # one logit ulp moves a_i by up to ~1% at these small random-weight logits. Where the
            # a_i agree to 0.02 and no coin lies that close to one, the step must accept the same
            # count.
            seed = int(pts[n].attrs["sampling_seed"])
            compared = equal = 0
            for key_ in a.keys() & b.keys():
                pa, pb = a[key_][1].astype(np.float64), b[key_][1].astype(np.float64)
                coins = np.array([verify_uniform(seed, key_[0], key_[1] + 1 + i) for i in range(len(pa))])
                if np.abs(pa - pb).max() > 0.02 or (np.abs(coins - pa) < 0.02).any():
                    continue
                compared += 1
                equal += a[key_][0] == b[key_][0]
            common = len(a.keys() & b.keys())
            check(compared >= 0.5 * max(len(a), len(b)), f"{n}: only {compared} of {len(a)} steps comparable with {m}")
            check(equal == compared, f"{n} vs {reference} {m}: {compared - equal} of {compared} steps accept differently")
            print(f"{n} vs {m} ({reference}): {common} common steps, {compared} compared, {equal} equal")


def check_qidx(res, name):
    g = res.group(name)
    on = mr._s(g.attrs["batch_qidx"]) == "on"
    full = mr._s(g.attrs["context_rows"]) == "full"
    not_applied = [mr._s(x) for x in g.attrs["arms_not_applied"]]
    row = res.points.loc[int(g.attrs["index"])]
    if on and full:
        check("batch_qidx" not in not_applied, f"{name}: batch_qidx applied but listed in arms_not_applied")
        check("qidx_check_rows" in g.attrs, f"{name}: no qidx_check_rows")
        if "qidx_check_rows" not in g.attrs:
            return
        # Context rows of every repeat (draft_rows rewrite): each sequence's prefill of
        # prompt_len - 1 rows, then each step's catch-up of `accepted` rows.
        seqs, steps = g["sequences"], res.steps(name)
        repeats = int(g.attrs["repeats"])
        want = repeats * int((seqs["prompt_len"][()] - 1).sum()) + int(steps["accepted"].sum())
        rows = int(g.attrs["qidx_check_rows"])
        check(rows == want, f"{name}: qidx_check_rows {rows}, expected {want} context rows")
        check(int(g.attrs["qidx_check_rows_differ"]) == 0, f"{name}: selections differ on the CPU")
        check(int(g.attrs["qidx_check_entries_differ"]) == 0, f"{name}: selection entries differ on the CPU")
        multi = int(g.attrs["qidx_check_rows_multi"])
        check(repeats * int((seqs["prompt_len"][()] - 1).sum()) <= multi <= rows, f"{name}: qidx_check_rows_multi {multi}")
        check(float(g.attrs["qidx_check_differ_rate"]) == 0.0, f"{name}: qidx_check_differ_rate")
        check(int(row["qidx_check_rows"]) == rows, f"{name}: /index qidx_check_rows {row['qidx_check_rows']}")
        check(int(row["qidx_check_rows_differ"]) == 0, f"{name}: /index qidx_check_rows_differ")
        check(float(row["qidx_check_differ_rate"]) == 0.0, f"{name}: /index qidx_check_differ_rate")
    else:
        check("qidx_check_rows" not in g.attrs, f"{name}: a selection check where batch_qidx does not apply")
        check(int(row["qidx_check_rows"]) == -1, f"{name}: /index qidx_check_rows should be -1")
        check(np.isnan(float(row["qidx_check_differ_rate"])), f"{name}: /index qidx_check_differ_rate should be NaN")
        check(("batch_qidx" in not_applied) == on, f"{name}: arms_not_applied {not_applied}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--points", type=int)
    ap.add_argument("--at-most", type=int)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--sharding-invariant", action="store_true")
    ap.add_argument("--qidx", action="store_true")
    ap.add_argument("--batch", action="store_true")
    ap.add_argument("--sampling", action="store_true")
    ap.add_argument("--reference")
    a = ap.parse_args()
    res = mr.Results(a.file)
    names = res.point_names
    for key in ["schema", "schema_version", "git_sha", "git_dirty", "argv", "experiment_yaml", "experiment_identity",
                "world_size", "hosts", "devices", "version.hdf5", "version.mpi", "environment", "sweep_axes"]:
        check(key in res.attrs, f"root attribute {key} missing")
    check(int(res.attrs["world_size"]) == a.world, f"world_size {res.attrs['world_size']}")
    check(len(res.attrs["hosts"]) == a.world, "one host per rank")
    if a.points is not None:
        check(len(names) == a.points, f"{len(names)} points, expected {a.points}")
    if a.at_most is not None:
        check(1 <= len(names) < a.at_most, f"{len(names)} points, expected 1..{a.at_most - 1}")
    pts = res.points
    check(len(pts) == len(names), f"/index has {len(pts)} rows for {len(names)} points")
    for n in names:
        check_point(res, n)
    div = res.divergence()
    stored = res.stored_divergence()
    check(len(div) == len(stored), f"/divergence has {len(stored)} rows, the reader computes {len(div)}")
    if len(div) and len(stored):
        check(np.allclose(div["rate_any"].values, stored["rate_any"].values, equal_nan=True), "/divergence rates")
        for c in ("differ_with_margin", "differ_near_tie"):
            check(c in stored.columns and bool((div[c].values == stored[c].values).all()), f"/divergence {c}")
        check(np.allclose(div["near_tie_rate"].values, stored["near_tie_rate"].values, equal_nan=True),
              "/divergence near_tie_rate")
        check(bool((stored["differ_near_tie"] <= stored["differ_with_margin"]).all() and
                   (stored["differ_with_margin"] <= stored["differ_any"]).all()), "/divergence near-tie counts")
    if a.sharding_invariant:
        inv = div[div["axis"].isin(["head_sharding", "context_rows"])]
        check(len(inv) > 0, "no head_sharding / context_rows pairs to compare")
        check(bool((inv["differ_any"] == 0).all()), f"sharded or full-row drafts differ:\n{inv}")
        check(bool((inv["common_steps"] == inv["steps"]).all()), "steps do not align across invariant arms")
    if a.qidx:
        for n in names:
            check_qidx(res, n)
        # batch_qidx acts on context rows only, whose outputs are discarded: drafts never change.
        inv = div[div["axis"] == "batch_qidx"]
        check(len(inv) == 2, f"{len(inv)} batch_qidx divergence rows, expected 2")
        check(bool((inv["differ_any"] == 0).all()), f"batch_qidx changed drafts:\n{inv}")
        check(bool((inv["common_steps"] == inv["steps"]).all()), "steps do not align across batch_qidx")
    if a.batch:
        check_batch(res, names)
    if a.sampling:
        check_sampling(res, names, a.reference)
    print(f"{a.file}: {len(names)} point(s), {len(div)} divergence row(s)")
    if failures:
        print(f"{len(failures)} failure(s)")
        sys.exit(1)


if __name__ == "__main__":
    main()
