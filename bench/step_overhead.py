#!/usr/bin/env python3
"""What a training step costs under each policy against local BN, measured on
this machine with the real server and worker binaries (the figure of merit
for choosing a policy).

For every W (workers) and per-worker batch, the tool starts S shard servers
(bnps_server --port=0) and W workers (bnps_worker) once per policy -- local,
sync, async, recal, and sync with BN on the gRPC stream rather than raw TCP,
back to back -- each process pinned to a physical core of its own (all its
hyperthreads) where there are enough, else to a CPU of its own
(os.sched_setaffinity, as `taskset -c` does); where the CPUs do not suffice,
processes share them round-robin; the table says which (--cores_each=even
shares the physical cores out evenly instead of one each). Each
worker trains --warmup + --steps steps (synthetic data by default, one model
thread) and reports the split of the timed steps (its --timing_warmup_steps
leaves the warm-up out): compute, BN sync, gradient sync. Beside it, the
BN round trip of ps_benchmark (bnps against the bare gRPC barrier "star",
the echo and the raw-TCP barrier, C = 256, W = 2) measured in the same run.

Usage:
    python3 bench/step_overhead.py --build --runs 3   # or, built:
    python3 bench/step_overhead.py [--runs 3] [--workers 1,2]
        [--batches 8,32] [--steps 300] [--warmup 50] [--servers 1]
        [--policies local,sync,async,recal,sync-stream,sync-colocated]
        [--data synthetic]
        [--bin_dir DIR] [--round_trip on|off] [--build]
        [--device cpu|gpu] [--mps auto|on|off] [--cores_each one|even]
        [--worker_flag=--bn_spin_us=0 ...] [--server_flag=--bn_port=0 ...]

Output (Markdown, parsed by update_performance_md.py):
  ## Step time against local   one row per (W, batch, policy): ms per step
                                 and its split (medians over the runs), the
                                 ratio to local (median of each run's ratio)
                                 and where the processes ran
  ## Ratio to local over runs   min / median / max of each ratio
  ## BN round trip beside it     ps_benchmark's row (medians over the runs)
                                 and its ratios' min / median / max

--device: where the workers train (default cpu, also on a machine with a
GPU); with --device=gpu the workers share the machine's GPUs (LOCAL_RANK =
their index) and, where they would share one, NVIDIA MPS as the launcher
uses it (--mps, tools/bnps_launch_mps.py).

A cell is the mean over the W workers of seconds / timed steps. Standard
library only; runs under any python3 (3.5+). Exit status: 0, 1 when a
process failed (its log's tail on stderr), 2 for bad usage.
"""

from __future__ import print_function

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# tools/bnps_launch_mps.py: MPS for workers that share a GPU.
sys.path.insert(0, os.path.join(REPO, "tools"))
import bnps_launch_mps  # noqa: E402  (needs the path above)
# bnps.cluster (pure Python): the servers' command lines, their "listening
# on" lines, the policies, and the servers' --keep_awake_us where every
# process has a core of its own, as LocalCluster starts them.
sys.path.insert(0, os.path.join(REPO, "python"))
from bnps import cluster  # noqa: E402
from bnps.cluster import KEEP_AWAKE_US, parse_listening  # noqa: E402
# local first: the baseline the others' overhead is measured against.
POLICIES = ["local"] + [p for p in cluster.POLICIES if p != "local"]
# Co-located aggregation: the W workers' batches in ONE bnps_worker process
# with --replicas=W (one thread each, pinned to the W workers' cores), the BN
# statistics combined in the process and sent once. Only for W >= 2.
COLOCATED = "sync-colocated"
# sync with the BN traffic on the gRPC stream (servers without --bn_port), as
# a job with TLS runs it.
STREAM = "sync-stream"
VARIANTS = [STREAM, COLOCATED]

STEP_HEADING = "## Step time against local"
STEP_HEADER = ["W", "batch", "policy", "ms/step", "compute", "BN sync",
               "grad sync", "ratio to local", "cores"]
