"""The report and plot of the one-axis matrices (--matrix=staleness, groups;
matrix.AXES): test error against one setting of the job, per cell (model,
per-worker batch), mean +- standard deviation over seeds, the gap to the
row the axis is measured from (sync), the range of the axis that stays
within the noise of it, and a plot of each.

Pure functions of the results (one matrix's data as results.json holds it
under "one_axis"), except draw_axis_plot, which needs matplotlib.
"""

import os

from .matrix import AXES, POSITIONS, ROWS, estimate_text, learning_rate
from .regime import cell_groups, cells_of, gap, portable_command


def error(stat):
    """Test error (mean, sd, n) of an accuracy summary; None without one."""
    return None if stat is None else (1.0 - stat[0], stat[1], stat[2])


def f_err(stat):
    """'18.4 ± 0.7' (test error in %, mean ± sd)."""
    if stat is None:
        return "—"
    return ("%.1f ± %.1f" % (100 * stat[0], 100 * stat[1]) if stat[2] > 1
            else "%.1f" % (100 * stat[0]))


def error_gap(groups, row, base, cell):
    """(error of row - error of base, 2 standard errors, separated) in one
    cell; None when either has fewer than 2 seeds."""
    a = (groups.get((row,) + cell) or {}).get("acc")
    b = (groups.get((base,) + cell) or {}).get("acc")
    g = gap(a, b)
    return None if g is None else (-g[0], g[1], g[2])


def f_gap(g):
    if g is None:
        return "—"
    # Rounded first, and + 0.0, so that a gap of nothing reads +0.0.
    return "%+.1f ± %.1f%s" % (round(100 * g[0], 1) + 0.0, 100 * g[1], " **" if g[2] else "")


def axis_rows(axis):
    """The rows on the axis, by value."""
    return sorted(axis.values, key=lambda r: axis.values[r])


def within_noise(groups, axis, cell):
    """The values of the axis, from the base's end, whose error is within
    the noise of the base's: for base_at "high" (groups: K = W) the values
    from the smallest K on which no larger one differs from K = W; for
    "low" (staleness: sync) those up to the largest s below which none
    differs from sync. [] when the first one already differs; None when a
    gap is missing (fewer than 2 seeds)."""
    rows = axis_rows(axis)
    if axis.base_at == "high":
        rows = rows[::-1]
    kept = []
    for row in rows:
        if row == axis.base:
            kept.append(axis.values[row])
            continue
        g = error_gap(groups, row, axis.base, cell)
        if g is None:
            return None
        if g[2]:
            break
        kept.append(axis.values[row])
    return sorted(kept)


def samples(axis, row, model, b):
    """Samples per channel that one BN normalization sees on row: per worker
    (b x positions), times K for a group."""
    per_worker = POSITIONS.get(model, 0) * b
    return per_worker * axis.values[row] if axis.symbol == "K" else per_worker


def findings(axis, groups, cells):
    """The generated lines: per cell, the gap at the axis' ends and the
    range within the noise of the base."""
    out = []
    rows = axis_rows(axis)
    for model, b in cells:
        cell = (model, b)
        if not all((r,) + cell in groups for r in rows):
            continue
        text = "`%s` b=%d: " % (model, b)
        kept = within_noise(groups, axis, cell)
        if kept is None:
            out.append(text + "fewer than 2 seeds; no noise to compare against.")
            continue
        if axis.base_at == "high":
            top = axis.values[axis.base]
            if kept and kept[0] < top:
                k = kept[0]
                text += ("groups of K ≥ %d (%d samples per channel per group) are within "
                         "the noise of K = %d" % (
                             k, samples(axis, "sync-k%d" % k, model, b), top))
            else:
                text += "every smaller group differs from K = %d beyond the noise" % top
            smaller = [r for r in rows if axis.values[r] < (kept[0] if kept else top)]
            if smaller:
                text += "; %s" % ", ".join(
                    "K = %d %s points" % (axis.values[r], f_gap(
                        error_gap(groups, r, axis.base, cell)).replace(" **", ""))
                    for r in smaller)
            out.append(text + ".")
            continue
        first = rows[0]
        if len(kept) == 1:
            text += "only %s = %d is within the noise of %s" % (
                axis.symbol, kept[0], axis.base)
        elif kept:
            text += "%s = %d to %d are within the noise of %s" % (
                axis.symbol, axis.values[first], kept[-1], axis.base)
        else:
            text += "already %s = %d differs from %s beyond the noise" % (
                axis.symbol, axis.values[first], axis.base)
        text += "; error against %s: %s" % (axis.base, ", ".join(
            "%s = %d %s" % (axis.symbol, axis.values[r],
                            f_gap(error_gap(groups, r, axis.base, cell)).replace(" **", ""))
            for r in rows))
        # Along the axis: does any value differ from the first beyond the noise?
        moved = [r for r in rows[1:] if (error_gap(groups, r, first, cell) or (0, 0, False))[2]]
        text += "; against %s = %d, %s" % (
            axis.symbol, axis.values[first],
            "%s differ%s beyond the noise" % (", ".join(
                "%s = %d (%s points)" % (axis.symbol, axis.values[r], f_gap(
                    error_gap(groups, r, first, cell)).replace(" **", "")) for r in moved),
                "s" if len(moved) == 1 else "") if moved
            else "no larger %s differs beyond the noise" % axis.symbol)
        for bound in axis.bounds:
            if bound == axis.base or (bound,) + cell not in groups:
                continue
            g = error_gap(groups, rows[-1], bound, cell)
            if g is not None:
                text += "; at %s = %d, %s points against %s%s" % (
                    axis.symbol, axis.values[rows[-1]], f_gap(g).replace(" **", ""), bound,
                    " (beyond the noise)" if g[2] else " (within the noise)")
        out.append(text + ".")
    return out


