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

import os
import sys

# The code is the package compare/ beside this file (one module per concern;
# see its __init__.py). Python puts the script's directory on sys.path only
# when it runs this file as a script, and then with symlinks resolved; adding
# it here as the path was given also covers importing this file (as the test
# does) and a Bazel runfiles tree, from any cwd, under any python3.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compare.main import main  # noqa: E402  (needs the path above)

if __name__ == "__main__":
    sys.exit(main())
