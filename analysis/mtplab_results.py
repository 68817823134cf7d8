"""Reader for mtplab results files ("mtplab-results", schema version 3; docs/results-schema.md).
A file of an older version is refused: `mtplab upgrade OLD.h5 NEW.h5` rewrites it as version 3.

    import mtplab_results as mr
    res = mr.Results("results/quickstart.h5")
    res.points            # one row per point: arms, acceptance, tau, latency summaries
    res.steps("p0003")    # one row per step: repeat, sequence, position, accepted, timings (ms)
    res.summary("p0003")  # one row per timing metric: median, p90, p99, ci95, rel_spread
    res.drafts("p0003")   # [steps, k] int32, rows aligned with res.steps(...)
    res.divergence()      # drafts of each point vs its reference point (recomputed here)
    res.accepted_hist("p0003"), res.interval("p0003", "tau")   # accepted lengths, bootstrap CI
    res.draft_margins("p0003")  # [steps, k] top-1 minus top-2 logit (None where not recorded)
    plan = mr.Plan("results/plan.h5")   # a plan file of `mtplab plan`: plan.table, plan.best

Only h5py, numpy and pandas are needed. Strings are returned as str.
"""
import h5py
import numpy as np
import pandas as pd

SCHEMA = "mtplab-results"
SCHEMA_VERSION = 3
TIMING_COLUMNS = ["step_ms", "propose_ms", "block_ms", "head_ms", "exchange_ms", "after_verify_ms", "catch_up_ms",
                  "stats_ms"]


def _s(v):
    """A string attribute or element as str (fixed-length strings come back as bytes)."""
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray):
        return [_s(x) for x in v]
    return v


def _column(ds):
    data = ds[()]
    if data.dtype.kind in ("S", "O"):
        return np.array([_s(x) for x in data], dtype=object)
    return data


def _table(group):
    return pd.DataFrame({k: _column(group[k]) for k in group})


