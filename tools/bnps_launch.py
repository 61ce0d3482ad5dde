#!/usr/bin/env python3
"""Starts a local bnps cluster (S shard servers, W workers), watches it, and
prints a summary.

Usage:
    tools/bnps_launch.py --servers 2 --workers 4 --policy sync --epochs=1

What it does:
  1. (--build) runs `bazel build //server:bnps_server //worker:bnps_worker
     //python:libbnps.so ...` (BUILD_TARGETS).
  2. Starts S servers on 127.0.0.1 with --port=0 (and, without TLS,
     --bn_port=0: BN traffic over raw TCP too, and --bn_unix_socket=auto:
     the same over a Unix socket, which the workers use first; --bn_unix=off:
     TCP only) and reads each one's
     "listening on HOST:PORT" line to learn its port (--server_start_timeout_s).
  3. Starts W workers with --servers=<shard 0>,<shard 1>,... --worker=i
     --num_workers=W --report=<out_dir>/worker<i>.json --progress=plain.
     Every option this script does not know, written --flag=value (or --flag),
     goes to every worker unchanged: --epochs=2 --batch_size=128 ...
  4. Forwards every output line of every process to stdout as "[s0] ...",
     "[w3] ..." and saves each process's stdout and stderr in
     <out_dir>/<name>.log. On a terminal, worker 0's progress lines
     ("step ...") share one refreshed line; everything else scrolls.
  5. When every worker exited 0: SIGTERMs the servers, prints a table of the
     workers' reports and one line
        result: policy=sync workers=4 servers=2 test_accuracy=0.8712 wall_s=312.4
     and writes <out_dir>/summary.json.

Failure: when a worker or server exits non-zero, a server exits at all before
the workers are done, --timeout_s passes, or SIGINT/SIGTERM/SIGHUP arrives, it
sends SIGTERM to every process it started (by PID; the children run in their own
session so a terminal's Ctrl-C reaches only this script), SIGKILLs those still
alive after --kill_grace_s, names what failed with the tail of its stderr and
exits non-zero: 1 for a failed process, 124 on timeout, 128+N on signal N
(130 for Ctrl-C), 2 for bad usage. Children also get SIGTERM from the kernel
if the launcher itself dies (PR_SET_PDEATHSIG), so none outlives it.

--bn_host_aggregator also starts one bnps_host_bn ("h0", on 127.0.0.1, a
free port, with --token_file and --per_worker_tokens as the servers have
them) and gives every worker --bn_host_aggregator=<its address>: the
workers' BN traffic crosses to each shard as one frame per layer, phase and
step, with the same results (docs/scaling.md). It is watched, restarted and
stopped as the servers are. Plaintext jobs only.

Restarts (--restart=on-failure): a worker that exits non-zero, or a server
that exits before the workers are done, is started again with the same
command (a server on the port it had, from its checkpoints in
<checkpoint_dir>/shard<i>), at most --max_restarts times in all; each restart
is one line "restarting NAME (restart K of N): it ...". The job then rolls back
to the newest step every server has a checkpoint of (docs/reliability.md). It
needs --checkpoint_every_steps (default 10 with --restart); restarted workers
need --on_worker_loss=wait under sync.

The BN policy and the gradient mode: --policy is the shorthand for a pair
(sync, async, recal, local: policy/policy.h), --bn_policy and --gradients
choose the halves independently (e.g. --bn_policy=async --gradients=sync);
a --policy that contradicts either is a usage error. A shorthand pair goes to
the binaries as --policy, any other as --bn_policy and --gradients. The
binaries' own rule decides (policy::ResolvePolicy, through libbnps.so's C
ABI: bnps.policy), so the launcher needs libbnps.so: $BNPS_NATIVE_LIB,
<bin_dir>/python's, or the one bnps finds (the wheel's); without it, it
exits 2 saying how to build it (--build builds it first).

Options given to both servers and workers: --policy, --job, --staleness,
--bn_staleness, --bn_group_size, --bn_group, --learning_rate, --momentum, --weight_decay (the worker checks they match the
servers), --token_file (the job token; with --per_worker_tokens the servers
accept each worker's own token, and each worker gets only its own, written to
<out_dir>/worker<i>.token by tools/bnps_worker_token). Servers only: --bn_momentum,
--barrier_timeout_ms, --heartbeat_timeout_ms, --on_worker_loss, and TLS:
--server_tls_cert and --server_tls_key (passed as the servers' --tls_cert and
--tls_key), --tls_client_ca. The workers' --tls_ca, --tls_cert and --tls_key go
through to the workers like any other worker flag. An option left out is not
passed, so each binary uses its own default (--policy is always passed; default
sync).

GPUs: each worker gets LOCAL_RANK=<its index> (it takes GPU LOCAL_RANK
modulo the visible ones unless --gpu says otherwise). When the workers would
share GPUs (more workers than GPUs, workers not on --device=cpu), --mps=auto
(default) uses NVIDIA MPS: a control daemon that already runs, or one started
for the job and stopped at its end; --mps=on fails the launch when MPS cannot
be had, --mps=off never uses it (tools/bnps_launch_mps.py, docs/gpu.md).

Metrics (docs/observability.md): --metrics_port_base=P gives server s
--metrics_port=P+s, worker i --metrics_port=P+S+i and the host BN
aggregator (--bn_host_aggregator) P+S+W, all on 127.0.0.1 (each prints its
address); without it nothing serves metrics.
"""

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time

