#!/usr/bin/env python3
"""The policy comparison: one command runs a matrix of training runs with the
same model, data, seed(s) and number of epochs under every BN policy, and
writes a report (docs/results.md, plots next to it, raw data in
docs/results.json).

Usage:
    bazel build //server:bnps_server //worker:bnps_worker
    python3 tools/compare_policies.py                  # the default matrix
    python3 tools/compare_policies.py --smoke --results=/tmp/r/results.md
    python3 tools/compare_policies.py --report_only    # re-render from JSON
    python3 tools/compare_policies.py --dry_run        # commands + estimate

The matrix (rows x per-worker batch sizes x seeds), run one at a time through
tools/bnps_launch.py, each run with its own --out_dir under --out_dir:
    reference      1 worker with the global batch (workers x b), policy sync
                   (with one worker every policy is the same computation)
    local          local BN; running stats averaged at the end (the control)
    sync           exact cross-worker BN every step
    async-s1       bounded staleness, --staleness=1
    async-s4       bounded staleness, --staleness=4
    recal-precise  local BN, population stats recomputed after training
    recal-exact    the same, layer by layer (--recal_mode=exact)
Every run uses --workers workers (the reference 1) with per-worker batch b,
--servers shard servers, the same --train_examples, --epochs, --test_examples
(worker 0 evaluates on the same first test examples), --seed, learning rate,
momentum and weight decay. Every non-recal run also gets --recalibrate=true
(recal mode precise), so "accuracy after recalibrating the running stats" is
there for every row. With --epochs >= 2 the workers also evaluate after every
epoch (--eval_every_epoch), which gives the test points of the over-time plot.

Learning rate: fixed (--learning_rate, default 0.1, momentum 0.9, the
servers' defaults), not scaled with the batch. All rows of one batch size
share the global batch (workers x b), so the comparison between policies at
a given b is fair; across batch sizes the effective step differs, which the
report says. Async is the exception to "the same update": every worker's
gradient is applied on its own, so an update has batch b and there are
workers x as many. In the calibration async at b=2 did not learn at all at
0.1 (loss ~2.4, test accuracy 0.10 after 3000 steps) while sync reached 0.82;
so the async rows get --async_learning_rate, by default --learning_rate /
workers (0.025 for 0.1 and 4 workers: the linear-scaling equivalent, the same
step per example), and the report says so.

Per run it records: status (ok, or failed with the launcher's reason line and
the last stderr line of the process it blamed), the test accuracy with the
running statistics, the test accuracy after recalibration, the final training
loss (mean over workers of each worker's last reporting interval), images/s
summed over the workers, milliseconds per step split into compute, BN sync
and gradient sync (each worker's seconds / steps, averaged over workers),
max staleness, and wall time. Over seeds: mean and min-max.

Budget and calibration (the default matrix must finish within 45 min on 2 CPU
cores, so it is shrunk to fit). Measured with this tool on the project's
2-core AMD EPYC VM (23 GiB), 4 workers + 2 servers on the 2 cores, while
another benchmark ran on the same machine (load 3-6), from matrices of 3072
training examples and full-size sync/async runs at b=2:
    milliseconds per step      b=2    b=8    b=32
    sync                        18     27     64
    async (s1, s4)              13     23     57
    local                       10     22     57
    recal (precise, exact)       8     22     60
    reference (1 worker, 4b)    11     24     84
    fixed per run: ~2 s start-up, ~0.8 s per test evaluation of 10000
    examples; recalibration ~0.35 x one epoch's training time (precise),
    ~1 x (exact)
A first, single sync run at b=2 measured 34 ms per step, so the same runs
vary by up to ~1.9x on the shared machine. The default is --train_examples=
20000 (of 60000) and --epochs=2 (40000 examples seen per run; 5000 steps at
b=2, 312 at b=32), all 10000 test examples, one seed: 21 runs, estimated
16 min (up to ~31 min at the slow end), within the 45-minute budget. The
model behind the estimate is estimate_seconds (it was within 10% of the
measured full-size b=2 runs); --dry_run prints it for any configuration.
Scale up with --train_examples=0 (all 60000), more --epochs and
--seeds=1,2,3 on a larger machine, or on a GPU with --worker_flag=--device=gpu.
Threads: one model thread per worker (--threads), the reference too: on the
loaded 2 cores a 2-thread reference ran 5x slower than a 1-thread one.

Failures: a run that fails (non-zero launcher exit, its timeout, a missing
report) is recorded as failed with the reason and the matrix goes on; the
report lists it. Exit status: 0 when every run succeeded, 1 when some failed
(the report is still written), 2 for bad usage, 130 after Ctrl-C or SIGTERM
(the report is written with the runs done so far; the rest are "not run").

Plots need matplotlib (Debian's python3-matplotlib; `tools/setup.sh --peers`).
When this interpreter lacks it but /usr/bin/python3 has it, the plots are
drawn by running this file there with --plots_only. Otherwise the report says
the plots were skipped; everything else works with the standard library.

A hand-written part of "What the numbers say", between the lines
<!-- BEGIN hand-written --> and <!-- END hand-written -->, survives re-rendering
(--report_only, or a new run writing the same --results).
"""

import argparse
import datetime
import json
import math
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LAUNCHER = os.path.join(HERE, "bnps_launch.py")
BUILD_TARGETS = ["//server:bnps_server", "//worker:bnps_worker"]
SYSTEM_PYTHON = "/usr/bin/python3"
BUDGET_MINUTES = 45

# Row name -> (launcher policy, staleness, recal mode, description).
POLICIES = {
    "reference": ("sync", None, None, "1 worker, global batch"),
    "local": ("local", None, None, "local BN, running stats averaged"),
    "sync": ("sync", None, None, "exact cross-worker BN every step"),
    "async-s1": ("async", 1, None, "bounded staleness 1"),
    "async-s4": ("async", 4, None, "bounded staleness 4"),
    "recal-precise": ("recal", None, "precise", "recalibrated after training, one pass"),
    "recal-exact": ("recal", None, "exact", "recalibrated after training, layer by layer"),
}
FAMILIES = [("sync", ["sync"]), ("async", ["async-s1", "async-s4"]),
            ("recal", ["recal-precise", "recal-exact"])]

DEFAULTS = dict(batch_sizes="2,8,32", workers=4, servers=2, seeds="1",
                epochs=2, train_examples=20000, test_examples=10000,
                timeout_s=900.0)
SMOKE = dict(batch_sizes="2,8", workers=4, servers=2, seeds="1", epochs=1,
             train_examples=256, test_examples=200, timeout_s=120.0)