class Results:
    def __init__(self, path):
        self.path = path
        self.file = h5py.File(path, "r")
        schema = _s(self.file.attrs.get("schema", b""))
        if schema != SCHEMA:
            raise ValueError(f"{path}: not an mtplab results file (schema {schema!r})")
        version = int(self.file.attrs["schema_version"])
        if version != SCHEMA_VERSION:
            self.file.close()
            if version < SCHEMA_VERSION:
                raise ValueError(f"{path}: results schema version {version}; this reader reads version "
                                 f"{SCHEMA_VERSION} only: run `mtplab upgrade {path} NEW.h5` and read NEW.h5")
            raise ValueError(f"{path}: results schema version {version}, written by a newer mtplab; this reader "
                             f"reads version {SCHEMA_VERSION}")
        self.attrs = {k: _s(v) for k, v in self.file.attrs.items()}
        self.axes = list(self.attrs.get("sweep_axes", []))
        self.axis_values = {a: list(self.attrs.get(f"sweep_values.{a}", [])) for a in self.axes}

    def close(self):
        self.file.close()

    @property
    def point_names(self):
        return sorted(self.file["points"].keys())

    def group(self, point):
        return self.file["points"][self._name(point)]

    @staticmethod
    def _name(point):
        return point if isinstance(point, str) else f"p{int(point):04d}"

    def assignment(self, point):
        """{axis: value} of one point, typed as the file records the axis (int, float or str)."""
        g = self.group(point)
        return {a: _s(g.attrs[f"sweep.{a}"]) for a in self.axes}

    def assignment_index(self, point):
        """{axis: index of the point's value among the axis' values} (0 = the reference value)."""
        g = self.group(point)
        return dict(zip(self.axes, (int(x) for x in g.attrs["assignment_index"])))

    def arms(self, point):
        """{arm: value} of one point: every arm (and `kernels.<field>`) as the point records it,
        typed as the file stores it (integer arms int, real arms float, the others str)."""
        g = self.group(point)
        return {name: _s(g.attrs[name]) for name in self.attrs["arms"]}

    def kernels(self, point):
        """{op: "kernel[,kernel...]"}: the kernel each op of the point ran (its `kernels` entries
        "op=..."; where the ranks differ, "rank 0: ...; rank 1: ..."); "cpu" for every op on the CPU
        backend. Empty where the writer did not record them: a file upgraded from version 1 or 2
        ("not recorded ..."), or one of the first version-3 files (the policy there, as one str)."""
        raw = _s(self.group(point).attrs["kernels"])
        if not isinstance(raw, list):
            return {}
        out = {}
        for entry in raw:
            op, eq, kernels = entry.partition("=")
            if eq:
                out[op] = kernels
        return out

    @property
    def points(self):
        """One row per point: the index table (typed columns: every arm, every sweep axis)."""
        df = _table(self.file["index"])
        return df.set_index("point", drop=False).sort_index()

    def steps(self, point):
        g = self.group(point)["steps"]
        return _table(g)

    def measured_steps(self, point):
        """Steps that count for latency (warm-up excluded)."""
        s = self.steps(point)
        return s[s["warmup"] == 0]

    def step_experts(self, point, rows=None):
        """The median over the point's measured (batched) steps, each counted once, of the distinct
        routed experts its last draft read (steps/batch_experts); with `rows`, over the steps that
        drafted for that many sequences (all steps where none did). None where the point has no
        such column (a file upgraded from one written before it)."""
        s = self.measured_steps(point)
        if "batch_experts" not in s.columns or len(s) == 0:
            return None
        first = np.concatenate([[True], np.diff(s["batch_step"].values) != 0])
        ex, n = s["batch_experts"].values[first], s["batch_rows"].values[first]
        if rows is not None and (n == rows).any():
            ex = ex[n == rows]
        return float(np.median(ex))

    def summary(self, point):
        return _table(self.group(point)["summary"]).set_index("metric")

    def drafts(self, point):
        return self.group(point)["drafts"][()]

    def targets(self, point):
        return self.group(point)["targets"][()]

    def per_position(self, point):
        return np.asarray(self.group(point).attrs["per_position"], dtype=float)

    def accepted_hist(self, point):
        """[k + 1] int: repeat-0 steps with exactly j accepted drafts."""
        return np.asarray(self.group(point).attrs["accepted_hist"], dtype=np.int64)

    def interval(self, point, figure):
        """(lo, hi) of the 95% bootstrap interval over sequences of `figure` (acceptance_rate, tau,
        expected_acceptance_rate, expected_tau)."""
        v = self.group(point).attrs[f"{figure}_ci"]
        return float(v[0]), float(v[1])

    def acceptance_intervals(self, point):
        """{figure: (lo, hi)} for acceptance_rate, tau, expected_acceptance_rate and expected_tau:
        the 95% bootstrap intervals over sequences as the file records them."""
        return {f: self.interval(point, f) for f in ("acceptance_rate", "tau", "expected_acceptance_rate",
                                                      "expected_tau")}

    def draft_margins(self, point):
        """[steps, k] f32: each draft's top-1 minus top-2 logit (raw BF16 logits), rows aligned
        with steps(); None where the point recorded none (record_margins: off, skip: head, or a
        file upgraded from one written before them)."""
        g = self.group(point)
        return g["draft_margin"][()] if "draft_margin" in g else None

    def draft_logprobs(self, point):
        """[steps, k] f32: log q of each draft under the point's transform; None where absent."""
        g = self.group(point)
        return g["draft_logprob"][()] if "draft_logprob" in g else None

    def flips(self, point, reference):
        """The steps where `point`'s drafts differ from `reference`'s (repeat 0, same sequence and
        position), one row each: the first differing draft (the flip; later ones follow from its
        token), both tokens, and the reference's margin and log-probability at it (NaN where the
        reference recorded none)."""
        rows = []
        d_p, d_r = self.drafts(point), self.drafts(reference)
        m_r, l_r = self.draft_margins(reference), self.draft_logprobs(reference)
        s_p, s_r = self.steps(point), self.steps(reference)
        at = {(q, p): i for i, (q, p, rep) in enumerate(zip(s_r["sequence"], s_r["position"], s_r["repeat"])) if rep == 0}
        for i, (q, p, rep) in enumerate(zip(s_p["sequence"], s_p["position"], s_p["repeat"])):
            j = at.get((q, p)) if rep == 0 else None
            if j is None:
                continue
            n = min(d_p.shape[1], d_r.shape[1])
            differ = np.flatnonzero(d_p[i, :n] != d_r[j, :n])
            if len(differ) == 0:
                continue
            x = int(differ[0])
            rows.append(dict(sequence=int(q), position=int(p), draft=x, token=int(d_p[i, x]),
                             reference_token=int(d_r[j, x]),
                             reference_margin=float(m_r[j, x]) if m_r is not None else np.nan,
                             reference_logprob=float(l_r[j, x]) if l_r is not None else np.nan))
        cols = ["sequence", "position", "draft", "token", "reference_token", "reference_margin", "reference_logprob"]
        return pd.DataFrame(rows, columns=cols)

    def teacher_forced_rate(self, point):
        """[k] per-depth accuracy of a `replay: teacher_forced` point, with its interval
        ([k] lo, [k] hi); None for other points."""
        g = self.group(point)
        if "teacher_forced_rate" not in g.attrs:
            return None
        return (np.asarray(g.attrs["teacher_forced_rate"], dtype=float),
                np.asarray(g.attrs["teacher_forced_rate_ci_lo"], dtype=float),
                np.asarray(g.attrs["teacher_forced_rate_ci_hi"], dtype=float))

    def per_draft(self, point, phase):
        """[steps, k] milliseconds of `phase` (block_ms, head_ms, exchange_ms) per draft."""
        return self.group(point)["per_draft"][phase][()]

    def divergence(self):
        """How often a point's drafts differ from its reference point's, recomputed from the steps.

        Reference of point P for axis A (P's value of A not the axis' first value): the point
        with P's assignment except A at its first value. Compared: repeat-0 steps of both at the
        same (sequence, position); over the first min(k_P, k_ref) drafts. rate_any: fraction of
        those steps whose drafts differ anywhere; rate_first: whose first draft differs.
        differ_with_margin: differing steps where the reference recorded draft margins;
        differ_near_tie: of those, the ones whose first differing draft had a reference margin
        below one BF16 step (an exact tie: the margin alone decides only that case,
        docs/numerics.md); near_tie_rate = differ_near_tie / differ_with_margin.
        """
        pts = {}
        for name in self.point_names:
            g = self.group(name)
            pts[name] = (int(g.attrs["index"]), self.assignment_index(name))
        by_key = {tuple(sorted(a.items())): name for name, (_, a) in pts.items()}
        cache = {}

        def repeat0(name):
            if name not in cache:
                s = self.steps(name)
                d = self.drafts(name)
                m = self.draft_margins(name)
                keep = s["repeat"].values == 0
                keys = list(zip(s["sequence"].values[keep], s["position"].values[keep]))
                margins = dict(zip(keys, m[keep])) if m is not None else None
                cache[name] = (dict(zip(keys, d[keep])), margins)
            return cache[name]

        rows = []
        for name, (idx, a) in pts.items():
            for axis, at in a.items():
                if at == 0:
                    continue
                ref_a = dict(a)
                ref_a[axis] = 0
                ref = by_key.get(tuple(sorted(ref_a.items())))
                if ref is None:
                    continue
                value, first = self.axis_values[axis][at], self.axis_values[axis][0]
                (mine, _), (theirs, ref_margins) = repeat0(name), repeat0(ref)
                c = count_flips(mine, theirs, ref_margins)
                common, any_, first_ = c["common"], c["differ_any"], c["differ_first"]
                with_margin, near_tie = c["differ_with_margin"], c["differ_near_tie"]
                rows.append(dict(point=idx, reference=pts[ref][0], axis=axis, value=value, reference_value=first,
                                 steps=len(mine), common_steps=common, differ_any=any_, differ_first=first_,
                                 rate_any=any_ / common if common else np.nan,
                                 rate_first=first_ / common if common else np.nan,
                                 differ_with_margin=with_margin, differ_near_tie=near_tie,
                                 near_tie_rate=near_tie / with_margin if with_margin else np.nan))
        cols = ["point", "reference", "axis", "value", "reference_value", "steps", "common_steps", "differ_any",
                "differ_first", "rate_any", "rate_first", "differ_with_margin", "differ_near_tie", "near_tie_rate"]
        return pd.DataFrame(rows, columns=cols).sort_values(["point", "axis"]).reset_index(drop=True)

    def stored_divergence(self):
        """The /divergence table mtplab wrote (same definition as divergence())."""
        return _table(self.file["divergence"]) if "divergence" in self.file else pd.DataFrame()

    def phase_medians(self):
        """Per point: the median of each timing column over measured steps (ms)."""
        rows = []
        for name in self.point_names:
            s = self.summary(name)
            row = {"point": int(self.group(name).attrs["index"])}
            row.update({m: s.loc[m, "median"] for m in s.index})
            rows.append(row)
        return pd.DataFrame(rows).set_index("point").sort_index()


