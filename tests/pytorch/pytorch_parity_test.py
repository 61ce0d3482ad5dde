"""bnps.torch.SyncBatchNorm against torch.nn.BatchNorm on the concatenated
batch, in float64, with 2-3 worker processes and real bnps_server shards on
127.0.0.1 (ports picked by the servers).

Each scenario starts a LocalCluster, runs parity_worker.py SCENARIO in one
process per worker (forked from a multiprocessing fork server that imported
torch once, so no worker pays torch's import; the interpreter is Debian's
/usr/bin/python3, which has python3-torch, or one with torch), and
compares what they saved with the reference computed here: outputs, input
gradients, weight and bias gradients (summed over workers), running
statistics after many steps, eval mode; uneven and empty batches, one sample
per process, affine=False, 2-D/3-D/5-D input, channels_last, float16 and
bfloat16; convert_sync_batchnorm on nested modules; the local, recal and
async policies; a worker whose peer stops calling gets DeadlineExceeded.

torch is required: tools/setup.sh installs python3-torch. Without it this
test fails (it does not skip).
"""

import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import unittest

RUNFILES = os.getcwd()
HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.join(RUNFILES, "python")  # bnps/ and libbnps.so
sys.path.insert(0, PYDIR)
sys.path.insert(0, HERE)

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                             "python"))  # run from a checkout: torch_or_debian.py
import torch_or_debian  # noqa: F401,E402  (first: torch, or Debian's python3)
import torch  # noqa: E402

import parity_cases  # noqa: E402
import parity_worker  # noqa: E402
from bnps.cluster import LocalCluster  # noqa: E402

F64 = dict(rtol=1e-9, atol=1e-9)


# The layers wait for the device at each exchange: the CPU's way, and on
# CUDA (BNPS_PARITY_DEVICE=cuda) not the default, so named.
WAIT = {"BNPS_STREAM_EXCHANGE": "0"}


def tolerance(dtype):
    return {torch.float64: F64,
            torch.float32: dict(rtol=1e-4, atol=1e-4),
            torch.float16: dict(rtol=1e-2, atol=2e-2),
            torch.bfloat16: dict(rtol=3e-2, atol=1e-1)}[dtype]


# The workers' processes: forked from one server process that imported
# torch (and nothing that starts threads) before any worker asked for it.
FORKS = multiprocessing.get_context("forkserver")
FORKS.set_forkserver_preload(["torch"])


def run_scenario(scenario, workers, policy="sync", servers=2, flags=(),
                 extra_env=None, timeout=180):
    """Runs the scenario's workers against a fresh cluster; returns each
    worker's saved result."""
    with LocalCluster(num_servers=servers, num_workers=workers, policy=policy,
                      server_flags=list(flags)) as cluster, \
            tempfile.TemporaryDirectory() as out:
        procs = []
        for w in range(workers):
            env = cluster.worker_env(w)
            env["PYTHONPATH"] = PYDIR
            env["OMP_NUM_THREADS"] = "1"
            env.update(extra_env or {})
            procs.append(FORKS.Process(
                target=parity_worker.run_forked,
                args=(scenario, out, env, os.path.join(out, f"w{w}.log"))))
            procs[-1].start()
        deadline = time.monotonic() + timeout
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        if any(p.is_alive() for p in procs):
            for p in procs:
                p.kill()
            raise AssertionError(f"{scenario}: a worker hung")
        for w, p in enumerate(procs):
            if p.exitcode != 0:
                with open(os.path.join(out, f"w{w}.log")) as f:
                    log = f.read()
                raise AssertionError(f"{scenario} worker {w} exited "
                                     f"{p.exitcode}:\n{log[-4000:]}")
        return [torch.load(os.path.join(out, f"{scenario}_w{w}.pt"))
                for w in range(workers)]


