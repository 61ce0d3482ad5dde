#!/usr/bin/env python3
"""Tests of tools/bnps_launch.py against fake server and worker binaries.

Each test builds a temporary --bin_dir holding server/bnps_server and
worker/bnps_worker: small Python scripts that follow the real binaries'
contracts (the server prints its "listening on" line and waits for SIGTERM;
the worker prints progress lines and writes a JSON report). Their behaviour is
steered by FAKE_SERVER_MODE in the environment and by --fake_* worker flags,
which also shows that unknown flags reach the workers. Each fake writes its PID
(and its argv) to $FAKE_PID_DIR so the tests can check that the launcher left
nothing running. Every wait here is bounded.

Run: python3 tools/bnps_launch_test.py   or   bazel test //tools:bnps_launch_test
"""

import contextlib
import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.path.join(HERE, "bnps_launch.py")
RUN_LIMIT_S = 25  # No single launcher run in these tests may take longer.

FAKE_SERVER = r'''
import os, signal, sys, time

def flag(name, default=None):
    for a in sys.argv[1:]:
        if a.startswith("--" + name + "="):
            return a.split("=", 1)[1]
    return default

shard = int(flag("shard", "0"))
piddir = os.environ.get("FAKE_PID_DIR")
if piddir:
    # Written whole, then renamed: the test never reads it half done.
    pid_file = os.path.join(piddir, "s%d.pid" % shard)
    with open(pid_file + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(pid_file + ".tmp", pid_file)
    with open(os.path.join(piddir, "s%d.args" % shard), "w") as f:
        f.write("\n".join(sys.argv[1:]))

def on_term(signum, frame):
    print("bnps_server: signal %d, shutting down" % signum, file=sys.stderr, flush=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, on_term)
mode = os.environ.get("FAKE_SERVER_MODE", "ok")
if mode == "die":
    print("bnps_server: cannot bind: address in use", file=sys.stderr, flush=True)
    sys.exit(1)
if mode == "silent":
    print("bnps_server: thinking about it", file=sys.stderr, flush=True)
else:
    print("bnps_server: shard %d of %s, job '%s', policy %s, %s workers, listening on "
          "127.0.0.1:%d" % (shard, flag("num_shards"), flag("job"), flag("policy"),
                            flag("num_workers"), 40000 + shard), flush=True)
for i in range(600):  # At most 60 s.
    if mode == "exit_early" and shard == 1 and i == 5:
        print("bnps_server: giving up", file=sys.stderr, flush=True)
        sys.exit(0)
    # Dies once (killed, say); started again it runs on.
    once = os.path.join(piddir or ".", "s%d.died" % shard)
    if mode == "die_once" and shard == 1 and i == 2 and not os.path.exists(once):
        open(once, "w").close()
        print("bnps_server: dying once", file=sys.stderr, flush=True)
        sys.exit(9)
    time.sleep(0.1)
sys.exit(5)
'''

# Writes its argv and how many fake servers still run to --export's file.
FAKE_STATUS = r'''
import os, sys
path = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--export=")][0]
piddir = os.environ["FAKE_PID_DIR"]
alive = 0
for name in os.listdir(piddir):
    if name.startswith("s") and name.endswith(".pid"):
        try:
            os.kill(int(open(os.path.join(piddir, name)).read()), 0)
            alive += 1
        except ProcessLookupError:
            pass
with open(path, "w") as f:
    f.write("\n".join(sys.argv[1:] + ["servers alive: %d" % alive]))
print("bnps_status: exported 2 parameters")
'''

