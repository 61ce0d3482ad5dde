"""A local bnps cluster: S shard servers on 127.0.0.1, each on a free port,
for tests, examples and benchmarks (tools/bnps_launch.py starts whole jobs of
bnps_worker binaries; this starts only the servers, for Python workers).

    with LocalCluster(num_servers=2, num_workers=4, policy="sync") as c:
        env = c.worker_env(worker=0)   # BNPS_SERVERS, BNPS_WORKER, ...
        ...

Each server runs with --port=0 and prints the port it took; the servers run
in their own session and are stopped (SIGTERM, then SIGKILL after 5 s) by PID
when the context ends, or when start() fails. They also die with the thread
that started them (Linux's parent-death signal, as tools/bnps_launch.py's
children), so a test or script killed before stop() leaves none behind. A
server that exits or prints no port within start_timeout_s raises
RuntimeError with the tail of its output.

The servers run with --keep_serving unless keep_serving=False: they serve
reads (bnps.export, bnps_status) after the workers finished, until stop().
Without it, each exits 0 once every worker finished (Connection.finish).
"""

import os
import re
import select
import signal
import subprocess
import tempfile
import time

_LISTENING = re.compile(r"listening on (\S+):(\d+)\s*$")


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


def find_server_binary(explicit=None):
    """bnps_server: `explicit`, $BNPS_SERVER_BIN, the one the installed wheel
    carries (bnps-server's), the Bazel runfiles tree the caller runs in, or
    bazel-bin of the repository holding this package."""
    from bnps._console import packaged_binary
    candidates = [explicit, os.environ.get("BNPS_SERVER_BIN"),
                  packaged_binary("bnps_server"),
                  os.path.join(os.getcwd(), "server", "bnps_server")]
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))  # python/bnps -> repo
    candidates.append(os.path.join(repo, "bazel-bin", "server", "bnps_server"))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise FileNotFoundError(
        "bnps: no bnps_server binary; install the bnps wheel, build it "
        "with `bazel build //:bnps_server`, or set BNPS_SERVER_BIN")


class LocalCluster:
    def __init__(self, num_servers=1, num_workers=2, policy="sync",
                 job="bnps", server_flags=(), server_bin=None,
                 start_timeout_s=30.0, keep_serving=True):
        self.num_servers = num_servers
        self.num_workers = num_workers
        self.policy = policy
        self.job = job
        self._flags = list(server_flags) + (["--keep_serving"] if keep_serving else [])
        self._bin = find_server_binary(server_bin)
        self._timeout = start_timeout_s
        self._procs = []
        self._logs = []
        self.addresses = []

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
        preexec = _parent_death_signal()
        for shard in range(self.num_servers):
            log = tempfile.TemporaryFile(mode="w+")
            self._logs.append(log)
            args = [self._bin, "--host=127.0.0.1", "--port=0",
                    f"--shard={shard}", f"--num_shards={self.num_servers}",
                    f"--num_workers={self.num_workers}",
                    f"--policy={self.policy}", f"--job={self.job}"]
            self._procs.append(subprocess.Popen(
                args + self._flags, stdout=subprocess.PIPE, stderr=log,
                stdin=subprocess.DEVNULL, text=True, start_new_session=True,
                preexec_fn=preexec))
        for shard, proc in enumerate(self._procs):
            self.addresses.append(self._read_address(shard, proc))
        return self

    def _read_address(self, shard, proc):
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
            m = _LISTENING.search(line)
            if m:
                return f"{m.group(1)}:{m.group(2)}"
        self._logs[shard].seek(0)
        raise RuntimeError(
            f"bnps_server shard {shard} gave no port (exit status "
            f"{proc.poll()}): {''.join(seen)[-1000:]}"
            f"{self._logs[shard].read()[-2000:]}")

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
        self._logs[shard].seek(0)
        return self._logs[shard].read()

    def stop(self):
        for p in self._procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for p in self._procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout:
                p.stdout.close()
        self._procs = []
        for log in self._logs:
            log.close()
        self._logs = []
