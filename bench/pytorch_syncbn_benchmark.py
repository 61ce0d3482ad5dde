#!/usr/bin/env python3
"""Step time of a small PyTorch ResNet (examples/pytorch/resnet.py) with
bnps.torch.SyncBatchNorm (policy sync, real bnps_server shards on
127.0.0.1) against the same model with plain torch.nn.BatchNorm2d (local
statistics, no communication), on the CPU.

For each worker count W (--workers, default 1,2) it starts W processes of
each kind at a time (the plain ones independent, the bnps ones one sync job
with --servers shards), each timing --steps steps of forward + backward +
torch SGD after --warmup steps, one thread per process; a configuration's
step time is the median over its workers of their per-step medians. The
whole comparison runs --runs times (plain, bnps, plain, bnps, ...) and the
table gives each run's step times and the ratio bnps / plain as
min / median / max over the runs. (torch.nn.SyncBatchNorm over gloo as a
peer is measured on a GPU, by bench/pytorch_gpu_benchmark.py.)

--interleave: each of the W processes holds both models and alternates a
plain step and a bnps step, so both see the same load from the rest of the
machine (on a shared, busy machine the separate runs' step times swing by
several times from run to run, and so do their ratios).

    tools/bnps_python bench/pytorch_syncbn_benchmark.py
    tools/bnps_python bench/pytorch_syncbn_benchmark.py --workers=2 \\
        --batch=64 --width=32 --runs=5
    tools/bnps_python bench/pytorch_syncbn_benchmark.py \\
        --server_flag=--bn_port=-1        # BN on the gRPC stream
    tools/bnps_python bench/pytorch_syncbn_benchmark.py --interleave

A benchmark, not a test: it prints a table and exits 0 (1 if a process
fails).
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(REPO, "examples", "pytorch"))


def child(args):
    import torch
    import torch.nn.functional as F
    import resnet
    torch.set_num_threads(1)
    kinds = ["plain", "bnps"] if args.kind == "both" else [args.kind]
    runs = {}
    for kind in kinds:
        torch.manual_seed(0)
        model = resnet.SmallResNet(width=args.width)
        if kind == "bnps":
            import bnps.torch
            bnps.torch.init()
            model = bnps.torch.convert_sync_batchnorm(model)
        runs[kind] = (model, torch.optim.SGD(model.parameters(), lr=0.01,
                                             momentum=0.9), [])
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    for i in range(args.warmup + args.steps):
        for kind in kinds:  # plain, then bnps, when interleaved
            model, opt, times = runs[kind]
            start = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
    print("median_ms=" + ",".join(
        f"{1000 * statistics.median(runs[k][2]):.3f}" for k in kinds),
        flush=True)


def measure(args, kind, workers):
    """Median over workers of their median step time (ms); kind "both":
    (plain, bnps)."""
    from bnps.cluster import LocalCluster
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind,
           f"--batch={args.batch}", f"--width={args.width}",
           f"--steps={args.steps}", f"--warmup={args.warmup}"]
    cluster = None
    if kind in ("bnps", "both"):
        cluster = LocalCluster(num_servers=args.servers, num_workers=workers,
                               policy="sync",
                               server_flags=args.server_flag).start()
    try:
        procs = []
        for w in range(workers):
            env = cluster.worker_env(w) if cluster else dict(os.environ)
            env["OMP_NUM_THREADS"] = "1"
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        medians = []
        for p in procs:
            out, err = p.communicate(timeout=600)
            if p.returncode != 0:
                raise RuntimeError(f"{kind} worker failed:\n{err[-3000:]}")
            medians.append([float(v) for v in
                            out.strip().split("=")[1].split(",")])
        per_kind = [statistics.median(m) for m in zip(*medians)]
        return per_kind[0] if len(per_kind) == 1 else tuple(per_kind)
    finally:
        if cluster:
            cluster.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="1,2")
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--batch", type=int, default=32, help="per worker")
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--server_flag", action="append", default=[],
                   help="an extra bnps_server flag (repeatable), e.g. "
                        "--server_flag=--bn_port=-1 for BN on the gRPC "
                        "stream instead of raw TCP")
    p.add_argument("--interleave", action="store_true",
                   help="each process alternates a plain and a bnps step")
    p.add_argument("--child", choices=["plain", "bnps", "both"], dest="kind")
    args = p.parse_args()
    if args.kind:
        return child(args)
    import torch
    print(f"small ResNet width {args.width}, batch {args.batch} per worker, "
          f"{args.steps} timed steps, 1 thread per process, torch "
          f"{torch.__version__}, {os.cpu_count()} CPUs, {args.servers} "
          f"shard(s), server flags {' '.join(args.server_flag) or 'none'} "
          f"(BN over raw TCP unless --bn_port=-1), "
          f"{'interleaved' if args.interleave else 'separate'} runs, load "
          f"average {os.getloadavg()[0]:.1f}\n")
    print("| workers | plain BN ms/step (runs) | bnps SyncBN ms/step (runs) "
          "| ratio bnps/plain min / median / max |")
    print("|---|---|---|---|")
    for workers in [int(w) for w in args.workers.split(",")]:
        plain, sync = [], []
        for _ in range(args.runs):
            if args.interleave:
                p_ms, s_ms = measure(args, "both", workers)
                plain.append(p_ms)
                sync.append(s_ms)
                continue
            plain.append(measure(args, "plain", workers))
            sync.append(measure(args, "bnps", workers))
        ratios = sorted(s / q for s, q in zip(sync, plain))
        print(f"| {workers} | {' / '.join(f'{t:.2f}' for t in plain)} | "
              f"{' / '.join(f'{t:.2f}' for t in sync)} | "
              f"{ratios[0]:.2f} / {statistics.median(ratios):.2f} / "
              f"{ratios[-1]:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
