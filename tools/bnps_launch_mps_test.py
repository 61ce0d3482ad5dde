#!/usr/bin/env python3
"""Tests of tools/bnps_launch_mps.py: the launcher's MPS decisions and its
daemon's start and stop, against a fake machine (no GPU is needed: the fake
answers nvidia-smi and nvidia-cuda-mps-control as the real ones do).

Run: python3 tools/bnps_launch_mps_test.py  or  bazel test //tools:bnps_launch_mps_test
"""

import os
import sys
import shutil
import tempfile
import weakref
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bnps_launch_mps as mps  # noqa: E402

SMI_2 = ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa)\n"
         "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-bbbb)\n")


class FakeMachine(mps.System):
    """nvidia-smi with `smi` output, an MPS control program that starts a
    daemon (its control pipe appears in the pipe folder) unless
    `start_fails`, and answers and quits like the real one."""

    def __init__(self, smi=SMI_2, control=True, environ=None, start_fails=False,
                 daemon_dirs=()):
        super().__init__(dict(environ or {}, PATH="/fake/bin"))
        self.smi = smi
        self.control = control
        self.start_fails = start_fails
        self.files = set(os.path.join(d, "control") for d in daemon_dirs)
        self.calls = []
        self.tmp = tempfile.mkdtemp(prefix="bnps-mps-test-")
        # Its folder goes with it (the fake only records removals).
        weakref.finalize(self, shutil.rmtree, self.tmp, True)
        self.removed = []

    def which(self, name):
        if name == "nvidia-smi":
            return "/fake/bin/nvidia-smi" if self.smi is not None else None
        if name == mps.CONTROL:
            return "/fake/bin/" + name if self.control else None
        return None

    def run(self, cmd, stdin_text=None, env=None, timeout=30):
        env = self.environ if env is None else env
        self.calls.append((cmd, stdin_text, env.get("CUDA_MPS_PIPE_DIRECTORY")))
        if cmd == ["nvidia-smi", "-L"]:
            return 0, self.smi
        control = os.path.join(mps.pipe_dir(env), "control")
        if cmd == [mps.CONTROL, "-d"]:
            if self.start_fails:
                return 1, "An instance of this daemon is already running"
            self.files.add(control)
            return 0, ""
        if cmd == [mps.CONTROL]:
            if control not in self.files:
                return 1, "Cannot find MPS control daemon process"
            if stdin_text == "quit\n":
                self.files.discard(control)
            return 0, ""
        raise AssertionError("unexpected command %r" % (cmd,))

    def exists(self, path):
        return path in self.files

    def make_dir(self):
        return tempfile.mkdtemp(dir=self.tmp)

    def remove_dir(self, path):
        self.removed.append(path)

    def sleep(self, seconds):
        pass


class VisibleGpusTest(unittest.TestCase):
    def test_counts_nvidia_smi_lines(self):
        self.assertEqual(mps.visible_gpus(FakeMachine())[0], 2)

    def test_no_driver_means_no_gpu(self):
        count, why = mps.visible_gpus(FakeMachine(smi=None))
        self.assertEqual(count, 0)
        self.assertIn("nvidia-smi", why)

    def test_cuda_visible_devices_narrows_or_hides(self):
        for visible, want in (("1", 1), ("0,1", 2), ("0,1,2,3", 2), ("", 0),
                              ("-1", 0), ("0,-1,1", 1)):
            m = FakeMachine(environ={"CUDA_VISIBLE_DEVICES": visible})
            count, why = mps.visible_gpus(m)
            self.assertEqual(count, want, visible)
            if want == 0:
                self.assertIn("hides every GPU", why)


