"""bnps.torch's FUSED route (bnps/torch/_device_route.py) in a one-worker
sync job, on the CPU: a training step captured as a CUDA graph captures it
(the queue's recording stand-in: the native passes' copies and exchange
jobs recorded, then replayed) replays as new steps for the servers, with
the running statistics of as many steps; a failed exchange in a replay
surfaces at the next drain. The CUDA capture itself (torch.cuda.graph,
torch.compile(mode="reduce-overhead")) runs where a GPU is, and skips here
saying why.
Needs torch (tools/setup.sh installs python3-torch); fails without it."""

import os
import sys
import unittest
import warnings
from unittest import mock

sys.path.insert(0, os.path.join(os.getcwd(), "python"))  # Bazel runfiles

import torch_or_debian  # noqa: F401,E402  (first: torch, or Debian's python3)
import torch  # noqa: E402
from torch import nn  # noqa: E402

import bnps  # noqa: E402
import bnps.torch  # noqa: E402
from bnps.torch import _device_route as D  # noqa: E402
from bnps.torch import _layer_ops  # noqa: E402
from bnps.torch import _routes as R  # noqa: E402
from one_job import connect  # noqa: E402

C = 3


def _unavailable(*_):
    raise AssertionError("the fused route fell back")


class ReplayTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.s = connect(self, "sync", stream_exchange=True)[0]
        self.queue = D.RecordingQueue()
        self.s._queues[False] = self.queue  # the CPU's queue
        self.bn = bnps.torch.SyncBatchNorm(C, name="l",
                                           connection=self.s).double()
        self.ref = nn.BatchNorm2d(C).double()

    def forward(self, x):
        return D.forward(self.bn, x, self.bn.weight, self.bn.bias,
                         self.bn.eps, _layer_ops.worker_bn, _unavailable)

    def backward(self, x, dy, stats):
        return D.backward(self.bn, x, self.bn.weight, dy, stats, self.bn.eps,
                          True)

    def eager_step(self, x, dy):
        y, stats = self.forward(x)
        self.backward(x, dy, stats)
        self.ref(x)
        return y

    def test_each_replay_is_a_new_step_with_parity(self):
        x1, x2 = torch.randn(4, C, 3, 3).double(), \
            torch.randn(4, C, 3, 3).double() * 2 + 1
        dy = torch.randn(4, C, 3, 3).double()
        self.eager_step(x1, dy)
        self.queue.record(True)  # the capture: nothing runs
        y, stats = self.forward(x2)
        self.backward(x2, dy, stats)
        self.assertEqual(self.bn.num_batches_tracked.item(), 1)
        replays = 3
        # A replay of the graph: its kernels, then the native copies and
        # jobs recorded between them (the recording queue replays those;
        # the statistics' kernel is the test's to run again, into the same
        # tensors, which the native pass overwrites with what to normalize
        # with).
        local = D.CpuKernels.batch_norm_stats(x2, 0.0)
        for _ in range(replays):
            stats.mean.copy_(local[0])
            stats.invstd.copy_(local[1])
            self.queue.record(False, replays=1)
        self.s.drain_exchanges()
        plan = self.bn.__dict__["_bnps_device_plan"]
        self.assertTrue(plan.captured)
        self.assertEqual(plan.device_pass.steps(), (1 + replays, 1 + replays))
        for _ in range(replays):
            self.ref(x2)
        # What the kernels normalize with, the running statistics and the
        # merged sum(dy): those of the step, replayed. (The stand-in's
        # kernels ran once, at the capture, when nothing had run yet: its
        # sum(dy (x - mean)) is of no statistics.)
        var, mean = torch.var_mean(x2, dim=(0, 2, 3), unbiased=False)
        torch.testing.assert_close(stats.mean, mean)
        torch.testing.assert_close(stats.invstd,
                                   torch.rsqrt(var + self.bn.eps))
        self.assertEqual(stats.count.item(), 4 * 9)
        torch.testing.assert_close(stats.sums[0], dy.sum((0, 2, 3)))
        torch.testing.assert_close(self.bn.running_mean,
                                   self.ref.running_mean)
        torch.testing.assert_close(self.bn.running_var, self.ref.running_var)
        self.assertEqual(self.bn.num_batches_tracked.item(), 1 + replays)
        # The next eager step takes the replays' steps on (the servers
        # refuse a step below one they finished), then its own; so does a
        # pass on another route (an empty batch queues), then the layer's
        # counters are the replays' too.
        self.eager_step(x1, dy)
        self.s.drain_exchanges()
        self.assertEqual(plan.device_pass.steps(), (2 + replays, 2 + replays))
        torch.testing.assert_close(self.bn.running_mean,
                                   self.ref.running_mean)
        self.assertEqual(self.bn.num_batches_tracked.item(), 2 + replays)
        empty = torch.zeros(0, C, 3, 3).double()
        y, stats = _layer_ops.forward(self.bn, empty, self.bn.weight,
                                      self.bn.bias, self.bn.eps)
        _layer_ops.backward(self.bn, empty, self.bn.weight, empty, stats,
                            self.bn.eps, True)
        self.s.drain_exchanges()
        self.assertEqual((self.bn._bnps_step, self.bn._bnps_backward_step),
                         (3 + replays, 3 + replays))

    def test_a_failed_exchange_in_a_replay_surfaces_at_the_next_drain(self):
        x = torch.randn(4, C, 3, 3).double()
        dy = torch.randn(4, C, 3, 3).double()
        self.eager_step(x, dy)
        held = {}
        kernel = D.CpuKernels.batch_norm_stats

        def stats(x, eps):  # the local statistics, held by the test
            held["mean"], held["invstd"] = kernel(x, eps)
            return held["mean"], held["invstd"]

        self.queue.record(True)
        with mock.patch.object(D.CpuKernels, "batch_norm_stats",
                               staticmethod(stats)):
            _, s = self.forward(x)
        self.queue.record(False, replays=1)
        self.s.drain_exchanges()
        held["mean"][0] = float("nan")  # the next replay's moments are bad
        self.queue.record(False, replays=1)
        with self.assertRaisesRegex(bnps.BnpsError, "mean"):
            self.s.drain_exchanges()
        with self.assertRaisesRegex(bnps.BnpsError, "mean"):  # sticky
            self.s.drain_exchanges()


