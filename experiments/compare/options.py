"""The command line: flags, their defaults (the full matrix and --smoke),
their checks, and the config dict every other module reads.
"""

import argparse
import os

from .matrix import GRID_ROWS, MATRICES, POSITIONS, REPO, ROWS, SWEEP as ROWS_SWEEP

# libbnps.so: the launcher resolves the policies with it (bnps.policy).
BUILD_TARGETS = ["//server:bnps_server", "//worker:bnps_worker", "//python:libbnps.so"]

# Per --matrix; --smoke's sizes win over them (explicit flags over both).
DEFAULTS = {
    # The policies x batch sizes of the CNN (the first comparison).
    "grid": dict(batch_sizes="2,8,32", workers=4, servers=2, seeds="1", epochs=2,
                 train_examples=20000, test_examples=10000, timeout_s=900.0,
                 learning_rate=0.1, lr_scaling="fixed"),
    # Samples per channel per worker from 1 to 98, 3 seeds: ~45 min on 2 cores.
    "regime": dict(batch_sizes="", workers=4, servers=2, seeds="1,2,3", epochs=1,
                   train_examples=3000, test_examples=5000, timeout_s=900.0,
                   learning_rate=0.02, lr_scaling="linear"),
    # Up to 1568 samples per channel, more rows, 5 seeds, 3x the data.
    "full": dict(batch_sizes="", workers=4, servers=2, seeds="1,2,3,4,5", epochs=1,
                 train_examples=12000, test_examples=10000, timeout_s=1800.0,
                 learning_rate=0.02, lr_scaling="linear"),
}
DEFAULTS["smoke"] = DEFAULTS["regime"]
# The one-axis matrices (matrix.AXES), 3 seeds each, sized to ~20 min on 2
# idle cores. Staleness: 4 workers, as the regime matrix, 2x its data; groups: 8 workers
# (K = 1, 2, 4, 8), 4x the data so that b=8 still trains 188 steps.
DEFAULTS["staleness"] = dict(DEFAULTS["regime"], train_examples=6000)
DEFAULTS["groups"] = dict(DEFAULTS["regime"], workers=8, train_examples=12000)


def DEFAULT_TEXT(name):  # noqa: N802  (reads as a constant in the help)
    return ", ".join("%s %s" % (m, DEFAULTS[m][name]) for m in ("regime", "full", "grid"))


SMOKE = dict(batch_sizes="2,8", workers=2, servers=2, seeds="1", epochs=1,
             train_examples=256, test_examples=200, timeout_s=120.0)

# Worker flags the tool (or the launcher) sets; --worker_flag may not.
TOOL_WORKER_FLAGS = {"batch_size", "model", "bn_policy", "gradients", "epochs", "train_examples", "test_examples", "seed",
                     "threads", "recalibrate", "recal_mode", "recal_examples",
                     "eval_every_epoch", "servers", "worker", "num_workers", "report",
                     "progress", "policy", "staleness", "bn_staleness", "bn_group_size",
                     "learning_rate", "momentum",
                     "weight_decay", "job"}


