"""Reader for mtplab results files ("mtplab-results", schema v2 and v1; docs/results-schema.md).

    import mtplab_results as mr
    res = mr.Results("results/quickstart.h5")
    res.points            # one row per point: arms, acceptance, tau, latency summaries
    res.steps("p0003")    # one row per step: repeat, sequence, position, accepted, timings (ms)
    res.summary("p0003")  # one row per timing metric: median, p90, p99, ci95, rel_spread
    res.drafts("p0003")   # [steps, k] int32, rows aligned with res.steps(...)
    res.divergence()      # drafts of each point vs its reference point (recomputed here)

Only h5py, numpy and pandas are needed. Strings are returned as str.
"""
import h5py
import numpy as np
import pandas as pd

SCHEMA = "mtplab-results"
SCHEMA_VERSION = 2
# Versions this reader reads: 2 (typed assignment: assignment_index and sweep.<axis> attributes,
# typed /index columns) and 1 (the assignment as "axis=value" strings).
READABLE_VERSIONS = (1, 2)
TIMING_COLUMNS = ["step_ms", "propose_ms", "block_ms", "head_ms", "exchange_ms", "after_verify_ms", "catch_up_ms"]


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
        if version not in READABLE_VERSIONS:
            raise ValueError(f"{path}: results schema version {version}, this reader knows {READABLE_VERSIONS}")
        self.version = version
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
        """{axis: value} of one point. Version 2: typed as the file records the axis (int, float or
        str); version 1: the canonical strings."""
        g = self.group(point)
        if self.version == 1:
            return dict(x.split("=", 1) for x in _s(g.attrs["assignment"]))
        return {a: _s(g.attrs[f"sweep.{a}"]) for a in self.axes}

    def assignment_index(self, point):
        """{axis: index of the point's value among the axis' values} (0 = the reference value)."""
        g = self.group(point)
        if self.version == 1:
            a = self.assignment(point)
            return {ax: self.axis_values[ax].index(a[ax]) for ax in self.axes}
        return dict(zip(self.axes, (int(x) for x in g.attrs["assignment_index"])))

    @property
    def points(self):
        """One row per point: the index table (typed columns in version 2), with every sweep axis."""
        df = _table(self.file["index"]) if "index" in self.file else pd.DataFrame()
        if self.version == 1:
            rows = [self.assignment(name) for name in self.point_names]
            assign = pd.DataFrame(rows, columns=self.axes)
            for c in assign.columns:
                if c not in df.columns:
                    df[c] = assign[c].values
        return df.set_index("point", drop=False).sort_index()

    def steps(self, point):
        g = self.group(point)["steps"]
        return _table(g)

    def measured_steps(self, point):
        """Steps that count for latency (warm-up excluded)."""
        s = self.steps(point)
        return s[s["warmup"] == 0]

    def summary(self, point):
        return _table(self.group(point)["summary"]).set_index("metric")

    def drafts(self, point):
        return self.group(point)["drafts"][()]

    def targets(self, point):
        return self.group(point)["targets"][()]

    def per_position(self, point):
        return np.asarray(self.group(point).attrs["per_position"], dtype=float)

    def per_draft(self, point, phase):
        """[steps, k] milliseconds of `phase` (block_ms, head_ms, exchange_ms) per draft."""
        return self.group(point)["per_draft"][phase][()]

    def divergence(self):
        """How often a point's drafts differ from its reference point's, recomputed from the steps.

        Reference of point P for axis A (P's value of A not the axis' first value): the point
        with P's assignment except A at its first value. Compared: repeat-0 steps of both at the
        same (sequence, position); over the first min(k_P, k_ref) drafts. rate_any: fraction of
        those steps whose drafts differ anywhere; rate_first: whose first draft differs.
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
                keep = s["repeat"].values == 0
                keys = list(zip(s["sequence"].values[keep], s["position"].values[keep]))
                cache[name] = dict(zip(keys, d[keep]))
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
                mine, theirs = repeat0(name), repeat0(ref)
                common = [k for k in mine if k in theirs]
                any_, first_ = 0, 0
                for k in common:
                    n = min(len(mine[k]), len(theirs[k]))
                    any_ += bool(np.any(mine[k][:n] != theirs[k][:n]))
                    first_ += bool(n > 0 and mine[k][0] != theirs[k][0])
                rows.append(dict(point=idx, reference=pts[ref][0], axis=axis, value=value, reference_value=first,
                                 steps=len(mine), common_steps=len(common), differ_any=any_, differ_first=first_,
                                 rate_any=any_ / len(common) if common else np.nan,
                                 rate_first=first_ / len(common) if common else np.nan))
        cols = ["point", "reference", "axis", "value", "reference_value", "steps", "common_steps", "differ_any",
                "differ_first", "rate_any", "rate_first"]
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


# The copy bandwidth of an H200 measured by mtplab_bench_step (docs/performance.md), for floors
# drawn from a results file, which records no bandwidth.
H200_COPY_GBPS = 4230.0


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
