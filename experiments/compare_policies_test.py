#!/usr/bin/env python3
"""Tests of experiments/compare_policies.py and its package experiments/compare/.

SmokeTest runs the real thing once (--matrix=grid --smoke: a row of each kind,
SMOKE_ROWS, 2 workers at per-worker batch 2 and 8 on 256 training and 200 test
examples, real bnps_server and bnps_worker processes through
tools/bnps_launch.py) with one
failure injected, and checks
the report: a table per batch size with every row, the injected run shown as
failed with its reason while every other row is ok, results.json that parses
and holds every run, the plots when matplotlib is there (else the report says
they were skipped), and --report_only re-rendering the same tables while
keeping the hand-written block. RegimeSmokeTest runs --matrix=smoke (fc_bn
at one example per worker; the crossed BN policy x gradient mode rows on the
CNN), each row a real cluster. The two tool runs start together (ToolRun):
~110 s for both at load 11 on 2 cores, against ~155 s one after the other.

AxisMatricesTest checks --matrix=staleness and --matrix=groups: their plans,
that each row's --bn_staleness / --bn_group_size reaches both the servers'
and the workers' command lines as the launcher builds them, and their report
sections, results.json entries and plots on canned results. The other tests
exercise the pure parts of experiments/compare/ (reason lines, aggregation
over seeds, noise calls, rendering) without processes.

Run: bazel test //experiments:compare_policies_test   or, after
`bazel build //server:bnps_server //worker:bnps_worker //python:libbnps.so`,
python3 experiments/compare_policies_test.py
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "compare_policies.py")
if os.path.exists(os.path.join(os.getcwd(), "worker", "bnps_worker")):
    BIN_DIR = os.getcwd()  # Bazel: the runfiles root
else:
    BIN_DIR = os.path.join(os.path.dirname(HERE), "bazel-bin")
SMOKE_LIMIT_S = 300  # The whole smoke run; it takes ~40 s.
INJECTED = ("async-s4", 2)
# The grid smoke run's rows: each kind of row once (the policies' own runs
# are the ordinary suite's business: tests/training_test).
SMOKE_ROWS = ["reference", "local", "sync", "async-s4", "recal-exact"]

sys.path.insert(0, HERE)  # The package experiments/compare/, as the tool finds it.
from compare import matrix, options, plots, report, runner, stats  # noqa: E402

WORKERS = options.SMOKE["workers"]  # per run of --smoke (the reference: 1)


def have_matplotlib():
    if importlib.util.find_spec("matplotlib") is not None:
        return True
    if not os.access(plots.SYSTEM_PYTHON, os.X_OK):
        return False
    r = subprocess.run([plots.SYSTEM_PYTHON, "-c", "import matplotlib"],
                       capture_output=True, timeout=60)
    return r.returncode == 0


def tables(markdown):
    """{batch size: {row label: [cells]}} from the report's tables."""
    out, current = {}, None
    for line in markdown.splitlines():
        m = re.match(r"### Per-worker batch (\d+) ", line)
        if m:
            current = out.setdefault(int(m.group(1)), {})
            continue
        if line.startswith("## "):
            current = None
        if current is not None and line.startswith("| ") and not line.startswith("| policy"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            current[cells[0]] = cells
    return out


def label(row, b):
    return "reference (1×%d)" % (WORKERS * b) if row == "reference" else row


class ToolRun:
    """One run of the tool with real clusters, in the background: the smoke
    classes' two runs are started together (most of a cluster's time is
    start-up and waiting, so they overlap well on 2 cores) and each class
    waits for its own."""

    def __init__(self, prefix, flags):
        self.dir = tempfile.mkdtemp(prefix=prefix)
        self.md = os.path.join(self.dir, "report", "results.md")
        self.json = os.path.join(self.dir, "report", "results.json")
        cmd = [sys.executable, TOOL, "--smoke", "--bin_dir=" + BIN_DIR,
               "--out_dir=" + os.path.join(self.dir, "runs"), "--results=" + self.md] + flags
        self.popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True)
        self.proc = None

    def wait(self):
        """The finished process (subprocess.CompletedProcess)."""
        if self.proc is None:
            try:
                out, err = self.popen.communicate(timeout=SMOKE_LIMIT_S)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                out, err = self.popen.communicate()
            self.proc = subprocess.CompletedProcess(self.popen.args, self.popen.returncode,
                                                    out, err)
        return self.proc

    def close(self):
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.communicate()
        shutil.rmtree(self.dir, ignore_errors=True)


TOOL_RUNS = {}