# The process supervision is bnps_launch_procs.py beside this file; put this
# file's directory on sys.path as given (Python adds it, with symlinks
# resolved, only when it runs this file as a script) so that it is found when
# this file is imported too, and from a Bazel runfiles tree.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# bnps (its pure parts and bnps.policy; no NumPy, no torch) from python/ of
# the repository or runfiles tree holding this file, else where installed.
sys.path.insert(1, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "python"))

import bnps_launch_mps  # noqa: E402  (needs the path above)
from bnps_launch_report import (  # noqa: E402  (needs the path above)
    load_reports, report_path, result_line, summary_table, write_summary)
from bnps_launch_export import (  # noqa: E402  (needs the path above)
    run_export, status_path)
from bnps_launch_procs import (  # noqa: E402  (needs the path above)
    POLL_S, Console, Failure, Interrupt, Proc, check_deadline, check_interrupt,
    describe_exit, finish_output, say, start, stop_all)
from bnps import cluster, errors  # noqa: E402  (needs the path above)
from bnps import policy as bnps_policy  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD_TARGETS = ["//server:bnps_server", "//worker:bnps_worker", "//tools:bnps_status",
                 "//tools:bnps_worker_token", "//hostbn:bnps_host_bn",
                 "//python:libbnps.so"]

# Options shared by servers and workers / given to servers only. Each entry is
# (option name, type); a value left at None is not passed on.
SHARED_OPTIONS = [("staleness", int), ("bn_staleness", int),
                  ("bn_group_size", int), ("bn_group", str),
                  ("learning_rate", float),
                  ("momentum", float), ("weight_decay", float), ("token_file", str)]
SERVER_OPTIONS = [("bn_momentum", float), ("barrier_timeout_ms", int),
                  ("heartbeat_timeout_ms", int), ("tls_client_ca", str)]
# The servers' --tls_cert and --tls_key, named apart from the workers' own
# --tls_cert and --tls_key (which go through to the workers).
SERVER_RENAMED_OPTIONS = [("server_tls_cert", "tls_cert"),
                          ("server_tls_key", "tls_key")]
# Worker flags this script sets itself; a user may not pass them through.
RESERVED_WORKER_FLAGS = {"servers", "worker", "num_workers", "report", "progress"}


