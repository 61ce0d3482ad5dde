#!/usr/bin/env bash
# Runs bnps on the GPU machine from the archive tools/gpu/bundle.sh packed
# (gpu-bundle/bnps-gpu.tar.xz, carried beside the tree by the device tool).
#
#   tools/gpu/run.sh info                # GPU, driver, CUDA, which libraries load
#   tools/gpu/run.sh tests               # every GPU test binary (the CUDA BN
#                                        #   kernels, the CUDA backend)
#   tools/gpu/run.sh bench               # cuda_bn_benchmark (ours against
#                                        #   cuDNN) and the model step against
#                                        #   PyTorch on the same GPU
#   tools/gpu/run.sh all                 # everything below in one call
#                                        #   (under 8 minutes; torch when
#                                        #   dist/ holds a wheel), then one
#                                        #   summary table (summary.md) and
#                                        #   the figures (gpu_results.json)
#                                        #   for tools/gpu/summarize.py
#                                        #   --update_docs
#   tools/gpu/run.sh some PART...        # the named parts of `all` (and
#                                        #   step_overhead_gpu_tcp, _even,
#                                        #   _even_overlap),
#                                        #   packed
#                                        #   the same way
#   tools/gpu/run.sh torch               # bnps.torch from the wheel (dist/
#                                        #   bnps-*.whl, carried beside the
#                                        #   tree) on this machine's torch:
#                                        #   CUDA parity (fp32, fp16, bf16,
#                                        #   channels_last) and the ResNet-18
#                                        #   benchmark against plain BN and
#                                        #   torch's SyncBatchNorm (gloo), and
#                                        #   the host's time per BN layer; a
#                                        #   captured step's replays
#   tools/gpu/run.sh torch_matrix        # the fused route's matrix against
#                                        #   plain BN (ResNet-18, ResNet-50
#                                        #   shape; fp32, bf16; eager,
#                                        #   captured; P = 2, 4): a call of
#                                        #   its own, `run.sh some
#                                        #   torch_matrix` (under 10 min)
#   tools/gpu/run.sh scaling [--bed=K]   # the BN exchange on the multi-host
#                                        #   test bed (hosts as network
#                                        #   namespaces where they can be
#                                        #   made, else loopback addresses;
#                                        #   --bed=netns|loopback forces
#                                        #   one), 4 hosts x 1 and x 4
#                                        #   workers, flat and through per-host
#                                        #   aggregators, 200 us links, with
#                                        #   16 cores for its 25 processes
#   tools/gpu/run.sh demo [launcher flags]  # tools/bnps_launch.py --device=gpu
#   tools/gpu/run.sh exec PATH [args]    # one packed binary, e.g.
#                                        #   exec worker/bnps_worker --help
#
# It unpacks the archive into $BNPS_GPU_DIR (default /tmp/bnps-gpu, reused when
# it holds the same commit), puts wrappers that set the library search path
# under $BNPS_GPU_DIR/wrap (a bazel-bin-shaped tree, so tools that take
# --bin_dir or --binary use them as they are), and finds the machine's own
# CUDA libraries: the driver's libcuda, the toolkit's cudart and cuBLAS, and
# cuDNN (and cuBLAS if the toolkit lacks it) from PyTorch's nvidia wheels.
# BNPS_GPU_LOADER=packed forces the packed loader (to check it where the
# machine's glibc would do). Logs and tables go to $OUT (the device tool's output folder) when it is set,
# else ./gpu-out.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
ARCHIVE=${BNPS_GPU_ARCHIVE:-$REPO/gpu-bundle/bnps-gpu.tar.xz}
DIR=${BNPS_GPU_DIR:-/tmp/bnps-gpu}
RESULTS=${OUT:-$REPO/gpu-out}
mkdir -p "$RESULTS"

die() { echo "run.sh: $*" >&2; exit 1; }
[[ -f $ARCHIVE ]] || die "no $ARCHIVE: run tools/gpu/bundle.sh on the build machine and carry gpu-bundle"

