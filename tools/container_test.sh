#!/usr/bin/env bash
# The container deployment, end to end, on this machine (docs/deploy.md):
#   1. the Debian base image (mmdebstrap, once per machine: no registry here),
#   2. the bnps image (Dockerfile: Bazel builds the binaries inside Debian 12),
#   3. compose.yaml run to completion, plaintext with a token and again with
#      compose.tls.yaml (mutual TLS): every worker prints a test accuracy, then
#      every server exits 0,
#   4. the Kubernetes manifests (deploy/base, gpu, tls, jobset, jobset-tls,
#      kubeflow) rendered with kubectl kustomize and every object validated
#      offline (deploy/validate.py: Kubernetes' schemas, ours of JobSet,
#      Kubeflow Trainer's made strict),
#   5. the servers and workers of deploy/jobset, jobset-tls, base and tls run
#      as Pods with podman kube play (deploy/to_pods.py renders the JobSet, the
#      StatefulSet and the Indexed Job as the Pods a cluster would create) to
#      the workers' test accuracy; the JobSet's servers then exit 0, the
#      StatefulSet's keep serving (BNPS_KEEP_SERVING).
# A server that does not exit 0 in time after its workers finished is reported
# at the end, after the other steps ran, so one run shows all that passed.
# It removes every container, pod, network and volume it started, and its
# files; images, build layers and the image build's Bazel cache stay (the next
# run reuses them) unless --rmi, which removes them all (and any other image
# no container uses: meant for a machine that runs only this).
#
#   tools/setup.sh --containers && tools/container_test.sh [--rmi] [--skip-tls]
#
# --skip-tls skips the TLS runs (compose.tls.yaml and deploy/tls's pods).
#
# Needs root (rootful Podman), podman-compose, mmdebstrap, iptables, openssl,
# Debian's python3 with PyYAML, and the virtual environment of
# deploy/requirements.txt (the validator and kubectl; BNPS_VENV, default
# /opt/bnps-venv): tools/setup.sh --containers installs them all.
# Exit status 0 when every step passed; the failing step's output otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

rmi=0
tls=1
for arg in "$@"; do
  case "$arg" in
    --rmi) rmi=1 ;;
    --skip-tls) tls=0 ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
    *) echo "container_test.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

for tool in podman podman-compose mmdebstrap iptables openssl; do
  if ! command -v "$tool" >/dev/null; then
    echo "container_test.sh: no $tool; run tools/setup.sh --containers" >&2
    exit 2
  fi
done
venv=${BNPS_VENV:-/opt/bnps-venv}
readonly kubectl="$venv/bin/kubectl" validate=("$venv/bin/python3" deploy/validate.py)
if [ ! -x "$kubectl" ] || ! "$venv/bin/python3" -c 'import kubernetes_validate' 2>/dev/null; then
  echo "container_test.sh: no validator or kubectl in $venv; run tools/setup.sh --containers" >&2
  exit 2
fi
if ! /usr/bin/python3 -c 'import yaml' 2>/dev/null; then
  echo "container_test.sh: no PyYAML for /usr/bin/python3; run tools/setup.sh" >&2
  exit 2
fi

# Podman as it works here: runc, no default ulimits, netavark (DNS by name).
export CONTAINERS_CONF=${CONTAINERS_CONF:-$repo/tools/containers.conf}
readonly IMAGE=localhost/bnps:latest
readonly BASE=localhost/debian:bookworm
readonly project="bnpsct$$"
readonly kube_net="bnpsct$$-kube"
readonly subnet_prefix="10.89.$((100 + $$ % 100))"
work=$(mktemp -d /tmp/bnps-container-test.XXXXXX)
start=$(date +%s)

step() { echo "== $(( $(date +%s) - start ))s: $*"; }
die() { echo "container_test.sh: FAILED: $*" >&2; exit 1; }
late=()  # failures reported at the end (servers that did not exit 0)