class UsageError(Exception):
    """Bad command line or set-up; the message is one line for the user."""


# ----------------------------------------------------------------------------
# Command line


def parse_args(argv):
    """Returns (args, worker_extra): the launcher's options and the flags that
    go unchanged to every worker."""
    p = argparse.ArgumentParser(
        prog="bnps_launch.py",
        description="Start a local bnps cluster: S shard servers and W workers. "
        "Unknown --flag=value options go to every worker (e.g. --epochs=2).",
        allow_abbrev=False)
    p.add_argument("--servers", type=int, default=2, help="shard servers S (default 2)")
    p.add_argument("--workers", type=int, default=4, help="workers W (default 4)")
    p.add_argument("--resize", metavar="STEP:W[,STEP:W...]",
                   help="sync only: from step STEP on, the job trains with W "
                   "workers (ids 0..W-1), without a restart; e.g. 100:8,200:4. "
                   "Every worker id the job ever has is started at once; a "
                   "worker waits for its first step and ends after its last")
    p.add_argument("--policy", choices=cluster.POLICIES,
                   help="shorthand for a BN policy and a gradient mode, to servers and "
                   "workers (default sync): async = async BN + async gradients, the "
                   "others their BN policy + sync gradients")
    p.add_argument("--bn_policy", choices=cluster.POLICIES,
                   help="the BN policy alone (default: --policy's, else sync)")
    p.add_argument("--gradients", choices=cluster.GRADIENT_MODES,
                   help="the gradient mode alone (default: --policy's, else sync)")
    p.add_argument("--job", default="bnps", help="job name (default bnps)")
    for name, typ in SHARED_OPTIONS:
        p.add_argument("--" + name, type=typ, help="to servers and workers")
    for name, typ in SERVER_OPTIONS:
        p.add_argument("--" + name, type=typ, help="to servers")
    for name, server_name in SERVER_RENAMED_OPTIONS:
        p.add_argument("--" + name, help="to servers as --" + server_name)
    p.add_argument("--on_worker_loss", choices=["fail", "shrink", "wait"],
                   help="to servers")
    p.add_argument("--bn_host_aggregator", action="store_true",
                   help="start one bnps_host_bn for the workers (all on this "
                   "host): their BN traffic crosses to each shard as one frame "
                   "per layer, phase and step (plaintext jobs)")
    p.add_argument("--bn_unix", choices=["on", "off"], default="on",
                   help="without TLS: the servers also serve BN on a Unix "
                   "socket (--bn_unix_socket=auto), which the workers use "
                   "before TCP (default on)")
    p.add_argument("--per_worker_tokens", action="store_true",
                   help="with --token_file: the servers accept each worker's own "
                   "token, and each worker gets only its own "
                   "(<out_dir>/worker<i>.token, made by tools/bnps_worker_token)")
    p.add_argument("--restart", choices=["no", "on-failure"], default="no",
                   help="start a process that died again (default no)")
    p.add_argument("--max_restarts", type=int, default=3,
                   help="restarts allowed in all with --restart=on-failure (default 3)")
    p.add_argument("--checkpoint_dir",
                   help="servers' checkpoints go to <dir>/shard<i> (default with "
                   "--restart: <out_dir>/checkpoints)")
    p.add_argument("--checkpoint_every_steps", type=int,
                   help="to servers (default with --restart: 10)")
    p.add_argument("--export",
                   help="after the workers finished, write the servers' parameters and "
                   "BN running statistics to this safetensors file (bnps_status "
                   "--export; needs <bin_dir>/tools/bnps_status)")
    p.add_argument("--metrics_port_base", type=int,
                   help="serve Prometheus metrics: server s on port P+s, worker i "
                   "on P+S+i, the host BN aggregator on P+S+W (default: none)")
    p.add_argument("--bin_dir", default=os.path.join(REPO, "bazel-bin"),
                   help="holds server/bnps_server and worker/bnps_worker "
                   "(default <repo>/bazel-bin)")
    p.add_argument("--out_dir", help="reports and logs (default: a fresh temp dir)")
    p.add_argument("--build", action="store_true",
                   help="run `bazel build %s` first" % " ".join(BUILD_TARGETS))
    p.add_argument("--timeout_s", type=float, default=3600.0,
                   help="limit on the whole run after any --build (default 3600)")
    p.add_argument("--server_start_timeout_s", type=float, default=30.0,
                   help="how long a server may take to print its port (default 30)")
    p.add_argument("--mps", choices=["auto", "on", "off"], default="auto",
                   help="NVIDIA MPS when workers share a GPU (default auto: use or "
                   "start a daemon, else say why not)")
    p.add_argument("--kill_grace_s", type=float, default=5.0,
                   help="SIGTERM to SIGKILL grace when stopping (default 5)")
    args, extra = p.parse_known_args(argv)
    try:
        check_args(args, extra)
    except UsageError as e:
        p.error(str(e))
    return args, extra


