"""The experiment itself: which rows there are, the order of the runs, each
run's launcher command, and the model of how long the matrix takes.

Pure functions of the config (see options.make_config); nothing here starts a
process.
"""

import math
import os
import sys

TOOLS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TOOLS_DIR)
LAUNCHER = os.path.join(TOOLS_DIR, "bnps_launch.py")
# The command's entry point (the plots may be drawn by running it again under
# another interpreter).
ENTRY = os.path.join(TOOLS_DIR, "compare_policies.py")
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


# ----------------------------------------------------------------------------
# Estimate (calibrated on the 2-core machine; see the docstring of
# tools/compare_policies.py)

# Milliseconds per training step at per-worker batch 2, 8 and 32 (the
# reference: 1 worker with batch workers x b), interpolated in log2(b),
# measured with the tool on the 2-core machine (4 workers, 2 servers, load
# ~5 from another benchmark); see the docstring of tools/compare_policies.py.
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


def estimate_text(seconds):
    return ("%.0f min on the 2-core calibration machine (up to %.0f min when it is "
            "shared)" % (seconds / 60.0, SLOW_FACTOR * seconds / 60.0))
