"""The CPU digest of a results file: what a change to the drafter's arithmetic would move.

    cpu_digest.py FILE.h5            one line: sha256 over every point (sorted by name)
    cpu_digest.py --points FILE.h5   one line per point (name, sha256), to find which point moved

Per point it hashes the drafts, the targets, each step's sequence, position, accepted and expected
accepted counts, the accept probabilities, the draft margins and log-probabilities (when stored),
and the acceptance attributes (counts, rates, tau, expected figures, per-position rates, the
accepted-length histogram and the bootstrap intervals), plus /index batch_draft_mismatches. Timings,
host names, dates and provenance are left out: they change from run to run. Floating-point values
are hashed as their IEEE bytes, so a change in the last bit shows.
"""
import hashlib
import sys

import h5py
import numpy as np

DATASETS = ["drafts", "targets", "accept_prob", "draft_margin", "draft_logprob",
            "steps/sequence", "steps/position", "steps/accepted", "steps/expected_accepted", "steps/repeat"]
ATTRS = ["steps", "drafted", "accepted", "acceptance_rate", "tau", "expected_acceptance_rate", "expected_tau",
         "per_position", "accepted_hist", "acceptance_rate_ci", "tau_ci", "expected_acceptance_rate_ci",
         "expected_tau_ci", "teacher_forced_rate", "teacher_forced_rate_ci_lo", "teacher_forced_rate_ci_hi",
         "status"]


def _bytes(value):
    a = np.asarray(value)
    if a.dtype.kind in ("S", "O", "U"):
        return repr([x.decode() if isinstance(x, bytes) else str(x) for x in a.ravel()]).encode()
    return a.dtype.str.encode() + repr(a.shape).encode() + np.ascontiguousarray(a).tobytes()


def point_digests(path):
    out = {}
    with h5py.File(path, "r") as f:
        points = f["points"] if "points" in f else {}
        names = sorted(points.keys())
        mism = {}
        if "index" in f and "batch_draft_mismatches" in f["index"]:
            idx = f["index"]
            for name, m in zip(idx["name"][()], idx["batch_draft_mismatches"][()]):
                mism[name.decode() if isinstance(name, bytes) else str(name)] = int(m)
        for name in names:
            g = points[name]
            h = hashlib.sha256()
            for ds in DATASETS:
                if ds in g:
                    h.update(ds.encode() + b"=" + _bytes(g[ds][()]))
            for a in ATTRS:
                if a in g.attrs:
                    h.update(a.encode() + b"=" + _bytes(g.attrs[a]))
            h.update(b"batch_draft_mismatches=" + repr(mism.get(name)).encode())
            out[name] = h.hexdigest()
    return out


def main(argv):
    per_point = argv[:1] == ["--points"]
    paths = argv[1:] if per_point else argv
    if len(paths) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    digests = point_digests(paths[0])
    if not digests:
        print(f"{paths[0]}: no points", file=sys.stderr)
        return 1
    if per_point:
        for name, d in digests.items():
            print(name, d)
    else:
        h = hashlib.sha256()
        for name, d in digests.items():
            h.update(f"{name} {d}\n".encode())
        print(f"{len(digests)} {h.hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