# Seconds a server may take to exit after its job's last worker finished.
readonly SERVER_EXIT_S=90
# Waits for each container named to exit, and records (in late) any that is
# still running after SERVER_EXIT_S or exits with another status than 0.
expect_exit_0() {  # WHAT CONTAINER...
  local what=$1 c rc; shift
  for c in "$@"; do
    if ! rc=$(timeout "$SERVER_EXIT_S" podman wait "$c"); then
      late+=("$what: $c still running ${SERVER_EXIT_S}s after the workers finished (servers exit 0 once every worker of the job has finished and the final checkpoint is written; a bnps_server without that ends only when stopped)")
      podman stop -t 20 "$c" > /dev/null 2>&1 || true
    elif [ "$rc" != 0 ]; then
      late+=("$what: $c exited $rc after the workers finished, not 0")
    else
      echo "   $what: $c exited 0"
    fi
  done
}

compose() {
  podman-compose -p "$project" "$@"
}

cleanup() {
  local rc=$?
  set +e
  echo "== cleaning up"
  for f in "$work"/pods-*/workers.yaml "$work"/pods-*/servers.yaml; do
    [ -f "$f" ] && podman kube down "$f" >/dev/null 2>&1
  done
  # podman-compose 1.0.3's down leaves the network; remove what is labelled.
  compose -f compose.yaml down -v >/dev/null 2>&1
  podman ps -a -q --filter "label=io.podman.compose.project=$project" |
    xargs -r podman rm -f >/dev/null 2>&1
  podman network ls -q --filter "label=io.podman.compose.project=$project" |
    xargs -r podman network rm -f >/dev/null 2>&1
  podman network exists "$kube_net" && podman network rm -f "$kube_net" >/dev/null
  podman volume ls -q --filter "label=io.podman.compose.project=$project" |
    xargs -r podman volume rm -f >/dev/null 2>&1
  if [ "$rmi" = 1 ]; then
    podman rmi -f "$IMAGE" "$BASE" docker.io/library/debian:bookworm \
      docker.io/library/debian:bookworm-slim >/dev/null 2>&1
    # The build stages' layers, and the Dockerfile's Bazel cache mount.
    podman image prune -a -f >/dev/null 2>&1
    rm -rf /var/tmp/buildah-cache/bnps-bazel-disk
  fi
  rm -rf "$work"
  echo "== $(( $(date +%s) - start ))s in all; exit status $rc"
}
trap cleanup EXIT

# The workers' accuracy lines in LOG: N of them, each above chance (10%).
check_accuracy() {
  local log=$1 want=$2 what=$3
  local got
  got=$(grep -cE '^test accuracy 0\.[0-9]{4}' "$log" || true)
  [ "$got" = "$want" ] || { tail -40 "$log"; die "$what: $got of $want workers printed a test accuracy"; }
  # Above 0.5: well above chance after an epoch (about 0.8 is usual).
  if grep -E '^test accuracy' "$log" | awk '{ if ($3 < 0.5) bad = 1 } END { exit !bad }'; then
    grep -E '^test accuracy' "$log"; die "$what: a test accuracy below 0.5"
  fi
  grep -E '^test accuracy' "$log" | sort | uniq -c | sed "s/^/   $what: /"
}

# --- 1. The base image ------------------------------------------------------
if podman image exists "$BASE"; then
  step "base image $BASE: present (reused)"
else
  step "base image $BASE: mmdebstrap (once per machine)"
  mmdebstrap --quiet --variant=minbase bookworm "$work/rootfs.tar" http://deb.debian.org/debian
  podman import --quiet "$work/rootfs.tar" "$BASE" >/dev/null
  rm -f "$work/rootfs.tar"
fi
# The names the Dockerfile's FROM lines use.
podman tag "$BASE" docker.io/library/debian:bookworm docker.io/library/debian:bookworm-slim

# --- 2. The bnps image --------------------------------------------------------
step "podman build -t $IMAGE ."
podman build --network host --pull=never -t "$IMAGE" . > "$work/build.log" 2>&1 ||
  { tail -60 "$work/build.log"; die "podman build"; }
podman run --rm "$IMAGE" bnps_worker --help > "$work/help.txt" ||
  die "bnps_worker --help in the image"
