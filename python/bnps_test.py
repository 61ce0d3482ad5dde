"""Unit tests of the bnps package: errors, init's argument checks, an
unreachable server, local moments (16-bit input accumulated in float32),
Chan's merge, SyncBatchNorm against torch.nn.BatchNorm in a job of one
worker on a real bnps_server (one_job.py: sync, local with momentum=None,
async, recal; what reached the servers read from the client's metrics),
eval mode with no connection at all, convert_sync_batchnorm's names and
state. Needs torch (tools/setup.sh installs python3-torch); fails without
it."""

import os
import pickle
import shutil
import subprocess
import sys
import unittest
import warnings
from unittest import mock

sys.path.insert(0, os.path.join(os.getcwd(), "python"))  # Bazel runfiles

import torch_or_debian  # noqa: F401,E402  (first: torch, or Debian's python3)
import torch  # noqa: E402

from torch import nn  # noqa: E402

import bnps  # noqa: E402
from bnps import _native  # noqa: E402
import bnps.torch  # noqa: E402
from bnps import client as bnps_client  # noqa: E402
from bnps import errors  # noqa: E402
from bnps.torch import connection as bnps_connection  # noqa: E402
from one_job import connect, round_trips  # noqa: E402

F64 = dict(rtol=1e-10, atol=1e-10)


class ConfigOnlyClient:
    """What a Connection reads of a client when made (no layer runs over
    it: the layers' exchanges all go through a real one, one_job.py)."""

    def __init__(self, policy):
        self.config = {"policy": policy, "gradients": "sync",
                       "bn_momentum": 0.1, "barrier_timeout_ms": 1000}
        self.worker, self.num_workers = 0, 1
        self.closed = False

    def close(self):
        self.closed = True


class ErrorsTest(unittest.TestCase):
    def test_native_errors_become_the_package_classes(self):
        e = errors.from_native(_native.Error(4, "DEADLINE_EXCEEDED",
                                                  "workers 1 missing"))
        self.assertIsInstance(e, bnps.DeadlineExceeded)
        self.assertIsInstance(e, TimeoutError)
        self.assertEqual(e.code, 4)
        self.assertIn("workers 1 missing", str(e))
        self.assertIs(type(errors.from_native(
            _native.Error(13, "INTERNAL", "x"))), bnps.BnpsError)


class NativeTest(unittest.TestCase):
    def test_the_library_exports_only_its_c_abi(self):
        # The version script keeps gRPC, protobuf and Abseil private, so the
        # library loads beside grpcio and torch.
        nm = shutil.which("nm")
        if nm is None:
            self.skipTest("no nm")
        out = subprocess.run([nm, "-D", "--defined-only", _native._lib._name],
                             capture_output=True, text=True, check=True)
        names = [line.split()[-1] for line in out.stdout.splitlines()]
        self.assertGreater(len(names), 20)
        self.assertEqual([n for n in names
                          if not n.startswith(("bnps_", "BNPS_"))], [])

    def test_bad_arguments_are_value_errors(self):
        with self.assertRaisesRegex(ValueError, "policy"):
            _native.WorkerBn("fast", 0.1)
        with self.assertRaises(ValueError):
            _native.merge_moments(1, [0.0], [0.0], 1, [0.0, 1.0], [0.0, 0.0])


