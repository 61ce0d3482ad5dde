"""The host work of a bnps.torch.SyncBatchNorm pass on the native CPU route
(float32 CPU input: one native call per pass), counted, not timed: native
calls, torch operations and Python function calls per forward + backward
pass against torch.nn.BatchNorm2d's, with bounds that fail if the layer's
per-pass work grows back (bench/pytorch_layer_host_cost.py times it). And
the layer's kept route (_layer_ops.NativePlan) follows every change of the
layer that decides its route: dtype, layout, momentum, name, connection,
a replica sharing its attributes."""

import contextlib
import os
import sys
import unittest
from unittest import mock

sys.path.insert(0, os.path.join(os.getcwd(), "python"))  # Bazel runfiles

import torch_or_debian  # noqa: F401,E402  (first: torch, or Debian's python3)
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import bnps.torch  # noqa: E402
from bnps import _native  # noqa: E402
from bnps.torch import _device_route  # noqa: E402
from bnps.torch import _layer_ops  # noqa: E402
from bnps.torch import _routes as R  # noqa: E402
from one_job import connect  # noqa: E402

# Bounds on the layer's own work per forward + backward pass, beyond what
# torch.nn.BatchNorm2d does for the same pass (today: 2 torch operations,
# the layer's own allocations of y, dx, dweight and dbias against
# BatchNorm2d's kernels', and 12 Python calls more; before the kept route,
# 3-4 and about 35).
EXTRA_TORCH_OPS = 2
EXTRA_PYTHON_CALLS = 16


class _CountingLib:
    """bnps._native._lib, counting the native calls made through it."""

    def __init__(self, lib):
        self._lib = lib
        self.calls = []

    def __getattr__(self, name):
        fn = getattr(self._lib, name)
        if not name.startswith("bnps_") or name == "bnps_status_name":
            return fn

        def call(*args):
            self.calls.append(name)
            return fn(*args)
        return call


def _torch_ops(step):
    """The torch operations called from Python during step(): the aten
    events under no other aten event, less autograd's own work around the
    layers (the same for every layer, and varying from run to run with
    which references the collector has freed yet): the accumulation into
    .grad, and a gradient buffer its engine allocates (a bare
    aten::empty_strided, which no Python call makes)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()

    def autograd_own(e):
        if e.name == "aten::empty_strided":
            return True
        while e is not None:
            if "AccumulateGrad" in e.name:
                return True
            e = e.cpu_parent
        return False
    return [e.name for e in prof.events() if e.name.startswith("aten::") and
            (e.cpu_parent is None or
             not e.cpu_parent.name.startswith("aten::")) and
            not autograd_own(e)]


@contextlib.contextmanager
def _routes_taken():
    """The list of the forward routes the layers take inside the block, in
    order."""
    taken = []
    real = dict(_layer_ops._FORWARD)

    def spy(route):
        def call(*a):
            taken.append(route)
            return real[route](*a)
        return call
    with mock.patch.dict(_layer_ops._FORWARD, {r: spy(r) for r in real}):
        yield taken


def _python_calls(step):
    """Python functions called during step()."""
    n = [0]

    def hook(frame, event, arg):
        if event == "call":
            n[0] += 1
    sys.setprofile(hook)
    try:
        step()
    finally:
        sys.setprofile(None)
    return n[0]


# The FUSED route's torch calls per forward + backward pass (CUDA's: the
# four fused kernels and the count the forward's native call writes, one
# allocation: 5, 7 before the native call wrote its mean and 1/std over the
# kernel's; the bound, 8).
FUSED_TORCH_CALLS = 8
# Python calls per FUSED forward + backward pass beyond torch.nn.BatchNorm2d's
# (today 11: the four kernels' stand-ins, which on CUDA are torch's own C
# functions, and the layer's dispatch, plan check and passes).
FUSED_EXTRA_PYTHON_CALLS = 12


class _OneCallKernels:
    """The four kernels as one torch call each, as on CUDA (no arithmetic:
    the values are of no use), so that the Python calls a pass makes are
    the route's own."""

    @staticmethod
    def batch_norm_stats(x, eps):
        return torch.ones(2, x.shape[1], dtype=torch.float64).unbind(0)

    @staticmethod
    def batch_norm_elemt(x, weight, bias, mean, invstd, eps):
        return torch.empty_like(x)

    @staticmethod
    def batch_norm_backward_reduce(dy, x, mean, invstd, weight, *need):
        return torch.empty(4, x.shape[1], dtype=mean.dtype).unbind(0)

    @staticmethod
    def batch_norm_backward_elemt(dy, x, mean, invstd, weight, *sums):
        return torch.empty_like(x)


