"""The C ABI's layer exchanges and stream-ordered exchange queue without
servers (bnps._native: layer_exchange_forward / _backward, StreamQueue),
under the local policy, where no client is needed: the exchange-alone calls
normalize locally and update the running statistics, refuse bad moments and
a missing client, and give dx's map; the queue's jobs, run inline on the
CPU, match them, fall back and raise on failure, and refuse bad calls.
Needs torch (tools/setup.sh installs python3-torch); fails without it."""

import ctypes
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.getcwd(), "python"))  # Bazel runfiles

import torch_or_debian  # noqa: F401,E402  (first: torch, or Debian's python3)
import torch  # noqa: E402
import numpy as np  # noqa: E402
from torch import nn  # noqa: E402

import bnps  # noqa: E402
from bnps import _native  # noqa: E402


class ExchangeAloneTest(unittest.TestCase):
    """The layer steps' worker side without kernels (the generic path's
    native calls), under local, where no client is needed."""

    @staticmethod
    def forward(rule, count, mean, m2, momentum, rm, rv, tracked):
        stats = np.empty((2, len(mean)))
        info = np.zeros(3, dtype=np.int64)
        _native.layer_exchange_forward(
            rule, None, "l", 0, count, mean.ctypes.data, m2.ctypes.data,
            len(mean), momentum, None if rm is None else rm.ctypes.data,
            None if rv is None else rv.ctypes.data,
            None if tracked is None else tracked.ctypes.data,
            stats.ctypes.data, info.ctypes.data)
        return stats, info

    def test_forward_normalizes_locally_and_updates_running(self):
        rule = _native.WorkerBn("local", 0.1)
        mean, m2 = np.array([1.0, -2.0]), np.array([8.0, 2.0])
        rm, rv = np.array([0.5, 0.5]), np.array([2.0, 1.0])
        tracked = np.array([3], dtype=np.int64)
        want = _native.update_running(4, mean, m2, 0.1, 3, rm, rv)
        stats, info = self.forward(rule, 4, mean, m2, 0.1, rm, rv, tracked)
        np.testing.assert_array_equal(stats, [mean, m2 / 4])
        self.assertEqual(list(info), [4, 0, 0])  # nothing sent, no sync
        self.assertEqual(int(tracked[0]), want[0])
        np.testing.assert_array_equal(rm, want[1])
        np.testing.assert_array_equal(rv, want[2])
        # Untracked: no running statistics given or changed.
        stats, _ = self.forward(rule, 4, mean, m2, 0.1, None, None, None)
        np.testing.assert_array_equal(stats[0], mean)

    def test_forward_refuses_bad_moments_and_a_missing_client(self):
        local = _native.WorkerBn("local", 0.1)
        with self.assertRaisesRegex(ValueError, "m2"):
            self.forward(local, 4, np.array([0.0]), np.array([-1.0]), 0.1,
                         None, None, None)
        with self.assertRaisesRegex(ValueError, "no client"):
            self.forward(_native.WorkerBn("sync", 0.1), 4, np.array([0.0]),
                         np.array([1.0]), 0.1, None, None, None)

    def test_backward_gives_the_map_of_dx(self):
        # dx = k1 dy + k2 x + k3 against torch's batch norm backward.
        torch.manual_seed(3)
        x = torch.randn(5, 3, 4, dtype=torch.float64, requires_grad=True)
        w = torch.tensor([0.5, 1.5, 2.0], dtype=torch.float64)
        dy = torch.randn_like(x)
        eps = 1e-5
        nn.functional.batch_norm(x, None, None, w, None, True, 0.0,
                                 eps).backward(dy)
        xd = x.detach()
        mean = xd.mean(dim=(0, 2))
        var = xd.var(dim=(0, 2), unbiased=False)
        xhat = (xd - mean.view(1, 3, 1)) / torch.sqrt(var.view(1, 3, 1) + eps)
        sum_dy = dy.sum(dim=(0, 2)).numpy()
        sum_dy_xhat = (dy * xhat).sum(dim=(0, 2)).numpy()
        stats = torch.stack([mean, var]).numpy()
        weight = w.numpy()
        k = np.empty((3, 3))
        _native.layer_exchange_backward(
            None, "", 0, sum_dy.ctypes.data, sum_dy_xhat.ctypes.data, 3, 20,
            stats.ctypes.data, weight.ctypes.data, eps, k.ctypes.data)
        dx = (k[0].reshape(1, 3, 1) * dy.numpy() +
              k[1].reshape(1, 3, 1) * xd.numpy() + k[2].reshape(1, 3, 1))
        np.testing.assert_allclose(dx, x.grad.numpy(), rtol=1e-10,
                                   atol=1e-12)
        with self.assertRaisesRegex(ValueError, "client"):  # sync, no client
            _native.layer_exchange_backward(
                None, "l", 0, sum_dy.ctypes.data, sum_dy_xhat.ctypes.data, 3,
                20, stats.ctypes.data, None, eps, None)


