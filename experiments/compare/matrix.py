"""The experiment itself: which rows there are, the order of the runs, each
run's launcher command, and the model of how long the matrix takes.

Pure functions of the config (see options.make_config); nothing here starts a
process.
"""

import collections
import math
import os
import sys

EXPERIMENTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(EXPERIMENTS_DIR)
LAUNCHER = os.path.join(REPO, "tools", "bnps_launch.py")
# The command's entry point (the plots may be drawn by running it again under
# another interpreter).
ENTRY = os.path.join(EXPERIMENTS_DIR, "compare_policies.py")
BUDGET_MINUTES = 45

class Row(collections.namedtuple(
        "Row", "bn_policy gradients staleness recal_mode description extra_flags",
        defaults=((),))):
    """One row of a matrix: the BN policy and gradient mode (which pick the
    learning rate: async gradients take --async_learning_rate), the bounded
    staleness (--staleness) and recal mode when they apply, a description for
    the report, and the row's other launcher flags (extra_flags)."""


# Samples per channel per worker below which local BN lost accuracy beyond
# the noise in the regime matrix (docs/results.md): the groups matrix puts a
# worker below it and a group above it.
REGIME_BOUNDARY = 8

# The one-axis matrices' values: the exact BN staleness s (--bn_staleness)
# and the BN group size K (--bn_group_size) of W = 8 workers.
STALENESS = [0, 1, 2, 4, 8, 16]
GROUP_SIZES = [1, 2, 4, 8]

ROWS = {
    "reference": Row("sync", "sync", None, None, "1 worker, global batch"),
    "local": Row("local", "sync", None, None, "local BN, running stats averaged"),
    "sync": Row("sync", "sync", None, None, "exact cross-worker BN every step"),
    "async-s1": Row("async", "async", 1, None, "bounded staleness 1"),
    "async-s2": Row("async", "async", 2, None, "bounded staleness 2"),
    "async-s4": Row("async", "async", 4, None, "bounded staleness 4"),
    "recal-precise": Row("recal", "sync", None, "precise", "recalibrated after training, one pass"),
    "recal-exact": Row("recal", "sync", None, "exact", "recalibrated after training, layer by layer"),
    # The two halves of async crossed with the other policies' halves.
    "bn-async-s2": Row("async", "sync", 2, None, "async BN (window 2), sync gradients"),
    "grad-async-s2": Row("sync", "async", 2, None, "sync BN, async gradients (bound 2)"),
    "grad-async-s2-recal": Row("recal", "async", 2, "precise",
                               "local BN + recal, async gradients (bound 2)"),
}
# --matrix=staleness: async BN with the global moments of exactly s steps
# earlier, sync gradients, so BN staleness is the only change from sync.
for _s in STALENESS:
    ROWS["bn-stale-s%d" % _s] = Row(
        "async", "sync", None, None,
        "async BN with the other workers' moments of exactly %d step%s earlier, "
        "sync gradients"
        % (_s, "" if _s == 1 else "s"), ("--bn_staleness=%d" % _s,))
# --matrix=groups: sync BN within groups of K consecutive workers (the
# running statistics still follow the whole job).
for _k in GROUP_SIZES:
    ROWS["sync-k%d" % _k] = Row(
        "sync", "sync", None, None, "sync BN within groups of %d workers" % _k,
        ("--bn_group_size=%d" % _k,))
# The rows of --matrix=grid (the policies x batch sizes of the CNN).
GRID_ROWS = ["reference", "local", "sync", "async-s1", "async-s4", "recal-precise",
             "recal-exact"]

# Fewest BN positions per example of each --model on 28x28 (the worker's
# Model::bn_positions_per_example): samples per channel per worker are
# per-worker batch x this.
POSITIONS = {"cnn": 49, "deep": 4, "fc_bn": 1}

