#!/usr/bin/env python3
"""A/B of the worker's --overlap (gradient push during the backward pass), or
of another boolean worker flag (--ab_flag=overlap_bn: BN backward exchanges
overlapping a weight gradient), through the local-cluster launcher.

For each policy, worker count and batch size it runs short jobs on
Fashion-MNIST (the step time is seconds.total / steps of worker 0's report,
which counts the training steps only, not start-up or evaluation), alternating
--<flag>=true and --<flag>=false, --reps times each, and prints one table
row per (policy, workers, batch, overlap): min / median / max milliseconds per
step, and of that the medians of the gradient-sync share (pull + the wait for
the push) and of the BN-sync share (the time the model waited for BN
exchanges; with the overlap on, only the wait after the overlapped work).

Usage (after `bazel build //server:bnps_server //worker:bnps_worker`):
    python3 tools/bench/overlap_ab.py --workers 1,2 --batch 8,32 \\
        --policy sync,local --steps 100 --reps 3

The machine's load average is printed before and after: compare rows only
from quiet runs. Exit status: 0, or 1 if a run failed (its output is shown).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_once(args, policy, workers, batch, on):
    with tempfile.TemporaryDirectory(prefix="bnps_overlap_ab_") as out_dir:
        cmd = [sys.executable, os.path.join(REPO, "tools", "bnps_launch.py"),
               "--servers=%d" % args.servers, "--workers=%d" % workers,
               "--policy=" + policy, "--out_dir=" + out_dir,
               "--batch_size=%d" % batch, "--max_steps=%d" % args.steps,
               "--train_examples=%d" % (batch * workers * args.steps),
               "--eval=none", "--seed=1",
               "--threads=1", "--%s=%s" % (args.ab_flag, "true" if on else "false")]
        cmd += args.extra
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        if p.returncode != 0:
            sys.stdout.write(p.stdout[-4000:])
            raise RuntimeError("run failed: " + " ".join(cmd))
        with open(os.path.join(out_dir, "worker0.json")) as f:
            r = json.load(f)
    steps = max(1, r["steps"])
    sec = r["seconds"]
    return (1000.0 * sec["total"] / steps, 1000.0 * sec["grad_sync"] / steps,
            1000.0 * sec["bn_sync"] / steps)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", default="1,2")
    p.add_argument("--batch", default="8,32")
    p.add_argument("--policy", default="sync,local")
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--ab_flag", default="overlap",
                   help="the boolean worker flag to turn on and off")
    args, extra = p.parse_known_args(argv)
    args.extra = extra  # more worker flags, passed through
    print("load before:", os.getloadavg())
    print("%-6s %2s %5s %-7s %8s %8s %8s %8s %8s" % (
        "policy", "W", "batch", args.ab_flag[:7], "min_ms", "med_ms", "max_ms",
        "grad_ms", "bn_ms"))
    for policy in args.policy.split(","):
        for workers in [int(w) for w in args.workers.split(",")]:
            for batch in [int(b) for b in args.batch.split(",")]:
                got = {True: [], False: []}
                for _ in range(args.reps):
                    for overlap in (True, False):
                        got[overlap].append(
                            run_once(args, policy, workers, batch, overlap))
                for overlap in (True, False):
                    step = [s for s, _, _ in got[overlap]]
                    grad = [g for _, g, _ in got[overlap]]
                    bn = [b for _, _, b in got[overlap]]
                    print("%-6s %2d %5d %-7s %8.2f %8.2f %8.2f %8.2f %8.2f" % (
                        policy, workers, batch, "on" if overlap else "off",
                        min(step), statistics.median(step), max(step),
                        statistics.median(grad), statistics.median(bn)),
                          flush=True)
    print("load after:", os.getloadavg())
    return 0


if __name__ == "__main__":
    sys.exit(main())
