#!/usr/bin/env python3
"""Instructions per IO by differencing two variants of different IO counts.

usage: insns-difference.py RUN_DIR [SMALL_SUFFIX LARGE_SUFFIX] [--functions N]

For every kernel, scenario and variant pair NAME-2k / NAME-10k (suffixes
default -2k and -10k) of a `blklab run --count-insns` directory, and each
iteration present for both, prints

    per IO = (count(large) - count(small)) / (IOs(large) - IOs(small))

for kernel and user instructions, idle entries, context switches and the
block-layer and virtio functions, which cancels what does not scale with the
IO count (fio's start-up and exit, the SYNC handshakes). Then, per NAME, the
functions whose per-IO difference between the first kernel and each other
one is largest. Pure standard library."""
import collections
import glob
import json
import os
import re
import statistics
import sys


def load(run_dir):
    recs = collections.defaultdict(dict)
    for p in glob.glob(os.path.join(run_dir, "*.json")):
        r = json.load(open(p))
        if r.get("schema") != "blklab-run-result/1" or not r.get("instructions"):
            continue
        recs[(r["kernel"], r["scenario"], r["variant"])][r["iteration"]] = r
    return recs


def function_insns(ins):
    """Instructions per function over the window: `function_insns`, or, in
    records written before it existed, `functions` (per IO) times `ios`."""
    if ins.get("function_insns"):
        return ins["function_insns"]
    n = ins.get("ios") or 0
    return {f: v * n for f, v in (ins.get("functions") or {}).items()}


def ios(r):
    return r["checks"]["guest_block_ios"]


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    top = 12
    if "--functions" in sys.argv:
        top = int(sys.argv[sys.argv.index("--functions") + 1])
        args.remove(str(top))
    if not args:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    run_dir = args[0]
    small, large = (args[1], args[2]) if len(args) >= 3 else ("-2k", "-10k")
    run = json.load(open(os.path.join(run_dir, "run.json")))
    kernels = [k["label"] for k in run["kernels"]]
    recs = load(run_dir)
    names = sorted({(s, v[: -len(large)]) for (_, s, v) in recs if v.endswith(large)})
    per = {}  # (kernel, scenario, name) -> list of dicts (one per iteration)
    for k in kernels:
        for s, n in names:
            a = recs.get((k, s, n + small), {})
            b = recs.get((k, s, n + large), {})
            rows = []
            for it in sorted(set(a) & set(b)):
                ra, rb = a[it], b[it]
                d = ios(rb) - ios(ra)
                ia, ib = ra["instructions"], rb["instructions"]
                row = {
                    "kernel": (ib["kernel"] - ia["kernel"]) / d,
                    "user": (ib["user"] - ia["user"]) / d,
                    "idle": ((ib["idle_entries"] or 0) - (ia["idle_entries"] or 0)) / d,
                    "ctxsw": (rb["guest"]["context_switches"] - ra["guest"]["context_switches"]) / d,
                    "window_kernel": ib["kernel_per_io"],
                    "f": {},
                }
                fa, fb = function_insns(ia), function_insns(ib)
                for f in set(fa) | set(fb):
                    row["f"][f] = (fb.get(f, 0) - fa.get(f, 0)) / d
                rows.append(row)
            per[(k, s, n)] = rows

    def ms(v):
        if not v:
            return "-"
        sd = statistics.stdev(v) if len(v) > 1 else 0.0
        return f"{statistics.mean(v):.1f} ± {sd:.1f} (n={len(v)}, range {min(v):.1f}..{max(v):.1f})"

    for s, n in names:
        print(f"== {s}/{n}{small} vs {n}{large}: per IO by differencing")
        for k in kernels:
            rows = per[(k, s, n)]
            if not rows:
                continue
            print(f"  {k}:")
            for key, label in [("kernel", "kernel insns/IO"), ("user", "user insns/IO"),
                               ("idle", "idle entries/IO"), ("ctxsw", "context switches/IO"),
                               ("window_kernel", f"(SYNC window of {n}{large}: kernel insns/IO)")]:
                print(f"    {label:40s} {ms([r[key] for r in rows])}")
        base = kernels[0]
        for k in kernels[1:]:
            ra, rb = per[(base, s, n)], per[(k, s, n)]
            if not ra or not rb:
                continue
            fs = set().union(*[r["f"] for r in ra + rb])
            diffs = []
            for f in fs:
                va = [r["f"].get(f, 0.0) for r in ra]
                vb = [r["f"].get(f, 0.0) for r in rb]
                diffs.append((statistics.mean(vb) - statistics.mean(va), f, va, vb))
            diffs.sort(key=lambda x: -abs(x[0]))
            total = sum(d[0] for d in diffs)
            print(f"  functions, {k} - {base} (sum over all functions {total:+.1f}/IO):")
            for d, f, va, vb in diffs[:top]:
                print(f"    {f:34s} {d:+8.1f}   {base} {ms(va)}   {k} {ms(vb)}")
        print()


if __name__ == "__main__":
    main()
