#!/usr/bin/env python3
"""The BN exchange's cost against workers per host and hosts, on the test bed
(tools/testbed/README.md), and the scale model fitted to it (docs/scaling.md).

One shard server (sync) on host 0; H worker hosts with k workers each
(W = H * k bn_exchange processes), reaching the server over links of the
given round trip. Each worker times --reps BnForward calls of one layer of
--channels channels (a call returns once all W contributions are in); a cell
is the largest per-worker median. Prints Markdown tables: the measurements,
then the model's fit and its predictions.

Run as root, from the repository root, after
  bazel build //tools/testbed:bn_exchange //tools/testbed:bnps_relay \\
      //server:bnps_server
  tools/testbed/bn_scaling.py [--rtt_us=0,200] [--layouts=1x1,1x2,...]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

from tools.testbed import scale_model, testbed  # noqa: E402

BIN = "bazel-bin"
GRPC_PORT, BN_PORT = 7000, 7100


def measure(bed, links, hosts, per_host, reps, channels):
    workers = hosts * per_host
    server = bed.popen(0, [
        os.path.join(BIN, "server/bnps_server"), "--host=0.0.0.0",
        f"--port={GRPC_PORT}", f"--bn_port={BN_PORT}", "--num_shards=1",
        f"--num_workers={workers}", "--policy=sync",
        "--barrier_timeout_ms=60000"], stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        procs = []
        for w in range(workers):
            host = 1 + w // per_host
            procs.append(bed.popen(host, [
                os.path.join(BIN, "tools/testbed/bn_exchange"),
                f"--servers={links.address(0, GRPC_PORT)}", f"--worker={w}",
                f"--num_workers={workers}", f"--reps={reps}",
                f"--channels={channels}"], stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, text=True))
        p50s, p90s = [], []
        for p in procs:
            out, _ = p.communicate(timeout=300)
            if p.returncode != 0:
                raise RuntimeError(f"bn_exchange failed: {out}")
            fields = dict(kv.split("=") for kv in out.split())
            p50s.append(float(fields["p50_us"]))
            p90s.append(float(fields["p90_us"]))
        return max(p50s), max(p90s)
    finally:
        server.kill()
        server.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rtt_us", default="0,200")
    ap.add_argument("--layouts", default="1x1,1x2,1x4,2x1,2x2,4x1,4x2,2x4",
                    help="HOSTSxWORKERS_PER_HOST, comma-separated")
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--spin_us", type=float, default=60,
                    help="the relays' --spin_us")
    args = ap.parse_args()
    why = testbed.unavailable()
    if why:
        sys.exit(f"bn_scaling: no test bed here: {why}")
    layouts = [tuple(int(x) for x in l.split("x"))
               for l in args.layouts.split(",")]
    rtts = [float(r) for r in args.rtt_us.split(",")]
    max_hosts = max(h for h, _ in layouts)
    cells = {}  # (rtt, hosts, per_host) -> [(p50, p90)] over rounds
    with testbed.Bed(1 + max_hosts) as bed:
        links = bed.links(clients=list(range(1, 1 + max_hosts)), servers=[0],
                          ports=[GRPC_PORT, BN_PORT], spin_us=args.spin_us)
        for r in range(args.rounds):
            for rtt in rtts:
                links.delay(rtt)
                for hosts, per_host in layouts:
                    p50, p90 = measure(bed, links, hosts, per_host, args.reps,
                                       args.channels)
                    cells.setdefault((rtt, hosts, per_host), []).append((p50, p90))
                    print(f"round {r}: rtt {rtt:g} us, {hosts} hosts x "
                          f"{per_host}: p50 {p50:.0f} us, p90 {p90:.0f} us",
                          file=sys.stderr, flush=True)
    rows = [scale_model.Measured(rtt, h, k, statistics.median(p for p, _ in v),
                                 statistics.median(q for _, q in v))
            for (rtt, h, k), v in cells.items()]
    print(f"BN exchange (one layer, {args.channels} channels, one shard): "
          f"the largest per-worker p50 and p90 of {args.reps} calls, median "
          f"of {args.rounds} rounds; load average at the end "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    print("| link RTT us | hosts | workers/host | W | p50 us | p90 us |")
    print("|---:|---:|---:|---:|---:|---:|")
    for m in rows:
        print(f"| {m.rtt_us:g} | {m.hosts} | {m.per_host} | "
              f"{m.hosts * m.per_host} | {m.p50_us:.0f} | {m.p90_us:.0f} |")
    print()
    print(scale_model.report(rows))


if __name__ == "__main__":
    main()
