"""Running one row of the matrix: the launcher as a child process (bounded,
stopped cleanly on a signal), the run's figures read from its summary.json,
its failure reason from the launcher's output; and the machine's description.
"""

import json
import os
import platform
import re
import signal
import subprocess
import time

from .matrix import run_command
from .stats import mean

DEVICE_RE = re.compile(r"bnps_worker \d+/\d+: policy \S+, (\w+), model depth (\d+) "
                       r"width (\d+) \((\d+) weights\)")


def failure_reason(log_text, code):
    """(reason, detail) from the launcher's output: its FAILED line (or usage
    error) and the last line of the blamed process's stderr tail."""
    reason, detail = None, None
    lines = log_text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"bnps_launch(?:\.py)?: (?:FAILED: |error: )(.*)", line)
        if m and reason is None:
            reason = m.group(1).strip()
            tail = []
            for follow in lines[i + 1:]:
                if follow.startswith("bnps_launch: last "):
                    continue
                if not follow.startswith("  "):
                    break
                tail.append(follow.strip())
            if tail:
                detail = tail[-1]
    if reason is None:
        reason = "the launcher exited with code %s" % code
    return reason, detail


def read_summary(run, run_dir):
    """Fills run's figures from <run_dir>/summary.json; returns a problem or None."""
    path = os.path.join(run_dir, "summary.json")
    try:
        with open(path, encoding="utf-8") as f:
            summary = json.load(f)
        reports = [r for r in summary.get("reports") or [] if isinstance(r, dict)]
    except (OSError, ValueError) as e:
        return "no readable summary.json (%s)" % e
    if len(reports) != run["workers"]:
        return "%d of %d worker reports" % (len(reports), run["workers"])
    w0 = next((r for r in reports if r.get("worker") == 0), reports[0])
    run["launcher_wall_s"] = summary.get("wall_s")
    run["launcher_policy"] = summary.get("policy")  # policy::JobPolicyName
    run["steps"] = w0.get("steps")
    run["epochs_done"] = w0.get("epochs")
    run["test_accuracy"] = w0.get("test_accuracy")
    run["test_accuracy_recal"] = w0.get("test_accuracy_recal")
    run["train_loss_first"] = mean(r.get("train_loss_first") for r in reports)
    run["train_loss_last"] = mean(r.get("train_loss_last") for r in reports)
    ips = [r.get("images_per_second") for r in reports]
    run["images_per_second"] = sum(v for v in ips if v is not None)
    ms = {}
    for key in ("total", "compute", "bn_sync", "grad_sync"):
        per = [1000.0 * (r.get("seconds") or {}).get(key, 0.0) / r["steps"]
               for r in reports if r.get("steps")]
        ms[key] = mean(per)
    run["ms_per_step"] = ms
    run["finish_s"] = mean((r.get("seconds") or {}).get("finish") for r in reports)
    run["max_staleness"] = max((r.get("max_staleness") or 0) for r in reports)
    run["history"] = w0.get("history") or []
    run["evals"] = w0.get("evals") or []
    if run["test_accuracy"] is None:
        return "worker 0 reported no test accuracy"
    return None


def device_line(run_dir):
    try:
        with open(os.path.join(run_dir, "w0.log"), encoding="utf-8", errors="replace") as f:
            for line in f:
                m = DEVICE_RE.search(line)
                if m:
                    return {"device": m.group(1), "depth": int(m.group(2)),
                            "width": int(m.group(3)), "weights": int(m.group(4))}
    except OSError:
        pass
    return None


class Stop(Exception):
    """SIGTERM/SIGHUP arrived (SIGINT is KeyboardInterrupt)."""


def on_stop_signal(signum, frame):
    raise Stop(signal.Signals(signum).name)


def stop_launcher(proc):
    """SIGTERMs the launcher, which then stops its cluster (after a Ctrl-C on
    a terminal it has SIGINT already; a second signal only makes it SIGKILL
    its children without the grace period), and SIGKILLs the launcher if it is
    still there after 30 s. Bounded: ~40 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def execute(config, run, inject):
    """Runs one launcher to the end (bounded by its --timeout_s plus a margin)
    and fills `run`."""
    run_dir = os.path.join(config["out_dir"], run["id"])
    os.makedirs(run_dir, exist_ok=True)
    cmd = run_command(config, run, run_dir, inject)
    run["command"] = cmd
    run["out_dir"] = run_dir
    log_path = os.path.join(run_dir, "launcher.log")
    t0 = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            # The launcher stops itself at --timeout_s; this is the backstop.
            code = proc.wait(timeout=config["timeout_s"] + 60)
        except subprocess.TimeoutExpired:
            stop_launcher(proc)
            code = None
        except (KeyboardInterrupt, Stop):
            stop_launcher(proc)
            raise
    run["wall_s"] = time.monotonic() - t0
    run["exit_code"] = code
    try:  # other work on the machine slows the runs (not their accuracy)
        run["load_average"] = [round(v, 2) for v in os.getloadavg()]
    except OSError:
        pass
    with open(log_path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    run["worker_info"] = device_line(run_dir)
    if code is None:
        run.update(status="failed", reason="no result within --timeout_s=%g + 60 s; "
                   "stopped" % config["timeout_s"], detail=None)
    elif code != 0:
        reason, detail = failure_reason(text, code)
        run.update(status="failed", reason=reason, detail=detail)
    else:
        problem = read_summary(run, run_dir)
        if problem:
            run.update(status="failed", reason=problem, detail=None)
        else:
            run.update(status="ok", reason=None, detail=None)


def machine_info():
    info = {"cpu": None, "cores": os.cpu_count(), "ram_gib": None,
            "platform": platform.platform(), "python": platform.python_version(),
            "gpus": [], "load_average": None}
    try:
        info["cores_available"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        info["cores_available"] = os.cpu_count()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    info["ram_gib"] = round(int(line.split()[1]) / 1024.0 / 1024.0, 1)
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=15)
        if r.returncode == 0:
            info["gpus"] = [l.strip() for l in r.stdout.splitlines() if l.strip()]
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        info["load_average"] = [round(v, 2) for v in os.getloadavg()]
    except OSError:
        pass
    return info
