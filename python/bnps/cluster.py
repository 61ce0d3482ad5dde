"""A local bnps cluster: S shard servers on 127.0.0.1, each on a free port,
for tests, examples and benchmarks (tools/bnps_launch.py starts whole jobs of
bnps_worker binaries; this starts only the servers, for Python workers).

    with LocalCluster(num_servers=2, num_workers=4, policy="sync") as c:
        env = c.worker_env(worker=0)   # BNPS_SERVERS, BNPS_WORKER, ...
        ...

Each server runs with --port=0 and prints the port it took, and with
--bn_port=0 (BN over raw TCP, as tools/bnps_launch.py starts them; not with
TLS flags or an explicit --bn_port in server_flags) and --bn_unix_socket=auto
(the same over a Unix socket, which workers on this host use first;
bn_unix=False: not); the servers run
in their own session and are stopped (SIGTERM, then SIGKILL after 5 s) by PID
when the context ends, or when start() fails. They also die with the thread
that started them (Linux's parent-death signal, as tools/bnps_launch.py's
children), so a test or script killed before stop() leaves none behind. A
server that exits or prints no port within start_timeout_s raises
RuntimeError with the tail of its output.

Where this machine has a core for every server and worker of the cluster,
the servers also keep their CPUs awake between BN messages
(--keep_awake_us=2000, at idle priority: it takes no time another process
wants), so an answer is not delayed by waking a CPU (tens of microseconds
a message on a VM); keep_awake_us=0 turns it off, a number sets it, and
--keep_awake_us in server_flags wins.

The servers run with --keep_serving unless keep_serving=False: they serve
reads (bnps.export, bnps_status) after the workers finished, until stop().
Without it, each exits 0 once every worker finished (Connection.finish).
"""

import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time

# A server's (or host aggregator's) "listening on HOST:PORT" line; HOST is an
# IPv4 address, a name, or an IPv6 address in brackets ([::1]:7000).
_LISTENING = re.compile(
    r"listening on (\[[0-9A-Za-z:.%_-]+\]|[^\s\[\]]+?):(\d+)\s*$", re.MULTILINE)


def parse_listening(text):
    """The "HOST:PORT" of the first "listening on HOST:PORT" line in `text`
    (IPv6 hosts keep their brackets, so the result is dialable as is), or
    None when there is none. The one parser of that line: the launcher, the
    benchmarks and the cluster tests all read a server's port through it."""
    m = _LISTENING.search(text or "")
    return f"{m.group(1)}:{m.group(2)}" if m else None

# The BN policies and gradient modes of bnps_server's and bnps_worker's
# --policy (--bn_policy) and --gradients, as policy/policy.h lists them
# (python/policy_test.py checks them against it). The rule that pairs them
# is C++'s alone: bnps.policy.resolve.
POLICIES = ("sync", "async", "recal", "local")
GRADIENT_MODES = ("sync", "async")

# The servers' --keep_awake_us where cores suffice: longer than the compute
# between two of a step's BN exchanges (about 0.6 ms for the example model at
# batch 32 on a CPU), so a server's core stays awake through a step.
# bench/step_overhead.py starts its servers with it too.
KEEP_AWAKE_US = 2000


def _usable_cores():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def keep_awake_flags(num_servers, num_workers, keep_awake_us=None,
                     flags=()):
    """The --keep_awake_us flag for a cluster's servers: keep_awake_us when
    given (0: none), else KEEP_AWAKE_US where this machine has a core for
    each of the servers and workers, else none; none when `flags` set it."""
    if any(f.startswith("--keep_awake_us") for f in flags):
        return []
    if keep_awake_us is None:
        keep_awake_us = KEEP_AWAKE_US \
            if _usable_cores() >= num_servers + num_workers else 0
    return [f"--keep_awake_us={int(keep_awake_us)}"] if keep_awake_us > 0 else []


def _parent_death_signal():
    """A preexec_fn that makes the child get SIGTERM when its parent dies
    (even by SIGKILL); None where prctl is not available. Resolved here, in
    the parent: the child of a threaded process must not import."""
    try:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec():
        prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    return preexec


def _find_binary(name, folder, variable, explicit, target):
    """bnps binary `name`: `explicit`, $`variable`, the one the installed
    wheel carries, the Bazel runfiles tree the caller runs in
    (<folder>/<name>), or bazel-bin of the repository holding this
    package."""
    from bnps._console import packaged_binary
    candidates = [explicit, os.environ.get(variable), packaged_binary(name),
                  os.path.join(os.getcwd(), folder, name)]
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))  # python/bnps -> repo
    candidates.append(os.path.join(repo, "bazel-bin", folder, name))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise FileNotFoundError(
        f"bnps: no {name} binary; install the bnps wheel, build it with "
        f"`bazel build {target}`, or set {variable}")


