"""The command: run the matrix (or only print it), re-render the report from
results.json, or draw the plots only; exit statuses as documented in
experiments/compare_policies.py.
"""

import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time

from .matrix import BUDGET_MINUTES, REPO, estimate_seconds, estimate_text, plan_runs, run_command
from .options import BUILD_TARGETS, UsageError, make_config, parse_args
from .plots import PlotsUnavailable, draw_plots
from .report import document, f_acc, load_json, write_json, write_report
from .runner import Stop, execute, machine_info, on_stop_signal


def build():
    cmd = ["bazel", "build"] + BUILD_TARGETS
    print("compare_policies: $ " + shlex.join(cmd), flush=True)
    try:
        return subprocess.call(cmd, cwd=REPO)
    except FileNotFoundError:
        raise UsageError("bazel not found on PATH; cannot --build")


def fmt_eta(s):
    return "%dm%02ds" % (s // 60, s % 60)


def run_matrix(args, argv):
    config = make_config(args)
    runs = plan_runs(config)
    estimate = sum(estimate_seconds(config, r) for r in runs)
    command_line = shlex.join(["python3", "experiments/compare_policies.py"] + list(argv))
    if args.dry_run:
        config["out_dir"] = args.out_dir or "<out_dir>"
        for r in runs:
            cmd = run_command(config, r, os.path.join(config["out_dir"], r["id"]),
                              (r["policy"], r["batch_size"]) in args.inject)
            print("%-28s ~%4.0fs  %s" % (r["id"], estimate_seconds(config, r), shlex.join(cmd)))
        print("compare_policies: %d runs, estimated %s (budget %d min)"
              % (len(runs), estimate_text(estimate), BUDGET_MINUTES))
        return 0
    if args.build and build() != 0:
        print("compare_policies: error: the bazel build failed", file=sys.stderr)
        return 1
    for path in (os.path.join(args.bin_dir, "server", "bnps_server"),
                 os.path.join(args.bin_dir, "worker", "bnps_worker")):
        if not os.access(path, os.X_OK):
            raise UsageError("%s not found: run `bazel build %s`, or pass --build or "
                             "--bin_dir" % (path, " ".join(BUILD_TARGETS)))
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="bnps_compare_")
    os.makedirs(out_dir, exist_ok=True)
    config["out_dir"] = os.path.abspath(out_dir)
    results_md = os.path.abspath(args.results)
    json_path = os.path.abspath(args.results_json)
    os.makedirs(os.path.dirname(results_md), exist_ok=True)
    data = {"tool": "experiments/compare_policies.py", "command_line": command_line,
            "argv": list(argv), "config": config, "machine": machine_info(),
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "finished": None, "estimate_s": estimate, "total_wall_s": None,
            "results_json": json_path, "runs": runs}
    print("compare_policies: %d runs into %s; estimated %s"
          % (len(runs), config["out_dir"], estimate_text(estimate)), flush=True)
    t0 = time.monotonic()
    interrupted = None
    old = {s: signal.signal(s, on_stop_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        for i, run in enumerate(runs):
            inject = (run["policy"], run["batch_size"]) in args.inject
            print("compare_policies: [%d/%d] %s ..." % (i + 1, len(runs), run["id"]), flush=True)
            try:
                execute(config, run, inject)
                elapsed = time.monotonic() - t0
                if run["status"] == "ok":
                    what = "ok test_acc=%s recal=%s img/s=%.0f" % (
                        f_acc(run["test_accuracy"]), f_acc(run["test_accuracy_recal"]),
                        run["images_per_second"] or 0)
                else:
                    what = "FAILED: %s%s" % (run["reason"], ": " + run["detail"]
                                             if run.get("detail") else "")
                print("compare_policies: [%d/%d] %s %s (%.0fs; elapsed %s)" % (
                    i + 1, len(runs), run["id"], what, run["wall_s"], fmt_eta(elapsed)),
                    flush=True)
                data["total_wall_s"] = elapsed
                write_json(document(data, json_path), json_path)  # progress survives a crash
            except KeyboardInterrupt:
                interrupted = "SIGINT"
            except Stop as e:
                interrupted = str(e)
            if interrupted:
                if run.get("wall_s") is None:  # did not finish
                    run.update(status="not run", reason="interrupted by " + interrupted)
                break
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    data["total_wall_s"] = time.monotonic() - t0
    data["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    if interrupted:
        data["interrupted"] = interrupted
    plots = write_report(data, results_md, json_path, not args.no_plots)
    print("compare_policies: report %s, data %s%s" % (
        results_md, json_path, "" if plots.get("files") else " (plots skipped: %s)"
        % plots.get("skipped")), flush=True)
    if interrupted:
        return 130
    return 1 if any(r["status"] != "ok" for r in runs) else 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        if args.plots_only:
            data = load_json(args.results_json)
            try:
                plots = draw_plots(data, os.path.abspath(args.results))
            except PlotsUnavailable as e:
                print(str(e), file=sys.stderr)
                return 1
            print(json.dumps(plots))
            return 0
        if args.report_only:
            data = load_json(args.results_json)
            data["results_json"] = os.path.abspath(args.results_json)
            plots = write_report(data, os.path.abspath(args.results),
                                 os.path.abspath(args.results_json), not args.no_plots)
            print("compare_policies: report %s%s" % (
                args.results, "" if plots.get("files") else " (plots skipped: %s)"
                % plots.get("skipped")))
            return 0
        return run_matrix(args, argv)
    except UsageError as e:
        print("compare_policies: error: %s" % e, file=sys.stderr)
        return 2