def count_flips(mine, theirs, ref_margins):
    """How two runs' drafts compare over the steps both have. mine / theirs: {(sequence, position):
    drafts row} (repeat 0); ref_margins: theirs' {key: margins row} or None. Over the first
    min(k, k') drafts of each common step: common, differ_any, differ_first, differ_with_margin,
    differ_near_tie (the first differing draft at a reference margin of 0: an exact tie, the only
    one the margin alone decides, docs/numerics.md) and max_flip_margin (the largest reference
    margin at a first differing draft; NaN when none was recorded)."""
    common = [k for k in mine if k in theirs]
    out = dict(common=len(common), differ_any=0, differ_first=0, differ_with_margin=0, differ_near_tie=0,
               max_flip_margin=np.nan)
    for k in common:
        n = min(len(mine[k]), len(theirs[k]))
        differ = np.flatnonzero(mine[k][:n] != theirs[k][:n])
        if len(differ) == 0:
            continue
        out["differ_any"] += 1
        out["differ_first"] += bool(differ[0] == 0)
        if ref_margins is not None:
            flip = float(ref_margins[k][differ[0]])
            out["differ_with_margin"] += 1
            out["differ_near_tie"] += bool(flip == 0)
            m = out["max_flip_margin"]
            out["max_flip_margin"] = flip if np.isnan(m) else max(m, flip)
    return out


