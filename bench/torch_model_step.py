#!/usr/bin/env python3
"""The worker's model (nn/model.h) in PyTorch, timed like
bench/model_step_benchmark.cc: forward + loss + backward per step.

Architecture (as nn/model.cc builds it):
  stem     conv3x3(in -> w, pad 1, no bias) - BN - ReLU - maxpool 2x2
  stage 1  `depth` blocks: conv3x3 - BN - ReLU - conv3x3 - BN, + x, ReLU (w)
  down     conv3x3 stride 2 pad 1 (w -> 2w, no bias) - BN - ReLU
  stage 2  `depth` blocks at 2w
  head     global average pool - linear(2w -> classes, with bias)
  loss     cross-entropy, reduction='sum' (bnps's gradients are of the sum)

Train mode (BN with batch statistics, running stats updated), gradients set
to None before each step, no optimizer step: what the C++ side does (its
Gradients() download is included there; here the gradients stay in place).
--device=cuda times on the GPU (synchronizing at the end of every step).

Output (stdout):
  torch_config device=cpu depth=1 width=16 batch=32 threads=1 weights=...
  torch_step_ms p50=<> mean=<> min=<>
  torch_phase_ms forward=<> loss=<> backward=<> total=<>
Exit status 0; 1 when torch is missing or the device is not available.
"""

import argparse
import statistics
import sys
import time

MISSING = "python3-torch is not installed: run tools/setup.sh --peers"


def build_model(torch, depth, width, in_channels=1, classes=10, eps=1e-5,
                momentum=0.1):
    nn = torch.nn

    def conv(cin, cout, stride=1):
        return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)

    def bn(c):
        return nn.BatchNorm2d(c, eps=eps, momentum=momentum)

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv1 = conv(c, c)
            self.bn1 = bn(c)
            self.conv2 = conv(c, c)
            self.bn2 = bn(c)

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(y + x)

    w = width
    layers = [conv(in_channels, w), bn(w), nn.ReLU(), nn.MaxPool2d(2, 2)]
    layers += [Block(w) for _ in range(depth)]
    layers += [conv(w, 2 * w, stride=2), bn(2 * w), nn.ReLU()]
    layers += [Block(2 * w) for _ in range(depth)]
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * w, classes)]
    return nn.Sequential(*layers)


def summary(v):
    return statistics.median(v), statistics.fmean(v), min(v)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--depth", type=int, default=1)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "gpu"])
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print(MISSING, file=sys.stderr)
        return 1
    device = "cuda" if args.device in ("cuda", "gpu") else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print("torch_model_step: no CUDA device (torch.cuda.is_available() is "
              "False)", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if device == "cuda":
        # FP32 without TF32, as the bnps CUDA backend.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = False

    model = build_model(torch, args.depth, args.width).to(device)
    model.train()
    weights = sum(p.numel() for p in model.parameters())
    images = torch.randn(args.batch, 1, 28, 28, device=device)
    labels = torch.randint(0, 10, (args.batch,), device=device)
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def step(phases=None):
        t0 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        logits = model(images)
        sync()
        t1 = time.perf_counter()
        loss = loss_fn(logits, labels)
        sync()
        t2 = time.perf_counter()
        loss.backward()
        sync()
        t3 = time.perf_counter()
        if phases is not None:
            phases[0].append((t1 - t0) * 1e3)
            phases[1].append((t2 - t1) * 1e3)
            phases[2].append((t3 - t2) * 1e3)

    print(f"torch_config device={device} torch={torch.__version__} "
          f"depth={args.depth} width={args.width} batch={args.batch} "
          f"threads={torch.get_num_threads()} weights={weights} "
          f"warmup={args.warmup} iters={args.iters}")
    for _ in range(args.warmup):
        step()
    sync()
    times = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    p50, mean, mn = summary(times)
    print(f"torch_step_ms p50={p50:.4f} mean={mean:.4f} min={mn:.4f}")
    phases = ([], [], [])
    for _ in range(args.iters):
        step(phases)
    f, l, b = (statistics.median(p) for p in phases)
    print(f"torch_phase_ms forward={f:.4f} loss={l:.4f} backward={b:.4f} "
          f"total={f + l + b:.4f}")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
