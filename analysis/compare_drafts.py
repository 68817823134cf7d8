"""Drafts of one results file against another's, point by point: how often they differ, and how
many of the differences are near-ties. For runs of one experiment that should draft alike, e.g.
experiments/rank-scaling.yaml on 1 rank against N ranks, or one machine against another.

    python3 analysis/compare_drafts.py REF.h5 OTHER.h5 [--require-equal]

Points are paired by their assignment (the swept values, as text), so the two files may hold
different subsets of a sweep (a point present in one file only is listed, not compared). For each
pair, over the repeat-0 steps of both at the same (sequence, position) and the first min(k, k')
drafts, the definitions of /divergence (docs/results-schema.md): differ_any (steps whose drafts
differ anywhere), differ_first (whose first draft differs), differ_with_margin (differing steps
where REF recorded its draft margins) and differ_near_tie (of those, the steps whose first
differing draft had a REF margin of 0: a top-1 / top-2 tie that any rounding may flip), and the
largest REF margin (top-1 minus top-2 BF16 logit) at a flip: how close the other flips were. Steps align
fully when acceptance is equal; a sequence whose acceptance diverged has fewer common steps.

Prints one row per pair and a total. Exits 0, or with --require-equal 1 when any pair has a
difference that is not a near-tie (or a point has no partner); 2 on bad arguments.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mtplab_results as mr  # noqa: E402


def repeat0(res, name):
    """{(sequence, position): drafts row}, {(sequence, position): margins row} or None."""
    s, d, m = res.steps(name), res.drafts(name), res.draft_margins(name)
    keep = s["repeat"].values == 0
    keys = list(zip(s["sequence"].values[keep].tolist(), s["position"].values[keep].tolist()))
    return dict(zip(keys, d[keep])), (dict(zip(keys, m[keep])) if m is not None else None)


def assignment_key(res, name):
    return tuple(sorted((k, str(v)) for k, v in res.assignment(name).items()))


def compare(ref_path, other_path):
    ref, other = mr.Results(ref_path), mr.Results(other_path)
    ref_by = {assignment_key(ref, n): n for n in ref.point_names}
    other_by = {assignment_key(other, n): n for n in other.point_names}
    rows, unpaired = [], []
    for key, name in other_by.items():
        if key not in ref_by:
            unpaired.append(f"{other_path}: {name} ({dict(key)}) has no partner in {ref_path}")
            continue
        (mine, _), (theirs, margins) = repeat0(other, name), repeat0(ref, ref_by[key])
        c = mr.count_flips(mine, theirs, margins)
        rows.append(dict(point=name, reference=ref_by[key], label=other.group(name).attrs.get("label", ""),
                         steps=len(mine), common=c["common"], differ_any=c["differ_any"],
                         differ_first=c["differ_first"], with_margin=c["differ_with_margin"],
                         near_tie=c["differ_near_tie"], max_flip_margin=c["max_flip_margin"]))
    for key, name in ref_by.items():
        if key not in other_by:
            unpaired.append(f"{ref_path}: {name} ({dict(key)}) has no partner in {other_path}")
    return rows, unpaired


def main(argv):
    require = "--require-equal" in argv
    args = [a for a in argv[1:] if a != "--require-equal"]
    if len(args) != 2 or any(a.startswith("--") for a in args):
        print(__doc__.strip())
        return 2
    for path in args:
        if not os.path.isfile(path):
            print(f"compare_drafts: {path}: no such file")
            return 2
    rows, unpaired = compare(args[0], args[1])
    print(f"{'point':>6} {'ref':>6} {'steps':>6} {'common':>6} {'any':>5} {'first':>5} {'margin':>6} {'tie':>4} "
          f"{'max_flip_margin':>15}  label")
    for r in rows:
        print(f"{r['point']:>6} {r['reference']:>6} {r['steps']:>6} {r['common']:>6} {r['differ_any']:>5} "
              f"{r['differ_first']:>5} {r['with_margin']:>6} {r['near_tie']:>4} {r['max_flip_margin']:>15.6g}  "
              f"{mr._s(r['label'])}")
    for u in unpaired:
        print("UNPAIRED:", u)
    total = {k: sum(r[k] for r in rows) for k in ("common", "differ_any", "differ_first", "with_margin", "near_tie")}
    # A difference counts as a near-tie only where REF recorded margins and the flip's margin was 0.
    not_tie = sum(r["differ_any"] - r["near_tie"] for r in rows)
    print(f"{args[0]} vs {args[1]}: {len(rows)} point(s) paired, {total['common']} common step(s), "
          f"{total['differ_any']} differ ({total['differ_first']} at the first draft), "
          f"{total['near_tie']} of them near-ties, {not_tie} not")
    if require and (not_tie or unpaired):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