def tool_run(name):
    """The smoke run `name` ("grid" or "regime"), both started on the first
    call."""
    if not TOOL_RUNS:
        TOOL_RUNS["grid"] = ToolRun("compare_policies_test_", [
            "--matrix=grid", "--policies=" + ",".join(SMOKE_ROWS),
            "--inject_failure=%s@%d" % INJECTED])
        TOOL_RUNS["regime"] = ToolRun("compare_policies_regime_test_", [
            "--matrix=smoke", "--no_plots"])
    return TOOL_RUNS[name]


def tearDownModule():  # noqa: N802  (unittest's name)
    for run in TOOL_RUNS.values():
        run.close()


class SmokeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        run = tool_run("grid")
        cls.dir, cls.md, cls.json = run.dir, run.md, run.json
        cls.proc = run.wait()
        cls.output = cls.proc.stdout[-4000:] + cls.proc.stderr[-4000:]

    def read(self, path):
        self.assertTrue(os.path.exists(path), self.output)
        with open(path, encoding="utf-8") as f:
            return f.read()

    def test_exit_status_says_a_run_failed(self):
        self.assertEqual(self.proc.returncode, 1, self.output)
        self.assertIn("FAILED", self.proc.stdout)
        self.assertNotIn("Traceback", self.proc.stderr)

    def test_report_has_every_row_and_the_failure(self):
        md = self.read(self.md)
        t = tables(md)
        self.assertEqual(sorted(t), [2, 8], md)
        for b in (2, 8):
            self.assertEqual(len(t[b]), len(SMOKE_ROWS), t[b])
            for row in SMOKE_ROWS:
                cells = t[b].get(label(row, b))
                self.assertIsNotNone(cells, "no row %s at b=%d:\n%s" % (row, b, md))
                self.assertEqual(len(cells), 12, cells)
                if (row, b) == INJECTED:
                    self.assertTrue(cells[1].startswith("**failed**"), cells)
                    self.assertIn("width", cells[1])  # the worker's own reason
                    self.assertEqual(cells[2], "—")
                else:
                    self.assertEqual(cells[1], "ok", cells)
                    acc = float(cells[2])
                    self.assertTrue(0.0 <= acc <= 1.0, cells)
                    float(cells[3])  # acc after recal: there for every row
                    self.assertEqual(cells[10], str(256 // (WORKERS * b)), cells)  # steps
        for heading in ("## Machine", "## Command", "## Setup and budget",
                        "## Plots", "## What the numbers say"):
            self.assertIn(heading, md)
        self.assertIn("--smoke", md)
        self.assertIn("Failed runs: async-s4_b2_seed1", md)
        self.assertIn(report.BEGIN_HAND, md)

    def test_results_json(self):
        data = json.loads(self.read(self.json))
        runs = data["runs"]
        self.assertEqual(len(runs), 2 * len(SMOKE_ROWS))
        for r in runs:
            if (r["policy"], r["batch_size"]) == INJECTED:
                self.assertEqual(r["status"], "failed")
                self.assertIn("w", r["reason"])
                self.assertIn("width", r["detail"])
                continue
            self.assertEqual(r["status"], "ok", r.get("reason"))
            self.assertEqual(r["workers"], 1 if r["policy"] == "reference" else WORKERS)
            self.assertEqual(r["worker_batch"],
                             r["batch_size"] * (WORKERS if r["policy"] == "reference" else 1))
            for key in ("test_accuracy", "test_accuracy_recal", "train_loss_last",
                        "images_per_second", "wall_s"):
                self.assertIsNotNone(r[key], (r["id"], key))
            self.assertEqual(set(r["ms_per_step"]), {"total", "compute", "bn_sync", "grad_sync"})
            if r["policy"].startswith("async"):
                self.assertLessEqual(r["max_staleness"], int(r["policy"][-1]))
            if r["policy"] in ("local", "recal-precise", "recal-exact"):
                self.assertEqual(r["ms_per_step"]["bn_sync"], 0.0, r["id"])
            self.assertEqual(r["out_dir"], "OUT_DIR/" + r["id"])
            self.assertTrue(os.path.exists(
                os.path.join(self.dir, "runs", r["id"], "summary.json")))
        # Not this machine's run folders nor its Python (the report's own
        # path, given outside the repository here, stays as given).
        text = self.read(self.json)
        self.assertNotIn(os.path.join(self.dir, "runs"), text)
        self.assertNotIn(sys.executable, text)
        self.assertEqual(data["config"]["bin_dir"], "BIN_DIR")

    def test_plots(self):
        data = json.loads(self.read(self.json))
        md = self.read(self.md)
        files = data["plots"].get("files") or {}
        if have_matplotlib():
            self.assertEqual(set(files), {"accuracy_vs_batch", "accuracy_over_time"}, data["plots"])
        if files:
            for path in files.values():
                self.assertEqual(os.path.dirname(path), os.path.dirname(self.md))
                with open(path, "rb") as f:
                    self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
                self.assertIn("](%s)" % os.path.basename(path), md)
        else:
            self.assertIn("Plots skipped", md)

    def test_report_only_keeps_tables_and_hand_written_text(self):
        copy_md = os.path.join(self.dir, "copy", "results.md")
        os.makedirs(os.path.dirname(copy_md))
        md = self.read(self.md)
        edited = md.replace(report.BEGIN_HAND + "\n", report.BEGIN_HAND + "\nSync wins at b=2.\n")
        with open(copy_md, "w", encoding="utf-8") as f:
            f.write(edited)
        r = subprocess.run([sys.executable, TOOL, "--report_only", "--no_plots",
                            "--results=" + copy_md, "--results_json=" + self.json],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        again = self.read(copy_md)
        self.assertIn("Sync wins at b=2.", again)
        self.assertEqual(tables(again), tables(md))
        self.assertIn("Plots skipped: --no_plots", again)


class EntryPointTest(unittest.TestCase):
    def test_help_from_another_cwd_under_each_python(self):
        """The script finds its package wherever it is started from."""
        pythons = [sys.executable]
        if os.access(plots.SYSTEM_PYTHON, os.X_OK):
            pythons.append(plots.SYSTEM_PYTHON)
        cwd = tempfile.mkdtemp(prefix="compare_policies_cwd_")
        try:
            for python in pythons:
                r = subprocess.run([python, TOOL, "--help"], cwd=cwd, capture_output=True,
                                   text=True, timeout=60)
                self.assertEqual(r.returncode, 0, (python, r.stderr))
                self.assertTrue(r.stdout.startswith("usage: compare_policies.py"), r.stdout)
                self.assertIn("--inject_failure ROW@B", r.stdout)
        finally:
            shutil.rmtree(cwd, ignore_errors=True)


def fake_run(row, b, seed, acc, status="ok", recal=None):
    return {"id": "%s_b%d_seed%d" % (row, b, seed), "policy": row, "batch_size": b,
            "seed": seed, "status": status, "test_accuracy": acc if status == "ok" else None,
            "test_accuracy_recal": recal if recal is not None else acc,
            "train_loss_last": 0.5, "images_per_second": 100.0, "steps": 10,
            "ms_per_step": {"total": 10.0, "compute": 5.0,
                            "bn_sync": 3.0 if row == "sync" else 0.0, "grad_sync": 2.0},
            "max_staleness": 0, "wall_s": 5.0,
            "reason": None if status == "ok" else "worker w1 exited with code 1",
            "detail": None if status == "ok" else "bnps_worker: step 3: boom"}


class RegimeSmokeTest(unittest.TestCase):
    """--matrix=smoke: fc_bn at one example per worker and the crossed async
    rows on the CNN, each a real cluster (launcher, servers, workers)."""

    @classmethod
    def setUpClass(cls):
        run = tool_run("regime")
        cls.dir, cls.md = run.dir, run.md
        cls.proc = run.wait()
        cls.output = cls.proc.stdout[-4000:] + cls.proc.stderr[-4000:]

    def test_every_run_succeeds_and_the_report_has_the_cells(self):
        self.assertEqual(self.proc.returncode, 0, self.output)
        with open(os.path.join(self.dir, "report", "results.json"), encoding="utf-8") as f:
            data = json.load(f)
        runs = {r["id"]: r for r in data["runs"]}
        planned = [(m, b, row) for m, b, rows in matrix.MATRICES["smoke"] for row in rows]
        self.assertEqual(len(runs), len(planned))
        for m, b, row in planned:
            r = runs["%s_%s_b%d_seed1" % (row, m, b)]
            self.assertEqual(r["status"], "ok", r)
            self.assertEqual(r["samples_per_channel"], matrix.POSITIONS[m] * b)
            bn, grads = matrix.ROWS[row][:2]
            self.assertEqual((r["bn_policy"], r["gradients"]), (bn, grads))
            # The launcher named the pair (policy::JobPolicyName): crossed
            # rows by both halves, the others by their shorthand.
            self.assertEqual(r["launcher_policy"],
                             "bn_policy=%s,gradients=%s" % (bn, grads)
                             if row in matrix.CROSSED else bn, row)
            if grads == "sync":
                self.assertEqual(r["max_staleness"], 0, row)
        with open(self.md, encoding="utf-8") as f:
            md = f.read()
        self.assertIn("| `fc_bn` | 1 | 1 |", md)
        self.assertIn("## Which half of async costs the accuracy (`cnn`, b=2 per worker)", md)
        # Linear scaling from 0.02 at global batch 4: 0.02 at 2 x 2, half of
        # it for async gradients (each worker's batch applied on its own).
        self.assertIn("| grad-async-s2 | sync | async (s=2) | 0.01 |", md)
        self.assertIn("| bn-async-s2 | async (s=2) | sync | 0.02 |", md)


def regime_run(row, model, b, seed, acc, recal=None):
    r = fake_run(row, b, seed, acc, recal=recal)
    r.update(id="%s_%s_b%d_seed%d" % (row, model, b, seed), model=model,
             samples_per_channel=matrix.POSITIONS[model] * b)
    return r


class RegimeTest(unittest.TestCase):
    def config(self, name="regime"):
        from compare import options
        return options.make_config(options.parse_args(["--matrix=" + name]))

    def test_default_matrix_sweeps_samples_per_channel_with_three_seeds(self):
        cfg = self.config()
        runs = matrix.plan_runs(cfg)
        self.assertEqual(sorted(cfg["seeds"]), [1, 2, 3])
        samples = sorted({r["samples_per_channel"] for r in runs})
        self.assertEqual(samples[0], 1)
        self.assertGreaterEqual(len(samples), 6)
        # Every cell has the sweep's rows; the crossed rows are in one cell.
        crossed = {(r["model"], r["batch_size"]) for r in runs
                   if r["policy"] in matrix.CROSSED}
        self.assertEqual(crossed, {("cnn", 2)})
        for r in runs:
            if r["policy"] == "sync":
                for row in matrix.SWEEP:
                    self.assertTrue(any(q["policy"] == row and q["model"] == r["model"] and
                                        q["batch_size"] == r["batch_size"] and
                                        q["seed"] == r["seed"] for q in runs), row)
        minutes = sum(matrix.estimate_seconds(cfg, r) for r in runs) / 60.0
        self.assertLess(minutes, matrix.BUDGET_MINUTES)
        self.assertGreater(len(matrix.plan_runs(self.config("full"))), len(runs))

    def test_commands_of_crossed_rows_and_variants(self):
        cfg = self.config()
        cfg["out_dir"] = "/out"
        by = {r["id"]: r for r in matrix.plan_runs(cfg)}
        cmd = matrix.run_command(cfg, by["grad-async-s2_cnn_b2_seed1"], "/out/x", False)
        self.assertIn("--bn_policy=sync", cmd)
        self.assertIn("--gradients=async", cmd)
        self.assertIn("--staleness=2", cmd)
        self.assertIn("--learning_rate=0.01", cmd)  # 0.02 x 8 / 4 / 4 workers
        self.assertFalse(any(c.startswith("--model=") for c in cmd))  # cnn: the default
        cmd = matrix.run_command(cfg, by["bn-async-s2_cnn_b2_seed1"], "/out/x", False)
        self.assertIn("--learning_rate=0.04", cmd)  # sync gradients
        cmd = matrix.run_command(cfg, by["reference_fc_bn_b1_seed2"], "/out/x", False)
        self.assertIn("--workers=1", cmd)
        self.assertIn("--batch_size=4", cmd)
        self.assertIn("--learning_rate=0.02", cmd)  # as the 4 workers of batch 1
        self.assertIn("--model=fc_bn", cmd)
        self.assertIn("--bn_policy=sync", cmd)
        self.assertIn("--gradients=sync", cmd)

    def test_gaps_and_boundary(self):
        from compare import regime
        self.assertEqual(regime.summary([None]), None)
        m, sd, n = regime.summary([0.8, 0.82, 0.84])
        self.assertAlmostEqual(m, 0.82)
        self.assertAlmostEqual(sd, 0.02)
        self.assertEqual(n, 3)
        runs = []
        for seed, (s1, l1, s49, l49) in enumerate([(0.70, 0.10, 0.80, 0.80),
                                                  (0.72, 0.12, 0.82, 0.79),
                                                  (0.71, 0.11, 0.81, 0.82)]):
            runs += [regime_run("sync", "fc_bn", 1, seed, s1),
                     regime_run("local", "fc_bn", 1, seed, l1),
                     regime_run("sync", "cnn", 1, seed, s49),
                     regime_run("local", "cnn", 1, seed, l49)]
        groups = regime.cell_groups(runs)
        cells = regime.cells_of({}, runs)
        self.assertEqual(cells, [("fc_bn", 1), ("cnn", 1)])
        lose, hold = regime.boundary(groups, cells)
        self.assertEqual([(s, m) for s, m, _, _ in lose], [(1, "fc_bn")])
        self.assertEqual([(s, m) for s, m, _, _ in hold], [(49, "cnn")])
        d, noise, sep = regime.gap(groups[("sync", "fc_bn", 1)]["acc"],
                                   groups[("local", "fc_bn", 1)]["acc"])
        self.assertAlmostEqual(d, 0.60)
        self.assertTrue(sep)
        data = {"config": dict(self.config(), seeds=[0, 1, 2]), "runs": runs,
                "machine": {"cpu": "Test CPU", "cores": 2}, "command_line": "cmd",
                "estimate_s": 60.0, "total_wall_s": 30.0}
        md = report.render_markdown(data, {"files": {}, "skipped": "no matplotlib"},
                                    "KEEP ME")
        self.assertIn("| `fc_bn` | 1 | 1 |", md)
        self.assertIn("0.710 ± 0.010", md)
        self.assertIn("+60.0 ± ", md)
        self.assertIn("sync beats local beyond the noise at 1 (`fc_bn` b=1, +60.0 points); "
                      "not at 49 (`cnn` b=1)", md)
        self.assertIn("KEEP ME", md)
        self.assertIn("Test CPU", md)


def axis_run(row, model, b, seed, acc):
    r = regime_run(row, model, b, seed, acc)
    r["history"] = [{"step": 1, "seconds": 0.1, "loss": 2.3, "accuracy": 0.1}]
    r["load_average"] = [3.0 + seed, 2.0, 1.0]
    return r


def canned_axis_data(name, accuracies):
    """One-axis matrix data: {(row, model, b): [acc per seed]} of 3 seeds."""
    cfg = options.make_config(options.parse_args(["--matrix=" + name]))
    cfg.update(out_dir="/tmp/canned/runs", bin_dir="/tmp/canned/bin")
    runs = [axis_run(row, m, b, seed, acc) for (row, m, b), accs in accuracies.items()
            for seed, acc in enumerate(accs, 1)]
    runs[0]["command"] = [sys.executable, matrix.LAUNCHER, "--out_dir=/tmp/canned/runs/a"]
    return {"tool": "experiments/compare_policies.py", "config": cfg, "runs": runs,
            "command_line": "python3 experiments/compare_policies.py --matrix=%s "
            "--out_dir=/tmp/canned/runs" % name, "machine": {"cpu": "Test CPU", "cores": 2},
            "estimate_s": 600.0, "total_wall_s": 900.0}


# Canned accuracies, 3 seeds each: staleness costs from s = 4 on `cnn`
# and never on fc_bn; groups at b=2 need K = 4, at b=8 K = 1 is enough.
STALENESS_ACC = {}
for _m, _b, _base, _local, _drop in (("cnn", 2, 0.70, 0.66, 4), ("fc_bn", 2, 0.80, 0.45, 99)):
    STALENESS_ACC[("sync", _m, _b)] = [_base - 0.01, _base, _base + 0.01]
    STALENESS_ACC[("local", _m, _b)] = [_local - 0.01, _local, _local + 0.01]
    for _s in matrix.STALENESS:
        _a = _base - (0.01 * _s if _s >= _drop else 0.0)
        STALENESS_ACC[("bn-stale-s%d" % _s, _m, _b)] = [_a - 0.01, _a, _a + 0.01]
GROUPS_ACC = {}
for _b, _accs in ((2, (0.40, 0.74, 0.81, 0.82)), (8, (0.80, 0.81, 0.81, 0.80))):
    for _k, _a in zip(matrix.GROUP_SIZES, _accs):
        GROUPS_ACC[("sync-k%d" % _k, "fc_bn", _b)] = [_a - 0.01, _a, _a + 0.01]


class AxisMatricesTest(unittest.TestCase):
    """--matrix=staleness and --matrix=groups: their plans, their commands
    through the launcher's own command builder, and their report sections
    on canned results."""

    def config(self, name):
        from compare import options
        cfg = options.make_config(options.parse_args(["--matrix=" + name]))
        cfg.update(out_dir="/out", bin_dir=BIN_DIR)
        return cfg

    def launched(self, cfg, run):
        """The server's and worker 0's command lines the launcher builds
        from the tool's command for run."""
        spec = importlib.util.spec_from_file_location("bnps_launch", matrix.LAUNCHER)
        launch = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(launch)
        cmd = matrix.run_command(cfg, run, "/out/x", False)
        args, extra = launch.parse_args(cmd[2:])
        return cmd, launch.server_command(args, 0), launch.worker_command(
            args, extra, 0, ["127.0.0.1:1"], "/out/x")

    def test_staleness_plan_and_flags_reach_both_binaries(self):
        cfg = self.config("staleness")
        runs = matrix.plan_runs(cfg)
        self.assertEqual(cfg["seeds"], [1, 2, 3])
        self.assertEqual({r["policy"] for r in runs},
                         {"sync", "local"} | {"bn-stale-s%d" % s for s in (0, 1, 2, 4, 8, 16)})
        self.assertEqual(len(runs), 3 * 2 * 8)
        minutes = sum(matrix.estimate_seconds(cfg, r) for r in runs) / 60.0
        self.assertLess(minutes, 20)
        by = {r["id"]: r for r in runs}
        cmd, server, worker = self.launched(cfg, by["bn-stale-s4_cnn_b2_seed2"])
        self.assertIn("--bn_policy=async", cmd)
        self.assertIn("--gradients=sync", cmd)  # BN staleness is the only change
        self.assertFalse(any(c.startswith("--staleness=") for c in cmd))
        self.assertIn("--learning_rate=0.04", cmd)  # sync gradients' rate
        for binary in (server, worker):
            self.assertIn("--bn_staleness=4", binary)
        cmd, server, worker = self.launched(cfg, by["sync_cnn_b2_seed2"])
        self.assertFalse(any("bn_staleness" in c for c in cmd + server + worker))

    def test_groups_plan_crosses_the_boundary_and_flags_reach_both_binaries(self):
        cfg = self.config("groups")
        runs = matrix.plan_runs(cfg)
        self.assertEqual(cfg["workers"], 8)
        self.assertEqual({r["policy"] for r in runs}, {"sync-k1", "sync-k2", "sync-k4", "sync-k8"})
        self.assertEqual(len(runs), 3 * 2 * 4)
        per_worker = sorted({r["samples_per_channel"] for r in runs})
        # One batch puts a worker below the boundary, the other at or above
        # it; the largest group is above it at every batch.
        self.assertLess(per_worker[0], matrix.REGIME_BOUNDARY)
        self.assertGreaterEqual(per_worker[-1], matrix.REGIME_BOUNDARY)
        self.assertGreaterEqual(per_worker[0] * max(matrix.GROUP_SIZES), matrix.REGIME_BOUNDARY)
        minutes = sum(matrix.estimate_seconds(cfg, r) for r in runs) / 60.0
        self.assertLess(minutes, 20)
        by = {r["id"]: r for r in runs}
        cmd, server, worker = self.launched(cfg, by["sync-k2_fc_bn_b8_seed3"])
        self.assertIn("--workers=8", cmd)
        self.assertIn("--bn_policy=sync", cmd)
        for binary in (server, worker):
            self.assertIn("--bn_group_size=2", binary)
        self.assertEqual(by["sync-k2_fc_bn_b8_seed3"]["extra_flags"], ["--bn_group_size=2"])

    def test_report_sections_on_canned_results(self):
        from compare import axes
        d = tempfile.mkdtemp(prefix="compare_axes_test_")
        self.addCleanup(shutil.rmtree, d, ignore_errors=True)
        md, js = os.path.join(d, "results.md"), os.path.join(d, "results.json")
        report.write_report(canned_axis_data("staleness", STALENESS_ACC), md, js, False)
        report.write_report(canned_axis_data("groups", GROUPS_ACC), md, js, False)
        with open(md, encoding="utf-8") as f:
            text = f.read()
        self.assertIn("## BN staleness: test error against s", text)
        self.assertIn("## BN groups: test error against the group size K", text)
        # Error = 1 - accuracy, mean ± sd, and the gap to sync in points.
        self.assertIn("| bn-stale-s8 | 8 | 20.0 ± 1.0 | +0.0 ± 1.6 | 38.0 ± 1.0 | "
                      "+8.0 ± 1.6 ** |", text)
        self.assertIn("| sync-k1 | 1 | 60.0 ± 1.0 | +42.0 ± 1.6 ** | 2 | 20.0 ± 1.0 | "
                      "+0.0 ± 1.6 | 8 |", text)
        self.assertIn("`fc_bn` b=2: groups of K ≥ 4 (8 samples per channel per group) are "
                      "within the noise of K = 8; K = 1 +42.0 ± 1.6 points, K = 2 +8.0 ± 1.6 "
                      "points.", text)
        self.assertIn("`fc_bn` b=8: groups of K ≥ 1 (8 samples", text)
        self.assertIn("`cnn` b=2: s = 0 to 2 are within the noise of sync", text)
        self.assertIn("`fc_bn` b=2: s = 0 to 16 are within the noise of sync", text)
        self.assertIn("at s = 16, -35.0 ± 1.6 points against local (beyond the noise)", text)
        # Each section's hand-written block survives a re-render.
        text = text.replace("_(Write the reading here; this block survives a re-render or "
                            "a new run.)_", "STALE READING", 1)
        with open(md, "w", encoding="utf-8") as f:
            f.write(text)
        doc = report.load_json(js)
        report.write_report(doc, md, js, False)
        with open(md, encoding="utf-8") as f:
            again = f.read()
        self.assertIn("STALE READING", again)
        self.assertEqual(again.count("<!-- BEGIN hand-written staleness -->"), 1)
        # Both matrices in one compact document without machine paths or
        # training curves; a main matrix written later keeps them.
        with open(js, encoding="utf-8") as f:
            raw = f.read()
        self.assertNotIn("/tmp/", raw)
        self.assertNotIn('"history"', raw)
        self.assertEqual(sorted(json.loads(raw)["one_axis"]), ["groups", "staleness"])
        self.assertTrue(all(len(line) < 3000 for line in raw.splitlines()))
        if have_matplotlib():
            files = plots.make_plots(report.load_json(js), md, js)["files"]
            for name in ("error_vs_staleness", "error_vs_groups"):
                self.assertGreater(os.path.getsize(files[name]), 1000, files)
        main = {"config": dict(RegimeTest().config(), seeds=[1]), "machine": {},
                "runs": [regime_run("sync", "cnn", 1, 1, 0.7)], "command_line": "cmd"}
        report.write_report(main, md, js, False)
        with open(md, encoding="utf-8") as f:
            both = f.read()
        self.assertIn("# Policy comparison: where synchronizing BN matters", both)
        self.assertIn("STALE READING", both)
        self.assertLess(both.index("## BN groups"), both.index("## Running it"))
        self.assertEqual(axes.within_noise(axes.cell_groups(
            canned_axis_data("groups", GROUPS_ACC)["runs"]), matrix.AXES["groups"],
            ("fc_bn", 2)), [4, 8])


class PureTest(unittest.TestCase):
    def test_failure_reason(self):
        log = "\n".join([
            "[w1] step 1/10", "bnps_launch: stopping s0, s1",
            "bnps_launch: FAILED: worker w1 exited with code 1",
            "bnps_launch: last 2 lines of w1's stderr (all in /x/w1.log):",
            "  some earlier line", "  bnps_worker: step 3: DEADLINE_EXCEEDED",
            "bnps_launch: logs in /x"])
        self.assertEqual(runner.failure_reason(log, 1),
                         ("worker w1 exited with code 1",
                          "bnps_worker: step 3: DEADLINE_EXCEEDED"))
        self.assertEqual(runner.failure_reason("bnps_launch.py: error: --servers must be at "
                                               "least 1 (got 0)", 2),
                         ("--servers must be at least 1 (got 0)", None))
        self.assertEqual(runner.failure_reason("nothing useful", -9),
                         ("the launcher exited with code -9", None))

    def test_seeds_aggregate_to_mean_and_range_and_failures_stay(self):
        runs = [fake_run("sync", 2, 1, 0.80), fake_run("sync", 2, 2, 0.84),
                fake_run("sync", 2, 3, 0.0, status="failed"),
                fake_run("local", 2, 1, 0.60), fake_run("local", 2, 2, 0.62),
                fake_run("local", 2, 3, 0.61)]
        g = stats.aggregate(runs, ["sync", "local"], [2])
        self.assertEqual(g[("sync", 2)]["n_ok"], 2)
        self.assertAlmostEqual(g[("sync", 2)]["test_accuracy"][0], 0.82)
        self.assertEqual(g[("sync", 2)]["test_accuracy"][1:], (0.80, 0.84))
        self.assertTrue(stats.separated(g[("sync", 2)], g[("local", 2)], "test_accuracy", 10000))
        close = stats.aggregate([fake_run("sync", 2, 1, 0.80), fake_run("sync", 2, 2, 0.84),
                                 fake_run("local", 2, 1, 0.83), fake_run("local", 2, 2, 0.85)],
                                ["sync", "local"], [2])
        self.assertFalse(stats.separated(close[("sync", 2)], close[("local", 2)],
                                         "test_accuracy", 10000))
        # One seed: the test-set sampling error of the difference decides:
        # 2 x 0.56 points on 10000 test examples, 2 x 1.8 points on 1000.
        one = stats.aggregate([fake_run("sync", 2, 1, 0.80), fake_run("local", 2, 1, 0.82)],
                              ["sync", "local"], [2])
        self.assertTrue(stats.separated(one[("sync", 2)], one[("local", 2)],
                                        "test_accuracy", 10000))
        self.assertFalse(stats.separated(one[("sync", 2)], one[("local", 2)],
                                         "test_accuracy", 1000))

    def test_render_with_seeds_failures_and_unrun_rows(self):
        config = {"policies": ["reference", "sync", "local"], "batch_sizes": [2, 32],
                  "seeds": [1, 2], "workers": 4, "servers": 2, "epochs": 1,
                  "train_examples": 1000, "test_examples": 0, "learning_rate": 0.1,
                  "momentum": 0.9, "weight_decay": 0.0, "recal_examples": 0,
                  "worker_flags": [], "inject": [], "reference_threads_used": 1}
        runs = [fake_run("reference", 2, 1, 0.85), fake_run("reference", 2, 2, 0.86),
                fake_run("sync", 2, 1, 0.84), fake_run("sync", 2, 2, 0.0, status="failed"),
                fake_run("local", 2, 1, 0.70, recal=0.83), fake_run("local", 2, 2, 0.72, recal=0.84)]
        runs += [dict(fake_run(row, 32, s, 0.0), status="not run", test_accuracy=None)
                 for row in config["policies"] for s in (1, 2)]
        data = {"config": config, "machine": {"cpu": "Test CPU", "cores": 2},
                "runs": runs, "results_json": "/x/results.json", "command_line": "cmd",
                "estimate_s": 60.0, "total_wall_s": 30.0}
        md = report.render_markdown(data, {"files": {}, "skipped": "no matplotlib"})
        t = tables(md)
        self.assertEqual(set(t[2]), {"reference (1×8)", "sync", "local"})
        self.assertEqual(set(t[32]), {"reference (1×128)", "sync", "local"})
        self.assertEqual(t[2]["reference (1×8)"][2], "0.8550 (0.8500–0.8600)")
        self.assertIn("ok 1/2", t[2]["sync"][1])
        self.assertIn("**failed** (seed 2): worker w1 exited with code 1: bnps_worker: "
                      "step 3: boom", t[2]["sync"][1])
        self.assertEqual(t[2]["sync"][2], "0.8400")
        self.assertEqual(t[32]["sync"][1], "not run (2)")
        self.assertIn("Test CPU", md)
        self.assertIn("Plots skipped: no matplotlib", md)
        self.assertIn("0.7100 with its averaged running stats, 0.8350 after recalibration", md)
        self.assertIn("**b=32**: no run succeeded (0 failed, 6 not run).", md)


class CompactJsonTest(unittest.TestCase):
    def test_round_trips_with_one_run_per_line(self):
        data = {"tool": "t", "runs": [{"id": "a", "acc": [0.5, 0.25]},
                                      {"id": "b", "acc": []}],
                "empty": [], "plots": {"files": {}}}
        text = report.compact_json(data)
        self.assertEqual(json.loads(text), data)
        lines = text.splitlines()
        self.assertIn(' {"id":"a","acc":[0.5,0.25]},', lines)
        self.assertIn(' {"id":"b","acc":[]}', lines)
        self.assertEqual(len(lines), 9)


class PortableCommandTest(unittest.TestCase):
    def test_machine_paths_become_flag_names(self):
        from compare.regime import portable_command
        line = ("python3 experiments/compare_policies.py --bin_dir=/tmp/b "
                "--out_dir /home/u/runs --smoke --seeds=2")
        self.assertEqual(
            portable_command(line),
            "python3 experiments/compare_policies.py --bin_dir=BIN_DIR "
            "--out_dir OUT_DIR --smoke --seeds=2")

    def test_portable_data(self):
        from compare.regime import portable_data
        data = {"config": {"out_dir": "/tmp/o/runs", "bin_dir": "/r/bazel-bin"},
                "results_json": "/r/docs/results.json",
                "argv": ["--matrix=groups", "--results=/tmp/r/results.md"],
                "command_line": "python3 t.py --results=/tmp/r/results.md",
                "runs": [{"command": ["/venv/bin/python3", "/r/tools/bnps_launch.py",
                                      "--bin_dir=/r/bazel-bin",
                                      "--out_dir=/tmp/o/runs/a_b1"],
                          "out_dir": "/tmp/o/runs/a_b1", "steps": 3}]}
        got = portable_data(data, repo="/r", python="/venv/bin/python3")
        self.assertEqual(got, {
            "config": {"out_dir": "OUT_DIR", "bin_dir": "BIN_DIR"},
            "results_json": "docs/results.json",
            "argv": ["--matrix=groups", "--results=RESULTS"],
            "command_line": "python3 t.py --results=RESULTS",
            "runs": [{"command": ["python3", "tools/bnps_launch.py",
                                  "--bin_dir=BIN_DIR", "--out_dir=OUT_DIR/a_b1"],
                      "out_dir": "OUT_DIR/a_b1", "steps": 3}]})
        self.assertEqual(data["config"]["out_dir"], "/tmp/o/runs")  # a copy

    def test_the_checked_in_data_names_no_machine_path(self):
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                            "docs", "results.json")
        if not os.path.exists(path):
            self.skipTest("docs/results.json is not in this test's files")
        with open(path, encoding="utf-8") as f:
            found = re.findall(r'[^\s"=]*[\s"=]/(?:tmp|home|work|root)/[^\s"]*',
                               f.read())
        self.assertEqual(found[:3], [], "%d machine paths in %s"
                         % (len(found), path))

    def test_the_checked_in_report_names_no_machine_path(self):
        md = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                          "docs", "results.md")
        if not os.path.exists(md):
            self.skipTest("docs/results.md is not in this test's files")
        with open(md, encoding="utf-8") as f:
            command = [l for l in f if l.startswith("Command: ")]
        for l in command:
            self.assertNotRegex(l, r"=/|\s/(tmp|home|work|root)/", l)


if __name__ == "__main__":
    unittest.main()
