"""The report and plot of the regime matrices (--matrix=regime, full, smoke):
test accuracy against samples per channel per worker (model variant x
per-worker batch), mean +- standard deviation over seeds, the gaps between
policies with their noise, and the crossed async rows.

Pure functions of the results (data as results.json holds it), except
draw_regime_plot, which needs matplotlib.
"""

import math
import os
import shlex
import sys

from .matrix import (BUDGET_MINUTES, CROSSED, LR_BATCH, POSITIONS, REPO, ROWS,
                     estimate_text, learning_rate)

MODEL_TEXT = {
    "fc_bn": "BN after fully connected layers: statistics over the batch alone",
    "deep": "the CNN continued to 4x4 and 2x2 maps: 4 positions per example at the deepest BN",
    "cnn": "the default ResNet-style CNN: 49 positions per example at the deepest BN (7x7)",
}
# The rows of the sweep table, in this order when present.
SWEEP_ORDER = ["reference", "local", "sync", "recal-precise", "recal-exact", "async-s1",
               "async-s2", "async-s4"]



def portable_arg(arg):
    """--flag=/an/absolute/path as --flag=FLAG; any other argument as it is."""
    flag, eq, value = arg.partition("=")
    if flag.startswith("--") and eq and os.path.isabs(value):
        return flag + "=" + flag.lstrip("-").upper()
    return arg


def portable_command(line):
    """The command line as a reader can reuse it, without this machine's paths:
    a flag whose value is an absolute path shows the flag's name in capitals
    instead (--out_dir=/tmp/x/runs becomes --out_dir=OUT_DIR)."""
    try:
        parts = shlex.split(line or "")
    except ValueError:
        return line or ""
    out = []
    for i, part in enumerate(parts):
        if part.startswith("--") and "=" in part:
            part = portable_arg(part)
        elif os.path.isabs(part) and i > 0 and parts[i - 1].startswith("--"):
            part = parts[i - 1].lstrip("-").upper()
        out.append(part)
    return shlex.join(out)

def portable_data(data, repo=None, python=None):
    """A copy of the results' `data` without this machine's paths, for the
    file a repository holds: the --out_dir and --bin_dir folders become
    OUT_DIR and BIN_DIR (as portable_command writes them), paths inside the
    repository become relative to it, the Python that ran the launcher
    becomes python3, and the tool's own flags that name a path (argv,
    command_line) read as portable_command writes them."""
    config = data.get("config") or {}
    repo = repo or REPO
    python = python or sys.executable
    swaps = []
    for prefix, name in ((config.get("out_dir"), "OUT_DIR"),
                         (config.get("bin_dir"), "BIN_DIR")):
        if prefix and os.path.isabs(prefix) and prefix != os.sep:
            swaps.append((prefix.rstrip(os.sep), name))
    swaps.append((repo.rstrip(os.sep) + os.sep, ""))
    swaps.sort(key=lambda s: -len(s[0]))

    def fix(value):
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fix(v) for v in value]
        if not isinstance(value, str):
            return value
        if value in (python, os.path.realpath(python)):
            return "python3"
        for prefix, name in swaps:
            value = value.replace(prefix, name)
        return value

    out = fix(data)
    # Flags naming other places on this machine (--results=/tmp/x.md) as
    # portable_command writes them.
    if isinstance(out.get("argv"), list):
        out["argv"] = [portable_arg(a) if isinstance(a, str) else a for a in out["argv"]]
    if isinstance(out.get("command_line"), str):
        out["command_line"] = portable_command(out["command_line"])
    return out