def resolve_policy(args):
    """Sets args.bn_policy_used, args.gradients_used, args.policy_name
    (policy::JobPolicyName) and args.policy_flags (the binaries' policy
    flags) from --policy, --bn_policy and --gradients, by the binaries' own
    rule through libbnps.so (bnps.policy); UsageError when they contradict,
    or without the library."""
    try:
        p = bnps_policy.resolve(args.policy, args.bn_policy, args.gradients,
                                library_dirs=[os.path.join(args.bin_dir, "python")])
    except errors.InvalidArgument as e:
        raise UsageError(e.message)
    except ImportError as e:
        raise UsageError("resolving --policy, --bn_policy and --gradients needs "
                         "libbnps.so (the binaries' rule, policy/policy.h): run "
                         "with --build, or `bazel build //python:libbnps.so`, or "
                         "pass --bin_dir (%s)" % e)
    args.bn_policy_used, args.gradients_used = p.bn_policy, p.gradients
    args.policy_name, args.policy_flags = p.name, p.flags


def check_args(args, extra):
    """Checks the command line. The policy is resolved here too, unless
    --build is to build libbnps.so first (main resolves it then)."""
    if not args.build:
        resolve_policy(args)
    if args.servers < 1:
        raise UsageError("--servers must be at least 1 (got %d)" % args.servers)
    if args.workers < 1:
        raise UsageError("--workers must be at least 1 (got %d)" % args.workers)
    if args.staleness is not None and args.staleness < 0:
        raise UsageError("--staleness must be >= 0")
    for name in ("timeout_s", "server_start_timeout_s"):
        if getattr(args, name) <= 0:
            raise UsageError("--%s must be > 0" % name)
    if args.kill_grace_s < 0:
        raise UsageError("--kill_grace_s must be >= 0")
    ports = args.servers + args.workers + int(args.bn_host_aggregator)
    if args.metrics_port_base is not None and not (
            0 < args.metrics_port_base
            and args.metrics_port_base + ports <= 65536):
        raise UsageError("--metrics_port_base leaves no room for %d ports"
                         % ports)
    if args.max_restarts < 0:
        raise UsageError("--max_restarts must be >= 0")
    if args.per_worker_tokens and not args.token_file:
        raise UsageError("--per_worker_tokens derives the workers' tokens from "
                         "the job token: give --token_file")
    if args.bn_host_aggregator and args.server_tls_cert:
        raise UsageError("--bn_host_aggregator carries BN over raw TCP, which a "
                         "TLS job does not use")
    if args.resize and args.bn_host_aggregator:
        raise UsageError("--resize changes the workers a step counts, and "
                         "bnps_host_bn waits for a fixed set of workers: "
                         "give one of --resize and --bn_host_aggregator")
    args.membership = None
    if args.resize:
        # The servers check the history (proto/membership_history.h); here
        # only the most workers it ever has, to start that many.
        counts = [args.workers]
        for part in args.resize.split(","):
            fields = part.split(":")
            if len(fields) != 2 or not all(f.strip().isdigit() for f in fields):
                raise UsageError("--resize takes STEP:W[,STEP:W...]; got %r" % part)
            counts.append(int(fields[1]))
        args.membership = "0:%d,%s" % (args.workers, args.resize)
        args.workers = max(counts)
    if args.checkpoint_every_steps is not None and args.checkpoint_every_steps < 0:
        raise UsageError("--checkpoint_every_steps must be >= 0")
    for flag in extra:
        if not flag.startswith("--") or flag == "--":
            raise UsageError("worker flags must be written --flag=value; got %r" % flag)
        name = flag[2:].split("=", 1)[0]
        if name in RESERVED_WORKER_FLAGS:
            raise UsageError("--%s is set by the launcher; do not pass it" % name)