# Worker flags the tool (or the launcher) sets; --worker_flag may not.
TOOL_WORKER_FLAGS = {"batch_size", "epochs", "train_examples", "test_examples", "seed",
                     "threads", "recalibrate", "recal_mode", "recal_examples",
                     "eval_every_epoch", "servers", "worker", "num_workers", "report",
                     "progress", "policy", "staleness", "learning_rate", "momentum",
                     "weight_decay", "job"}
BEGIN_HAND = "<!-- BEGIN hand-written -->"
END_HAND = "<!-- END hand-written -->"
DEVICE_RE = re.compile(r"bnps_worker \d+/\d+: policy \w+, (\w+), model depth (\d+) "
                       r"width (\d+) \((\d+) weights\)")


class UsageError(Exception):
    pass


# ----------------------------------------------------------------------------
# Command line


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="compare_policies.py",
        description="Run every BN policy on the same model, data and seeds over "
        "several per-worker batch sizes, and write docs/results.md (tables, "
        "plots) and docs/results.json.", allow_abbrev=False)
    g = p.add_argument_group("the matrix")
    g.add_argument("--policies", default=",".join(POLICIES),
                   help="rows, comma-separated, from: %s (default all)" % ", ".join(POLICIES))
    g.add_argument("--batch_sizes", help="per-worker batch sizes (default %s)"
                   % DEFAULTS["batch_sizes"])
    g.add_argument("--workers", type=int, help="workers per run (default %d; the "
                   "reference uses 1 with batch workers x b)" % DEFAULTS["workers"])
    g.add_argument("--servers", type=int, help="shard servers (default %d)" % DEFAULTS["servers"])
    g.add_argument("--seeds", help="seeds, comma-separated (default %s)" % DEFAULTS["seeds"])
    g.add_argument("--epochs", type=int, help="default %d" % DEFAULTS["epochs"])
    g.add_argument("--train_examples", type=int,
                   help="first this-many training examples, 0 for all 60000 (default %d)"
                   % DEFAULTS["train_examples"])
    g.add_argument("--test_examples", type=int,
                   help="first this-many test examples, 0 for all 10000 (default %d)"
                   % DEFAULTS["test_examples"])
    g.add_argument("--smoke", action="store_true",
                   help="a tiny configuration (batch sizes %s, %d training and %d test "
                   "examples, 1 epoch); explicit flags still win"
                   % (SMOKE["batch_sizes"], SMOKE["train_examples"], SMOKE["test_examples"]))
    g = p.add_argument_group("training (the same for every run)")
    g.add_argument("--learning_rate", type=float, default=0.1,
                   help="SGD learning rate, fixed for every batch size (default 0.1)")
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
                   help="limit on each run (default %g; --smoke %g)"
                   % (DEFAULTS["timeout_s"], SMOKE["timeout_s"]))
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
    base = SMOKE if args.smoke else DEFAULTS
    for name, value in base.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.results_json is None:
        args.results_json = os.path.splitext(args.results)[0] + ".json"
    if args.report_only or args.plots_only:
        return
    args.batch_size_list = int_list(args.batch_sizes, "batch_sizes", 1)
    args.seed_list = int_list(args.seeds, "seeds", 0)
    args.policy_list = [v.strip() for v in args.policies.split(",") if v.strip()]
    unknown = [v for v in args.policy_list if v not in POLICIES]
    if unknown or not args.policy_list:
        raise UsageError("--policies: unknown %s; choose from %s"
                         % (", ".join(unknown) or "(empty)", ", ".join(POLICIES)))
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
        if row not in POLICIES or not b.isdigit():
            raise UsageError("--inject_failure takes ROW@B, e.g. local@8 (got %r)" % item)
        args.inject.add((row, int(b)))


# ----------------------------------------------------------------------------
# The runs


def eval_every_epoch(config):
    mode = config["eval_every_epoch"]
    return config["epochs"] >= 2 if mode == "auto" else mode == "true"


def plan_runs(config):
    """The runs in order: seed, then batch size, then row (so an interrupted
    matrix still holds whole seeds)."""
    runs = []
    for seed in config["seeds"]:
        for b in config["batch_sizes"]:
            for row in config["policies"]:
                runs.append({"id": "%s_b%d_seed%d" % (row, b, seed), "policy": row,
                             "batch_size": b, "seed": seed, "status": "not run"})
    return runs


def learning_rate(config, row):
    if POLICIES[row][0] == "async" and config.get("async_learning_rate") is not None:
        return config["async_learning_rate"]
    return config["learning_rate"]


def run_command(config, run, run_dir, inject):
    """The launcher command of one run."""
    row, b = run["policy"], run["batch_size"]
    policy, staleness, recal_mode, _ = POLICIES[row]
    workers = 1 if row == "reference" else config["workers"]
    batch = config["workers"] * b if row == "reference" else b
    threads = config["threads"]
    if row == "reference":
        threads = config["reference_threads_used"]
    cmd = [sys.executable, LAUNCHER, "--servers=%d" % config["servers"],
           "--workers=%d" % workers, "--policy=" + policy,
           "--bin_dir=" + config["bin_dir"], "--out_dir=" + run_dir,
           "--timeout_s=%g" % config["timeout_s"],
           "--learning_rate=%g" % learning_rate(config, row),
           "--momentum=%g" % config["momentum"],
           "--weight_decay=%g" % config["weight_decay"]]
    if staleness is not None:
        cmd.append("--staleness=%d" % staleness)
    if config["bn_momentum"] is not None:
        cmd.append("--bn_momentum=%g" % config["bn_momentum"])
    cmd += ["--batch_size=%d" % batch, "--epochs=%d" % config["epochs"],
            "--train_examples=%d" % config["train_examples"],
            "--test_examples=%d" % config["test_examples"],
            "--seed=%d" % run["seed"], "--threads=%d" % threads]
    if recal_mode is not None:
        cmd.append("--recal_mode=" + recal_mode)
    else:
        cmd.append("--recalibrate=true")
    if config["recal_examples"]:
        cmd.append("--recal_examples=%d" % config["recal_examples"])
    if eval_every_epoch(config):
        cmd.append("--eval_every_epoch=true")
    cmd += config["worker_flags"]
    if inject:
        cmd.append("--width=0")  # The worker rejects it: a run that fails.
    run.update(workers=workers, worker_batch=batch, launcher_policy=policy,
               staleness=staleness, recal_mode=recal_mode, threads=threads)
    return cmd


