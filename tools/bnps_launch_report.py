"""The launcher's reports: each worker's JSON report (--report), the table
and the result line tools/bnps_launch.py prints at the end, and its
summary.json. Beside bnps_launch.py, which imports it."""

import json
import os
import sys


def report_path(out_dir, index):
    return os.path.join(out_dir, "worker%d.json" % index)


def load_reports(workers, out_dir):
    """Returns (reports, problems): the parsed report of each worker (None when
    missing or unreadable) and one message per problem."""
    reports, problems = [], []
    for i, w in enumerate(workers):
        path = report_path(out_dir, i)
        try:
            with open(path, encoding="utf-8") as f:
                report = json.load(f)
            if not isinstance(report, dict):
                raise ValueError("not a JSON object")
            reports.append(report)
        except (OSError, ValueError) as e:
            reports.append(None)
            problems.append("worker %s exited 0 but its report %s is missing or bad: %s"
                            % (w.name, path, e))
    return reports, problems


def fmt(value, spec):
    if value is None:
        return "-"
    try:
        return format(value, spec)
    except (TypeError, ValueError):
        return str(value)


def summary_table(reports):
    has_recal = any(r and r.get("test_accuracy_recal") is not None for r in reports)
    header = ["worker", "steps", "loss_first", "loss_last", "test_acc"]
    if has_recal:
        header.append("recal_acc")
    header += ["img/s", "total_s", "compute_s", "bn_sync_s", "grad_sync_s"]
    rows = [header]
    for i, r in enumerate(reports):
        if r is None:
            rows.append(["w%d" % i] + ["(no report)"] + [""] * (len(header) - 2))
            continue
        secs = r.get("seconds") or {}
        row = ["w%d" % r.get("worker", i), fmt(r.get("steps"), "d"),
               fmt(r.get("train_loss_first"), ".4f"), fmt(r.get("train_loss_last"), ".4f"),
               fmt(r.get("test_accuracy"), ".4f")]
        if has_recal:
            row.append(fmt(r.get("test_accuracy_recal"), ".4f"))
        row += [fmt(r.get("images_per_second"), ".1f")]
        row += [fmt(secs.get(k), ".2f") for k in ("total", "compute", "bn_sync", "grad_sync")]
        rows.append(row)
    widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
    return ["  ".join(cell.rjust(widths[c]) for c, cell in enumerate(row)) for row in rows]


def first_value(reports, key):
    for r in reports:
        if r and r.get(key) is not None:
            return r[key]
    return None


def result_line(args, reports, wall_s):
    acc = first_value(reports, "test_accuracy")
    line = "result: policy=%s workers=%d servers=%d test_accuracy=%s" % (
        args.policy_name, args.workers, args.servers,
        fmt(acc, ".4f") if acc is not None else "none")
    recal = first_value(reports, "test_accuracy_recal")
    if recal is not None:
        line += " test_accuracy_recal=%s" % fmt(recal, ".4f")
    return line + " wall_s=%.1f" % wall_s


def write_summary(args, extra, argv, out_dir, addresses, reports, wall_s):
    summary = {
        "command": [sys.argv[0]] + list(argv),
        "policy": args.policy_name,
        "bn_policy": args.bn_policy_used,
        "gradients": args.gradients_used,
        "servers": args.servers,
        "workers": args.workers,
        "server_addresses": addresses,
        "worker_flags": list(extra),
        "test_accuracy": first_value(reports, "test_accuracy"),
        "test_accuracy_recal": first_value(reports, "test_accuracy_recal"),
        "wall_s": wall_s,
        "reports": reports,
    }
    path = os.path.join(out_dir, "summary.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    return path