grep -q 'BNPS_SERVERS' "$work/help.txt" || die "--help in the image names no BNPS_SERVERS"
[ "$(podman run --rm "$IMAGE" id -u)" = 10001 ] || die "the image's user is not 10001"
step "image $(podman image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}')"

# --- 3. compose ---------------------------------------------------------------
# Secrets are bind-mounted: the containers' user (10001) must read them.
openssl rand -hex 32 > "$work/token"
chmod 644 "$work/token"
export COMPOSE_BNPS_TOKEN="$work/token" COMPOSE_BNPS_IMAGE="$IMAGE"

run_compose() {  # NAME COMPOSE_FILES...
  local name=$1; shift
  local files=()
  for f in "$@"; do files+=(-f "$f"); done
  step "compose ($name): podman-compose up"
  compose "${files[@]}" up -d > "$work/compose-$name-up.log" 2>&1 ||
    { cat "$work/compose-$name-up.log"; die "podman-compose up ($name)"; }
  local log="$work/compose-$name.log" rc
  : > "$log"
  for w in 0 1 2 3; do
    rc=$(timeout 900 podman wait "${project}_worker-${w}_1") ||
      die "compose ($name): worker-$w did not finish in 15 minutes"
    podman logs "${project}_worker-${w}_1" >> "$log" 2>&1
    [ "$rc" = 0 ] || { tail -30 "$log"; podman logs "${project}_server-0_1" | tail; die "compose ($name): worker-$w exited $rc"; }
  done
  check_accuracy "$log" 4 "compose ($name)"
  # The job is over: each server exits 0 (restart: on-failure leaves it so).
  expect_exit_0 "compose ($name)" "${project}_server-0_1" "${project}_server-1_1"
  podman logs "${project}_server-0_1" > "$work/compose-$name-server.log" 2>&1
  # The servers wrote checkpoints into their volumes (BNPS_CHECKPOINT_DIR).
  local dir
  for s in 0 1; do
    dir=$(podman volume inspect --format '{{.Mountpoint}}' "${project}_checkpoints-$s") ||
      die "compose ($name): no volume ${project}_checkpoints-$s"
    ls "$dir" > "$work/compose-$name-ckpt-$s.txt" 2>&1 || true
    grep -q '^ckpt-.*\.bnps$' "$work/compose-$name-ckpt-$s.txt" ||
      { cat "$work/compose-$name-ckpt-$s.txt"; die "compose ($name): no checkpoint in server-$s's volume"; }
  done
  echo "   compose ($name): checkpoints in both servers' volumes: $(wc -l < "$work/compose-$name-ckpt-0.txt") and $(wc -l < "$work/compose-$name-ckpt-1.txt")"
  # -v: the checkpoint volumes too, or the next run would resume this job.
  compose "${files[@]}" down -v > /dev/null 2>&1
}

run_compose plaintext compose.yaml
grep -q "plaintext with a job token" "$work/compose-plaintext-server.log" ||
  die "compose (plaintext): the server did not take the token"
if [ "$tls" = 1 ]; then
  deploy/make_tls.sh "$work/tls" server-0 server-1 > /dev/null
  export COMPOSE_BNPS_TLS="$work/tls"
  run_compose tls compose.yaml compose.tls.yaml
  grep -q "mutual TLS" "$work/compose-tls-server.log" ||
    { cat "$work/compose-tls-server.log"; die "compose (tls): the server does not serve mutual TLS"; }
fi

# --- 4. The manifests, validated ----------------------------------------------
step "manifests: kubectl kustomize ($("$kubectl" version --client | tr '\n' ' ')), deploy/validate.py"
# A copy of deploy/ with the secrets a user would create.
cp -r deploy "$work/deploy"
openssl rand -hex 32 > "$work/deploy/base/secrets/token"
cp "$work/deploy/base/secrets/token" "$work/deploy/jobset/secrets/token"
deploy/make_tls.sh "$work/deploy/tls/secrets" > /dev/null
deploy/make_tls.sh "$work/deploy/jobset-tls/secrets" \
  bnps-servers-0-0.bnps bnps-servers-0-1.bnps '*.bnps.default.svc' > /dev/null