_M64 = (1 << 64) - 1


def _splitmix64_mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _quantile_sorted(x, p):
    """core/stats.hpp's quantile: linear interpolation between order statistics."""
    h = (len(x) - 1) * p
    lo = int(np.floor(h))
    hi = min(lo + 1, len(x) - 1)
    return x[lo] + (h - lo) * (x[hi] - x[lo])


def bootstrap_ratio_intervals(denominators, numerators, seed, resamples=2000, level=0.95):
    """mtplab's bootstrap over units (lib/harness/uncertainty.hpp), step for step: units with a zero
    denominator left out; each resample draws len(units) units with splitmix64 (the i-th draw is
    unit next() % len(units)); ratio q = sum(numerators[q]) / sum(denominators) of the drawn units;
    the interval the ((1 - level) / 2, (1 + level) / 2) quantiles. Returns [(lo, hi)] per ratio."""
    units = [u for u, d in enumerate(denominators) if d > 0]
    if not units:
        return [(np.nan, np.nan) for _ in numerators]
    n, state = len(units), seed
    values = [[] for _ in numerators]
    for _ in range(resamples):
        den, num = 0.0, [0.0] * len(numerators)
        for _ in range(n):
            state = (state + 0x9E3779B97F4A7C15) & _M64
            u = units[_splitmix64_mix(state) % n]
            den += denominators[u]
            for q, nums in enumerate(numerators):
                num[q] += nums[u]
        for q in range(len(numerators)):
            values[q].append(num[q] / den)
    tail = (1 - level) / 2
    out = []
    for v in values:
        v = sorted(v)
        out.append((_quantile_sorted(v, tail), _quantile_sorted(v, 1 - tail)))
    return out


def _fnv1a64(text):
    h = 14695981039346656037
    for b in text.encode():
        h = ((h ^ b) * 1099511628211) & _M64
    return h


def acceptance_bootstrap_seed(point_index):
    """The seed of a point's acceptance intervals (harness::acceptance_bootstrap_seed)."""
    return _splitmix64_mix(_fnv1a64("acceptance bootstrap") ^ (point_index & _M64)) >> 1


def bf16_spacing(v):
    """The BF16 spacing at the magnitude of v: 2^(e - 7) for |v| in [2^e, 2^(e + 1))."""
    a = np.abs(np.asarray(v, dtype=float))
    e = np.floor(np.log2(np.where(a < 2.0 ** -126, 2.0 ** -126, a)))
    return np.where(a < 2.0 ** -126, 2.0 ** -133, 2.0 ** (e - 7))


def config_dict(text):
    """A point's canonical config (the YAML mtplab writes: one key per line) as {dotted key: text}."""
    out, stack = {}, []
    for line in _s(text).splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip())) // 2
        key, _, value = line.strip().partition(":")
        stack = stack[:depth] + [key]
        if value.strip():
            out[".".join(stack)] = value.strip()
    return out


# The copy bandwidth (bytes read + written) mtplab_bench_step measured on each GPU kind the project
# has run on (docs/performance.md), for floors drawn from a results file, which records its devices
# but no bandwidth.
H200_COPY_GBPS = 4230.0
COPY_GBPS = {"H200": H200_COPY_GBPS, "H100": 3005.0}


