"""A real bnps cluster on 127.0.0.1 whose processes a test kills and restarts.

Servers get fixed free ports (a restarted server comes back on its port) and
one checkpoint directory each; workers train on synthetic data with a fixed
seed, so two runs of the same cluster end bit-identical, which
`bnps_status --digest` shows. Servers run with --keep_serving unless asked
not to, so that the digest can be read after the workers finished (without
it a server exits once the job is complete). Every process is started here
and killed only by its PID.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import time

RUNFILES = os.getcwd()  # Bazel runs tests in the runfiles tree of the workspace
sys.path.insert(0, os.path.join(RUNFILES, "python"))
from bnps.cluster import server_command  # noqa: E402
SERVER = os.path.join(RUNFILES, "server", "bnps_server")
WORKER = os.path.join(RUNFILES, "worker", "bnps_worker")
STATUS = os.path.join(RUNFILES, "tools", "bnps_status")


def free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


class Cluster:
    def __init__(self, out_dir, servers=2, workers=2, policy="sync",
                 steps=600, checkpoint_every=3, worker_loss="fail",
                 staleness=0, extra_worker_flags=(), keep_serving=True,
                 barrier_timeout_ms=30000):
        self.out = out_dir
        self.num_servers = servers
        self.num_workers = workers
        self.ports = free_ports(servers)
        self.addresses = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        # The job's flags, the same for every server.
        self.server_flags = server_command(
            num_shards=servers, num_workers=workers, policy=policy,
            keep_serving=keep_serving, flags=[
                f"--checkpoint_every_steps={checkpoint_every}",
                "--heartbeat_timeout_ms=3000",
                f"--barrier_timeout_ms={barrier_timeout_ms}",
                f"--on_worker_loss={worker_loss}", f"--staleness={staleness}"])
        self.worker_flags = [
            f"--servers={self.addresses}", f"--num_workers={workers}",
            "--data=synthetic", "--train_examples=1024", "--batch_size=16",
            f"--max_steps={steps}", f"--epochs={steps}", "--eval=none",
            "--progress=none", "--width=4", "--seed=7",
            "--connect_timeout_s=30", *extra_worker_flags]
        self.servers = [None] * servers
        self.workers = [None] * workers
        self.starts = {}  # (kind, index) -> how many times started

    def log(self, kind, i):
        return os.path.join(self.out, f"{kind}{i}.log")

    def read_log(self, kind, i):
        with open(self.log(kind, i)) as f:
            return f.read()

    def checkpoint_dir(self, i):
        return os.path.join(self.out, f"ckpt{i}")

    def _spawn(self, kind, i, args):
        self.starts[(kind, i)] = self.starts.get((kind, i), 0) + 1
        with open(self.log(kind, i), "a") as log:  # the child keeps its own fd
            return self.popen(kind, i, args, stdout=log,
                              stderr=subprocess.STDOUT)

    def popen(self, kind, i, args, **kwargs):
        """Starts server or worker i (a subclass may start it elsewhere)."""
        return subprocess.Popen(args, **kwargs)

    def run_status(self, args):
        """bnps_status with `args` (a subclass may run it elsewhere)."""
        return subprocess.run([STATUS, f"--servers={self.addresses}", *args],
                              capture_output=True, text=True, timeout=30)

    def server_command(self, i):
        """Server i's command line (a subclass may add options)."""
        return server_command(SERVER, port=self.ports[i], shard=i,
                              checkpoint_dir=self.checkpoint_dir(i),
                              flags=self.server_flags)

    def start_server(self, i):
        self.servers[i] = self._spawn("server", i, self.server_command(i))

    def start_worker(self, w):
        self.workers[w] = self._spawn("worker", w, [
            WORKER, f"--worker={w}", *self.worker_flags,
            f"--report={os.path.join(self.out, f'worker{w}.json')}"])

    def start(self):
        for i in range(self.num_servers):
            self.start_server(i)
        for w in range(self.num_workers):
            self.start_worker(w)

    def kill(self, kind, i):
        p = (self.servers if kind == "server" else self.workers)[i]
        os.kill(p.pid, signal.SIGKILL)
        p.wait()

    def checkpoints(self, i):
        d = self.checkpoint_dir(i)
        if not os.path.isdir(d):
            return []
        return sorted(f for f in os.listdir(d) if f.endswith(".bnps"))

    def wait_for_common_checkpoint(self, timeout=60):
        """Until every server wrote a checkpoint of one same step: what a
        rollback needs (each shard writes its own in the background, so one
        shard's file alone does not make a step common)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            common = None
            for i in range(len(self.ports)):
                steps = {int(re.sub(r"\D", "", f)) for f in self.checkpoints(i)}
                common = steps if common is None else common & steps
            if common:
                return True
            time.sleep(0.02)
        return False

    def wait_workers(self, timeout=120):
        """The workers' exit codes (None for one still running at timeout)."""
        deadline = time.time() + timeout
        codes = []
        for p in self.workers:
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.time())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes

    def digest(self):
        r = self.run_status(["--digest"])
        return r.stdout.strip() if r.returncode == 0 else "error: " + r.stderr

    def status(self, *flags, timeout=30):
        """bnps_status's (exit code, stdout), retried while a server is not
        up yet (a restart), up to `timeout` seconds."""
        deadline = time.time() + timeout
        while True:
            r = subprocess.run([STATUS, f"--servers={self.addresses}", *flags],
                               capture_output=True, text=True, timeout=30)
            if r.returncode == 0 or time.time() >= deadline:
                return r.returncode, r.stdout + r.stderr
            time.sleep(0.1)

    def wait_servers(self, timeout=60):
        """The servers' exit codes (None for one still running at timeout)."""
        deadline = time.time() + timeout
        codes = []
        for p in self.servers:
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.time())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes

    def pushes(self):
        """(parameters, pushes applied, smallest parameter version) over the
        shards, from bnps_status."""
        r = self.run_status([])
        params = applied = 0
        versions = []
        for m in re.finditer(r"parameters (\d+) \(min version (\d+)\).*?"
                             r"pushes (\d+) applied", r.stdout, re.S):
            params += int(m.group(1))
            versions.append(int(m.group(2)))
            applied += int(m.group(3))
        return params, applied, min(versions) if versions else -1

    def stop(self):
        for p in self.servers + self.workers:
            if p is not None and p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()

    def logs(self):
        out = []
        for kind, procs in (("server", self.servers), ("worker", self.workers)):
            for i in range(len(procs)):
                if os.path.exists(self.log(kind, i)):
                    out.append(f"--- {kind}{i}\n" + self.read_log(kind, i)[-2000:])
        return "\n".join(out)
