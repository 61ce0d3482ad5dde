"""The two plots next to the report (matplotlib only here). When this
interpreter lacks matplotlib, they are drawn by running the command again
under the system Python with --plots_only.
"""

import json
import os
import subprocess
import sys
import textwrap

from .axes import draw_axis_plot
from .matrix import AXES, ENTRY
from .regime import draw_regime_plot
from .stats import aggregate

SYSTEM_PYTHON = "/usr/bin/python3"


class PlotsUnavailable(Exception):
    pass


def plot_paths(results_md, matrix="grid"):
    base = os.path.splitext(results_md)[0]
    if matrix in AXES:
        return {"error_vs_" + matrix: base + "_error_vs_%s.png" % matrix}
    if matrix != "grid":
        return {"accuracy_vs_samples": base + "_accuracy_vs_samples.png"}
    return {"accuracy_vs_batch": base + "_accuracy_vs_batch.png",
            "accuracy_over_time": base + "_accuracy_over_time.png"}


SMOOTH = 5  # training-accuracy points averaged in the over-time plot


def smooth(values):
    """Trailing mean over up to SMOOTH points."""
    out = []
    for i in range(len(values)):
        window = values[max(0, i - SMOOTH + 1):i + 1]
        out.append(sum(window) / len(window))
    return out