class UsageError(Exception):
    pass


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="compare_policies.py",
        description="Run every BN policy on the same model, data and seeds over "
        "several per-worker batch sizes, and write docs/results.md (tables, "
        "plots) and docs/results.json.", allow_abbrev=False)
    g = p.add_argument_group("the matrix")
    g.add_argument("--matrix", choices=sorted(MATRICES) + ["grid"], default="regime",
                   help="regime (default): samples per channel per worker swept by "
                   "model variant (--model of the worker: %s positions per example) and "
                   "per-worker batch, rows %s, plus the crossed async rows in one cell; "
                   "full: a larger one (more batch sizes, rows and seeds, 3x the data; "
                   "hours on 2 cores); smoke: a tiny regime matrix for tests; grid: "
                   "--policies x --batch_sizes on --model (the first comparison); staleness: "
                   "test error against the exact BN staleness s (--bn_staleness); groups: "
                   "against the BN group size K of 8 workers (--bn_group_size). The "
                   "cells are listed in experiments/compare/matrix.py (MATRICES)"
                   % (", ".join("%s %d" % kv for kv in sorted(POSITIONS.items())),
                      ", ".join(ROWS_SWEEP)))
    g.add_argument("--policies", default=",".join(GRID_ROWS),
                   help="--matrix=grid: rows, comma-separated, from: %s (default %s)"
                   % (", ".join(ROWS), ", ".join(GRID_ROWS)))
    g.add_argument("--batch_sizes", help="--matrix=grid: per-worker batch sizes (default %s)"
                   % DEFAULTS["grid"]["batch_sizes"])
    g.add_argument("--model", choices=sorted(POSITIONS), default="cnn",
                   help="--matrix=grid: the worker's --model (default cnn)")
    g.add_argument("--workers", type=int, help="workers per run (default %d; the "
                   "reference uses 1 with batch workers x b)" % DEFAULTS["regime"]["workers"])
    g.add_argument("--servers", type=int, help="shard servers (default %d)" % DEFAULTS["regime"]["servers"])
    g.add_argument("--seeds", help="seeds, comma-separated (default %s)" % DEFAULT_TEXT("seeds"))
    g.add_argument("--epochs", type=int, help="default %s" % DEFAULT_TEXT("epochs"))
    g.add_argument("--train_examples", type=int,
                   help="first this-many training examples, 0 for all 60000 (default %s)"
                   % DEFAULT_TEXT("train_examples"))
    g.add_argument("--test_examples", type=int,
                   help="first this-many test examples, 0 for all 10000 (default %s)"
                   % DEFAULT_TEXT("test_examples"))
    g.add_argument("--smoke", action="store_true",
                   help="a tiny configuration (batch sizes %s, %d workers, %d training "
                   "and %d test examples, 1 epoch); explicit flags still win"
                   % (SMOKE["batch_sizes"], SMOKE["workers"], SMOKE["train_examples"],
                      SMOKE["test_examples"]))
    g = p.add_argument_group("training (the same for every run)")
    g.add_argument("--learning_rate", type=float,
                   help="SGD learning rate (default %s); with --lr_scaling=linear the one "
                   "of global batch 4, scaled by workers x b / 4" % DEFAULT_TEXT("learning_rate"))
    g.add_argument("--lr_scaling", choices=["fixed", "linear"],
                   help="fixed: --learning_rate at every batch size; linear: scaled with "
                   "the global batch (default %s). At global batch 4 a fixed 0.1 made "
                   "some fc_bn runs diverge while others learned" % DEFAULT_TEXT("lr_scaling"))
    g.add_argument("--async_learning_rate", type=float,
                   help="learning rate of the async rows (default: --learning_rate / "
                   "--workers). "
                   "Under async every worker's gradient is applied on its own, so each "
                   "update has batch b, not workers x b; --learning_rate/workers is the "
                   "linear-scaling equivalent")
    g.add_argument("--momentum", type=float, default=0.9, help="default 0.9")
    g.add_argument("--weight_decay", type=float, default=0.0, help="default 0")
    g.add_argument("--bn_momentum", type=float, help="servers' BN running-stat momentum "
                   "(default: theirs, 0.1)")
    g.add_argument("--recal_examples", type=int, default=0,
                   help="recalibrate over this many training examples (0: all trained on)")
    g.add_argument("--eval_every_epoch", choices=["auto", "true", "false"], default="auto",
                   help="test after every epoch (auto: when --epochs >= 2)")
    g.add_argument("--threads", type=int, default=1,
                   help="model threads per worker of the multi-worker runs (default 1)")
    g.add_argument("--reference_threads", type=int, default=0,
                   help="threads of the 1-worker reference (0: --threads; more threads "
                   "than free cores make OpenMP crawl: 5x slower measured here)")
    g.add_argument("--worker_flag", action="append", default=[], metavar="--FLAG=VALUE",
                   help="another flag for every worker (repeatable), e.g. "
                   "--worker_flag=--device=gpu --worker_flag=--width=32")
    g = p.add_argument_group("running")
    g.add_argument("--bin_dir", default=os.path.join(REPO, "bazel-bin"),
                   help="holds server/bnps_server and worker/bnps_worker "
                   "(default <repo>/bazel-bin)")
    g.add_argument("--build", action="store_true", help="run `bazel build %s` first"
                   % " ".join(BUILD_TARGETS))
    g.add_argument("--out_dir", help="one sub-directory per run (default: a fresh temp dir)")
    g.add_argument("--timeout_s", type=float,
                   help="limit on each run (default %s; --smoke %g)"
                   % (DEFAULT_TEXT("timeout_s"), SMOKE["timeout_s"]))
    g.add_argument("--dry_run", action="store_true",
                   help="print the runs' commands and the time estimate; run nothing")
    g.add_argument("--inject_failure", action="append", default=[], metavar="ROW@B",
                   help="(for tests) make the run of ROW at batch B fail (its workers "
                   "get --width=0)")
    g = p.add_argument_group("the report")
    g.add_argument("--results", default=os.path.join(REPO, "docs", "results.md"),
                   help="the markdown report; plots and results.json go next to it "
                   "(default docs/results.md)")
    g.add_argument("--results_json",
                   help="raw results (default: --results with .json)")
    g.add_argument("--report_only", action="store_true",
                   help="run nothing: re-render the report and plots from --results_json")
    g.add_argument("--plots_only", action="store_true", help=argparse.SUPPRESS)
    g.add_argument("--no_plots", action="store_true", help="skip the plots")
    args = p.parse_args(argv)
    try:
        finish_args(args)
    except UsageError as e:
        p.error(str(e))
    return args