unpack() {
  local want
  # bundle.sh writes the archive's commit and a digest beside it.
  want=$(cat "${ARCHIVE%.tar.xz}.id" 2>/dev/null || echo none)
  if [[ -f $DIR/ID && $(cat "$DIR/ID") == "$want" ]]; then return; fi
  rm -rf "$DIR"; mkdir -p "$(dirname "$DIR")"
  local tmp; tmp=$(mktemp -d "$(dirname "$DIR")/bnps-gpu.XXXXXX")
  xz -dc "$ARCHIVE" | tar -C "$tmp" -xf -
  echo "$want" > "$tmp/bnps-gpu/ID"
  mv "$tmp/bnps-gpu" "$DIR"; rmdir "$tmp"
}

# A python that can import torch (the GPU machine's), for the wheels' libraries
# and the PyTorch side of the benchmarks.
find_python() {
  local p
  for p in ${BNPS_PYTHON:-} python3 /usr/bin/python3 python; do
    if command -v "$p" >/dev/null && "$p" -c 'import torch' 2>/dev/null; then
      command -v "$p"; return
    fi
  done
}

# The library folders of PyTorch's nvidia wheels and of torch itself.
WHEEL_LIBS='
import importlib, os
for mod in ("nvidia.cudnn", "nvidia.cublas", "nvidia.cuda_runtime", "nvidia.cu13"):
    try:
        m = importlib.import_module(mod)
    except ImportError:
        continue
    for root in getattr(m, "__path__", []):
        for sub in ("lib", "lib64"):
            if os.path.isdir(os.path.join(root, sub)):
                print(os.path.join(root, sub))
import torch
print(os.path.join(os.path.dirname(torch.__file__), "lib"))
'

cuda_lib_dirs() {
  local dirs=() d py
  # The driver's libcuda.so.1.
  d=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 / && !f {print $NF; f=1}')
  [[ -n $d ]] && dirs+=("$(dirname "$d")")
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu; do
    [[ -d $d ]] && dirs+=("$d")
  done
  py=$(find_python || true)
  if [[ -n $py ]]; then
    while read -r d; do [[ -d $d ]] && dirs+=("$d"); done < <("$py" -c "$WHEEL_LIBS" 2>/dev/null)
  fi
  local IFS=:; echo "${dirs[*]}"
}