class _MarkedKernels(_device_route.CpuKernels):
    """The CPU stand-in with each kernel one marked call for the profiler
    (on CUDA each is one torch call)."""


_STAND_IN = _device_route.CpuKernels
for _k in ("batch_norm_stats", "batch_norm_elemt",
           "batch_norm_backward_reduce", "batch_norm_backward_elemt"):
    def _marked(*a, _k=_k):
        # (record_function's own enter makes a tensor on torch 1.13.)
        ops = torch.ops.profiler
        h = ops._record_function_enter_new("kernel::" + _k, None)
        try:
            return getattr(_STAND_IN, _k)(*a)
        finally:
            ops._record_function_exit._RecordFunction(h)
    setattr(_MarkedKernels, _k, staticmethod(_marked))


def _route_torch_calls(step):
    """The torch calls the layer's Python makes during step(): top-level
    aten operations and the stand-in's kernels, one call each."""
    with mock.patch.object(_device_route, "CpuKernels", _MarkedKernels), \
            profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    calls = []
    for e in prof.events():
        if not (e.name.startswith("aten::") or e.name.startswith("kernel::")):
            continue
        p = e.cpu_parent
        while p is not None and not (p.name.startswith("aten::") or
                                     p.name.startswith("kernel::")):
            p = p.cpu_parent
        if p is None:
            calls.append(e.name)
    return calls


