"""bnps.torch.SyncBatchNorm inside the ways PyTorch code trains, each with
the layers waiting for the device and with the exchanges queued on the
stream, against torch.nn.BatchNorm2d in a one-worker sync job (where the
merged statistics are the worker's own, so the two agree to rounding):

- activation checkpointing (torch.utils.checkpoint, reentrant and not),
  whose recomputed forward pass exchanges again, as torch's layer updates
  its running statistics again;
- a first training-mode pass under torch.inference_mode, then training
  (the layer's host buffers are made there and written later);
- gradient accumulation (several backward passes before a step);
- a copy of the model (copy.deepcopy: an EMA teacher) that trains beside
  it: it shares the connection, and is refused until its layers have names
  of their own;
- a GradScaler whose scale is too large (torch >= 2.3 on the CPU): its
  steps are skipped, nothing fails, and the model trains once the scale
  has come down.

Float64 on the CPU (the generic path, which queues), float32 for the
GradScaler (the native step). Real bnps_server on 127.0.0.1."""

import gc
import os
import pickle
import sys
import unittest
from copy import deepcopy

sys.path.insert(0, os.path.join(os.getcwd(), "python"))  # Bazel runfiles
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                             "python"))  # run from a checkout: torch_or_debian.py
import torch_or_debian  # noqa: F401,E402  (first: torch, or Debian's python3)
import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.utils import checkpoint  # noqa: E402

import bnps.torch  # noqa: E402
from one_worker_job import OneWorkerJob  # noqa: E402

F64 = dict(rtol=1e-9, atol=1e-9)


def block(dtype):
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                               torch.nn.ReLU()).to(dtype)


class TrainingPatternsTest(OneWorkerJob):
    CONNECT = dict(set_default=False)
    made = 0  # models made: each one's layers get names of their own

    def pair(self, dtype=torch.float64):
        """(bnps model, torch model) with the same parameters; the bnps one
        with layer names of its own in the job."""
        torch.manual_seed(self.made)
        ref = block(dtype)
        ours = block(dtype)
        ours.load_state_dict(ref.state_dict())
        type(self).made += 1
        return bnps.torch.convert_sync_batchnorm(
            ours, prefix=f"m{self.made}",
            connection=self.connection), ref

    def both_ways(self, check):
        for queued in (False, True):
            with self.subTest(queued=queued):
                self.connection.stream_exchange = queued
                try:
                    check()
                    self.connection.drain_exchanges()
                finally:
                    self.connection.stream_exchange = None

    def assert_same(self, ours, ref):
        for (name, a), b in zip(ours.state_dict().items(),
                                ref.state_dict().values()):
            torch.testing.assert_close(a, b, **F64, msg=name)
        for (name, a), b in zip(ours.named_parameters(), ref.parameters()):
            torch.testing.assert_close(a.grad, b.grad, **F64, msg=name)

    def test_activation_checkpointing(self):
        def check():
            ours, ref = self.pair()
            x = torch.randn(4, 3, 6, 6, dtype=torch.float64)
            for reentrant in (False, True):
                for model in (ours, ref):
                    xi = x.clone().requires_grad_()
                    checkpoint.checkpoint(model, xi, use_reentrant=reentrant
                                          ).sum().backward()
            self.assert_same(ours, ref)
        self.both_ways(check)

    def test_a_first_pass_under_inference_mode(self):
        def check():
            ours, ref = self.pair()
            with torch.inference_mode():
                for model in (ours, ref):
                    model(torch.ones(2, 3, 6, 6, dtype=torch.float64))
            x = torch.randn(4, 3, 6, 6, dtype=torch.float64)
            for model in (ours, ref):
                model(x).sum().backward()
            self.assert_same(ours, ref)
        self.both_ways(check)

    def test_gradient_accumulation(self):
        def check():
            ours, ref = self.pair()
            for i in range(3):
                x = torch.randn(4, 3, 6, 6, dtype=torch.float64) * (i + 1)
                for model in (ours, ref):
                    model(x).pow(2).sum().backward()
            self.assert_same(ours, ref)
        self.both_ways(check)

    def test_a_copy_trains_only_under_names_of_its_own(self):
        # A model's copy (an EMA teacher, SWA's update_bn) keeps its layers'
        # names: training both under one name would give the copy the
        # original's statistics, so it is refused, saying what to do.
        ours, _ = self.pair()
        x = torch.randn(4, 3, 6, 6, dtype=torch.float64)
        ours(x).sum().backward()
        copy = deepcopy(ours)
        self.assertIs(copy[1].connection, self.connection)  # shared
        with self.assertRaisesRegex(TypeError, "state_dict"):
            pickle.dumps(ours)
        with torch.no_grad():
            copy.eval()(x)  # eval exchanges nothing: allowed
            copy.train()
            with self.assertRaisesRegex(RuntimeError,
                                        "two layers named .* rename=True"):
                copy(x)
        bnps.torch.name_layers(copy, prefix="copy.", rename=True)
        self.assertEqual(copy[1].bnps_name, "copy.1")
        self.assertEqual(copy[1]._bnps_step, 0)
        copy(x).sum().backward()
        ours(x).sum().backward()  # both train on, each under its names
        name = ours[1].bnps_name
        del ours
        gc.collect()
        # The name is free once its layer is gone.
        other = bnps.torch.SyncBatchNorm(4, name=name,
                                         connection=self.connection).double()
        other(torch.randn(4, 4, 2, 2, dtype=torch.float64))

    @unittest.skipUnless(hasattr(torch, "amp") and
                         hasattr(torch.amp, "GradScaler"),
                         "torch.amp.GradScaler for the CPU: torch >= 2.3")
    def test_a_grad_scaler_skips_the_steps_that_overflow(self):
        def check():
            # Float32 (the native step on the CPU), whose range a scaled
            # gradient can leave.
            ours, ref = self.pair(torch.float32)
            x = torch.randn(8, 3, 6, 6)
            losses = {}
            for name, model in (("ours", ours), ("ref", ref)):
                opt = torch.optim.SGD(model.parameters(), lr=0.01)
                # 2**126: every gradient overflows float32's range until
                # the scale has halved about 100 times.
                scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 126,
                                              growth_interval=10 ** 6)
                losses[name] = []
                for _ in range(4):
                    opt.zero_grad()
                    loss = (model(x) * 1e3).pow(2).mean()
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
                    losses[name].append(loss.item())
                losses[name].append(scaler.get_scale())
            # Every step skipped (the loss never moved), the scale down to
            # 2**122 for both, and the same losses.
            self.assertEqual(len(set(losses["ours"][:4])), 1)
            self.assertEqual(losses["ours"][4], 2.0 ** 122)
            torch.testing.assert_close(losses["ours"], losses["ref"])
        self.both_ways(check)


if __name__ == "__main__":
    unittest.main()
