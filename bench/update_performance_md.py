#!/usr/bin/env python3
"""Regenerates docs/performance.md from one run of the benchmarks.

Builds the benchmarks with Bazel (-c opt), runs them one after another, takes
the Markdown tables they print verbatim and writes docs/performance.md: what
each table measures, the machine and date, the command that regenerates the
file, each table, and a short reading of it. The reading is a template below
plus figures computed from the table itself, so it stays true on any run.

The script fails (exit status 1, one message on stderr, the old document left
as it was) if a benchmark fails or if any expected table is missing, empty,
short of rows, or has a cell that is not a number (a failed cell prints
"fail[N]"), so the document cannot silently go empty.

    python3 bench/update_performance_md.py             # the real run
    python3 bench/update_performance_md.py --save_logs /tmp/perf
    python3 bench/update_performance_md.py --from_logs /tmp/perf

--from_logs DIR renders logs saved earlier (or canned ones, as the test does)
without building or running anything. Standard library only; runs under any
python3.
"""

from __future__ import print_function

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

# step_overhead.py (beside this file) runs the servers and workers and says
# which of its tables the document takes; performance_text.py holds the
# document's prose. Both are found when imported from a Bazel runfiles tree
# too.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import performance_text  # noqa: E402  (needs the path above)
import step_overhead  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "tools", "gpu"))
import summarize as gpu_summary  # noqa: E402  (tools/gpu/summarize.py)

REGENERATE = "python3 bench/update_performance_md.py"
TARGETS = [
    "//bench:ps_benchmark",
    "//bn:bn_benchmark",
    "//bench:optimizer_benchmark",
    "//server:bnps_server",
    "//worker:bnps_worker",
]
BUILD_COMMAND = ["bazel", "build", "-c", "opt"] + TARGETS

# Each benchmark: the log it writes, how it is run (environment, path under
# bazel-bin, arguments), and how long it may take.
BENCHMARKS = [
    {
        "log": "ps_benchmark.txt",
        "env": {},
        "binary": "bench/ps_benchmark",
        "args": [],
        "quick_args": ["--quick"],
        "timeout": 1800,
    },
    {
        "log": "bn_benchmark.txt",
        "env": {"OMP_NUM_THREADS": "1"},
        "binary": "bn/bn_benchmark",
        "args": [],
        "quick_args": ["--reps=3"],
        "timeout": 600,
    },
    {
        "log": "optimizer_benchmark.txt",
        "env": {},
        "binary": "bench/optimizer_benchmark",
        "args": [],
        "quick_args": ["--reps=3"],
        "timeout": 600,
    },
    {
        # A script, not a binary: run with this python and --bin_dir.
        "log": "step_overhead.txt",
        "env": {},
        "script": "bench/step_overhead.py",
        "args": ["--runs", "3"],
        "quick_args": ["--steps", "30", "--warmup", "5",
                       "--quick_round_trip"],
        "timeout": 1800,
    },
]
MACHINE_LOG = "machine.txt"

NUMBER = re.compile(r"^-?\d+(\.\d+)?\*?$")
SEPARATOR = re.compile(r"^\|(\s*:?-+:?\s*\|)+$")

BN_KERNELS = [
    "moments",
    "normalize",
    "forward (moments+normalize)",
    "backward reduce",
    "backward input",
]

