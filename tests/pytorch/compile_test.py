"""bnps.torch.SyncBatchNorm under torch.compile (torch >= 2.4): the exchange
with the servers is the custom op bnps::batch_norm_v3 (and its backward), so
`torch.compile(model, fullgraph=True)` traces the whole model with no graph
break (one graph, with the three layers' ops in it), and the compiled model
(backend aot_eager) gives the same bits as the eager one: outputs, every
parameter's gradient, the running statistics over 3 training steps, and eval
mode; with Inductor the same to float32 rounding. A 1-worker sync job on a
real bnps_server (the compiled copy's layers have names of their own, so
both run in one job). With the connection's stream_exchange, float64
layers queue their exchanges (on the CPU the jobs run as they are queued)
in the compiled model as in the eager one, with the same bits, and what
the ops hold for the backward pass is freed with the graph's saved
tensors, or with the outputs of a forward that has none. The ops carry
the cudagraph_unsafe tag where torch has it.
BNPS_PARITY_DEVICE=cuda (tools/gpu/run.sh torch) puts the models on the
GPU, where the queued exchanges are CUDA host functions, compiles with
aot_eager only (Inductor's GPU kernels take minutes to build) and compares
to float rounding (cuDNN's backward may add in any order). Under torch <
2.4 (Debian's 1.13) it skips: the ops are not registered there and the
layer runs eagerly.

Run it with a torch 2.x interpreter (docs/pytorch.md):

    bazel build //python:libbnps.so //:bnps_server
    PYTHONPATH=python BNPS_NATIVE_LIB=bazel-bin/python/libbnps.so \\
    BNPS_SERVER_BIN=bazel-bin/server/bnps_server \\
        ~/.cache/bnps/torch2-venv/bin/python tests/pytorch/compile_test.py
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.getcwd(), "python"))  # Bazel runfiles
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                             "python"))  # run from a checkout: torch_or_debian.py
import torch_or_debian  # noqa: F401,E402  (first: torch, or Debian's python3)
import torch  # noqa: E402


import bnps.torch  # noqa: E402
from one_worker_job import OneWorkerJob  # noqa: E402
from bnps.torch import custom_ops  # noqa: E402

STEPS = 3
DEVICE = torch.device(os.environ.get("BNPS_PARITY_DEVICE", "cpu"))
BACKENDS = ("aot_eager",) if DEVICE.type == "cuda" else \
    ("aot_eager", "inductor")
# Bit-equal where every kernel is deterministic: on the CPU. On CUDA the
# convolutions' backward may take cuDNN algorithms that add in any order,
# in the eager model as in the compiled one: equal to float rounding there.
EXACT = DEVICE.type == "cpu"


def make(prefix, dtype=torch.float32):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3),
        torch.nn.BatchNorm2d(4, affine=False), torch.nn.Flatten(),
        torch.nn.Linear(4 * 4 * 4, 5), torch.nn.BatchNorm1d(5))
    return bnps.torch.convert_sync_batchnorm(model.to(DEVICE, dtype),
                                             prefix=prefix)


@unittest.skipUnless(custom_ops.SUPPORTED,
                     f"torch {torch.__version__} < 2.4: no "
                     "torch.library.custom_op; SyncBatchNorm runs eagerly")
class CompileTest(OneWorkerJob):
    # The layers wait for the device at each exchange (on CUDA not the
    # default); test_stream_exchange queues them.
    CONNECT = dict(stream_exchange=False)

    def same(self, a, b, exact, msg):
        if exact:
            self.assertTrue(torch.equal(a, b), msg)
        else:
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=msg)

    def compare(self, backend, tag, exact=EXACT, dtype=torch.float32):
        torch._dynamo.reset()
        graphs = []

        def capture(gm, inputs):  # Dynamo's graph, then the real backend
            graphs.append(gm.code)
            return torch._dynamo.lookup_backend(backend)(gm, inputs)

        eager = make(f"{tag}.eager.", dtype)
        compiled = make(f"{tag}.compiled.", dtype)
        run = torch.compile(compiled, fullgraph=True, backend=capture)
        g = torch.Generator().manual_seed(1)
        for step in range(STEPS):
            x = torch.randn(8, 3, 6, 6, generator=g) * 3 + 1
            x = x.to(DEVICE, dtype)
            ye, yc = eager(x), run(x)
            self.same(ye, yc, exact, f"{backend} step {step}")
            ye.square().sum().backward()
            yc.square().sum().backward()
            for (name, p), (_, q) in zip(eager.named_parameters(),
                                         compiled.named_parameters()):
                self.same(p.grad, q.grad, exact,
                          f"{backend} step {step} grad {name}")
                p.grad = q.grad = None
        for (name, b), (_, c) in zip(eager.named_buffers(),
                                     compiled.named_buffers()):
            self.same(b.double(), c.double(), exact,
                      f"{backend} buffer {name}")
        self.assertEqual(int(compiled[1].num_batches_tracked), STEPS)
        # One graph (fullgraph=True raises on a break), holding the ops.
        self.assertEqual(len(graphs), 1, graphs)
        self.assertEqual(graphs[0].count("bnps.batch_norm"), 3, graphs[0])
        # Eval mode: the running statistics, read when the graph runs.
        eager.eval()
        compiled.eval()
        x = torch.randn(8, 3, 6, 6, generator=g).to(DEVICE, dtype)
        self.same(eager(x), run(x), exact, f"{backend} eval")
        return eager, compiled, run

    def test_the_ops_are_not_captured_in_cuda_graphs(self):
        # Where this torch has the tag: reduce-overhead's CUDA graphs go
        # around the ops (each must talk to the servers every step).
        tag = getattr(torch.Tag, "cudagraph_unsafe", None)
        if tag is None:
            self.skipTest(f"torch {torch.__version__} has no cudagraph_unsafe")
        for op in (torch.ops.bnps.batch_norm_v3,
                   torch.ops.bnps.batch_norm_backward_v3):
            self.assertIn(tag, op.default.tags)

    def test_aot_eager_is_bit_equal(self):
        # The traced graph (forward and AOT autograd's backward, through
        # the ops' fake implementations) run op by op: the same bits.
        self.compare("aot_eager", "aot")

    @unittest.skipIf(DEVICE.type == "cuda", "Inductor's GPU kernels take "
                     "minutes to build: aot_eager only on CUDA")
    def test_inductor(self):
        # Inductor's own kernels for the other operations (the ReLU's
        # backward, eval mode's normalization) round differently from
        # eager, as for any model; the bnps ops run the same code.
        self.compare("inductor", "inductor", exact=False)

    def test_stream_exchange(self):
        # Float64 layers take the generic path, which queues its exchanges
        # with stream_exchange: the compiled ops queue them too.
        for backend in BACKENDS:
            with self.subTest(backend=backend):
                self.stream_exchange(backend)

    def stream_exchange(self, backend):
        queue = self.connection.exchange_queue(DEVICE)
        self.connection.drain_exchanges()
        before = queue.counts()
        self.connection.stream_exchange = True
        try:
            _, compiled, run = self.compare(
                backend, f"stream.{backend}",
                exact=EXACT and backend == "aot_eager",
                dtype=torch.float64)
            self.connection.drain_exchanges()  # CUDA: the jobs have run
            ran = queue.counts()[1] - before[1]
            # 3 layers, forward and backward, 3 steps, eager and compiled.
            self.assertEqual(ran, 2 * 3 * 2 * STEPS, queue.counts())
            self.assertEqual(queue.counts()[2], before[2])  # no fallback
            # Held until the backward pass's saved tensors go.
            self.assertEqual(custom_ops.held(), 0)
            compiled.train()
            x = torch.randn(8, 3, 6, 6, dtype=torch.float64, device=DEVICE)
            y = run(x)
            self.assertEqual(custom_ops.held(), 3)
            y.sum().backward()
            self.assertEqual(custom_ops.held(), 0)
            # A training-mode forward without a backward pass: freed with
            # its outputs.
            with torch.no_grad():
                run(x)
            self.assertEqual(custom_ops.held(), 0)
            self.connection.drain_exchanges()
        finally:
            self.connection.stream_exchange = False

if __name__ == "__main__":
    unittest.main()
