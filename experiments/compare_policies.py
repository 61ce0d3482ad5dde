#!/usr/bin/env python3
"""The policy comparison: one command runs a matrix of training runs with the
same data and seeds under the BN policies, and writes a report
(docs/results.md, a plot next to it, raw data in docs/results.json).

Usage:
    bazel build //server:bnps_server //worker:bnps_worker //python:libbnps.so
    python3 experiments/compare_policies.py                  # the default matrix
    python3 experiments/compare_policies.py --matrix=full    # the larger one
    python3 experiments/compare_policies.py --matrix=grid    # policies x batch sizes
    python3 experiments/compare_policies.py --matrix=smoke --smoke --results=/tmp/r/results.md
    python3 experiments/compare_policies.py --report_only    # re-render from JSON
    python3 experiments/compare_policies.py --dry_run        # commands + estimate

The matrices (experiments/compare/matrix.py, MATRICES):
    regime (default)  where synchronizing BN matters. A BN layer's statistics
                      are over batch x height x width of its input, so the
                      question is samples per channel per worker = per-worker
                      batch b x the positions per example at the model's
                      smallest BN input: the worker's --model=fc_bn (BN after
                      linear layers: 1), deep (2x2 maps: 4), cnn (7x7: 49).
                      Cells fc_bn b=1,2,8; deep b=1,8; cnn b=1,2 (samples 1,
                      2, 4, 8, 32, 49, 98), rows reference, local, sync,
                      recal-precise, async-s2 in every cell, and in one cell
                      (cnn, b=2) the crossed rows: bn-async-s2 (async BN, sync
                      gradients), grad-async-s2 (sync BN, async gradients),
                      grad-async-s2-recal (recal BN, async gradients), which
                      tell which half of async costs the accuracy. Seeds 1, 2,
                      3; the report gives mean +- standard deviation, gaps
                      with 2 standard errors, and a plot of test accuracy
                      against samples per channel per worker.
    full              more batch sizes (to 32 per worker), rows (async-s1,
                      async-s4, recal-exact) and 5 seeds on 3x the data:
                      hours on 2 cores.
    smoke             a tiny regime matrix (fc_bn b=1, the crossed cell) for
                      the test.
    grid              the first comparison: --policies x --batch_sizes on
                      --model (default every shorthand row at b = 2, 8, 32).
    staleness         one axis: async BN with the global moments of exactly s
                      steps earlier (--bn_staleness=s, s = 0, 1, 2, 4, 8, 16)
                      and sync gradients, with sync and local as the bounds;
                      fc_bn and cnn at b=2, 4 workers, 6000 examples, 3 seeds.
    groups            one axis: sync BN in groups of K consecutive workers
                      (--bn_group_size=K, K = 1, 2, 4, 8) of 8 workers; fc_bn
                      at b=2 and b=8 (below and at the regime boundary of
                      ~8 samples per channel per worker), 12000 examples,
                      3 seeds.
                      Both render their own section of the report (test error
                      mean +- sd, the gap to sync, a plot) and keep their data
                      under "one_axis" in results.json, beside the main
                      matrix's, which they leave as it is.
Rows (ROWS, each a matrix.Row with its extra launcher flags): reference (1 worker with the global batch workers x b, which
sync must match), local, sync, async-s1/s2/s4 (async BN and gradients,
bound s), recal-precise, recal-exact, and the crossed rows above. Every
non-recal run also gets --recalibrate=true (recal mode precise), so
"accuracy after recalibrating the running statistics" is there for every row.

Learning rate: --lr_scaling=linear (regime, full): --learning_rate (0.02) is
the rate of global batch 4 and scales with workers x b (0.04 at b=2, 0.16 at
b=8); a fixed 0.1 at global batch 4 made some fc_bn runs diverge (loss back to
ln 10) while others learned. --lr_scaling=fixed (grid): --learning_rate (0.1)
at every batch size. Rows with async gradients get --async_learning_rate, by
default the rate / workers (each worker's gradient is applied on its own, so
an update has batch b, not workers x b: the linear-scaling equivalent; in the
first calibration async at b=2 did not learn at all at 0.1).

Per run it records: status (ok, or failed with the launcher's reason line and
the last stderr line of the process it blamed), the test accuracy with the
running statistics, the test accuracy after recalibration, the final training
loss, images/s summed over the workers, milliseconds per step split into
compute, BN sync and gradient sync, max staleness, wall time and the load
average after it.

Budget: the default matrix must finish within about 45 min on 2 CPU cores.
The estimate (estimate_seconds; --dry_run prints it) is calibrated on the
project's 2-core AMD EPYC VM with 4 workers and 2 servers on the 2 cores while
other work ran (load 3-6): milliseconds per step of the CNN
    b=2: sync 18, async 13, local 10, recal 8, reference (1 worker, 4b) 11
    b=8: 27, 23, 22, 22, 24;  b=32: 64, 57, 57, 60, 84
(b=1 extrapolated), ~2 s start-up per run, ~0.8 s per 10000 test examples,
recalibration ~0.35 x an epoch; the variants cost ~0.6x (fc_bn) and ~2x
(deep) the CNN; more workers than 4 share the cores, so a step of W workers
costs W/4 of the 4-worker step (the 8-worker groups matrix: estimated 7.1
min, measured 6.7 min at load 8-22). The regime matrix: 3000 training
examples, 1 epoch, 5000 test examples, 114 runs, estimated 19 min (up to
~36 min on the shared machine).
Scale up with --matrix=full, --train_examples=0 (all 60000), more --epochs
and --seeds on a larger machine, or on a GPU with --worker_flag=--device=gpu.
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