class FusedCallsTest(unittest.TestCase):
    """The FUSED route (float64 CPU input with the exchanges queued: the
    kernels' CPU stand-in around the same native calls as on CUDA) in a
    one-worker sync job: one native call per pass, the torch calls bounded,
    and no host wait per step after the first."""

    def setUp(self):
        torch.manual_seed(0)
        self.s = connect(self, "sync", stream_exchange=True)[0]
        self.x = torch.randn(4, 8, 3, 3, dtype=torch.float64,
                             requires_grad=True)
        self.dy = torch.randn(4, 8, 3, 3, dtype=torch.float64)
        self.bn = bnps.torch.SyncBatchNorm(8, name="l", connection=self.s)
        self.bn.double()

    def step(self):
        self.bn(self.x).backward(self.dy)

    def test_one_native_call_per_pass(self):
        self.step()
        self.assertIsNotNone(self.bn.__dict__.get("_bnps_device_plan"))
        counting = _CountingLib(_device_route._lib)
        with mock.patch.object(_device_route, "_lib", counting):
            for _ in range(3):
                self.step()
        self.assertEqual(counting.calls, ["bnps_device_call_forward",
                                          "bnps_device_call_backward"] * 3)
        self.assertEqual(self.bn._bnps_step, 4)
        self.assertEqual(self.bn._bnps_backward_step, 4)
        plan = self.bn.__dict__["_bnps_device_plan"]
        self.assertEqual(plan.device_pass.steps(), (4, 4))  # the jobs ran

    def test_torch_calls_per_pass(self):
        for _ in range(2):
            self.step()
        calls = _route_torch_calls(self.step)
        # (Autograd's own: the accumulation of the gradients, which
        # torch.nn.BatchNorm2d's pass makes too, and its check of a Python
        # Function's outputs.)
        own = [c for c in calls if c not in ("aten::add_", "aten::copy_",
                                             "aten::is_same_size")]
        self.assertLessEqual(len(own), FUSED_TORCH_CALLS, calls)
        self.assertEqual(sum(c.startswith("kernel::") for c in own), 4, own)
        # The count is the route's one tensor; the statistics to normalize
        # with are the kernel's outputs, overwritten.
        self.assertEqual(own.count("aten::empty"), 1, own)
        self.assertNotIn("aten::unbind", own)

    def test_python_calls_per_pass(self):
        plain = nn.BatchNorm2d(8).double()

        def plain_step():
            plain(self.x).backward(self.dy)
        with mock.patch.object(_device_route, "CpuKernels", _OneCallKernels):
            for _ in range(2):
                self.step()
                plain_step()
            ours = _python_calls(self.step)
        theirs = _python_calls(plain_step)
        self.assertLessEqual(ours, theirs + FUSED_EXTRA_PYTHON_CALLS,
                             (ours, theirs))

    def test_the_kept_plan_follows_the_layer(self):
        self.step()
        first = self.bn.__dict__["_bnps_device_plan"]
        self.s.stream_exchange = False  # waits: another route, its steps
        self.step()
        self.assertEqual(first.device_pass.steps(), (1, 1))
        self.assertEqual(self.bn._bnps_step, 2)
        self.s.stream_exchange = True  # a new plan, from the layer's steps
        self.step()
        plan = self.bn.__dict__["_bnps_device_plan"]
        self.assertIsNot(plan, first)
        self.assertEqual(plan.device_pass.steps(), (3, 3))
        self.step()  # kept now
        self.assertIs(self.bn.__dict__["_bnps_device_plan"], plan)
        self.assertEqual(plan.device_pass.steps(), (4, 4))
        with torch.no_grad():
            self.bn.running_var.fill_(2.0)  # written otherwise: read again
        self.step()
        self.assertIsNot(self.bn.__dict__["_bnps_device_plan"], plan)
        ref = nn.BatchNorm2d(8).double()
        with torch.no_grad():
            ref.running_var.fill_(2.0)
        ref(self.x)
        torch.testing.assert_close(self.bn.running_var, ref.running_var)

    def step_on(self, x):
        """(the routes a step of the layer on x took, its plan after it,
        whether the route table was asked: the plan did not hold)."""
        with _routes_taken() as taken, \
                mock.patch.object(R, "choose", wraps=R.choose) as table:
            y = self.bn(x)
        y.backward(torch.ones_like(y))
        if x.numel():
            self.ref(x.to(torch.float64))
        return taken, self.bn.__dict__.get("_bnps_device_plan"), \
            table.call_count > 0

    def test_the_plan_check_follows_every_change(self):
        self.ref = nn.BatchNorm2d(8).double()
        x = self.x.detach()
        _, plan, _ = self.step_on(x)
        self.assertEqual(self.step_on(x), ([R.FUSED], plan, False))  # kept
        waits = self.s.host_waits()["layers"]
        # Input of another layout: the table, then the same plan (what its
        # native pass was made for holds), kept for it at once.
        last = x.to(memory_format=torch.channels_last)
        self.assertEqual(self.step_on(last), ([R.FUSED], plan, True))
        self.assertEqual(self.step_on(last), ([R.FUSED], plan, False))
        self.assertEqual(self.step_on(x), ([R.FUSED], plan, True))
        self.assertEqual(self.s.host_waits()["layers"], waits)
        # Each change of the layer: a new plan, from its state then (the
        # running statistics read again: a wait).
        bn, ref = self.bn, self.ref

        def swap_storage(m):  # (no new version: the storage's address)
            m.running_mean.data = m.running_mean.data.clone() + 1

        def new_buffer(m):
            m.running_var = torch.full((8,), 3.0, dtype=torch.float64)

        def write(m):
            with torch.no_grad():
                m.num_batches_tracked.add_(5)

        def set_eps(m):
            m.eps = 1e-3

        def set_momentum(m):
            m.momentum = 0.5
        for change in (swap_storage, new_buffer, write, set_eps,
                       set_momentum):
            change(bn)
            change(ref)
            taken, got, asked = self.step_on(x)
            self.assertEqual((taken, asked), ([R.FUSED], True), change)
            self.assertIsNot(got, plan, change)
            plan = got
            self.assertEqual(self.step_on(x), ([R.FUSED], plan, False))
        self.assertEqual(self.s.host_waits()["layers"], waits + 5)
        self.s.drain_exchanges()
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            torch.testing.assert_close(getattr(bn, name), getattr(ref, name))
        # Statistics of another dtype (16-bit input: float32): a new plan.
        half = x.to(torch.bfloat16)
        taken, got, _ = self.step_on(half)
        self.assertEqual(taken, [R.FUSED])
        self.assertIsNot(got, plan)
        self.assertEqual(self.step_on(half), ([R.FUSED], got, False))
        # The fused route closed on the queue, an empty batch, the
        # connection's changes: the table's other routes.
        queue = self.s.exchange_queue(x.device)
        queue._bnps_unfused = "the test's"
        with self.assertWarnsRegex(R.Fallback, "the test's"):
            self.assertEqual(self.step_on(half)[0], [R.QUEUED])
        queue._bnps_unfused = None
        _, got, _ = self.step_on(half)  # (the steps it took: a new plan)
        self.assertEqual(self.step_on(half), ([R.FUSED], got, False))
        self.assertEqual(self.step_on(half[:0])[:2], ([R.QUEUED], got))
        _, got, _ = self.step_on(half)
        self.s.stream_exchange = False
        self.assertEqual(self.step_on(half)[0], [R.WAITING])

    def test_the_host_waits_once(self):
        self.step()
        self.assertEqual(self.s.host_waits()["layers"], 1)  # the buffers
        for _ in range(4):
            self.step()
            self.s.drain_exchanges()  # the step's boundary
        self.assertEqual(self.s.host_waits(), {"layers": 1, "drains": 0})
        self.bn.running_mean.add_(1.0)  # a change the layer did not make
        self.step()
        self.assertEqual(self.s.host_waits()["layers"], 2)


class LayerCallsTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.s = connect(self, "local")[0]
        self.x = torch.randn(4, 8, 3, 3, requires_grad=True)
        self.dy = torch.randn(4, 8, 3, 3)

    def pass_of(self, layer):
        return lambda: layer(self.x).backward(self.dy)

    def test_one_native_call_per_pass(self):
        bn = bnps.torch.SyncBatchNorm(8, name="l", connection=self.s)
        self.pass_of(bn)()
        counting = _CountingLib(_native._lib)
        with mock.patch.object(_native, "_lib", counting):
            for _ in range(3):
                self.pass_of(bn)()
        self.assertEqual(counting.calls, ["bnps_layer_pass_forward",
                                          "bnps_layer_pass_backward"] * 3)

    def test_torch_operations_per_pass(self):
        bn = bnps.torch.SyncBatchNorm(8, name="l", connection=self.s)
        plain = nn.BatchNorm2d(8)
        for layer in (bn, plain):
            for _ in range(2):  # .grad exists: both accumulate; torch's
                self.pass_of(layer)()  # first-use allocations are done
        ours, theirs = (_torch_ops(self.pass_of(m)) for m in (bn, plain))
        self.assertLessEqual(len(ours), len(theirs) + EXTRA_TORCH_OPS,
                             (ours, theirs))
        # y, dx, dweight and dbias are the only tensors the layer makes
        # (its statistics are not a tensor).
        self.assertEqual(ours.count("aten::empty_like"), 4, ours)
        self.assertNotIn("aten::empty", ours)

    def test_python_calls_per_pass(self):
        bn = bnps.torch.SyncBatchNorm(8, name="l", connection=self.s)
        plain = nn.BatchNorm2d(8)
        for layer in (bn, plain):
            for _ in range(2):
                self.pass_of(layer)()
        ours = _python_calls(self.pass_of(bn))
        theirs = _python_calls(self.pass_of(plain))
        self.assertLessEqual(ours, theirs + EXTRA_PYTHON_CALLS,
                             (ours, theirs))

    def test_the_kept_route_follows_the_layer(self):
        bn = bnps.torch.SyncBatchNorm(8, name="l", connection=self.s)
        ref = nn.BatchNorm2d(8)

        def both(x, routes):
            with _routes_taken() as taken:
                y = bn(x.clone().requires_grad_())
            self.assertEqual(taken, routes)
            y.sum().backward()
            torch.testing.assert_close(y, ref(x.to(y.dtype)).to(y.dtype),
                                       rtol=1e-4, atol=1e-4)

        x = torch.randn(4, 8, 3, 3)
        both(x, [R.NATIVE_CPU])
        plan = bn.__dict__["_bnps_plan"]
        both(x, [R.NATIVE_CPU])
        self.assertIs(bn.__dict__["_bnps_plan"], plan)  # kept
        bn.double()
        ref.double()
        both(x.double(), [R.WAITING])
        bn.float()
        ref.float()
        both(x, [R.NATIVE_CPU])
        self.assertIsNot(bn.__dict__["_bnps_plan"], plan)  # made again
        both(x.to(memory_format=torch.channels_last), [R.WAITING])
        # A new momentum and new buffers of the same dtype (a new address).
        bn.momentum = ref.momentum = 0.5
        bn.running_var = torch.ones(8) * 3
        ref.running_var = torch.ones(8) * 3
        both(x, [R.NATIVE_CPU])
        torch.testing.assert_close(bn.running_var, ref.running_var)
        torch.testing.assert_close(bn.running_mean, ref.running_mean)
        # A replica sharing the layer's attributes, its plan included
        # (nn.DataParallel's _replicate_for_data_parallel), makes a plan of
        # its own, which claims the name: refused while the layer lives.
        replica = bn._replicate_for_data_parallel()
        replica.__dict__.update(weight=bn.weight, bias=bn.bias)  # as its own
        self.assertIs(replica.__dict__["_bnps_plan"], bn.__dict__["_bnps_plan"])
        with self.assertRaisesRegex(RuntimeError, "DataParallel"):
            replica(x.clone().requires_grad_())

    def test_the_statistics_as_a_tensor(self):
        # The native forward's statistics are a ctypes array; the compiled
        # ops (custom_ops.py) read them as a tensor and hand a tensor back
        # to the backward pass, which then gives the same gradients.
        bn = bnps.torch.SyncBatchNorm(8, name="l", connection=self.s)
        x = torch.randn(4, 8, 3, 3) * 2 + 1
        with torch.no_grad():
            y, stats = _layer_ops.forward(bn, x, bn.weight, bn.bias, bn.eps,
                                          R.NATIVE_CPU)
        dims = (0, 2, 3)
        torch.testing.assert_close(stats.moments, torch.stack([
            x.double().mean(dims), x.double().var(dims, unbiased=False)]))
        dy = torch.randn_like(x)
        again = _layer_ops.Stats(stats.count, stats.moments.t().contiguous()
                                 .t(), None)  # a strided tensor, as given
        got = _layer_ops.backward(bn, x, bn.weight, dy, again, bn.eps, True)
        want = _layer_ops.backward(bn, x, bn.weight, dy, stats, bn.eps, True)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)

    def test_a_second_layer_under_a_taken_name_is_still_refused(self):
        a = bnps.torch.SyncBatchNorm(8, name="l", connection=self.s)
        b = bnps.torch.SyncBatchNorm(8, name="l", connection=self.s)
        a(self.x).sum().backward()
        a(self.x).sum().backward()  # the kept route
        with self.assertRaisesRegex(RuntimeError, "'l'"):
            b(self.x)

    def test_a_new_connection_makes_a_new_plan(self):
        bn = bnps.torch.SyncBatchNorm(8, name="l", connection=self.s)
        bn(self.x).sum().backward()
        other = connect(self, "local")[0]
        bn.connection = other
        bn._bnps_step = bn._bnps_backward_step = 0  # a new job's steps
        bn(self.x).sum().backward()
        self.assertIs(bn.__dict__["_bnps_plan"].key[0], other)


if __name__ == "__main__":
    unittest.main()
