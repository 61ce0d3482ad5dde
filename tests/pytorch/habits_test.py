"""Three habits PyTorch code relies on, held by bnps.torch:

- a layer in eval() never talks to the servers, under every policy (sync,
  async, local, recal): after a training step the job's server is stopped,
  and the evaluated model, and a training model whose only BatchNorm is
  frozen (eval() inside a train() model), still run and give torch's
  eval-mode result from the layer's running statistics;
- convert_sync_batchnorm keeps each layer's training flag, its parameters'
  requires_grad (the same Parameter objects), its device and its dtype, so
  a frozen layer stays frozen;
- `with connection.step():` around each iteration waits only where the
  job's gradient mode says so (the C ABI's rule): under async gradients
  (staleness 0) worker 0 may not begin step 1 until worker 1 finished step
  0; under sync gradients it begins at once.

Real bnps_server on 127.0.0.1, one worker; float64 on the CPU (and CUDA's
device check where a GPU is present)."""

import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.getcwd(), "python"))  # Bazel runfiles
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                             "python"))  # run from a checkout: torch_or_debian.py
import torch_or_debian  # noqa: F401,E402  (first: torch, or Debian's python3)
import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import bnps.torch  # noqa: E402
from bnps.cluster import POLICIES, LocalCluster  # noqa: E402


def model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                               torch.nn.ReLU()).double()


def torch_eval(m, x):
    """The model's output with its BatchNorm in eval mode, computed by torch
    from the layer's own running statistics."""
    conv, bn = m[0], m[1]
    y = F.batch_norm(conv(x), bn.running_mean, bn.running_var, bn.weight,
                     bn.bias, False, 0.0, bn.eps)
    return torch.relu(y)


class EvalNeverExchangesTest(unittest.TestCase):
    def test_every_policy(self):
        torch.set_num_threads(1)
        x = torch.randn(6, 3, 8, 8, dtype=torch.float64)
        for i, policy in enumerate(POLICIES):
            with self.subTest(policy=policy):
                cluster = LocalCluster(num_servers=1, num_workers=1,
                                       policy=policy).start()
                connection = None
                try:
                    connection = bnps.torch.init(
                        servers=cluster.servers, worker=0, num_workers=1,
                        set_default=False, connect_timeout_s=5.0,
                        rpc_timeout_s=5.0)
                    m = bnps.torch.convert_sync_batchnorm(
                        model(i), connection=connection)
                    m.train()
                    m(x).sum().backward()  # a training step talks to them
                    connection.drain_exchanges()
                    stats = m[1].running_mean.clone()
                    cluster.stop()  # from here, any exchange would fail
                    m.eval()
                    with torch.no_grad():
                        torch.testing.assert_close(m(x), torch_eval(m, x))
                    m.train()
                    m[1].eval()  # frozen inside a training model
                    y = m(x)
                    y.sum().backward()
                    torch.testing.assert_close(y, torch_eval(m, x))
                    torch.testing.assert_close(m[1].running_mean, stats)
                finally:
                    if connection is not None:
                        try:
                            connection.close()
                        except Exception:  # its server is gone on purpose
                            pass
                    cluster.stop()


class ConversionKeepsTest(unittest.TestCase):
    def devices(self):
        return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

    def test_training_requires_grad_device_dtype(self):
        for device in self.devices():
            for dtype in (torch.float32, torch.float64, torch.bfloat16):
                with self.subTest(device=device, dtype=dtype):
                    net = torch.nn.Sequential(
                        torch.nn.BatchNorm1d(3), torch.nn.BatchNorm2d(4),
                        torch.nn.BatchNorm3d(5, affine=False),
                        torch.nn.SyncBatchNorm(6)).to(device, dtype)
                    net.train()
                    net[1].eval()                       # frozen statistics
                    net[1].weight.requires_grad_(False)  # frozen parameters
                    net[3].bias.requires_grad_(False)
                    before = [(m.training,
                               [(p, p.requires_grad) for p in m.parameters()],
                               [b.device for b in m.buffers()],
                               [b.dtype for b in m.buffers()])
                              for m in net]
                    out = bnps.torch.convert_sync_batchnorm(
                        net, connection=object())  # never used: no forward
                    for j, (m, (training, params, devices, dtypes)) in \
                            enumerate(zip(out, before)):
                        self.assertIsInstance(m, bnps.torch.SyncBatchNorm)
                        self.assertEqual(m.training, training, j)
                        got = list(m.parameters())
                        self.assertEqual(len(got), len(params), j)
                        for p, (q, grad) in zip(got, params):
                            self.assertIs(p, q)
                            self.assertEqual(p.requires_grad, grad, j)
                            self.assertEqual(p.dtype, dtype, j)
                            self.assertEqual(p.device.type, device, j)
                        self.assertEqual([b.device for b in m.buffers()],
                                         devices, j)
                        self.assertEqual([b.dtype for b in m.buffers()],
                                         dtypes, j)
                    self.assertTrue(out.training)


class StepBracketsTest(unittest.TestCase):
    def brackets(self, policy):
        """Seconds worker 0's second step() waited for worker 1, which
        finishes its first step 0.5 s after worker 0 asks."""
        with LocalCluster(num_servers=1, num_workers=2,
                          policy=policy) as cluster:
            conns = [bnps.torch.init(servers=cluster.servers, worker=w,
                                     num_workers=2, set_default=False,
                                     connect_timeout_s=5.0, rpc_timeout_s=10.0)
                     for w in range(2)]
            try:
                with conns[0].step():
                    pass
                waited = []

                def second_step():
                    start = time.monotonic()
                    with conns[0].step():
                        waited.append(time.monotonic() - start)

                t = threading.Thread(target=second_step)
                t.start()
                time.sleep(0.5)
                with conns[1].step():
                    pass
                t.join(timeout=30)
                self.assertFalse(t.is_alive())
                return waited[0]
            finally:
                for c in conns:
                    c.close()

    def test_async_gradients_wait_for_the_bound(self):
        self.assertGreaterEqual(self.brackets("async"), 0.4)

    def test_sync_gradients_begin_at_once(self):
        self.assertLess(self.brackets("sync"), 0.4)


if __name__ == "__main__":
    unittest.main()
