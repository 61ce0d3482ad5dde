"""A scale model of bnps's per-step BN and gradient cost (docs/scaling.md),
fitted to BN-exchange measurements on the test bed (bn_scaling.py).

One BN exchange (a layer's forward or backward merge, one shard, W
contributions) is modelled as

    T(W, R) = a + b * W + d(H) * R,   d(H) = d0 + d1 * H

a: the fixed cost of a call (client, server, wake-ups), b: the server's cost
per contribution (it merges them one by one), R: the link's round trip,
d(H): what a round trip of the link costs the exchange with H hosts (1 on a
real link; on the bed each host's relay is one more process polling through
the delay on the same CPUs, so it grows with H). a and b are fitted to the
rows without delay, d0 and d1 to the rows with delay and W <= 4 (least
squares of (T - a - b W) / R over H); the rows with delay and W > 4 check
the model. Predictions at scale take a real link: d = 1.

Per step, at scale (predictions; nothing here was run at these sizes):
- BN, flat (each worker to the shard): 2 L exchanges in a row (forward and
  backward of each of L BN layers), each with all W contributions at a shard:
  2 L T(W, R).
- BN, aggregated per host (bnps_host_bn, hostbn/aggregator.h): the k
  workers of a host send to the host's aggregator, which sends one frame per
  host to the shard, carrying the k contributions; the shard still merges
  all W. Fitted to the bed's aggregated rows without delay:

      T_agg(H, k, R) = a' + h H + l k + e W + d(H) R

  a': the fixed cost (a call and the hop through the aggregator), h: the
  shard's cost per host frame, l: the cost per worker of the host (the
  aggregator's reads and answers), e: the shard's cost per contribution
  (the merge), d(H) as above; 2 L T_agg(H, k, R) per step. The delayed
  aggregated rows check it.
- Gradients: each worker pushes and pulls 4P bytes (float32); one shard
  server per host holds P / H of them. Flat, a host's link carries 8 P k
  bytes each way (its k workers' and its shard's) and its shard processes
  8 P k bytes: max(8 P k / B, 8 P k / C) + 2 R. Aggregated, the host sums its
  workers' gradients in memory (4 P k / M) and sends one push:
  max(8 P / B, 8 P / C) + 4 P k / M + 2 R.
- NCCL beside them: a small all-reduce between 2 nodes over InfiniBand costs
  about 20 us (published; NVIDIA/nccl#1259, #583); with its tree across H
  hosts, 20 log2(H) us an exchange, 2 L of them per step.
"""

import collections
import math

Measured = collections.namedtuple(
    "Measured", "rtt_us hosts per_host p50_us p90_us aggregated",
    defaults=(False,))
Fit = collections.namedtuple("Fit", "a_us b_us d0 d1", defaults=(0.0,))
FitAgg = collections.namedtuple("FitAgg", "a_us host_us local_us entry_us")
Shape = collections.namedtuple("Shape", "name bn_layers params")

CNN = Shape("built-in CNN (depth 1, width 16)", 6, 28410)
RESNET50 = Shape("ResNet-50 shape", 53, 25_600_000)

LINK_RTT_US = 200.0
LINK_BYTES_PER_S = 12.5e9  # 100 Gb/s Ethernet
# A shard's push + pull processing: ps_benchmark's 64 MB rows, about 2100 MB/s
# of push + pull bytes on 127.0.0.1 (docs/performance.md).
SERVER_BYTES_PER_S = 2.1 * 2**30
MEMORY_BYTES_PER_S = 10e9  # summing on the host
NCCL_TWO_NODES_US = 20.0
FIT_W = 4  # d is fitted to the delayed rows up to this W, checked above it


def fit(rows):
    """a and b by least squares over the flat rows without delay; d0 and d1
    from the flat rows with delay and W <= FIT_W (d = 1 if there are none,
    d1 = 0 if they have one host count)."""
    rows = [m for m in rows if not m.aggregated]
    base = [(m.hosts * m.per_host, m.p50_us) for m in rows if m.rtt_us == 0]
    if len(base) < 2 or len({w for w, _ in base}) < 2:
        raise ValueError("need rows without delay at two or more W")
    n = len(base)
    mw = sum(w for w, _ in base) / n
    mt = sum(t for _, t in base) / n
    b = (sum((w - mw) * (t - mt) for w, t in base) /
         sum((w - mw) ** 2 for w, _ in base))
    a = mt - b * mw
    ds = [(m.hosts, (m.p50_us - a - b * m.hosts * m.per_host) / m.rtt_us)
          for m in rows if m.rtt_us > 0 and m.hosts * m.per_host <= FIT_W]
    if not ds:
        return Fit(a, b, 1.0, 0.0)
    if len({h for h, _ in ds}) < 2:
        return Fit(a, b, sum(d for _, d in ds) / len(ds), 0.0)
    d0, d1 = _solve([(1.0, h) for h, _ in ds], [d for _, d in ds])
    return Fit(a, b, d0, d1)


def link_factor(f, hosts):
    return f.d0 + f.d1 * hosts