RATIO_HEADING = "## Ratio to local over runs"
RATIO_HEADER = ["W", "batch", "policy", "min", "median", "max"]
RT_HEADING = "## BN round trip beside it"
RT_HEADER = ["C", "W", "bnps p50 us", "star p50 us", "echo p50 us",
             "tcp p50 us", "bnps/star", "bnps/echo", "bnps/tcp",
             "bnps/star min", "bnps/star max"]


# The (W, batch, policy) rows docs/performance.md expects of both step tables.
STEP_ROWS = [(w, b, p) for w in ("1", "2") for b in ("8", "32")
             for p in POLICIES + [STREAM]] + [("2", b, COLOCATED)
                                             for b in ("8", "32")]

# For update_performance_md.py: the tables docs/performance.md takes from
# this tool's output (its TABLES format), what they measure, how to read them.
DOC_TABLES = [
    {
        "id": "step_overhead",
        "title": "Step overhead: sync, async and recal against local",
        "log": "step_overhead.txt",
        "heading": STEP_HEADING,
        "header": STEP_HEADER,
        "keys": [0, 1, 2],
        "rows": STEP_ROWS,
        "numbers": [3, 4, 5, 6, 7],
        "ratios": [],
    },
    {
        "id": "step_ratio",
        "log": "step_overhead.txt",
        "heading": RATIO_HEADING,
        "header": RATIO_HEADER,
        "keys": [0, 1, 2],
        "rows": STEP_ROWS,
        "numbers": [3, 4, 5],
        "ratios": [],
    },
    {
        "id": "step_round_trip",
        "log": "step_overhead.txt",
        "heading": RT_HEADING,
        "header": RT_HEADER,
        "keys": [0, 1],
        "rows": [("256", "2")],
        "numbers": list(range(2, 11)),
        "ratios": [],
    },
]

DOC_WHAT = """\
What a user pays per training step for each policy, against `local` BN
(gradients still go through the servers; BN statistics stay on the worker)
measured in the same run: `bench/step_overhead.py` starts S = 1
shard server and W worker processes (`bnps_server`, `bnps_worker`) for each
policy in turn, each process pinned to a physical core of its own (all its
hyperthreads, so that no other process's busy-waiting slows it as a sibling)
where the machine has enough, else to a CPU of its own (the last column says
which, and where they share), and each worker trains
a warm-up that is left out, then the timed steps (synthetic 28x28 data, the
default model, one model thread). The servers serve BN over raw TCP as the
launcher starts them (`--bn_port=0`, docs/server.md); where every process
has a core, the workers poll for BN answers 1000 us before blocking
(`--bn_spin_us=-1`) and the server keeps its core awake between messages
(`--keep_awake_us=2000`); the settings line says which. Cells are milliseconds per
step, the mean over the workers, split as the worker reports it: compute
(data, forward, backward), BN sync (the blocking BN exchanges: 12 a step
for this model) and grad sync (push, pull, clocks). The second table gives each ratio's
spread over the runs; the third puts `ps_benchmark`'s BN round trip
(C = 256, W = 2: bnps against the bare gRPC barrier, the echo and the same
barrier on raw TCP) beside it, measured in each run."""

DOC_READING = """\
"ratio to local" is the policy's step time over local's in the same run
(the median of the runs' ratios): the price of the policy. sync pays the BN
exchanges on top of compute even at W = 1, where there is no peer to wait
for, so its BN sync column is the latency of the round trip times the
exchanges per step. async exchanges BN statistics without waiting for the
slowest worker; recal exchanges none during training (its recalibration
after training is not in the step). Where processes share cores, a worker
waiting for a peer gives its core to a process that runs, so ratios can
fall below 1 and the figures time the scheduler as much as bnps.
`sync-stream` is sync with its BN traffic on the gRPC stream (servers
without `--bn_port`), as a job with TLS runs it: against `sync`, what the
raw-TCP BN connection saves. `sync-colocated` (W >= 2) is sync with the W workers' batches in one
`bnps_worker --replicas=W` process (one thread per replica, on the same
cores): the replicas combine their BN statistics and gradients in the
process and cross to the server once per layer, so each barrier waits for
one contribution instead of W (docs/worker.md)."""