def find_server_binary(explicit=None):
    """bnps_server: `explicit`, $BNPS_SERVER_BIN, the one the installed wheel
    carries (bnps-server's), the Bazel runfiles tree the caller runs in, or
    bazel-bin of the repository holding this package."""
    return _find_binary("bnps_server", "server", "BNPS_SERVER_BIN", explicit,
                        "//:bnps_server")


def find_host_bn_binary(explicit=None):
    """bnps_host_bn (a host's BN aggregator), found as find_server_binary
    finds bnps_server ($BNPS_HOST_BN_BIN, the wheel's bnps-host-bn, ...)."""
    return _find_binary("bnps_host_bn", "hostbn", "BNPS_HOST_BN_BIN",
                        explicit, "//hostbn:bnps_host_bn")


# The calling process's metrics endpoint (bnps.torch.init); never a
# server's (ServerProcess.launch).
OWN_METRICS = ("BNPS_METRICS_PORT", "BNPS_METRICS_ADDRESS")


class ServerProcess:
    """One bnps_server process: `args` are its flags (without the binary).
    start() launches it (in its own session, dying with the thread that
    started it) and returns once it printed its address, or raises
    RuntimeError with the tail of its output; stop() ends it (SIGTERM, then
    SIGKILL after `grace_s`) and is idempotent. Not thread-safe."""

    def __init__(self, args, server_bin=None, start_timeout_s=30.0):
        self.args = list(args)
        self._bin = find_server_binary(server_bin)
        self._timeout = start_timeout_s
        self.proc = None
        self._log = None
        self.address = None  # "host:port" once started

    def launch(self):
        """Starts the process without waiting for its address. It inherits
        this process's environment but for BNPS_METRICS_PORT and
        BNPS_METRICS_ADDRESS: those are this process's own metrics
        endpoint (bnps.torch.init), which bnps_server would also read as
        its flags; a server serves metrics only when its `args` say."""
        self._log = tempfile.TemporaryFile(mode="w+")
        env = {k: v for k, v in os.environ.items() if k not in OWN_METRICS}
        self.proc = subprocess.Popen(
            [self._bin] + self.args, stdout=subprocess.PIPE, stderr=self._log,
            stdin=subprocess.DEVNULL, text=True, start_new_session=True,
            preexec_fn=_parent_death_signal(), env=env)
        return self

    def wait_address(self, what="bnps_server"):
        """The address the server printed; RuntimeError if none came within
        start_timeout_s. A failure leaves the process to stop()."""
        proc = self.proc
        deadline = time.monotonic() + self._timeout
        seen = []
        while True:
            left = deadline - time.monotonic()
            # The server prints (and flushes) one whole line: once the pipe
            # is readable, readline() does not block for long.
            if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
                break
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            address = parse_listening(line)
            if address:
                self.address = address
                return self.address
        raise RuntimeError(
            f"{what} gave no port (exit status {proc.poll()}): "
            f"{''.join(seen)[-1000:]}{self.log()[-2000:]}")

    def start(self):
        try:
            self.launch().wait_address()
        except BaseException:
            self.stop()
            raise
        return self

    def log(self):
        """What the server wrote on stderr so far."""
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read()

    def signal(self, sig=signal.SIGTERM):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, grace_s=5.0):
        self.signal()
        self.reap(time.monotonic() + grace_s)

    def reap(self, deadline):
        """Waits for the process until `deadline` (time.monotonic), then
        kills it; closes its pipes."""
        p = self.proc
        if p is not None:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout:
                p.stdout.close()
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None


def _flag_name(flag):
    """"bn_port" of "--bn_port=0" (or of "--bn_port")."""
    return flag[2:].split("=", 1)[0] if flag.startswith("--") else None