def _solve(xs, ys):
    """Least squares: the coefficients c minimizing sum (x . c - y)^2, by the
    normal equations; None if they are singular."""
    n = len(xs[0])
    a = [[sum(x[i] * x[j] for x in xs) for j in range(n)] +
         [sum(x[i] * y for x, y in zip(xs, ys))] for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-9:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                q = a[r][col] / a[col][col]
                a[r] = [v - q * p for v, p in zip(a[r], a[col])]
    return [a[i][n] / a[i][i] for i in range(n)]


def fit_aggregated(rows):
    """a', h, l and e by least squares over the aggregated rows without
    delay; None without enough of them (four, varying H, k and W)."""
    base = [m for m in rows if m.aggregated and m.rtt_us == 0]
    if len(base) < 4:
        return None
    c = _solve([(1.0, m.hosts, m.per_host, m.hosts * m.per_host) for m in base],
               [m.p50_us for m in base])
    return FitAgg(*c) if c else None


def exchange_us(f, hosts, per_host, rtt_us):
    return (f.a_us + f.b_us * hosts * per_host +
            link_factor(f, hosts) * rtt_us)


def exchange_agg_us(fa, f, hosts, per_host, rtt_us):
    return (fa.a_us + fa.host_us * hosts + fa.local_us * per_host +
            fa.entry_us * hosts * per_host + link_factor(f, hosts) * rtt_us)


def check(rows, f, fa=None):
    """(row, predicted us, error as a fraction of the measurement) for the
    rows with delay that the fits did not use: flat ones with W > FIT_W,
    aggregated ones (with `fa`) all."""
    out = []
    for m in rows:
        w = m.hosts * m.per_host
        if m.rtt_us == 0:
            continue
        if m.aggregated:
            if fa is None:
                continue
            p = exchange_agg_us(fa, f, m.hosts, m.per_host, m.rtt_us)
        elif w <= FIT_W:
            continue
        else:
            p = exchange_us(f, m.hosts, m.per_host, m.rtt_us)
        out.append((m, p, (p - m.p50_us) / m.p50_us))
    return out


def step_costs(f, shape, workers, hosts, rtt_us=LINK_RTT_US, fa=None):
    """Predicted per-step costs in ms at `workers` on `hosts` (a real link:
    d = 1): BN flat, BN aggregated (None without `fa`), gradients flat,
    gradients aggregated, NCCL's BN."""
    k = workers / hosts
    exchanges = 2 * shape.bn_layers
    bn_flat = exchanges * (f.a_us + f.b_us * workers + rtt_us)
    bn_agg = None
    if fa is not None:
        bn_agg = exchanges * exchange_agg_us(fa, f._replace(d0=1.0, d1=0.0),
                                             hosts, k, rtt_us)
    grad_bytes = 8 * shape.params  # push + pull of float32
    rate = min(LINK_BYTES_PER_S, SERVER_BYTES_PER_S)
    grad_flat = grad_bytes * k / rate * 1e6 + 2 * rtt_us
    grad_agg = (grad_bytes / rate + grad_bytes / 2 * k / MEMORY_BYTES_PER_S) * 1e6 + 2 * rtt_us
    nccl = exchanges * NCCL_TWO_NODES_US * max(1.0, math.log2(hosts))
    return tuple(None if x is None else x / 1e3
                 for x in (bn_flat, bn_agg, grad_flat, grad_agg, nccl))


def report(rows, layouts=((64, 8), (64, 32), (256, 8), (256, 32), (256, 128),
                          (1024, 8), (1024, 32), (1024, 128))):
    f = fit(rows)
    fa = fit_aggregated(rows)
    lines = [f"Model fit, flat: a = {f.a_us:.0f} us, b = {f.b_us:.1f} us per "
             f"contribution, d(H) = {f.d0:.2f} + {f.d1:.2f} H (the bed's "
             f"round trip over the link's)", ""]
    if fa is not None:
        lines += [f"Model fit, aggregated: a' = {fa.a_us:.0f} us, h = "
                  f"{fa.host_us:.1f} us per host, l = {fa.local_us:.1f} us "
                  f"per worker of a host, e = {fa.entry_us:.1f} us per "
                  f"contribution", ""]
    checked = check(rows, f, fa)
    if checked:
        lines += ["| path | link RTT us | hosts | workers/host | W | measured "
                  "p50 us | model us | error |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for m, p, e in checked:
            lines.append(f"| {'aggregated' if m.aggregated else 'flat'} | "
                         f"{m.rtt_us:g} | {m.hosts} | {m.per_host} | "
                         f"{m.hosts * m.per_host} | {m.p50_us:.0f} | {p:.0f} | "
                         f"{100 * e:+.0f}% |")
        lines.append("")
    for shape in (CNN, RESNET50):
        lines += [f"Predicted per step, {shape.name} ({shape.bn_layers} BN "
                  f"layers, {shape.params:,} parameters), {LINK_RTT_US:g} us "
                  f"links, 100 Gb/s, one shard per host (ms)", "",
                  "| W | hosts | workers/host | BN flat | BN per-host "
                  "aggregation | gradients flat | gradients aggregated | "
                  "NCCL BN (published latency) |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for w, h in layouts:
            c = step_costs(f, shape, w, h, fa=fa)
            lines.append(f"| {w} | {h} | {w // h} | " +
                         " | ".join("-" if x is None else f"{x:.1f}"
                                    for x in c) + " |")
        lines.append("")
    return "\n".join(lines)