def torch_bn(case):
    cls = {0: torch.nn.BatchNorm1d, 1: torch.nn.BatchNorm1d,
           2: torch.nn.BatchNorm2d, 3: torch.nn.BatchNorm3d}[len(case.spatial)]
    bn = cls(case.features, affine=case.affine,
             track_running_stats=case.track).double()
    if case.affine:
        w, b = case.init_params()
        with torch.no_grad():
            bn.weight.copy_(w)
            bn.bias.copy_(b)
    return bn


def reference(case):
    """torch BN on the global batch, in float64 from the case's dtype."""
    bn = torch_bn(case)
    ref = {"y": [], "dx": [], "dw": [], "db": []}
    for step in range(case.steps):
        x, dy = case.global_data(step)
        x = x.to(case.dtype).double().requires_grad_(True)
        y = bn(x)
        (y * dy).sum().backward()
        ref["y"].append(y.detach())
        ref["dx"].append(x.grad)
        if case.affine:
            ref["dw"].append(bn.weight.grad.clone())
            ref["db"].append(bn.bias.grad.clone())
            bn.weight.grad = bn.bias.grad = None
    ref["bn"] = bn
    return ref


class SyncParityTest(unittest.TestCase):
    """Twelve cases on one 3-worker sync job with 2 shards."""

    ENV = WAIT

    @classmethod
    def setUpClass(cls):
        cls.results = run_scenario("sync", 3,
                                   flags=["--barrier_timeout_ms=20000"],
                                   extra_env=cls.ENV)

    def check_case(self, case):
        ref = reference(case)
        tol = tolerance(case.dtype)
        got = [r[case.name] for r in self.results]
        for step in range(case.steps):
            for w, g in enumerate(got):
                rows = case.slice(w)
                msg = f"{case.name} step {step} worker {w}"
                torch.testing.assert_close(g["y"][step], ref["y"][step][rows],
                                           msg=msg + " output", **tol)
                torch.testing.assert_close(g["dx"][step], ref["dx"][step][rows],
                                           msg=msg + " input grad", **tol)
                if case.channels_last:
                    self.assertTrue(g["channels_last"][step], msg)
            if case.affine:
                ptol = tol if case.dtype != torch.float32 else \
                    dict(rtol=1e-4, atol=1e-3)
                torch.testing.assert_close(
                    sum(g["dw"][step] for g in got), ref["dw"][step], **ptol,
                    msg=f"{case.name} step {step} weight grad")
                torch.testing.assert_close(
                    sum(g["db"][step] for g in got), ref["db"][step], **ptol,
                    msg=f"{case.name} step {step} bias grad")
        bn = ref["bn"]
        for w, g in enumerate(got):
            self.assertEqual(g["dtype"], str(case.dtype), case.name)
            if case.track:
                rtol = F64 if case.dtype == torch.float64 else \
                    dict(rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(g["running_mean"], bn.running_mean,
                                           **rtol, msg=f"{case.name} mean w{w}")
                torch.testing.assert_close(g["running_var"], bn.running_var,
                                           **rtol, msg=f"{case.name} var w{w}")
                self.assertEqual(g["num_batches_tracked"], case.steps)
        # Eval mode: the running statistics (or, untracked, the worker's own
        # batch statistics), no traffic: worker 0 made 3 more eval calls.
        xe = parity_cases.eval_data(case).to(case.dtype).double()
        bn.eval()
        for w, g in enumerate(got):
            rows = case.slice(w)
            if case.track:
                want = bn(xe)[rows]
            elif case.sizes[w] > 0:
                local = torch_bn(case)
                local.eval()
                want = local(xe[rows])
            else:
                continue
            torch.testing.assert_close(g["y_eval"], want.detach(), **tol,
                                       msg=f"{case.name} eval w{w}")


def _add_sync_tests():
    for case in parity_cases.SYNC3:
        setattr(SyncParityTest, f"test_{case.name}",
                lambda self, case=case: self.check_case(case))


_add_sync_tests()

# The exchanges queued in stream order (bnps/torch/stream_exchange.py): on
# the CPU each runs inside the call that queues it, on a GPU
# (BNPS_PARITY_DEVICE=cuda) as a CUDA host function.
STREAM = {"BNPS_STREAM_EXCHANGE": "1"}


class StreamSyncParityTest(SyncParityTest):
    """SyncParityTest's cases with the exchanges queued in stream order."""

    ENV = STREAM

    def test_the_exchanges_were_queued(self):
        kind = "cuda" if os.environ.get("BNPS_PARITY_DEVICE") == "cuda" \
            else "host"
        for w, r in enumerate(self.results):
            counts = r["stream_counts"]
            self.assertEqual(list(counts), [kind], w)
            pending, run, fell_back = counts[kind]
            # Every case's forward and backward passes, none left or failed.
            self.assertGreater(run, 2 * len(parity_cases.SYNC3), w)
            self.assertEqual((pending, fell_back), (0, 0), w)


@unittest.skipUnless(os.environ.get("BNPS_PARITY_DEVICE") == "cuda" and
                     torch.cuda.is_available(),
                     "CUDA graphs: BNPS_PARITY_DEVICE=cuda on a GPU "
                     "(tools/gpu/run.sh torch)")
class CudaGraphCaptureTest(unittest.TestCase):
    """A training-mode pass captured in a CUDA graph: refused, saying why,
    where each exchange waits on the host (stream_exchange off); with the
    exchanges queued on the stream (the fused route) captured, each replay
    a new step; eval mode captures either way."""

    def test_capture_in_training_and_in_eval(self):
        import bnps.torch
        with LocalCluster(num_servers=1, num_workers=1) as c:
            with bnps.torch.init(servers=c.servers, worker=0, num_workers=1,
                                 set_default=False) as connection:
                for queued in (False, True):
                    connection.stream_exchange = queued
                    bn = bnps.torch.SyncBatchNorm(
                        3, name=f"bn{int(queued)}",
                        connection=connection).cuda()
                    x = torch.randn(4, 3, 2, 2, device="cuda")
                    bn(x)  # a step outside the graph works
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    if not queued:
                        with self.assertRaisesRegex(RuntimeError,
                                                    "stream_exchange"):
                            with torch.cuda.graph(graph):
                                bn(x)
                    else:
                        with torch.cuda.graph(graph):
                            y = bn(x)
                        for _ in range(3):
                            graph.replay()
                        torch.cuda.synchronize()
                        connection.drain_exchanges()
                        self.assertEqual(bn.num_batches_tracked.item(), 4)
                        want = torch.nn.functional.batch_norm(
                            x, None, None, training=True, eps=bn.eps)
                        torch.testing.assert_close(y, want, rtol=1e-4,
                                                   atol=1e-4)
                    torch.cuda.synchronize()
                    bn.eval()
                    side = torch.cuda.Stream()  # warm up, as CUDA graphs want
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        bn(x)
                    torch.cuda.current_stream().wait_stream(side)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        y = bn(x)
                    graph.replay()
                    torch.testing.assert_close(y, bn(x))
                    connection.drain_exchanges()


class LongRunTest(unittest.TestCase):
    def test_running_stats_after_many_steps_on_one_shard(self):
        case = parity_cases.LONG
        got = [r["long"] for r in run_scenario("long", 2, servers=1)]
        ref = reference(case)
        for w, g in enumerate(got):
            torch.testing.assert_close(g["y"][-1], ref["y"][-1][case.slice(w)],
                                       **F64)
            torch.testing.assert_close(g["running_mean"],
                                       ref["bn"].running_mean, **F64)
            torch.testing.assert_close(g["running_var"],
                                       ref["bn"].running_var, **F64)
            # ... and they are the servers' running statistics too.
            torch.testing.assert_close(g["server_mean"],
                                       ref["bn"].running_mean, **F64)
            torch.testing.assert_close(g["server_var"],
                                       ref["bn"].running_var, **F64)


class SharedLayerTest(unittest.TestCase):
    def test_a_layer_applied_twice_per_step_matches_torch(self):
        # A siamese model: the second application's backward pass comes
        # first (the servers refused the first's as "from the past"). In
        # float64 (torch operations) and float32 (the native steps).
        for dtype in (torch.float64, torch.float32):
            self.check_shared(dtype)

    def check_shared(self, dtype):
        got = run_scenario("shared", 2, servers=1,
                           extra_env={"BNPS_PARITY_DTYPE": str(dtype)[6:]})
        case = parity_cases.SHARED
        tol = F64 if dtype == torch.float64 else tolerance(dtype)
        bn = torch_bn(case)
        for step in range(case.steps):
            x1, dy1, x2, dy2 = (t.to(dtype).double()
                                for t in parity_cases.shared_data(step))
            x1.requires_grad_(True)
            x2.requires_grad_(True)
            y1, y2 = bn(x1), bn(x2)
            ((y1 * dy1).sum() + (y2 * dy2).sum()).backward()
            for w, g in enumerate(got):
                rows = case.slice(w)
                for i, (y, x) in enumerate(((y1, x1), (y2, x2))):
                    msg = f"{dtype} step {step} worker {w} application {i}"
                    torch.testing.assert_close(g["y"][step][i],
                                               y.detach()[rows], **tol,
                                               msg=msg + " output")
                    torch.testing.assert_close(g["dx"][step][i],
                                               x.grad[rows], **tol,
                                               msg=msg + " input grad")
            bn.zero_grad(set_to_none=True)
        for g in got:
            torch.testing.assert_close(g["running_mean"], bn.running_mean,
                                       **tol)
            torch.testing.assert_close(g["running_var"], bn.running_var,
                                       **tol)


class SecuredTest(unittest.TestCase):
    def test_mutual_tls_and_token_from_the_environment(self):
        tls = os.path.join(RUNFILES, "tests", "testdata", "tls")
        with tempfile.TemporaryDirectory() as d:
            token = os.path.join(d, "token")
            with open(token, "w") as f:
                f.write("pytorch-parity-token-0123456789\n")
            os.chmod(token, 0o600)  # a token others can read is refused
            got = run_scenario(
                "secured", 2, servers=2,
                flags=["--tls_cert=" + os.path.join(tls, "server.pem"),
                       "--tls_key=" + os.path.join(tls, "server.key"),
                       "--tls_client_ca=" + os.path.join(tls, "ca.pem"),
                       "--token_file=" + token],
                extra_env={"BNPS_TLS_CA": os.path.join(tls, "ca.pem"),
                           "BNPS_TLS_CERT": os.path.join(tls, "client.pem"),
                           "BNPS_TLS_KEY": os.path.join(tls, "client.key"),
                           "BNPS_TOKEN_FILE": token,
                           "BNPS_CONNECT_TIMEOUT_S": "10"})
        case = parity_cases.Case("secured", [3, 2], 3, steps=2, seed=13)
        ref = reference(case)
        for w, g in enumerate(got):
            torch.testing.assert_close(g["secured"]["y"][-1],
                                       ref["y"][-1][case.slice(w)], **F64)


class ConvertTest(unittest.TestCase):
    def test_nested_model_matches_torch_on_the_global_batch(self):
        got = run_scenario("convert", 3)
        model = parity_cases.nested_model()
        bn_names = sorted(n for n, m in model.named_modules()
                          if isinstance(m, torch.nn.modules.batchnorm._BatchNorm))
        self.assertEqual(bn_names, ["blocks.0.bn", "blocks.1.bn", "head.1",
                                    "head.3", "stem.1"])
        for g in got:
            self.assertEqual(g["names"], bn_names)
            self.assertNotIn("BatchNorm2d", g["types"])
            self.assertNotIn("BatchNorm1d", g["types"])
            self.assertTrue(g["state_kept"])
            self.assertTrue(g["same_keys"])
        sizes = parity_cases.CONVERT_SIZES
        for step in range(parity_cases.CONVERT_STEPS):
            x, dy = parity_cases.convert_data(step)
            x.requires_grad_(True)
            y = model(x)
            (y * dy).sum().backward()
            start = 0
            for w, g in enumerate(got):
                rows = slice(start, start + sizes[w])
                start += sizes[w]
                torch.testing.assert_close(g["y"][step], y.detach()[rows], **F64)
                torch.testing.assert_close(g["dx"][step], x.grad[rows], **F64)
            for name, p in model.named_parameters():
                torch.testing.assert_close(
                    sum(g["grads"][step][name] for g in got), p.grad, **F64,
                    msg=f"grad of {name} at step {step}")
            model.zero_grad(set_to_none=True)
        for key, value in model.state_dict().items():
            for g in got:
                torch.testing.assert_close(g["buffers"][key], value, **F64,
                                           msg=key)


class StopCallingTest(unittest.TestCase):
    ENV = WAIT

    def test_peer_that_stops_calling_gives_deadline_exceeded(self):
        got = run_scenario("stop", 2, servers=1,
                           flags=["--barrier_timeout_ms=2000"],
                           extra_env=dict(self.ENV, STOP_SLEEP_S="6"))
        self.assertEqual(got[1]["completed"], 2)
        self.assertIsNone(got[1]["error"])
        self.assertEqual(got[0]["completed"], 2, got[0])
        self.assertEqual(got[0]["error"], "DeadlineExceeded", got[0])
        self.assertTrue(got[0]["is_timeout"])
        self.assertIn("worker", got[0]["message"])
        self.assertIn("1", got[0]["message"])
        # The servers' barrier timeout, not the client's 30 s RPC deadline.
        self.assertLess(got[0]["waited_s"], 25, got[0])


class StreamStopCallingTest(StopCallingTest):
    """A queued exchange's failure reaches the caller: the layer's next
    pass (here its backward) raises it."""

    ENV = STREAM


class OverflowTest(unittest.TestCase):
    """A mixed-precision step whose scaled loss overflowed on one worker
    (torch's GradScaler then skips the step): as with torch's
    SyncBatchNorm, the merged backward sums are not finite, so every
    worker's input gradient is not finite that step, and no call fails;
    the steps before and after are finite, and so are the running
    statistics (the forward pass saw finite input)."""

    ENV = WAIT

    def test_every_worker_gets_a_non_finite_input_gradient(self):
        got = run_scenario("overflow", 2, servers=1, extra_env=self.ENV)
        for w, g in enumerate(got):
            for dtype in ("float32", "float64"):
                steps = g[dtype]
                self.assertEqual(steps[0], (True, True), (w, dtype))
                self.assertFalse(steps[1][0], (w, dtype))
                # The weight's gradient is the worker's own sum.
                self.assertEqual(steps[1][1], w != 0, (w, dtype))
                self.assertEqual(steps[2], (True, True), (w, dtype))
                self.assertTrue(g[dtype + "_running"], (w, dtype))


class StreamOverflowTest(OverflowTest):
    ENV = STREAM


class PolicyTest(unittest.TestCase):
    ENV = WAIT

    def check_queued(self, got):
        """With STREAM, the training passes' exchanges were queued jobs,
        none failed."""
        for w, g in enumerate(got):
            counts = g["stream_counts"]
            if self.ENV is WAIT:
                self.assertEqual(counts, {}, w)
                continue
            kind = "cuda" if os.environ.get("BNPS_PARITY_DEVICE") == "cuda" \
                else "host"
            pending, run, fell_back = counts[kind]
            self.assertGreater(run, 0, w)
            self.assertEqual((pending, fell_back), (0, 0), w)

    def test_local_normalizes_locally_then_averages_running_stats(self):
        got = run_scenario("local", 2, policy="local", servers=1,
                           extra_env=self.ENV)
        self.check_queued(got)
        case = parity_cases.Case("local", [4, 6], 3, steps=5, seed=20)
        refs = []
        for w, g in enumerate(got):
            bn = torch.nn.BatchNorm2d(3).double()
            for step in range(case.steps):
                x, _ = case.global_data(step)
                torch.testing.assert_close(g["y"][step],
                                           bn(x[case.slice(w)]).detach(), **F64)
            refs.append(bn)
            torch.testing.assert_close(g["running_before"][0], bn.running_mean,
                                       **F64)
        want_mean = (refs[0].running_mean + refs[1].running_mean) / 2
        want_var = (refs[0].running_var + refs[1].running_var) / 2
        for g in got:
            self.assertEqual(g["settled"], 1)
            torch.testing.assert_close(g["running_after"][0], want_mean, **F64)
            torch.testing.assert_close(g["running_after"][1], want_var, **F64)
        # The second round averages the statistics as they are then (the
        # servers answered it with the first round's before).
        for i in (0, 1):
            want = (got[0]["running_before2"][i] +
                    got[1]["running_before2"][i]) / 2
            self.assertFalse(torch.allclose(want, got[0]["running_after"][i]))
            for g in got:
                torch.testing.assert_close(g["running_after2"][i], want, **F64)

    def test_recal_recalibrates_over_every_workers_batches(self):
        got = run_scenario("recal", 2, policy="recal", servers=2,
                           extra_env=self.ENV)
        data = torch.cat([b for g in got for b in g["loader"]])
        dims = [0, 2, 3]
        for w, g in enumerate(got):
            self.assertEqual(g["batches"], 2 + w)
            torch.testing.assert_close(g["running_mean"], data.mean(dim=dims),
                                       **F64)
            torch.testing.assert_close(g["running_var"],
                                       data.var(dim=dims, unbiased=True), **F64)
        # A second recalibration (the servers refused its batches before).
        data2 = torch.cat([b for g in got for b in g["loader2"]])
        for g in got:
            torch.testing.assert_close(g["running2"][0], data2.mean(dim=dims),
                                       **F64)
            torch.testing.assert_close(g["running2"][1],
                                       data2.var(dim=dims, unbiased=True),
                                       **F64)

    def test_async_runs_and_shares_the_servers_running_stats(self):
        got = run_scenario("async", 2, policy="async", servers=1,
                           flags=["--staleness=1"], extra_env=self.ENV)
        self.check_queued(got)
        for g in got:
            self.assertTrue(g["finite"])
            self.assertEqual(g["steps"], 6)
            # The servers' statistics, moved from their start (mean 0, var 1)
            # towards the data (worker w's inputs have mean near 3 w).
            self.assertGreater(float(g["running_mean"].min()), 0.1, g)
            self.assertTrue(bool((g["running_var"] > 0).all()), g)


class RunningStatsTest(unittest.TestCase):
    ENV = WAIT

    def test_cumulative_average_and_a_loaded_state_follow_torch(self):
        g = run_scenario("running", 1, servers=1, extra_env=self.ENV)[0]
        for step, (y, want) in enumerate(zip(g["y"], g["y_ref"])):
            torch.testing.assert_close(y, want, **F64, msg=f"step {step}")
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            torch.testing.assert_close(g[name], g["ref_" + name], **F64,
                                       msg=name)
        self.assertEqual(int(g["num_batches_tracked"]), 6)


class StreamRunningStatsTest(RunningStatsTest):
    ENV = STREAM


class StreamPolicyTest(PolicyTest):
    """PolicyTest's policies with the exchanges queued in stream order:
    local (nothing sent, running statistics from the batch), recal
    (recalibration drains the queue first) and async (the servers' running
    statistics)."""

    ENV = STREAM


class ParameterServerOptimizerTest(unittest.TestCase):
    def test_training_through_the_servers_matches_sgd_on_the_global_batch(self):
        got = run_scenario(
            "optimizer", 2, servers=2,
            flags=[f"--learning_rate={parity_cases.OPT_LR}",
                   f"--momentum={parity_cases.OPT_MOMENTUM}"])
        model = parity_cases.opt_model()
        sgd = torch.optim.SGD(model.parameters(), lr=parity_cases.OPT_LR,
                              momentum=parity_cases.OPT_MOMENTUM)
        for step in range(parity_cases.OPT_STEPS):
            x, y = parity_cases.opt_data(step)
            sgd.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            sgd.step()
        for g in got:
            self.assertEqual(g["steps"], parity_cases.OPT_STEPS)
            for name, p in model.named_parameters():
                torch.testing.assert_close(g["params"][name], p.detach(),
                                           rtol=1e-4, atol=1e-5, msg=name)
        # They moved: the check above is not the initial values twice.
        start = dict(parity_cases.opt_model().named_parameters())
        self.assertFalse(torch.allclose(start["0.weight"], model[0].weight))


_CLOSE_WHILE_WAITING = """
import threading, time
import bnps
from bnps.cluster import LocalCluster
with LocalCluster(num_servers=1, num_workers=2,
                  server_flags=["--barrier_timeout_ms=3000"]) as c:
    client = bnps.Client(c.servers, worker=0, num_workers=2)
    got = {}
    calling = threading.Event()
    def waiter():  # a forward barrier that worker 1 never joins
        try:
            calling.set()
            client.bn_forward("l", 0, 2, [0.0], [1.0])
            got["result"] = "ok"
        except bnps.BnpsError as e:
            got["result"] = type(e).__name__
            got["message"] = str(e)
    t = threading.Thread(target=waiter)
    t.start()
    calling.wait()
    time.sleep(1)  # well inside the call (3 s barrier timeout)
    client.close()
    t.join(30)
    try:
        client.bn_forward("l", 1, 2, [0.0], [1.0])
        after = "no error"
    except bnps.BnpsError as e:
        after = type(e).__name__
    print("alive", t.is_alive(), "result", got.get("result"), "after", after)
    print(got.get("message"))
"""


class CloseTest(unittest.TestCase):
    def test_close_while_another_thread_waits_on_the_servers(self):
        # The call in flight holds the connection: it ends as if close() had
        # not come (the barrier's deadline), instead of running on a
        # destroyed client (a crash, most runs, before the fix).
        r = subprocess.run([sys.executable, "-c", _CLOSE_WHILE_WAITING],
                           env=dict(os.environ, PYTHONPATH=PYDIR),
                           cwd=RUNFILES, capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr[-3000:])
        self.assertIn("alive False result DeadlineExceeded after "
                      "FailedPrecondition", r.stdout)


def _running(pid):
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class LocalClusterTest(unittest.TestCase):
    def test_servers_die_with_the_process_that_started_them(self):
        # A test or script killed before LocalCluster.stop() (a Bazel
        # timeout, Ctrl-C on a launcher) must not leave servers running.
        code = ("import time\n"
                "from bnps.cluster import LocalCluster\n"
                "c = LocalCluster(num_servers=2, num_workers=1).start()\n"
                "print(*[p.pid for p in c._procs], flush=True)\n"
                "time.sleep(120)\n")
        proc = subprocess.Popen([sys.executable, "-c", code],
                                env=dict(os.environ, PYTHONPATH=PYDIR),
                                cwd=RUNFILES, stdout=subprocess.PIPE,
                                text=True)
        try:
            pids = [int(p) for p in proc.stdout.readline().split()]
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()
        self.assertEqual(len(pids), 2)
        deadline = time.monotonic() + 10
        alive = pids
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [pid for pid in pids if _running(pid)]
        for pid in alive:  # do not leak them when the test fails
            os.kill(pid, 9)
        self.assertEqual(alive, [], "servers outlived their parent")

    def test_a_failed_start_stops_the_servers_it_started(self):
        # The servers refuse an unknown flag: start() raises, and stops
        # what it started, also when called without `with`.
        c = LocalCluster(num_servers=2, num_workers=1,
                         server_flags=["--no_such_flag_for_this_test"],
                         start_timeout_s=20)
        with self.assertRaisesRegex(RuntimeError, "gave no port"):
            c.start()
        self.assertEqual(c._procs, [])


if __name__ == "__main__":
    unittest.main()
