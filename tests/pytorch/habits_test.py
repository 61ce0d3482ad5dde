"""Two habits PyTorch code relies on, held by bnps.torch:

- a layer in eval() never talks to the servers, under every policy (sync,
  async, local, recal): after a training step the job's server is stopped,
  and the evaluated model, and a training model whose only BatchNorm is
  frozen (eval() inside a train() model), still run and give torch's
  eval-mode result from the layer's running statistics;
- convert_sync_batchnorm keeps each layer's training flag, its parameters'
  requires_grad (the same Parameter objects), its device and its dtype, so
  a frozen layer stays frozen.

Real bnps_server on 127.0.0.1, one worker; float64 on the CPU (and CUDA's
device check where a GPU is present)."""

import os
import sys
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


if __name__ == "__main__":
    unittest.main()
