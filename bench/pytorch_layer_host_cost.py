#!/usr/bin/env python3
"""The host's cost of one bnps.torch.SyncBatchNorm layer, without the
network: a stack of --layers layers on a small input (so that the device
has next to nothing to do and the host's time shows), forward and backward,
against torch.nn.BatchNorm2d on the same input, in one process.

On a GPU a step of a model like ResNet-18 is bound by the host's time to
queue it (tools/gpu/run.sh torch: plain BatchNorm's step takes as long as
its host queues it), so every microsecond a layer adds on the host is added
to the step, 2 passes x each BN layer. This measures that microsecond count
on its own: a one-worker job under --policy (default `local`: the layer's
rules run, no exchange leaves the process; `sync` adds a round trip to
the server per layer and pass), for each route a training pass can take
(bnps/torch/_routes.py): the fused route (the default on CUDA: torch's
fused batch-norm kernels around one native call per pass; on the CPU their
CPU stand-in), the queued one (torch operations, the exchange queued on the
stream) and waiting for the device, in float32 on a GPU and float64 on the
CPU, and on the CPU the native call of float32 input.

    tools/bnps_python bench/pytorch_layer_host_cost.py              # the CPU
    python3 bench/pytorch_layer_host_cost.py --device=cuda          # a GPU

Prints one Markdown table: microseconds per layer for a forward and a
backward pass, min / median / max over --runs runs of --steps steps (the
kinds take turns every --chunk steps, so a busy machine's load falls on
all alike), the
extra over plain BatchNorm of the same dtype and the ratio to it; and from
torch's profiler, per layer, the torch operations called from Python and
(on a GPU) the kernel launches and copies. A benchmark: exits 0; 1 if a
run fails.
"""

import argparse
import os
import statistics
import sys
import time
import warnings

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.append(os.path.join(REPO, "python"))  # torch_or_debian.py

import torch_or_debian  # noqa: F401,E402  (first: torch, or Debian's python3)
import torch  # noqa: E402

import bnps.torch  # noqa: E402
from bnps.cluster import LocalCluster  # noqa: E402
from bnps.torch._routes import Fallback  # noqa: E402