def failure_reason(log_text, code):
    """(reason, detail) from the launcher's output: its FAILED line (or usage
    error) and the last line of the blamed process's stderr tail."""
    reason, detail = None, None
    lines = log_text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"bnps_launch(?:\.py)?: (?:FAILED: |error: )(.*)", line)
        if m and reason is None:
            reason = m.group(1).strip()
            tail = []
            for follow in lines[i + 1:]:
                if follow.startswith("bnps_launch: last "):
                    continue
                if not follow.startswith("  "):
                    break
                tail.append(follow.strip())
            if tail:
                detail = tail[-1]
    if reason is None:
        reason = "the launcher exited with code %s" % code
    return reason, detail


def mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def read_summary(run, run_dir):
    """Fills run's figures from <run_dir>/summary.json; returns a problem or None."""
    path = os.path.join(run_dir, "summary.json")
    try:
        with open(path, encoding="utf-8") as f:
            summary = json.load(f)
        reports = [r for r in summary.get("reports") or [] if isinstance(r, dict)]
    except (OSError, ValueError) as e:
        return "no readable summary.json (%s)" % e
    if len(reports) != run["workers"]:
        return "%d of %d worker reports" % (len(reports), run["workers"])
    w0 = next((r for r in reports if r.get("worker") == 0), reports[0])
    run["launcher_wall_s"] = summary.get("wall_s")
    run["steps"] = w0.get("steps")
    run["epochs_done"] = w0.get("epochs")
    run["test_accuracy"] = w0.get("test_accuracy")
    run["test_accuracy_recal"] = w0.get("test_accuracy_recal")
    run["train_loss_first"] = mean(r.get("train_loss_first") for r in reports)
    run["train_loss_last"] = mean(r.get("train_loss_last") for r in reports)
    ips = [r.get("images_per_second") for r in reports]
    run["images_per_second"] = sum(v for v in ips if v is not None)
    ms = {}
    for key in ("total", "compute", "bn_sync", "grad_sync"):
        per = [1000.0 * (r.get("seconds") or {}).get(key, 0.0) / r["steps"]
               for r in reports if r.get("steps")]
        ms[key] = mean(per)
    run["ms_per_step"] = ms
    run["finish_s"] = mean((r.get("seconds") or {}).get("finish") for r in reports)
    run["max_staleness"] = max((r.get("max_staleness") or 0) for r in reports)
    run["history"] = w0.get("history") or []
    run["evals"] = w0.get("evals") or []
    if run["test_accuracy"] is None:
        return "worker 0 reported no test accuracy"
    return None


def device_line(run_dir):
    try:
        with open(os.path.join(run_dir, "w0.log"), encoding="utf-8", errors="replace") as f:
            for line in f:
                m = DEVICE_RE.search(line)
                if m:
                    return {"device": m.group(1), "depth": int(m.group(2)),
                            "width": int(m.group(3)), "weights": int(m.group(4))}
    except OSError:
        pass
    return None


class Stop(Exception):
    """SIGTERM/SIGHUP arrived (SIGINT is KeyboardInterrupt)."""


def on_stop_signal(signum, frame):
    raise Stop(signal.Signals(signum).name)


