#!/usr/bin/env bash
# The metrics endpoints against a real Prometheus (Debian's prometheus package,
# installed by tools/setup.sh): starts a bnps_server and two bnps_workers on
# 127.0.0.1 with --metrics_port, and a Prometheus on a free loopback port with
# a generated config and a temporary storage directory; waits until it has
# scraped every endpoint, then asks its HTTP API for non-zero pushes, a
# barrier-wait histogram and the workers' step split. `promtool check metrics`
# validates every endpoint's exposition. Everything it starts is stopped by
# PID at exit. Also the health check of tools/grpc_health_check.py.
#
#   bazel test //tools:prometheus_scrape_test
#   tools/prometheus_scrape_test.sh [BIN_DIR]   # BIN_DIR: default bazel-bin
set -euo pipefail

if [ -n "${TEST_SRCDIR:-}" ]; then
  bin="$TEST_SRCDIR/bnps"
  pydir="$TEST_SRCDIR/bnps/python"
else
  bin="${1:-bazel-bin}"
  pydir="$(cd "$(dirname "$0")/.." && pwd)/python"
fi
# bnps.cluster (standard library only) reads the server's port.
export PYTHONPATH="$pydir${PYTHONPATH:+:$PYTHONPATH}"
server="$bin/server/bnps_server"
worker="$bin/worker/bnps_worker"
prometheus=/usr/bin/prometheus
promtool=/usr/bin/promtool
for f in "$server" "$worker" "$prometheus" "$promtool"; do
  if [ ! -x "$f" ]; then
    echo "prometheus_scrape_test: $f missing (bazel build //:bnps_server" \
         "//:bnps_worker; tools/setup.sh installs prometheus)" >&2
    exit 1
  fi
done

tmp="$(mktemp -d "${TEST_TMPDIR:-/tmp}/bnps_scrape.XXXXXX")"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
  echo "prometheus_scrape_test: FAIL: $*" >&2
  for log in "$tmp"/*.log; do
    echo "--- $log" >&2
    tail -n 20 "$log" >&2
  done
  exit 1
}

# Free loopback ports (the kernel's pick, released at once).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
server_metrics=$(free_port)
worker0_metrics=$(free_port)
worker1_metrics=$(free_port)
prom_port=$(free_port)

# --keep_serving: scraped after the workers finished, as they are. The log
# exists before the server starts: the loop below reads it at once, and a
# missing file would end this script (set -e).
: >"$tmp/server.log"
"$server" --port=0 --num_workers=2 --metrics_port="$server_metrics" --keep_serving \
  >"$tmp/server.log" 2>&1 &
pids+=($!)
port=""
for _ in $(seq 100); do
  port=$(python3 -m bnps.cluster listening "$tmp/server.log") && port=${port##*:}
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || fail "the server did not start"

# The standard health check, as a probe makes it.
if [ -n "${TEST_SRCDIR:-}" ]; then
  health="$TEST_SRCDIR/bnps/tools/grpc_health_check.py"
else
  health="$(dirname "$0")/grpc_health_check.py"
fi
/usr/bin/python3 "$health" "127.0.0.1:$port" bnps.proto.ParameterServer \
  || fail "the server is not SERVING"

# Short training; the workers keep their endpoints up afterwards so that
# Prometheus scrapes their final figures.
for w in 0 1; do
  metrics_port=$worker0_metrics
  [ "$w" = 1 ] && metrics_port=$worker1_metrics
  "$worker" --servers="127.0.0.1:$port" --worker="$w" --num_workers=2 \
    --device=cpu --data=synthetic --train_examples=1024 --eval=none \
    --progress=none --max_steps=20 --metrics_port="$metrics_port" \
    --metrics_linger_s=60 >"$tmp/worker$w.log" 2>&1 &
  pids+=($!)
done

cat >"$tmp/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: bnps_server
    static_configs:
      - targets: ['127.0.0.1:$server_metrics']
  - job_name: bnps_worker
    static_configs:
      - targets: ['127.0.0.1:$worker0_metrics', '127.0.0.1:$worker1_metrics']
YAML
"$promtool" check config "$tmp/prometheus.yml" >/dev/null \
  || fail "promtool rejects the generated config"
"$prometheus" --config.file="$tmp/prometheus.yml" \
  --storage.tsdb.path="$tmp/data" --web.listen-address="127.0.0.1:$prom_port" \
  --log.level=warn >"$tmp/prometheus.log" 2>&1 &
pids+=($!)

# The value of a PromQL query's first sample, or empty.
query() {
  curl -sfG "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode "query=$1" \
    | python3 -c 'import json, sys
r = json.load(sys.stdin)["data"]["result"]
print(r[0]["value"][1] if r else "")' 2>/dev/null || true
}
positive() { python3 -c "import sys; sys.exit(0 if float('$1') > 0 else 1)" 2>/dev/null; }

checks=(
  'count(up{job=~"bnps_.*"} == 1) == 3'
  'sum(bnps_server_pushes_total{result="applied"})'
  'sum(bnps_server_bn_barrier_wait_seconds_count{phase="forward"})'
  'histogram_quantile(0.9, sum by (le) (bnps_server_bn_barrier_wait_seconds_bucket))'
  'sum(bnps_server_requests_total{method="PushGradients",code="OK"})'
  'min(bnps_server_worker_step)'
  'sum(bnps_worker_step_seconds_count{part="bn_sync"})'
  'sum(bnps_worker_bn_round_trip_seconds_count)'
)
deadline=$((SECONDS + 45))
for q in "${checks[@]}"; do
  while true; do
    v=$(query "$q")
    if [ -n "$v" ] && positive "$v"; then
      echo "ok: $q = $v"
      break
    fi
    [ "$SECONDS" -lt "$deadline" ] || fail "no positive answer to: $q (last: '$v')"
    sleep 0.5
  done
done

# Every query of the Grafana dashboard parses and runs (its variables set
# to this test's job names).
if [ -n "${TEST_SRCDIR:-}" ]; then
  dashboard="$TEST_SRCDIR/bnps/deploy/grafana/bnps.json"
else
  dashboard="$(dirname "$0")/../deploy/grafana/bnps.json"
fi
python3 - "$dashboard" "$prom_port" <<'PY' || fail "a dashboard query failed"
import json, sys, urllib.parse, urllib.request
dashboard, port = sys.argv[1], sys.argv[2]
panels = json.load(open(dashboard))["panels"]
n = 0
for panel in panels:
    for target in panel["targets"]:
        expr = (target["expr"].replace("$server_job", "bnps_server")
                .replace("$worker_job", "bnps_worker"))
        url = "http://127.0.0.1:%s/api/v1/query?%s" % (
            port, urllib.parse.urlencode({"query": expr}))
        try:
            status = json.load(urllib.request.urlopen(url))["status"]
        except Exception as e:  # 400: the query does not parse
            sys.exit("%s: %s: %s" % (panel["title"], expr, e))
        if status != "success":
            sys.exit("%s: %s: %s" % (panel["title"], expr, status))
        n += 1
print("ok: the dashboard's %d queries run" % n)
PY

for p in "$server_metrics" "$worker0_metrics" "$worker1_metrics"; do
  curl -sf "http://127.0.0.1:$p/metrics" >"$tmp/metrics_$p.txt" \
    || fail "cannot fetch 127.0.0.1:$p/metrics"
  "$promtool" check metrics <"$tmp/metrics_$p.txt" \
    || fail "promtool check metrics rejects 127.0.0.1:$p"
  echo "ok: promtool check metrics 127.0.0.1:$p"
done
echo "prometheus_scrape_test: PASS"