def doc_summary(tables):
    """One paragraph of figures from the checked tables (id -> Table)."""
    ratio = tables["step_ratio"]
    parts = []
    for row in ratio.rows:
        if row[2] in ("sync", STREAM):
            parts.append("W = {}, batch {}{}: {}".format(
                row[0], row[1], ", BN on the gRPC stream" if row[2] == STREAM
                else "", row[4]))
    rt = dict(zip(RT_HEADER, tables["step_round_trip"].rows[0]))
    return ("In this run, sync / local (median over runs): {}. BN round "
            "trip at C = {}, W = {}: bnps {} us against the bare gRPC "
            "barrier's {} us (bnps/star {}) and the raw-TCP barrier's {} us "
            "(bnps/tcp {}).".format(
                "; ".join(parts), rt["C"], rt["W"], rt["bnps p50 us"],
                rt["star p50 us"], rt["bnps/star"], rt["tcp p50 us"],
                rt["bnps/tcp"]))


class Failure(Exception):
    pass


def median(values):
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2.0


def usable_cores():
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def physical_cores(cpus, sysfs="/sys/devices/system/cpu"):
    """`cpus` grouped by physical core: the usable hyperthread siblings of
    each core together (Linux's topology/thread_siblings_list), in the
    order of their first CPU; one group per CPU where sysfs does not say."""
    groups = {}
    for c in cpus:
        try:
            with open("{}/cpu{}/topology/thread_siblings_list".format(
                    sysfs, c)) as f:
                key = f.read().strip()
        except (IOError, OSError):
            key = "cpu{}".format(c)
        groups.setdefault(key, []).append(c)
    return list(groups.values())


def placement(servers, workers, groups, cores_each="one"):
    """(server cores, worker cores, shared, where): each process's CPUs (a
    set), whether processes share CPUs, and the table's 'cores' cell.
    `groups` are the usable CPUs by physical core (physical_cores). Where
    there are enough physical cores, each process gets one whole (its
    other threads -- gRPC's, CUDA's -- run on the sibling, and no other
    process's busy-waiting slows it as a sibling hyperthread would), or with
    `cores_each` "even" an even share of them (whole cores, the servers
    taking the odd ones: a process's helper threads -- gRPC's, CUDA's, a
    BN poll -- then run beside its main thread, as on an unpinned machine
    with cores to spare); else a CPU of its own, siblings of one core last;
    else CPUs round-robin."""
    n = servers + workers
    cpus = [g[i] for i in range(max(map(len, groups))) for g in groups
            if i < len(g)]
    if n <= len(groups):
        share, extra = (len(groups) // n, len(groups) % n) \
            if cores_each == "even" else (1, 0)
        assigned, first = [], 0
        for i in range(n):
            take = share + (1 if i < extra else 0)
            assigned.append(set().union(*groups[first:first + take]))
            first += take
        unit = ("physical core" if any(len(g) > 1 for g in groups)
                else "core")
        where = ("own {} each".format(unit) if share == 1 and not extra
                 else "own {}{} {}s each".format(
                     share, "-{}".format(share + 1) if extra else "", unit))
    else:
        assigned = [{cpus[i % len(cpus)]} for i in range(n)]
        where = "own core each"
    shared = n > len(cpus)
    if shared:
        where = "shared: {} processes on {} cores".format(n, len(cpus))
    return assigned[:servers], assigned[servers:], shared, where


def pinned(core):
    """A preexec_fn pinning to `core` (an int, or a set of them)."""
    if core is None or not hasattr(os, "sched_setaffinity"):
        return None
    cores = set(core) if isinstance(core, (set, frozenset)) else {core}
    return lambda: os.sched_setaffinity(0, cores)


def tail(path, n=15):
    try:
        with open(path) as f:
            return "".join(f.readlines()[-n:])
    except (IOError, OSError):
        return ""


def stop(procs):
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.time() + 5
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def start_server(args, shard, policy, workers, core, shared, out_dir,
                 stream=False):
    """A server with BN over raw TCP and a Unix socket (bnps_server
    --bn_port=0 --bn_unix_socket=auto, as the launcher starts servers;
    workers on this host take the socket) and, where every process has a
    core of its own, its core kept awake while messages come
    (--keep_awake_us); a --server_flag replaces the default of its name and
    adds the rest. `stream` (sync-stream) keeps BN on the gRPC stream."""
    log = os.path.join(out_dir, "s{}.log".format(shard))
    keep_awake = [] if shared else cluster.keep_awake_flags(
        args.servers, workers, KEEP_AWAKE_US, args.server_flag)
    cmd = cluster.server_command(
        os.path.join(args.bin_dir, "server", "bnps_server"), host="127.0.0.1",
        port=0, shard=shard, num_shards=args.servers, num_workers=workers,
        policy=policy, bn_port=-1 if stream else 0, bn_unix=not stream,
        flags=keep_awake + args.server_flag)
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                             preexec_fn=pinned(core))
    deadline = time.time() + 30
    while time.time() < deadline:
        address = parse_listening(tail(log, 50))
        if address:
            return p, address
        if p.poll() is not None:
            raise Failure("bnps_server exited with status {}:\n{}".format(
                p.returncode, tail(log)))
        time.sleep(0.02)
    p.kill()
    raise Failure("bnps_server printed no address in 30 s:\n" + tail(log))