# ----------------------------------------------------------------------------
# Commands


def binary_paths(bin_dir):
    return (os.path.join(bin_dir, "server", "bnps_server"),
            os.path.join(bin_dir, "worker", "bnps_worker"))


def host_bn_path(bin_dir):
    return os.path.join(bin_dir, "hostbn", "bnps_host_bn")


def check_binaries(bin_dir, export=False, host_bn=False):
    for path in (binary_paths(bin_dir) + ((status_path(bin_dir),) if export else ())
                 + ((host_bn_path(bin_dir),) if host_bn else ())):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise UsageError(
                "%s not found (or not executable): run with --build, or run "
                "`bazel build %s` first, or pass --bin_dir" % (path, " ".join(BUILD_TARGETS)))


def optional_flags(args, options):
    flags = []
    for name, _ in options:
        value = getattr(args, name)
        if value is not None:
            flags.append("--%s=%s" % (name, value))
    return flags


def server_command(args, shard):
    flags = optional_flags(args, SHARED_OPTIONS + SERVER_OPTIONS)
    for name, server_name in SERVER_RENAMED_OPTIONS:
        if getattr(args, name) is not None:
            flags.append("--%s=%s" % (server_name, getattr(args, name)))
    if args.on_worker_loss:
        flags.append("--on_worker_loss=" + args.on_worker_loss)
    if args.membership:
        flags.append("--membership=" + args.membership)
    if args.per_worker_tokens:
        flags.append("--per_worker_tokens")
    if args.metrics_port_base is not None:
        flags.append("--metrics_port=%d" % (args.metrics_port_base + shard))
    if args.checkpoint_every_steps is not None:
        flags.append("--checkpoint_every_steps=%d" % args.checkpoint_every_steps)
    # The launcher stops the servers itself, after its end-of-run reads
    # (--export): keep_serving, so that a server that left on its own as the
    # job completed does not look like one that died before the workers'
    # exits were seen. Plaintext: BN traffic also over raw TCP (a free port)
    # and, with --bn_unix=on, a Unix socket the server names and removes (a
    # TLS job keeps BN on the encrypted stream: bnps.cluster.server_command).
    return cluster.server_command(
        binary_paths(args.bin_dir)[0], host="127.0.0.1", port=0, job=args.job,
        shard=shard, num_shards=args.servers, num_workers=args.workers,
        policy=args.policy_flags,
        checkpoint_dir=(os.path.join(args.checkpoint_dir, "shard%d" % shard)
                        if args.checkpoint_dir else None),
        keep_serving=True, bn_port=0, bn_unix=args.bn_unix == "on", flags=flags)


