"""Several workers on one GPU: the launcher's use of NVIDIA MPS.

Worker processes that share a GPU without the Multi-Process Service take
turns on it (time-slicing): on an H100, 4 workers of the demo ran at 568
images/s each without MPS and 6,085 with it (docs/gpu.md). So when a job puts
more worker processes on the machine than it has GPUs, the launcher uses MPS:

  --mps=auto (default)  uses a control daemon that already runs; else starts
                        one for the job (its own pipe and log folders, so it
                        never touches another user's daemon) and stops it at
                        the end; when it cannot, says why and what that costs,
                        and runs without.
  --mps=on              the same, but a job that cannot have MPS does not run.
  --mps=off             never; says what that costs when workers share a GPU.

Replicas of one worker (--replicas) share one process and need no MPS.
Everything that asks the machine (nvidia-smi, the daemon) goes through a
`System` object, so the decisions are tested without a GPU.
"""

import os
import shutil
import subprocess
import tempfile
import time

CONTROL = "nvidia-cuda-mps-control"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
# What time-slicing cost on the one measured GPU (4 workers, docs/gpu.md).
SLOWDOWN_NOTE = ("they take turns on it (time-slicing; 4 workers of the demo "
                 "ran about 10x slower per worker on an H100)")


class MpsError(Exception):
    """MPS was required (--mps=on) and cannot be had; one line for the user."""


class System:
    """The machine as the launcher sees it; tests pass a fake."""

    def __init__(self, environ=None):
        self.environ = dict(os.environ if environ is None else environ)

    def which(self, name):
        return shutil.which(name, path=self.environ.get("PATH"))

    def run(self, cmd, stdin_text=None, env=None, timeout=30):
        """(returncode, stdout + stderr); (None, why) when it cannot run."""
        try:
            p = subprocess.run(cmd, input=stdin_text, capture_output=True,
                               text=True, timeout=timeout,
                               env=self.environ if env is None else env)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, str(e)
        return p.returncode, (p.stdout or "") + (p.stderr or "")

    def exists(self, path):
        return os.path.exists(path)

    def make_dir(self):
        return tempfile.mkdtemp(prefix="bnps-mps-", dir="/tmp")

    def remove_dir(self, path):
        shutil.rmtree(path, ignore_errors=True)

    def sleep(self, seconds):
        time.sleep(seconds)


def visible_gpus(system):
    """(count, why): the GPUs CUDA processes would see here."""
    if not system.which("nvidia-smi"):
        return 0, "no nvidia-smi (no NVIDIA driver)"
    rc, out = system.run(["nvidia-smi", "-L"], timeout=20)
    if rc != 0:
        return 0, "nvidia-smi -L failed: %s" % (out.strip().splitlines() or ["?"])[-1]
    count = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    visible = system.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v for v in visible.split(",") if v.strip()]
        # CUDA stops at the first invalid entry ("-1" hides everything).
        valid = 0
        for v in ids:
            if v.strip().startswith("-"):
                break
            valid += 1
        count = min(count, valid)
        if count == 0:
            return 0, "CUDA_VISIBLE_DEVICES=%r hides every GPU" % visible
    return count, "%d GPU%s visible" % (count, "" if count == 1 else "s")


def worker_device(extra):
    """The --device the workers get (the last one given; default auto)."""
    device = "auto"
    for flag in extra:
        if flag.startswith("--device="):
            device = flag.split("=", 1)[1]
    return device


def pipe_dir(environ):
    return environ.get("CUDA_MPS_PIPE_DIRECTORY", DEFAULT_PIPE_DIR)


def daemon_running(system, environ):
    """True when an MPS control daemon answers on `environ`'s pipe folder."""
    if not system.exists(os.path.join(pipe_dir(environ), "control")):
        return False
    rc, _ = system.run([CONTROL], stdin_text="get_server_list\n", env=environ,
                       timeout=10)
    return rc == 0


class Plan:
    """What the launcher does about MPS, and the line it says about it."""

    def __init__(self, action, message):
        self.action = action  # "none" | "use" | "start" | "without"
        self.message = message

    def __repr__(self):
        return "Plan(%r, %r)" % (self.action, self.message)