def measure_policy(args, policy, workers, batch, out_dir):
    """Mean over workers of (total, compute, bn, grad) seconds per step."""
    s_cores, w_cores, shared, where = placement(
        args.servers, workers, args.core_groups, args.cores_each)
    # sync-colocated: one process holds the W workers' replicas.
    replicas = workers if policy == COLOCATED else 1
    if replicas > 1:
        policy, batch, workers = "sync", batch * replicas, 1
        w_cores = [set().union(*w_cores)]
    stream = policy == STREAM
    if stream:
        policy = "sync"
    procs = []
    try:
        addresses = []
        for s in range(args.servers):
            p, address = start_server(args, s, policy, workers, s_cores[s],
                                      shared, out_dir, stream)
            procs.append(p)
            addresses.append(address)
        reports, logs, wprocs = [], [], []
        for w in range(workers):
            report = os.path.join(out_dir, "w{}.json".format(w))
            log = os.path.join(out_dir, "w{}.log".format(w))
            if os.path.exists(report):
                os.remove(report)
            cmd = [os.path.join(args.bin_dir, "worker", "bnps_worker"),
                   "--servers=" + ",".join(addresses),
                   "--worker={}".format(w), "--num_workers={}".format(workers),
                   "--policy=" + policy, "--batch_size={}".format(batch),
                   "--max_steps={}".format(args.warmup + args.steps),
                   "--timing_warmup_steps={}".format(args.warmup),
                   "--epochs=1000000", "--data=" + args.data, "--threads=1",
                   "--eval=none", "--progress=none", "--report=" + report,
                   "--replicas={}".format(replicas),
                   "--device=" + args.device] + args.worker_flag
            env = dict(os.environ, LOCAL_RANK=str(w), **args.worker_env)
            with open(log, "w") as f:
                p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                     env=env, preexec_fn=pinned(w_cores[w]))
            procs.append(p)
            wprocs.append(p)
            reports.append(report)
            logs.append(log)
        deadline = time.time() + args.timeout_s
        for p, log in zip(wprocs, logs):
            try:
                rc = p.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                raise Failure("{} W={} batch={}: a worker ran past {} s:\n{}"
                              .format(policy, workers, batch, args.timeout_s,
                                      tail(log)))
            if rc != 0:
                raise Failure("{} W={} batch={}: bnps_worker exited with "
                              "status {}:\n{}".format(policy, workers, batch,
                                                      rc, tail(log)))
    finally:
        stop(procs)
    sums = [0.0, 0.0, 0.0, 0.0]
    for report in reports:
        with open(report) as f:
            r = json.load(f)
        steps = r.get("timed_steps", 0)
        if steps <= 0:
            raise Failure("{}: no timed steps (is bnps_worker older than "
                          "--timing_warmup_steps?)".format(report))
        sec = r["seconds"]
        for i, key in enumerate(("total", "compute", "bn_sync", "grad_sync")):
            sums[i] += sec[key] / steps / workers
    return sums, (shared, where)