def copy_gbps(devices):
    """(GB/s, GPU name) for a results file's `devices` attribute: the measured copy bandwidth of the
    first GPU kind of COPY_GBPS named there, else the H200's (name "H200, assumed")."""
    text = str(devices)
    for name, gbps in COPY_GBPS.items():
        if name in text:
            return gbps, name
    return H200_COPY_GBPS, "H200, assumed"


def draft_byte_floor(config, batch, context, head_fp8=False, distinct_experts=None):
    """The fewest bytes one batched draft step reads at the point's model sizes (world 1): the dense
    weights and the head once, each distinct routed expert once (by default the expected number
    under uniform routing, E (1 - (1 - k/E)^B)), the shared expert, and per sequence its selected
    latent rows and pool keys at `context` rows. As mtplab_bench_step --batch counts it."""
    c = {k.split(".", 1)[1]: float(v) for k, v in config_dict(config).items() if k.startswith("model.") and
         v.replace(".", "", 1).replace("e-", "", 1).isdigit()}
    H, V = c["hidden"], c["vocab"]
    nh, qk, v, ql, kvl = c["n_heads"], c["qk_nope_head_dim"], c["v_head_dim"], c["q_lora_rank"], c["kv_lora_rank"]
    nI, D, E, k, inter = c["index_n_heads"], c["index_head_dim"], c["n_routed_experts"], c["num_experts_per_tok"], \
        c["moe_intermediate_size"]
    dense = 2 * (H * 2 * H + ql * H + nh * qk * ql + kvl * H + nh * (qk + v) * kvl + H * nh * v + nI * D * ql +
                 2 * D * H + nI * H + E * H + 3 * c["n_shared_experts"] * inter * H + 8 * H)
    if distinct_experts is None:
        distinct_experts = E * (1 - (1 - k / E) ** batch)
    head = V * H + 4 * V if head_fp8 else 2 * V * H
    width = c["index_topk"] + c["index_kpool"] - 1
    per_seq = 2 * min(width, context) * kvl + 4 * (context // c["index_kpool"]) * D
    return dense + distinct_experts * 2 * 3 * inter * H + head + batch * per_seq


def open_results(path):
    return Results(path)


PLAN_SCHEMA = "mtplab-plan"
PLAN_SCHEMA_VERSION = 1


class Plan:
    """A plan file of `mtplab plan` (schema "mtplab-plan" version 1; docs/planning.md, "The plan
    file"): its `plan` group as tables.

        plan = mr.Plan("results/plan.h5")
        plan.table        # one row per (batch, k): tau, step_us, tokens_per_s_user / _gpu, speedup,
                          # each with _lo / _hi (95% interval), win_fraction
        plan.best         # one row per batch: k, win_fraction, k_set, runner_up, distinguishable, ...
        plan.acceptance   # one row per k: tau, tau_lo, tau_hi, origin
        plan.online_check # with online cost points: one row per (batch, k) an online point ran,
                          # predicted / measured tokens/s per sequence (None without)
        plan.attrs        # model, layers, gpus, inputs, warnings, notes, tau_interval, cost_interval, ...
    """

    def __init__(self, path):
        self.path = path
        with h5py.File(path, "r") as f:
            schema = _s(f.attrs.get("schema", b""))
            if schema != PLAN_SCHEMA:
                raise ValueError(f"{path}: not an mtplab plan file (schema {schema!r})")
            version = int(f.attrs["schema_version"])
            if version != PLAN_SCHEMA_VERSION:
                raise ValueError(f"{path}: plan schema version {version}; this reader reads version "
                                 f"{PLAN_SCHEMA_VERSION}")
            g = f["plan"]
            self.attrs = {k: _s(v) for k, v in g.attrs.items()}
            self.table = _table(g["table"])
            self.best = _table(g["best"])
            a = g["acceptance"]
            self.acceptance = pd.DataFrame({c: _column(a[c]) for c in ("k", "tau", "tau_lo", "tau_hi", "origin")})
            self.marginal_rates = np.asarray(a["marginal_rates"][()], dtype=float)
            self.costs = _table(g["costs"])
            self.online_check = _table(g["online_check"]) if "online_check" in g else None

    def envelope(self):
        """One row per batch: the best k's speedup, tokens/s per user and per GPU with intervals."""
        t = self.table.merge(self.best[["batch", "k"]], on=["batch", "k"])
        return t.sort_values("batch").reset_index(drop=True)
