"""bnps.torch's route table (bnps/torch/_routes.py): every route from its
facts, the fallbacks (a correct route, one warning per layer), the
refusals (a capture, another device), without servers; that a layer
dispatches on the table's answer (a one-worker local job, one_job.py); and
that bnps (python/bnps) has no import circle.
Needs torch (tools/setup.sh installs python3-torch); fails without it."""

import ast
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
from bnps.torch import _layer_ops  # noqa: E402
from bnps.torch import _routes as R  # noqa: E402
from one_job import connect  # noqa: E402

# A training pass of float32 CPU input in order, connection not queueing.
BASE = R.Facts(training=True, tracks_running=True, recalibrating=False,
               compiling=False, capturing=False, device="cpu",
               float32_state=True, layout=R.CONTIGUOUS, queues=False,
               other_device=False, policy="sync")


class TableTest(unittest.TestCase):
    def check(self, route, fallback=False, **changes):
        got, why = R.choose(BASE._replace(**changes))
        self.assertEqual(got, route, changes)
        self.assertEqual(why is not None, fallback, (changes, why))

    def test_every_route_from_its_facts(self):
        self.check(R.EVAL, training=False)
        self.check(R.OWN_STATISTICS, training=False, tracks_running=False)
        self.check(R.COMPILED, compiling=True)
        self.check(R.NATIVE_CPU)
        self.check(R.RECALIBRATING, recalibrating=True)
        self.check(R.WAITING, float32_state=False)  # float64, 16-bit, ...
        self.check(R.WAITING, device="cuda", float32_state=False)
        self.check(R.FUSED, device="cuda", float32_state=False, queues=True)
        self.check(R.FUSED, float32_state=False, queues=True)  # =1 on CPU
        # An empty batch: the queued route, no warning.
        self.check(R.QUEUED, device="cuda", float32_state=False, queues=True,
                   unfused="")
        self.assertEqual(set(R.ROUTES), {
            R.EVAL, R.OWN_STATISTICS, R.COMPILED, R.NATIVE_CPU, R.FUSED,
            R.QUEUED, R.WAITING, R.RECALIBRATING})

    def test_fallbacks_take_a_correct_route_and_say_so(self):
        # The native call waits inside itself: no queue for it.
        self.check(R.NATIVE_CPU, fallback=True, queues=True)
        # Strided float32 CPU input: torch operations read any strides.
        self.check(R.WAITING, fallback=True, layout=R.STRIDED)
        self.check(R.FUSED, fallback=True, layout=R.STRIDED, queues=True)
        # What the fused route cannot take (16-bit running statistics, a
        # driver without its calls) queues with torch operations.
        self.check(R.QUEUED, fallback=True, device="cuda",
                   float32_state=False, queues=True, unfused="why")
        self.check(R.QUEUED, fallback=True, layout=R.STRIDED, queues=True,
                   unfused="why")

    def test_a_capture_takes_the_fused_route_or_is_refused_saying_why(self):
        cuda = BASE._replace(capturing=True, device="cuda",
                             float32_state=False, queues=True)
        for policy in ("sync", "async", "local", "recal"):
            self.assertEqual(R.choose(cuda._replace(policy=policy)),
                             (R.FUSED, None))
        for policy in ("sync", "local"):
            for change, why in ((dict(queues=False), "stream_exchange"),
                                (dict(unfused="16-bit"), "16-bit"),
                                (dict(unfused=""), "an empty batch"),
                                (dict(recalibrating=True), "recalibration")):
                with self.assertRaisesRegex(
                        R.RouteError,
                        f"CUDA graph under the '{policy}' policy: .*{why}"):
                    R.choose(cuda._replace(policy=policy, **change))
        with self.assertRaises(R.RouteError):  # recalibration sends too
            R.choose(BASE._replace(capturing=True, recalibrating=True))
        # Eval mode captures (torch operations only); so does a trace.
        self.check(R.EVAL, training=False, capturing=True)
        self.check(R.OWN_STATISTICS, training=False, tracks_running=False,
                   capturing=True)
        self.check(R.COMPILED, compiling=True, capturing=True)

    def test_input_on_a_device_that_is_not_current_is_refused(self):
        with self.assertRaisesRegex(R.RouteError, "current"):
            R.choose(BASE._replace(device="cuda", float32_state=False,
                                   queues=True, other_device=True))

    def test_the_backward_route(self):
        self.assertEqual(R.choose_backward(True, True, fused=True), R.FUSED)
        self.assertEqual(R.choose_backward(True, True), R.QUEUED)
        self.assertEqual(R.choose_backward(False, True), R.NATIVE_CPU)
        self.assertEqual(R.choose_backward(False, False), R.WAITING)

    def test_native_shape(self):
        x = torch.zeros(2, 3, 4, 5)
        self.assertEqual(R.native_shape(x), (2, 3, 20))
        self.assertEqual(R.native_shape(torch.zeros(2, 3)), (2, 3, 1))
        self.assertIsNone(R.native_shape(x.double()))
        self.assertIsNone(R.native_shape(
            x.to(memory_format=torch.channels_last)))
        self.assertIsNone(R.native_shape(torch.zeros(2, 3, 0)))
        self.assertIsNone(R.native_shape(x, torch.zeros(3).double()))