def stop_launcher(proc):
    """SIGTERMs the launcher, which then stops its cluster (after a Ctrl-C on
    a terminal it has SIGINT already; a second signal only makes it SIGKILL
    its children without the grace period), and SIGKILLs the launcher if it is
    still there after 30 s. Bounded: ~40 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def execute(config, run, inject):
    """Runs one launcher to the end (bounded by its --timeout_s plus a margin)
    and fills `run`."""
    run_dir = os.path.join(config["out_dir"], run["id"])
    os.makedirs(run_dir, exist_ok=True)
    cmd = run_command(config, run, run_dir, inject)
    run["command"] = cmd
    run["out_dir"] = run_dir
    log_path = os.path.join(run_dir, "launcher.log")
    t0 = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            # The launcher stops itself at --timeout_s; this is the backstop.
            code = proc.wait(timeout=config["timeout_s"] + 60)
        except subprocess.TimeoutExpired:
            stop_launcher(proc)
            code = None
        except (KeyboardInterrupt, Stop):
            stop_launcher(proc)
            raise
    run["wall_s"] = time.monotonic() - t0
    run["exit_code"] = code
    with open(log_path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    run["worker_info"] = device_line(run_dir)
    if code is None:
        run.update(status="failed", reason="no result within --timeout_s=%g + 60 s; "
                   "stopped" % config["timeout_s"], detail=None)
    elif code != 0:
        reason, detail = failure_reason(text, code)
        run.update(status="failed", reason=reason, detail=detail)
    else:
        problem = read_summary(run, run_dir)
        if problem:
            run.update(status="failed", reason=problem, detail=None)
        else:
            run.update(status="ok", reason=None, detail=None)


# ----------------------------------------------------------------------------
# Estimate (calibrated on the 2-core machine; see the module docstring)

# Milliseconds per training step at per-worker batch 2, 8 and 32 (the
# reference: 1 worker with batch workers x b), interpolated in log2(b),
# measured with the tool on the 2-core machine (4 workers, 2 servers, load
# ~5 from another benchmark); see the module docstring.
STEP_MS = {"reference": (10.5, 23.6, 84.0), "sync": (18.0, 26.5, 64.0),
           "async": (12.7, 23.0, 57.0), "local": (9.8, 22.3, 57.0),
           "recal": (8.0, 21.5, 60.0)}
START_S = 2.2          # servers and workers up, data loaded
EVAL_S_PER_10K = 0.8   # one test evaluation of 10000 examples
RECAL_FRACTION = {"precise": 0.35, "exact": 1.0}  # x one epoch's training time
SLOW_FACTOR = 1.9      # the slowest the same runs measured on the shared machine


def step_ms(family, b):
    points = STEP_MS[family]
    x = math.log2(b) / 2.0 - 0.5  # 0 at b=2, 1 at b=8, 2 at b=32
    k = min(max(int(math.floor(x)), 0), 1)
    lo, hi = math.log(points[k]), math.log(points[k + 1])
    return math.exp(lo + (x - k) * (hi - lo))


def estimate_seconds(config, run):
    """Seconds one run takes on the calibration machine (a rough model)."""
    row, b = run["policy"], run["batch_size"]
    policy, _, recal_mode, _ = POLICIES[row]
    family = "reference" if row == "reference" else policy
    n = config["train_examples"] or 60000
    workers, batch = (1, config["workers"] * b) if row == "reference" else (config["workers"], b)
    epoch_s = max(1, math.ceil(n / workers / batch)) * step_ms(family, b) / 1000.0
    evals = (config["epochs"] if eval_every_epoch(config) else 1) + (recal_mode is None)
    recal_s = RECAL_FRACTION[recal_mode or "precise"] * epoch_s
    if config["recal_examples"]:
        recal_s *= min(1.0, config["recal_examples"] / float(n))
    test = config["test_examples"] or 10000
    return START_S + config["epochs"] * epoch_s + recal_s + evals * EVAL_S_PER_10K * test / 10000


# ----------------------------------------------------------------------------
# Machine


def machine_info():
    info = {"cpu": None, "cores": os.cpu_count(), "ram_gib": None,
            "platform": platform.platform(), "python": platform.python_version(),
            "gpus": [], "load_average": None}
    try:
        info["cores_available"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        info["cores_available"] = os.cpu_count()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    info["ram_gib"] = round(int(line.split()[1]) / 1024.0 / 1024.0, 1)
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=15)
        if r.returncode == 0:
            info["gpus"] = [l.strip() for l in r.stdout.splitlines() if l.strip()]
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        info["load_average"] = [round(v, 2) for v in os.getloadavg()]
    except OSError:
        pass
    return info


# ----------------------------------------------------------------------------
# Aggregation


def aggregate(runs, policies, batch_sizes):
    """{(row, b): {...}} over seeds: n, n_ok, failures, and for each figure
    (mean, min, max) over the ok runs."""
    groups = {}
    for row in policies:
        for b in batch_sizes:
            rs = [r for r in runs if r["policy"] == row and r["batch_size"] == b]
            ok = [r for r in rs if r["status"] == "ok"]
            g = {"runs": rs, "n": len(rs), "n_ok": len(ok),
                 "failed": [r for r in rs if r["status"] == "failed"],
                 "not_run": [r for r in rs if r["status"] == "not run"]}
            figures = {
                "test_accuracy": [r.get("test_accuracy") for r in ok],
                "test_accuracy_recal": [r.get("test_accuracy_recal") for r in ok],
                "train_loss_last": [r.get("train_loss_last") for r in ok],
                "images_per_second": [r.get("images_per_second") for r in ok],
                "ms_compute": [(r.get("ms_per_step") or {}).get("compute") for r in ok],
                "ms_bn_sync": [(r.get("ms_per_step") or {}).get("bn_sync") for r in ok],
                "ms_grad_sync": [(r.get("ms_per_step") or {}).get("grad_sync") for r in ok],
                "ms_total": [(r.get("ms_per_step") or {}).get("total") for r in ok],
                "max_staleness": [r.get("max_staleness") for r in ok],
                "wall_s": [r.get("wall_s") for r in rs if r.get("wall_s") is not None],
                "steps": [r.get("steps") for r in ok],
            }
            for key, values in figures.items():
                values = [v for v in values if v is not None]
                g[key] = (mean(values), min(values), max(values)) if values else None
            g["seed_values"] = [r.get("test_accuracy") for r in ok]
            groups[(row, b)] = g
    return groups


def noise_floor(p, n_test):
    """Standard error of an accuracy p measured on n_test examples."""
    if p is None or not n_test:
        return None
    return math.sqrt(max(p * (1 - p), 1e-12) / n_test)


def separated(ga, gb, key, n_test):
    """True when rows a and b differ in `key` beyond the noise: with two or
    more seeds each, when their min-max ranges do not overlap; with one
    seed, when the gap exceeds 2 x the test-set sampling error of the
    difference (seed-to-seed variation is then unmeasured, so this is a
    lower bound on the noise). None when a figure is missing."""
    a, b = ga.get(key), gb.get(key)
    if a is None or b is None:
        return None
    if ga["n_ok"] >= 2 and gb["n_ok"] >= 2:
        return a[1] > b[2] or b[1] > a[2]
    sa, sb = noise_floor(a[0], n_test), noise_floor(b[0], n_test)
    if sa is None or sb is None:
        return None
    return abs(a[0] - b[0]) > 2 * math.sqrt(sa * sa + sb * sb)


# ----------------------------------------------------------------------------
# Markdown


def f_acc(v):
    return "—" if v is None else "%.4f" % v


def f_num(v, spec):
    return "—" if v is None else format(v, spec)


def cell(stat, fmt_fn, multi):
    """mean, or 'mean (min–max)' when several seeds went into it."""
    if stat is None:
        return "—"
    m, lo, hi = stat
    if multi and lo != hi:
        return "%s (%s–%s)" % (fmt_fn(m), fmt_fn(lo), fmt_fn(hi))
    return fmt_fn(m)


def md_escape(text):
    return (text or "").replace("|", "\\|").replace("\n", " ")


def short(text, limit=160):
    text = text or ""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def status_cell(g):
    if g["n"] == 0:
        return "not planned"
    if g["n_ok"] == g["n"]:
        return "ok" if g["n"] == 1 else "ok (%d seeds)" % g["n"]
    parts = []
    if g["n_ok"]:
        parts.append("ok %d/%d" % (g["n_ok"], g["n"]))
    for r in g["failed"]:
        why = r.get("reason") or "failed"
        if r.get("detail"):
            why += ": " + r["detail"]
        parts.append("**failed**%s: %s" % ("" if g["n"] == 1 else " (seed %d)" % r["seed"],
                                           md_escape(short(why))))
    if g["not_run"]:
        parts.append("not run%s" % ("" if g["n"] == 1 else " (%d)" % len(g["not_run"])))
    return "; ".join(parts)


def row_label(row, b, workers):
    if row == "reference":
        return "reference (1×%d)" % (workers * b)
    return row


def batch_table(data, groups, b):
    cfg = data["config"]
    multi = len(cfg["seeds"]) > 1
    lines = [
        "| policy | status | test acc | acc after recal | train loss (last) | "
        "images/s (all workers) | ms/step compute | ms/step BN sync | "
        "ms/step grad sync | max staleness | steps | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in cfg["policies"]:
        g = groups[(row, b)]
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            row_label(row, b, cfg["workers"]), status_cell(g),
            cell(g["test_accuracy"], f_acc, multi),
            cell(g["test_accuracy_recal"], f_acc, multi),
            cell(g["train_loss_last"], lambda v: f_num(v, ".3f"), multi),
            cell(g["images_per_second"], lambda v: f_num(v, ".0f"), multi),
            cell(g["ms_compute"], lambda v: f_num(v, ".1f"), multi),
            cell(g["ms_bn_sync"], lambda v: f_num(v, ".1f"), multi),
            cell(g["ms_grad_sync"], lambda v: f_num(v, ".1f"), multi),
            cell(g["max_staleness"], lambda v: f_num(v, ".0f"), False),
            cell(g["steps"], lambda v: f_num(v, ".0f"), False),
            cell(g["wall_s"], lambda v: f_num(v, ".0f"), False)))
    return lines


def pts(a, b):
    """a - b in percentage points."""
    return "%+.1f" % (100.0 * (a - b))


CHANCE_CEILING = 0.2  # below this, with and without recalibration: did not learn
RECAL_MOVES = 0.02    # recalibration changing accuracy this much is worth a line


def findings(data, groups):
    """The generated part of "What the numbers say": facts read off the data."""
    cfg = data["config"]
    n_test = cfg["test_examples"] or 10000
    multi = len(cfg["seeds"]) > 1
    out = []
    if multi:
        out.append("Noise: with %d seeds, two rows are called different only when their "
                   "min–max ranges over seeds do not overlap." % len(cfg["seeds"]))
    else:
        se = noise_floor(0.85, n_test)
        out.append("Noise: one seed, so seed-to-seed variation is not measured. Two rows "
                   "are called different only when the gap exceeds twice the test-set "
                   "sampling error of the difference (about %.1f points at 85%% accuracy "
                   "on %d test examples); that is a lower bound on the real noise (a "
                   "different seed changes the initial weights and the data order; the "
                   "bulk-synchronous rows repeat bit for bit with the same seed, async "
                   "depends on timing), so small separations here are indicative only."
                   % (100 * 2 * math.sqrt(2) * se, n_test))
    for b in cfg["batch_sizes"]:
        ok_rows = [row for row in cfg["policies"] if groups[(row, b)]["test_accuracy"]]
        if not ok_rows:
            gs = [groups[(row, b)] for row in cfg["policies"]]
            out.append("**b=%d**: no run succeeded (%d failed, %d not run)." % (
                b, sum(len(g["failed"]) for g in gs), sum(len(g["not_run"]) for g in gs)))
            continue
        acc = {row: groups[(row, b)]["test_accuracy"][0] for row in ok_rows}
        best = max(ok_rows, key=lambda r: acc[r])
        ties = [r for r in ok_rows if r != best
                and separated(groups[(best, b)], groups[(r, b)], "test_accuracy", n_test) is False]
        text = "**b=%d** (global batch %d): best test accuracy %s (%.4f)" % (
            b, cfg["workers"] * b, best, acc[best])
        if ties:
            text += ", not separable from %s" % ", ".join(ties)
        text += "."
        ref = groups.get(("reference", b))
        if ref and ref["test_accuracy"]:
            gaps = []
            for row in ok_rows:
                if row == "reference":
                    continue
                sep = separated(groups[(row, b)], ref, "test_accuracy", n_test)
                gaps.append("%s %s%s" % (row, pts(acc[row], ref["test_accuracy"][0]),
                                         "" if sep else " (within noise)"))
            text += " Versus the 1-worker reference (%.4f), in points: %s." % (
                ref["test_accuracy"][0], ", ".join(gaps))
        # The three strategies: best row of each family.
        fam_best = {}
        for fam, rows in FAMILIES:
            cand = [r for r in rows if r in acc]
            if cand:
                fam_best[fam] = max(cand, key=lambda r: acc[r])
        if len(fam_best) >= 2:
            pairs, same = [], []
            names = list(fam_best)
            for i in range(len(names)):
                for j in range(i + 1, len(names)):
                    ra, rb = fam_best[names[i]], fam_best[names[j]]
                    sep = separated(groups[(ra, b)], groups[(rb, b)], "test_accuracy", n_test)
                    (pairs if sep else same).append("%s vs %s (%s)" % (
                        names[i], names[j], pts(acc[ra], acc[rb])))
            if same:
                text += " The strategies do not separate for %s." % "; ".join(same)
            if pairs:
                text += " They do separate for %s." % "; ".join(pairs)
        if "local" in acc:
            lg = groups[("local", b)]
            if lg["test_accuracy_recal"]:
                text += (" local: %.4f with its averaged running stats, %.4f after "
                         "recalibration (%s points)." % (
                             acc["local"], lg["test_accuracy_recal"][0],
                             pts(lg["test_accuracy_recal"][0], acc["local"])))
        out.append(text)
    # Cost of BN traffic.
    for b in cfg["batch_sizes"]:
        parts = []
        for row in ("sync", "async-s1", "async-s4", "local", "recal-precise"):
            g = groups.get((row, b))
            if g and g["ms_total"] and g["ms_bn_sync"] and g["ms_total"][0]:
                parts.append("%s %.0f%% of %.1f ms" % (
                    row, 100.0 * g["ms_bn_sync"][0] / g["ms_total"][0], g["ms_total"][0]))
        ips = {}
        for row in ("sync", "async-s1", "async-s4", "local", "recal-precise", "recal-exact"):
            g = groups.get((row, b))
            if g and g["images_per_second"]:
                ips[row] = g["images_per_second"][0]
        if parts:
            text = "**Cost at b=%d**: BN sync share of the step: %s." % (b, ", ".join(parts))
            if "local" in ips and ips["local"] > 0:
                text += " Images/s relative to local: %s." % ", ".join(
                    "%s %.2f×" % (r, v / ips["local"]) for r, v in ips.items() if r != "local")
            out.append(text)
    # Recalibration's effect, and rows that did not learn, per (row, b).
    moved, flat = [], []
    for b in cfg["batch_sizes"]:
        for row in cfg["policies"]:
            g = groups[(row, b)]
            t, r = g["test_accuracy"], g["test_accuracy_recal"]
            if t is None:
                continue
            if r is not None and max(t[0], r[0]) < CHANCE_CEILING:
                loss = g["train_loss_last"]
                flat.append("%s at b=%d (%.4f%s)" % (
                    row, b, t[0], "" if loss is None else ", last train loss %.2f" % loss[0]))
            elif r is not None and abs(r[0] - t[0]) >= RECAL_MOVES and POLICIES[row][0] != "recal":
                moved.append("%s at b=%d %s" % (row, b, pts(r[0], t[0])))
    if moved:
        out.append("Recalibrating the running statistics after training moves test accuracy "
                   "by %.0f points or more (in points) for: %s; there the running statistics, "
                   "not the weights, set the result." % (100 * RECAL_MOVES, ", ".join(moved)))
    if flat:
        text = ("Did not learn (test accuracy below %.2f with and without recalibration; "
                "chance is 0.10): %s." % (CHANCE_CEILING, ", ".join(flat)))
        if any(f.startswith("async") for f in flat) and cfg.get("async_learning_rate") is None:
            text += (" Async applies every worker's gradient on its own (batch b per update, "
                     "%d updates where sync makes one) at the same learning rate, which at "
                     "small b may need a smaller one (--async_learning_rate)." % cfg["workers"])
        out.append(text)
    failed = [r for r in data["runs"] if r["status"] == "failed"]
    if failed:
        out.append("Failed runs: %s." % "; ".join(
            "%s (%s)" % (r["id"], md_escape(short(r.get("reason"), 100))) for r in failed))
    not_run = [r for r in data["runs"] if r["status"] == "not run"]
    if not_run:
        out.append("Not run (the matrix was interrupted): %d runs." % len(not_run))
    return out


def hand_written_block(path):
    """The hand-written block of an existing report, or None."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    i, j = text.find(BEGIN_HAND), text.find(END_HAND)
    if i < 0 or j < i:
        return None
    return text[i:j + len(END_HAND)]