# The regime matrices: cells of (model, per-worker batch, rows). SWEEP rows
# run in every cell; CROSSED rows in one cell, the default CNN at batch 2.
SWEEP = ["reference", "local", "sync", "recal-precise", "async-s2"]
CROSSED = ["bn-async-s2", "grad-async-s2", "grad-async-s2-recal"]
MATRICES = {
    # samples per channel per worker: fc_bn 1, 2, 8; deep 4, 32; cnn 49, 98
    "regime": [("fc_bn", b, SWEEP) for b in (1, 2, 8)]
              + [("deep", b, SWEEP) for b in (1, 8)]
              + [("cnn", 1, SWEEP), ("cnn", 2, SWEEP + CROSSED)],
    "full": [("fc_bn", b, SWEEP + ["async-s1", "async-s4", "recal-exact"])
             for b in (1, 2, 4, 8, 32)]
            + [("deep", b, SWEEP + ["async-s1", "recal-exact"]) for b in (1, 2, 4, 8, 32)]
            + [("cnn", b, SWEEP + ["async-s1"]) for b in (1, 8, 32)]
            + [("cnn", 2, SWEEP + ["async-s1"] + CROSSED),
               ("fc_bn", 2, CROSSED)],
    "smoke": [("fc_bn", 1, ["reference", "local", "sync", "recal-precise"]),
              ("cnn", 2, ["sync", "async-s2"] + CROSSED)],
    # The one-axis matrices (AXES). Staleness: the CNN at b=2 (98 samples per
    # channel per worker, above the regime boundary: local BN is fine there)
    # and fc_bn at b=2 (2 samples: local BN is far below sync), with sync and
    # local as the bounds.
    "staleness": [(m, 2, ["sync", "local"] + ["bn-stale-s%d" % s for s in STALENESS])
                  for m in ("fc_bn", "cnn")],
    # Groups of K of W = 8 workers on fc_bn (samples per channel = examples):
    # at b=2 a worker is below the regime boundary (~8 samples per channel)
    # and a group reaches it at K=4; at b=8 one worker is at it already.
    "groups": [("fc_bn", b, ["sync-k%d" % k for k in GROUP_SIZES]) for b in (2, 8)],
}


class Axis(collections.namedtuple(
        "Axis", "symbol label heading meaning values bounds base base_at")):
    """A one-axis matrix: its axis (symbol, label), its section's heading,
    what a row on it does, the value of each row on it, the rows that bound it (drawn across the
    plot), the row the gaps are taken against, and where that row sits on
    the axis ("low": before its first value, as sync before s = 0; "high":
    at its last, as K = W)."""


AXES = {
    "staleness": Axis("s", "BN staleness s (steps)", "BN staleness: test error against s",
                      "async BN: each worker normalizes with its own moments merged with "
                      "the other workers' of exactly s steps earlier (its own alone for "
                      "the first s steps), sync gradients",
                      {"bn-stale-s%d" % s: s for s in STALENESS}, ["sync", "local"],
                      "sync", "low"),
    "groups": Axis("K", "BN group size K (workers)",
                   "BN groups: test error against the group size K",
                   "sync BN within groups of K consecutive workers; the running "
                   "statistics follow the whole job",
                   {"sync-k%d" % k: k for k in GROUP_SIZES}, [],
                   "sync-k%d" % GROUP_SIZES[-1], "high"),
}


def cells(config):
    """[(model, b, rows)] of the config: a regime matrix, or the grid
    (config's policies x batch sizes on config's model)."""
    if config.get("matrix", "grid") == "grid":
        return [(config.get("model", "cnn"), b, list(config["policies"]))
                for b in config["batch_sizes"]]
    return [(m, b, list(rows)) for m, b, rows in MATRICES[config["matrix"]]]
FAMILIES = [("sync", ["sync"]), ("async", ["async-s1", "async-s4"]),
            ("recal", ["recal-precise", "recal-exact"])]


def eval_every_epoch(config):
    mode = config["eval_every_epoch"]
    return config["epochs"] >= 2 if mode == "auto" else mode == "true"


def plan_runs(config):
    """The runs in order: seed, then cell, then row (so an interrupted matrix
    still holds whole seeds)."""
    runs = []
    grid = config.get("matrix", "grid") == "grid"
    for seed in config["seeds"]:
        for model, b, rows in cells(config):
            for row in rows:
                rid = ("%s_b%d_seed%d" % (row, b, seed) if grid
                       else "%s_%s_b%d_seed%d" % (row, model, b, seed))
                runs.append({"id": rid, "policy": row, "model": model, "batch_size": b,
                             "samples_per_channel": POSITIONS.get(model, 0) * b,
                             "seed": seed, "status": "not run"})
    return runs


# --lr_scaling=linear: the learning rates are for this global batch and
# scale with workers x b (the reference's batch is the same global batch).
LR_BATCH = 4


def lr_scale(config, b):
    if config.get("lr_scaling", "fixed") != "linear":
        return 1.0
    return config["workers"] * b / float(LR_BATCH)


def learning_rate(config, row, b=None):
    scale = 1.0 if b is None else lr_scale(config, b)
    if ROWS[row].gradients == "async" and config.get("async_learning_rate") is not None:
        return config["async_learning_rate"] * scale
    return config["learning_rate"] * scale