class StreamQueueTest(unittest.TestCase):
    """The stream-ordered exchanges' native side (bnps_stream_queue_*) with
    jobs run inline, under local (no client needed)."""

    @staticmethod
    def typed(a):
        return a.ctypes.data, a.itemsize

    def test_forward_and_backward_jobs_match_the_exchange_alone(self):
        q = _native.StreamQueue(on_cuda=False)
        rule = _native.WorkerBn("local", 0.1)
        mean, var, eps = np.array([1.0, -2.0]), np.array([2.0, 0.5]), 1e-5
        local = np.concatenate([mean, var])
        rm, rv = np.array([0.5, 0.5]), np.array([2.0, 1.0])
        tracked = np.array([3], dtype=np.int64)
        want = _native.update_running(4, mean, var * 4, 0.1, 3, rm, rv)
        rows = np.full(6, np.nan, dtype=np.float32)
        running = np.full(4, np.nan)
        tracked_out = np.zeros(1, dtype=np.int64)
        outcome, exchanged, global_backward = q.forward(
            None, rule, None, "l", 0, 4, self.typed(local), 2, eps, 0.1,
            rm.ctypes.data, rv.ctypes.data, tracked.ctypes.data,
            self.typed(rows), self.typed(running), tracked_out.ctypes.data)
        self.assertEqual((exchanged, global_backward), (False, False))
        want_rows = np.concatenate([mean, var, 1 / np.sqrt(var + eps)])
        np.testing.assert_array_equal(rows, want_rows.astype(np.float32))
        np.testing.assert_array_equal(running, np.concatenate(want[1:]))
        self.assertEqual(tracked_out[0], want[0])
        np.testing.assert_array_equal(rm, want[1])  # the host copy too
        # The backward job's map is the exchange-alone call's, from float32
        # sums into a float64 k.
        sums = np.array([0.3, -1.0, 2.0, 0.25, 1.5, 0.5], dtype=np.float32)
        k = np.empty(6)
        q.backward(None, None, "", 0, self.typed(sums), True, 2, outcome,
                   eps, self.typed(k))
        s64 = sums.astype(np.float64)
        want_k = np.empty(6)
        _native.layer_exchange_backward(
            None, "", 0, s64[:2].ctypes.data, s64[2:4].ctypes.data, 2, 4,
            local.ctypes.data, s64[4:].ctypes.data, eps, want_k.ctypes.data)
        np.testing.assert_array_equal(k, want_k)
        self.assertEqual(q.counts(), (0, 2, 0))
        q.drain(1.0)

    def test_a_failed_job_falls_back_and_the_next_call_raises(self):
        q = _native.StreamQueue(on_cuda=False)
        rule = _native.WorkerBn("local", 0.1)
        bad = np.array([0.0, -1.0])  # a negative variance: the job fails
        rows = np.full(3, np.nan)
        q.forward(None, rule, None, "l", 0, 4, self.typed(bad), 1, 0.0, 0.1,
                  None, None, None, self.typed(rows), None, None)
        np.testing.assert_array_equal(rows[:2], bad)  # the fallback: local
        self.assertEqual(q.counts(), (0, 1, 1))
        with self.assertRaisesRegex(ValueError, "m2"):
            q.drain(1.0)
        good = np.array([0.0, 1.0])
        with self.assertRaisesRegex(ValueError, "m2"):  # sticky
            q.forward(None, rule, None, "l", 1, 4, self.typed(good), 1, 0.0,
                      0.1, None, None, None, self.typed(rows), None, None)

    def test_refusals_at_queueing_time(self):
        q = _native.StreamQueue(on_cuda=False)
        local = np.array([0.0, 1.0])
        rows = np.empty(3)
        rm, rv = np.zeros(1), np.ones(1)
        tracked, out = np.zeros(1, dtype=np.int64), np.zeros(1, np.int64)
        with self.assertRaisesRegex(ValueError, "no client"):
            q.forward(None, _native.WorkerBn("sync", 0.1), None, "l", 0, 4,
                      self.typed(local), 1, 1e-5, 0.1, None, None, None,
                      self.typed(rows), None, None)
        with self.assertRaisesRegex(ValueError, "momentum"):
            q.forward(None, _native.WorkerBn("async", 0.1), None, "l", 0, 4,
                      self.typed(local), 1, 1e-5, 0.5, rm.ctypes.data,
                      rv.ctypes.data, tracked.ctypes.data, self.typed(rows),
                      self.typed(rm), out.ctypes.data)
        with self.assertRaisesRegex(ValueError, "float32"):
            half = local.astype(np.float16)
            q.forward(None, _native.WorkerBn("local", 0.1), None, "l", 0, 4,
                      self.typed(half), 1, 1e-5, 0.1, None, None, None,
                      self.typed(rows), None, None)
        with self.assertRaisesRegex(ValueError, "somewhere to write"):
            q.forward(None, _native.WorkerBn("local", 0.1), None, "l", 0, 4,
                      self.typed(local), 1, 1e-5, 0.1, rm.ctypes.data,
                      rv.ctypes.data, tracked.ctypes.data, self.typed(rows),
                      None, None)
        self.assertEqual(q.counts(), (0, 0, 0))

    def test_device_pass_refusals(self):
        from bnps.torch import _device_route as D
        q = _native.StreamQueue(on_cuda=False)
        rm, rv = np.zeros(2), np.ones(2)
        tracked = np.zeros(1, dtype=np.int64)
        out = np.zeros(4, dtype=np.float32)

        def new(policy, itemsize=4, running=True, client=None):
            return D.DevicePass(
                q, _native.WorkerBn(policy, 0.1), client, "l", 2, 1e-5, 0.1,
                itemsize,
                (rm.ctypes.data, rv.ctypes.data, tracked.ctypes.data)
                if running else None,
                (out.ctypes.data, out[2:].ctypes.data, tracked.ctypes.data,
                 4) if running else None, (0, 0))
        with self.assertRaisesRegex(ValueError, "no client"):
            new("sync")
        with self.assertRaisesRegex(ValueError, "2-byte"):
            new("local", itemsize=2)
        p = new("local")
        mean = np.array([1.0, 2.0], dtype=np.float32)
        invstd = np.array([0.5, np.inf], dtype=np.float32)  # var 4 and 0
        count = np.zeros(1, dtype=np.int32)
        # A pass through the call block: what to normalize with written back
        # over the local statistics, the flags in the block, the running
        # statistics into the layer's buffers, and its refusals raised from
        # its own error buffer.
        a = _native.DeviceCall(p._h)
        a.count, a.mean, a.invstd, a.count_out = \
            8, mean.ctypes.data, invstd.ctypes.data, count.ctypes.data
        self.assertEqual(D._lib.bnps_device_call_forward(
            ctypes.addressof(a), a.err_at, D.ERR_LEN), 0)
        np.testing.assert_allclose(
            np.concatenate([mean, invstd]),
            [1.0, 2.0, 1 / np.sqrt(4 + 1e-5), 1 / np.sqrt(1e-5)], rtol=1e-6)
        self.assertEqual((count[0], a.exchanges, a.backward_exchanges,
                          a.captured), (8, 0, 0, 0))
        want = _native.update_running(8, np.array([1.0, 2.0]),
                                      np.array([32.0, 0.0]), 0.1, 0,
                                      np.zeros(2), np.ones(2))
        np.testing.assert_allclose(out, np.concatenate(want[1:]), rtol=1e-6)
        self.assertEqual(tracked[0], 1)
        a.count = 0
        code = D._lib.bnps_device_call_forward(ctypes.addressof(a),
                                               a.err_at, D.ERR_LEN)
        with self.assertRaisesRegex(ValueError, "0 samples per channel"):
            raise _native.error(code, a.err)
        self.assertEqual(D._lib.bnps_device_call_backward(
            ctypes.addressof(a), a.err_at, D.ERR_LEN), 0)  # local: nothing

    def test_on_cuda_without_a_driver_says_why(self):
        if torch.cuda.is_available():
            self.skipTest("this machine has a CUDA driver")
        with self.assertRaisesRegex(bnps.BnpsError, "libcuda.so.1"):
            _native.StreamQueue(on_cuda=True)


if __name__ == "__main__":
    unittest.main()
