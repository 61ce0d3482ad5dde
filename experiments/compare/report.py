"""The markdown report (docs/results.md): the tables, the generated findings,
the hand-written block kept across re-renders; and writing it with
results.json.
"""

import json
import math
import os
import re

from .axes import render_axis
from .matrix import AXES, BUDGET_MINUTES, FAMILIES, ROWS, estimate_text
from .options import UsageError
from .plots import make_plots
from .regime import portable_command, portable_data, render_regime
from .stats import aggregate, noise_floor, separated

BEGIN_HAND = "<!-- BEGIN hand-written -->"
END_HAND = "<!-- END hand-written -->"
# The one-axis matrices' results live in the same document, under this key,
# one entry per matrix (matrix.AXES), each with its own hand-written block.
ONE_AXIS = "one_axis"
# Fields of a run the one-axis report does not read (the per-interval
# training curve is most of a run's bytes): left out of results.json.
SLIM_DROPS = ("history",)


def hand_markers(name):
    return ("<!-- BEGIN hand-written %s -->" % name, "<!-- END hand-written %s -->" % name)


def f_acc(v):
    return "—" if v is None else "%.4f" % v


def f_num(v, spec):
    return "—" if v is None else format(v, spec)


def cell(stat, fmt_fn, multi):
    """mean, or 'mean (min–max)' when several seeds went into it."""
    if stat is None:
        return "—"
    m, lo, hi = stat
    if multi and lo != hi:
        return "%s (%s–%s)" % (fmt_fn(m), fmt_fn(lo), fmt_fn(hi))
    return fmt_fn(m)


def md_escape(text):
    return (text or "").replace("|", "\\|").replace("\n", " ")


def short(text, limit=160):
    text = text or ""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def status_cell(g):
    if g["n"] == 0:
        return "not planned"
    if g["n_ok"] == g["n"]:
        return "ok" if g["n"] == 1 else "ok (%d seeds)" % g["n"]
    parts = []
    if g["n_ok"]:
        parts.append("ok %d/%d" % (g["n_ok"], g["n"]))
    for r in g["failed"]:
        why = r.get("reason") or "failed"
        if r.get("detail"):
            why += ": " + r["detail"]
        parts.append("**failed**%s: %s" % ("" if g["n"] == 1 else " (seed %d)" % r["seed"],
                                           md_escape(short(why))))
    if g["not_run"]:
        parts.append("not run%s" % ("" if g["n"] == 1 else " (%d)" % len(g["not_run"])))
    return "; ".join(parts)


def row_label(row, b, workers):
    if row == "reference":
        return "reference (1×%d)" % (workers * b)
    return row


def batch_table(data, groups, b):
    cfg = data["config"]
    multi = len(cfg["seeds"]) > 1
    lines = [
        "| policy | status | test acc | acc after recal | train loss (last) | "
        "images/s (all workers) | ms/step compute | ms/step BN sync | "
        "ms/step grad sync | max staleness | steps | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in cfg["policies"]:
        g = groups[(row, b)]
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            row_label(row, b, cfg["workers"]), status_cell(g),
            cell(g["test_accuracy"], f_acc, multi),
            cell(g["test_accuracy_recal"], f_acc, multi),
            cell(g["train_loss_last"], lambda v: f_num(v, ".3f"), multi),
            cell(g["images_per_second"], lambda v: f_num(v, ".0f"), multi),
            cell(g["ms_compute"], lambda v: f_num(v, ".1f"), multi),
            cell(g["ms_bn_sync"], lambda v: f_num(v, ".1f"), multi),
            cell(g["ms_grad_sync"], lambda v: f_num(v, ".1f"), multi),
            cell(g["max_staleness"], lambda v: f_num(v, ".0f"), False),
            cell(g["steps"], lambda v: f_num(v, ".0f"), False),
            cell(g["wall_s"], lambda v: f_num(v, ".0f"), False)))
    return lines


def pts(a, b):
    """a - b in percentage points."""
    return "%+.1f" % (100.0 * (a - b))


CHANCE_CEILING = 0.2  # below this, with and without recalibration: did not learn
RECAL_MOVES = 0.02    # recalibration changing accuracy this much is worth a line