def rt_spin_us(args):
    """bnps_worker's --bn_spin_us=-1 rule for the round trip's processes
    (W workers of one thread, one server), so it polls as the step would."""
    return 1000 if (os.cpu_count() or 1) >= args.rt_workers + 1 else 0


def measure_round_trip(args):
    """(bnps, star, echo, tcp) p50 microseconds from one ps_benchmark run."""
    cmd = [os.path.join(args.bin_dir, "bench", "ps_benchmark"),
           "--tables=bn", "--systems=bnps,star,echo,tcp",
           "--channels={}".format(args.rt_channels),
           "--workers={}".format(args.rt_workers), "--rounds=1",
           "--bn_spin_us={}".format(rt_spin_us(args))]
    if args.quick_round_trip:
        cmd.append("--quick")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         universal_newlines=True)
    out, err = p.communicate(timeout=600)
    if p.returncode != 0:
        raise Failure("ps_benchmark exited with status {}:\n{}".format(
            p.returncode, err[-3000:]))
    header = None
    for line in out.splitlines():
        if not line.startswith("|"):
            continue
        row = [c.strip() for c in line.strip().strip("|").split("|")]
        if "bnps p50" in row:
            header = row
            continue
        if header and len(row) == len(header) and row[0] == str(
                args.rt_channels) and row[1] == str(args.rt_workers):
            return tuple(float(row[header.index(k)].rstrip("*"))
                         for k in ("bnps p50", "star p50", "echo p50",
                                   "tcp p50"))
    raise Failure("ps_benchmark printed no C={} W={} row:\n{}".format(
        args.rt_channels, args.rt_workers, out[-3000:]))


def fmt_ms(seconds):
    return "{:.3f}".format(seconds * 1000)


def report(args, results, shared, rts, out):
    """Prints the tables. results[(W, b, policy)] = list of per-run
    (total, compute, bn, grad); rts = list of per-run (bnps, star, echo,
    tcp)."""
    cores = len(args.cores)
    w = out.write
    w("# step_overhead\n\n")
    w("machine: {} usable cores ({} physical), {}; load average {}\n".format(
        cores, len(args.core_groups), cpu_model(), load_average()))
    w("settings: S = {} shard server(s); {} timed steps after {} warm-up "
      "steps per worker; --data={}, --device={}, model depth 1 width 16, 1 model thread; "
      "{} run(s), the policies of a (W, batch) back to back in each; "
      "each process pinned to a physical core (all its hyperthreads) where "
      "there are enough, else to a CPU (sched_setaffinity; round-robin where "
      "there are too few; see 'cores'); worker flags: "
      "{}; server flags: {}; round trip: bnps workers poll {} us before "
      "blocking (the workers' --bn_spin_us=-1 rule)\n\n".format(
          args.servers, args.steps, args.warmup, args.data,
          args.device + (" ({})".format(args.mps_note) if args.mps_note else ""),
          args.runs,
          " ".join(args.worker_flag) or "defaults (--bn_spin_us=-1: poll "
          "1000 us where every process has a core)",
          "--bn_port=0 --bn_unix_socket=auto (BN over a Unix socket, TCP "
          "beside it), and --keep_awake_us={} where every "
          "process has a core{}".format(
              KEEP_AWAKE_US, "; then " + " ".join(args.server_flag)
              if args.server_flag else ""),
          rt_spin_us(args)))
    w(STEP_HEADING + " (ms per step, mean over workers; median over runs)\n\n")
    w("| " + " | ".join(STEP_HEADER) + " |\n")
    w("|---:|---:|:---|---:|---:|---:|---:|---:|:---|\n")
    ratios = {}
    for W in args.workers:
        for b in args.batches:
            local = results.get((W, b, "local"))
            for policy in args.policies:
                if (W, b, policy) not in results:
                    continue
                runs = results[(W, b, policy)]
                cells = [median([r[i] for r in runs]) for i in range(4)]
                if local:
                    ratios[(W, b, policy)] = [
                        r[0] / l[0] for r, l in zip(runs, local)]
                    ratio = "{:.2f}".format(median(ratios[(W, b, policy)]))
                else:
                    ratio = "-"
                where = shared[W][1]
                if policy == COLOCATED:
                    where = "1 process, {} replicas; ".format(W) + where
                w("| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n".format(
                    W, b, policy, *([fmt_ms(c) for c in cells] +
                                    [ratio, where])))
    w("\n" + RATIO_HEADING + " (each run's policy / that run's local)\n\n")
    w("| " + " | ".join(RATIO_HEADER) + " |\n")
    w("|---:|---:|:---|---:|---:|---:|\n")
    for W in args.workers:
        for b in args.batches:
            for policy in args.policies:
                r = ratios.get((W, b, policy))
                if not r:
                    continue
                w("| {} | {} | {} | {:.2f} | {:.2f} | {:.2f} |\n".format(
                    W, b, policy, min(r), median(r), max(r)))
    if rts:
        w("\n" + RT_HEADING + " (ps_benchmark, microseconds, median over "
          "runs)\n\n")
        w("| " + " | ".join(RT_HEADER) + " |\n")
        w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
        bs = [r[0] / r[1] for r in rts]
        be = [r[0] / r[2] for r in rts]
        bt = [r[0] / r[3] for r in rts]
        w("| {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.2f} | {:.2f} | "
          "{:.2f} | {:.2f} | {:.2f} |\n".format(
              args.rt_channels, args.rt_workers,
              median([r[0] for r in rts]), median([r[1] for r in rts]),
              median([r[2] for r in rts]), median([r[3] for r in rts]),
              median(bs), median(be), median(bt), min(bs), max(bs)))


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except (IOError, OSError):
        pass
    return "unknown CPU"