class _AllocatingKernels:
    """The fused route's four kernels as one allocation each, with no
    arithmetic: on the CPU, the route's own host cost, about as a GPU's
    kernels (one torch call and launch each) leave it (the values are
    ones or garbage; only the time counts)."""

    @staticmethod
    def batch_norm_stats(x, eps):
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        return torch.ones(2, x.shape[1], dtype=acc).unbind(0)  # (valid)

    @staticmethod
    def batch_norm_elemt(x, weight, bias, mean, invstd, eps):
        return torch.empty_like(x)

    @staticmethod
    def batch_norm_backward_reduce(dy, x, mean, invstd, weight, input_g,
                                   weight_g, bias_g):
        four = torch.empty(4, x.shape[1], dtype=mean.dtype)
        return four.unbind(0)

    @staticmethod
    def batch_norm_backward_elemt(dy, x, mean, invstd, weight, sum_dy,
                                  sum_dy_xmu, count):
        return torch.empty_like(x)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--layers", type=int, default=20)
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--chunk", type=int, default=10,
                   help="steps of one kind before the next kind's turn")
    p.add_argument("--policy", default="local", choices=["local", "sync"])
    p.add_argument("--clock", choices=["thread", "wall"], default=None,
                   help="thread: this thread's CPU time (the host's own "
                   "work, which other processes' load inflates far less "
                   "than wall time; the default on the CPU); wall: "
                   "elapsed time (the default on a GPU, where the host "
                   "also waits for the device)")
    p.add_argument("--server_bin", default=None,
                   help="bnps_server (default: the wheel's, or bazel-bin's)")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("pytorch_layer_host_cost: no GPU here")
        return 0
    torch.set_num_threads(1)
    device = torch.device(args.device)
    # The queued and waiting routes' dtype; on the CPU float32 takes the
    # native call.
    dtype = torch.float64 if args.device == "cpu" else torch.float32
    inputs = {t: torch.randn(4, args.channels, 2, 2, dtype=t, device=device,
                             requires_grad=True)
              for t in {dtype, torch.float32}}

    def stack(t):
        return torch.nn.Sequential(*[
            torch.nn.BatchNorm2d(args.channels)
            for _ in range(args.layers)]).to(device, t)

    def per_layer_us(model, steps, x):
        sync = torch.cuda.synchronize if device.type == "cuda" else \
            (lambda: None)
        sync()
        start = clock()
        for _ in range(steps):
            model(x).sum().backward()
        sync()
        return (clock() - start) / steps / args.layers * 1e6

    def calls_per_layer(model, x):
        """(torch operations, CUDA runtime calls or None) per layer for a
        forward and a backward pass, from torch's profiler: the operations
        called from Python (not those they call), the kernel launches and
        copies a GPU is asked for."""
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + (
            [ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=acts) as prof:
            model(x).sum().backward()
            if device.type == "cuda":
                torch.cuda.synchronize()
        events = prof.events()
        ops = sum(1 for e in events if e.name.startswith("aten::") and (
            e.cpu_parent is None or
            not e.cpu_parent.name.startswith("aten::")))
        cuda = sum(1 for e in events
                   if e.name in ("cudaLaunchKernel", "cudaMemcpyAsync",
                                 "cudaLaunchKernelExC"))
        return (ops / args.layers,
                cuda / args.layers if device.type == "cuda" else None)

    if args.clock is None:
        args.clock = "wall" if device.type == "cuda" else "thread"
    clock = time.thread_time if args.clock == "thread" else time.perf_counter

    def short(t):
        return str(t)[6:]

    with LocalCluster(num_servers=1, num_workers=1, policy=args.policy,
                      server_bin=args.server_bin) as cluster, \
            bnps.torch.init(servers=cluster.servers, worker=0,
                            num_workers=1, set_default=False) as conn:
        # name -> (model, route, dtype, plain's name); the route as
        # use() sets it
        kinds = {}
        queue = conn.exchange_queue(device)

        from bnps.torch import _device_route
        stand_in = _device_route.CpuKernels

        def use(route):
            _device_route.CpuKernels = _AllocatingKernels \
                if route == "fused, kernels free" else stand_in
            conn.stream_exchange = route in ("fused", "queued",
                                             "fused, kernels free")
            # (The fused route's own switch: what it cannot take queues.)
            queue._bnps_unfused = "the bench's queued kind" \
                if route == "queued" else None
        for t in sorted(inputs, key=str):
            kinds[f"plain BatchNorm2d, {short(t)}"] = (stack(t), None, t,
                                                       None)
        plain = f"plain BatchNorm2d, {short(dtype)}"
        ours = bnps.torch.convert_sync_batchnorm(stack(dtype),
                                                 connection=conn)
        if device.type == "cpu":
            kinds["bnps, native call, float32"] = (
                bnps.torch.convert_sync_batchnorm(
                    stack(torch.float32), connection=conn, prefix="f32."),
                "native", torch.float32, "plain BatchNorm2d, float32")
        kinds[f"bnps, fused, one native call, {short(dtype)}"] = (
            ours, "fused", dtype, plain)
        if device.type == "cpu":  # the CPU stand-in's arithmetic left out
            kinds[f"bnps, fused, kernels as allocations, {short(dtype)}"] = (
                bnps.torch.convert_sync_batchnorm(
                    stack(dtype), connection=conn, prefix="free."),
                "fused, kernels free", dtype, plain)
        kinds[f"bnps, queued on the stream, {short(dtype)}"] = (
            ours, "queued", dtype, plain)
        kinds[f"bnps, waiting for the device, {short(dtype)}"] = (
            ours, "waiting", dtype, plain)
        times = {k: [] for k in kinds}
        warnings.simplefilter("ignore", Fallback)
        for name, (model, route, t, _) in kinds.items():
            use(route)
            per_layer_us(model, args.warmup, inputs[t])
        chunks = max(1, args.steps // args.chunk)
        for _ in range(args.runs):
            spent = dict.fromkeys(kinds, 0.0)
            for _ in range(chunks):  # the kinds in turn, a chunk each
                for name, (model, route, t, _) in kinds.items():
                    use(route)
                    spent[name] += per_layer_us(model, args.chunk, inputs[t])
            for name in kinds:
                times[name].append(spent[name] / chunks)
        calls = {}
        for name, (model, route, t, _) in kinds.items():
            use(route)
            calls[name] = calls_per_layer(model, inputs[t])
        use(None)
        conn.drain_exchanges()
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    clock_name = "the thread's CPU time" if args.clock == "thread" \
        else "wall time"
    print(f"{args.layers} layers of {args.channels} channels on "
          f"{tuple(inputs[dtype].shape)} input, {name}, torch "
          f"{torch.__version__}, one thread, policy {args.policy}, load "
          f"{load:.1f}; us per layer for a forward and a backward pass "
          f"({clock_name}), "
          f"min / median / max over {args.runs} runs of {args.steps} "
          f"steps, the kinds in turns of {args.chunk}\n")
    print("| layer | us per layer | extra over plain (median) | / plain "
          "(median) | torch operations per layer | CUDA launches and copies "
          "per layer |")
    print("|---|---|---|---|---|---|")
    for name, t in times.items():
        med = statistics.median(t)
        base = kinds[name][3]
        ref = statistics.median(times[base]) if base else None
        ops, cuda = calls[name]
        print("| %s | %.0f / %.0f / %.0f | %s | %s | %.1f | %s |" % (
            name, min(t), med, max(t),
            "" if ref is None else "%.0f" % (med - ref),
            "" if ref is None else "%.2f" % (med / ref), ops,
            "n/a" if cuda is None else "%.1f" % cuda))
    return 0


if __name__ == "__main__":
    sys.exit(main())
