#!/usr/bin/env python3
"""bnps.torch on one GPU: step time of a ResNet-18-shaped model (or, with
--model resnet50, a ResNet-50-shaped one: 53 BatchNorm2d; 64x64 inputs, 10
classes) with P processes sharing the GPU under NVIDIA MPS, several ways,
measured in the same run:

  plain   torch.nn.BatchNorm2d, each process on its own (no communication)
  bnps    bnps.torch.SyncBatchNorm, policy sync, real bnps_server shards on
          127.0.0.1 (bnps.cluster.LocalCluster: BN over raw TCP), each
          exchange waiting for the device (BNPS_STREAM_EXCHANGE=0)
  stream  the same with the exchanges queued in the CUDA stream's order
          (the default on CUDA: the fused route, one native call per layer
          pass around torch's fused batch-norm kernels)
  torch   torch.nn.SyncBatchNorm over a gloo process group (the peer)

--precision bf16 trains under torch.autocast(bfloat16) with the model and
inputs in channels_last. --capture captures each kind's training step
(forward, backward, SGD) in a CUDA graph after the warm-up and times its
replays: plain and stream only (a waiting exchange, and gloo, run on the
host; their columns read n/a).

For each P (--procs) and per-process batch (--batches) it starts P processes
once; each holds a model of every kind and trains them in alternating
segments (--runs rounds: plain, bnps, torch, plain, ...), each segment
--steps steps of forward + backward + SGD (after --warmup steps per kind),
with torch.cuda.synchronize() per step. A segment's time is the median over
the processes of their per-step medians; a ratio is bnps (or torch) over
plain within one round, given as min / median / max over the rounds. MPS: as tools/bnps_launch.py --mps
(a running daemon, or one of this run's own, stopped at the end).

    python3 bench/pytorch_gpu_benchmark.py [--procs 2,4] [--batches 8,32]
        [--runs 3] [--steps 30] [--warmup 10] [--bin_dir DIR] [--profile F]

Needs torch with CUDA, bnps importable (the installed wheel, or
PYTHONPATH=python with the native library built), and bnps_server (from the
wheel's console script, --bin_dir, or bazel-bin). A benchmark: prints one
Markdown table and exits 0; 1 if a process fails; 0 with one line when there
is no GPU.
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tools"))  # bnps_launch_mps
KINDS = ["plain", "bnps", "stream", "torch"]


def resnet18(classes=10):
    """ResNet-18's shape (torchvision's layout: 4 stages of 2 basic blocks,
    64-512 channels, 20 BatchNorm2d), written here so no torchvision is
    needed."""
    import torch.nn as nn

    class Basic(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return self.relu(y + (x if self.down is None else self.down(x)))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
              nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Basic(cin, cout, stride), Basic(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes)]
    return nn.Sequential(*layers)


def resnet50(classes=10):
    """A ResNet-50-shaped model (torchvision's layout: 3, 4, 6, 3 bottleneck
    blocks, 256-2048 channels out, 53 BatchNorm2d), written here as
    resnet18."""
    import torch.nn as nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = 4 * width
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
                nn.Conv2d(width, width, 3, stride, 1, bias=False),
                nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False),
                    nn.BatchNorm2d(cout))
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.relu(self.body(x) +
                             (x if self.down is None else self.down(x)))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
              nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2),
                                  (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
            cin = 4 * width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


MODELS = {"resnet18": resnet18, "resnet50": resnet50}
CAPTURABLE = ("plain", "stream")


def _captured(model, opt, x, y, amp):
    """A CUDA graph of one training step of `model` on the static x and y,
    after the eager warm-up (a replay is a step)."""
    import torch
    import torch.nn.functional as F
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        with amp():
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return graph


def child(args):
    """One process: a model of each kind, trained in alternating segments of
    --steps steps (after --warmup steps each), --runs segments per kind; one
    line "<kind> <run> <median ms>" per segment."""
    import torch
    import torch.nn.functional as F
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    kinds = args.kinds.split(",")
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    models = {}
    for kind in kinds:
        torch.manual_seed(0)
        model = MODELS[args.model]()
        if kind in ("bnps", "stream"):
            import bnps.torch
            if not any(k in models for k in ("bnps", "stream")):
                bnps.torch.init()
            # Layer names of their own: the servers key layers by name.
            model = bnps.torch.convert_sync_batchnorm(model, prefix=kind + ".")
        elif kind == "torch":
            import torch.distributed as dist
            dist.init_process_group("gloo", rank=rank,
                                    world_size=int(os.environ["WORLD_SIZE"]))
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        model = model.to(dev)
        if args.precision == "bf16":
            model = model.to(memory_format=torch.channels_last)
        models[kind] = (model, torch.optim.SGD(model.parameters(), lr=0.01,
                                               momentum=0.9))
    # Where a bnps step's time goes: inside the exchanges (the client's
    # calls, a barrier of all processes each) and waiting for the device
    # before an exchange (staging.Staging.wait_s), summed over the layers.
    spent = {"exchange": 0.0, "calls": 0}
    bn_layers = []
    if "bnps" in kinds:
        client = bnps.torch.default_connection().client

        def timed(call):
            def wrapper(*a, **kw):
                start = time.perf_counter()
                try:
                    return call(*a, **kw)
                finally:
                    spent["exchange"] += time.perf_counter() - start
                    spent["calls"] += 1
            return wrapper
        # The layers' exchanges: one native call per pass each (the
        # policy, the round trip and what follows on the host).
        from bnps import _native
        _native.layer_exchange_forward = timed(_native.layer_exchange_forward)
        _native.layer_exchange_backward = timed(
            _native.layer_exchange_backward)
        bn_layers = [m for m in models["bnps"][0].modules()
                     if isinstance(m, bnps.torch.SyncBatchNorm)]

    def device_wait():
        return sum(m._staging().wait_s for m in bn_layers)
    g = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(args.batch, 3, 64, 64, generator=g).to(dev)
    y = torch.randint(0, 10, (args.batch,), generator=g).to(dev)
    if args.precision == "bf16":
        x = x.to(memory_format=torch.channels_last)

    def amp():
        if args.precision != "bf16":
            import contextlib
            return contextlib.nullcontext()
        return torch.autocast(dev.type, dtype=torch.bfloat16)
    graphs = {}

    def train(kind, steps, queued=None):
        """Each step's seconds; `queued` gets each step's host time up to
        the final wait for the device (the time to queue its work, for
        plain; where bnps's exchanges wait for the device, most of it)."""
        model, opt = models[kind]
        if kind in ("bnps", "stream"):  # one connection, the mode per kind
            conn = bnps.torch.default_connection()
            conn.stream_exchange = kind == "stream"
        times = []
        graph = graphs.get(kind)
        for _ in range(steps):
            sync()
            start = time.perf_counter()
            if graph is not None:
                graph.replay()
            else:
                opt.zero_grad()
                with amp():
                    loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
            if queued is not None:
                queued.append(time.perf_counter() - start)
            sync()
            times.append(time.perf_counter() - start)
        if kind == "stream":
            conn.drain_exchanges()  # raises what a queued exchange met
        return times

    for kind in kinds:
        train(kind, args.warmup)
        if args.capture:  # (the parent keeps the capturable kinds only)
            conn = None
            if kind == "stream":
                conn = bnps.torch.default_connection()
                conn.drain_exchanges()
            graphs[kind] = _captured(*models[kind], x, y, amp)
            train(kind, 2)  # replays before the timing
    def stream_spent():
        """(seconds in the queued exchanges, jobs run) so far: the stream
        kind's queue (its jobs run on the driver's thread)."""
        from bnps.torch import _device_route
        q = bnps.torch.default_connection()._queues.get(dev.type == "cuda")
        if q is None:
            return 0.0, 0
        return _device_route.exchange_seconds(q), q.counts()[1]

    for run in range(args.runs):
        for kind in kinds:
            if kind == "bnps":
                before = (spent["exchange"], spent["calls"], device_wait())
            if kind == "stream":
                before_stream = stream_spent()
            queued = []
            ms = 1000 * statistics.median(train(kind, args.steps, queued))
            print("%s %d %.3f" % (kind, run, ms), flush=True)
            print("queue-%s %d %.3f" % (kind, run,
                                        1000 * statistics.median(queued)),
                  flush=True)
            if kind == "stream":
                after = stream_spent()
                print("sdetail %d %.3f %.1f" % (
                    run, 1000 * (after[0] - before_stream[0]) / args.steps,
                    (after[1] - before_stream[1]) / args.steps), flush=True)
            if kind == "bnps":
                print("detail %d %.3f %.3f %.1f" % (
                    run, 1000 * (spent["exchange"] - before[0]) / args.steps,
                    1000 * (device_wait() - before[2]) / args.steps,
                    (spent["calls"] - before[1]) / args.steps), flush=True)
    for kind in [k for k in ("bnps", "stream") if k in kinds] \
            if args.profile else []:
        # Where the host's time goes in bnps steps (waiting, and queued on
        # the stream), by Python function and the C calls they make
        # (cProfile: its own overhead inflates Python-heavy rows alike).
        # Every process runs the segment (its exchanges are barriers);
        # rank 0 profiles it.
        import cProfile
        import io
        import pstats
        prof = cProfile.Profile()
        if rank == 0:
            prof.enable()
        # cProfile sees one thread: run the backward pass on this one
        # (autograd runs a CUDA backward on a thread of its own otherwise).
        single = getattr(torch.autograd, "set_multithreading_enabled", None)
        if single is not None:
            with single(False):
                train(kind, args.steps)
        else:
            train(kind, args.steps)
        if rank != 0:
            continue
        prof.disable()
        text = io.StringIO()
        stats = pstats.Stats(prof, stream=text)
        stats.sort_stats("tottime").print_stats(40)
        stats.sort_stats("cumulative").print_stats(40)
        with open(args.profile, "a") as out:
            out.write("# P=%s batch=%d, %d %s steps of rank 0\n%s\n" % (
                os.environ.get("WORLD_SIZE"), args.batch, args.steps, kind,
                text.getvalue()))
    return 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(args, kinds, procs, batch, base_env):
    """{kind: [per run: median over the processes of their median ms]}."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child",
           "--kinds=" + ",".join(kinds), "--runs=%d" % args.runs,
           "--batch=%d" % batch, "--steps=%d" % args.steps,
           "--warmup=%d" % args.warmup, "--device=" + args.device,
           "--model=" + args.model, "--precision=" + args.precision]
    if args.capture:
        cmd.append("--capture")
    if args.profile:
        cmd.append("--profile=" + os.path.abspath(args.profile))
    cluster = None
    if "bnps" in kinds or "stream" in kinds:
        from bnps.cluster import LocalCluster
        options = dict(num_servers=1, num_workers=procs, policy="sync")
        if args.bin_dir:
            options["server_bin"] = os.path.join(args.bin_dir, "server", "bnps_server")
        cluster = LocalCluster(**options).start()
    port = free_port()
    running = []
    try:
        for rank in range(procs):
            env = dict(base_env)
            if cluster:
                env.update(cluster.worker_env(rank, base=base_env))
            env.update(LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE=str(procs),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       OMP_NUM_THREADS="1")
            running.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True))
        per_proc = []
        for p in running:
            out, err = p.communicate(timeout=args.timeout_s)
            if p.returncode != 0:
                raise RuntimeError("P=%d batch=%d: a process failed:\n%s"
                                   % (procs, batch, err[-3000:]))
            got = {}
            for line in out.splitlines():
                fields = line.split()
                if fields[0] in ("detail", "sdetail"):
                    got.setdefault(fields[0], {})[int(fields[1])] = [
                        float(v) for v in fields[2:]]
                else:
                    got.setdefault(fields[0], {})[int(fields[1])] = float(fields[2])
            per_proc.append(got)
        result = {k: [statistics.median(p[k][r] for p in per_proc)
                      for r in range(args.runs)] for k in kinds}
        if "bnps" in kinds:  # [exchange ms, device wait ms, calls] a step
            result["detail"] = [statistics.median(
                p["detail"][r][i] for p in per_proc for r in range(args.runs))
                for i in range(3)]
        if "stream" in kinds:  # [exchange ms, jobs] a step
            result["sdetail"] = [statistics.median(
                p["sdetail"][r][i] for p in per_proc for r in range(args.runs))
                for i in range(2)]
        result["queue"] = {k: statistics.median(
            p["queue-" + k][r] for p in per_proc for r in range(args.runs))
            for k in kinds}
        return result
    finally:
        for p in running:
            if p.poll() is None:
                p.kill()
        if cluster:
            cluster.stop()


def spread(values):
    v = sorted(values)
    return "%.2f / %.2f / %.2f" % (v[0], statistics.median(v), v[-1])


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", default="2,4")
    p.add_argument("--batches", default="8,32", help="per process")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--mps", choices=["auto", "on", "off"], default="auto")
    p.add_argument("--bin_dir", help="where server/bnps_server is (default: "
                   "bnps.cluster's own search)")
    p.add_argument("--timeout_s", type=float, default=300)
    p.add_argument("--kinds", default=",".join(KINDS),
                   help="which of plain, bnps, stream, torch (default all)")
    p.add_argument("--device", default="cuda",
                   help="cuda; cpu only to try the script where there is no "
                   "GPU (torch's SyncBatchNorm needs CUDA)")
    p.add_argument("--profile", help="append cProfiles of rank 0's bnps "
                   "steps, waiting and queued (one more segment of each "
                   "after the timed ones), to this file, for each P and "
                   "batch")
    p.add_argument("--model", choices=sorted(MODELS), default="resnet18")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: autocast to bfloat16, channels_last")
    p.add_argument("--capture", action="store_true",
                   help="time replays of each step captured in a CUDA graph "
                   "(plain and stream only)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    import torch
    kinds = [k for k in args.kinds.split(",") if k]
    if not kinds or set(kinds) - set(KINDS) or "plain" not in kinds:
        p.error("--kinds: plain and any of bnps, stream, torch")
    if args.capture:
        kinds = [k for k in kinds if k in CAPTURABLE]
    if args.device == "cuda" and not torch.cuda.is_available():
        print("pytorch_gpu_benchmark: no CUDA device (torch %s): skipped" % torch.__version__)
        return 0
    import bnps_launch_mps
    procs_list = [int(v) for v in args.procs.split(",") if v]
    notes = []
    daemon, mps_env = bnps_launch_mps.setup(
        args.mps, "gpu" if args.device == "cuda" else "cpu", max(procs_list),
        bnps_launch_mps.System(), notes.append)
    base_env = dict(os.environ, **mps_env)
    try:
        print("%s shape, 64x64 inputs, %s, %s; %s; torch %s; %s\n" % (
            {"resnet18": "ResNet-18", "resnet50": "ResNet-50"}[args.model],
            {"fp32": "float32", "bf16": "bf16 autocast, channels_last"}[
                args.precision],
            "captured in a CUDA graph" if args.capture else "eager",
            torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU",
            torch.__version__,
            "; ".join(notes) or "MPS: not needed"))
        print("| P | batch | plain ms | bnps sync ms | bnps stream ms | "
              "torch SyncBN (gloo) ms | bnps/plain min / median / max | "
              "stream/plain min / median / max | torch/plain min / median / "
              "max |")
        print("|---|---|---|---|---|---|---|---|---|")
        details, stream_details, queues = [], [], []
        for procs in procs_list:
            for batch in [int(v) for v in args.batches.split(",") if v]:
                t = dict({k: [] for k in KINDS},
                         **measure(args, kinds, procs, batch, base_env))

                def cell(kind):
                    return "%.2f" % statistics.median(t[kind]) if t[kind] else "n/a"

                def ratio(kind):
                    if not t[kind]:
                        return "n/a"
                    return spread([b / q for b, q in zip(t[kind], t["plain"])])
                print("| %d | %d | %s | %s | %s | %s | %s | %s | %s |" % (
                    procs, batch, cell("plain"), cell("bnps"), cell("stream"),
                    cell("torch"), ratio("bnps"), ratio("stream"),
                    ratio("torch")), flush=True)
                if t.get("detail"):
                    details.append((procs, batch, t["detail"]))
                if t.get("sdetail"):
                    stream_details.append((procs, batch, t["sdetail"]))
                queues.append((procs, batch, t["queue"]))
        if details:
            print("\nWhere a bnps step's time goes (ms per step, the median "
                  "over processes and rounds): inside the exchanges (each a "
                  "barrier of all processes) and waiting for the GPU before "
                  "them.\n")
            print("| P | batch | exchanges a step | in exchanges ms | "
                  "waiting for the GPU ms |")
            print("|---|---|---|---|---|")
            for procs, batch, (exchange, wait, calls) in details:
                print("| %d | %d | %.0f | %.2f | %.2f |" % (
                    procs, batch, calls, exchange, wait))
        if stream_details:
            print("\nInside the queued exchanges (the stream kind: the "
                  "exchange jobs' time on the driver's thread, barriers "
                  "included; ms per step, the median over processes and "
                  "rounds).\n")
            print("| P | batch | exchange jobs a step | in exchanges ms |")
            print("|---|---|---|---|")
            for procs, batch, (exchange, jobs) in stream_details:
                print("| %d | %d | %.0f | %.2f |" % (procs, batch, jobs,
                                                     exchange))
        print("\nHost time to queue a step: from its start to the optimizer "
              "step's return, before the final wait for the GPU (ms, the "
              "median over processes and rounds). Plain BatchNorm queues "
              "the whole step without waiting, so the GPU runs it while the "
              "host queues; each synced layer waits for the GPU before its "
              "exchange, so there host and GPU time add up.\n")
        print("| P | batch | " + " | ".join(kinds) + " |")
        print("|---|---|" + "---|" * len(kinds))
        for procs, batch, q in queues:
            print("| %d | %d | %s |" % (procs, batch, " | ".join(
                "%.2f" % q[k] for k in kinds)))
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print("pytorch_gpu_benchmark: %s" % e, file=sys.stderr)
        return 1
    finally:
        if daemon is not None:
            daemon.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
