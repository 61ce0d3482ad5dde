"""The export end to end, small: a sync job of 2 bnps_worker processes and 2
shards on 127.0.0.1 (LocalCluster: servers with --keep_serving) trains the built-in CNN on
real Fashion-MNIST; then bnps.export.export (Python, through the C++ client)
writes the same bytes as `bnps_status --export`, examples/export/evaluate.py
loads them into the equivalent torch.nn module with strict=True, and its
test accuracy equals the one worker 0 printed (float rounding may flip an
example whose two largest logits tie to float precision: at most 2 of
2000 allowed)."""

import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

RUNFILES = os.getcwd()
sys.path.insert(0, os.path.join(RUNFILES, "python"))  # Bazel runfiles
import torch_or_debian  # noqa: F401,E402  (first: torch, or Debian's python3)
sys.path.insert(1, os.path.join(RUNFILES, "examples", "export"))
import torch  # noqa: E402

import bnps.export  # noqa: E402
from bnps.cluster import LocalCluster  # noqa: E402
import evaluate  # noqa: E402

WORKER = os.path.join(RUNFILES, "worker", "bnps_worker")
STATUS = os.path.join(RUNFILES, "tools", "bnps_status")
TEST_EXAMPLES = 2000
WIDTH = 8
STEPS = 2 * 4096 // 2 // 32  # 2 epochs of 4096 examples, 2 workers


class ExportTest(unittest.TestCase):
    def test_the_export_evaluates_to_the_workers_accuracy(self):
        with tempfile.TemporaryDirectory() as out, \
                LocalCluster(num_servers=2, num_workers=2, policy="sync") as c:
            workers = [subprocess.Popen(
                [WORKER, "--servers=" + c.servers, f"--worker={w}",
                 "--num_workers=2", "--policy=sync", "--device=cpu",
                 "--train_examples=4096", "--batch_size=32", "--epochs=2",
                 f"--test_examples={TEST_EXAMPLES}", f"--width={WIDTH}",
                 "--eval=first", "--progress=none", "--threads=1",
                 "--report=" + os.path.join(out, f"w{w}.json")],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                for w in range(2)]
            logs = [w.communicate(timeout=240)[0] for w in workers]
            for w, log in zip(workers, logs):
                self.assertEqual(w.returncode, 0, log)
            self.assertRegex(logs[0], r"test accuracy \d\.\d{4}")
            with open(os.path.join(out, "w0.json")) as f:
                worker_accuracy = json.load(f)["test_accuracy"]

            path = os.path.join(out, "model.safetensors")
            info = bnps.export.export(path, c.servers)
            self.assertEqual(info["step"], STEPS)
            self.assertTrue(info["job_complete"])
            self.assertEqual(info["bn_layers"], 6)
            self.assertEqual(bnps.export.metadata(path)["bnps_step"], str(STEPS))
            # One implementation: the binary writes the same bytes.
            again = os.path.join(out, "again.safetensors")
            r = subprocess.run([STATUS, "--servers=" + c.servers,
                                "--export=" + again],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(path, "rb") as a, open(again, "rb") as b:
                self.assertEqual(a.read(), b.read())

            model = evaluate.load_model(path, width=WIDTH)  # strict=True
        images, labels = evaluate.test_set(TEST_EXAMPLES)
        torch.set_num_threads(1)
        accuracy = evaluate.accuracy(model, images, labels)
        self.assertAlmostEqual(accuracy, worker_accuracy,
                               delta=2.0 / TEST_EXAMPLES + 1e-12)
        self.assertGreater(accuracy, 0.3)  # it learned: chance is 0.1
        print("worker %.4f, PyTorch on the export %.4f" % (worker_accuracy,
                                                           accuracy))

    def test_a_file_with_other_names_is_refused(self):
        # strict=True: a module named otherwise than the export fails loudly
        # instead of evaluating with initial values.
        with tempfile.TemporaryDirectory() as out:
            path = os.path.join(out, "wrong.safetensors")
            model = evaluate.BnpsCnn(width=2)
            state = {k.replace("stem.", "steam."): v
                     for k, v in model.state_dict().items()}
            _write(path, state)
            with self.assertRaises(RuntimeError):
                evaluate.load_model(path, width=2)


def _write(path, state):
    """A safetensors file of `state` (float32/int64), for the refusal test."""
    header, blobs, offset = {}, [], 0
    names = {torch.float32: "F32", torch.int64: "I64"}
    for name, t in sorted(state.items()):
        data = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


if __name__ == "__main__":
    unittest.main()