def draw_plots(data, results_md):
    """Writes the document's PNGs next to results_md with matplotlib: its
    main matrix's, and one per one-axis matrix it holds; returns {"files":
    {...}, "note": ...}. Raises PlotsUnavailable without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise PlotsUnavailable("matplotlib is not installed for %s (%s)" % (sys.executable, e))
    out = {"files": {}, "note": ""}
    if data.get("config") and data.get("runs"):
        out = draw_main_plots(plt, data, results_md)
    for name, entry in sorted((data.get("one_axis") or {}).items()):
        if name in AXES and any(r["status"] == "ok" for r in entry["runs"]):
            paths = plot_paths(results_md, name)
            draw_axis_plot(plt, name, entry, paths["error_vs_" + name])
            out["files"].update(paths)
    return out


def draw_main_plots(plt, data, results_md):
    """The main matrix's plots: the regime plot, or the grid's two."""
    cfg = data["config"]
    if cfg.get("matrix", "grid") != "grid":
        paths = plot_paths(results_md, cfg["matrix"])
        draw_regime_plot(plt, data, paths["accuracy_vs_samples"])
        return {"files": paths, "note": "Mean ± one standard deviation over seeds, from %s."
                % os.path.basename(data.get("results_json") or "results.json")}
    groups = aggregate(data["runs"], cfg["policies"], cfg["batch_sizes"])
    paths = plot_paths(results_md)
    styles = {"reference": ("k", "o", "--"), "local": ("tab:gray", "v", "-"),
              "sync": ("tab:blue", "s", "-"), "async-s1": ("tab:orange", "^", "-"),
              "async-s4": ("tab:red", "D", "-"), "recal-precise": ("tab:green", "P", "-"),
              "recal-exact": ("tab:olive", "X", "-")}

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    for ax, key, title in ((axes[0], "test_accuracy", "with the policy's running statistics"),
                           (axes[1], "test_accuracy_recal", "after recalibration")):
        for row in cfg["policies"]:
            xs, ys, lo, hi = [], [], [], []
            for b in cfg["batch_sizes"]:
                stat = groups[(row, b)][key]
                if stat:
                    xs.append(b)
                    ys.append(stat[0])
                    lo.append(stat[0] - stat[1])
                    hi.append(stat[2] - stat[0])
            if not xs:
                continue
            color, marker, ls = styles.get(row, (None, "o", "-"))
            ax.errorbar(xs, ys, yerr=[lo, hi] if len(cfg["seeds"]) > 1 else None,
                        color=color, marker=marker, linestyle=ls, capsize=3, label=row)
        ax.set_xscale("log", base=2)
        ax.set_xticks(cfg["batch_sizes"])
        ax.set_xticklabels([str(b) for b in cfg["batch_sizes"]])
        ax.set_xlabel("per-worker batch size b (%d workers; reference: 1 worker, batch %d·b)"
                      % (cfg["workers"], cfg["workers"]), fontsize=8)
        ax.set_title("Test accuracy %s" % title, fontsize=10)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("test accuracy")
    axes[1].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(paths["accuracy_vs_batch"], dpi=110)
    plt.close(fig)

    seed = cfg["seeds"][0]
    nb = len(cfg["batch_sizes"])
    width_in = max(6.0, 5.0 * nb)
    fig, axes = plt.subplots(1, nb, figsize=(width_in, 4.4), squeeze=False)
    any_eval = False
    for ax, b in zip(axes[0], cfg["batch_sizes"]):
        for row in cfg["policies"]:
            run = next((r for r in data["runs"] if r["policy"] == row and r["batch_size"] == b
                        and r["seed"] == seed and r["status"] == "ok"), None)
            if run is None:
                continue
            color, marker, ls = styles.get(row, (None, "o", "-"))
            hist = run.get("history") or []
            if hist:
                ax.plot([h["seconds"] for h in hist], smooth([h["accuracy"] for h in hist]),
                        color=color, linestyle=ls, linewidth=1, alpha=0.6, label=row)
            evals = [e for e in run.get("evals") or [] if e.get("test_accuracy") is not None]
            if evals:
                any_eval = True
                ax.plot([e["seconds"] for e in evals], [e["test_accuracy"] for e in evals],
                        color=color, marker=marker, linestyle="none", markersize=7)
        ax.set_title("b=%d (global batch %d)" % (b, cfg["workers"] * b), fontsize=10)
        ax.set_xlabel("seconds since training started (worker 0)")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("accuracy")
    axes[0][-1].legend(fontsize=8, loc="lower right")
    title = ("Lines: training accuracy of worker 0 (batch statistics, trailing mean of %d "
             "reporting intervals); markers: test accuracy%s (seed %d)" % (
                 SMOOTH, " after each epoch and at the end" if any_eval else " at the end", seed))
    fig.suptitle(textwrap.fill(title, width=int(12 * width_in)), fontsize=9)
    fig.tight_layout()
    fig.savefig(paths["accuracy_over_time"], dpi=110)
    plt.close(fig)
    note = ("Over time: lines are worker 0's training accuracy (a reporting interval is "
            "1/50 of the run; measured with batch statistics as in training; trailing mean "
            "of %d intervals), markers the test accuracy with the running statistics%s; "
            "seed %d. Accuracy against batch size: mean over seeds%s. Both plots from %s."
            % (SMOOTH, " after each epoch and at the end" if any_eval else " at the end",
               seed, ", bars min–max" if len(cfg["seeds"]) > 1 else "",
               os.path.basename(data.get("results_json") or "results.json")))
    return {"files": paths, "note": note}


def make_plots(data, results_md, json_path):
    """Draws the plots here, or with the system Python when this one lacks
    matplotlib; returns the plots record for the report."""
    try:
        return draw_plots(data, results_md)
    except PlotsUnavailable as e:
        reason = str(e)
    if os.path.realpath(sys.executable) != os.path.realpath(SYSTEM_PYTHON) and \
            os.access(SYSTEM_PYTHON, os.X_OK):
        try:
            r = subprocess.run([SYSTEM_PYTHON, ENTRY, "--plots_only",
                                "--results=" + results_md, "--results_json=" + json_path],
                               capture_output=True, text=True, timeout=300)
            if r.returncode == 0:
                return json.loads(r.stdout.strip().splitlines()[-1])
            reason += "; %s: %s" % (SYSTEM_PYTHON, (r.stderr.strip().splitlines() or ["?"])[-1])
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
            reason += "; %s failed: %s" % (SYSTEM_PYTHON, e)
    return {"files": {}, "skipped": reason + " (install python3-matplotlib: "
            "`tools/setup.sh --peers` or `apt-get install python3-matplotlib`)"}