class FallbackTest(unittest.TestCase):
    def test_without_the_drivers_calls_the_queued_route_warns_once(self):
        s = connect(self, "sync", stream_exchange=True)[0]
        bn = bnps.torch.SyncBatchNorm(C, name="l", connection=s).double()
        ref = nn.BatchNorm2d(C).double()
        missing = bnps.errors.Unavailable(
            14, "UNAVAILABLE", "the CUDA driver lacks cuMemcpyDtoHAsync_v2")
        taken = []
        queued = _layer_ops._FORWARD[R.QUEUED]

        def spy(*a):
            taken.append(R.QUEUED)
            return queued(*a)

        with mock.patch.object(D, "DevicePass", side_effect=missing), \
                mock.patch.dict(_layer_ops._FORWARD, {R.QUEUED: spy}), \
                warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            for _ in range(3):
                x = torch.randn(4, C, 2, 2).double()
                torch.testing.assert_close(bn(x), ref(x))
        # The first pass fell back inside the fused route; the table sends
        # the later ones to the queued route at once.
        self.assertEqual(taken, [R.QUEUED] * 2)
        self.assertNotIn("_bnps_device_plan", bn.__dict__)
        messages = [str(w.message) for w in said]
        self.assertEqual(len(messages), 2, messages)  # the route, the layer
        self.assertTrue(all("cuMemcpyDtoHAsync_v2" in m for m in messages))
        s.drain_exchanges()


@unittest.skipUnless(torch.cuda.is_available(),
                     "no CUDA device here: the capture of a training step in "
                     "a CUDA graph runs where a GPU is (tools/gpu/run.sh)")
class CudaCaptureTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.s = connect(self, "sync")[0]  # queues on CUDA by default

    def model(self, ours=True):
        """A small model on the GPU, its BN layer bnps's (ours) or torch's
        (the reference: one worker's sync is torch's BN)."""
        torch.manual_seed(1)
        m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                          nn.BatchNorm2d(8)).cuda()
        if not ours:
            return m
        return bnps.torch.convert_sync_batchnorm(m, connection=self.s)

    def test_a_captured_step_replays_with_parity(self):
        ours, ref = self.model(), self.model(ours=False)
        x = torch.randn(8, 3, 8, 8, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # eager warm-up: the layers' plans
                ours(x).sum().backward()
                ref(x).sum().backward()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ours(x)
            out.sum().backward()
        for _ in range(3):
            graph.replay()
            want = ref(x)
            want.sum().backward()
        torch.cuda.synchronize()
        self.s.drain_exchanges()
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(ours[2].running_mean, ref[2].running_mean)
        self.assertEqual(ours[2].num_batches_tracked.item(),
                         ref[2].num_batches_tracked.item())

    def test_the_host_waits_once_per_layer(self):
        model = self.model()
        x = torch.randn(8, 3, 8, 8, device="cuda")
        for _ in range(5):
            model(x).sum().backward()
            self.s.drain_exchanges()  # the step's boundary (a wait)
        # One wait per layer: its running statistics read when its route
        # was set up; none per step after.
        self.assertEqual(self.s.host_waits()["layers"], 1)
        self.assertEqual(self.s._queues[True].counts()[2], 0)  # no fallback

    @unittest.skipUnless(hasattr(torch, "compile"), "torch < 2.0")
    def test_reduce_overhead_compiles_and_matches(self):
        ours, ref = self.model(), self.model(ours=False)
        compiled = torch.compile(ours, mode="reduce-overhead")
        x = torch.randn(8, 3, 8, 8, device="cuda")
        for _ in range(4):
            got = compiled(x)
            got.sum().backward()
            want = ref(x)
            want.sum().backward()
        self.s.drain_exchanges()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


if __name__ == "__main__":
    unittest.main()
