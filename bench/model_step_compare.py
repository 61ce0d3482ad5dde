#!/usr/bin/env python3
"""Per-step forward + backward time of the worker's model: bnps against
PyTorch on the same model, batch and thread count, measured in the same run
so that the ratio is fair. Target: bnps within 1.2x of PyTorch.

For every configuration it runs bench/model_step_benchmark (C++) and
bench/torch_model_step.py alternately, --rounds times each (bnps, torch,
bnps, torch, ...), takes the median of each side's per-run p50 and prints a
Markdown table with the ratio bnps / torch, plus the spread (min-max of the
p50s) and the phase breakdown of both sides.

The CPU matrix by default: width 16, depth 1 (the default model), batch 32 and
128, threads 1 and 2. --device=gpu runs the same on the GPU (bnps's CUDA
backend against PyTorch's cuDNN path); with no CUDA device it prints one line
saying so and exits 0, and with a PyTorch built without CUDA (Debian's
python3-torch) it reports bnps's GPU numbers alone.

PyTorch is Debian's python3-torch, run with the first interpreter that can
import it (this one, then /usr/bin/python3; --python to choose).
--baseline_binary adds another build of the benchmark (e.g. one from before a
change) to the same alternating rounds, for before/after numbers.

Run:
  python3 bench/model_step_compare.py --build
  python3 bench/model_step_compare.py --batches=32,128 --threads=1,2 \
      --extra=width=32:depth=2:batch=64:threads=2

It is a benchmark, not a test: it exits 0 when the target is missed; 1 when a
program fails or PyTorch is missing.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BINARY = os.path.join(REPO, "bazel-bin", "bench", "model_step_benchmark")
TORCH_SCRIPT = os.path.join(REPO, "bench", "torch_model_step.py")
TARGET = 1.2
MISSING = "python3-torch is not installed: run tools/setup.sh --peers"


def find_torch_python(preferred):
    """A Python interpreter that can import torch (Debian's python3-torch lives
    in /usr/bin/python3, which may not be the python3 first on PATH)."""
    candidates = [preferred] if preferred else []
    candidates += [sys.executable, "/usr/bin/python3", shutil.which("python3")]
    seen = set()
    for py in candidates:
        if not py or py in seen or not os.path.exists(py):
            continue
        seen.add(py)
        r = subprocess.run([py, "-c", "import torch"], capture_output=True)
        if r.returncode == 0:
            return py
    return None


def parse_line(out, key):
    """{'p50': .., ...} from the line starting with `key`."""
    for line in out.splitlines():
        if line.startswith(key + " "):
            fields = {}
            for tok in line.split()[1:]:
                k, _, v = tok.partition("=")
                try:
                    fields[k] = float(v)
                except ValueError:
                    fields[k] = v
            return fields
    return None


def run(cmd, key, timeout):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        msg = (r.stderr.strip() or r.stdout.strip()).splitlines()
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {r.returncode}): "
                           f"{msg[-1] if msg else ''}")
    step = parse_line(r.stdout, key + "_step_ms")
    phase = parse_line(r.stdout, key + "_phase_ms")
    if step is None:
        raise RuntimeError(f"{' '.join(cmd)} printed no {key}_step_ms line")
    return step, phase


def parse_extra(spec):
    cfg = {}
    for part in spec.split(":"):
        k, _, v = part.partition("=")
        if k not in ("width", "depth", "batch", "threads") or not v.isdigit():
            raise ValueError(f"bad --extra item {part!r} (want "
                             "width=W:depth=D:batch=B:threads=T)")
        cfg[k] = int(v)
    full = {"width": 16, "depth": 1, "batch": 32, "threads": 1}
    full.update(cfg)
    return full


def config_name(cfg):
    return (f"w{cfg['width']} d{cfg['depth']} batch {cfg['batch']} "
            f"threads {cfg['threads']}")


def median_run(p50s, phases):
    """The median of the runs' p50s and the phases of the run that has it
    (the upper middle one for an even count)."""
    order = sorted(range(len(p50s)), key=lambda i: p50s[i])
    return statistics.median(p50s), phases[order[len(order) // 2]]


def fmt_phase(p, keys):
    if not p:
        return "-"
    return " / ".join(f"{p.get(k, 0):.2f}" for k in keys)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="32,128")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--depth", type=int, default=1)
    ap.add_argument("--extra", action="append", default=[],
                    help="another config, e.g. width=32:depth=2:batch=64:threads=2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    ap.add_argument("--binary", default=BINARY)
    ap.add_argument("--baseline_binary", default=None,
                    help="another build of model_step_benchmark (e.g. before "
                         "a change), run alternately with the others and "
                         "shown in its own column")
    ap.add_argument("--python", default=None,
                    help="the Python with torch (default: found)")
    ap.add_argument("--build", action="store_true",
                    help="bazel build //bench:model_step_benchmark first "
                         "(the default configuration: .bazelrc compiles "
                         "everything at -O2, the CPU backend and the BN "
                         "kernels at -O3, so -c opt is not needed)")
    args = ap.parse_args(argv)

    py = find_torch_python(args.python)
    if py is None:
        print(MISSING, file=sys.stderr)
        return 1

    if args.build:
        cmd = ["bazel", "build", "//bench:model_step_benchmark"]
        print("+ " + " ".join(cmd), file=sys.stderr)
        if subprocess.run(cmd, cwd=REPO).returncode != 0:
            print("model_step_compare: the build failed", file=sys.stderr)
            return 1
    if not os.access(args.binary, os.X_OK):
        print(f"model_step_compare: {args.binary} is missing: run with --build "
              "(or bazel build //bench:model_step_benchmark)",
              file=sys.stderr)
        return 1

    # GPU: bnps's CUDA backend (cuDNN, cuBLAS) against PyTorch's cuDNN path;
    # skipped with one line when there is no CUDA device, and bnps alone when
    # this PyTorch has no CUDA (Debian's python3-torch is CPU-only).
    torch_on_device = True
    if args.device == "gpu":
        r = subprocess.run([args.binary, "--device=gpu", "--warmup=0",
                            "--iters=1"], capture_output=True, text=True)
        if r.returncode != 0:
            why = (r.stderr.strip().splitlines() or ["unknown error"])[-1]
            print(f"model_step_compare: GPU comparison skipped: {why}")
            return 0
        r = subprocess.run(
            [py, "-c", "import sys, torch; "
             "sys.exit(0 if torch.cuda.is_available() else 3)"],
            capture_output=True)
        if r.returncode != 0:
            torch_on_device = False
            print("model_step_compare: this PyTorch has no CUDA "
                  "(torch.cuda.is_available() is False): bnps GPU numbers "
                  "only", file=sys.stderr)

    configs = []
    for t in [int(x) for x in args.threads.split(",") if x]:
        for b in [int(x) for x in args.batches.split(",") if x]:
            configs.append({"width": args.width, "depth": args.depth,
                            "batch": b, "threads": t})
    try:
        configs += [parse_extra(e) for e in args.extra]
    except ValueError as e:
        print(f"model_step_compare: {e}", file=sys.stderr)
        return 2

    torch_device = "cuda" if args.device == "gpu" else "cpu"
    rows = []
    baseline = {}  # config name -> the baseline binary's p50s
    for cfg in configs:
        common = [f"--depth={cfg['depth']}", f"--width={cfg['width']}",
                  f"--batch={cfg['batch']}", f"--threads={cfg['threads']}",
                  f"--warmup={args.warmup}", f"--iters={args.iters}"]
        bnps_cmd = [args.binary, f"--device={args.device}"] + common
        torch_cmd = [py, TORCH_SCRIPT, f"--device={torch_device}"] + common
        base_cmd = ([args.baseline_binary] + bnps_cmd[1:]
                    if args.baseline_binary else None)
        bnps_p50, torch_p50, bnps_ph, torch_ph, base_p50 = [], [], [], [], []
        try:
            for _ in range(args.rounds):
                if base_cmd:
                    s, _ = run(base_cmd, "bnps", timeout=600)
                    base_p50.append(s["p50"])
                s, p = run(bnps_cmd, "bnps", timeout=600)
                bnps_p50.append(s["p50"])
                bnps_ph.append(p)
                if torch_on_device:
                    s, p = run(torch_cmd, "torch", timeout=600)
                    torch_p50.append(s["p50"])
                    torch_ph.append(p)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"model_step_compare: {e}", file=sys.stderr)
            return 1
        b, bp = median_run(bnps_p50, bnps_ph)
        t, tp = median_run(torch_p50, torch_ph) if torch_p50 else (None, None)
        rows.append((cfg, b, t, bnps_p50, torch_p50, bp, tp))
        if base_p50:
            baseline[config_name(cfg)] = base_p50
        print(f"# {cfg}: bnps {b:.2f} ms, torch "
              f"{'n/a' if t is None else f'{t:.2f} ms, ratio {b / t:.2f}'}",
              file=sys.stderr, flush=True)

    print(f"Per-step forward + loss + backward, {args.device}, median of "
          f"{args.rounds} alternating runs of {args.iters} steps each "
          f"(p50 per run); target bnps/torch <= {TARGET}.\n")
    print("| config | bnps ms/step | torch ms/step | ratio bnps/torch | "
          f"target {TARGET} met? | bnps p50 spread | torch p50 spread |")
    print("|---|---|---|---|---|---|---|")
    for cfg, b, t, bs, ts, _, _ in rows:
        if t is None:
            print(f"| {config_name(cfg)} | {b:.2f} | n/a | n/a | n/a | "
                  f"{min(bs):.2f}-{max(bs):.2f} | n/a |")
            continue
        ratio = b / t
        print(f"| {config_name(cfg)} | {b:.2f} | {t:.2f} | {ratio:.2f} | "
              f"{'yes' if ratio <= TARGET else 'no'} | "
              f"{min(bs):.2f}-{max(bs):.2f} | {min(ts):.2f}-{max(ts):.2f} |")
    if baseline:
        print(f"\nBaseline {args.baseline_binary} in the same rounds:\n")
        print("| config | baseline ms/step | bnps ms/step | speed-up | "
              "baseline/torch | baseline p50 spread |")
        print("|---|---|---|---|---|---|")
        for cfg, b, t, _, _, _, _ in rows:
            v = baseline[config_name(cfg)]
            m = statistics.median(v)
            bt = "n/a" if t is None else f"{m / t:.2f}"
            print(f"| {config_name(cfg)} | {m:.2f} | {b:.2f} | {m / b:.2f}x | "
                  f"{bt} | {min(v):.2f}-{max(v):.2f} |")
    print("\nPhases (ms, medians of the median run): bnps forward / loss / "
          "backward / gradients download; torch forward / loss / backward.\n")
    print("| config | bnps phases | torch phases |")
    print("|---|---|---|")
    for cfg, _, _, _, _, bp, tp in rows:
        print(f"| {config_name(cfg)} | {fmt_phase(bp, ['forward', 'loss', 'backward', 'gradients'])} "
              f"| {fmt_phase(tp, ['forward', 'loss', 'backward'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