def findings(data, groups):
    """The generated part of "What the numbers say": facts read off the data."""
    cfg = data["config"]
    n_test = cfg["test_examples"] or 10000
    multi = len(cfg["seeds"]) > 1
    out = []
    if multi:
        out.append("Noise: with %d seeds, two rows are called different only when their "
                   "min–max ranges over seeds do not overlap." % len(cfg["seeds"]))
    else:
        se = noise_floor(0.85, n_test)
        out.append("Noise: one seed, so seed-to-seed variation is not measured. Two rows "
                   "are called different only when the gap exceeds twice the test-set "
                   "sampling error of the difference (about %.1f points at 85%% accuracy "
                   "on %d test examples); that is a lower bound on the real noise (a "
                   "different seed changes the initial weights and the data order; the "
                   "bulk-synchronous rows repeat bit for bit with the same seed, async "
                   "depends on timing), so small separations here are indicative only."
                   % (100 * 2 * math.sqrt(2) * se, n_test))
    for b in cfg["batch_sizes"]:
        ok_rows = [row for row in cfg["policies"] if groups[(row, b)]["test_accuracy"]]
        if not ok_rows:
            gs = [groups[(row, b)] for row in cfg["policies"]]
            out.append("**b=%d**: no run succeeded (%d failed, %d not run)." % (
                b, sum(len(g["failed"]) for g in gs), sum(len(g["not_run"]) for g in gs)))
            continue
        acc = {row: groups[(row, b)]["test_accuracy"][0] for row in ok_rows}
        best = max(ok_rows, key=lambda r: acc[r])
        ties = [r for r in ok_rows if r != best
                and separated(groups[(best, b)], groups[(r, b)], "test_accuracy", n_test) is False]
        text = "**b=%d** (global batch %d): best test accuracy %s (%.4f)" % (
            b, cfg["workers"] * b, best, acc[best])
        if ties:
            text += ", not separable from %s" % ", ".join(ties)
        text += "."
        ref = groups.get(("reference", b))
        if ref and ref["test_accuracy"]:
            gaps = []
            for row in ok_rows:
                if row == "reference":
                    continue
                sep = separated(groups[(row, b)], ref, "test_accuracy", n_test)
                gaps.append("%s %s%s" % (row, pts(acc[row], ref["test_accuracy"][0]),
                                         "" if sep else " (within noise)"))
            text += " Versus the 1-worker reference (%.4f), in points: %s." % (
                ref["test_accuracy"][0], ", ".join(gaps))
        # The three strategies: best row of each family.
        fam_best = {}
        for fam, rows in FAMILIES:
            cand = [r for r in rows if r in acc]
            if cand:
                fam_best[fam] = max(cand, key=lambda r: acc[r])
        if len(fam_best) >= 2:
            pairs, same = [], []
            names = list(fam_best)
            for i in range(len(names)):
                for j in range(i + 1, len(names)):
                    ra, rb = fam_best[names[i]], fam_best[names[j]]
                    sep = separated(groups[(ra, b)], groups[(rb, b)], "test_accuracy", n_test)
                    (pairs if sep else same).append("%s vs %s (%s)" % (
                        names[i], names[j], pts(acc[ra], acc[rb])))
            if same:
                text += " The strategies do not separate for %s." % "; ".join(same)
            if pairs:
                text += " They do separate for %s." % "; ".join(pairs)
        if "local" in acc:
            lg = groups[("local", b)]
            if lg["test_accuracy_recal"]:
                text += (" local: %.4f with its averaged running stats, %.4f after "
                         "recalibration (%s points)." % (
                             acc["local"], lg["test_accuracy_recal"][0],
                             pts(lg["test_accuracy_recal"][0], acc["local"])))
        out.append(text)
    # Cost of BN traffic.
    for b in cfg["batch_sizes"]:
        parts = []
        for row in ("sync", "async-s1", "async-s4", "local", "recal-precise"):
            g = groups.get((row, b))
            if g and g["ms_total"] and g["ms_bn_sync"] and g["ms_total"][0]:
                parts.append("%s %.0f%% of %.1f ms" % (
                    row, 100.0 * g["ms_bn_sync"][0] / g["ms_total"][0], g["ms_total"][0]))
        ips = {}
        for row in ("sync", "async-s1", "async-s4", "local", "recal-precise", "recal-exact"):
            g = groups.get((row, b))
            if g and g["images_per_second"]:
                ips[row] = g["images_per_second"][0]
        if parts:
            text = "**Cost at b=%d**: BN sync share of the step: %s." % (b, ", ".join(parts))
            if "local" in ips and ips["local"] > 0:
                text += " Images/s relative to local: %s." % ", ".join(
                    "%s %.2f×" % (r, v / ips["local"]) for r, v in ips.items() if r != "local")
            out.append(text)
    # Recalibration's effect, and rows that did not learn, per (row, b).
    moved, flat = [], []
    for b in cfg["batch_sizes"]:
        for row in cfg["policies"]:
            g = groups[(row, b)]
            t, r = g["test_accuracy"], g["test_accuracy_recal"]
            if t is None:
                continue
            if r is not None and max(t[0], r[0]) < CHANCE_CEILING:
                loss = g["train_loss_last"]
                flat.append("%s at b=%d (%.4f%s)" % (
                    row, b, t[0], "" if loss is None else ", last train loss %.2f" % loss[0]))
            elif r is not None and abs(r[0] - t[0]) >= RECAL_MOVES and ROWS[row].bn_policy != "recal":
                moved.append("%s at b=%d %s" % (row, b, pts(r[0], t[0])))
    if moved:
        out.append("Recalibrating the running statistics after training moves test accuracy "
                   "by %.0f points or more (in points) for: %s; there the running statistics, "
                   "not the weights, set the result." % (100 * RECAL_MOVES, ", ".join(moved)))
    if flat:
        text = ("Did not learn (test accuracy below %.2f with and without recalibration; "
                "chance is 0.10): %s." % (CHANCE_CEILING, ", ".join(flat)))
        if any(f.startswith("async") for f in flat) and cfg.get("async_learning_rate") is None:
            text += (" Async applies every worker's gradient on its own (batch b per update, "
                     "%d updates where sync makes one) at the same learning rate, which at "
                     "small b may need a smaller one (--async_learning_rate)." % cfg["workers"])
        out.append(text)
    failed = [r for r in data["runs"] if r["status"] == "failed"]
    if failed:
        out.append("Failed runs: %s." % "; ".join(
            "%s (%s)" % (r["id"], md_escape(short(r.get("reason"), 100))) for r in failed))
    not_run = [r for r in data["runs"] if r["status"] == "not run"]
    if not_run:
        out.append("Not run (the matrix was interrupted): %d runs." % len(not_run))
    return out