# The tables the document must hold. "heading": the "## " line the table
# follows in its log (None: the log's only table). "header": its columns.
# "keys": the columns that name a row, and "rows" the rows expected (each as
# the tuple of those cells). "numbers": columns that must be numbers;
# "ratios": columns that must be numbers or "-" (no ratio defined).
TABLES = [
    {
        "id": "bn_sync",
        "title": ("BN-sync round trip of one layer: bnps against gloo and "
                  "bare gRPC"),
        "log": "ps_benchmark.txt",
        "heading": "## BN-sync round trip, one layer",
        "header": ["C", "W", "bnps p50", "bnps p99", "gloo p50", "gloo p99",
                   "echo p50", "echo p99", "star p50", "star p99",
                   "tcp p50", "tcp p99", "bnps/gloo", "bnps/echo",
                   "bnps/star", "bnps/tcp", "star/gloo", "star/tcp"],
        "keys": [0, 1],
        "rows": [(c, w) for c in ("64", "256", "1024")
                 for w in ("1", "2", "4", "8")],
        "numbers": list(range(2, 12)),
        "ratios": list(range(12, 18)),
    },
    {
        "id": "grad",
        "title": "Gradient push + pull: bnps against bare gRPC",
        "log": "ps_benchmark.txt",
        "heading": "## Gradient push + pull",
        "header": ["MB", "S", "keys per shard", "bnps MB/s", "echo MB/s",
                   "bnps/echo"],
        "keys": [0, 1],
        "rows": [(mb, s) for s in ("1", "2") for mb in ("1", "16", "64")],
        "numbers": [3, 4, 5],
        "ratios": [],
    },
    {
        "id": "bn_kernels",
        "title": "CPU BN kernels against memcpy",
        "log": "bn_benchmark.txt",
        "heading": None,
        "header": ["shape", "kernel", "time us", "MB moved", "GB/s",
                   "memcpy GB/s", "ratio"],
        "keys": [0, 1],
        "rows": [(shape, k)
                 for shape in ("[32, 64, 28, 28]", "[32, 256, 14, 14]")
                 for k in BN_KERNELS],
        "numbers": [2, 3, 4, 5, 6],
        "ratios": [],
    },
    {
        "id": "optimizer",
        "title": "The server's optimizer step against memcpy",
        "log": "optimizer_benchmark.txt",
        "heading": None,
        "header": ["elements", "MB", "SGD step ms", "SGD GB/s", "memcpy GB/s",
                   "SGD/memcpy"],
        "keys": [0],
        "rows": [(str(1 << k),) for k in (18, 20, 22, 24)],
        "numbers": [1, 2, 3, 4, 5],
        "ratios": [],
    },
    # Its section also shows the tool's other tables ("extra").
    dict(step_overhead.DOC_TABLES[0], extra=step_overhead.DOC_TABLES[1:]),
]

INTRO = performance_text.INTRO
WHAT = performance_text.WHAT
READING = performance_text.READING

# For each table, the ratio columns summarized under it.
SUMMARY_COLUMNS = {
    "bn_sync": ["bnps/gloo", "bnps/star", "star/gloo", "bnps/echo",
                "star/tcp"],
    "grad": ["bnps/echo"],
    "bn_kernels": ["ratio"],
    "optimizer": ["SGD/memcpy"],
}


class Failure(Exception):
    """A benchmark or its output is not what the document needs."""


class Table(object):
    def __init__(self, heading, lines, header, rows, notes):
        self.heading = heading  # the "## " line above it, or None
        self.lines = lines  # the table's lines as printed
        self.header = header  # list of column names
        self.rows = rows  # list of lists of cells
        self.notes = notes  # non-table lines after it, before the next heading


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_tables(text):
    """Every Markdown table in `text`, in order."""
    tables = []
    heading = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        if line.startswith("## "):
            heading = line
            i += 1
            continue
        if not line.startswith("|"):
            i += 1
            continue
        block = []
        while i < len(lines) and lines[i].startswith("|"):
            block.append(lines[i].rstrip())
            i += 1
        has_separator = len(block) > 1 and SEPARATOR.match(block[1])
        rows = block[2:] if has_separator else []
        notes = []
        while (i < len(lines) and not lines[i].startswith("|") and
               not lines[i].startswith("#")):
            if lines[i].strip():
                notes.append(lines[i].rstrip())
            i += 1
        tables.append(Table(heading, block, cells(block[0]),
                            [cells(r) for r in rows], notes))
    return tables