def load_average():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except (IOError, OSError):
        return "unknown"


def int_list(text):
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("want positive integers: " + text)
    return values


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Step time of sync, async and recal against local.")
    p.add_argument("--runs", type=int, default=1,
                   help="measure everything this many times (the tables give "
                   "medians and min/median/max of the ratios)")
    p.add_argument("--workers", type=int_list, default=[1, 2])
    p.add_argument("--batches", type=int_list, default=[8, 32],
                   help="per-worker batch sizes")
    p.add_argument("--policies", default=",".join(POLICIES + VARIANTS),
                   help="of local, sync, async, recal, " + STREAM +
                   " (sync with BN on the gRPC stream: no --bn_port) and " +
                   COLOCATED +
                   " (W >= 2: the W workers as one process with --replicas=W)")
    p.add_argument("--servers", type=int, default=1, help="shard servers S")
    p.add_argument("--steps", type=int, default=300, help="timed steps")
    p.add_argument("--warmup", type=int, default=50,
                   help="steps before the timed ones, left out")
    p.add_argument("--data", default="synthetic",
                   help="synthetic | fashion-mnist (the worker's --data)")
    p.add_argument("--bin_dir",
                   help="where server/bnps_server, worker/bnps_worker and "
                   "bench/ps_benchmark are (default: Bazel's -c opt "
                   "output, bazel-out/k8-opt/bin, else bazel-bin)")
    p.add_argument("--build", action="store_true",
                   help="bazel build -c opt the three binaries first")
    p.add_argument("--round_trip", choices=["on", "off"], default="on",
                   help="also run ps_benchmark's BN round trip each run")
    p.add_argument("--rt_channels", type=int, default=256)
    p.add_argument("--rt_workers", type=int, default=2)
    p.add_argument("--quick_round_trip", action="store_true",
                   help="ps_benchmark --quick (for tests)")
    p.add_argument("--worker_flag", action="append", default=[],
                   help="passed to every worker as is (repeatable), e.g. "
                   "--worker_flag=--bn_spin_us=0")
    p.add_argument("--server_flag", action="append", default=[],
                   help="passed to every server (repeatable), replacing the "
                   "default of the same name (--bn_port=0, and "
                   "--keep_awake_us={} where every process has a core); "
                   "e.g. --server_flag=--keep_awake_us=0, or "
                   "--server_flag=--bn_port=-1 for BN on the gRPC stream"
                   .format(KEEP_AWAKE_US))
    p.add_argument("--cores_each", choices=["one", "even"], default="one",
                   help="where every process can have a physical core of "
                   "its own: one each (the rest idle), or the cores shared "
                   "out evenly (whole cores; the servers take the odd ones)")
    p.add_argument("--timeout_s", type=float, default=600,
                   help="per policy and (W, batch)")
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                   help="the workers' --device (default cpu, whatever the "
                   "machine has)")
    p.add_argument("--mps", choices=["auto", "on", "off"], default="auto",
                   help="with --device=gpu: NVIDIA MPS where workers share a "
                   "GPU, as tools/bnps_launch.py --mps")
    args = p.parse_args(argv)
    args.policies = [x for x in args.policies.split(",") if x]
    bad = [x for x in args.policies if x not in POLICIES + VARIANTS]
    if bad or not args.policies:
        p.error("--policies: {} not in {}".format(bad, POLICIES + VARIANTS))
    if args.runs < 1 or args.steps < 1 or args.warmup < 0 or args.servers < 1:
        p.error("--runs, --steps and --servers must be >= 1, --warmup >= 0")
    return args