def hand_written_block(path):
    """The hand-written block of an existing report, or None."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    i, j = text.find(BEGIN_HAND), text.find(END_HAND)
    if i < 0 or j < i:
        return None
    return text[i:j + len(END_HAND)]


def hand_written_blocks(path):
    """{matrix: its hand-written block} of an existing report's one-axis
    sections."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return {}
    out = {}
    for m in re.finditer(r"<!-- BEGIN hand-written (\w+) -->.*?<!-- END hand-written \1 -->",
                         text, re.S):
        out[m.group(1)] = m.group(0)
    return out


def axis_sections(data, plots, hand_blocks):
    """The markdown lines of the document's one-axis matrices."""
    files = (plots or {}).get("files") or {}
    lines = []
    for name in AXES:
        entry = (data.get(ONE_AXIS) or {}).get(name)
        if entry:
            lines += render_axis(name, entry, files.get("error_vs_" + name),
                                 hand_blocks.get(name), *hand_markers(name))
    if lines and plots and plots.get("skipped"):
        lines += ["Plots skipped: %s." % plots["skipped"], ""]
    return lines


def render_markdown(data, plots, hand_block=None, hand_blocks=None):
    sections = axis_sections(data, plots, hand_blocks or {})
    if "config" not in data:  # only one-axis matrices
        return "\n".join(["# BN staleness and groups", "",
                          "Generated by `experiments/compare_policies.py` from `results.json`; "
                          "edit only between the hand-written markers.", ""] + sections)
    if data["config"].get("matrix", "grid") != "grid":
        return render_regime(data, plots, hand_block, BEGIN_HAND, END_HAND, sections)
    return render_grid(data, plots, hand_block) + "\n".join(sections)