def plan(mode, device, workers, system):
    """Decides from --mps, the workers' --device and the machine.

    Raises MpsError when mode is "on" and MPS cannot be had.
    """
    if mode not in ("auto", "on", "off"):
        raise ValueError("--mps must be auto, on or off")
    if device == "cpu":
        return Plan("none", None)
    gpus, why = visible_gpus(system)
    if gpus == 0:
        if mode == "on":
            raise MpsError("--mps=on but no GPU is usable here (%s)" % why)
        return Plan("none", None)
    if workers <= gpus:
        return Plan("none", "%d worker%s on %s: one GPU each, no MPS needed"
                    % (workers, "" if workers == 1 else "s", why))
    sharing = "%d workers share %s: " % (workers, why)
    if mode == "off":
        return Plan("without", sharing + "--mps=off, so " + SLOWDOWN_NOTE)
    if daemon_running(system, system.environ):
        return Plan("use", sharing + "using the MPS daemon that runs (pipe "
                    "folder %s)" % pipe_dir(system.environ))
    if not system.which(CONTROL):
        why_not = "%s is not on PATH (it comes with the NVIDIA driver)" % CONTROL
        if mode == "on":
            raise MpsError("--mps=on but " + why_not)
        return Plan("without", sharing + "no MPS: %s, so %s; install it or "
                    "pass --workers=%d" % (why_not, SLOWDOWN_NOTE, gpus))
    return Plan("start", sharing + "starting an MPS daemon for this job")


class Daemon:
    """An MPS control daemon started for one job, in folders of its own."""

    def __init__(self, system):
        self.system = system
        self.root = None
        self.env = None

    def start(self, wait_s=10.0):
        """Starts it; returns None, or why it did not start."""
        self.root = self.system.make_dir()
        pipe = os.path.join(self.root, "pipe")
        log = os.path.join(self.root, "log")
        for d in (pipe, log):
            os.makedirs(d, exist_ok=True)
        self.env = dict(self.system.environ, CUDA_MPS_PIPE_DIRECTORY=pipe,
                        CUDA_MPS_LOG_DIRECTORY=log)
        rc, out = self.system.run([CONTROL, "-d"], env=self.env, timeout=30)
        if rc != 0:
            self._clean()
            return "%s -d failed: %s" % (CONTROL, out.strip() or "exit %s" % rc)
        deadline = time.monotonic() + wait_s
        while True:
            if daemon_running(self.system, self.env):
                return None
            if time.monotonic() >= deadline:
                self.stop()
                return "the MPS daemon did not answer within %gs" % wait_s
            self.system.sleep(0.1)

    def worker_env(self):
        """The variables that point the workers' CUDA at this daemon."""
        return {k: self.env[k] for k in ("CUDA_MPS_PIPE_DIRECTORY",
                                          "CUDA_MPS_LOG_DIRECTORY")}

    def stop(self, wait_s=10.0):
        """Asks the daemon to quit (it ends its servers) and removes its
        folders; returns None, or what went wrong."""
        if self.env is None:
            return None
        rc, out = self.system.run([CONTROL], stdin_text="quit\n", env=self.env,
                                  timeout=wait_s)
        problem = None
        if rc != 0:
            problem = "stopping the MPS daemon: %s" % (out.strip() or rc)
        else:
            deadline = time.monotonic() + wait_s
            while self.system.exists(os.path.join(self.env["CUDA_MPS_PIPE_DIRECTORY"],
                                                  "control")):
                if time.monotonic() >= deadline:
                    problem = "the MPS daemon did not quit within %gs" % wait_s
                    break
                self.system.sleep(0.1)
        self._clean()
        return problem

    def _clean(self):
        if self.root:
            self.system.remove_dir(self.root)
        self.root = None
        self.env = None


def setup(mode, device, workers, system, say):
    """Plans and, when needed, starts a daemon. Returns (daemon or None, the
    variables every worker gets). Raises MpsError under --mps=on."""
    p = plan(mode, device, workers, system)
    if p.message:
        say("gpu: " + p.message)
    if p.action != "start":
        return None, {}
    daemon = Daemon(system)
    why = daemon.start()
    if why is None:
        say("gpu: MPS daemon running (pipe folder %s); stopped at the end"
            % daemon.env["CUDA_MPS_PIPE_DIRECTORY"])
        return daemon, daemon.worker_env()
    if mode == "on":
        raise MpsError("--mps=on but the MPS daemon did not start: " + why)
    say("gpu: no MPS: %s; the workers run without it, so %s" % (why, SLOWDOWN_NOTE))
    return None, {}