class PlanTest(unittest.TestCase):
    def test_cpu_workers_and_machines_without_gpus_need_nothing(self):
        self.assertEqual(mps.plan("auto", "cpu", 8, FakeMachine()).action, "none")
        self.assertEqual(mps.plan("auto", "auto", 8, FakeMachine(smi=None)).action, "none")
        self.assertEqual(mps.plan("off", "gpu", 8, FakeMachine(smi="")).action, "none")

    def test_one_gpu_per_worker_needs_no_mps(self):
        p = mps.plan("on", "gpu", 2, FakeMachine())
        self.assertEqual(p.action, "none")
        self.assertIn("one GPU each", p.message)

    def test_sharing_starts_a_daemon(self):
        p = mps.plan("auto", "auto", 4, FakeMachine())
        self.assertEqual(p.action, "start")
        self.assertIn("4 workers share 2 GPUs visible", p.message)

    def test_a_running_daemon_is_used(self):
        m = FakeMachine(daemon_dirs=[mps.DEFAULT_PIPE_DIR])
        p = mps.plan("auto", "gpu", 4, m)
        self.assertEqual(p.action, "use")
        self.assertIn(mps.DEFAULT_PIPE_DIR, p.message)
        m = FakeMachine(environ={"CUDA_MPS_PIPE_DIRECTORY": "/run/mine"},
                        daemon_dirs=["/run/mine"])
        self.assertEqual(mps.plan("auto", "gpu", 4, m).action, "use")

    def test_a_stale_pipe_without_a_daemon_is_not_a_daemon(self):
        m = FakeMachine(daemon_dirs=[mps.DEFAULT_PIPE_DIR])
        m.files.clear()
        self.assertEqual(mps.plan("auto", "gpu", 4, m).action, "start")

    def test_off_says_what_sharing_costs(self):
        p = mps.plan("off", "gpu", 3, FakeMachine(smi="GPU 0: X\n"))
        self.assertEqual(p.action, "without")
        self.assertIn("3 workers share 1 GPU", p.message)
        self.assertIn("time-slicing", p.message)

    def test_without_the_control_program(self):
        p = mps.plan("auto", "gpu", 4, FakeMachine(control=False))
        self.assertEqual(p.action, "without")
        self.assertIn("not on PATH", p.message)
        self.assertIn("--workers=2", p.message)
        with self.assertRaisesRegex(mps.MpsError, "--mps=on but nvidia-cuda-mps-control"):
            mps.plan("on", "gpu", 4, FakeMachine(control=False))
        with self.assertRaisesRegex(mps.MpsError, "no GPU is usable"):
            mps.plan("on", "gpu", 4, FakeMachine(smi=None))


class SetupTest(unittest.TestCase):
    def test_daemon_of_its_own_started_and_stopped(self):
        m = FakeMachine()
        said = []
        daemon, env = mps.setup("auto", "gpu", 4, m, said.append)
        self.assertIsNotNone(daemon)
        pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
        self.assertTrue(pipe.startswith(m.tmp))
        self.assertTrue(env["CUDA_MPS_LOG_DIRECTORY"].startswith(m.tmp))
        self.assertNotEqual(pipe, mps.DEFAULT_PIPE_DIR)
        self.assertTrue(mps.daemon_running(m, dict(m.environ, **env)))
        self.assertEqual(len(said), 2, said)
        self.assertIn("starting an MPS daemon", said[0])
        self.assertIn("MPS daemon running", said[1])
        # The default folder was never asked to start anything.
        self.assertIn(([mps.CONTROL, "-d"], None, pipe), m.calls)
        self.assertIsNone(daemon.stop())
        self.assertFalse(mps.daemon_running(m, dict(m.environ, **env)))
        self.assertIn(([mps.CONTROL], "quit\n", pipe), m.calls)
        self.assertEqual(len(m.removed), 1)

    def test_a_running_daemon_is_left_alone(self):
        m = FakeMachine(daemon_dirs=[mps.DEFAULT_PIPE_DIR])
        daemon, env = mps.setup("on", "gpu", 4, m, lambda line: None)
        self.assertIsNone(daemon)
        self.assertEqual(env, {})
        self.assertFalse(any(c[0] == [mps.CONTROL, "-d"] for c in m.calls))

    def test_a_failed_start_warns_or_fails(self):
        said = []
        daemon, env = mps.setup("auto", "gpu", 4, FakeMachine(start_fails=True),
                                said.append)
        self.assertIsNone(daemon)
        self.assertEqual(env, {})
        self.assertIn("already running", said[-1])
        self.assertIn("time-slicing", said[-1])
        with self.assertRaisesRegex(mps.MpsError, "did not start"):
            mps.setup("on", "gpu", 4, FakeMachine(start_fails=True), said.append)

    def test_nothing_for_cpu_workers(self):
        m = FakeMachine()
        said = []
        self.assertEqual(mps.setup("auto", "cpu", 4, m, said.append), (None, {}))
        self.assertEqual(said, [])
        self.assertEqual(m.calls, [])


class WorkerDeviceTest(unittest.TestCase):
    def test_last_device_flag_wins(self):
        self.assertEqual(mps.worker_device([]), "auto")
        self.assertEqual(mps.worker_device(["--epochs=1", "--device=gpu"]), "gpu")
        self.assertEqual(mps.worker_device(["--device=gpu", "--device=cpu"]), "cpu")


if __name__ == "__main__":
    unittest.main()