def render_grid(data, plots, hand_block):
    cfg = data["config"]
    mach = data["machine"]
    groups = aggregate(data["runs"], cfg["policies"], cfg["batch_sizes"])
    runs = data["runs"]
    n_ok = sum(r["status"] == "ok" for r in runs)
    n_failed = sum(r["status"] == "failed" for r in runs)
    info = next((r.get("worker_info") for r in runs if r.get("worker_info")), None) or {}
    train_n = cfg["train_examples"] or 60000
    test_n = cfg["test_examples"] or 10000
    L = []
    L.append("# BN policies compared: accuracy and cost")
    L.append("")
    L.append("Generated by `experiments/compare_policies.py` from `%s` (%s). Re-render with "
             "`python3 experiments/compare_policies.py --report_only`; the hand-written part of "
             "the last section survives that." % (os.path.basename(data["results_json"]),
                                                  data.get("finished") or data.get("started")))
    L.append("")
    L.append("## Machine")
    L.append("")
    L.append("- CPU: %s, %s cores (%s available to the run), %s GiB RAM" % (
        mach.get("cpu") or "unknown", mach.get("cores"), mach.get("cores_available"),
        mach.get("ram_gib")))
    L.append("- GPU: %s; the workers ran on: %s" % (
        "; ".join(mach.get("gpus") or []) or "none", info.get("device", "unknown")))
    L.append("- OS: %s, Python %s; load average at the start: %s" % (
        mach.get("platform"), mach.get("python"),
        ", ".join("%.2f" % v for v in mach.get("load_average") or []) or "unknown"))
    L.append("")
    L.append("## Command")
    L.append("")
    L.append("```sh")
    L.append(portable_command(data.get("command_line")))
    L.append("```")
    L.append("")
    L.append("## Setup and budget")
    L.append("")
    L.append("- Model: the ResNet-style CNN of `bnps_worker` (depth %s, width %s, %s "
             "weights), Fashion-MNIST." % (info.get("depth", "?"), info.get("width", "?"),
                                           info.get("weights", "?")))
    L.append("- Data: the first %d of 60000 training examples, %d epoch%s (%d examples "
             "seen per run); test accuracy on the first %d of 10000 test examples, the "
             "same for every run (evaluated by worker 0)." % (
                 train_n, cfg["epochs"], "" if cfg["epochs"] == 1 else "s",
                 train_n * cfg["epochs"], test_n))
    L.append("- %d workers and %d shard servers per run; per-worker batch sizes %s; "
             "seeds %s." % (cfg["workers"], cfg["servers"],
                            ", ".join(map(str, cfg["batch_sizes"])),
                            ", ".join(map(str, cfg["seeds"]))))
    L.append("- The reference is 1 worker with the global batch (%d × b), policy sync "
             "(with one worker all policies coincide), %s model thread%s." % (
                 cfg["workers"], cfg.get("reference_threads_used", "?"),
                 "" if cfg.get("reference_threads_used") == 1 else "s"))
    L.append("- Optimizer: SGD, learning rate %g fixed for every batch size (not scaled "
             "with the global batch), momentum %g, weight decay %g. All rows of one batch "
             "size share the global batch, so policies compare fairly within a table; "
             "across tables the number of steps and the gradient noise differ." % (
                 cfg["learning_rate"], cfg["momentum"], cfg["weight_decay"]))
    if cfg.get("async_learning_rate") is not None:
        L.append("- The async rows use learning rate %g instead: under async each worker's "
                 "gradient is applied on its own (an update has batch b, not %d × b)." % (
                     cfg["async_learning_rate"], cfg["workers"]))
    L.append("- async-s1 / async-s4: `--staleness=1` / `4`. recal-precise / recal-exact: "
             "`--recal_mode=precise` / `exact`. Every other row also recalibrates after "
             "training (`--recalibrate=true`, mode precise) for the \"acc after recal\" "
             "column%s." % (
                 "" if not cfg["recal_examples"]
                 else "; recalibration over the first %d training examples" % cfg["recal_examples"]))
    if cfg["worker_flags"]:
        L.append("- Extra worker flags: `%s`." % " ".join(cfg["worker_flags"]))
    if cfg.get("inject"):
        L.append("- Test-only: failures injected into %s." % ", ".join(
            "%s@%d" % tuple(x) for x in cfg["inject"]))
    wall = data.get("total_wall_s")
    L.append("- Budget: the default matrix is sized to finish within %d minutes on 2 CPU "
             "cores; to fit, it trains on %d of the 60000 training examples for %d "
             "epoch%s with one seed. Estimated %s; this run took %s, %d runs "
             "(%d ok, %d failed%s)." % (
                 BUDGET_MINUTES, train_n, cfg["epochs"], "" if cfg["epochs"] == 1 else "s",
                 estimate_text(data.get("estimate_s") or 0),
                 "%.1f min" % (wall / 60.0) if wall is not None else "unknown",
                 len(runs), n_ok, n_failed,
                 ", %d not run" % (len(runs) - n_ok - n_failed)
                 if len(runs) - n_ok - n_failed else ""))
    L.append("")
    L.append("Columns: *test acc* uses the running statistics the policy leaves; *acc "
             "after recal* after recomputing them over the training data (for recal rows "
             "the two are the same); *train loss* is the mean over workers of each "
             "worker's mean loss over its last reporting interval (batch statistics, "
             "as in training); *images/s* is the sum over the workers; *ms/step* is each "
             "worker's time in that part divided by its steps, averaged over workers "
             "(BN sync includes waiting for the others at the BN barriers, grad sync the "
             "pull, push and clocks); *wall s* is the whole run as this tool timed it "
             "(start-up, training, evaluation, recalibration)%s." % (
                 "; with several seeds: mean (min–max)" if len(cfg["seeds"]) > 1 else ""))
    L.append("")
    L.append("## Results")
    for b in cfg["batch_sizes"]:
        L.append("")
        L.append("### Per-worker batch %d (global batch %d)" % (b, cfg["workers"] * b))
        L.append("")
        L.extend(batch_table(data, groups, b))
    L.append("")
    L.append("## Plots")
    L.append("")
    if plots.get("files"):
        for name, title in (("accuracy_vs_batch", "Test accuracy against per-worker batch size"),
                            ("accuracy_over_time", "Accuracy over training time")):
            f = plots["files"].get(name)
            if f:
                L.append("![%s](%s)" % (title, os.path.basename(f)))
                L.append("")
        L.append(plots.get("note") or "")
    else:
        L.append("Plots skipped: %s." % (plots.get("skipped") or "not drawn"))
    L.append("")
    L.append("## What the numbers say")
    L.append("")
    L.append("Generated from the data:")
    L.append("")
    for text in findings(data, groups):
        L.append("- " + text)
    L.append("")
    L.append(hand_block or "%s\n_(Reading of the results, written by hand after the real "
             "run.)_\n%s" % (BEGIN_HAND, END_HAND))
    L.append("")
    return "\n".join(L)


