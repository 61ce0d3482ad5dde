"""Process supervision for tools/bnps_launch.py: each child in a session of
its own that dies with the launcher (PR_SET_PDEATHSIG), its stdout and stderr
forwarded line by line to one console and to its log, a server's
"listening on HOST:PORT" line read for its port, and the stopping: SIGTERM,
then SIGKILL after a grace period; plus the signals and the deadline the
launcher's main loop polls. Standard library only (and bnps.cluster's
parser of that line, from python/ beside tools/).
"""

import collections
import re
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(1, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "python"))
from bnps.cluster import parse_listening  # noqa: E402  (needs the path above)

PROGRESS_RE = re.compile(r"^step \d+")
TAIL_LINES = 20
POLL_S = 0.05


class Failure(Exception):
    """The run failed. exit_code is what the launcher exits with; proc, when
    set, is the process to blame (its stderr tail is printed)."""

    def __init__(self, message, exit_code=1, proc=None):
        super().__init__(message)
        self.exit_code = exit_code
        self.proc = proc


# ----------------------------------------------------------------------------
# Output


class Console:
    """Writes lines to a stream from many threads. With live=True (a terminal),
    status() shows one line that is rewritten in place; line() scrolls above it."""

    def __init__(self, stream, live):
        self._stream = stream
        self._live = live
        self._lock = threading.Lock()
        self._status = ""

    def line(self, text):
        with self._lock:
            clear = "\r\x1b[K" if self._status else ""
            self._write(clear + text + "\n" + self._status)

    def status(self, text):
        if not self._live:
            self.line(text)
            return
        width = shutil.get_terminal_size((100, 24)).columns - 1
        with self._lock:
            self._status = text[:max(width, 20)]
            self._write("\r\x1b[K" + self._status)

    def end_status(self):
        """Leaves the last status line on screen and moves below it."""
        with self._lock:
            if self._status:
                self._status = ""
                self._write("\n")

    def _write(self, text):
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):
            pass  # A closed stdout (| head) must not stop the pipes being drained.


def say(console, text):
    console.line("bnps_launch: " + text)


# ----------------------------------------------------------------------------
# Processes


class Proc:
    """One started process: its Popen, log file, reader threads, stderr tail,
    and (servers) the port it printed."""

    def __init__(self, name, cmd, log_path, env=None):
        self.name = name
        self.cmd = cmd
        self.log_path = log_path
        self.env = dict(env or {})  # variables added to the launcher's own
        self.popen = None
        self.log = None
        self.log_lock = threading.Lock()
        self.readers = []
        self.stderr_tail = collections.deque(maxlen=TAIL_LINES)
        self.address = None
        self.listening = threading.Event()
        self.restarts = 0  # times this process was started again

    def running(self):
        return self.popen is not None and self.popen.poll() is None

    def returncode(self):
        return None if self.popen is None else self.popen.poll()


def die_with_parent():
    """Runs in the child before exec: Linux sends it SIGTERM when the
    launcher dies, even by SIGKILL, so no server or worker outlives it."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the launcher's own handlers still stop everything


def start(proc, console):
    # A restarted process appends to the log of the one it replaces.
    proc.log = open(proc.log_path, "a" if proc.restarts else "w",
                    encoding="utf-8", errors="replace")
    proc.log.write("# " + shlex.join(proc.cmd) + "\n")
    proc.log.flush()
    # A session of their own: a terminal's Ctrl-C reaches only the launcher,
    # which then stops the children in order.
    try:
        proc.popen = subprocess.Popen(proc.cmd, stdin=subprocess.DEVNULL,
                                      env=dict(os.environ, **proc.env) if proc.env else None,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      start_new_session=True,
                                      preexec_fn=die_with_parent)
    except OSError as e:
        raise Failure("cannot start %s (%s): %s" % (proc.name, proc.cmd[0], e))
    for stream, is_err in ((proc.popen.stdout, False), (proc.popen.stderr, True)):
        t = threading.Thread(target=pump, args=(proc, stream, is_err, console),
                             name="%s-%s" % (proc.name, "err" if is_err else "out"),
                             daemon=True)
        t.start()
        proc.readers.append(t)
    say(console, "started %s (pid %d): %s" % (proc.name, proc.popen.pid, shlex.join(proc.cmd)))


def pump(proc, stream, is_err, console):
    """Reads one pipe of proc line by line until it closes."""
    prefix = "[%s] " % proc.name
    progress_line = proc.name == "w0" and not is_err
    for raw in iter(stream.readline, b""):
        text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        with proc.log_lock:
            proc.log.write(text + "\n")
            proc.log.flush()
        if is_err:
            proc.stderr_tail.append(text)
        elif proc.address is None:
            proc.address = parse_listening(text)
            if proc.address:
                proc.listening.set()
        if progress_line and PROGRESS_RE.match(text):
            console.status(prefix + text)
        else:
            console.line(prefix + text)
    stream.close()
    if progress_line:
        console.end_status()  # w0 is done: its last progress line stays put.


def finish_output(procs, console):
    """Waits (bounded) for the reader threads of finished processes, closes logs."""
    deadline = time.monotonic() + 2.0
    for proc in procs:
        for t in proc.readers:
            t.join(max(0.0, deadline - time.monotonic()))
    console.end_status()
    for proc in procs:
        if proc.log is not None:
            with proc.log_lock:
                proc.log.close()


def stop_all(procs, grace_s, console, interrupt):
    """SIGTERM to every started process still running, then SIGKILL after
    grace_s (at once on a second interrupt). Signals only our own children,
    only while they are unreaped, so a PID is never one that was recycled."""
    live = [p for p in procs if p.running()]
    if not live:
        return
    say(console, "stopping %s" % ", ".join(p.name for p in live))
    for p in live:
        p.popen.terminate()  # Popen skips the signal if the child was reaped.
    interrupts = interrupt.count
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and interrupt.count == interrupts:
        if not any(p.running() for p in live):
            return
        time.sleep(POLL_S)
    for p in live:
        if p.running():
            say(console, "%s still running; SIGKILL" % p.name)
            p.popen.kill()
    for p in live:
        try:
            p.popen.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            say(console, "%s (pid %d) did not exit after SIGKILL" % (p.name, p.popen.pid))


def describe_exit(code):
    if code is None:
        return "is still running"
    if code < 0:
        try:
            return "was killed by %s" % signal.Signals(-code).name
        except ValueError:
            return "was killed by signal %d" % -code
    return "exited with code %d" % code


# ----------------------------------------------------------------------------
# Signals


class Interrupt:
    """Records SIGINT/SIGTERM/SIGHUP; the main loop polls it."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self):
        self.signum = None
        self.count = 0

    def install(self):
        for s in self.SIGNALS:
            signal.signal(s, self._handle)

    def _handle(self, signum, frame):
        if self.signum is None:
            self.signum = signum
        self.count += 1


def check_interrupt(interrupt):
    if interrupt.signum is not None:
        name = signal.Signals(interrupt.signum).name
        raise Failure("interrupted by %s%s" % (
            name, " (Ctrl-C)" if interrupt.signum == signal.SIGINT else ""),
            exit_code=128 + interrupt.signum)


def check_deadline(deadline, timeout_s, procs):
    if time.monotonic() >= deadline:
        running = [p.name for p in procs if p.running()]
        raise Failure("timed out after --timeout_s=%g; still running: %s"
                      % (timeout_s, ", ".join(running) or "none"), exit_code=124)

