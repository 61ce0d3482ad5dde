# Shared by tools/wheel_ci.sh and tools/wheel_test.sh (sourced, not run):
# building the wheel, the checks of an installed one, and their report.
# The caller sets `repo` and `work` (a scratch directory) first.

passed=0; failed=0; skipped=0; results=()

# record NAME STATUS SECONDS: a check's result, one line (the end of its log
# if it failed).
record() {
  local name="$1" status="$2" took="$3"
  if [ "$status" = 0 ]; then
    results+=("PASS  $name ($took s)"); passed=$((passed + 1))
    echo "wheel: PASS $name ($took s)"
  else
    results+=("FAIL  $name ($took s)"); failed=$((failed + 1))
    echo "wheel: FAIL $name ($took s); the end of its log:"
    tail -40 "$work/$name.log" | sed 's/^/    /'
  fi
}

# check NAME COMMAND...: runs it with its output in $work/NAME.log; one line.
check() {
  local name="$1"; shift
  local start=$SECONDS status=0
  "$@" >"$work/$name.log" 2>&1 || status=$?
  record "$name" "$status" $((SECONDS - start))
}

# check_each PYTHON SCRIPT...: `check`s each script as PYTHON SCRIPT, as many
# at once as there are cores (each in a temporary directory of its own, as
# Bazel runs tests), reported in their order once all have ended.
check_each() {
  local py="$1" t name parallel
  shift
  parallel="$(nproc 2>/dev/null || echo 1)"
  for t in "$@"; do
    while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do wait -n || true; done
    name="$(basename "$t" .py)"
    mkdir -p "$work/tmp/$name"
    (
      start=$SECONDS status=0
      TMPDIR="$work/tmp/$name" "$py" "$t" >"$work/$name.log" 2>&1 || status=$?
      echo "$status $((SECONDS - start))" >"$work/$name.status"
    ) &
  done
  wait
  for t in "$@"; do
    name="$(basename "$t" .py)"
    # shellcheck disable=SC2046
    record "$name" $(cat "$work/$name.status" 2>/dev/null || echo "1 ?")
  done
}

skip() {  # skip NAME WHY
  results+=("SKIP  $1: $2"); skipped=$((skipped + 1))
  echo "wheel: SKIP $1: $2"
}

summary() {  # summary TITLE; exit status 0 iff nothing failed
  echo
  echo "wheel: $1"
  printf '  %s\n' "${results[@]}"
  echo "wheel: $passed passed, $failed failed, $skipped skipped"
  [ "$failed" = 0 ]
}

# build_wheel DIR: python -m build --wheel from the repository into DIR,
# with the wheel tools' venv (tools/setup.sh).
build_wheel() {
  local tools="${BNPS_WHEEL_TOOLS:-$HOME/.cache/bnps/wheel-tools}"
  if [ ! -x "$tools/bin/python" ]; then
    echo "no wheel tools at $tools; run tools/setup.sh"; return 2
  fi
  (cd "$repo" && "$tools/bin/python" -m build --wheel --outdir "$1" .)
}

# A run directory outside the source tree with the tests' own files only
# (the Python tests, their workers, the example, TLS test data, the Kubeflow
# manifests python/kubeflow_test.py reads), laid out as
# in Bazel's runfiles: each test finds its files under the working directory
# and `import bnps` finds the installed package.
make_run_dir() {  # make_run_dir DIR
  local run="$1" d
  mkdir -p "$run/python"
  cp "$repo"/python/*_test.py "$repo"/python/torch_or_debian.py \
    "$repo"/python/one_job.py "$run/python/"
  for d in tests/pytorch tests/testdata/tls examples/pytorch deploy/kubeflow; do
    mkdir -p "$run/$(dirname "$d")"
    cp -r "$repo/$d" "$run/$d"
  done
}

# The Python tests of the run directory (python/, tests/pytorch/,
# examples/pytorch/), relative paths, one per line.
python_tests() {
  (cd "$1" && ls python/*_test.py tests/pytorch/*_test.py \
    examples/pytorch/*_test.py 2>/dev/null)
}

# Checks of the wheel installed in venv $1, run from the run directory $2:
# the package, its console scripts, bnps beside torch and grpc, then the
# Python tests named after them (paths in the run directory), or, with none
# named, every one.
installed_checks() {
  local venv="$1" run="$2" t
  shift 2
  local py="$venv/bin/python"
  cd "$run" || return 1
  installed() {
    local where
    where="$("$py" -c 'import bnps, bnps._native as n; print(bnps.__file__, n._lib._name)')" &&
      echo "$where" && [[ "$where" == "$venv/"*" $venv/"* ]]
  }
  check imports_the_installed_package installed
  consoles() {
    "$venv/bin/bnps-server" --help >/dev/null &&
      "$venv/bin/bnps-status" --help >/dev/null &&
      "$venv/bin/bnps-host-bn" --help >/dev/null
  }
  check console_scripts consoles
  if "$py" -c 'import grpc' 2>/dev/null; then
    check beside_torch_and_grpc "$py" -c "$beside_py" grpc-first
    check bnps_before_torch_and_grpc "$py" -c "$beside_py" bnps-first
  else
    skip beside_torch_and_grpc "no grpcio in this environment"
  fi
  if [ "$#" -gt 0 ]; then
    check_each "$py" "$@"
  else
    # shellcheck disable=SC2046
    check_each "$py" $(python_tests "$run")
  fi
}

# bnps in one process with grpcio and torch (argv[1]: which loads first):
# a real job against the wheel's server, a SyncBatchNorm step against torch,
# and a grpcio channel to the same server.
beside_py="$(cat <<'PY'
import sys
if sys.argv[1] == "bnps-first":
    import bnps._native  # libbnps.so and its vendored gRPC, first
import grpc          # grpcio's own gRPC
import torch
import bnps.torch
from bnps.cluster import LocalCluster, find_server_binary
from bnps._console import packaged_binary
assert find_server_binary() == packaged_binary("bnps_server")
with LocalCluster(num_servers=1, num_workers=1) as c:
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
)"
