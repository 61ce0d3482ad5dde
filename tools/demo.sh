#!/usr/bin/env bash
# The README's demo: installs what bnps needs (tools/setup.sh), builds the
# server and worker, and trains the default model on Fashion-MNIST with a local
# cluster of 2 shard servers and 4 workers under the sync policy, printing
# progress, a summary and the test accuracy.
#
#   tools/demo.sh                          # sync, 3 epochs
#   tools/demo.sh --policy async --staleness 2
#   tools/demo.sh --policy recal --recal_mode=exact
#
# Extra arguments go to tools/bnps_launch.py (later ones win), and from there
# unknown --flag=value ones to every worker.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
bazel build //server:bnps_server //worker:bnps_worker //python:libbnps.so
exec python3 tools/bnps_launch.py --servers 2 --workers 4 --policy sync \
  --epochs=3 "$@"
