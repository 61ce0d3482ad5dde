#!/usr/bin/env python3
"""A PyTorch ResNet-style model on Fashion-MNIST, trained by W worker
processes against a local bnps cluster: bnps SyncBatchNorm for the BN layers
(convert_sync_batchnorm, one line) and the servers' SGD for the parameters
(bnps.torch.ParameterServerOptimizer). Prints the test accuracy.

    tools/bnps_python examples/pytorch/train.py                  # 4 workers, 2 shards, sync
    tools/bnps_python examples/pytorch/train.py --policy async --staleness 2
    tools/bnps_python examples/pytorch/train.py --policy local
    tools/bnps_python examples/pytorch/train.py --policy recal
    tools/bnps_python examples/pytorch/train.py --train_examples 60000 --epochs 3

    # under torchrun, servers in their own processes (or pods):
    BNPS_SERVERS=host:port,host:port torchrun --nproc_per_node=4 train.py
    # under torchrun, one server per node started by its local rank 0:
    torchrun --nproc_per_node=4 train.py

Run by hand (no BNPS_WORKER or RANK in the environment) it starts the
cluster (bnps.cluster: --servers shard servers on 127.0.0.1) and W copies of
itself as workers, prefixing their output with [wN]. Under a launcher
(torchrun's RANK, or BNPS_WORKER) it is one worker: with BNPS_SERVERS it
connects to those servers, without them it joins a gloo process group and
each node's local rank 0 starts a server with the flags below
(bnps.torch.init(start_local_server=True)). Each worker trains on every W-th
of the first --train_examples images. After training the running statistics are
settled as the policy says (sync: already identical; async: the servers';
local: averaged over workers; recal: recalibrated over every worker's data),
and worker 0 evaluates on --test_examples test images in eval mode.
"""

import argparse
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import resnet  # noqa: E402


def parse_args():
    from bnps.cluster import POLICIES
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--policy", default="sync", choices=POLICIES)
    p.add_argument("--staleness", type=int, default=2, help="async bound")
    p.add_argument("--learning_rate", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--batch_size", type=int, default=32, help="per worker")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--train_examples", type=int, default=16384,
                   help="first N training images (of 60000)")
    p.add_argument("--test_examples", type=int, default=2000)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--recalibrate", action="store_true",
                   help="also recalibrate the running statistics over every "
                        "worker's data (any policy) and print that accuracy")
    p.add_argument("--recal_examples", type=int, default=2048,
                   help="per worker, for recal and --recalibrate")
    p.add_argument("--timeout_s", type=float, default=900)
    return p.parse_args()


def server_flags(args):
    return [f"--learning_rate={args.learning_rate}",
            f"--momentum={args.momentum}", f"--staleness={args.staleness}"
            if args.policy == "async" else "--staleness=0"]


def launch(args):
    from bnps.cluster import LocalCluster
    flags = server_flags(args)
    start = time.monotonic()
    with LocalCluster(num_servers=args.servers, num_workers=args.workers,
                      policy=args.policy, job="pytorch-example",
                      server_flags=flags) as cluster:
        print(f"cluster: {args.servers} shards at {cluster.servers}, policy "
              f"{args.policy}, {args.workers} workers", flush=True)
        procs = []
        for w in range(args.workers):
            env = cluster.worker_env(w)
            env.setdefault("OMP_NUM_THREADS", "1")
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__)] + sys.argv[1:],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, bufsize=1))
        failed = False
        import selectors
        sel = selectors.DefaultSelector()
        for w, p in enumerate(procs):
            sel.register(p.stdout, selectors.EVENT_READ, w)
        open_streams = len(procs)
        deadline = time.monotonic() + args.timeout_s
        while open_streams and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=1.0):
                line = key.fileobj.readline()
                if not line:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                    continue
                print(f"[w{key.data}] {line}", end="", flush=True)
        for w, p in enumerate(procs):
            try:
                rc = p.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                rc = "timeout"
            if rc != 0:
                print(f"worker {w} failed: {rc}", file=sys.stderr)
                failed = True
    print(f"wall_s={time.monotonic() - start:.1f}")
    return 1 if failed else 0