for overlay in base gpu tls jobset jobset-tls kubeflow; do
  "$kubectl" kustomize "$work/deploy/$overlay" > "$work/$overlay.yaml" ||
    die "kubectl kustomize deploy/$overlay"
  "${validate[@]}" "$work/$overlay.yaml" > "$work/validate-$overlay.txt" ||
    { cat "$work/validate-$overlay.txt"; die "deploy/$overlay: invalid objects"; }
  echo "   deploy/$overlay: $(tail -1 "$work/validate-$overlay.txt")"
done
# The validator must be able to fail: a count that is not a number, in a
# StatefulSet (Kubernetes' schema), in a JobSet (ours) and in a TrainJob
# (Trainer's).
if sed 's/replicas: 2/replicas: "two"/' "$work/base.yaml" | "${validate[@]}" - > /dev/null; then
  die "validate.py accepted a StatefulSet with replicas: \"two\""
fi
if sed 's/replicas: 1/replicas: "one"/' "$work/jobset.yaml" | "${validate[@]}" - > /dev/null; then
  die "validate.py accepted a JobSet with replicas: \"one\""
fi
if sed 's/numNodes: 2/numNodes: "two"/' "$work/kubeflow.yaml" | "${validate[@]}" - > /dev/null; then
  die "validate.py accepted a TrainJob with numNodes: \"two\""
fi

# --- 5. The manifests' containers as Pods --------------------------------------
podman network create --subnet "$subnet_prefix.0/24" "$kube_net" > /dev/null

# Retries COMMAND... for up to 60 s (a server that is starting).
within_60s() {
  local t
  for t in $(seq 60); do "$@" && return 0; sleep 1; done
  "$@"
}
health_serving() { /usr/bin/python3 tools/grpc_health_check.py "$1:7000" > "$2" 2>&1; }
port_open() { /usr/bin/python3 -c "import socket; socket.create_connection(('$1', 7000), 5).close()" 2>/dev/null; }
bnps_metrics() {
  /usr/bin/python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen('http://$1:9090/metrics', timeout=10).read().decode())" \
    > "$2" 2>/dev/null && grep -q '^bnps_' "$2"
}