def find_table(spec, text):
    """The table `spec` names, checked; raises Failure naming what is wrong."""
    where = "{} in {}".format(spec["id"], spec["log"])
    tables = parse_tables(text)
    if spec["heading"] is None:
        found = tables[:1]
    else:
        found = [t for t in tables
                 if t.heading and t.heading.startswith(spec["heading"])]
    if not found:
        raise Failure("{}: no table{}".format(
            where, "" if spec["heading"] is None
            else " under '{}'".format(spec["heading"])))
    table = found[0]
    if table.header != spec["header"]:
        raise Failure("{}: columns are {}, expected {}".format(
            where, table.header, spec["header"]))
    if not table.rows:
        raise Failure("{}: the table is empty".format(where))
    seen = []
    for row in table.rows:
        if len(row) != len(spec["header"]):
            raise Failure("{}: row '{}' has {} cells, expected {}".format(
                where, " | ".join(row), len(row), len(spec["header"])))
        key = tuple(row[k] for k in spec["keys"])
        if key not in spec["rows"]:
            raise Failure("{}: unexpected row {}".format(where, key))
        if key in seen:
            raise Failure("{}: row {} appears twice".format(where, key))
        seen.append(key)
        for c in spec["numbers"]:
            if not NUMBER.match(row[c]):
                raise Failure("{}: row {}, column '{}' is '{}', not a number{}"
                              .format(where, key, spec["header"][c], row[c],
                                      footnote(table, row[c])))
        for c in spec["ratios"]:
            if row[c] != "-" and not NUMBER.match(row[c]):
                raise Failure("{}: row {}, column '{}' is '{}'".format(
                    where, key, spec["header"][c], row[c]))
    missing = [k for k in spec["rows"] if k not in seen]
    if missing:
        raise Failure("{}: missing rows {} (has {} of {})".format(
            where, missing, len(seen), len(spec["rows"])))
    return table


def footnote(table, cell):
    m = re.match(r"^fail\[(\d+)\]$", cell)
    if not m:
        return ""
    for note in table.notes:
        if note.startswith("[{}] ".format(m.group(1))):
            return " ({})".format(note)
    return ""


def number(cell):
    return float(cell.rstrip("*"))