def main(argv):
    args = parse_args(argv)
    args.cores = usable_cores()
    args.core_groups = physical_cores(args.cores)
    if args.build:
        subprocess.check_call(
            ["bazel", "build", "-c", "opt", "//server:bnps_server",
             "//worker:bnps_worker", "//bench:ps_benchmark"], cwd=REPO)
        if not args.bin_dir:
            args.bin_dir = subprocess.check_output(
                ["bazel", "info", "-c", "opt", "bazel-bin"], cwd=REPO,
                universal_newlines=True).strip()
    if not args.bin_dir:
        opt = os.path.join(REPO, "bazel-out", "k8-opt", "bin")
        args.bin_dir = opt if os.path.isdir(opt) else os.path.join(
            REPO, "bazel-bin")
    results = {}
    shared = {}
    rts = []
    # Workers sharing a GPU: MPS for the whole run, as the launcher does.
    daemon, args.worker_env, args.mps_note = None, {}, None
    if args.device == "gpu":
        notes = []
        try:
            daemon, args.worker_env = bnps_launch_mps.setup(
                args.mps, "gpu", max(args.workers), bnps_launch_mps.System(),
                notes.append)
        except bnps_launch_mps.MpsError as e:
            print("step_overhead: error: {}".format(e), file=sys.stderr)
            return 2
        for line in notes:
            print("step_overhead: " + line, file=sys.stderr)
        # What the launcher's rule decided, as it said it.
        args.mps_note = "; ".join(notes) or "MPS: not needed"
    tmp = tempfile.mkdtemp(prefix="bnps_step_overhead_")
    for name in ("server/bnps_server", "worker/bnps_worker") + (
            ("bench/ps_benchmark",) if args.round_trip == "on" else ()):
        if not os.access(os.path.join(args.bin_dir, name), os.X_OK):
            print("step_overhead: no {} under {} (build it: --build, or "
                  "--round_trip=off without ps_benchmark)".format(
                      name, args.bin_dir), file=sys.stderr)
            return 1
    try:
        for run in range(args.runs):
            for W in args.workers:
                for b in args.batches:
                    for policy in args.policies:
                        if policy == COLOCATED and W < 2:
                            continue
                        print("step_overhead: run {} W={} batch={} {}".format(
                            run + 1, W, b, policy), file=sys.stderr)
                        sys.stderr.flush()
                        r, shared[W] = measure_policy(args, policy, W, b, tmp)
                        results.setdefault((W, b, policy), []).append(r)
            if args.round_trip == "on":
                rts.append(measure_round_trip(args))
    except Failure as e:
        print("step_overhead: error: {}".format(e), file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if daemon is not None:
            problem = daemon.stop()
            if problem:
                print("step_overhead: " + problem, file=sys.stderr)
    report(args, results, shared, rts, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
