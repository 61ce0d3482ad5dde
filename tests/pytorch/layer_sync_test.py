"""bnps.layer_sync (the trainers' convert-and-back, behind bnps.lightning's
plugin) in a one-worker sync job against torch.nn.BatchNorm: a converted
model trains as torch's does; revert gives back each layer's own class
(BatchNorm1d/2d/3d) with the same Parameters and the trained statistics,
and its state_dict loads (strict) into a plain model that then computes
the same; a layer bnps made itself reverts to a BatchNorm of any
dimension; torch.nn.DataParallel is refused naming it. bnps.lightning
without Lightning installed raises ImportError saying what to install
(with Lightning installed, the plugin is a LayerSync that converts and
reverts). Float64 on the CPU; real bnps_server on 127.0.0.1."""

import importlib
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.getcwd(), "python"))  # Bazel runfiles
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                             "python"))  # run from a checkout: torch_or_debian.py
import torch_or_debian  # noqa: F401,E402  (first: torch, or Debian's python3)
import torch  # noqa: E402
from torch import nn  # noqa: E402

import bnps.torch  # noqa: E402
from bnps import layer_sync  # noqa: E402
from one_worker_job import OneWorkerJob  # noqa: E402

F64 = dict(rtol=1e-9, atol=1e-9)


def net():
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Flatten(), nn.Linear(4 * 36, 5), nn.BatchNorm1d(5)
                         ).double()


def has_lightning():
    for name in ("lightning", "pytorch_lightning"):
        try:
            importlib.import_module(name)
            return True
        except ImportError:
            pass
    return False


class LayerSyncTest(OneWorkerJob):
    CONNECT = dict(set_default=False)

    def test_train_revert_and_load_into_a_plain_model(self):
        torch.manual_seed(0)
        ref, ours = net(), net()
        ours.load_state_dict(ref.state_dict())
        ours = layer_sync.apply(ours, self.connection, prefix="ls")
        self.assertIsInstance(ours[1], bnps.torch.SyncBatchNorm)
        self.assertIsInstance(ours[5], bnps.torch.SyncBatchNorm)
        params = list(ours.parameters())
        for model in (ref, ours):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(3):
                torch.manual_seed(10 + step)
                x = torch.randn(8, 3, 8, 8, dtype=torch.float64)
                opt.zero_grad()
                model(x).square().sum().backward()
                opt.step()
        ours[5].eval()  # a frozen layer stays frozen through revert
        plain = layer_sync.revert(ours)
        self.assertIs(type(plain[1]), nn.BatchNorm2d)
        self.assertIs(type(plain[5]), nn.BatchNorm1d)
        self.assertFalse(plain[5].training)
        self.assertTrue(plain[1].training)
        for p, q in zip(plain.parameters(), params):
            self.assertIs(p, q)
        for (name, a), b in zip(plain.state_dict().items(),
                                ref.state_dict().values()):
            torch.testing.assert_close(a, b, **F64, msg=name)
        fresh = net()
        fresh.load_state_dict(plain.state_dict(), strict=True)
        fresh.eval()
        ref.eval()
        x = torch.randn(4, 3, 8, 8, dtype=torch.float64)
        torch.testing.assert_close(fresh(x), ref(x), **F64)

    def test_a_bnps_layer_of_its_own_reverts_to_any_dimension(self):
        bn = bnps.torch.SyncBatchNorm(3, connection=self.connection).double()
        with torch.no_grad():
            bn.running_mean.fill_(2.0)
        plain = layer_sync.revert(bn)
        self.assertIsInstance(plain, nn.modules.batchnorm._BatchNorm)
        self.assertNotIsInstance(plain, bnps.torch.SyncBatchNorm)
        plain.eval()
        for shape in ((2, 3), (2, 3, 4), (2, 3, 4, 4)):
            x = torch.randn(*shape, dtype=torch.float64)
            torch.testing.assert_close(
                plain(x), (x - 2.0) / (1.0 + bn.eps) ** 0.5, **F64)

    def test_mixed_device_types_are_refused_naming_each_rank(self):
        layer_sync.check_same_device_type("cpu", lambda t: [t, t])
        with self.assertRaises(ValueError) as e:
            layer_sync.check_same_device_type("cpu", lambda t: [t, "cuda"])
        self.assertIn("rank 0: cpu, rank 1: cuda", str(e.exception))
        self.assertEqual(layer_sync.device_type(net()), "cpu")
        mixed = net()
        mixed.register_buffer("elsewhere", torch.zeros(1, device="meta"))
        with self.assertRaises(ValueError) as e:
            layer_sync.device_type(mixed)
        self.assertIn("cpu, meta", str(e.exception))

    def test_data_parallel_is_refused(self):
        with self.assertRaisesRegex(ValueError, "DataParallel"):
            layer_sync.apply(nn.DataParallel(net()), self.connection)


class LightningImportTest(unittest.TestCase):
    @unittest.skipIf(has_lightning(), "PyTorch Lightning is installed "
                     "(tools/wheel_test.sh trains with it)")
    def test_without_lightning_says_what_to_install(self):
        sys.modules.pop("bnps.lightning", None)
        with self.assertRaisesRegex(ImportError, "pip install lightning"):
            importlib.import_module("bnps.lightning")

    @unittest.skipUnless(has_lightning(), "PyTorch Lightning is not "
                         "installed (tools/wheel_test.sh installs it)")
    def test_the_plugin_is_a_layer_sync(self):
        import bnps.lightning
        plugin = bnps.lightning.BnpsSyncBatchNorm(connection=object())
        self.assertEqual(type(plugin).__mro__[1].__name__, "LayerSync")


if __name__ == "__main__":
    unittest.main()