FAKE_WORKER = r'''
import json, os, signal, sys, time

flags = {}
for a in sys.argv[1:]:
    name, _, value = a[2:].partition("=")
    flags[name] = value
me = int(flags["worker"])
piddir = os.environ.get("FAKE_PID_DIR")
if piddir:
    # Written whole, then renamed: the test never reads it half done.
    pid_file = os.path.join(piddir, "w%d.pid" % me)
    with open(pid_file + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(pid_file + ".tmp", pid_file)
if flags.get("fake_ignore_term"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

def hang():
    for _ in range(600):  # At most 60 s.
        time.sleep(0.1)
    sys.exit(6)

once = os.path.join(piddir or ".", "w%d.died" % me)
if flags.get("fake_fail_once_worker") == str(me) and not os.path.exists(once):
    open(once, "w").close()
    print("bnps_worker: dying once", file=sys.stderr, flush=True)
    sys.exit(3)
if flags.get("fake_fail_once_worker") == str(me):
    time.sleep(0.5)  # the restarted worker outlives the dying server
if flags.get("fake_fail_worker") == str(me):
    print("step 1/10 epoch 1 loss 2.3 acc 0.1 img/s 100 stale 0", flush=True)
    time.sleep(0.3)
    print("bnps_worker: BN forward of layer 'bn/3' step 2 timed out", file=sys.stderr, flush=True)
    sys.exit(3)
if flags.get("fake_hang"):
    hang()
if "fake_fail_worker" in flags:
    hang()  # The others wait for the failing one, like a real barrier.
steps = int(flags.get("fake_steps", "5"))
for s in range(1, steps + 1):
    print("step %d/%d epoch 1 loss %.3f acc 0.5 img/s 1000 stale 0" % (s, steps, 2.0 / s),
          flush=True)
    time.sleep(0.01)
print("test accuracy 0.%d (running stats)" % (8700 + me), flush=True)
if flags.get("fake_no_report_worker") == str(me):
    sys.exit(0)
report = {
    "worker": me, "policy": flags["policy"], "steps": steps,
    "train_loss_first": 2.0, "train_loss_last": 2.0 / steps,
    "test_accuracy": 0.87 + me / 10000.0,
    "test_accuracy_recal": 0.9 if flags["policy"] == "recal" else None,
    "images_per_second": 1234.5,
    "seconds": {"total": 1.5, "compute": 1.0, "bn_sync": 0.3, "grad_sync": 0.2},
    "argv": sys.argv[1:],
    "local_rank": os.environ.get("LOCAL_RANK"),
}
with open(flags["report"], "w") as f:
    json.dump(report, f)
'''


FAKE_HOST_BN = r'''
import os, signal, sys, time

piddir = os.environ.get("FAKE_PID_DIR")
if piddir:
    # Written whole, then renamed: the test never reads it half done.
    pid_file = os.path.join(piddir, "h0.pid")
    with open(pid_file + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(pid_file + ".tmp", pid_file)

def on_term(signum, frame):
    print("bnps_host_bn: shutting down", file=sys.stderr, flush=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, on_term)
print("bnps_host_bn: for 2 workers, listening on 127.0.0.1:7200", flush=True)
for i in range(600):  # At most 60 s.
    time.sleep(0.1)
sys.exit(5)
'''