def spread(values):
    """'a to b (median m)' of a non-empty list of numbers."""
    values = sorted(values)
    n = len(values)
    median = values[n // 2] if n % 2 else (
        values[n // 2 - 1] + values[n // 2]) / 2
    if n == 1:
        return "{:.2f}".format(values[0])
    return "{:.2f} to {:.2f} (median {:.2f})".format(values[0], values[-1],
                                                      median)


def summary(spec, table, cpus):
    """Figures from the table: the spread of each ratio column (for the BN
    table by W, as a table), and for the BN table a note on the rows with
    more processes than this machine has CPUs."""
    if spec["id"] == "step_overhead":
        return step_overhead.doc_summary(table.extra)
    names = SUMMARY_COLUMNS[spec["id"]]
    columns = [table.header.index(name) for name in names]
    if spec["id"] != "bn_sync":
        parts = []
        for name, c in zip(names, columns):
            values = [number(r[c]) for r in table.rows if r[c] != "-"]
            parts.append("{} {}".format(name, spread(values)))
        return "In this run, over the {} rows: {}.".format(
            len(table.rows), "; ".join(parts))
    w_col = table.header.index("W")
    workers = sorted(set(int(r[w_col]) for r in table.rows))
    out = ["In this run, the ratios over the rows of each W:", "",
           "| W | " + " | ".join(names) + " |",
           "|---:|" + "---:|" * len(names)]
    for w in workers:
        rows = [r for r in table.rows if int(r[w_col]) == w]
        cells = []
        for c in columns:
            values = [number(r[c]) for r in rows if r[c] != "-"]
            cells.append(spread(values) if values else "-")
        out.append("| {} | {} |".format(w, " | ".join(cells)))
    text = "\n".join(out)
    crowded = [w for w in workers if w + 1 > cpus]
    if cpus and crowded:
        text += (
            "\n\nThis machine has {} logical CPUs. A row runs W + 1 processes "
            "for bnps, echo, star and tcp (the workers and the server) and W for "
            "gloo; where they outnumber the CPUs (here from W = {}) they take "
            "turns on them, and the row times the scheduler as much as the "
            "exchange.".format(cpus, crowded[0]))
    return text


def logical_cpus(machine):
    for k, v in machine:
        if k == "Cores":
            m = re.match(r"(\d+) logical CPUs", v)
            if m:
                return int(m.group(1))
    return 0


def read_machine_log(path):
    """The label: value lines of `path`, in order."""
    info = []
    with open(path) as f:
        for line in f:
            if ":" in line:
                k, v = line.split(":", 1)
                info.append((k.strip(), v.strip()))
    return info


def read_file(path, default=""):
    try:
        with open(path) as f:
            return f.read()
    except (IOError, OSError):
        return default


def machine_info(root):
    """The machine, the date and the source, as label: value."""
    cpu = "unknown"
    logical = 0
    for line in read_file("/proc/cpuinfo").splitlines():
        if line.startswith("model name") and cpu == "unknown":
            cpu = line.split(":", 1)[1].strip()
        if line.startswith("processor"):
            logical += 1
    cores = "{} logical CPUs".format(logical or os.cpu_count())
    if hasattr(os, "sched_getaffinity"):
        usable = len(os.sched_getaffinity(0))
        if logical and usable != logical:
            cores += " ({} usable by the run)".format(usable)
    memory = "unknown"
    m = re.search(r"^MemTotal:\s+(\d+) kB", read_file("/proc/meminfo"), re.M)
    if m:
        memory = "{:.1f} GiB".format(int(m.group(1)) / 1024.0 / 1024.0)
    u = platform.uname()
    load = read_file("/proc/loadavg").split()
    info = [
        ("Date", time.strftime("%Y-%m-%d", time.gmtime()) + " (UTC)"),
        ("CPU", cpu),
        ("Cores", cores),
        ("Memory", memory),
        ("Kernel", "{} {} ({})".format(u[0], u[2], u[4])),
    ]
    if load:
        info.append(("Load average when the run began",
                     "{} (1 min); the machine is shared".format(load[0])))
    commit = git_commit(root)
    if commit:
        info.append(("Source", commit))
    return info


def git_commit(root):
    try:
        head = subprocess.check_output(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root,
            stderr=subprocess.DEVNULL, universal_newlines=True).strip()
        dirty = subprocess.check_output(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root, stderr=subprocess.DEVNULL,
            universal_newlines=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return "commit {}{}".format(head, " with local changes" if dirty else "")


def settings_line(text):
    for line in text.splitlines():
        if line.startswith("settings: "):
            return line[len("settings: "):]
    return ""


def commands(quick):
    """The commands the run consists of, as shown in the document."""
    lines = [" ".join(BUILD_COMMAND)]
    for b in BENCHMARKS:
        env = "".join("{}={} ".format(k, v)
                      for k, v in sorted(b["env"].items()))
        args = b["args"] + (b["quick_args"] if quick else [])
        program = ("python3 " + b["script"] if "script" in b
                   else "bazel-bin/" + b["binary"])
        lines.append((env + program + " " + " ".join(args)).rstrip())
    return lines


def render(logs, machine, quick):
    """The document from the logs (log name -> text); raises Failure."""
    checked = [(spec, find_table(spec, logs[spec["log"]])) for spec in TABLES]
    for spec, table in checked:
        table.extra = {e["id"]: find_table(e, logs[e["log"]])
                       for e in spec.get("extra", [])}
        table.extra[spec["id"]] = table
    out = ["# Performance", "", INTRO]
    out += ["To regenerate this file:", "", "```sh", REGENERATE, "```", "",
            "It builds the benchmarks with Bazel and runs them one after "
            "another",
            "(\"Time taken\" below says how long that took here), which is:",
            "", "```sh"] + commands(quick) + ["```", ""]
    if quick:
        out += ["**This run used --quick: fewer repetitions, for trying the "
                "script; not for reading.**", ""]
    out += ["## Machine", ""]
    out += ["- {}: {}".format(k, v) for k, v in machine] + [""]
    cpus = logical_cpus(machine)
    settings_shown = False
    for spec, table in checked:
        out += ["## " + spec["title"], "", WHAT[spec["id"]], ""]
        if spec["log"] == "ps_benchmark.txt" and not settings_shown:
            settings = settings_line(logs[spec["log"]])
            if settings:
                out += ["`ps_benchmark`'s settings (both of its tables): " +
                        settings + ".", ""]
            settings_shown = True
        elif spec["log"] == "step_overhead.txt":
            settings = settings_line(logs[spec["log"]])
            if settings:
                out += ["`step_overhead`'s settings: " + settings + ".", ""]
        if spec["heading"]:
            caption = table.heading[3:].strip()
            out += ["`{}`: {}".format(spec["log"][:-4], caption), ""]
        out += table.lines + [""]
        for e in spec.get("extra", []):
            out += ["`{}`: {}".format(e["log"][:-4],
                                      table.extra[e["id"]].heading[3:].strip()),
                    ""] + table.extra[e["id"]].lines + [""]
        notes = [n for n in table.notes if n.startswith("*") or
                 n.startswith("[")]
        if notes:
            out += notes + [""]
        out += [READING[spec["id"]], "", summary(spec, table, cpus), ""]
    return "\n".join(out)


def run(cmd, cwd, env=None, timeout=None):
    """stdout of `cmd`; raises Failure with its stderr if it fails."""
    print("update_performance_md: running " + " ".join(cmd), file=sys.stderr)
    sys.stderr.flush()
    full_env = dict(os.environ)
    full_env.update(env or {})
    p = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise Failure("{} ran past {} s".format(" ".join(cmd), timeout))
    if p.returncode != 0:
        raise Failure("{} exited with status {}:\n{}".format(
            " ".join(cmd), p.returncode, err[-4000:]))
    return out


def measure(root, logs_dir, quick):
    """Builds and runs the benchmarks, writing their logs to `logs_dir`."""
    machine = machine_info(root)
    start = time.time()
    run(BUILD_COMMAND, root)
    bazel_bin = run(["bazel", "info", "-c", "opt", "bazel-bin"], root).strip()
    for b in BENCHMARKS:
        args = b["args"] + (b["quick_args"] if quick else [])
        if "script" in b:
            cmd = [sys.executable, os.path.join(root, b["script"]),
                   "--bin_dir", bazel_bin]
        else:
            cmd = [os.path.join(bazel_bin, b["binary"])]
        out = run(cmd + args, root, env=b["env"], timeout=b["timeout"])
        with open(os.path.join(logs_dir, b["log"]), "w") as f:
            f.write(out)
    machine.append(("Time taken", "{:.1f} min, build included".format(
        (time.time() - start) / 60)))
    with open(os.path.join(logs_dir, MACHINE_LOG), "w") as f:
        for k, v in machine:
            f.write("{}: {}\n".format(k, v))
        if quick:
            f.write("quick: yes\n")


def load_logs(logs_dir, root):
    logs = {}
    for b in BENCHMARKS:
        path = os.path.join(logs_dir, b["log"])
        if not os.path.isfile(path):
            raise Failure("no log {}".format(path))
        logs[b["log"]] = read_file(path)
    machine_path = os.path.join(logs_dir, MACHINE_LOG)
    quick = False
    if os.path.isfile(machine_path):
        machine = read_machine_log(machine_path)
        quick = ("quick", "yes") in machine
        machine = [(k, v) for k, v in machine if k != "quick"]
    else:
        machine = machine_info(root)
    return logs, machine, quick


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(
        description="Regenerates docs/performance.md from a benchmark run.")
    parser.add_argument(
        "--from_logs", metavar="DIR",
        help="render the logs in DIR (ps_benchmark.txt, bn_benchmark.txt, "
        "optimizer_benchmark.txt, step_overhead.txt and, if there, "
        "machine.txt) instead of "
        "building and running the benchmarks")
    parser.add_argument(
        "--save_logs", metavar="DIR",
        help="keep the benchmarks' output in DIR (for --from_logs)")
    parser.add_argument(
        "--output", metavar="FILE",
        default=os.path.join(root, "docs", "performance.md"),
        help="the document to write (default: docs/performance.md)")
    parser.add_argument(
        "--quick", action="store_true",
        help="fewer repetitions, to try the script; the document says so")
    args = parser.parse_args(argv)

    tmp = None
    try:
        if args.from_logs:
            logs_dir = args.from_logs
        else:
            if not os.path.isfile(os.path.join(root, "WORKSPACE")):
                raise Failure("{} is not the repository root (no WORKSPACE)"
                              .format(root))
            if args.save_logs:
                logs_dir = args.save_logs
                if not os.path.isdir(logs_dir):
                    os.makedirs(logs_dir)
            else:
                tmp = tempfile.mkdtemp(prefix="bnps_perf_")
                logs_dir = tmp
            measure(root, logs_dir, args.quick)
        logs, machine, quick = load_logs(logs_dir, root)
        text = render(logs, machine, quick)
    except Failure as e:
        print("update_performance_md: error: {}".format(e), file=sys.stderr)
        print("update_performance_md: {} was not written".format(args.output),
              file=sys.stderr)
        return 1
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    # The GPU section comes from a GPU run (tools/gpu/summarize.py), not from
    # this one: the document keeps it as it was.
    text = gpu_summary.keep_gpu_section(args.output, text)
    with open(args.output + ".tmp", "w") as f:
        f.write(text)
    os.rename(args.output + ".tmp", args.output)
    print("update_performance_md: wrote {}".format(args.output),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
