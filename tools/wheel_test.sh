#!/usr/bin/env bash
# The wheel against torch 2.x from PyPI, as a PyTorch user installs it (not
# in CI's command: the first run downloads torch, several GB):
#
#   tools/wheel_test.sh [WHEEL]
#
# Uses (or makes) a venv from the bare `python3` on PATH (pyenv's CPython,
# no Debian packages) at $BNPS_TORCH_VENV (default ~/.cache/bnps/torch2-venv,
# outside the repository and shared: an existing one is reused, with what
# it lacks added),
# with torch==$BNPS_TORCH_VERSION (default 2.15.0), grpcio, PyYAML
# (the Kubeflow wiring test reads the manifests), lightning and ray[train]
# (tests/pytorch/lightning_test.py, ray_test.py) from PyPI, pinned;
# pip installs WHEEL (default: builds dist/bnps-*.whl first) into it, then,
# from a directory outside the source tree:
#   - the installed package, the console scripts, bnps beside torch and grpc
#   - bnps-server from the wheel: two shards, bnps-status reading them, and
#     `torchrun --nproc_per_node=4 examples/pytorch/train.py` against them,
#     which must print a test accuracy (when this tree's example runs under
#     torchrun)
#   - every Python test of python/, tests/pytorch/ and examples/pytorch/:
#     the parity scenarios, and DDP, torch.compile and torchrun where the
#     tree has them, Lightning's Trainer with bnps.lightning's plugin, and a
#     Ray Train TorchTrainer on a local Ray cluster of three nodes
# One line per check, then a summary; exit status 1 if any failed.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${BNPS_TORCH_VENV:-$HOME/.cache/bnps/torch2-venv}"
torch_version="${BNPS_TORCH_VERSION:-2.15.0}"
grpcio_version="${BNPS_GRPCIO_VERSION:-1.85.3}"
pyyaml_version=6.0.3  # for kubeflow_test, which reads the manifests
lightning_version=2.6.6  # for lightning_test
ray_version=2.60.0       # for ray_test
work="$(mktemp -d /tmp/bnps_wheel_test.XXXXXX)"
server_pids=()
cleanup() {
  local p
  for p in "${server_pids[@]}"; do kill "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
unset BNPS_SERVER_BIN BNPS_NATIVE_LIB PYTHONPATH BNPS_SERVERS BNPS_WORKER \
  BNPS_NUM_WORKERS
# shellcheck source=tools/wheel_lib.sh
. "$repo/tools/wheel_lib.sh"

wheel="${1:-}"
if [ -z "$wheel" ]; then
  check build_wheel build_wheel "$work/dist"
  wheel="$(ls "$work"/dist/bnps-*.whl 2>/dev/null | head -1)"
  [ -n "$wheel" ] || { summary "no wheel was built"; exit 1; }
fi

make_torch_venv() {
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" || return 1
  fi
  "$venv/bin/python" -c 'import torch' 2>/dev/null ||
    "$venv/bin/pip" install -q "torch==$torch_version" || return 1
  "$venv/bin/python" -c 'import grpc' 2>/dev/null ||
    "$venv/bin/pip" install -q "grpcio==$grpcio_version" || return 1
  "$venv/bin/python" -c 'import yaml' 2>/dev/null ||
    "$venv/bin/pip" install -q "pyyaml==$pyyaml_version" || return 1
  "$venv/bin/python" -c 'import lightning' 2>/dev/null ||
    "$venv/bin/pip" install -q "lightning==$lightning_version" || return 1
  "$venv/bin/python" -c 'import ray.train' 2>/dev/null ||
    "$venv/bin/pip" install -q "ray[train]==$ray_version" || return 1
  "$venv/bin/python" -c 'import sys, torch; print(sys.version, torch.__version__)'
}
check torch_venv make_torch_venv
check pip_install "$venv/bin/pip" install --quiet --force-reinstall --no-deps "$wheel"
check numpy_dependency "$venv/bin/pip" install --quiet "$wheel"

make_run_dir "$work/run"

# bnps-server from the wheel, two shards, and torchrun against them.
start_servers() {
  local shard line
  servers=""
  for shard in 0 1; do
    "$venv/bin/bnps-server" --host=127.0.0.1 --port=0 --shard=$shard \
      --num_shards=2 --num_workers=4 --policy=sync --job=pytorch-example \
      --learning_rate=0.1 --momentum=0.9 \
      >"$work/server$shard.out" 2>"$work/server$shard.err" &
    server_pids+=($!)
  done
  for shard in 0 1; do
    for _ in $(seq 100); do
      line="$("$venv/bin/python" -m bnps.cluster listening \
        "$work/server$shard.out")" && break
      sleep 0.1
    done
    [ -n "$line" ] || { cat "$work/server$shard.err"; return 1; }
    servers="${servers:+$servers,}$line"
  done
  echo "servers $servers"
  "$venv/bin/bnps-status" --servers="$servers"
}
check bnps_server_and_status start_servers
if ! grep -q LOCAL_RANK "$work/run/examples/pytorch/train.py" \
    "$repo"/python/bnps/*.py "$repo"/python/bnps/torch/*.py 2>/dev/null; then
  skip torchrun_example "this tree's bnps.torch does not read torchrun's variables"
elif [ -z "${servers:-}" ]; then
  skip torchrun_example "no servers"
else
  torchrun_example() {
    (cd "$work/run" && BNPS_SERVERS="$servers" BNPS_JOB=pytorch-example \
      OMP_NUM_THREADS=1 "$venv/bin/torchrun" --nproc_per_node=4 \
      examples/pytorch/train.py --train_examples=4096 --test_examples=1000) |
      tee "$work/torchrun.out" && grep -q "test_accuracy=" "$work/torchrun.out"
  }
  check torchrun_example torchrun_example
fi
for p in "${server_pids[@]}"; do kill "$p" 2>/dev/null; done
server_pids=()

installed_checks "$venv" "$work/run"
summary "$(basename "$wheel") in $venv ($("$venv/bin/python" -c \
  'import sys, torch; print("CPython", sys.version.split()[0], "torch", torch.__version__)' 2>/dev/null))"