def load_launcher_module():
    spec = importlib.util.spec_from_file_location("bnps_launch", LAUNCHER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_script(path, body):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("#!%s\n%s" % (sys.executable, body))
    os.chmod(path, 0o755)


def pid_alive(pid):
    """True if pid names a live (not zombie) process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, IndexError):
        return False


class LauncherTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="bnps_launch_test_", dir=os.environ.get("TEST_TMPDIR"))
        self.bin_dir = os.path.join(self.tmp, "bin")
        self.out_dir = os.path.join(self.tmp, "out")
        self.pid_dir = os.path.join(self.tmp, "pids")
        os.makedirs(self.pid_dir)
        write_script(os.path.join(self.bin_dir, "server", "bnps_server"), FAKE_SERVER)
        write_script(os.path.join(self.bin_dir, "worker", "bnps_worker"), FAKE_WORKER)

    def tearDown(self):
        for pid in self.started_pids():  # Never leave a fake behind, whatever happened.
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def env(self, server_mode="ok"):
        env = dict(os.environ)
        env["FAKE_PID_DIR"] = self.pid_dir
        env["FAKE_SERVER_MODE"] = server_mode
        return env

    def argv(self, *extra, servers=2, workers=3):
        return [sys.executable, LAUNCHER, "--servers=%d" % servers, "--workers=%d" % workers,
                "--bin_dir=" + self.bin_dir, "--out_dir=" + self.out_dir] + list(extra)

    def launch(self, *extra, server_mode="ok", servers=2, workers=3):
        t0 = time.monotonic()
        proc = subprocess.run(self.argv(*extra, servers=servers, workers=workers),
                              env=self.env(server_mode), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=RUN_LIMIT_S)
        proc.elapsed = time.monotonic() - t0
        return proc

    def started_pids(self):
        pids = {}
        for name in os.listdir(self.pid_dir):
            if name.endswith(".pid"):
                with open(os.path.join(self.pid_dir, name)) as f:
                    pids[name[:-4]] = int(f.read())
        return list(pids.values())

    def pid_of(self, name):
        with open(os.path.join(self.pid_dir, name + ".pid")) as f:
            return int(f.read())

    def assert_all_gone(self, names):
        # A process writes its pid file when its script starts; one the
        # launcher stopped before that never wrote it (and is gone). One it
        # left running writes it late: wait a little for that.
        deadline = time.monotonic() + 2
        for name in names:
            path = os.path.join(self.pid_dir, name + ".pid")
            while not os.path.exists(path) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not os.path.exists(path):
                continue
            pid = self.pid_of(name)
            self.assertFalse(pid_alive(pid), "%s (pid %d) is still running" % (name, pid))

    def all_names(self, servers=2, workers=3):
        return ["s%d" % i for i in range(servers)] + ["w%d" % i for i in range(workers)]

    # -- success ------------------------------------------------------------

    def test_success_prints_summary_and_writes_summary_json(self):
        r = self.launch("--policy=recal", "--learning_rate=0.05", "--bn_momentum=0.2",
                        "--epochs=2", "--batch_size=64", "--fake_steps=4")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        out = r.stdout
        for w in range(3):
            self.assertIn("[w%d] step 4/4" % w, out)
            self.assertIn("[w%d] test accuracy 0.870%d (running stats)" % (w, w), out)
        self.assertIn("[s0] bnps_server: shard 0 of 2", out)
        self.assertIn("[s1] bnps_server: signal 15, shutting down", out)  # stderr forwarded
        self.assertRegex(out, r"result: policy=recal workers=3 servers=2 "
                              r"test_accuracy=0\.8700 test_accuracy_recal=0\.9000 wall_s=\d+\.\d")
        table = [l for l in out.splitlines() if l.split()[:1] in (["worker"], ["w0"], ["w1"], ["w2"])]
        self.assertEqual(len(table), 4, out)
        self.assertIn("recal_acc", table[0])
        self.assertIn("grad_sync_s", table[0])
        self.assertEqual(table[1].split()[:5], ["w0", "4", "2.0000", "0.5000", "0.8700"])

        with open(os.path.join(self.out_dir, "summary.json")) as f:
            summary = json.load(f)
        self.assertEqual([rep["worker"] for rep in summary["reports"]], [0, 1, 2])
        # Each worker's local rank is its index (it picks its GPU by it).
        self.assertEqual([rep["local_rank"] for rep in summary["reports"]], ["0", "1", "2"])
        self.assertEqual(summary["policy"], "recal")
        self.assertEqual(summary["test_accuracy"], 0.87)
        self.assertGreater(summary["wall_s"], 0)
        self.assertIn("--epochs=2", summary["command"])
        self.assertEqual(summary["server_addresses"], ["127.0.0.1:40000", "127.0.0.1:40001"])

        # Worker flags: the launcher's own, the shared ones, and the extras unchanged.
        argv = summary["reports"][2]["argv"]
        self.assertIn("--servers=127.0.0.1:40000,127.0.0.1:40001", argv)
        for flag in ("--worker=2", "--num_workers=3", "--policy=recal", "--job=bnps",
                     "--learning_rate=0.05", "--progress=plain", "--epochs=2",
                     "--batch_size=64", "--fake_steps=4",
                     "--report=" + os.path.join(self.out_dir, "worker2.json")):
            self.assertIn(flag, argv)
        self.assertNotIn("--bn_momentum=0.2", argv)  # Servers only.
        with open(os.path.join(self.pid_dir, "s1.args")) as f:
            server_argv = f.read().split("\n")
        for flag in ("--port=0", "--host=127.0.0.1", "--shard=1", "--num_shards=2",
                     "--num_workers=3", "--policy=recal", "--learning_rate=0.05",
                     "--bn_momentum=0.2", "--keep_serving"):
            self.assertIn(flag, server_argv)
        self.assertNotIn("--epochs=2", server_argv)

        for name in ("s0", "s1", "w0", "w1", "w2"):
            with open(os.path.join(self.out_dir, name + ".log")) as f:
                self.assertTrue(f.readline().startswith("# "))
        with open(os.path.join(self.out_dir, "s0.log")) as f:
            self.assertIn("shutting down", f.read())  # stderr saved too
        self.assert_all_gone(self.all_names())

    def test_the_host_bn_aggregator_starts_before_the_workers_and_stops(self):
        write_script(os.path.join(self.bin_dir, "hostbn", "bnps_host_bn"),
                     FAKE_HOST_BN)
        r = self.launch("--bn_host_aggregator", servers=1, workers=2)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("host BN aggregator: 127.0.0.1:7200", r.stdout)
        with open(os.path.join(self.out_dir, "worker1.json")) as f:
            self.assertIn("--bn_host_aggregator=127.0.0.1:7200",
                          json.load(f)["argv"])
        with open(os.path.join(self.out_dir, "h0.log")) as f:
            self.assertIn("shutting down", f.read())  # SIGTERM, as the servers
        self.assert_all_gone(self.all_names(servers=1, workers=2) + ["h0"])

    def test_one_server_one_worker(self):
        r = self.launch(servers=1, workers=1)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("result: policy=sync workers=1 servers=1 test_accuracy=0.8700", r.stdout)
        self.assertNotIn("test_accuracy_recal", r.stdout)

    def test_export_reads_the_servers_before_they_stop(self):
        write_script(os.path.join(self.bin_dir, "tools", "bnps_status"), FAKE_STATUS)
        path = os.path.join(self.tmp, "model.safetensors")
        r = self.launch("--export=" + path, "--token_file=/t", "--tls_ca=/ca.pem",
                        servers=2, workers=1)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("bnps_status: exported", r.stdout)
        with open(path) as f:
            argv = f.read().split("\n")
        for flag in ("--servers=127.0.0.1:40000,127.0.0.1:40001", "--job=bnps",
                     "--export=" + path, "--token_file=/t", "--tls_ca=/ca.pem"):
            self.assertIn(flag, argv)
        # The servers were still up (the fake checks their pids).
        self.assertIn("servers alive: 2", argv)

    def test_a_failed_export_fails_the_run(self):
        write_script(os.path.join(self.bin_dir, "tools", "bnps_status"),
                     "import sys\nprint('bnps_status: no export: denied', file=sys.stderr)\n"
                     "sys.exit(1)\n")
        r = self.launch("--export=" + os.path.join(self.tmp, "m"), servers=1, workers=1)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("bnps_status: no export: denied", r.stdout)
        self.assertIn("FAILED: the export to", r.stdout)

    def test_export_needs_bnps_status(self):
        r = self.launch("--export=/tmp/x", servers=1, workers=1)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("bnps_status not found", r.stderr)

    # -- failures -----------------------------------------------------------

    def test_failing_worker_stops_the_others(self):
        r = self.launch("--fake_fail_worker=1")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("FAILED: worker w1 exited with code 3", r.stdout)
        self.assertIn("timed out", r.stdout.split("FAILED")[1])  # its stderr tail
        self.assertLess(r.elapsed, 10)
        self.assert_all_gone(self.all_names())
        self.assertFalse(os.path.exists(os.path.join(self.out_dir, "summary.json")))

    def test_worker_ignoring_sigterm_is_killed(self):
        r = self.launch("--fake_fail_worker=0", "--fake_ignore_term=1", "--kill_grace_s=0.5")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("FAILED: worker w0 exited with code 3", r.stdout)
        self.assertIn("SIGKILL", r.stdout)
        self.assert_all_gone(self.all_names())

    def test_server_that_never_prints_its_port_fails_in_time(self):
        r = self.launch("--server_start_timeout_s=1", server_mode="silent")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("FAILED: server s0 did not print 'listening on HOST:PORT' within 1s",
                      r.stdout)
        self.assertIn("thinking about it", r.stdout.split("FAILED")[1])
        self.assertLess(r.elapsed, 8)
        self.assert_all_gone(["s0", "s1"])
        self.assertFalse(os.path.exists(os.path.join(self.pid_dir, "w0.pid")))

    def test_server_that_exits_at_start_fails(self):
        r = self.launch(server_mode="die")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("FAILED: server s0 exited with code 1 before printing its port", r.stdout)
        self.assertIn("cannot bind", r.stdout.split("FAILED")[1])
        self.assertLess(r.elapsed, 8)

    def test_server_exiting_during_the_run_fails(self):
        r = self.launch("--fake_hang=1", server_mode="exit_early")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("FAILED: server s1 exited with code 0 before the workers finished",
                      r.stdout)
        self.assertIn("giving up", r.stdout.split("FAILED")[1])
        self.assert_all_gone(self.all_names())

    def test_restart_on_failure_restarts_a_dead_worker_and_server(self):
        r = self.launch("--restart=on-failure", "--fake_fail_once_worker=1",
                        "--fake_steps=40", server_mode="die_once")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"restarting w1 \(restart [12] of 3\): it exited "
                         r"with code 3")
        self.assertRegex(r.stdout, r"restarting s1 \(restart [12] of 3\): it exited "
                         r"with code 9 before the workers finished")
        # The server came back on its port, from its checkpoints.
        with open(os.path.join(self.pid_dir, "s1.args")) as f:
            args = f.read().split("\n")
        self.assertIn("--port=40001", args)
        self.assertIn("--checkpoint_dir=" + os.path.join(self.out_dir, "checkpoints",
                                                         "shard1"), args)
        self.assertIn("--checkpoint_every_steps=10", args)
        with open(os.path.join(self.out_dir, "w1.log")) as f:
            self.assertIn("dying once", f.read())  # the log keeps both runs

    def test_restarts_are_bounded(self):
        r = self.launch("--restart=on-failure", "--max_restarts=0",
                        "--fake_fail_once_worker=1")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("FAILED: worker w1 exited with code 3", r.stdout)
        self.assertNotIn("restarting", r.stdout)
        for pid in self.started_pids():
            self.assertFalse(pid_alive(pid), "pid %d is still running" % pid)

    def test_timeout_stops_a_hanging_cluster(self):
        r = self.launch("--fake_hang=1", "--timeout_s=1.5")
        self.assertEqual(r.returncode, 124, r.stdout + r.stderr)
        self.assertIn("FAILED: timed out after --timeout_s=1.5; still running: s0, s1, w0, w1, w2",
                      r.stdout)
        self.assertLess(r.elapsed, 8)
        self.assert_all_gone(self.all_names())

    def test_sigint_stops_everything_and_exits_130(self):
        proc = subprocess.Popen(self.argv("--fake_hang=1"), env=self.env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            for _ in range(200):  # At most 10 s for every process to start.
                # Each writes its pid file when it runs, in no set order.
                if all(os.path.exists(os.path.join(self.pid_dir, n + ".pid"))
                       for n in self.all_names()):
                    break
                time.sleep(0.05)
            else:
                self.fail("workers did not start")
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=RUN_LIMIT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.assertEqual(proc.returncode, 130, out + err)
        self.assertIn("FAILED: interrupted by SIGINT (Ctrl-C)", out)
        self.assert_all_gone(self.all_names())

    def test_worker_without_report_fails(self):
        r = self.launch("--fake_no_report_worker=2")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("FAILED: worker w2 exited 0 but its report", r.stdout)
        self.assertIn("(no report)", r.stdout)
        self.assertIn("result: policy=sync", r.stdout)

    # -- bad input ----------------------------------------------------------

    def test_missing_binaries_say_how_to_build(self):
        os.remove(os.path.join(self.bin_dir, "worker", "bnps_worker"))
        r = self.launch()
        self.assertEqual(r.returncode, 2)
        self.assertIn("worker/bnps_worker not found", r.stderr)
        self.assertIn("--build", r.stderr)
        self.assertIn("bazel build //server:bnps_server //worker:bnps_worker", r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)

    def test_bad_counts_and_flags_are_rejected(self):
        for args, message in (
                (["--workers=0"], "--workers must be at least 1"),
                (["--servers=0"], "--servers must be at least 1"),
                (["--epochs", "3"], "worker flags must be written --flag=value; got '3'"),
                (["--worker=2"], "--worker is set by the launcher"),
                (["--policy=fast"], "invalid choice"),
                (["--policy=sync", "--bn_policy=local"],
                 "--policy=sync means --bn_policy=sync, not local"),
        ):
            argv = [sys.executable, LAUNCHER, "--bin_dir=" + self.bin_dir] + args
            r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, timeout=RUN_LIMIT_S)
            self.assertEqual(r.returncode, 2, args)
            self.assertIn(message, r.stderr, args)


    def test_without_libbnps_the_policy_is_a_usage_error_saying_how(self):
        # The launcher and bnps, but no libbnps.so anywhere it looks.
        repo = os.path.join(self.tmp, "repo")
        shutil.copytree(HERE, os.path.join(repo, "tools"),
                        ignore=shutil.ignore_patterns("*_test*", "BUILD"))
        shutil.copytree(os.path.join(os.path.dirname(HERE), "python", "bnps"),
                        os.path.join(repo, "python", "bnps"))
        env = {k: v for k, v in os.environ.items() if k not in ("BNPS_NATIVE_LIB", "PYTHONPATH")}
        r = subprocess.run([sys.executable, os.path.join(repo, "tools", "bnps_launch.py"),
                            "--bin_dir=" + self.bin_dir, "--policy=async"], cwd=self.tmp,
                           env=env, capture_output=True, text=True, timeout=RUN_LIMIT_S)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("needs libbnps.so", r.stderr)
        self.assertIn("bazel build //python:libbnps.so", r.stderr)
        self.assertEqual(self.started_pids(), [])


class UnitTest(unittest.TestCase):
    """Pieces of the launcher, imported as a module."""

    @classmethod
    def setUpClass(cls):
        cls.m = load_launcher_module()

    def test_unknown_flags_go_to_workers_unabbreviated(self):
        args, extra = self.m.parse_args(["--work=3", "--epochs=2", "--device=cpu", "--build"])
        self.assertEqual(extra, ["--work=3", "--epochs=2", "--device=cpu"])
        self.assertEqual(args.workers, 4)
        self.assertTrue(args.build)

    def test_policy_pairs_reach_servers_and_workers(self):
        cases = [([], ["--policy=sync"]),
                 (["--policy=async"], ["--policy=async"]),
                 (["--bn_policy=recal"], ["--policy=recal"]),
                 (["--bn_policy=async", "--gradients=sync"],
                  ["--bn_policy=async", "--gradients=sync"]),
                 (["--policy=recal", "--gradients=async"], None),
                 (["--gradients=async"], ["--bn_policy=sync", "--gradients=async"])]
        for argv, want in cases:
            if want is None:
                err = io.StringIO()
                with self.assertRaises(SystemExit), contextlib.redirect_stderr(err):
                    self.m.parse_args(argv)
                self.assertIn("--policy=recal means --gradients=sync", err.getvalue())
                continue
            args, extra = self.m.parse_args(argv)
            for cmd in (self.m.server_command(args, 0),
                        self.m.worker_command(args, extra, 0, ["127.0.0.1:1"], "/out")):
                got = [f for f in cmd if f.split("=")[0] in
                       ("--policy", "--bn_policy", "--gradients")]
                self.assertEqual(got, want, argv)

    def test_resize_starts_every_id_and_gives_the_servers_the_history(self):
        args, extra = self.m.parse_args(["--workers=2", "--resize=4:4,8:2"])
        self.assertEqual(args.workers, 4)
        server = self.m.server_command(args, 0)
        self.assertIn("--membership=0:2,4:4,8:2", server)
        self.assertIn("--num_workers=4", server)
        worker = self.m.worker_command(args, extra, 3, ["127.0.0.1:1"], "/out")
        self.assertIn("--num_workers=4", worker)
        self.assertFalse(any(f.startswith("--membership") for f in worker))
        plain, _ = self.m.parse_args([])
        self.assertFalse(any(f.startswith("--membership")
                             for f in self.m.server_command(plain, 0)))
        for bad in ("4", "4:x", "4:4:4", "-1:2"):
            with self.assertRaises(SystemExit):
                self.m.parse_args(["--resize=" + bad])
        # The host's aggregator waits for a fixed set of workers.
        with self.assertRaises(SystemExit):
            self.m.parse_args(["--resize=4:4", "--bn_host_aggregator"])

    def test_metrics_ports_follow_the_base(self):
        args, extra = self.m.parse_args(["--servers=2", "--workers=3",
                                         "--metrics_port_base=9400"])
        self.assertIn("--metrics_port=9401", self.m.server_command(args, 1))
        worker = self.m.worker_command(args, extra, 2, ["127.0.0.1:1"], "/out")
        self.assertIn("--metrics_port=9404", worker)
        args, _ = self.m.parse_args(["--servers=2", "--workers=3",
                                     "--metrics_port_base=9400",
                                     "--bn_host_aggregator"])
        self.assertIn("--metrics_port=9405", self.m.host_bn_command(args))
        with self.assertRaises(SystemExit):  # 2 + 3 + 1 ports from 65531
            self.m.parse_args(["--servers=2", "--workers=3",
                               "--metrics_port_base=65531",
                               "--bn_host_aggregator"])
        args, extra = self.m.parse_args([])
        self.assertFalse(any(f.startswith("--metrics_port")
                             for f in self.m.server_command(args, 0)))

    def test_security_options_reach_the_right_binaries(self):
        args, extra = self.m.parse_args([
            "--token_file=/t", "--server_tls_cert=/s.pem", "--server_tls_key=/s.key",
            "--tls_client_ca=/ca.pem", "--tls_ca=/ca.pem", "--tls_cert=/c.pem",
            "--tls_key=/c.key"])
        server = self.m.server_command(args, 0)
        for flag in ("--token_file=/t", "--tls_cert=/s.pem", "--tls_key=/s.key",
                     "--tls_client_ca=/ca.pem"):
            self.assertIn(flag, server)
        self.assertNotIn("--tls_cert=/c.pem", server)
        self.assertNotIn("--bn_port=0", server)  # BN stays on the TLS stream
        self.assertNotIn("--bn_unix_socket=auto", server)
        plain, _ = self.m.parse_args([])
        self.assertIn("--bn_port=0", self.m.server_command(plain, 0))
        self.assertIn("--bn_unix_socket=auto", self.m.server_command(plain, 0))
        tcp_only, _ = self.m.parse_args(["--bn_unix=off"])
        self.assertIn("--bn_port=0", self.m.server_command(tcp_only, 0))
        self.assertNotIn("--bn_unix_socket=auto",
                         self.m.server_command(tcp_only, 0))
        worker = self.m.worker_command(args, extra, 0, ["127.0.0.1:1"], "/out")
        for flag in ("--token_file=/t", "--tls_ca=/ca.pem", "--tls_cert=/c.pem",
                     "--tls_key=/c.key"):
            self.assertIn(flag, worker)
        for flag in ("--tls_cert=/s.pem", "--tls_client_ca=/ca.pem"):
            self.assertNotIn(flag, worker)

    def test_per_worker_tokens_give_each_worker_only_its_own(self):
        args, extra = self.m.parse_args(["--token_file=/t", "--per_worker_tokens"])
        self.assertIn("--per_worker_tokens", self.m.server_command(args, 0))
        self.assertIn("--token_file=/t", self.m.server_command(args, 0))
        worker = self.m.worker_command(args, extra, 1, ["127.0.0.1:1"], "/out")
        self.assertIn("--token_file=/out/worker1.token", worker)
        self.assertNotIn("--token_file=/t", worker)
        with self.assertRaises(SystemExit):  # it needs the job token
            with open(os.devnull, "w") as devnull:
                saved, sys.stderr = sys.stderr, devnull
                try:
                    self.m.parse_args(["--per_worker_tokens"])
                finally:
                    sys.stderr = saved

    def test_a_host_bn_aggregator_serves_every_worker(self):
        args, extra = self.m.parse_args(["--workers=3", "--bn_host_aggregator",
                                         "--token_file=/t", "--per_worker_tokens"])
        cmd = self.m.host_bn_command(args)
        self.assertTrue(cmd[0].endswith("hostbn/bnps_host_bn"))
        for flag in ("--host=127.0.0.1", "--port=0", "--workers=3",
                     "--shards=127.0.0.1", "--token_file=/t",
                     "--per_worker_tokens", "--num_workers=3"):
            self.assertIn(flag, cmd)
        args.host_bn_address = "127.0.0.1:7200"
        worker = self.m.worker_command(args, extra, 1, ["127.0.0.1:1"], "/out")
        self.assertIn("--bn_host_aggregator=127.0.0.1:7200", worker)
        plain, plain_extra = self.m.parse_args([])
        self.assertFalse(any(f.startswith("--bn_host_aggregator")
                             for f in self.m.worker_command(
                                 plain, plain_extra, 0, ["127.0.0.1:1"], "/out")))
        tls, _ = self.m.parse_args(["--server_tls_cert=/s.pem",
                                    "--server_tls_key=/s.key"])
        tls.bn_host_aggregator = True
        with self.assertRaises(self.m.UsageError) as e:
            self.m.check_args(tls, [])
        self.assertIn("TLS", str(e.exception))

    def test_live_console_keeps_progress_on_one_line(self):
        out = io.StringIO()
        c = self.m.Console(out, live=True)
        c.status("[w0] step 1")
        c.line("[s0] hello")
        c.status("[w0] step 2")
        c.end_status()
        c.line("done")
        self.assertEqual(out.getvalue(),
                         "\r\x1b[K[w0] step 1" "\r\x1b[K[s0] hello\n[w0] step 1"
                         "\r\x1b[K[w0] step 2" "\n" "done\n")

    def test_plain_console_scrolls(self):
        out = io.StringIO()
        c = self.m.Console(out, live=False)
        c.status("[w0] step 1")
        c.line("[s0] hello")
        c.end_status()
        self.assertEqual(out.getvalue(), "[w0] step 1\n[s0] hello\n")

    def test_table_and_result_line_without_accuracy(self):
        reports = [{"worker": 0, "steps": 3, "train_loss_first": 1.0, "train_loss_last": 0.5,
                    "test_accuracy": None, "images_per_second": 10.0,
                    "seconds": {"total": 1.0, "compute": 0.5, "bn_sync": 0.25,
                                "grad_sync": 0.25}}]
        lines = self.m.summary_table(reports)
        self.assertEqual(lines[1].split(), ["w0", "3", "1.0000", "0.5000", "-", "10.0",
                                            "1.00", "0.50", "0.25", "0.25"])
        args, _ = self.m.parse_args(["--workers=1", "--servers=1"])
        self.assertEqual(self.m.result_line(args, reports, 2.0),
                         "result: policy=sync workers=1 servers=1 test_accuracy=none wall_s=2.0")


if __name__ == "__main__":
    unittest.main()
