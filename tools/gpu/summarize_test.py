#!/usr/bin/env python3
"""Tests of tools/gpu/summarize.py on a canned `run.sh all` from a GPU machine
(tools/gpu/testdata/run: the unpacked gpu-run.tar.gz of the run the docs quote).

Run: python3 tools/gpu/summarize_test.py  or  bazel test //tools/gpu:summarize_test
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import summarize  # noqa: E402

CANNED = os.path.join(HERE, "testdata", "run")
# The fused route's matrix, synthetic (testdata/torch_matrix/README.md).
MATRIX = os.path.join(HERE, "testdata", "torch_matrix")
# bnps.torch's ResNet-18 rows, by the number of processes.
QUEUED = ("bnps.torch sync / plain BN, ResNet-18, %d processes, batch 32, "
          "exchanges queued on the stream (the default on CUDA)")
WAIT = ("bnps.torch sync / plain BN, ResNet-18, %d processes, batch 32, each "
        "exchange waiting for the device (BNPS_STREAM_EXCHANGE=0)")


def mean_images_per_second(sub):
    with open(os.path.join(CANNED, sub, "summary.json")) as f:
        reports = json.load(f)["reports"]
    values = [r["images_per_second"] for r in reports]
    return sum(values) / len(values)


class ScalingRowsTest(unittest.TestCase):
    def test_ratio_of_the_aggregated_layouts_against_the_target(self):
        rows = [{"rtt_us": 200.0, "hosts": 4, "per_host": k, "p50_us": us,
                 "aggregated": agg, "p90_us": us}
                for agg, k, us in ((True, 1, 500.0), (True, 4, 600.0),
                                   (False, 1, 480.0), (False, 4, 1200.0))]
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "scaling.json"), "w") as f:
                json.dump({"rows": rows}, f)
            got = {r[0]: r for r in summarize.rows(summarize.collect(d))}
        agg = got["BN exchange on the bed, 4 hosts, 200 us links, per-host "
                  "aggregation: 4 workers/host / 1"]
        self.assertEqual(agg[1], "1.20 (600 us / 500 us)")
        self.assertEqual(agg[3], "met")
        flat = got["BN exchange on the bed, 4 hosts, 200 us links, flat: "
                   "4 workers/host / 1"]
        self.assertEqual(flat[1], "2.50 (1200 us / 480 us)")

    def test_the_bed_kind_is_named_when_saved(self):
        rows = [{"rtt_us": 200.0, "hosts": 4, "per_host": k, "p50_us": us,
                 "aggregated": True, "p90_us": us}
                for k, us in ((1, 500.0), (4, 600.0))]
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "scaling.json"), "w") as f:
                json.dump({"rows": rows, "bed": "loopback"}, f)
            got = {r[0]: r for r in summarize.rows(summarize.collect(d))}
        agg = got["BN exchange on the bed, 4 hosts, 200 us links, per-host "
                  "aggregation: 4 workers/host / 1"]
        self.assertEqual(agg[1], "1.20 (600 us / 500 us), hosts as loopback addresses")

    def test_a_run_without_the_bed_says_not_measured(self):
        with tempfile.TemporaryDirectory() as d:
            got = {r[0]: r for r in summarize.rows(summarize.collect(d))}
        row = got["BN exchange on the bed, 4 hosts, 200 us links, per-host "
                  "aggregation: 4 workers/host / 1"]
        self.assertEqual(row[3], "not measured")


class SummaryOfTheCannedRunTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.f = summarize.collect(CANNED)
        cls.rows = {r[0]: r for r in summarize.rows(cls.f)}

    def test_names_the_device_and_date(self):
        self.assertIn("H100", self.f["device"])
        self.assertRegex(self.f["date"], r"^\d{4}-\d\d-\d\d$")

    def test_every_cuda_test_passed_and_none_skipped(self):
        for t in summarize.TESTS:
            counts = self.f["tests"][t]
            self.assertIsNotNone(counts, t)
            self.assertGreater(counts["passed"], 0, t)
            self.assertEqual(counts["failed"] + counts["skipped"], 0, t)
            self.assertEqual(self.rows[t][3], "met")

    def test_demo_speedup_is_computed_from_the_two_runs(self):
        want = mean_images_per_second("demo") / mean_images_per_second("demo_nomps")
        row = self.rows["demo, 4 workers on one GPU: images/s per worker, MPS / none"]
        self.assertIn("= %.1fx" % want, row[1])
        self.assertEqual(row[3], "met" if want >= summarize.DEMO_SPEEDUP_TARGET else "missed")

    def test_step_ratios_come_from_the_ratio_table(self):
        for w in (1, 2, 4):
            r = self.f["step_gpu"][(w, 32, "sync")]
            self.assertLessEqual(r["min"], r["median"])
            self.assertLessEqual(r["median"], r["max"])
            row = self.rows["sync / local step, GPU, W=%d, batch 32" % w]
            self.assertTrue(row[1].startswith("%.2f" % r["median"]), row)
            self.assertEqual(row[3], "met" if r["median"] <= 1.10 else "missed")
            self.assertEqual(self.f["step_gpu"][(w, 32, "local")]["median"], 1.0)

    def test_model_step_and_kernels_are_read(self):
        self.assertIn((32, 1), self.f["model_step"])
        self.assertIn((128, 1), self.f["model_step"])
        for r in self.f["model_step"].values():
            self.assertAlmostEqual(r["ratio"], r["bnps_ms"] / r["torch_ms"], delta=0.02)
        kernels = {(r["kernel"], r["shape"]): r for r in self.f["kernels"]["rows"]}
        self.assertEqual(len(kernels), 12)
        backward = kernels[("backward", "[32,64,28,28]")]
        self.assertGreater(backward["us"], 0)
        self.assertGreater(backward["vs_cudnn"], 0)  # cuDNN's time / ours
        self.assertIsNone(kernels[("moments", "[32,64,28,28]")]["vs_cudnn"])

    def test_loopback_round_trip_is_read_when_present(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "rtt.log"), "w") as f:
                f.write("| transport | round trip p50 us | p90 us |\n|---|---:|---:|\n"
                        "| TCP 127.0.0.1 | 41.5 | 50.0 |\n| Unix socket | 12.2 | 15.0 |\n")
            got = {r[0]: r for r in summarize.rows(summarize.collect(d))}
            empty = {r[0]: r for r in summarize.rows(summarize.collect(CANNED + "-none"))}
        name = "loopback round trip, 64 bytes between two processes: TCP / Unix socket"
        self.assertEqual(got[name][1], "42 us / 12 us")
        self.assertEqual(empty[name][1], "n/a us / n/a us")

    def test_the_variant_rows_appear_only_when_measured(self):
        self.assertFalse(any("over TCP" in name or "evenly" in name
                             for name in self.rows))
        for variant, label in (("tcp", "BN over TCP (--bn_unix=false)"),
                               ("even", "the cores shared out evenly "
                                        "(--cores_each=even)")):
            with tempfile.TemporaryDirectory() as tmp:
                shutil.copy(os.path.join(CANNED, "step_overhead_gpu.txt"),
                            os.path.join(tmp, "step_overhead_gpu_%s.txt" % variant))
                f = summarize.collect(tmp)
                rows = {r[0]: r for r in summarize.rows(f)}
            want = self.f["step_gpu"][(4, 32, "sync")]["median"]
            row = rows["sync / local step, GPU, W=4, batch 32, " + label]
            self.assertTrue(row[1].startswith("%.2f" % want), row)
            self.assertEqual(len([n for n in rows if label in n]), 3)

    def test_exchange_cost_on_both_devices(self):
        gpu = summarize.per_exchange_us(self.f["step_gpu"], 1)
        cpu = summarize.per_exchange_us(self.f["step_cpu"], 1)
        self.assertGreater(gpu, 0)
        self.assertGreater(cpu, 0)

    def test_the_command_line_prints_the_table_and_writes_json(self):
        out = tempfile.mkdtemp()
        try:
            path = os.path.join(out, "r.json")
            p = subprocess.run([sys.executable, os.path.join(HERE, "summarize.py"),
                                CANNED, "--json", path],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("| check | figure | target |", p.stdout)
            self.assertIn("cuda_kernels_test", p.stdout)
            with open(path) as f:
                data = json.load(f)
            self.assertIn("(1, 32, 'sync')", data["step_gpu"])
            # Every part's figures are in it, the bed's too.
            run = os.path.join(out, "run")
            shutil.copytree(CANNED, run)
            with open(os.path.join(run, "scaling.json"), "w") as f:
                json.dump({"rows": [{"rtt_us": 200.0, "hosts": 4, "per_host": 1,
                                     "p50_us": 400.0, "p90_us": 450.0,
                                     "aggregated": True}], "bed": "loopback"}, f)
            p = subprocess.run([sys.executable, os.path.join(HERE, "summarize.py"),
                                run, "--json", path],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(path) as f:
                data = json.load(f)
            self.assertEqual(data["scaling"], {"(True, 200.0, 4, 1)": 400.0})
            self.assertEqual(data["scaling_bed"], "loopback")
        finally:
            shutil.rmtree(out)


class TorchRowsTest(unittest.TestCase):
    def test_parity_and_benchmark_rows_come_from_the_torch_folder(self):
        t = summarize.collect(CANNED)["torch"]
        self.assertIsNotNone(t)
        self.assertGreater(t["parity_ran"], 0)
        self.assertTrue(t["parity_ok"])
        by_key = {(r["procs"], r["batch"]): r for r in t["rows"]}
        self.assertIn((2, 32), by_key)
        self.assertIn((4, 32), by_key)
        rows = {r[0]: r for r in summarize.rows(summarize.collect(CANNED))}
        for procs in (2, 4):
            lo, med, hi = by_key[(procs, 32)]["bnps"]
            self.assertLessEqual(lo, med)
            self.assertLessEqual(med, hi)
            row = rows[WAIT % procs]
            self.assertTrue(row[1].startswith("%.2f (" % med), row)
            self.assertIn("torch SyncBatchNorm (gloo)", row[1])
            self.assertEqual(row[3], "met" if med <= summarize.TORCH_TARGET else "missed")

    def test_the_stream_column_gives_rows_of_its_own(self):
        # The canned run predates the column: no row for it.
        names = [r[0] for r in summarize.rows(summarize.collect(CANNED))]
        self.assertFalse([n for n in names if "queued on the stream" in n])
        with tempfile.TemporaryDirectory() as tmp:
            run = os.path.join(tmp, "run")
            shutil.copytree(CANNED, run)
            path = os.path.join(run, "torch", "pytorch_gpu.md")
            with open(path, "w") as f:
                f.write(
                    "ResNet-18 shape, 64x64 inputs, a GPU; torch 2.11\n\n"
                    "| P | batch | plain ms | bnps sync ms | bnps stream ms | "
                    "torch SyncBN (gloo) ms | bnps/plain min / median / max | "
                    "stream/plain min / median / max | torch/plain min / "
                    "median / max |\n|---|---|---|---|---|---|---|---|---|\n"
                    "| 2 | 32 | 10.00 | 50.00 | 14.00 | 55.00 | 4.90 / 5.00 / "
                    "5.10 | 1.30 / 1.40 / 1.60 | 5.40 / 5.50 / 5.60 |\n"
                    "| 4 | 32 | 10.00 | 50.00 | 17.00 | 55.00 | 4.90 / 5.00 / "
                    "5.10 | 1.60 / 1.70 / 1.90 | 5.40 / 5.50 / 5.60 |\n")
            rows = {r[0]: r for r in summarize.rows(summarize.collect(run))}
            # The stream's row first, with the peer's figure beside it.
            self.assertEqual(rows[QUEUED % 2][1:], (
                "1.40 (1.30-1.60); torch SyncBatchNorm (gloo) 5.50", "<= 1.50",
                "met"))
            self.assertEqual(rows[QUEUED % 4][3], "missed")
            self.assertEqual(rows[WAIT % 2][1:], ("5.00 (4.90-5.10)", "<= 1.50",
                                                  "missed"))
            names = list(rows)
            self.assertLess(names.index(QUEUED % 2), names.index(WAIT % 2))

    def test_the_fused_routes_matrix_gives_rows_and_the_docs_tables(self):
        names = [r[0] for r in summarize.rows(summarize.collect(CANNED))]
        self.assertFalse([n for n in names if "fused route" in n])
        self.assertFalse([n for n in names if "captured in a CUDA graph" in n])
        with tempfile.TemporaryDirectory() as tmp:
            run = os.path.join(tmp, "run")
            shutil.copytree(CANNED, run)
            for name in os.listdir(MATRIX):
                if name != "README.md":
                    shutil.copy(os.path.join(MATRIX, name),
                                os.path.join(run, "torch"))
            f = summarize.collect(run)
            rows = {r[0]: r for r in summarize.rows(f)}
            eager = ("bnps.torch sync / plain BN, fused route, ResNet-18, "
                     "float32, eager, %d processes, batch 32")
            captured = ("bnps.torch sync / plain BN, fused route, ResNet-50 "
                        "shape, bf16 autocast, channels_last, captured in a "
                        "CUDA graph, %d processes, batch 32")
            self.assertEqual(rows[eager % 2][1:], (
                "1.15 (1.10-1.20); torch SyncBatchNorm (gloo) 5.50", "<= 1.25",
                "met"))
            self.assertEqual(rows[eager % 4][3], "missed")  # 1.30
            self.assertEqual(rows[captured % 2][1:], (
                "1.10 (1.05-1.12)", "<= 1.15", "met"))
            self.assertEqual(rows[captured % 4][1:], (
                "1.20 (1.15-1.22)", "<= 1.15", "missed"))
            names = list(rows)  # the matrix's order: model, precision, mode
            self.assertLess(names.index(eager % 4), names.index(captured % 2))
            capture = rows["bnps.torch training step captured in a CUDA graph "
                           "(torch.cuda.graph, reduce-overhead), replays "
                           "with parity"]
            self.assertEqual(capture[1:], ("2 tests, passed", "all pass",
                                           "met"))
            # The docs' section carries each table under its configuration,
            # without the run's MPS pipe folder.
            section = summarize.torch_section(f)
            self.assertIn("ResNet-50 shape, 64x64 inputs, bf16 autocast, "
                          "channels_last, captured in a CUDA graph", section)
            self.assertIn("| 4 | 32 | 20.00 | n/a | 24.00 |", section)
            self.assertNotIn("bnps-mps-x", section)

    def test_the_host_cost_gives_a_row_where_it_ran(self):
        name = ("bnps.torch host time per layer, forward and backward "
                "(bench/pytorch_layer_host_cost.py): queued / waiting / "
                "plain BatchNorm2d")
        names = [r[0] for r in summarize.rows(summarize.collect(CANNED))]
        self.assertNotIn(name, names)  # the canned run predates it
        with tempfile.TemporaryDirectory() as tmp:
            run = os.path.join(tmp, "run")
            shutil.copytree(CANNED, run)
            with open(os.path.join(run, "torch", "torch_host_cost.log"),
                      "w") as f:
                f.write("20 layers of 64 channels, a GPU\n\n"
                        "| layer | us per layer | extra over plain (median) |\n"
                        "|---|---|---|\n"
                        "| plain BatchNorm2d | 40 / 41 / 45 |  |\n"
                        "| bnps, queued on the stream | 200 / 210 / 230 | 169 |\n"
                        "| bnps, waiting for the device | 300 / 320 / 330 | 279 |\n")
            rows = {r[0]: r for r in summarize.rows(summarize.collect(run))}
            self.assertEqual(rows[name][1], "210 us / 320 us / 41 us")
            # Rows that name their dtype, as the bench writes them now.
            with open(os.path.join(run, "torch", "torch_host_cost.log"),
                      "w") as f:
                f.write("20 layers of 64 channels, a GPU\n\n"
                        "| layer | us per layer | extra over plain (median) "
                        "| / plain (median) |\n"
                        "|---|---|---|---|\n"
                        "| plain BatchNorm2d, float32 | 40 / 41 / 45 |  |  |\n"
                        "| bnps, queued on the stream, float32 | 200 / 211 / "
                        "230 | 170 | 5.15 |\n"
                        "| bnps, waiting for the device, float32 | 300 / 321 "
                        "/ 330 | 280 | 7.83 |\n")
            rows = {r[0]: r for r in summarize.rows(summarize.collect(run))}
            self.assertEqual(rows[name][1], "211 us / 321 us / 41 us")

    def test_the_compile_suite_gives_a_row_where_it_ran(self):
        # The canned run predates the part: no row.
        names = [r[0] for r in summarize.rows(summarize.collect(CANNED))]
        self.assertFalse([n for n in names if "torch.compile" in n])
        name = ("bnps.torch under torch.compile (aot_eager), layers on the "
                "GPU, exchanges waiting for the device and queued on the stream")
        with tempfile.TemporaryDirectory() as tmp:
            run = os.path.join(tmp, "run")
            shutil.copytree(CANNED, run)
            log = os.path.join(run, "torch", "torch_compile.log")
            with open(log, "w") as f:
                f.write("test_stream_exchange ... ok\n\n"
                        "Ran 3 tests in 9.1s\n\nOK (skipped=1)\n")
            rows = {r[0]: r for r in summarize.rows(summarize.collect(run))}
            self.assertEqual(rows[name][1:], ("3 tests, passed", "all pass",
                                              "met"))
            with open(log, "w") as f:
                f.write("Ran 3 tests in 9.1s\n\nFAILED (failures=1)\n")
            rows = {r[0]: r for r in summarize.rows(summarize.collect(run))}
            self.assertEqual(rows[name][1:], ("3 tests, not all passed",
                                              "all pass", "missed"))

    def test_a_failed_parity_suite_and_a_missing_torch_part(self):
        with tempfile.TemporaryDirectory() as tmp:
            run = os.path.join(tmp, "run")
            shutil.copytree(CANNED, run)
            log = os.path.join(run, "torch", "torch_parity.log")
            with open(log) as f:
                text = f.read()
            with open(log, "w") as f:
                f.write(text.replace("\nOK", "\nFAILED (failures=1)"))
            rows = {r[0]: r for r in summarize.rows(summarize.collect(run))}
            self.assertEqual(rows["bnps.torch parity suite, layers on the GPU"][3], "missed")
            shutil.rmtree(os.path.join(run, "torch"))
            rows = {r[0]: r for r in summarize.rows(summarize.collect(run))}
            self.assertEqual(rows["bnps.torch (wheel) on the GPU"][3], "not run")


class CombinedRunsTest(unittest.TestCase):
    def test_a_later_partial_run_replaces_only_its_parts(self):
        with tempfile.TemporaryDirectory() as tmp:
            later = os.path.join(tmp, "later")
            os.makedirs(os.path.join(later, "torch"))
            for name in ("info.txt", "torch/pytorch_gpu.md", "torch/torch_parity.log"):
                shutil.copy(os.path.join(CANNED, name), os.path.join(later, name))
            with open(os.path.join(later, "commit.txt"), "w") as f:
                f.write("b" * 40)
            with open(os.path.join(later, "date.txt"), "w") as f:
                f.write("2030-01-02")
            with open(os.path.join(later, "rtt.log"), "w") as f:
                f.write("| transport | round trip p50 us | p90 us |\n|---|---:|---:|\n"
                        "| TCP 127.0.0.1 | 30.0 | 31.0 |\n")
            first = summarize.collect(CANNED)
            f = summarize.combine([first, summarize.collect(later)])
            self.assertEqual(f["tests"], first["tests"])        # from the first
            self.assertEqual(f["commit"], first["commit"])
            self.assertEqual(f["rtt"], {"TCP 127.0.0.1": 30.0})  # from the later
            self.assertEqual(f["part_from"]["torch"]["commit"], "b" * 40)
            self.assertEqual(f["part_from"]["demo"]["commit"], first["commit"])
            section = summarize.doc_section(f)
            self.assertIn("From a later call on the same kind of machine "
                          "(2030-01-02, commit bbbbbbbbbbbb): bnps.torch, the "
                          "loopback round trip.", section)
            self.assertIn("2030-01-02, commit bbbbbbbbbbbb", summarize.torch_section(f))

    def test_a_later_step_table_of_some_ws_keeps_the_others(self):
        with tempfile.TemporaryDirectory() as later:
            with open(os.path.join(CANNED, "step_overhead_gpu.txt")) as f:
                text = f.read()
            # The later call measured W = 2 and 4 only, with other numbers.
            kept = [l for l in text.splitlines() if not l.startswith("| 1 |")]
            with open(os.path.join(later, "step_overhead_gpu.txt"), "w") as f:
                f.write("\n".join(kept).replace(
                    "| 4 | 32 | sync | ", "| 4 | 32 | sync | 9") + "\n")
            for name, text in (("commit.txt", "c" * 40), ("date.txt", "2030-01-03"),
                               ("note.txt", "workers with --bn_spin_us=1000")):
                with open(os.path.join(later, name), "w") as f:
                    f.write(text)
            first = summarize.collect(CANNED)
            second = summarize.collect(later)
            f = summarize.combine([first, second])
            step = f["step_gpu"]
            self.assertEqual(step[(1, 32, "sync")], first["step_gpu"][(1, 32, "sync")])
            self.assertEqual(step[(2, 32, "sync")], second["step_gpu"][(2, 32, "sync")])
            self.assertEqual(step[(4, 32, "local")], second["step_gpu"][(4, 32, "local")])
            self.assertNotEqual(step[(4, 32, "sync")], first["step_gpu"][(4, 32, "sync")])
            self.assertIn("From a later call on the same kind of machine "
                          "(2030-01-03, commit cccccccccccc; workers with "
                          "--bn_spin_us=1000): the step overhead on the GPU "
                          "(W = 2, 4).", summarize.doc_section(f))


class PartialRunTest(unittest.TestCase):
    def test_missing_parts_are_said_not_fatal(self):
        tmp = tempfile.mkdtemp()
        try:
            run = os.path.join(tmp, "run")
            shutil.copytree(CANNED, run)
            for name in ("demo_nomps", "replicas"):
                shutil.rmtree(os.path.join(run, name))
            for name in ("model_cuda_test.log", "step_overhead_gpu.txt"):
                os.remove(os.path.join(run, name))
            rows = {r[0]: r for r in summarize.rows(summarize.collect(run))}
            self.assertEqual(rows["model_cuda_test"][1:], ("no log", "all pass, none skipped", "not run"))
            self.assertEqual(rows["sync / local step, GPU, W=2, batch 32"][3], "not measured")
            self.assertEqual(rows["--replicas=2 on one GPU"][3], "missed")
            demo = rows["demo, 4 workers on one GPU: images/s per worker, MPS / none"]
            self.assertEqual(demo[3], "not measured")
        finally:
            shutil.rmtree(tmp)


class DocsTest(unittest.TestCase):
    def setUp(self):
        self.repo = tempfile.mkdtemp()
        os.makedirs(os.path.join(self.repo, "docs"))
        self.perf = os.path.join(self.repo, "docs", "performance.md")
        self.readme = os.path.join(self.repo, "README.md")
        with open(self.perf, "w") as f:
            f.write("# Performance\n\nCPU tables.\n")
        with open(self.readme, "w") as f:
            f.write("| part | state |\n|---|---|\n%s\nold row\n%s\n| next | row |\n"
                    % (summarize.README_BEGIN, summarize.README_END))

    def tearDown(self):
        shutil.rmtree(self.repo)

    def read(self, path):
        with open(path) as f:
            return f.read()

    def test_update_docs_writes_the_section_once(self):
        f = summarize.collect(CANNED)
        summarize.update_docs(f, self.repo)
        first = self.read(self.perf)
        self.assertTrue(first.startswith("# Performance\n\nCPU tables.\n"))
        self.assertEqual(first.count(summarize.BEGIN), 1)
        self.assertIn("## On a GPU\n\nMeasured by `tools/gpu/run.sh all` "
                      "(docs/gpu.md) on " + f["device"], first)
        self.assertIn("| cuda_kernels_test |", first)
        summarize.update_docs(f, self.repo)
        self.assertEqual(self.read(self.perf), first)  # idempotent
        readme = self.read(self.readme)
        self.assertNotIn("old row", readme)
        row = [l for l in readme.splitlines() if l.startswith("| [GPU]")]
        self.assertEqual(len(row), 1, readme)
        self.assertIn(" | %s, " % f["device"], row[0])
        self.assertRegex(row[0], r": \d+ CUDA tests passed, \d+ failed or skipped \|$")
        self.assertLessEqual(len(row[0]), 120)  # one line of the status table
        self.assertTrue(readme.endswith("| next | row |\n"))

    def test_update_docs_writes_the_torch_table_between_its_markers(self):
        doc = os.path.join(self.repo, "docs", "pytorch.md")
        with open(doc, "w") as f:
            f.write("# bnps.torch\n\n%s\nstale row\n%s\nafter\n"
                    % (summarize.TORCH_BEGIN, summarize.TORCH_END))
        summarize.update_docs(summarize.collect(CANNED), self.repo)
        text = self.read(doc)
        self.assertNotIn("stale row", text)
        self.assertNotIn("pipe folder", text)  # the run's own temp paths
        self.assertIn("| P | batch | plain ms |", text)
        self.assertIn("| 4 | 32 |", text)
        self.assertTrue(text.endswith(summarize.TORCH_END + "\nafter\n"))

    def test_readme_without_markers_is_an_error(self):
        with open(self.readme, "w") as f:
            f.write("no markers\n")
        with self.assertRaises(ValueError):
            summarize.update_docs(summarize.collect(CANNED), self.repo)

    def test_keep_gpu_section_survives_a_cpu_rewrite(self):
        summarize.update_docs(summarize.collect(CANNED), self.repo)
        section = self.read(self.perf).split(summarize.BEGIN, 1)[1]
        rewritten = summarize.keep_gpu_section(self.perf, "# Performance\n\nnew CPU tables\n")
        self.assertIn("new CPU tables", rewritten)
        self.assertIn(summarize.BEGIN + section, rewritten)
        self.assertEqual(summarize.keep_gpu_section(self.readme, "x\n"), "x\n")


if __name__ == "__main__":
    unittest.main()