def int_list(text, name, minimum):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError("--%s must be comma-separated integers (got %r)" % (name, text))
    if not values:
        raise UsageError("--%s is empty" % name)
    if any(v < minimum for v in values):
        raise UsageError("--%s values must be >= %d (got %r)" % (name, minimum, text))
    if len(set(values)) != len(values):
        raise UsageError("--%s has duplicates (%r)" % (name, text))
    return values


def finish_args(args):
    base = dict(DEFAULTS[args.matrix])
    if args.smoke:
        base.update(SMOKE)
    for name, value in base.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.results_json is None:
        args.results_json = os.path.splitext(args.results)[0] + ".json"
    if args.report_only or args.plots_only:
        return
    if args.matrix != "grid":
        if args.batch_sizes != base["batch_sizes"] or args.policies != ",".join(GRID_ROWS):
            raise UsageError("--policies and --batch_sizes choose the rows of "
                             "--matrix=grid; --matrix=%s has its own cells" % args.matrix)
        args.batch_sizes = ",".join(str(b) for b in sorted({c[1] for c in MATRICES[args.matrix]}))
    args.batch_size_list = int_list(args.batch_sizes, "batch_sizes", 1)
    args.seed_list = int_list(args.seeds, "seeds", 0)
    args.policy_list = [v.strip() for v in args.policies.split(",") if v.strip()]
    unknown = [v for v in args.policy_list if v not in ROWS]
    if unknown or not args.policy_list:
        raise UsageError("--policies: unknown %s; choose from %s"
                         % (", ".join(unknown) or "(empty)", ", ".join(ROWS)))
    if args.matrix != "grid":
        args.policy_list = list(dict.fromkeys(
            row for cell in MATRICES[args.matrix] for row in cell[2]))
    if args.async_learning_rate is not None and args.async_learning_rate <= 0:
        raise UsageError("--async_learning_rate must be > 0")
    if args.learning_rate <= 0:
        raise UsageError("--learning_rate must be > 0")
    if len(set(args.policy_list)) != len(args.policy_list):
        raise UsageError("--policies has duplicates")
    for name in ("workers", "servers", "epochs", "threads"):
        if getattr(args, name) < 1:
            raise UsageError("--%s must be >= 1" % name)
    for name in ("train_examples", "test_examples", "recal_examples", "reference_threads"):
        if getattr(args, name) < 0:
            raise UsageError("--%s must be >= 0" % name)
    if args.timeout_s <= 0:
        raise UsageError("--timeout_s must be > 0")
    for flag in args.worker_flag:
        if not flag.startswith("--") or "=" not in flag:
            raise UsageError("--worker_flag takes --flag=value (got %r)" % flag)
        name = flag[2:].split("=", 1)[0]
        if name in TOOL_WORKER_FLAGS:
            raise UsageError("--worker_flag=%s: this tool sets --%s itself%s" % (
                flag, name, "; use its own --%s" % name if name in (
                    "epochs", "train_examples", "test_examples", "threads",
                    "recal_examples", "eval_every_epoch") else ""))
    args.inject = set()
    for item in args.inject_failure:
        row, _, b = item.partition("@")
        if row not in ROWS or not b.isdigit():
            raise UsageError("--inject_failure takes ROW@B, e.g. local@8 (got %r)" % item)
        args.inject.add((row, int(b)))


def make_config(args):
    cores = os.cpu_count() or 1
    return {
        "matrix": args.matrix, "model": args.model,
        "policies": args.policy_list, "batch_sizes": args.batch_size_list,
        "seeds": args.seed_list, "workers": args.workers, "servers": args.servers,
        "epochs": args.epochs, "train_examples": args.train_examples,
        "test_examples": args.test_examples, "learning_rate": args.learning_rate,
        "lr_scaling": args.lr_scaling,
        # Linear scaling: an async update has batch b, a sync one workers x b.
        "async_learning_rate": (args.async_learning_rate
                                if args.async_learning_rate is not None
                                else args.learning_rate / args.workers),
        "momentum": args.momentum, "weight_decay": args.weight_decay,
        "bn_momentum": args.bn_momentum, "recal_examples": args.recal_examples,
        "eval_every_epoch": args.eval_every_epoch, "threads": args.threads,
        "reference_threads": args.reference_threads,
        "reference_threads_used": args.reference_threads or args.threads,
        "cores": cores, "worker_flags": list(args.worker_flag),
        "bin_dir": os.path.abspath(args.bin_dir), "timeout_s": args.timeout_s,
        "smoke": args.smoke, "inject": sorted([list(x) for x in args.inject]),
    }