def server_command(binary=None, *, shard=None, num_shards=None,
                   num_workers=None, policy=None, job=None, host=None,
                   port=None, bn_port=None, bn_unix=False,
                   checkpoint_dir=None, keep_serving=False, flags=()):
    """bnps_server's command line: `binary` (when given) and the flags of
    the options given, in this order; an option left None is not passed, so
    the server uses its default. The one place a bnps_server command line is
    made (the launcher, LocalCluster, the benchmarks, the cluster tests).

    policy: a --policy shorthand ("async"), or the flags of a resolved pair
    (bnps.policy.resolve(...).flags). bn_port: BN over raw TCP on this port
    (0: a free one the workers learn when they register; -1: none).
    bn_unix: BN also over a Unix socket of the server's choosing
    (--bn_unix_socket=auto), which workers on the host use first. A
    --tls_cert in `flags` leaves both out: a TLS job keeps BN on its
    encrypted gRPC stream. Without raw TCP (bn_port -1, or --bn_port=-1 in
    `flags`: BN on the gRPC stream) bn_unix is left out too, as the server
    takes a Unix socket only beside its TCP listener. checkpoint_dir: the
    shard's own directory.

    flags: more flags, each written --name=value or --name; one whose name
    the options above also set replaces that option's flag."""
    flags = list(flags)
    given = {_flag_name(f) for f in flags}
    tls = "tls_cert" in given
    port_given = [f.split("=", 1)[1] for f in flags
                  if _flag_name(f) == "bn_port" and "=" in f]
    no_tcp = (port_given[-1] if port_given else str(bn_port)) == "-1"
    options = [("host", host), ("port", port), ("shard", shard),
               ("num_shards", num_shards), ("num_workers", num_workers),
               ("policy", policy), ("job", job),
               ("checkpoint_dir", checkpoint_dir),
               ("bn_port", None if tls else bn_port),
               ("bn_unix_socket",
                "auto" if bn_unix and not tls and not no_tcp else None)]
    args = []
    for name, value in options:
        if name == "policy" and not isinstance(value, str):
            args += list(value or [])
        elif value is not None:
            args.append(f"--{name}={value}")
    if keep_serving:
        args.append("--keep_serving")
    args = [a for a in args if _flag_name(a) not in given]
    return ([binary] if binary else []) + args + flags


def server_args(shard, num_shards, num_workers, policy="sync", job="bnps",
                host="127.0.0.1", port=0, flags=(), bn_unix=True):
    """server_command's flags for one shard of a LocalCluster (and of
    bnps.torch's node servers): BN over raw TCP on a free port, and with
    `bn_unix` over a Unix socket, as tools/bnps_launch.py starts servers."""
    return server_command(shard=shard, num_shards=num_shards,
                          num_workers=num_workers, policy=policy, job=job,
                          host=host, port=port, bn_port=0, bn_unix=bn_unix,
                          flags=flags)


class LocalCluster:
    def __init__(self, num_servers=1, num_workers=2, policy="sync",
                 job="bnps", server_flags=(), server_bin=None,
                 start_timeout_s=30.0, keep_serving=True, keep_awake_us=None,
                 bn_unix=True):
        self.num_servers = num_servers
        self.bn_unix = bn_unix
        self.num_workers = num_workers
        self.policy = policy
        self.job = job
        self._flags = list(server_flags) + (["--keep_serving"] if keep_serving else [])
        self._flags += keep_awake_flags(num_servers, num_workers,
                                        keep_awake_us, server_flags)
        self._bin = find_server_binary(server_bin)
        self._timeout = start_timeout_s
        self._servers = []
        self.addresses = []

    @property
    def _procs(self):
        return [s.proc for s in self._servers if s.proc is not None]

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        """Starts the servers and reads their ports; on failure stops the
        ones started and raises."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self):
        for shard in range(self.num_servers):
            self._servers.append(ServerProcess(
                server_args(shard, self.num_servers, self.num_workers,
                            self.policy, self.job, flags=self._flags,
                            bn_unix=self.bn_unix),
                self._bin, self._timeout).launch())
        for shard, server in enumerate(self._servers):
            self.addresses.append(
                server.wait_address(f"bnps_server shard {shard}"))
        return self

    @property
    def servers(self):
        """The servers' addresses, comma-separated, shard order."""
        return ",".join(self.addresses)

    def worker_env(self, worker, base=None):
        """`base` (default os.environ) plus the BNPS_* variables of worker
        `worker`, which bnps.torch.init() reads."""
        env = dict(os.environ if base is None else base)
        env.update(BNPS_SERVERS=self.servers, BNPS_WORKER=str(worker),
                   BNPS_NUM_WORKERS=str(self.num_workers), BNPS_JOB=self.job)
        return env

    def server_log(self, shard):
        return self._servers[shard].log()

    def stop(self):
        for server in self._servers:
            server.signal()
        deadline = time.monotonic() + 5
        for server in self._servers:
            server.reap(deadline)
        self._servers = []


def _main(argv):
    """`python3 -m bnps.cluster listening FILE`: prints the HOST:PORT of
    FILE's "listening on" line, or exits 1 when it has none yet (for shell
    scripts, which then read a server's port through the one parser)."""
    if len(argv) != 2 or argv[0] != "listening":
        print("usage: python3 -m bnps.cluster listening FILE", file=sys.stderr)
        return 2
    try:
        with open(argv[1], errors="replace") as f:
            address = parse_listening(f.read())
    except OSError:
        address = None
    if address is None:
        return 1
    print(address)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