class InitTest(unittest.TestCase):
    def setUp(self):
        self.saved = {k: v for k, v in os.environ.items()
                      if k.startswith("BNPS_")}
        for k in self.saved:
            del os.environ[k]

    def tearDown(self):
        os.environ.update(self.saved)

    def test_missing_servers_or_worker_is_a_value_error(self):
        with self.assertRaisesRegex(ValueError, "BNPS_SERVERS"):
            bnps.torch.init()
        os.environ["BNPS_SERVERS"] = "127.0.0.1:1"
        with self.assertRaisesRegex(ValueError, "BNPS_WORKER"):
            bnps.torch.init()
        os.environ["BNPS_WORKER"] = "zero"
        with self.assertRaisesRegex(ValueError, "BNPS_WORKER"):
            bnps.torch.init(num_workers=1)

    def test_a_local_server_needs_a_process_group_and_no_servers(self):
        with self.assertRaisesRegex(ValueError, "both given"):
            bnps.torch.init(servers="127.0.0.1:1", worker=0, num_workers=1,
                            start_local_server=True)
        with self.assertRaisesRegex(ValueError, "no local rank"):
            bnps.torch.init(worker=0, num_workers=1, start_local_server=True)
        os.environ["LOCAL_RANK"] = "0"
        try:
            with self.assertRaisesRegex(RuntimeError, "init_process_group"):
                bnps.torch.init(worker=0, num_workers=1,
                                start_local_server=True)
        finally:
            del os.environ["LOCAL_RANK"]

    def test_the_worker_id_from_torchruns_variables_is_checked(self):
        # init() takes the id from RANK (no BNPS_WORKER), and checks it
        # against the count before connecting.
        saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE")}
        os.environ.update(RANK="1", WORLD_SIZE="2")
        try:
            with self.assertRaisesRegex(ValueError, "RANK=1"):
                bnps.torch.init(servers="127.0.0.1:1", num_workers=1)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k)
                else:
                    os.environ[k] = v

    def test_a_bn_spin_out_of_range_is_refused_before_connecting(self):
        for spin in (-2, 1000001):
            with self.assertRaisesRegex(bnps.InvalidArgument, "bn_spin_us"):
                bnps_client.Client("127.0.0.1:1", bn_spin_us=spin,
                                   connect_timeout_s=0.3)
        os.environ["BNPS_BN_SPIN_US"] = "-2"
        try:
            with self.assertRaisesRegex(bnps.InvalidArgument, "bn_spin_us"):
                bnps.torch.init(servers="127.0.0.1:1", worker=0, num_workers=1)
        finally:
            os.environ.pop("BNPS_BN_SPIN_US")

    def test_a_bad_stream_exchange_is_refused_before_connecting(self):
        os.environ["BNPS_STREAM_EXCHANGE"] = "yes"
        with self.assertRaisesRegex(ValueError, "BNPS_STREAM_EXCHANGE"):
            bnps.torch.init(servers="127.0.0.1:1", worker=0, num_workers=1)
        del os.environ["BNPS_STREAM_EXCHANGE"]
        with self.assertRaisesRegex(ValueError, "stream_exchange"):
            bnps.torch.init(servers="127.0.0.1:1", worker=0, num_workers=1,
                            stream_exchange="cuda")

    def test_exchanges_queue_on_cuda_unless_told(self):
        # The rule init's stream_exchange sets (without connecting:
        # devices as torch names them, no GPU needed).
        cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
        for value, want in ((None, (False, True)), (True, (True, True)),
                            (False, (False, False))):
            s = bnps_connection.Connection(ConfigOnlyClient("sync"),
                                           stream_exchange=value)
            self.assertEqual((s.queues_on(cpu), s.queues_on(cuda)), want,
                             value)
        self.assertIsNone(bnps_connection._flag_or_auto(" Auto"))
        self.assertIs(bnps_connection._flag_or_auto("0"), False)

    def test_without_a_driver_that_queues_cuda_layers_wait_unless_told(self):
        # As where libcuda.so.1 cannot queue host functions.
        def no_driver(on_cuda):
            if on_cuda:
                raise bnps.Unavailable(14, "UNAVAILABLE", "no CUDA driver")
            return real(on_cuda)
        real, cuda = _native.StreamQueue, torch.device("cuda", 0)
        with mock.patch.object(_native, "StreamQueue", no_driver):
            auto = bnps_connection.Connection(ConfigOnlyClient("sync"))
            with self.assertWarnsRegex(UserWarning, "no CUDA driver"):
                self.assertIsNone(auto.exchange_queue(cuda))
            self.assertFalse(auto.queues_on(cuda))
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # once only
                self.assertIsNone(auto.exchange_queue(cuda))
            auto.drain_exchanges()  # nothing to drain
            self.assertIsNotNone(auto.exchange_queue(torch.device("cpu")))
            asked = bnps_connection.Connection(ConfigOnlyClient("sync"),
                                               stream_exchange=True)
            with self.assertRaisesRegex(bnps.Unavailable, "no CUDA driver"):
                asked.exchange_queue(cuda)

    def test_unreachable_server_is_unavailable_naming_it(self):
        os.environ["BNPS_CONNECT_TIMEOUT_S"] = "0.3"
        with self.assertRaises(bnps.Unavailable) as cm:
            bnps.torch.init(servers="127.0.0.1:1", worker=0, num_workers=1)
        self.assertIn("127.0.0.1:1", str(cm.exception))
        self.assertIsInstance(cm.exception, ConnectionError)