run_pods() {  # OVERLAY: deploy/OVERLAY's servers and workers as Pods
  local overlay=$1 pods="$work/pods-$1" what="pods ($1)"
  # The StatefulSet's pods and names (deploy/base, tls), or the JobSet's.
  local first_server=bnps-server-0.bnps-server ckpt="checkpoints-bnps-server-%d" ends=0 tls_on=0
  case "$overlay" in
    jobset*) first_server=bnps-servers-0-0.bnps ckpt="checkpoints-bnps/shard-%d" ends=1 ;;
  esac
  case "$overlay" in *tls) tls_on=1 ;; esac
  step "$what: podman kube play deploy/$overlay's servers and workers"
  /usr/bin/python3 deploy/to_pods.py "$work/$overlay.yaml" "$pods" "$subnet_prefix" > /dev/null
  local ip_args=() ip w s rc i servers=() workers=() pod
  while read -r ip; do ip_args+=(--ip "$ip"); done < "$pods/ips"
  while read -r pod; do servers+=("$pod-server"); done < "$pods/server-pods"
  while read -r pod; do workers+=("$pod-worker"); done < "$pods/worker-pods"
  [ ${#servers[@]} = 2 ] && [ ${#workers[@]} = 4 ] ||
    die "$what: ${#servers[@]} server and ${#workers[@]} worker pods, want 2 and 4"
  podman kube play --network "$kube_net" "${ip_args[@]}" "$pods/servers.yaml" \
    > "$pods/play-servers.log" 2>&1 || { cat "$pods/play-servers.log"; die "$what: kube play (servers)"; }
  podman kube play --network "$kube_net" "$pods/workers.yaml" \
    > "$pods/play-workers.log" 2>&1 || { cat "$pods/play-workers.log"; die "$what: kube play (workers)"; }
  # While the workers train: what the manifests' probes and scrape
  # annotations point at. Plaintext: gRPC health says SERVING on 7000
  # (Kubernetes' grpc: probe); TLS: the port accepts connections (the
  # overlay's tcpSocket probe). Both: bnps metrics on :9090/metrics.
  i=0
  while read -r ip; do
    if [ "$tls_on" = 1 ]; then
      within_60s port_open "$ip" || die "$what: ${servers[$i]} does not accept connections on 7000"
    else
      within_60s health_serving "$ip" "$pods/health-$i.txt" ||
        { cat "$pods/health-$i.txt"; die "$what: ${servers[$i]}'s health service is not SERVING"; }
    fi
    within_60s bnps_metrics "$ip" "$pods/metrics-$i.txt" ||
      die "$what: ${servers[$i]} serves no bnps_ metrics on :9090/metrics"
    i=$((i + 1))
  done < "$pods/ips"
  if [ "$tls_on" = 1 ]; then
    echo "   $what: both servers accept connections on 7000 and serve /metrics on 9090"
  else
    echo "   $what: both servers SERVING on 7000 and serving /metrics on 9090"
  fi
  local log="$pods/workers.log"
  : > "$log"
  for w in 0 1 2 3; do
    rc=$(timeout 900 podman wait "${workers[$w]}") ||
      die "$what: ${workers[$w]} did not finish in 15 minutes"
    podman logs "${workers[$w]}" >> "$log" 2>&1
    [ "$rc" = 0 ] || { tail -30 "$log"; die "$what: ${workers[$w]} exited $rc"; }
  done
  check_accuracy "$log" 4 "$what"
  # The job is over. The JobSet's servers (restartPolicy OnFailure) end with
  # status 0; the StatefulSet's are told to keep serving (a StatefulSet
  # restarts whatever exits).
  if [ "$ends" = 1 ]; then
    expect_exit_0 "$what" "${servers[@]}"
  else
    for s in 0 1; do
      [ "$(podman inspect --format '{{.State.Running}}' "${servers[$s]}")" = true ] ||
        die "$what: ${servers[$s]} stopped although BNPS_KEEP_SERVING=true"
    done
    echo "   $what: both servers still serving (BNPS_KEEP_SERVING=true)"
  fi
  # Each server's shard: its pod's ordinal (StatefulSet, from the host name)
  # or completion index (JobSet, through the downward API).
  # (Logs to a file first: grep -q would close the pipe early, and pipefail.)
  for s in 0 1; do
    podman logs "${servers[$s]}" > "$pods/server-$s.log" 2>&1
    grep -q "shard $s of 2" "$pods/server-$s.log" ||
      { cat "$pods/server-$s.log"; die "$what: ${servers[$s]} is not shard $s"; }
    if [ "$tls_on" = 1 ]; then
      grep -q "mutual TLS with a job token" "$pods/server-$s.log" ||
        die "$what: ${servers[$s]} does not serve mutual TLS"
    fi
  done
  # Checkpoints in each server's claim (the StatefulSet's volumeClaimTemplate,
  # or its directory of the JobSet's volumeClaimPolicies claim).
  for s in 0 1; do
    # shellcheck disable=SC2059
    ls "$pods/volumes/$(printf "$ckpt" "$s")" | grep -q '^ckpt-.*\.bnps$' ||
      die "$what: no checkpoint in ${servers[$s]}'s volume"
  done
  # The worker ids came from JOB_COMPLETION_INDEX, the servers' names from
  # the manifests (the JobSet's: derived in the pod from NUM_SERVERS).
  for w in 0 1 2 3; do
    grep -q "^bnps_worker $w/4: connecting to job 'fashion' at $first_server:7000" "$log" ||
      die "$what: no worker $w connecting by the servers' DNS names ($first_server, ...)"
  done
  podman kube down "$pods/workers.yaml" > /dev/null 2>&1
  podman kube down "$pods/servers.yaml" > /dev/null 2>&1
}

run_pods jobset
if [ "$tls" = 1 ]; then run_pods jobset-tls; fi
run_pods base
if [ "$tls" = 1 ]; then run_pods tls; fi
if [ ${#late[@]} -gt 0 ]; then
  printf '%s\n' "${late[@]}" >&2
  die "${#late[@]} server(s) did not exit 0 after their workers finished (above)"
fi
step "passed"