def work(args):
    import bnps.torch
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if os.environ.get("BNPS_SERVERS"):
        connection = bnps.torch.init()
    else:  # torchrun without servers: one per node, from its local rank 0
        import torch.distributed as dist
        dist.init_process_group("gloo")
        connection = bnps.torch.init(start_local_server=True,
                                     policy=args.policy, job="pytorch-example",
                                     server_flags=server_flags(args))
    w, nw = connection.worker, connection.num_workers
    if connection.node_server is not None and w == 0:
        print(f"servers (one per node): {connection.node_server.servers}",
              flush=True)
    x, y = resnet.fashion_mnist("train", args.train_examples)
    x, y = x[w::nw], y[w::nw]
    torch.manual_seed(args.seed)  # the same initial model everywhere
    model = resnet.SmallResNet(width=args.width)
    model = bnps.torch.convert_sync_batchnorm(model)   # the one-line switch
    opt = bnps.torch.ParameterServerOptimizer(model.named_parameters())
    model.train()
    g = torch.Generator().manual_seed(args.seed + 1000 * w)
    steps = 0
    start = time.monotonic()
    for epoch in range(args.epochs):
        order = torch.randperm(len(x), generator=g)
        # Every worker runs the same number of steps (sync needs it).
        per_epoch = args.train_examples // nw // args.batch_size
        loss_sum = correct = seen = 0
        for i in range(per_epoch):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            xb, yb = x[idx], y[idx]
            with connection.step():
                opt.zero_grad()
                out = model(xb)
                loss = F.cross_entropy(out, yb)
                loss.backward()
                opt.step(num_samples=len(xb))
            steps += 1
            loss_sum += float(loss) * len(xb)
            correct += int((out.argmax(1) == yb).sum())
            seen += len(xb)
            if w == 0 and (i + 1) % 20 == 0:
                print(f"epoch {epoch} step {i + 1}/{per_epoch} loss "
                      f"{loss_sum / seen:.4f} train_acc {correct / seen:.4f} "
                      f"{seen / (time.monotonic() - start):.0f} img/s",
                      flush=True)
    train_s = time.monotonic() - start
    # Settle the running statistics as the policy says (a barrier for
    # local and recal: every worker takes part).
    recal_loader = [x[i:i + 256]
                    for i in range(0, min(len(x), args.recal_examples), 256)]
    accuracies = {}
    if connection.policy == "recal":
        bnps.torch.recalibrate(model, recal_loader)
    else:
        bnps.torch.sync_running_stats(model)
        if args.recalibrate:
            accuracies["test_accuracy"] = evaluate(model, args) if w == 0 else 0
            bnps.torch.recalibrate(model, recal_loader)
    key = "recal_accuracy" if "test_accuracy" in accuracies else "test_accuracy"
    accuracies[key] = evaluate(model, args) if w == 0 else 0
    if w == 0:
        print(f"result: policy={connection.policy} workers={nw} steps={steps} "
              f"train_s={train_s:.1f} " +
              " ".join(f"{k}={v:.4f}" for k, v in accuracies.items()),
              flush=True)
    connection.finish()  # the job ends once every worker finished
    connection.close()  # with start_local_server: a barrier, then it stops
    return 0


def evaluate(model, args):
    """Accuracy on the first --test_examples test images, in eval mode (no
    traffic to the servers)."""
    model.eval()
    xt, yt = resnet.fashion_mnist("test", args.test_examples)
    with torch.no_grad():
        correct = sum(int((model(xt[i:i + 500]).argmax(1) == yt[i:i + 500])
                          .sum()) for i in range(0, len(xt), 500))
    model.train()
    return correct / len(xt)


def main():
    args = parse_args()
    if os.environ.get("BNPS_WORKER") is None and \
            os.environ.get("RANK") is None:
        return launch(args)
    return work(args)


if __name__ == "__main__":
    sys.exit(main())