def table(axis, groups, cells):
    """One row per matrix row (the bounds, then the axis by value), per cell
    the test error and its gap to the base; groups also show the samples
    per channel a group normalizes over."""
    head = ["row", axis.symbol]
    for model, b in cells:
        head += ["`%s` b=%d: test error %%" % (model, b), "− %s (points)" % axis.base]
        if axis.symbol == "K":
            head.append("samples / channel / group")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in [r for r in axis.bounds] + axis_rows(axis):
        if not any((row, m, b) in groups for m, b in cells):
            continue
        line = [row, str(axis.values[row]) if row in axis.values else "—"]
        for model, b in cells:
            g = groups.get((row, model, b))
            line.append(f_err(error(g["acc"])) if g else "")
            line.append("" if row == axis.base or not g else
                        f_gap(error_gap(groups, row, axis.base, (model, b))))
            if axis.symbol == "K":
                line.append(str(samples(axis, row, model, b)))
        lines.append("| " + " | ".join(line) + " |")
    return lines


def row_flags(row):
    return " ".join(["--bn_policy=%s --gradients=%s" % ROWS[row][:2]] + list(ROWS[row].extra_flags))


def setup_text(data, axis, cells):
    cfg, runs = data["config"], data["runs"]
    first, last = axis_rows(axis)[0], axis_rows(axis)[-1]
    machine = data.get("machine") or {}
    wall = data.get("total_wall_s")
    loads = [r["load_average"][0] for r in runs if r.get("load_average")]
    rates = sorted({learning_rate(cfg, r, b) for r in axis_rows(axis) + axis.bounds
                    for _, b in cells})
    text = ("`python3 experiments/compare_policies.py --matrix=%s`: %d workers and %d "
            "shard servers per run, Fashion-MNIST, the first %s training examples for %d "
            "epoch(s), %s test examples, seeds %s, SGD learning rate %s (%g per global "
            "batch of 4, scaled linearly), momentum %g. Cells: %s. Rows: %s." % (
                cfg["matrix"], cfg["workers"], cfg["servers"],
                cfg["train_examples"] or 60000, cfg["epochs"], cfg["test_examples"] or 10000,
                ", ".join(str(s) for s in cfg["seeds"]),
                " and ".join("%g" % r for r in rates), cfg["learning_rate"], cfg["momentum"],
                "; ".join("`%s` at b=%d per worker (%d samples per channel per worker)"
                          % (m, b, POSITIONS.get(m, 0) * b) for m, b in cells),
                "; ".join(["**%s** (`%s`): %s" % (r, row_flags(r), ROWS[r].description)
                           for r in axis.bounds] + [
                    "**%s** to **%s** (`%s`, %s = %s): %s" % (
                        first, last, row_flags(first).replace(
                            "=%d" % axis.values[first], "=" + axis.symbol),
                        axis.symbol, ", ".join(str(axis.values[r]) for r in axis_rows(axis)),
                        axis.meaning)])))
    run_text = ("Command: `%s`. Machine: %s, %s cores; wall time %s (estimated %s); "
                "%d runs, %d ok." % (
                    portable_command(data.get("command_line", "?")),
                    machine.get("cpu") or "?", machine.get("cores") or "?",
                    "%.1f min" % (wall / 60.0) if wall else "?",
                    estimate_text(data.get("estimate_s") or 0), len(runs),
                    sum(1 for r in runs if r["status"] == "ok")))
    if loads:
        run_text += (" Load average (1 min) after each run %.1f to %.1f, mean %.1f: the "
                     "machine was shared, which slows the runs but not these rows' "
                     "arithmetic (sync and the exact staleness do not depend on timing)."
                     % (min(loads), max(loads), sum(loads) / len(loads)))
    return text, run_text


