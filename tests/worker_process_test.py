"""Real processes on 127.0.0.1: the launcher, bnps_server and bnps_worker.

A short run on Fashion-MNIST (installed by tools/setup.sh) must bring the
training loss clearly below its start and report a test accuracy; bad flags
and missing data must give one clear line on stderr, not a stack trace.
Also bnps_status's command line: --help lists every flag of each binary and
exits 0, a bad flag exits 2.
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

RUNFILES = os.getcwd()  # Bazel runs tests in the runfiles tree of the workspace
sys.path.insert(0, os.path.join(RUNFILES, "python"))
from bnps.cluster import parse_listening, server_command  # noqa: E402
SERVER = os.path.join(RUNFILES, "server", "bnps_server")
WORKER = os.path.join(RUNFILES, "worker", "bnps_worker")
STATUS = os.path.join(RUNFILES, "tools", "bnps_status")
LAUNCHER = os.path.join(RUNFILES, "tools", "bnps_launch.py")
TLS = os.path.join(RUNFILES, "tests", "testdata", "tls")
TOKEN = "process-test-token-0123456789"


def write_token(directory, token=TOKEN):
    path = os.path.join(directory, "token")
    with open(path, "w") as f:
        f.write(token + "\n")
    os.chmod(path, 0o600)  # a token others can read is refused
    return path


def run(args, timeout=60):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


class EndToEndTest(unittest.TestCase):
    def test_short_sync_run_learns(self):
        with tempfile.TemporaryDirectory() as out:
            r = run([sys.executable, LAUNCHER, "--servers", "2", "--workers", "2",
                     "--policy", "sync", "--bin_dir", RUNFILES, "--out_dir", out,
                     "--timeout_s", "240", "--batch_size=32", "--epochs=2",
                     "--train_examples=2048", "--test_examples=1000",
                     "--export", os.path.join(out, "model.safetensors")],
                    timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
            self.assertIn("result: policy=sync workers=2 servers=2", r.stdout)
            # --export read the servers at the end: the final step, the job
            # complete (every worker left), as safetensors.
            self.assertIn("BN layers' running statistics of step 64 (the job "
                          "is complete) to " + os.path.join(out, "model.safetensors"),
                          r.stdout)
            with open(os.path.join(out, "model.safetensors"), "rb") as f:
                size = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(size))
            self.assertEqual(header["__metadata__"]["bnps_step"], "64")
            self.assertEqual(header["stem.conv.weight"]["dtype"], "F32")
            self.assertEqual(header["stem.bn.num_batches_tracked"]["shape"], [])
            reports = [json.load(open(os.path.join(out, f"worker{w}.json")))
                       for w in range(2)]
            for report in reports:
                self.assertEqual(report["steps"], 2 * 2048 // 2 // 32)
                self.assertLess(report["train_loss_last"],
                                0.6 * report["train_loss_first"], report)
            # Worker 0 evaluates: well above chance (10%) after 128 steps.
            self.assertGreater(reports[0]["test_accuracy"], 0.5)
            self.assertIsNone(reports[1]["test_accuracy"])
            # A plaintext launch on one host: the BN traffic went over the
            # servers' Unix sockets, every worker to every shard.
            out_text = r.stdout + r.stderr
            for w in range(2):
                for s in range(2):
                    self.assertRegex(out_text, r"bnps worker %d: BN over a Unix "
                                     r"socket to shard %d \(.*\) at /" % (w, s))

    def test_async_run_reports_staleness_within_the_bound(self):
        with tempfile.TemporaryDirectory() as out:
            r = run([sys.executable, LAUNCHER, "--servers", "1", "--workers", "2",
                     "--policy", "async", "--staleness", "2", "--bin_dir", RUNFILES,
                     "--out_dir", out, "--timeout_s", "240", "--batch_size=32",
                     "--train_examples=1024", "--test_examples=500"],
                    timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
            for w in range(2):
                report = json.load(open(os.path.join(out, f"worker{w}.json")))
                self.assertLessEqual(report["max_staleness"], 2)
                self.assertEqual(report["policy"], "async")


    def test_secured_run_learns(self):
        # Mutual TLS and a job token, passed through the launcher.
        with tempfile.TemporaryDirectory() as out:
            token = write_token(out)
            r = run([sys.executable, LAUNCHER, "--servers", "2", "--workers", "2",
                     "--bin_dir", RUNFILES, "--out_dir", out, "--timeout_s", "240",
                     "--token_file", token,
                     "--server_tls_cert", os.path.join(TLS, "server.pem"),
                     "--server_tls_key", os.path.join(TLS, "server.key"),
                     "--tls_client_ca", os.path.join(TLS, "ca.pem"),
                     "--tls_ca=" + os.path.join(TLS, "ca.pem"),
                     "--tls_cert=" + os.path.join(TLS, "client.pem"),
                     "--tls_key=" + os.path.join(TLS, "client.key"),
                     "--batch_size=32", "--epochs=1", "--train_examples=1024",
                     "--test_examples=500"],
                    timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
            for w in range(2):
                report = json.load(open(os.path.join(out, f"worker{w}.json")))
                self.assertEqual(report["steps"], 1024 // 2 // 32)
                self.assertLess(report["train_loss_last"], report["train_loss_first"])
            # TLS: the BN statistics stay on the encrypted stream.
            self.assertNotIn("BN over TCP", r.stdout + r.stderr)


class OneLineErrors:
    def assertOneLine(self, r, code, *needles):
        self.assertEqual(r.returncode, code, r.stderr)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        for needle in needles:
            self.assertIn(needle, lines[0])
        self.assertNotIn("Traceback", r.stderr)


class CommandLineTest(OneLineErrors, unittest.TestCase):
    # Flags each binary must list in --help: its own and those of the
    # libraries it links (security/security_flags.cc for the clients).
    FLAGS = {
        SERVER: ["--host", "--port", "--bn_port", "--bn_unix_socket",
                 "--keep_awake_us",
                 "--heap_keep_mb", "--policy", "--token_file", "--tls_cert",
                 "--tls_key", "--tls_client_ca", "--metrics_port",
                 "--metrics_address", "--checkpoint_dir",
                 "--checkpoint_every_steps", "--on_worker_loss", "--keep_serving"],
        WORKER: ["--servers", "--connect_timeout_s", "--rpc_timeout_s",
                 "--bn_over_tcp", "--bn_unix",
                 "--token_file", "--tls_ca",
                 "--tls_cert", "--tls_key", "--metrics_port",
                 "--metrics_address", "--metrics_linger_s"],
        STATUS: ["--servers", "--timeout_ms", "--token_file", "--tls_ca",
                 "--tls_cert", "--tls_key", "--json", "--watch",
                 "--interval_s", "--count", "--digest", "--export", "--job"],
    }

    def test_help_lists_every_flag_and_exits_0(self):
        for binary, flags in self.FLAGS.items():
            name = os.path.basename(binary)
            r = run([binary, "--help"], timeout=30)
            self.assertEqual(r.returncode, 0, name + ": " + r.stdout + r.stderr)
            self.assertTrue(r.stdout.startswith(name + ": "), r.stdout[:300])
            for flag in flags:
                # Abseil's format: "    --flag (help text); default: ...;"
                self.assertIn(flag + " (", r.stdout, name)
            self.assertNotIn("--flagfile", r.stdout, name)  # Abseil's own

    def test_bad_flags_exit_2(self):
        for binary in self.FLAGS:
            self.assertOneLine(run([binary, "--no_such_flag=1"], timeout=30),
                               2, "no_such_flag")
        self.assertOneLine(run([WORKER, "--epochs=many"]), 2, "epochs")
        self.assertOneLine(run([SERVER, "--port=http"]), 2, "port")
        self.assertOneLine(run([STATUS, "--timeout_ms"]), 2, "timeout_ms")


class BadInputTest(OneLineErrors, unittest.TestCase):

    def test_worker_flags(self):
        self.assertOneLine(run([WORKER, "--batch_size=0", "--servers=127.0.0.1:1"]),
                           2, "--batch_size")
        self.assertOneLine(run([WORKER, "--worker=4", "--num_workers=4",
                                "--servers=127.0.0.1:1"]), 2, "--worker=4")
        self.assertOneLine(run([WORKER]), 2, "--servers is required")
        self.assertOneLine(run([WORKER, "--servers=127.0.0.1:1", "--device=tpu"]),
                           2, "--device=tpu")
        self.assertOneLine(run([WORKER, "--servers=127.0.0.1:1", "--width=0"]),
                           2, "width")
        self.assertOneLine(run([WORKER, "--no_such_flag=1"]), 2, "no_such_flag")
        self.assertOneLine(run([WORKER, "--epochs=many"]), 2, "epochs")

    def test_missing_data(self):
        with tempfile.TemporaryDirectory() as empty:
            self.assertOneLine(run([WORKER, "--servers=127.0.0.1:1",
                                    "--data_dir=" + empty]),
                               1, empty, "dataset-fashion-mnist")

    def test_corrupt_data(self):
        with tempfile.TemporaryDirectory() as d:
            for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                         "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
                with open(os.path.join(d, name), "wb") as f:
                    f.write(b"\x00\x00\x08\x03garbage")
            self.assertOneLine(run([WORKER, "--servers=127.0.0.1:1",
                                    "--data_dir=" + d]), 1, d)

    def test_unreachable_servers(self):
        # A closed port: the worker says at once what it connects to, keeps
        # retrying, and gives up after --connect_timeout_s (not the longer
        # --rpc_timeout_s) with one line naming the address.
        start = time.monotonic()
        worker = subprocess.Popen(
            [WORKER, "--servers=127.0.0.1:1", "--device=cpu",
             "--connect_timeout_s=3", "--rpc_timeout_s=60",
             "--train_examples=64"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # The first line says where it trains, the second what it
            # connects to, both before any wait.
            device = worker.stdout.readline()
            first = worker.stdout.readline()
            said = time.monotonic() - start
            still_trying = worker.poll() is None
            out, err = worker.communicate(timeout=30)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        took = time.monotonic() - start
        self.assertRegex(device, r"^bnps_worker 0/1: device (cpu|cuda:\d+.*): --device=")
        self.assertIn("connecting to job 'bnps' at 127.0.0.1:1 (up to 3s)", first)
        self.assertTrue(still_trying, first + out + err)
        self.assertOneLine(subprocess.CompletedProcess(worker.args,
                                                       worker.returncode, out, err),
                           1, "127.0.0.1:1", "connect_timeout 3s")
        self.assertGreaterEqual(took - said, 2)  # it retried meanwhile
        self.assertLess(took, said + 10)

    def test_connect_timeout_flag(self):
        self.assertOneLine(run([WORKER, "--servers=127.0.0.1:1",
                                "--connect_timeout_s=0"]),
                           2, "--connect_timeout_s")

    def test_server_flags(self):
        self.assertOneLine(run([SERVER, "--policy=bogus"]), 2, "bogus")
        self.assertOneLine(run([SERVER, "--port=70000"]), 2, "70000")

    def test_server_on_a_port_in_use(self):
        # A second server on a busy port must not start (gRPC would share the
        # port with SO_REUSEPORT and mix the two jobs' traffic).
        first = subprocess.Popen([SERVER, "--port=0"], stdout=subprocess.PIPE,
                                 text=True)
        try:
            port = parse_listening(first.stdout.readline()).rsplit(":", 1)[1]
            second = subprocess.Popen([SERVER, "--port=" + port],
                                      stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
            try:
                out, err = second.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                second.kill()
                out, err = second.communicate()
                self.fail("a second server started on port %s: %s" % (port, out))
            self.assertEqual(second.returncode, 1, out + err)
            last = err.strip().splitlines()[-1]
            self.assertTrue(last.startswith(
                "bnps_server: cannot listen on 127.0.0.1:" + port), err)
            self.assertIn("in use", last)
            self.assertNotIn("listening", out)
            self.assertIsNone(first.poll())  # the first one still serves
        finally:
            first.terminate()
            first.wait(timeout=10)

    def test_security_flags(self):
        cert = os.path.join(TLS, "server.pem")
        self.assertOneLine(run([SERVER, "--port=0", "--tls_cert=" + cert]), 2, "key")
        self.assertOneLine(run([SERVER, "--port=0", "--token_file=/nonexistent/tok"]),
                           2, "/nonexistent/tok")
        with tempfile.TemporaryDirectory() as d:
            short = write_token(d, "short")
            self.assertOneLine(run([SERVER, "--port=0", "--token_file=" + short]),
                               2, short, "16 to 4096")
            self.assertOneLine(run([WORKER, "--servers=127.0.0.1:1",
                                    "--token_file=" + short]), 2, short)
        self.assertOneLine(run([WORKER, "--servers=127.0.0.1:1",
                                "--tls_ca=/nonexistent/ca.pem"]),
                           1, "/nonexistent/ca.pem")

    def test_worker_with_the_wrong_token(self):
        with tempfile.TemporaryDirectory() as d:
            server = subprocess.Popen(
                [SERVER, "--port=0", "--token_file=" + write_token(d)],
                stdout=subprocess.PIPE, text=True)
            try:
                port = parse_listening(server.stdout.readline()).rsplit(":", 1)[1]
                for flags in ([], ["--token_file=" +
                                   write_token(d, "some-other-jobs-token")]):
                    self.assertOneLine(
                        run([WORKER, f"--servers=127.0.0.1:{port}", "--device=cpu",
                             "--train_examples=64"] + flags),
                        1, "token")
            finally:
                server.terminate()
                server.wait(timeout=10)

    def test_worker_flags_that_disagree_with_the_servers(self):
        server = subprocess.Popen([SERVER, "--port=0", "--policy=sync"],
                                  stdout=subprocess.PIPE, text=True)
        try:
            port = parse_listening(server.stdout.readline()).rsplit(":", 1)[1]
            self.assertOneLine(run([WORKER, f"--servers=127.0.0.1:{port}",
                                    "--policy=async", "--train_examples=64"]),
                               1, "--policy=async", "sync")
        finally:
            server.terminate()
            server.wait(timeout=10)


def start_server(*flags):
    """A bnps_server on a free port; returns (process, "127.0.0.1:port")."""
    server = subprocess.Popen(server_command(SERVER, port=0, flags=flags),
                              stdout=subprocess.PIPE, text=True)
    port = parse_listening(server.stdout.readline()).rsplit(":", 1)[1]
    return server, "127.0.0.1:" + port


def stop(process):
    """Stops a process this test started (by its Popen) and closes its pipes."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()