class KeepAwakeRuleTest(unittest.TestCase):
    def test_servers_keep_awake_only_where_cores_suffice(self):
        from bnps import cluster
        cores = cluster._usable_cores()
        self.assertEqual(cluster.keep_awake_flags(1, cores - 1),
                         ["--keep_awake_us=%d" % cluster.KEEP_AWAKE_US])
        self.assertEqual(cluster.keep_awake_flags(1, cores), [])
        self.assertEqual(cluster.keep_awake_flags(1, 1, keep_awake_us=0), [])
        self.assertEqual(cluster.keep_awake_flags(1, cores * 4, keep_awake_us=500),
                         ["--keep_awake_us=500"])
        self.assertEqual(cluster.keep_awake_flags(
            1, 1, flags=["--keep_awake_us=7"]), [])  # the caller's wins


class MomentsTest(unittest.TestCase):
    def test_moments_match_float64(self):
        x = torch.randn(6, 3, 4, 5, dtype=torch.float64) * 2 + 7
        count, mean, m2 = bnps.torch.local_moments(x)
        self.assertEqual(count, 6 * 4 * 5)
        torch.testing.assert_close(mean, x.mean(dim=(0, 2, 3)), **F64)
        torch.testing.assert_close(
            m2, x.var(dim=(0, 2, 3), unbiased=False) * count, **F64)

    def test_half_input_is_accumulated_in_float32(self):
        # A half-precision sum of these would overflow (max 65504).
        x = (torch.randn(64, 2, 16, 16) + 100).half()
        count, mean, m2 = bnps.torch.local_moments(x)
        ref = x.double()
        torch.testing.assert_close(mean, ref.mean(dim=(0, 2, 3)),
                                   rtol=1e-6, atol=1e-5)
        torch.testing.assert_close(
            m2 / count, ref.var(dim=(0, 2, 3), unbiased=False),
            rtol=1e-3, atol=1e-3)

    def test_moments_are_a_copy_of_their_own(self):
        # On the CPU as through a GPU's pinned buffer: later calls do not
        # change what an earlier one returned.
        staging = bnps.torch.staging.Staging()
        x = torch.randn(6, 3, 4, dtype=torch.float64)
        _, mean, m2 = bnps.torch.local_moments(x, staging)
        before = (mean.clone(), m2.clone())
        bnps.torch.local_moments(x * 5 + 1, staging)
        x.mul_(3)
        self.assertTrue(torch.equal(mean, before[0]))
        self.assertTrue(torch.equal(m2, before[1]))

    def test_empty_input_has_count_zero(self):
        count, mean, m2 = bnps.torch.local_moments(torch.zeros(0, 4, 3, 3))
        self.assertEqual(count, 0)
        self.assertEqual(mean.tolist(), [0.0] * 4)
        self.assertEqual(m2.tolist(), [0.0] * 4)

    def test_merge_is_the_union(self):
        a = torch.randn(5, 3, dtype=torch.float64)
        b = torch.randn(7, 3, dtype=torch.float64) + 3
        ma, mb = bnps.torch.local_moments(a), bnps.torch.local_moments(b)
        n, mean, m2 = bnps_client.merge_moments(
            ma[0], ma[1].numpy(), ma[2].numpy(), mb[0], mb[1].numpy(),
            mb[2].numpy())
        u = bnps.torch.local_moments(torch.cat([a, b]))
        self.assertEqual(n, 12)
        torch.testing.assert_close(torch.from_numpy(mean), u[1], **F64)
        torch.testing.assert_close(torch.from_numpy(m2), u[2], **F64)