version_ge() { [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" == "$2" ]]; }

# Wrappers: wrap/<path> runs bin/<path> with the right search path; with the
# packed loader when this machine's glibc is older than the build machine's.
make_wrappers() {
  local host_glibc built_glibc libpath prefix=""
  host_glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
  built_glibc=$(cat "$DIR/lib/glibc/VERSION")
  libpath="$DIR/lib"
  if [[ ${BNPS_GPU_LOADER:-auto} != packed ]] && version_ge "$host_glibc" "$built_glibc"; then
    # The machine's C library will do; its C++ runtime too if new enough
    # (GCC 12's GLIBCXX_3.4.30).
    local cxx; cxx=$(ldconfig -p | awk '/libstdc\+\+\.so\.6 / && !f {print $NF; f=1}')
    if [[ -z $cxx ]] || ! grep -qa GLIBCXX_3.4.30 "$cxx"; then libpath="$libpath:$DIR/lib/cxx"; fi
  else
    libpath="$DIR/lib/glibc:$DIR/lib/cxx:$libpath"
    prefix="$DIR/lib/glibc/$(ls "$DIR/lib/glibc" | grep -m1 '^ld-linux')"
  fi
  libpath="$libpath:$(cuda_lib_dirs)"
  echo "glibc here $host_glibc, built against $built_glibc; loader: ${prefix:-this machine}" > "$DIR/MODE"
  rm -rf "$DIR/wrap"
  (cd "$DIR/bin" && find . -type f | sed "s|^\./||") | while read -r rel; do
    mkdir -p "$DIR/wrap/$(dirname "$rel")"
    if [[ -n $prefix ]]; then
      printf '#!/bin/sh\nexec %s --library-path "%s" %s "$@"\n' \
        "$prefix" "$libpath" "$DIR/bin/$rel" > "$DIR/wrap/$rel"
    else
      printf '#!/bin/sh\nLD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec %s "$@"\n' \
        "$libpath" "$DIR/bin/$rel" > "$DIR/wrap/$rel"
    fi
    chmod +x "$DIR/wrap/$rel"
  done
}

unpack
make_wrappers
W=$DIR/wrap
PY=$(find_python || true)
cmd=${1:-info}; shift || true

run_tests() {
  local rc=0 t log
  for t in bn/cuda_kernels_test nn/cuda_backend_test nn/model_cuda_test; do
    log="$RESULTS/$(basename "$t").log"
    if "$W/$t" --gtest_output="xml:$RESULTS/$(basename "$t").xml" > "$log" 2>&1; then
      echo "$t: ok"
    else
      echo "$t: FAILED"; rc=1
    fi
    grep -E '^\[ +(PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' "$log" | sed 's/^/  /' || true
    # On a GPU machine nothing may skip: a skip means no device was found.
    if grep -qE '^\[ +SKIPPED +\] [0-9]+ tests?' "$log" && nvidia-smi -L >/dev/null 2>&1; then
      echo "  tests skipped although this machine has a GPU"; rc=1
    fi
  done
  return $rc
}

# The launcher resolves --policy with libbnps.so (bnps.policy), which the
# bundle does not carry: the installed wheel's (`run.sh torch` installs it),
# unless BNPS_NATIVE_LIB names one. Without either the launcher exits 2
# saying so.
launcher_lib() {
  [[ -n ${BNPS_NATIVE_LIB:-} ]] && { echo "$BNPS_NATIVE_LIB"; return; }
  (cd / && "${PY:-python3}" -c 'import os, bnps
p = os.path.join(os.path.dirname(bnps.__file__), "libbnps.so")
print(p if os.path.isfile(p) else "")' 2>/dev/null) || true
}

demo() {  # demo OUT_SUBDIR [launcher flags]
  local sub=$1; shift
  BNPS_NATIVE_LIB=$(launcher_lib) \
  "${PY:-python3}" "$REPO/tools/bnps_launch.py" --bin_dir "$W" --servers 2 --workers 4 \
    --policy sync --epochs=3 --device=gpu --data_dir="$DIR/data/fashion-mnist" \
    --out_dir "$RESULTS/$sub" "$@"
}

# One part of `all`: its output in $RESULTS/<name>.log, its wall time and
# exit status in times.txt; a failed or overtime part does not stop the rest.
part() {  # part NAME SECONDS COMMAND...
  local name=$1 limit=$2 t0 rc; shift 2
  t0=$(date +%s)
  echo "== $name (at most ${limit}s)"
  set +e
  timeout --kill-after=10 "$limit" "$@" > "$RESULTS/$name.log" 2>&1
  rc=$?
  set -e
  tail -n 3 "$RESULTS/$name.log" | sed 's/^/  /'
  echo "$name $(( $(date +%s) - t0 ))s exit $rc" | tee -a "$RESULTS/times.txt"
}

# The parts of `all`, in order; each writes <name>.log (and its tables) into
# $RESULTS and a line to times.txt.
ALL_PARTS=(tests kernels model_step step_overhead_gpu step_overhead_cpu rtt
           demo demo_nomps replicas scaling torch)
# Parts only `some` runs.
EXTRA_PARTS=(step_overhead_gpu_tcp step_overhead_gpu_even step_overhead_gpu_even_overlap
             torch_matrix)

do_tests() { part tests 120 "$0" tests; }
do_kernels() {
  part kernels 90 "$W/bn/cuda_bn_benchmark"
  cp "$RESULTS/kernels.log" "$RESULTS/cuda_bn_benchmark.txt"
}
do_model_step() {
  [[ -n $PY ]] || { echo "model_step: not run (no python with torch)" | tee -a "$RESULTS/times.txt"; return; }
  part model_step 150 "$PY" "$REPO/bench/model_step_compare.py" --device=gpu \
    --binary "$W/bench/model_step_benchmark" --python "$PY" --threads=1 \
    --rounds=3 --iters=50
  grep -v '^#' "$RESULTS/model_step.log" > "$RESULTS/model_step_gpu.md" || true
}
# The step against local on the GPU (MPS where workers share it), and W = 1
# on the CPU beside it for the cost of one BN exchange.
step_overhead() {  # step_overhead NAME SECONDS DEVICE WORKERS [flags]
  local name=$1 limit=$2 device=$3 workers=$4; shift 4
  part "$name" "$limit" "${PY:-python3}" "$REPO/bench/step_overhead.py" \
    --bin_dir "$W" --device="$device" --workers "$workers" --batches 32 \
    --policies local,sync --runs 3 --steps 200 --warmup 30 --round_trip off "$@"
  grep -v '^step_overhead: ' "$RESULTS/$name.log" > "$RESULTS/$name.txt" || true
}
do_step_overhead_gpu() { step_overhead step_overhead_gpu 200 gpu 1,2,4; }
do_step_overhead_cpu() { step_overhead step_overhead_cpu 90 cpu 1; }
# The same with BN over TCP where workers would take a server's Unix socket.
do_step_overhead_gpu_tcp() {
  step_overhead step_overhead_gpu_tcp 200 gpu 1,2,4 --worker_flag=--bn_unix=false
}
# The same with the cores shared out evenly (a process's helper threads --
# gRPC's, CUDA's, a BN poll -- beside its main thread) rather than one each.
do_step_overhead_gpu_even() {
  step_overhead step_overhead_gpu_even 200 gpu 1,2,4 --cores_each=even
}
# And with each backward exchange beside its convolution's weight gradient.
do_step_overhead_gpu_even_overlap() {
  step_overhead step_overhead_gpu_even_overlap 200 gpu 1,2,4 --cores_each=even \
    --worker_flag=--overlap_bn
}
# This machine's loopback round trip, the floor under a BN exchange.
do_rtt() { part rtt 60 "${PY:-python3}" "$REPO/tools/gpu/loopback_rtt.py"; }
# The demo: 4 workers on the one GPU, MPS started by the launcher; a short
# run of the same without MPS for the images/s beside it; two replicas of
# one worker sharing the GPU.
do_demo() { part demo 120 "$0" demo_to demo; }
do_demo_nomps() { part demo_nomps 90 "$0" demo_to demo_nomps --mps=off --max_steps=40; }
do_replicas() {
  BNPS_NATIVE_LIB=$(launcher_lib) \
  part replicas 90 "${PY:-python3}" "$REPO/tools/bnps_launch.py" --bin_dir "$W" \
    --servers 1 --workers 1 --policy sync --device=gpu --replicas=2 --max_steps=60 \
    --data_dir="$DIR/data/fashion-mnist" --out_dir "$RESULTS/replicas"
}
# The multi-host bed's BN exchange on 16 cores instead of 2.
do_scaling() { part scaling 120 "$0" scaling; }
# bnps.torch from the wheel carried in dist/ (its parity suite on the GPU
# and the ResNet-18 benchmark), into torch/.
do_torch() {
  if [[ -n $PY ]] && ls "$REPO"/dist/bnps-*.whl >/dev/null 2>&1; then
    part torch 480 env OUT="$RESULTS/torch" "$0" torch
  else
    echo "torch: not run (no wheel in dist/, or no python with torch)" | tee -a "$RESULTS/times.txt"
  fi
}

# The fused route's matrix (ResNet-18 and the ResNet-50 shape, fp32 and
# bf16, eager and captured; P = 2, 4), into torch/ beside the part above:
# a call of its own (`run.sh some torch_matrix`), as `all` fills one.
do_torch_matrix() {
  if [[ -n $PY ]] && ls "$REPO"/dist/bnps-*.whl >/dev/null 2>&1; then
    part torch_matrix 560 env OUT="$RESULTS/torch" "$0" torch_matrix
  else
    echo "torch_matrix: not run (no wheel in dist/, or no python with torch)" | tee -a "$RESULTS/times.txt"
  fi
}

# The wheel in dist/ into this machine's Python, beside its torch, as a user
# would (the machine is a throwaway one; nothing is fetched: --no-deps).
install_wheel() {
  [[ -n $PY ]] || die "no python with torch here"
  local wheel=${BNPS_WHEEL:-$(ls "$REPO"/dist/bnps-*.whl 2>/dev/null | head -1)}
  [[ -f $wheel ]] || die "no wheel: build one (docs/pytorch.md) and carry dist/"
  "$PY" -m pip install -q --no-index --no-deps --force-reinstall "$wheel"
  echo "installed $(basename "$wheel") for $("$PY" --version)"
}

case "$cmd" in
  info)
    echo "bundle: commit $(cut -c1-12 "$DIR/COMMIT"), $(cat "$DIR/MODE")"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "nvidia-smi: none"
    # The CPUs' layout (hyperthreads share a core: bench/step_overhead.py
    # gives each process a whole core where there are enough).
    lscpu 2>/dev/null | grep -E '^(CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)):' || true
    nvcc --version 2>/dev/null | tail -1 || true
    [[ -n $PY ]] && "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "gpu", torch.cuda.is_available())'
    echo "search path: $(cuda_lib_dirs)"
    "$W/worker/bnps_worker" --help >/dev/null && echo "bnps_worker starts"
    ;;
  tests)
    run_tests
    ;;
  bench)
    "$W/bn/cuda_bn_benchmark" "$@" 2>&1 | tee "$RESULTS/cuda_bn_benchmark.txt"
    if [[ -n $PY ]]; then
      "$PY" "$REPO/bench/model_step_compare.py" --device=gpu \
        --binary "$W/bench/model_step_benchmark" --python "$PY" 2>&1 | tee "$RESULTS/model_step_gpu.md"
    fi
    ;;
  demo)
    demo demo "$@"
    ;;
  torch)
    install_wheel
    bin=$(dirname "$(command -v "$PY")")
    part torch_import 60 "$PY" -c 'import importlib.util as u, torch, bnps, bnps.torch; g = __import__("grpc") if u.find_spec("grpc") else None; print("bnps", bnps.__file__, "torch", torch.__version__, "cuda", torch.cuda.is_available(), "grpcio", g.__version__ if g else "not installed here")'
    part torch_server 30 "$bin/bnps-server" --help
    # The sync cases (fp64, fp32 contiguous and channels_last, fp16, bf16,
    # uneven, empty, 2-D to 5-D, ...) with the layers on the GPU, 3 workers;
    # again with the exchanges queued on the CUDA stream (host functions),
    # and a queued exchange's failure reaching the caller; a mixed-precision
    # overflow step and the local, recal and async policies both ways.
    (cd /tmp && export BNPS_PARITY_DEVICE=cuda && part torch_parity 300 "$PY" \
      "$REPO/tests/pytorch/pytorch_parity_test.py" -v SyncParityTest \
      StreamSyncParityTest StreamStopCallingTest StreamRunningStatsTest \
      CudaGraphCaptureTest OverflowTest StreamOverflowTest PolicyTest \
      StreamPolicyTest)
    # The layers under torch.compile (aot_eager) on the GPU, by default and
    # with the exchanges queued on the stream.
    (cd /tmp && export BNPS_PARITY_DEVICE=cuda && part torch_compile 90 "$PY" \
      "$REPO/tests/pytorch/compile_test.py" -v)
    # The host's time per layer pass, queued and waiting, against plain
    # BatchNorm (what a host-bound step pays per BN layer).
    part torch_host_cost 60 "$PY" "$REPO/bench/pytorch_layer_host_cost.py" \
      --device=cuda
    part torch_bench 300 "$PY" "$REPO/bench/pytorch_gpu_benchmark.py" \
      --procs 2,4 --batches "${BNPS_TORCH_BATCHES:-8,32}" --runs "${BNPS_TORCH_RUNS:-3}" \
      --profile "$RESULTS/torch_profile.txt"
    cp "$RESULTS/torch_bench.log" "$RESULTS/pytorch_gpu.md"
    # A training step captured in a CUDA graph (torch.cuda.graph, and
    # torch.compile(mode="reduce-overhead") where torch has it), replayed
    # with parity; from a folder of its own, so that bnps is the wheel's.
    cap=$(mktemp -d)
    cp "$REPO/python/device_route_test.py" "$REPO/python/one_job.py" \
      "$REPO/python/torch_or_debian.py" "$cap/"
    (cd "$cap" && part torch_capture 120 "$PY" device_route_test.py -v \
      CudaCaptureTest)
    ;;
  torch_matrix)
    # The fused route (the default on CUDA) against plain BatchNorm, eager
    # beside torch's SyncBatchNorm (gloo), and captured in a CUDA graph:
    # ResNet-18 and the ResNet-50 shape, float32 and bf16 autocast with
    # channels_last, P = 2 and 4, batch 32. The cells most asked about
    # first, each at most 65 s, so that the part's 560 s leave the rest of
    # a 10-minute call to the machine's start.
    install_wheel
    for cell in resnet18:fp32:eager resnet18:fp32:captured \
        resnet50:bf16:eager resnet50:bf16:captured resnet18:bf16:eager \
        resnet18:bf16:captured resnet50:fp32:eager resnet50:fp32:captured; do
      IFS=: read -r model prec mode <<<"$cell"
      name=torch_${model}_${prec}_${mode}
      part "$name" 65 "$PY" "$REPO/bench/pytorch_gpu_benchmark.py" \
        --procs 2,4 --batches 32 --runs "${BNPS_TORCH_RUNS:-3}" \
        --steps 20 --warmup 5 --model "$model" --precision "$prec" \
        $([[ $mode == captured ]] && echo --capture)
      cp "$RESULTS/$name.log" "$RESULTS/pytorch_gpu_${model}_${prec}_${mode}.md"
    done
    ;;
  scaling)
    "${PY:-python3}" "$REPO/tools/testbed/bn_scaling.py" --bin_dir "$W" --aggregate \
      --bed=auto --rtt_us=0,200 --layouts=4x1,4x4 --rounds=3 \
      --save "$RESULTS/scaling.json" "$@"
    ;;
  demo_to)  # demo_to OUT_SUBDIR [launcher flags]: the demo into $RESULTS/OUT_SUBDIR
    demo "$@"
    ;;
  all|some)
    # all: every part below; some NAME...: the named ones (e.g. a short
    # second call that reruns a few: summarize.py OLD NEW takes each part
    # from the newest folder). The device tool brings back at most 8
    # files: everything goes to a folder of its own, packed at the end into
    # gpu-run.tar.gz beside summary.md and gpu_results.json.
    if [[ $cmd == all ]]; then
      parts=("${ALL_PARTS[@]}")
    else
      [[ $# -ge 1 ]] || die "some needs part names: ${ALL_PARTS[*]} ${EXTRA_PARTS[*]}"
      parts=("$@")
      for name in "${parts[@]}"; do
        [[ " ${ALL_PARTS[*]} ${EXTRA_PARTS[*]} " == *" $name "* ]] ||
          die "no part $name (parts: ${ALL_PARTS[*]} ${EXTRA_PARTS[*]})"
      done
    fi
    final=$RESULTS
    RESULTS=$(mktemp -d /tmp/bnps-gpu-run.XXXXXX)/gpu-run
    mkdir -p "$RESULTS"
    export OUT=$RESULTS
    : > "$RESULTS/times.txt"
    date -u +%Y-%m-%d > "$RESULTS/date.txt"
    cut -c1-40 "$DIR/COMMIT" > "$RESULTS/commit.txt"
    "$0" info > "$RESULTS/info.txt" 2>&1 || true
    cat "$RESULTS/info.txt"
    for name in "${parts[@]}"; do "do_$name"; done
    echo
    "${PY:-python3}" "$REPO/tools/gpu/summarize.py" "$RESULTS" \
      --json "$RESULTS/gpu_results.json" | tee "$RESULTS/summary.md"
    tar -C "$(dirname "$RESULTS")" -czf "$final/gpu-run.tar.gz" gpu-run
    cp "$RESULTS/summary.md" "$RESULTS/gpu_results.json" "$final/"
    echo "run.sh: everything in $final/gpu-run.tar.gz ($(du -h "$final/gpu-run.tar.gz" | cut -f1))"
    ;;
  exec)
    [[ $# -ge 1 ]] || die "exec needs a path under bazel-bin, e.g. worker/bnps_worker"
    rel=$1; shift
    exec "$W/$rel" "$@"
    ;;
  *) die "unknown command $cmd (info, tests, bench, demo, scaling, all, some, torch, torch_matrix, exec)" ;;
esac