def host_bn_command(args):
    """The host's BN aggregator for all the workers (--bn_host_aggregator).
    Its shards are this host's (--shards=127.0.0.1): it relays to no
    other address a worker's hello might name."""
    cmd = [host_bn_path(args.bin_dir), "--host=127.0.0.1", "--port=0",
           "--workers=%d" % args.workers, "--shards=127.0.0.1"]
    if args.token_file:
        cmd.append("--token_file=" + args.token_file)
    if args.per_worker_tokens:
        cmd += ["--per_worker_tokens", "--num_workers=%d" % args.workers]
    if args.metrics_port_base is not None:
        cmd.append("--metrics_port=%d" % (args.metrics_port_base +
                                          args.servers + args.workers))
    return cmd


def worker_command(args, extra, index, addresses, out_dir):
    cmd = [binary_paths(args.bin_dir)[1], "--servers=" + ",".join(addresses),
           "--job=" + args.job, "--worker=%d" % index, "--num_workers=%d" % args.workers]
    cmd += args.policy_flags
    cmd += optional_flags(args, SHARED_OPTIONS)
    if args.per_worker_tokens:  # its own token, not the job's
        cmd = [f for f in cmd if not f.startswith("--token_file=")]
        cmd.append("--token_file=" + worker_token_path(out_dir, index))
    if getattr(args, "host_bn_address", None):
        cmd.append("--bn_host_aggregator=" + args.host_bn_address)
    cmd += ["--report=" + report_path(out_dir, index), "--progress=plain"]
    if args.metrics_port_base is not None:
        cmd.append("--metrics_port=%d"
                   % (args.metrics_port_base + args.servers + index))
    return cmd + list(extra)


def worker_token_path(out_dir, index):
    return os.path.join(out_dir, "worker%d.token" % index)


def make_worker_tokens(args, out_dir):
    """Writes each worker's own token (--per_worker_tokens), derived from the
    job token by tools/bnps_worker_token (the one place the rule lives)."""
    tool = os.path.join(args.bin_dir, "tools", "bnps_worker_token")
    for i in range(args.workers):
        try:
            r = subprocess.run([tool, "--job_token_file=" + args.token_file,
                                "--worker=%d" % i],
                               capture_output=True, text=True, timeout=30)
        except OSError as e:
            raise UsageError("%s: %s (run with --build, or pass --bin_dir)"
                             % (tool, e.strerror))
        if r.returncode != 0:
            raise UsageError(r.stderr.strip() or "%s failed" % tool)
        path = worker_token_path(out_dir, i)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(r.stdout)


def run_build():
    """Runs the bazel build; returns its exit code."""
    cmd = ["bazel", "build"] + BUILD_TARGETS
    print("bnps_launch: $ " + shlex.join(cmd), flush=True)
    try:
        rc = subprocess.call(cmd, cwd=REPO)
    except FileNotFoundError:
        raise UsageError("bazel not found on PATH; cannot --build")
    return rc



# ----------------------------------------------------------------------------
# Running the cluster


def start_servers(args, out_dir, procs, console, interrupt, deadline):
    """Starts the servers (and, with --bn_host_aggregator, the host's BN
    aggregator "h0", watched and stopped as they are) and returns them and
    the shards' addresses in shard order."""
    servers = []
    commands = [("s%d" % shard, server_command(args, shard))
                for shard in range(args.servers)]
    if args.bn_host_aggregator:
        commands.append(("h0", host_bn_command(args)))
    for name, cmd in commands:
        proc = Proc(name, cmd, os.path.join(out_dir, name + ".log"))
        procs.append(proc)
        servers.append(proc)
        start(proc, console)
    start_deadline = min(deadline, time.monotonic() + args.server_start_timeout_s)
    for proc in servers:
        while not proc.listening.wait(POLL_S):
            check_interrupt(interrupt)
            if proc.returncode() is not None:
                raise Failure("server %s %s before printing its port"
                              % (proc.name, describe_exit(proc.returncode())), proc=proc)
            if time.monotonic() >= start_deadline:
                if time.monotonic() >= deadline:
                    check_deadline(deadline, args.timeout_s, procs)
                raise Failure("server %s did not print 'listening on HOST:PORT' within "
                              "%gs" % (proc.name, args.server_start_timeout_s), proc=proc)
    addresses = [p.address for p in servers[:args.servers]]
    say(console, "servers: " + ",".join(addresses))
    if args.bn_host_aggregator:
        args.host_bn_address = servers[-1].address
        say(console, "host BN aggregator: " + args.host_bn_address)
    return servers, addresses