def compact_json(data):
    """`data` as JSON a diff can read and a repository can hold: one top-level
    key per line, and a list (the runs) one record per line; each one-axis
    matrix under ONE_AXIS the same way. Plain JSON: json.load reads it back
    unchanged."""
    def line(value):
        return json.dumps(value, separators=(",", ":"), sort_keys=False)

    items = []
    for key, value in data.items():
        if key == ONE_AXIS and isinstance(value, dict) and value:
            body = ",\n".join("%s:%s" % (line(k), compact_json(v).rstrip("\n"))
                              for k, v in value.items())
            items.append("%s:{\n%s\n}" % (line(key), body))
        elif isinstance(value, list) and value:
            body = ",\n".join(" " + line(v) for v in value)
            items.append("%s:[\n%s\n]" % (line(key), body))
        else:
            items.append("%s:%s" % (line(key), line(value)))
    return "{\n" + ",\n".join(items) + "\n}\n"


def write_json(data, path):
    """Writes `data` to `path` without this machine's paths (portable_data)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(compact_json(portable_data(data)))
    os.replace(tmp, path)


def read_document(json_path):
    """The results document at json_path as it is, {} without one."""
    try:
        with open(json_path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def slim(data):
    """One one-axis matrix's data as the document keeps it: no machine
    paths, no per-interval training curves, no plots record of its own."""
    out = portable_data(data)
    out.pop("plots", None)
    out.pop("results_json", None)
    out["runs"] = [{k: v for k, v in r.items() if k not in SLIM_DROPS} for r in out["runs"]]
    return out


def document(data, json_path):
    """The document to write to json_path: a one-axis matrix's data goes
    under ONE_AXIS of the document already there (the other matrices stay);
    any other data is the document itself and keeps the one-axis results
    already there."""
    matrix = (data.get("config") or {}).get("matrix")
    if matrix in AXES:
        doc = read_document(json_path)
        doc.setdefault(ONE_AXIS, {})[matrix] = slim(data)
        return doc
    if ONE_AXIS not in data:
        kept = read_document(json_path).get(ONE_AXIS)
        if kept:
            data[ONE_AXIS] = kept
    return data


def all_runs(doc):
    return list(doc.get("runs") or []) + [
        r for entry in (doc.get(ONE_AXIS) or {}).values() for r in entry["runs"]]


def write_report(data, results_md, json_path, plots_enabled):
    """Writes the document holding `data` (see document) to json_path, its
    plots, and the markdown report rendered from the whole document."""
    doc = document(data, json_path)
    write_json(doc, json_path)  # The plots may be drawn from it by another Python.
    if plots_enabled and any(r["status"] == "ok" for r in all_runs(doc)):
        plots = make_plots(doc, results_md, json_path)
    elif plots_enabled:
        plots = {"files": {}, "skipped": "no run succeeded"}
    else:
        plots = {"files": {}, "skipped": "--no_plots"}
    doc["plots"] = plots
    write_json(doc, json_path)
    text = render_markdown(doc, plots, hand_written_block(results_md),
                           hand_written_blocks(results_md))
    tmp = results_md + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, results_md)
    return plots


def load_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError("cannot read %s: %s" % (path, e))
    if "config" in data:
        data["config"]["batch_sizes"] = list(data["config"]["batch_sizes"])
    return data