def worker_args(address, *flags):
    return [WORKER, "--servers=" + address, "--device=cpu", "--data=synthetic",
            "--eval=none", "--progress=none"] + list(flags)


def status(address):
    r = run([STATUS, "--servers=" + address], timeout=30)
    return r.stdout


class WorkerLifecycleTest(OneLineErrors, unittest.TestCase):
    """Who may join a job, and what happens to a worker the job dropped."""

    def test_a_bad_launch_leaves_the_servers_usable(self):
        # A worker launched with flags that do not fit the job stops before it
        # joins; so its corrected relaunch is welcome at once (had the bad one
        # registered, it would still be live, and the relaunch refused).
        server, address = start_server("--policy=sync", "--learning_rate=0.1",
                                       "--heartbeat_timeout_ms=1000")
        try:
            for flag, theirs in (("--policy=async", "sync"),
                                 ("--learning_rate=0.5", "0.1"),
                                 ("--staleness=3", "0")):
                self.assertOneLine(run(worker_args(address, flag, "--max_steps=2")),
                                   1, flag, theirs)
                self.assertIn("worker 0: not registered", status(address))
            r = run(worker_args(address, "--policy=sync", "--max_steps=2"))
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("done: 2 steps", r.stdout)
        finally:
            stop(server)

    def test_the_same_worker_launched_twice_is_refused(self):
        server, address = start_server("--num_workers=1")
        first = subprocess.Popen(worker_args(address, "--max_steps=100000"),
                                 stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 30
            while ("worker 0: live" not in status(address)
                   and time.monotonic() < deadline):
                time.sleep(0.1)
            self.assertIn("worker 0: live", status(address))
            self.assertOneLine(run(worker_args(address, "--max_steps=2")), 1,
                               "worker 0 is already registered")
            self.assertIsNone(first.poll())  # the first trains on
        finally:
            stop(first)
            stop(server)

    def test_a_lost_worker_stops_when_it_resumes(self):
        # async: pushes apply on arrival. A worker stopped (SIGSTOP) past the
        # heartbeat timeout is lost; resumed, it must change nothing and stop
        # with a clear line instead of training on.
        server, address = start_server("--policy=async", "--staleness=1",
                                       "--heartbeat_timeout_ms=1000")
        worker = subprocess.Popen(
            worker_args(address, "--epochs=1000", "--progress=plain",
                        "--progress_interval_s=0.1"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            for line in worker.stdout:  # training has begun
                if line.startswith("step "):
                    break
            worker.send_signal(signal.SIGSTOP)
            deadline = time.monotonic() + 15
            while ("worker 0: LOST" not in status(address)
                   and time.monotonic() < deadline):
                time.sleep(0.1)
            before = status(address)
            self.assertIn("worker 0: LOST", before)
            worker.send_signal(signal.SIGCONT)
            try:
                out, err = worker.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                out, err = worker.communicate()
                self.fail("the lost worker trains on: " + status(address))
            self.assertOneLine(
                subprocess.CompletedProcess(worker.args, worker.returncode,
                                            out, err),
                1, "worker 0 was lost")
            applied = re.compile(r"pushes (\d+) applied")
            self.assertEqual(applied.search(status(address)).group(1),
                             applied.search(before).group(1))
        finally:
            if worker.poll() is None:
                worker.send_signal(signal.SIGCONT)
            stop(worker)
            stop(server)


if __name__ == "__main__":
    unittest.main()
