#!/usr/bin/env bash
# Packs what the GPU machine needs to run bnps's GPU tests, benchmarks and the
# demo: the binaries (built here, where the dependencies are), the shared
# libraries they load that such a machine lacks, and Fashion-MNIST. The GPU
# machine has the CUDA toolkit, a driver and PyTorch's cuDNN and cuBLAS wheels,
# but no gRPC, Abseil, protobuf or oneDNN, and reaches no package registry.
#
#   tools/gpu/bundle.sh            # writes gpu-bundle/bnps-gpu.tar.xz
#   tools/gpu/bundle.sh --no-build # packs what bazel-bin has now
#
# Left out of the archive: the CUDA libraries (libcuda, cudart, cuBLAS, cuDNN:
# tools/gpu/run.sh finds the GPU machine's own) and nothing else, glibc and
# libstdc++ included, so the binaries also start on a machine with an older C
# library (run.sh then loads them through the packed loader). The archive
# must stay under the device tool's 64 MiB carry limit; the script says its
# size and fails if it is over.
#
# On the GPU machine, in one call of the device tool (see docs/gpu.md):
#   tools/gpu/run.sh tests      # carry: gpu-bundle
set -euo pipefail
cd "$(dirname "$0")/../.."

BUILD=1
for arg in "$@"; do
  case "$arg" in
    --no-build) BUILD=0 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "bundle.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

# Label -> path under bazel-bin. Tests are linked against bazel's shared
# libraries (_solib); ldd below follows them through the binaries' rpath.
TARGETS=(
  //bn:cuda_kernels_test
  //bn:cuda_bn_benchmark
  //nn:cuda_backend_test
  //nn:model_cuda_test
  //server:bnps_server
  //worker:bnps_worker
  //tools:bnps_status
  //bench:model_step_benchmark
  //bench:ps_benchmark
  //tools/testbed:bn_exchange
  //tools/testbed:bnps_relay
  //hostbn:bnps_host_bn
)
LIMIT_BYTES=$((64 * 1024 * 1024 - 4 * 1024 * 1024))  # room for the tree itself

if [[ $BUILD == 1 ]]; then
  bazel build "${TARGETS[@]}"
fi

OUT=gpu-bundle
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
ROOT="$STAGE/bnps-gpu"
mkdir -p "$ROOT/bin" "$ROOT/lib/glibc" "$ROOT/lib/cxx" "$ROOT/data/fashion-mnist"

# Libraries the GPU machine provides itself (driver, toolkit, PyTorch wheels).
is_provided() {
  case "$(basename "$1")" in
    libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*|libcudnn*.so*|\
    libnvidia-*|libnvrtc*|libcufft*|libcurand*|libcusparse*|libcusolver*) return 0 ;;
  esac
  return 1
}

declare -A SEEN=()
for label in "${TARGETS[@]}"; do
  rel=${label#//}; rel=${rel/://}
  src="bazel-bin/$rel"
  [[ -x $src ]] || { echo "bundle.sh: $src is missing: build $label" >&2; exit 1; }
  mkdir -p "$ROOT/bin/$(dirname "$rel")"
  cp -L "$src" "$ROOT/bin/$rel"
  # ldd's "name => path" lines and the loader's own line.
  while read -r lib; do
    [[ -n $lib && -f $lib ]] || continue
    is_provided "$lib" && continue
    name=$(basename "$lib")
    [[ -n ${SEEN[$name]:-} ]] && continue
    SEEN[$name]=1
    # glibc and the C++ runtime apart: run.sh uses them only when the GPU
    # machine's own are older than these.
    case "$name" in
      ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*) dir=glibc ;;
      libstdc++.so*|libgcc_s.so*) dir=cxx ;;
      *) dir=. ;;
    esac
    cp -L "$lib" "$ROOT/lib/$dir/$name"
  done < <(ldd "$src" | awk '/=>/ {print $3} /^\t\/.*ld-linux/ {print $1}')
done
# The binaries' own rpath points into bazel-bin; run.sh sets the search path.
strip --strip-unneeded "$ROOT"/lib/*.so* "$ROOT"/lib/cxx/*.so* 2>/dev/null || true
/usr/bin/getconf GNU_LIBC_VERSION | awk '{print $2}' > "$ROOT/lib/glibc/VERSION"
cp /usr/share/datasets/fashion-mnist/*.gz "$ROOT/data/fashion-mnist/"
git rev-parse HEAD > "$ROOT/COMMIT" 2>/dev/null || echo unknown > "$ROOT/COMMIT"

mkdir -p "$OUT"
tar -C "$STAGE" -cf - bnps-gpu | xz -T2 -6 > "$OUT/bnps-gpu.tar.xz.tmp"
mv "$OUT/bnps-gpu.tar.xz.tmp" "$OUT/bnps-gpu.tar.xz"
echo "$(cat "$ROOT/COMMIT") $(sha256sum "$OUT/bnps-gpu.tar.xz" | cut -c1-16)" > "$OUT/bnps-gpu.id"
size=$(stat -c %s "$OUT/bnps-gpu.tar.xz")
echo "bundle.sh: $OUT/bnps-gpu.tar.xz: $((size / 1024 / 1024)) MiB ($(du -sh "$ROOT" | cut -f1) unpacked), $(find "$ROOT/lib" -name "*.so*" | wc -l) libraries, commit $(cat "$ROOT/COMMIT" | cut -c1-12)"
if (( size > LIMIT_BYTES )); then
  echo "bundle.sh: over the $((LIMIT_BYTES / 1024 / 1024)) MiB the device tool can carry beside the tree" >&2
  exit 1
fi