def render_markdown(data, plots, hand_block=None):
    cfg = data["config"]
    mach = data["machine"]
    groups = aggregate(data["runs"], cfg["policies"], cfg["batch_sizes"])
    runs = data["runs"]
    n_ok = sum(r["status"] == "ok" for r in runs)
    n_failed = sum(r["status"] == "failed" for r in runs)
    info = next((r.get("worker_info") for r in runs if r.get("worker_info")), None) or {}
    train_n = cfg["train_examples"] or 60000
    test_n = cfg["test_examples"] or 10000
    L = []
    L.append("# BN policies compared: accuracy and cost")
    L.append("")
    L.append("Generated by `tools/compare_policies.py` from `%s` (%s). Re-render with "
             "`python3 tools/compare_policies.py --report_only`; the hand-written part of "
             "the last section survives that." % (os.path.basename(data["results_json"]),
                                                  data.get("finished") or data.get("started")))
    L.append("")
    L.append("## Machine")
    L.append("")
    L.append("- CPU: %s, %s cores (%s available to the run), %s GiB RAM" % (
        mach.get("cpu") or "unknown", mach.get("cores"), mach.get("cores_available"),
        mach.get("ram_gib")))
    L.append("- GPU: %s; the workers ran on: %s" % (
        "; ".join(mach.get("gpus") or []) or "none", info.get("device", "unknown")))
    L.append("- OS: %s, Python %s; load average at the start: %s" % (
        mach.get("platform"), mach.get("python"),
        ", ".join("%.2f" % v for v in mach.get("load_average") or []) or "unknown"))
    L.append("")
    L.append("## Command")
    L.append("")
    L.append("```sh")
    L.append(data.get("command_line") or "")
    L.append("```")
    L.append("")
    L.append("## Setup and budget")
    L.append("")
    L.append("- Model: the ResNet-style CNN of `bnps_worker` (depth %s, width %s, %s "
             "weights), Fashion-MNIST." % (info.get("depth", "?"), info.get("width", "?"),
                                           info.get("weights", "?")))
    L.append("- Data: the first %d of 60000 training examples, %d epoch%s (%d examples "
             "seen per run); test accuracy on the first %d of 10000 test examples, the "
             "same for every run (evaluated by worker 0)." % (
                 train_n, cfg["epochs"], "" if cfg["epochs"] == 1 else "s",
                 train_n * cfg["epochs"], test_n))
    L.append("- %d workers and %d shard servers per run; per-worker batch sizes %s; "
             "seeds %s." % (cfg["workers"], cfg["servers"],
                            ", ".join(map(str, cfg["batch_sizes"])),
                            ", ".join(map(str, cfg["seeds"]))))
    L.append("- The reference is 1 worker with the global batch (%d × b), policy sync "
             "(with one worker all policies coincide), %s model thread%s." % (
                 cfg["workers"], cfg.get("reference_threads_used", "?"),
                 "" if cfg.get("reference_threads_used") == 1 else "s"))
    L.append("- Optimizer: SGD, learning rate %g fixed for every batch size (not scaled "
             "with the global batch), momentum %g, weight decay %g. All rows of one batch "
             "size share the global batch, so policies compare fairly within a table; "
             "across tables the number of steps and the gradient noise differ." % (
                 cfg["learning_rate"], cfg["momentum"], cfg["weight_decay"]))
    if cfg.get("async_learning_rate") is not None:
        L.append("- The async rows use learning rate %g instead: under async each worker's "
                 "gradient is applied on its own (an update has batch b, not %d × b)." % (
                     cfg["async_learning_rate"], cfg["workers"]))
    L.append("- async-s1 / async-s4: `--staleness=1` / `4`. recal-precise / recal-exact: "
             "`--recal_mode=precise` / `exact`. Every other row also recalibrates after "
             "training (`--recalibrate=true`, mode precise) for the \"acc after recal\" "
             "column%s." % (
                 "" if not cfg["recal_examples"]
                 else "; recalibration over the first %d training examples" % cfg["recal_examples"]))
    if cfg["worker_flags"]:
        L.append("- Extra worker flags: `%s`." % " ".join(cfg["worker_flags"]))
    if cfg.get("inject"):
        L.append("- Test-only: failures injected into %s." % ", ".join(
            "%s@%d" % tuple(x) for x in cfg["inject"]))
    wall = data.get("total_wall_s")
    L.append("- Budget: the default matrix is sized to finish within %d minutes on 2 CPU "
             "cores; to fit, it trains on %d of the 60000 training examples for %d "
             "epoch%s with one seed. Estimated %s; this run took %s, %d runs "
             "(%d ok, %d failed%s)." % (
                 BUDGET_MINUTES, train_n, cfg["epochs"], "" if cfg["epochs"] == 1 else "s",
                 estimate_text(data.get("estimate_s") or 0),
                 "%.1f min" % (wall / 60.0) if wall is not None else "unknown",
                 len(runs), n_ok, n_failed,
                 ", %d not run" % (len(runs) - n_ok - n_failed)
                 if len(runs) - n_ok - n_failed else ""))
    L.append("")
    L.append("Columns: *test acc* uses the running statistics the policy leaves; *acc "
             "after recal* after recomputing them over the training data (for recal rows "
             "the two are the same); *train loss* is the mean over workers of each "
             "worker's mean loss over its last reporting interval (batch statistics, "
             "as in training); *images/s* is the sum over the workers; *ms/step* is each "
             "worker's time in that part divided by its steps, averaged over workers "
             "(BN sync includes waiting for the others at the BN barriers, grad sync the "
             "pull, push and clocks); *wall s* is the whole run as this tool timed it "
             "(start-up, training, evaluation, recalibration)%s." % (
                 "; with several seeds: mean (min–max)" if len(cfg["seeds"]) > 1 else ""))
    L.append("")
    L.append("## Results")
    for b in cfg["batch_sizes"]:
        L.append("")
        L.append("### Per-worker batch %d (global batch %d)" % (b, cfg["workers"] * b))
        L.append("")
        L.extend(batch_table(data, groups, b))
    L.append("")
    L.append("## Plots")
    L.append("")
    if plots.get("files"):
        for name, title in (("accuracy_vs_batch", "Test accuracy against per-worker batch size"),
                            ("accuracy_over_time", "Accuracy over training time")):
            f = plots["files"].get(name)
            if f:
                L.append("![%s](%s)" % (title, os.path.basename(f)))
                L.append("")
        L.append(plots.get("note") or "")
    else:
        L.append("Plots skipped: %s." % (plots.get("skipped") or "not drawn"))
    L.append("")
    L.append("## What the numbers say")
    L.append("")
    L.append("Generated from the data:")
    L.append("")
    for text in findings(data, groups):
        L.append("- " + text)
    L.append("")
    L.append(hand_block or "%s\n_(Reading of the results, written by hand after the real "
             "run.)_\n%s" % (BEGIN_HAND, END_HAND))
    L.append("")
    return "\n".join(L)