def summary(values):
    """(mean, sample standard deviation, n) of the values that are not None;
    None without any."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    n = len(values)
    m = sum(values) / n
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return (m, sd, n)


def cell_groups(runs):
    """{(row, model, b): {"acc": summary, "recal": summary, "ms": summary,
    "staleness": max, "runs": [...], "ok": n}}."""
    out = {}
    for r in runs:
        key = (r["policy"], r.get("model", "cnn"), r["batch_size"])
        out.setdefault(key, []).append(r)
    groups = {}
    for key, rs in out.items():
        ok = [r for r in rs if r["status"] == "ok"]
        groups[key] = {
            "runs": rs, "ok": len(ok),
            "acc": summary([r.get("test_accuracy") for r in ok]),
            "recal": summary([r.get("test_accuracy_recal") for r in ok]),
            "ms": summary([(r.get("ms_per_step") or {}).get("total") for r in ok]),
            "staleness": max([r.get("max_staleness") or 0 for r in ok], default=None),
        }
    return groups


def gap(a, b):
    """(a - b, 2 standard errors of the difference, separated) of two
    summaries; None when either is missing or has fewer than 2 seeds."""
    if a is None or b is None or a[2] < 2 or b[2] < 2:
        return None
    d = a[0] - b[0]
    noise = 2 * math.sqrt(a[1] ** 2 / a[2] + b[1] ** 2 / b[2])
    return d, noise, abs(d) > noise


def f_ms(s):
    """'0.812 ± 0.010' (accuracy, mean ± sd)."""
    if s is None:
        return "—"
    return "%.3f ± %.3f" % (s[0], s[1]) if s[2] > 1 else "%.3f" % s[0]


def f_pts(g):
    if g is None:
        return "—"
    d, noise, sep = g
    return "%+.1f ± %.1f%s" % (100 * d, 100 * noise, " **" if sep else "")


def cells_of(config, runs):
    """[(model, b)] in the order of the sweep: by samples per channel."""
    seen = []
    for r in runs:
        c = (r.get("model", "cnn"), r["batch_size"])
        if c not in seen:
            seen.append(c)
    return sorted(seen, key=lambda c: (POSITIONS.get(c[0], 0) * c[1], c[0]))


def boundary(groups, cells):
    """Cells where sync beats local beyond the noise, and where it does not."""
    lose, hold = [], []
    for model, b in cells:
        g = gap((groups.get(("sync", model, b)) or {}).get("acc"),
                (groups.get(("local", model, b)) or {}).get("acc"))
        if g is None:
            continue
        (lose if g[2] and g[0] > 0 else hold).append((POSITIONS[model] * b, model, b, g))
    return lose, hold


def render_regime(data, plots, hand_block, begin_hand, end_hand, sections=()):
    cfg, runs = data["config"], data["runs"]
    groups = cell_groups(runs)
    cells = cells_of(cfg, runs)
    rows_present = [r for r in SWEEP_ORDER if any(k[0] == r for k in groups)]
    machine = data.get("machine") or {}
    L = ["# Policy comparison: where synchronizing BN matters", ""]
    L.append("Generated by `experiments/compare_policies.py` (`--matrix=%s`) from `%s`; do not edit "
             "by hand except between the hand-written markers below. Re-render with "
             "`python3 experiments/compare_policies.py --report_only`." % (
                 cfg.get("matrix"), "results.json"))
    L.append("")
    L.append("Command: `%s`" % portable_command(data.get("command_line", "?")))
    L.append("")
    wall = data.get("total_wall_s")
    L.append("Machine: %s, %s cores, %s GiB; load average at the start %s. Wall time %s "
             "(estimated %s; budget %d min). %d runs, %d ok." % (
                 machine.get("cpu") or "?", machine.get("cores") or "?",
                 machine.get("ram_gib") or "?", machine.get("load_average"),
                 "%.1f min" % (wall / 60.0) if wall else "?",
                 estimate_text(data.get("estimate_s") or 0), BUDGET_MINUTES, len(runs),
                 sum(1 for r in runs if r["status"] == "ok")))
    loads = [r["load_average"][0] for r in runs if r.get("load_average")]
    if loads:
        L.append("")
        L.append("Load average (1 min) after each run: %.1f to %.1f, mean %.1f, on %s "
                 "cores: other work shared the machine, which slows the runs and changes "
                 "the async rows' staleness, not the bulk-synchronous rows' arithmetic." % (
                     min(loads), max(loads), sum(loads) / len(loads),
                     machine.get("cores") or "?"))
    if data.get("interrupted"):
        L.append("")
        L.append("**Interrupted (%s)**: the runs not done are listed as not run." %
                 data["interrupted"])
    L.append("")
    L.append("## Setup")
    L.append("")
    L.append("Every run: %d workers (the reference 1) and %d shard servers on this machine, "
             "Fashion-MNIST, the first %s training examples for %d epoch(s), %s test "
             "examples, seeds %s (a seed sets the initial weights and the data order), SGD "
             "learning rate %g %s with momentum %g (async gradients: %g, the linear-scaling "
             "equivalent, since each worker's gradient is applied on its own), weight decay "
             "%g. Accuracy is worker 0's on the test set with the running statistics the "
             "policy leaves; \"after recal\" recomputes them over the training data first."
             % (cfg["workers"], cfg["servers"], cfg["train_examples"] or 60000,
                cfg["epochs"], cfg["test_examples"] or 10000,
                ", ".join(str(s) for s in cfg["seeds"]), cfg["learning_rate"],
                "per global batch of %d, scaled linearly with workers × b" % LR_BATCH
                if cfg.get("lr_scaling") == "linear" else "at every batch size",
                cfg["momentum"], cfg.get("async_learning_rate") or cfg["learning_rate"],
                cfg["weight_decay"]))
    L.append("")
    L.append("A BN layer's statistics are over batch × height × width of its input, so a "
             "worker's samples per channel are its batch times the positions per example "
             "of the model's smallest BN input (the worker's `--model`):")
    L.append("")
    L.append("| model | positions per example | what |")
    L.append("|---|---|---|")
    for m in sorted({c[0] for c in cells}, key=lambda m: POSITIONS[m]):
        L.append("| `%s` | %d | %s |" % (m, POSITIONS[m], MODEL_TEXT.get(m, "")))
    L.append("")
    L.append("Rows: " + "; ".join("**%s**: %s" % (r, ROWS[r].description) for r in rows_present) +
             ". The reference is one worker with the global batch (workers × b), which "
             "sync must match.")
    L.append("")
    L.append("## Test accuracy against samples per channel per worker")
    L.append("")
    files = (plots or {}).get("files") or {}
    if files.get("accuracy_vs_samples"):
        import os
        L.append("![test accuracy against samples per channel per worker](%s)" %
                 os.path.basename(files["accuracy_vs_samples"]))
        L.append("")
    elif plots and plots.get("skipped"):
        L.append("Plots skipped: %s." % plots["skipped"])
        L.append("")
    L.append("Mean ± standard deviation over the seeds (n = %d per cell unless a run "
             "failed)." % len(cfg["seeds"]))
    L.append("")
    head = ["model", "b / worker", "samples / channel / worker"] + [
        "reference (1×%db)" % cfg["workers"] if r == "reference" else r for r in rows_present]
    L.append("| " + " | ".join(head) + " |")
    L.append("|" + "---|" * len(head))
    for model, b in cells:
        line = ["`%s`" % model, str(b), str(POSITIONS[model] * b)]
        for r in rows_present:
            g = groups.get((r, model, b))
            line.append(f_ms(g["acc"]) if g else "")
        L.append("| " + " | ".join(line) + " |")
    L.append("")
    recal_rows = [r for r in rows_present if ROWS[r].recal_mode is None and r != "reference"]
    if recal_rows:
        L.append("After recalibrating the running statistics (the same trained weights):")
        L.append("")
        head = ["model", "samples / channel / worker"] + recal_rows
        L.append("| " + " | ".join(head) + " |")
        L.append("|" + "---|" * len(head))
        for model, b in cells:
            line = ["`%s`" % model, str(POSITIONS[model] * b)]
            for r in recal_rows:
                g = groups.get((r, model, b))
                line.append(f_ms(g["recal"]) if g else "")
            L.append("| " + " | ".join(line) + " |")
        L.append("")
    L.append("### Gaps, in accuracy points")
    L.append("")
    L.append("Difference of means ± 2 standard errors of the difference over the seeds; "
             "`**` where the gap exceeds that noise.")
    L.append("")
    pairs = [("sync", "local"), ("recal-precise", "local"), ("sync", "recal-precise"),
             ("async-s2", "local"), ("sync", "reference")]
    pairs = [p for p in pairs if p[0] in rows_present and p[1] in rows_present]
    head = ["model", "samples / channel / worker"] + ["%s − %s" % p for p in pairs]
    L.append("| " + " | ".join(head) + " |")
    L.append("|" + "---|" * len(head))
    for model, b in cells:
        line = ["`%s`" % model, str(POSITIONS[model] * b)]
        for a, c in pairs:
            line.append(f_pts(gap((groups.get((a, model, b)) or {}).get("acc"),
                                  (groups.get((c, model, b)) or {}).get("acc"))))
        L.append("| " + " | ".join(line) + " |")
    L.append("")
    lose, hold = boundary(groups, cells)
    if lose or hold:
        L.append("Generated: sync beats local beyond the noise at %s; not at %s." % (
            ", ".join("%d (`%s` b=%d, %+.1f points)" % (s, m, b, 100 * g[0])
                      for s, m, b, g in lose) or "no cell",
            ", ".join("%d (`%s` b=%d)" % (s, m, b) for s, m, b, _ in hold) or "no cell"))
        L.append("")
    crossed_cells = [(m, b) for m, b in cells if any((r, m, b) in groups for r in CROSSED)]
    for model, b in crossed_cells:
        L.append("## Which half of async costs the accuracy (`%s`, b=%d per worker)" % (model, b))
        L.append("")
        L.append("The BN policy and the gradient mode chosen independently (`--bn_policy`, "
                 "`--gradients`); staleness bound 2 for every async half.")
        L.append("")
        L.append("| row | BN policy | gradients | learning rate | test acc | after recal | "
                 "ms/step | max staleness | − sync (points) |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        base = (groups.get(("sync", model, b)) or {}).get("acc")
        for r in ["sync", "async-s2"] + CROSSED + ["local", "recal-precise"]:
            g = groups.get((r, model, b))
            if not g:
                continue
            bn, grads, s = ROWS[r][:3]
            lr = learning_rate(cfg, r, b)
            L.append("| %s | %s%s | %s%s | %g | %s | %s | %s | %s | %s |" % (
                r, bn, " (s=%d)" % s if bn == "async" else "", grads,
                " (s=%d)" % s if grads == "async" else "", lr or 0, f_ms(g["acc"]),
                f_ms(g["recal"]), "%.1f" % g["ms"][0] if g["ms"] else "—",
                g["staleness"] if g["staleness"] is not None else "—",
                "" if r == "sync" else f_pts(gap(g["acc"], base))))
        L.append("")
    failed = [r for r in runs if r["status"] != "ok"]
    if failed:
        L.append("## Runs that did not succeed")
        L.append("")
        for r in failed:
            L.append("- `%s`: %s%s" % (r["id"], r["status"],
                                       ": " + (r.get("reason") or "") if r.get("reason") else ""))
        L.append("")
    L.append("## What the numbers say")
    L.append("")
    L.append(hand_block or "%s\n_(Write the conclusions here; this block survives a "
             "re-render or a new run.)_\n%s" % (begin_hand, end_hand))
    L.append("")
    L.extend(sections)
    L.append("## Running it")
    L.append("")
    L.append("`bazel build //server:bnps_server //worker:bnps_worker //python:libbnps.so "
             "&& python3 "
             "experiments/compare_policies.py` (or `python3 experiments/compare_policies.py "
             "--build`) runs this matrix (`--dry_run` prints its runs and the estimate; "
             "`tools/setup.sh --peers` adds matplotlib for the plot); `--matrix=full` runs the larger one (more batch sizes, rows, "
             "5 seeds, 3× the data: hours on 2 cores); `--matrix=grid` the first comparison "
             "(policies × batch sizes on one model); `--matrix=staleness` and "
             "`--matrix=groups` re-run the two one-axis sections. On a GPU add "
             "`--worker_flag=--device=gpu`, and with it `--train_examples=0` and more "
             "`--epochs`.")
    L.append("")
    return "\n".join(L)


def draw_regime_plot(plt, data, path):
    """Test accuracy against samples per channel per worker (log scale), one
    line per row and model, error bars one standard deviation."""
    groups = cell_groups(data["runs"])
    cfg = data["config"]
    colors = {"reference": "k", "local": "tab:gray", "sync": "tab:blue",
              "recal-precise": "tab:green", "recal-exact": "tab:olive",
              "async-s1": "tab:orange", "async-s2": "tab:red", "async-s4": "tab:brown",
              "bn-async-s2": "tab:purple", "grad-async-s2": "tab:pink",
              "grad-async-s2-recal": "tab:cyan"}
    markers = {"fc_bn": "o", "deep": "s", "cnn": "^"}
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    for ax, key, title in ((axes[0], "acc", "with the policy's running statistics"),
                           (axes[1], "recal", "after recalibration")):
        labeled = set()
        for row in SWEEP_ORDER:
            for model in ("fc_bn", "deep", "cnn"):
                pts = sorted((POSITIONS[model] * b, g[key]) for (r, m, b), g in groups.items()
                             if r == row and m == model and g[key] is not None)
                if not pts:
                    continue
                xs = [p[0] for p in pts]
                ax.errorbar(xs, [p[1][0] for p in pts], yerr=[p[1][1] for p in pts],
                            color=colors.get(row, "k"), marker=markers[model],
                            linestyle="--" if row == "reference" else "-", capsize=3,
                            label=None if row in labeled else row)
                labeled.add(row)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("samples per channel per worker (batch × positions; o fc_bn, "
                      "□ deep, △ cnn)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("test accuracy (mean ± sd over %d seeds)" % len(cfg["seeds"]))
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle("%d workers; reference: 1 worker with the global batch (same x: its "
                 "cell's per-worker figure)" % cfg["workers"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
