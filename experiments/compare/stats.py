"""Statistics over the runs: per (row, batch size) means and min-max ranges
over seeds, and whether two rows differ beyond the noise.
"""

import math


def mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def aggregate(runs, policies, batch_sizes):
    """{(row, b): {...}} over seeds: n, n_ok, failures, and for each figure
    (mean, min, max) over the ok runs."""
    groups = {}
    for row in policies:
        for b in batch_sizes:
            rs = [r for r in runs if r["policy"] == row and r["batch_size"] == b]
            ok = [r for r in rs if r["status"] == "ok"]
            g = {"runs": rs, "n": len(rs), "n_ok": len(ok),
                 "failed": [r for r in rs if r["status"] == "failed"],
                 "not_run": [r for r in rs if r["status"] == "not run"]}
            figures = {
                "test_accuracy": [r.get("test_accuracy") for r in ok],
                "test_accuracy_recal": [r.get("test_accuracy_recal") for r in ok],
                "train_loss_last": [r.get("train_loss_last") for r in ok],
                "images_per_second": [r.get("images_per_second") for r in ok],
                "ms_compute": [(r.get("ms_per_step") or {}).get("compute") for r in ok],
                "ms_bn_sync": [(r.get("ms_per_step") or {}).get("bn_sync") for r in ok],
                "ms_grad_sync": [(r.get("ms_per_step") or {}).get("grad_sync") for r in ok],
                "ms_total": [(r.get("ms_per_step") or {}).get("total") for r in ok],
                "max_staleness": [r.get("max_staleness") for r in ok],
                "wall_s": [r.get("wall_s") for r in rs if r.get("wall_s") is not None],
                "steps": [r.get("steps") for r in ok],
            }
            for key, values in figures.items():
                values = [v for v in values if v is not None]
                g[key] = (mean(values), min(values), max(values)) if values else None
            g["seed_values"] = [r.get("test_accuracy") for r in ok]
            groups[(row, b)] = g
    return groups


def noise_floor(p, n_test):
    """Standard error of an accuracy p measured on n_test examples."""
    if p is None or not n_test:
        return None
    return math.sqrt(max(p * (1 - p), 1e-12) / n_test)


def separated(ga, gb, key, n_test):
    """True when rows a and b differ in `key` beyond the noise: with two or
    more seeds each, when their min-max ranges do not overlap; with one
    seed, when the gap exceeds 2 x the test-set sampling error of the
    difference (seed-to-seed variation is then unmeasured, so this is a
    lower bound on the noise). None when a figure is missing."""
    a, b = ga.get(key), gb.get(key)
    if a is None or b is None:
        return None
    if ga["n_ok"] >= 2 and gb["n_ok"] >= 2:
        return a[1] > b[2] or b[1] > a[2]
    sa, sb = noise_floor(a[0], n_test), noise_floor(b[0], n_test)
    if sa is None or sb is None:
        return None
    return abs(a[0] - b[0]) > 2 * math.sqrt(sa * sa + sb * sb)