class LayerTest(unittest.TestCase):
    def connection(self, policy):
        return connect(self, policy)[0]

    def test_finish_leaves_the_job_and_close_does_not(self):
        # A server without --keep_serving exits once its job is complete:
        # once its one worker left.
        s, cluster = connect(self, "sync", keep_serving=False)
        server = cluster._servers[0].proc
        s.close()
        with self.assertRaises(subprocess.TimeoutExpired):
            server.wait(timeout=0.5)
        s, cluster = connect(self, "sync", keep_serving=False)
        s.finish()
        self.assertEqual(cluster._servers[0].proc.wait(timeout=30), 0)

    def check_against_torch(self, policy, momentum, steps=3):
        s = self.connection(policy)
        ours = bnps.torch.SyncBatchNorm(3, momentum=momentum, name="l",
                                        connection=s).double()
        ref = nn.BatchNorm2d(3, momentum=momentum).double()
        with torch.no_grad():
            for m in (ours, ref):
                m.weight.copy_(torch.tensor([0.5, 1.5, 2.0]))
                m.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
        for _ in range(steps):
            x = torch.randn(4, 3, 5, 5, dtype=torch.float64) * 3 + 2
            dy = torch.randn_like(x)
            xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
            ya, yb = ours(xa), ref(xb)
            ya.backward(dy)
            yb.backward(dy)
            torch.testing.assert_close(ya, yb, **F64)
            torch.testing.assert_close(xa.grad, xb.grad, **F64)
            torch.testing.assert_close(ours.weight.grad, ref.weight.grad, **F64)
            torch.testing.assert_close(ours.bias.grad, ref.bias.grad, **F64)
        for key, value in ref.state_dict().items():
            torch.testing.assert_close(ours.state_dict()[key], value, **F64)
        return s

    def test_sync_with_one_worker_is_torch_batchnorm(self):
        s = self.check_against_torch("sync", 0.1)
        self.assertEqual(round_trips(s), {("l", "forward"): 3,
                                          ("l", "backward"): 3})

    def test_local_is_torch_batchnorm_with_a_cumulative_average(self):
        s = self.check_against_torch("local", None)
        self.assertEqual(round_trips(s), {})  # no traffic

    def test_running_stats_written_behind_the_layers_back_are_used(self):
        # The layer keeps a host copy of the running statistics it wrote; a
        # load_state_dict, a user's write or a move must replace it.
        s = self.connection("sync")
        ours = bnps.torch.SyncBatchNorm(3, name="l", connection=s).double()
        ref = nn.BatchNorm2d(3).double()
        x = torch.randn(4, 3, 2, 2, dtype=torch.float64)
        ours(x)
        ref(x)
        state = {"running_mean": torch.tensor([1.0, 2.0, 3.0]),
                 "running_var": torch.tensor([4.0, 5.0, 6.0]),
                 "num_batches_tracked": torch.tensor(7)}
        ours.load_state_dict(state, strict=False)
        ref.load_state_dict(state, strict=False)
        ours(x)
        ref(x)
        with torch.no_grad():  # a user's own write
            ours.running_mean.mul_(2)
            ref.running_mean.mul_(2)
        ours(x)
        ref(x)
        ours.running_var = ours.running_var.clone() + 1  # a new tensor
        ref.running_var = ref.running_var.clone() + 1
        ours(x)
        ref(x)
        for key, value in ref.state_dict().items():
            torch.testing.assert_close(ours.state_dict()[key], value, **F64,
                                       msg=key)

    def test_copies_leave_the_per_process_caches_behind(self):
        s = self.connection("sync")
        ours = bnps.torch.SyncBatchNorm(3, name="l", connection=s).double()
        x = torch.randn(4, 3, 2, 2, dtype=torch.float64, requires_grad=True)
        ours(x).sum().backward()
        self.assertIn("_bnps_running", ours.__dict__)
        ours.connection = None  # a connection is not for pickling
        copy = pickle.loads(pickle.dumps(ours))
        for key in bnps.torch.SyncBatchNorm._CACHES:
            self.assertNotIn(key, copy.__dict__)
        torch.testing.assert_close(copy.running_mean, ours.running_mean)
        copy.connection = s
        copy.bnps_name = "l2"
        copy(x).sum().backward()  # trains, making its own caches

    def test_async_needs_the_jobs_momentum(self):
        # The C++ client's rule (client/worker_bn.h), as a ValueError.
        s = self.connection("async")
        bn = bnps.torch.SyncBatchNorm(3, momentum=0.5, name="l", connection=s)
        for x in (torch.randn(4, 3), torch.randn(4, 3).double()):
            with self.assertRaisesRegex(ValueError, "bn_momentum=0.5"):
                bn.to(x.dtype)(x)
        self.assertEqual(round_trips(s), {})  # refused before sending

    def test_recal_settles_by_recalibrating(self):
        s = self.connection("recal")
        model = bnps.torch.SyncBatchNorm(3, name="l", connection=s)
        with self.assertRaisesRegex(RuntimeError, "recalibrate"):
            bnps.torch.sync_running_stats(model, connection=s)
        self.assertEqual(bnps.torch.sync_running_stats(
            model, connection=self.connection("sync")), 0)

    def test_training_without_a_name_or_a_connection_is_refused(self):
        s = self.connection("sync")
        with self.assertRaisesRegex(RuntimeError, "name"):
            bnps.torch.SyncBatchNorm(2, connection=s)(torch.randn(3, 2))
        saved, bnps_connection._default = bnps_connection._default, None
        try:
            with self.assertRaisesRegex(RuntimeError, "init"):
                bnps.torch.SyncBatchNorm(2, name="x")(torch.randn(3, 2))
        finally:
            bnps_connection._default = saved

    def test_bad_input_rank_is_a_value_error(self):
        with self.assertRaises(ValueError):
            bnps.torch.SyncBatchNorm(2, name="x")(torch.randn(3))
        with self.assertRaises(ValueError):
            bnps.torch.SyncBatchNorm(2, name="x")(torch.randn(3, 4))

    def check_two_backward_passes(self, policy, round_trips_then):
        s = self.connection(policy)
        ours = bnps.torch.SyncBatchNorm(3, name="l", connection=s).double()
        ref = nn.BatchNorm2d(3).double()
        x = torch.randn(4, 3, 2, 2, dtype=torch.float64)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = ours(xa), ref(xb)
        for _ in range(2):
            dy = torch.randn_like(x)
            ya.backward(dy, retain_graph=True)
            yb.backward(dy, retain_graph=True)
        torch.testing.assert_close(xa.grad, xb.grad, **F64)
        self.assertEqual(round_trips(s), round_trips_then)

    def test_a_second_backward_through_one_forward_under_sync(self):
        # Each backward pass is merged on its own (the servers answer a
        # repeated step with the first answer: it must not be reused).
        # (The servers refuse a step below one they finished: steps 0, 1.)
        self.check_two_backward_passes("sync", {("l", "forward"): 1,
                                                ("l", "backward"): 2})

    def test_a_layer_applied_twice_per_step_under_sync(self):
        # A siamese model: the backward passes come in reverse order of the
        # forwards; their steps count up all the same (the servers refuse a
        # backward step below one they finished).
        s = self.connection("sync")
        ours = bnps.torch.SyncBatchNorm(3, name="l", connection=s).double()
        ref = nn.BatchNorm2d(3).double()
        for _ in range(2):
            x1 = torch.randn(4, 3, 2, 2, dtype=torch.float64)
            x2 = torch.randn(4, 3, 2, 2, dtype=torch.float64) + 1
            grads = []
            for m in (ours, ref):
                a, b = x1.clone().requires_grad_(), x2.clone().requires_grad_()
                ((m(a) * x1).sum() + (m(b) ** 3).sum()).backward()
                grads.append((a.grad, b.grad))
            for got, want in zip(grads[0], grads[1]):
                torch.testing.assert_close(got, want, **F64)
        # Steps 0 to 3: the servers refused none.
        self.assertEqual(ours._bnps_backward_step, 4)
        self.assertEqual(round_trips(s)[("l", "backward")], 4)

    def test_a_second_backward_under_local_is_torch_batchnorm(self):
        self.check_two_backward_passes("local", {})

    def test_double_backward_is_refused(self):
        # The backward pass treats the merged statistics as constants, so
        # its own derivative (create_graph=True, a gradient penalty) would
        # be wrong: it must raise rather than differentiate it.
        s = self.connection("local")
        bn = bnps.torch.SyncBatchNorm(3, name="l", connection=s).double()
        x = torch.randn(4, 3, 2, 2, dtype=torch.float64, requires_grad=True)
        (g,) = torch.autograd.grad((bn(x) ** 3).sum(), x, create_graph=True)
        with self.assertRaisesRegex(RuntimeError, "once_differentiable"):
            g.sum().backward()

    def test_recalibrate_keeps_untracked_layers_off_the_wire(self):
        # Under sync an untracked layer's forward is a barrier; during
        # recalibration (loaders of any length per worker) it must not be.
        s = self.connection("sync")
        model = nn.Sequential(
            bnps.torch.SyncBatchNorm(3, name="a", connection=s),
            bnps.torch.SyncBatchNorm(3, name="b", connection=s,
                                     track_running_stats=False))
        model.eval()
        model[1].train()  # a mixed state: each module's flag comes back
        loader = [torch.randn(4, 3, 2, 2) for _ in range(2)]
        self.assertEqual(bnps.torch.recalibrate(model, loader, connection=s), 2)
        self.assertEqual({k for k in round_trips(s) if k[0] == "b"}, set())
        self.assertFalse(model.training)
        self.assertFalse(model[0].training)
        self.assertTrue(model[1].training)
        # The population's statistics: the servers merged both batches.
        both = torch.cat(loader).transpose(0, 1).reshape(3, -1).double()
        torch.testing.assert_close(model[0].running_mean,
                                   both.mean(1).float())
        torch.testing.assert_close(model[0].running_var,
                                   both.var(1).float())

    def test_float32_on_the_cpu_takes_the_native_step(self):
        # Contiguous float32 CPU input runs the C++ worker's kernels, one
        # native call per pass. Other input runs torch's operations.
        s = self.connection("local")
        calls = []

        def counted(name):
            real = getattr(_native, name)

            def call(*args):
                calls.append(name)
                return real(*args)
            return mock.patch.object(_native, name, side_effect=call)

        tol = dict(rtol=1e-4, atol=1e-4)
        with counted("layer_pass_forward"), counted("layer_pass_backward"):
            for i, (shape, affine, momentum) in enumerate((
                    ((6, 3, 5, 4), True, 0.1), ((7, 3), False, None),
                    ((0, 3, 2), True, 0.1))):
                ours = bnps.torch.SyncBatchNorm(3, affine=affine,
                                                momentum=momentum,
                                                name=f"l{i}", connection=s)
                ref = nn.BatchNorm1d(3, affine=affine, momentum=momentum)
                if affine:
                    with torch.no_grad():
                        for m in (ours, ref):
                            m.weight.copy_(torch.tensor([0.5, 1.5, 2.0]))
                            m.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
                for _ in range(2):
                    x = torch.randn(*shape) * 3 + 50
                    dy = torch.randn_like(x)
                    xa = x.clone().requires_grad_()
                    xb = x.clone().requires_grad_()
                    ya = ours(xa)
                    ya.backward(dy)
                    if x.numel() == 0:
                        self.assertEqual(ya.shape, x.shape)
                        self.assertEqual(xa.grad.shape, x.shape)
                        continue
                    yb = ref(xb.flatten(2) if x.dim() > 3 else xb)
                    yb.view(x.shape).backward(dy)
                    torch.testing.assert_close(ya, yb.view(x.shape), **tol)
                    torch.testing.assert_close(xa.grad, xb.grad, **tol)
                    if affine:
                        torch.testing.assert_close(ours.weight.grad,
                                                   ref.weight.grad, **tol)
                        torch.testing.assert_close(ours.bias.grad,
                                                   ref.bias.grad, **tol)
                for key, value in ref.state_dict().items():
                    torch.testing.assert_close(ours.state_dict()[key], value,
                                               **tol)
            self.assertEqual(calls, ["layer_pass_forward",
                                     "layer_pass_backward"] * 6)
            del calls[:]
            bn = bnps.torch.SyncBatchNorm(3, name="l", connection=s)
            x = torch.randn(4, 3, 2, 2)
            for other in (x.double(), x.to(memory_format=torch.channels_last),
                          x.half()):
                bn.to(torch.float64 if other.dtype == torch.float64 else
                      torch.float32)
                bn(other.requires_grad_()).sum().backward()
            self.assertEqual(calls, [])

    @unittest.skipUnless(torch.cuda.is_available(),
                         "no CUDA device (or a CPU-only torch)")
    def test_cuda_is_torch_batchnorm(self):
        # The CUDA path: the same torch operations on the input's device.
        for dtype, affine in ((torch.float32, True), (torch.float32, False),
                              (torch.float16, True)):
            s = self.connection("sync")
            ours = bnps.torch.SyncBatchNorm(3, affine=affine, name="l",
                                            connection=s).cuda()
            ref = nn.BatchNorm2d(3, affine=affine).cuda()
            x = (torch.randn(4, 3, 5, 5, device="cuda") * 3 + 2).to(dtype)
            dy = torch.randn_like(x)
            xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
            ours(xa).backward(dy)
            ref(xb.float()).to(dtype).backward(dy)
            tol = dict(rtol=1e-2, atol=2e-2) if dtype == torch.float16 else \
                dict(rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(xa.grad.float(), xb.grad.float(), **tol)
            if affine:
                torch.testing.assert_close(ours.weight.grad, ref.weight.grad,
                                           **tol)
            torch.testing.assert_close(ours.running_var, ref.running_var,
                                       rtol=1e-4, atol=1e-4)

    def test_eval_needs_no_connection(self):
        ours = bnps.torch.SyncBatchNorm(3).eval()
        ref = nn.BatchNorm2d(3).eval()
        with torch.no_grad():
            for m in (ours, ref):
                m.running_mean.copy_(torch.tensor([1.0, -1.0, 0.5]))
                m.running_var.copy_(torch.tensor([2.0, 0.5, 1.0]))
        x = torch.randn(2, 3, 4, 4)
        torch.testing.assert_close(ours(x), ref(x))


class ClusterArgsTest(unittest.TestCase):
    """bnps.cluster's server flags: BN over raw TCP and a Unix socket by
    default, neither with TLS, TCP alone with bn_unix=False."""

    def test_plaintext_servers_offer_tcp_and_a_unix_socket(self):
        from bnps import cluster
        args = cluster.server_args(0, 1, 2)
        self.assertIn("--bn_port=0", args)
        self.assertIn("--bn_unix_socket=auto", args)
        tcp = cluster.server_args(0, 1, 2, bn_unix=False)
        self.assertIn("--bn_port=0", tcp)
        self.assertNotIn("--bn_unix_socket=auto", tcp)
        tls = cluster.server_args(0, 1, 2, flags=["--tls_cert=/c.pem"])
        self.assertNotIn("--bn_port=0", tls)
        self.assertNotIn("--bn_unix_socket=auto", tls)
        own = cluster.server_args(0, 1, 2, flags=["--bn_unix_socket=/tmp/x"])
        self.assertEqual([f for f in own if f.startswith("--bn_unix")],
                         ["--bn_unix_socket=/tmp/x"])


class ConvertTest(unittest.TestCase):
    def test_names_state_and_parameters_are_kept(self):
        model = nn.Sequential(nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2),
                              nn.Sequential(nn.Flatten(), nn.SyncBatchNorm(8)))
        with torch.no_grad():
            model[1].running_mean.fill_(0.25)
            model[1].weight.fill_(3)
        weight = model[1].weight
        before = {k: v.clone() for k, v in model.state_dict().items()}
        out = bnps.torch.convert_sync_batchnorm(model.eval(), prefix="m/")
        self.assertIs(out, model)
        self.assertIsInstance(model[1], bnps.torch.SyncBatchNorm)
        self.assertIsInstance(model[2][1], bnps.torch.SyncBatchNorm)
        self.assertIs(model[1].weight, weight)
        self.assertFalse(model[1].training)
        self.assertEqual(model[1].bnps_name, "m/1")
        self.assertEqual(model[2][1].bnps_name, "m/2.1")
        after = model.state_dict()
        self.assertEqual(sorted(before), sorted(after))
        for k, v in before.items():
            self.assertTrue(torch.equal(after[k], v), k)

    def test_a_batchnorm_root_is_replaced(self):
        out = bnps.torch.convert_sync_batchnorm(nn.BatchNorm1d(4))
        self.assertIsInstance(out, bnps.torch.SyncBatchNorm)
        self.assertEqual(out.bnps_name, "bn")


if __name__ == "__main__":
    unittest.main()