# ----------------------------------------------------------------------------
# Plots (matplotlib only here)


class PlotsUnavailable(Exception):
    pass


def plot_paths(results_md):
    base = os.path.splitext(results_md)[0]
    return {"accuracy_vs_batch": base + "_accuracy_vs_batch.png",
            "accuracy_over_time": base + "_accuracy_over_time.png"}


SMOOTH = 5  # training-accuracy points averaged in the over-time plot


def smooth(values):
    """Trailing mean over up to SMOOTH points."""
    out = []
    for i in range(len(values)):
        window = values[max(0, i - SMOOTH + 1):i + 1]
        out.append(sum(window) / len(window))
    return out


def draw_plots(data, results_md):
    """Writes the two PNGs next to results_md with matplotlib; returns
    {"files": {...}, "note": ...}. Raises PlotsUnavailable without it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise PlotsUnavailable("matplotlib is not installed for %s (%s)" % (sys.executable, e))
    cfg = data["config"]
    groups = aggregate(data["runs"], cfg["policies"], cfg["batch_sizes"])
    paths = plot_paths(results_md)
    styles = {"reference": ("k", "o", "--"), "local": ("tab:gray", "v", "-"),
              "sync": ("tab:blue", "s", "-"), "async-s1": ("tab:orange", "^", "-"),
              "async-s4": ("tab:red", "D", "-"), "recal-precise": ("tab:green", "P", "-"),
              "recal-exact": ("tab:olive", "X", "-")}

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    for ax, key, title in ((axes[0], "test_accuracy", "with the policy's running statistics"),
                           (axes[1], "test_accuracy_recal", "after recalibration")):
        for row in cfg["policies"]:
            xs, ys, lo, hi = [], [], [], []
            for b in cfg["batch_sizes"]:
                stat = groups[(row, b)][key]
                if stat:
                    xs.append(b)
                    ys.append(stat[0])
                    lo.append(stat[0] - stat[1])
                    hi.append(stat[2] - stat[0])
            if not xs:
                continue
            color, marker, ls = styles.get(row, (None, "o", "-"))
            ax.errorbar(xs, ys, yerr=[lo, hi] if len(cfg["seeds"]) > 1 else None,
                        color=color, marker=marker, linestyle=ls, capsize=3, label=row)
        ax.set_xscale("log", base=2)
        ax.set_xticks(cfg["batch_sizes"])
        ax.set_xticklabels([str(b) for b in cfg["batch_sizes"]])
        ax.set_xlabel("per-worker batch size b (%d workers; reference: 1 worker, batch %d·b)"
                      % (cfg["workers"], cfg["workers"]), fontsize=8)
        ax.set_title("Test accuracy %s" % title, fontsize=10)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("test accuracy")
    axes[1].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(paths["accuracy_vs_batch"], dpi=110)
    plt.close(fig)

    seed = cfg["seeds"][0]
    nb = len(cfg["batch_sizes"])
    width_in = max(6.0, 5.0 * nb)
    fig, axes = plt.subplots(1, nb, figsize=(width_in, 4.4), squeeze=False)
    any_eval = False
    for ax, b in zip(axes[0], cfg["batch_sizes"]):
        for row in cfg["policies"]:
            run = next((r for r in data["runs"] if r["policy"] == row and r["batch_size"] == b
                        and r["seed"] == seed and r["status"] == "ok"), None)
            if run is None:
                continue
            color, marker, ls = styles.get(row, (None, "o", "-"))
            hist = run.get("history") or []
            if hist:
                ax.plot([h["seconds"] for h in hist], smooth([h["accuracy"] for h in hist]),
                        color=color, linestyle=ls, linewidth=1, alpha=0.6, label=row)
            evals = [e for e in run.get("evals") or [] if e.get("test_accuracy") is not None]
            if evals:
                any_eval = True
                ax.plot([e["seconds"] for e in evals], [e["test_accuracy"] for e in evals],
                        color=color, marker=marker, linestyle="none", markersize=7)
        ax.set_title("b=%d (global batch %d)" % (b, cfg["workers"] * b), fontsize=10)
        ax.set_xlabel("seconds since training started (worker 0)")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("accuracy")
    axes[0][-1].legend(fontsize=8, loc="lower right")
    title = ("Lines: training accuracy of worker 0 (batch statistics, trailing mean of %d "
             "reporting intervals); markers: test accuracy%s (seed %d)" % (
                 SMOOTH, " after each epoch and at the end" if any_eval else " at the end", seed))
    fig.suptitle(textwrap.fill(title, width=int(12 * width_in)), fontsize=9)
    fig.tight_layout()
    fig.savefig(paths["accuracy_over_time"], dpi=110)
    plt.close(fig)
    note = ("Over time: lines are worker 0's training accuracy (a reporting interval is "
            "1/50 of the run; measured with batch statistics as in training; trailing mean "
            "of %d intervals), markers the test accuracy with the running statistics%s; "
            "seed %d. Accuracy against batch size: mean over seeds%s. Both plots from %s."
            % (SMOOTH, " after each epoch and at the end" if any_eval else " at the end",
               seed, ", bars min–max" if len(cfg["seeds"]) > 1 else "",
               os.path.basename(data["results_json"])))
    return {"files": paths, "note": note}


def make_plots(data, results_md, json_path):
    """Draws the plots here, or with the system Python when this one lacks
    matplotlib; returns the plots record for the report."""
    try:
        return draw_plots(data, results_md)
    except PlotsUnavailable as e:
        reason = str(e)
    if os.path.realpath(sys.executable) != os.path.realpath(SYSTEM_PYTHON) and \
            os.access(SYSTEM_PYTHON, os.X_OK):
        try:
            r = subprocess.run([SYSTEM_PYTHON, os.path.abspath(__file__), "--plots_only",
                                "--results=" + results_md, "--results_json=" + json_path],
                               capture_output=True, text=True, timeout=300)
            if r.returncode == 0:
                return json.loads(r.stdout.strip().splitlines()[-1])
            reason += "; %s: %s" % (SYSTEM_PYTHON, (r.stderr.strip().splitlines() or ["?"])[-1])
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
            reason += "; %s failed: %s" % (SYSTEM_PYTHON, e)
    return {"files": {}, "skipped": reason + " (install python3-matplotlib: "
            "`tools/setup.sh --peers` or `apt-get install python3-matplotlib`)"}


# ----------------------------------------------------------------------------
# Writing


def write_json(data, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def write_report(data, results_md, json_path, plots_enabled):
    if plots_enabled and any(r["status"] == "ok" for r in data["runs"]):
        plots = make_plots(data, results_md, json_path)
    elif plots_enabled:
        plots = {"files": {}, "skipped": "no run succeeded"}
    else:
        plots = {"files": {}, "skipped": "--no_plots"}
    data["plots"] = plots
    write_json(data, json_path)
    text = render_markdown(data, plots, hand_written_block(results_md))
    tmp = results_md + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, results_md)
    return plots


def load_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError("cannot read %s: %s" % (path, e))
    data["config"]["batch_sizes"] = list(data["config"]["batch_sizes"])
    return data


# ----------------------------------------------------------------------------
# Main


def build():
    cmd = ["bazel", "build"] + BUILD_TARGETS
    print("compare_policies: $ " + shlex.join(cmd), flush=True)
    try:
        return subprocess.call(cmd, cwd=REPO)
    except FileNotFoundError:
        raise UsageError("bazel not found on PATH; cannot --build")


def make_config(args):
    cores = os.cpu_count() or 1
    return {
        "policies": args.policy_list, "batch_sizes": args.batch_size_list,
        "seeds": args.seed_list, "workers": args.workers, "servers": args.servers,
        "epochs": args.epochs, "train_examples": args.train_examples,
        "test_examples": args.test_examples, "learning_rate": args.learning_rate,
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


def estimate_text(seconds):
    return ("%.0f min on the 2-core calibration machine (up to %.0f min when it is "
            "shared)" % (seconds / 60.0, SLOW_FACTOR * seconds / 60.0))


def fmt_eta(s):
    return "%dm%02ds" % (s // 60, s % 60)


def run_matrix(args, argv):
    config = make_config(args)
    runs = plan_runs(config)
    estimate = sum(estimate_seconds(config, r) for r in runs)
    command_line = shlex.join(["python3", "tools/compare_policies.py"] + list(argv))
    if args.dry_run:
        config["out_dir"] = args.out_dir or "<out_dir>"
        for r in runs:
            cmd = run_command(config, r, os.path.join(config["out_dir"], r["id"]),
                              (r["policy"], r["batch_size"]) in args.inject)
            print("%-28s ~%4.0fs  %s" % (r["id"], estimate_seconds(config, r), shlex.join(cmd)))
        print("compare_policies: %d runs, estimated %s (budget %d min)"
              % (len(runs), estimate_text(estimate), BUDGET_MINUTES))
        return 0
    if args.build and build() != 0:
        print("compare_policies: error: the bazel build failed", file=sys.stderr)
        return 1
    for path in (os.path.join(args.bin_dir, "server", "bnps_server"),
                 os.path.join(args.bin_dir, "worker", "bnps_worker")):
        if not os.access(path, os.X_OK):
            raise UsageError("%s not found: run `bazel build %s`, or pass --build or "
                             "--bin_dir" % (path, " ".join(BUILD_TARGETS)))
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="bnps_compare_")
    os.makedirs(out_dir, exist_ok=True)
    config["out_dir"] = os.path.abspath(out_dir)
    results_md = os.path.abspath(args.results)
    json_path = os.path.abspath(args.results_json)
    os.makedirs(os.path.dirname(results_md), exist_ok=True)
    data = {"tool": "tools/compare_policies.py", "command_line": command_line,
            "argv": list(argv), "config": config, "machine": machine_info(),
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "finished": None, "estimate_s": estimate, "total_wall_s": None,
            "results_json": json_path, "runs": runs}
    print("compare_policies: %d runs into %s; estimated %s"
          % (len(runs), config["out_dir"], estimate_text(estimate)), flush=True)
    t0 = time.monotonic()
    interrupted = None
    old = {s: signal.signal(s, on_stop_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        for i, run in enumerate(runs):
            inject = (run["policy"], run["batch_size"]) in args.inject
            print("compare_policies: [%d/%d] %s ..." % (i + 1, len(runs), run["id"]), flush=True)
            try:
                execute(config, run, inject)
                elapsed = time.monotonic() - t0
                if run["status"] == "ok":
                    what = "ok test_acc=%s recal=%s img/s=%.0f" % (
                        f_acc(run["test_accuracy"]), f_acc(run["test_accuracy_recal"]),
                        run["images_per_second"] or 0)
                else:
                    what = "FAILED: %s%s" % (run["reason"], ": " + run["detail"]
                                             if run.get("detail") else "")
                print("compare_policies: [%d/%d] %s %s (%.0fs; elapsed %s)" % (
                    i + 1, len(runs), run["id"], what, run["wall_s"], fmt_eta(elapsed)),
                    flush=True)
                data["total_wall_s"] = elapsed
                write_json(data, json_path)  # progress survives a crash
            except KeyboardInterrupt:
                interrupted = "SIGINT"
            except Stop as e:
                interrupted = str(e)
            if interrupted:
                if run.get("wall_s") is None:  # did not finish
                    run.update(status="not run", reason="interrupted by " + interrupted)
                break
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    data["total_wall_s"] = time.monotonic() - t0
    data["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    if interrupted:
        data["interrupted"] = interrupted
    plots = write_report(data, results_md, json_path, not args.no_plots)
    print("compare_policies: report %s, data %s%s" % (
        results_md, json_path, "" if plots.get("files") else " (plots skipped: %s)"
        % plots.get("skipped")), flush=True)
    if interrupted:
        return 130
    return 1 if any(r["status"] != "ok" for r in runs) else 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        if args.plots_only:
            data = load_json(args.results_json)
            try:
                plots = draw_plots(data, os.path.abspath(args.results))
            except PlotsUnavailable as e:
                print(str(e), file=sys.stderr)
                return 1
            print(json.dumps(plots))
            return 0
        if args.report_only:
            data = load_json(args.results_json)
            data["results_json"] = os.path.abspath(args.results_json)
            plots = write_report(data, os.path.abspath(args.results),
                                 os.path.abspath(args.results_json), not args.no_plots)
            print("compare_policies: report %s%s" % (
                args.results, "" if plots.get("files") else " (plots skipped: %s)"
                % plots.get("skipped")))
            return 0
        return run_matrix(args, argv)
    except UsageError as e:
        print("compare_policies: error: %s" % e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