class LayerRouteTest(unittest.TestCase):
    def connection(self, **kw):
        return connect(self, "local", **kw)[0]

    def routes(self, bn, x):
        """The routes `bn` took for a forward and backward pass on x, and
        the warnings it gave."""
        taken = []

        def spy(table):
            wrapped = {}
            for route, fn in table.items():
                def call(*a, _route=route, _fn=fn):
                    taken.append(_route)
                    return _fn(*a)
                wrapped[route] = call
            return mock.patch.dict(table, wrapped)

        with spy(_layer_ops._FORWARD), spy(_layer_ops._BACKWARD), \
                warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            bn(x.requires_grad_()).sum().backward()
        return taken, [str(w.message) for w in said
                       if issubclass(w.category, R.Fallback)]

    def test_the_layer_takes_the_tables_route(self):
        s = self.connection()
        bn = bnps.torch.SyncBatchNorm(3, name="l", connection=s)
        x = torch.randn(4, 3, 2, 2)
        self.assertEqual(self.routes(bn, x.clone()), (
            [R.NATIVE_CPU, R.NATIVE_CPU], []))
        bn.double()
        self.assertEqual(self.routes(bn, x.double()),
                         ([R.WAITING, R.WAITING], []))
        bn.eval()
        self.assertEqual(self.routes(bn, x.double()), ([], []))  # torch's

    def test_strided_float32_warns_once_and_matches_torch(self):
        s = self.connection()
        ours = bnps.torch.SyncBatchNorm(3, name="l", connection=s)
        ref = nn.BatchNorm2d(3)
        for step in range(3):
            x = torch.randn(4, 3, 5, 5).to(memory_format=torch.channels_last)
            routes, said = self.routes(ours, x.clone())
            self.assertEqual(routes, [R.WAITING, R.WAITING])
            self.assertEqual(len(said), 1 if step == 0 else 0, said)
            ref(x)
        torch.testing.assert_close(ours.running_var, ref.running_var)
        # Another layer says it again: once per layer.
        other = bnps.torch.SyncBatchNorm(3, name="m", connection=s)
        x = torch.randn(4, 3, 5, 5).to(memory_format=torch.channels_last)
        self.assertEqual(len(self.routes(other, x)[1]), 1)

    def test_a_queue_asked_for_on_the_native_path_warns_once(self):
        s = self.connection(stream_exchange=True)
        bn = bnps.torch.SyncBatchNorm(3, name="l", connection=s)
        routes, said = self.routes(bn, torch.randn(4, 3, 2, 2))
        self.assertEqual(routes, [R.NATIVE_CPU, R.NATIVE_CPU])
        self.assertEqual(len(said), 1)
        self.assertIn("stream_exchange", said[0])
        routes, said = self.routes(bn, torch.randn(4, 3, 2, 2))
        self.assertEqual(said, [])
        # Input the native call does not take queues on the CPU: the fused
        # route, through the kernels' CPU stand-in; an empty batch queues.
        routes, _ = self.routes(bn.double(), torch.randn(4, 3, 2, 2).double())
        self.assertEqual(routes, [R.FUSED, R.FUSED])
        routes, said = self.routes(bn, torch.randn(0, 3, 2, 2).double())
        self.assertEqual((routes, said), ([R.QUEUED, R.QUEUED], []))


def _imports(path, modules):
    """The modules of `modules` that `path` imports, anywhere in it (a
    function's import too: a circle closed at run time is one all the
    same)."""
    found = set()
    with open(path) as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:  # a module, or a name from one
                sub = f"{node.module}.{a.name}"
                found.add(sub if sub in modules else node.module)
    return found & set(modules)


class ImportGraphTest(unittest.TestCase):
    def test_bnps_has_no_import_circle(self):
        root = os.path.dirname(os.path.dirname(os.path.abspath(
            bnps.__file__)))
        modules = {}
        for folder, _, files in os.walk(os.path.join(root, "bnps")):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(folder, f)
                    name = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                    modules[name.replace(".__init__", "")] = path
        self.assertIn("bnps.torch.custom_ops", modules)
        graph = {m: _imports(p, modules) - {m} for m, p in modules.items()}
        # A package's __init__ gathers its modules' names (it imports them;
        # they import it only through its parts): not a circle's edge back.
        packages = {"bnps", "bnps.torch"}
        for m in graph:
            if m not in packages:
                graph[m] -= packages
        # Depth-first search for a back edge; the first circle found fails.
        state, path = {}, []

        def visit(m):
            state[m] = "open"
            path.append(m)
            for n in sorted(graph[m]):
                if state.get(n) == "open":
                    self.fail("import circle: " + " -> ".join(
                        path[path.index(n):] + [n]))
                if n not in state:
                    visit(n)
            path.pop()
            state[m] = "done"

        for m in sorted(graph):
            if m not in state:
                visit(m)


if __name__ == "__main__":
    unittest.main()