def start_workers(args, extra, addresses, out_dir, procs, console, env=None):
    """Starts the workers; each gets `env` and LOCAL_RANK=<its index>."""
    workers = []
    for i in range(args.workers):
        name = "w%d" % i
        path = report_path(out_dir, i)
        if os.path.exists(path):
            os.remove(path)  # Never read a report left by an earlier run.
        proc = Proc(name, worker_command(args, extra, i, addresses, out_dir),
                    os.path.join(out_dir, name + ".log"),
                    env=dict(env or {}, LOCAL_RANK=str(i)))
        procs.append(proc)
        workers.append(proc)
        start(proc, console)
    return workers


def restart(args, group, i, procs, console, budget, why):
    """Starts group[i] again (same command; a server on its port) if
    --restart allows; returns whether it did."""
    if args.restart != "on-failure" or budget[0] >= args.max_restarts:
        return False
    budget[0] += 1
    old = group[i]
    cmd = list(old.cmd)
    if old.address:  # a server comes back where the workers look for it
        cmd = [("--port=" + old.address.rsplit(":", 1)[1])
               if c.startswith("--port=") else c for c in cmd]
    proc = Proc(old.name, cmd, old.log_path)
    proc.restarts = old.restarts + 1
    say(console, "restarting %s (restart %d of %d): it %s"
        % (old.name, budget[0], args.max_restarts, why))
    procs.append(proc)
    group[i] = proc
    start(proc, console)
    return True


def wait_for_workers(args, servers, workers, procs, interrupt, deadline,
                     console=None):
    """Returns when every worker exited 0; raises Failure otherwise (after
    the restarts --restart allows)."""
    budget = [0]  # restarts used
    while True:  # Bounded by deadline (check_deadline raises).
        check_interrupt(interrupt)
        for i, w in enumerate(workers):
            code = w.returncode()
            if code is not None and code != 0:
                if restart(args, workers, i, procs, console, budget,
                           describe_exit(code)):
                    continue
                raise Failure("worker %s %s" % (w.name, describe_exit(code)), proc=w)
        if all(w.returncode() == 0 for w in workers):
            return
        for i, s in enumerate(servers):
            code = s.returncode()
            if code is not None:
                if restart(args, servers, i, procs, console, budget,
                           describe_exit(code) + " before the workers finished"):
                    continue
                raise Failure("server %s %s before the workers finished"
                              % (s.name, describe_exit(code)), proc=s)
        check_deadline(deadline, args.timeout_s, procs)
        time.sleep(POLL_S)


def stop_servers(servers, grace_s, console, interrupt):
    for s in servers:
        code = s.returncode()
        if code is not None and code != 0:
            say(console, "warning: server %s %s" % (s.name, describe_exit(code)))
    running = [s for s in servers if s.running()]
    stop_all(running, grace_s, console, interrupt)
    for s in running:
        code = s.returncode()
        if code not in (0, -signal.SIGTERM):
            say(console, "warning: server %s %s after SIGTERM" % (s.name, describe_exit(code)))


def report_failure(failure, exited, console):
    """Prints what failed: the failure, the stderr tail of the process to
    blame, and the other processes in `exited` (those that had already exited
    non-zero before the launcher stopped anything)."""
    say(console, "FAILED: " + str(failure))
    proc = failure.proc
    if proc is not None:
        if proc.stderr_tail:
            say(console, "last %d lines of %s's stderr (all in %s):"
                % (len(proc.stderr_tail), proc.name, proc.log_path))
            for line in proc.stderr_tail:
                console.line("  " + line)
        else:
            say(console, "%s wrote nothing on stderr; its output is in %s"
                % (proc.name, proc.log_path))
    for p in exited:
        if p is proc:
            continue
        say(console, "also: %s %s" % (p.name, describe_exit(p.returncode())))