def render_axis(name, data, plot_file, hand_block, begin, end):
    """The section of one one-axis matrix, as markdown lines."""
    axis = AXES[name]
    groups = cell_groups(data["runs"])
    cells = cells_of(data["config"], data["runs"])
    setup, run_text = setup_text(data, axis, cells)
    L = ["## " + axis.heading, "", setup, "", run_text, ""]
    if plot_file:
        L += ["![%s](%s)" % (axis.heading, os.path.basename(plot_file)), ""]
    L.append("Test error in %% (mean ± sd over the seeds, n = %d unless a run failed); "
             "the gap to %s is the difference of means ± 2 standard errors, `**` where it "
             "exceeds that noise." % (len(data["config"]["seeds"]), axis.base))
    L.append("")
    L += table(axis, groups, cells)
    L.append("")
    for text in findings(axis, groups, cells):
        L.append("- Generated: " + text)
    failed = [r for r in data["runs"] if r["status"] != "ok"]
    if failed:
        L.append("- Runs that did not succeed: %s." % ", ".join(
            "`%s` (%s)" % (r["id"], r.get("reason") or r["status"]) for r in failed))
    L += ["", "### What we read from it", ""]
    L.append(hand_block or "%s\n_(Write the reading here; this block survives a re-render "
             "or a new run.)_\n%s" % (begin, end))
    L.append("")
    return L


def draw_axis_plot(plt, name, data, path):
    """Test error against the axis, one line per cell (error bars one
    standard deviation), the bounds as dashed lines across, and the start
    of the range within the noise of the base marked."""
    axis = AXES[name]
    groups = cell_groups(data["runs"])
    cells = cells_of(data["config"], data["runs"])
    rows = axis_rows(axis)
    values = [axis.values[r] for r in rows]
    colors = ["tab:blue", "tab:red", "tab:green", "tab:purple"]

    def side(x):  # Text beside an end point stays inside the axes.
        return "left" if x == values[0] else "right" if x == values[-1] else "center"

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, (model, b) in enumerate(cells):
        color = colors[i % len(colors)]
        pts = [(axis.values[r], error(groups[(r, model, b)]["acc"])) for r in rows
               if (r, model, b) in groups and groups[(r, model, b)]["acc"]]
        if not pts:
            continue
        xs = [p[0] for p in pts]
        ax.errorbar(xs, [100 * p[1][0] for p in pts], yerr=[100 * p[1][1] for p in pts],
                    color=color, marker="o", capsize=3, label="%s b=%d" % (model, b))
        for bound, style in zip(axis.bounds, ("--", ":")):
            e = error((groups.get((bound, model, b)) or {}).get("acc"))
            if e is not None:
                ax.axhline(100 * e[0], color=color, linestyle=style, linewidth=1)
                ax.annotate("%s" % bound, (xs[-1], 100 * e[0]), color=color, fontsize=7,
                            textcoords="offset points", xytext=(4, 2))
        kept = within_noise(groups, axis, (model, b))
        if kept and axis.base_at == "high" and kept[0] < axis.values[axis.base]:
            k = kept[0]
            e = error(groups[("sync-k%d" % k, model, b)]["acc"])
            ax.annotate("K ≥ %d within noise of K = %d\n(%d samples / channel / group)" % (
                k, axis.values[axis.base], samples(axis, "sync-k%d" % k, model, b)),
                (k, 100 * e[0]), xytext=(0, 28), textcoords="offset points", fontsize=7,
                color=color, ha=side(k), arrowprops=dict(arrowstyle="->", color=color))
        elif kept is not None and axis.base_at == "low":
            edge = kept[-1] if kept else None
            if edge is not None:
                e = error(groups[(rows[len(kept) - 1], model, b)]["acc"])
                ax.annotate("within noise of %s up to %s = %d" % (axis.base, axis.symbol, edge),
                            (edge, 100 * e[0]), xytext=(0, 28), textcoords="offset points",
                            fontsize=7, color=color, ha=side(edge),
                            arrowprops=dict(arrowstyle="->", color=color))
    if values[0] == 0:
        ax.set_xscale("symlog", base=2, linthresh=1)
    else:
        ax.set_xscale("log", base=2)
    ax.set_xticks(values)
    ax.set_xticklabels([str(v) for v in values])
    ax.set_xlabel(axis.label + ("; dashed: %s" % ", dotted: ".join(axis.bounds)
                                if axis.bounds else ""))
    ax.set_ylabel("test error %% (mean ± sd over %d seeds)" % len(data["config"]["seeds"]))
    ax.set_title("%s (%d workers)" % (axis.heading, data["config"]["workers"]), fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