def run_command(config, run, run_dir, inject):
    """The launcher command of one run."""
    row, b = run["policy"], run["batch_size"]
    bn_policy, gradients, staleness, recal_mode = ROWS[row][:4]
    workers = 1 if row == "reference" else config["workers"]
    batch = config["workers"] * b if row == "reference" else b
    threads = config["threads"]
    if row == "reference":
        threads = config["reference_threads_used"]
    cmd = [sys.executable, LAUNCHER, "--servers=%d" % config["servers"],
           "--workers=%d" % workers]
    # The launcher pairs them as the binaries do (policy::ResolvePolicy): a
    # shorthand pair reaches them as --policy, and its summary names it.
    cmd += ["--bn_policy=" + bn_policy, "--gradients=" + gradients]
    cmd += [
           "--bin_dir=" + config["bin_dir"], "--out_dir=" + run_dir,
           "--timeout_s=%g" % config["timeout_s"],
           "--learning_rate=%g" % learning_rate(config, row, b),
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
    if run.get("model", "cnn") != "cnn":
        cmd.append("--model=" + run["model"])
    cmd += ROWS[row].extra_flags
    cmd += config["worker_flags"]
    if inject:
        cmd.append("--width=0")  # The worker rejects it: a run that fails.
    run.update(workers=workers, worker_batch=batch, bn_policy=bn_policy,
               gradients=gradients, staleness=staleness, recal_mode=recal_mode,
               threads=threads, extra_flags=list(ROWS[row].extra_flags))
    return cmd


# ----------------------------------------------------------------------------
# Estimate (calibrated on the 2-core machine; see the docstring of
# experiments/compare_policies.py)

# Milliseconds per training step at per-worker batch 2, 8 and 32 (the
# reference: 1 worker with batch workers x b), interpolated in log2(b),
# measured with the tool on the 2-core machine (4 workers, 2 servers, load
# ~5 from another benchmark); see the docstring of experiments/compare_policies.py.
STEP_MS = {"reference": (10.5, 23.6, 84.0), "sync": (18.0, 26.5, 64.0),
           "async": (12.7, 23.0, 57.0), "local": (9.8, 22.3, 57.0),
           "recal": (8.0, 21.5, 60.0)}
START_S = 2.2          # servers and workers up, data loaded
EVAL_S_PER_10K = 0.8   # one test evaluation of 10000 examples
RECAL_FRACTION = {"precise": 0.35, "exact": 1.0}  # x one epoch's training time
SLOW_FACTOR = 1.9      # the slowest the same runs measured on the shared machine
CALIBRATION_WORKERS = 4  # more workers than this share the 2 cores: slower steps
MODEL_COST = {"cnn": 1.0, "deep": 2.0, "fc_bn": 0.6}


def step_ms(family, b):
    points = STEP_MS[family]
    x = math.log2(b) / 2.0 - 0.5  # 0 at b=2, 1 at b=8, 2 at b=32 (b=1: extrapolated)
    k = min(max(int(math.floor(x)), 0), 1)
    lo, hi = math.log(points[k]), math.log(points[k + 1])
    return math.exp(lo + (x - k) * (hi - lo))


def estimate_seconds(config, run):
    """Seconds one run takes on the calibration machine (a rough model)."""
    row, b = run["policy"], run["batch_size"]
    bn_policy, gradients, _, recal_mode = ROWS[row][:4]
    # BN traffic sets the cost: sync BN's two round trips per layer, async's
    # one; async gradients about as async BN (calibrated on the shorthands).
    family = ("reference" if row == "reference" else "sync" if bn_policy == "sync"
              else "async" if "async" in (bn_policy, gradients) else bn_policy)
    n = config["train_examples"] or 60000
    workers, batch = (1, config["workers"] * b) if row == "reference" else (config["workers"], b)
    # The workers share the cores: a step of more workers than calibrated
    # takes proportionally longer.
    crowd = max(1.0, workers / float(CALIBRATION_WORKERS))
    epoch_s = max(1, math.ceil(n / workers / batch)) * step_ms(family, b) * crowd / 1000.0
    evals = (config["epochs"] if eval_every_epoch(config) else 1) + (recal_mode is None)
    recal_s = RECAL_FRACTION[recal_mode or "precise"] * epoch_s
    if config["recal_examples"]:
        recal_s *= min(1.0, config["recal_examples"] / float(n))
    test = config["test_examples"] or 10000
    # The variants relative to the CNN (measured: 500 steps at b=1, 4
    # workers, load ~6): fc_bn's compute is negligible, deep's ~2x.
    factor = MODEL_COST.get(run.get("model", "cnn"), 1.0)
    return START_S + factor * (config["epochs"] * epoch_s + recal_s +
                               evals * EVAL_S_PER_10K * test / 10000)


def estimate_text(seconds):
    return ("%.0f min on the 2-core calibration machine (up to %.0f min when it is "
            "shared)" % (seconds / 60.0, SLOW_FACTOR * seconds / 60.0))