# ----------------------------------------------------------------------------
# Main


def make_out_dir(args):
    try:
        if args.out_dir:
            os.makedirs(args.out_dir, exist_ok=True)
            return os.path.abspath(args.out_dir)
        return tempfile.mkdtemp(prefix="bnps_launch_")
    except OSError as e:
        raise UsageError("cannot create the output directory: %s" % e)


def run_cluster(args, extra, argv, out_dir, console, interrupt):
    """Runs the cluster to the end; returns the exit code."""
    procs = []
    t0 = time.monotonic()
    deadline = t0 + args.timeout_s
    addresses = []
    mps = None
    try:
        mps, worker_env = bnps_launch_mps.setup(
            args.mps, bnps_launch_mps.worker_device(extra), args.workers,
            bnps_launch_mps.System(), lambda line: say(console, line))
        servers, addresses = start_servers(args, out_dir, procs, console, interrupt, deadline)
        workers = start_workers(args, extra, addresses, out_dir, procs, console,
                                worker_env)
        wait_for_workers(args, servers, workers, procs, interrupt, deadline,
                         console)
    except bnps_launch_mps.MpsError as e:
        print("bnps_launch: error: %s" % e, file=sys.stderr)
        return 2
    except Failure as failure:
        console.end_status()
        exited = [p for p in procs if p.returncode() not in (None, 0)]
        stop_all(procs, args.kill_grace_s, console, interrupt)
        finish_output(procs, console)
        report_failure(failure, exited, console)
        say(console, "logs in " + out_dir)
        return failure.exit_code
    except BaseException:
        stop_all(procs, args.kill_grace_s, console, interrupt)
        raise
    finally:
        if mps is not None:
            # The workers are gone (finished or stopped): the daemon may go.
            problem = mps.stop()
            if problem:
                say(console, "gpu: " + problem)
    wall_s = time.monotonic() - t0
    export_problem = run_export(args, extra, addresses, console) if args.export else None
    stop_servers(servers, args.kill_grace_s, console, interrupt)
    finish_output(procs, console)
    reports, problems = load_reports(workers, out_dir)
    for line in summary_table(reports):
        console.line(line)
    path = write_summary(args, extra, argv, out_dir, addresses, reports, wall_s)
    console.line(result_line(args, reports, wall_s))
    say(console, "summary in " + path)
    if export_problem:
        problems.append(export_problem)
    for problem in problems:
        say(console, "FAILED: " + problem)
    return 1 if problems else 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args, extra = parse_args(argv)
    try:
        if args.build:
            if run_build() != 0:
                print("bnps_launch: error: the bazel build failed", file=sys.stderr)
                return 1
            resolve_policy(args)
        check_binaries(args.bin_dir, export=bool(args.export),
                       host_bn=args.bn_host_aggregator)
        out_dir = make_out_dir(args)
        if args.per_worker_tokens:
            make_worker_tokens(args, out_dir)
        if args.restart == "on-failure":
            # A restarted server resumes from its checkpoints.
            if not args.checkpoint_dir:
                args.checkpoint_dir = os.path.join(out_dir, "checkpoints")
            if args.checkpoint_every_steps is None:
                args.checkpoint_every_steps = 10
    except UsageError as e:
        print("bnps_launch: error: %s" % e, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bnps_launch: interrupted", file=sys.stderr)
        return 130
    console = Console(sys.stdout, live=sys.stdout.isatty())
    say(console, "reports and logs in " + out_dir)
    interrupt = Interrupt()
    interrupt.install()
    return run_cluster(args, extra, argv, out_dir, console, interrupt)


if __name__ == "__main__":
    sys.exit(main())
