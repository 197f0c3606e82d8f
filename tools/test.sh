#!/usr/bin/env bash
# The README's test command. Installs what is missing, then runs every test
# tier and ends with one line "N passed, N failed[, N skipped]" counted from
# all of them (tools/count_tests.py):
#
#   asan       //... under AddressSanitizer and UndefinedBehaviorSanitizer
#              together (--config=asan_ubsan): every test and every
#              configuration, instrumented (tests and what they use only)
#   tsan       core, sockets and the provider suites over unet and tcp
#              under ThreadSanitizer ($TSAN_TARGETS below; --config=tsan)
#   fuzz       each libFuzzer target for $ZSOCK_FUZZ_SECONDS (default 30)
#   package    the installed library: tools/package.sh builds the Debian
#              package, dpkg -i installs it, and tools/package_test.sh
#              checks its exports, headers and modules and builds and runs
#              examples/ and tests/package/ against it (one check per
#              step); the package is removed again at the end
#   machine    nothing left behind: /dev/shm, network namespaces, processes
#              (tools/machine_state.sh)
#   plain      bazel test //... without instrumentation: not in the
#              default set, because the asan tier runs the same tests
#              with more checks (docs/decisions/0040-ci-tiers.md)
#
# ZSOCK_TEST_TIERS="plain tsan" runs a chosen set (default: asan tsan fuzz
# package machine).
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh || exit 1
tiers="${ZSOCK_TEST_TIERS:-asan tsan fuzz package machine}"
fuzz_secs="${ZSOCK_FUZZ_SECONDS:-30}"
# What TSan checks: core (CQ, registration cache, locks), the sockets
# layer over the SDP engine (sockets closed and used from several threads
# at once) and the conformance suite, over the providers whose threads are
# all zsock's own code (unet, tcp): under --config=tsan the suites are not
# linked with ofi, ucx or verbs (//tools:tsan), whose work is done inside
# uninstrumented libraries. --build_tests_only keeps the tools and
# benchmarks of these packages out of the instrumented build.
# //tests:sdp_test is left out: it forks its peers from a process whose
# engine threads run, and TSan ends a child of a multi-threaded fork that
# starts threads (the SDP engine's threads run under TSan in
# //sockets:zsock_test, whose peers fork from a single-threaded parent).
TSAN_TARGETS=(//core/... //sockets/... //providers/unet/... //providers/tcp/...
              //tests:conformance_test)

results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
rc=0
has_tier() { [[ " $tiers " == *" $1 "* ]]; }

# One `bazel test` run, counted at once (the next run overwrites the shared
# testlogs directory).
bazel_tier() {
  local name=$1
  shift
  echo "=== [$name] bazel test $*"
  local start=$SECONDS
  bazel test --config=ci "--build_event_json_file=$results/$name.bep.json" "$@" || rc=1
  python3 tools/count_tests.py --bep "$results/$name.bep.json" --out "$results/$name.counts" || rc=1
  echo "=== [$name] took $((SECONDS - start)) s"
}

# One check that is not a Bazel test: passed or failed by its exit status.
check_tier() {
  local name=$1
  shift
  echo "=== [$name] $*"
  local start=$SECONDS
  "$@"
  local status=$?
  [ "$status" -eq 0 ] || rc=1
  python3 tools/count_tests.py --check "$name" "$status" --out "$results/$name.counts" || rc=1
  echo "=== [$name] took $((SECONDS - start)) s"
}

has_tier machine && bash tools/machine_state.sh snapshot "$results/state"
has_tier plain && bazel_tier plain //...
# --build_tests_only: the benchmark programs no test runs are built by
# the package tier (zsock_bench, zsock_info, optimized) and by
# tools/demo.sh and tools/perf_report.sh, not again under ASan.
has_tier asan && bazel_tier asan --config=asan_ubsan --build_tests_only //...
has_tier tsan && bazel_tier tsan --config=tsan --build_tests_only "${TSAN_TARGETS[@]}"
if has_tier fuzz; then
  # The fuzzers run side by side: each is one single-threaded process, and
  # the machine has two cores. Each is counted as its own check.
  start=$SECONDS
  fuzz_targets=(sdp-wire unet-descriptors)
  fuzz_pids=()
  for target in "${fuzz_targets[@]}"; do
    bash tools/fuzz.sh "$target" "$fuzz_secs" > "$results/fuzz-$target.log" 2>&1 &
    fuzz_pids+=("$!")
  done
  for i in "${!fuzz_targets[@]}"; do
    target=${fuzz_targets[$i]}
    wait "${fuzz_pids[$i]}"
    status=$?
    echo "=== [fuzz-$target] bash tools/fuzz.sh $target $fuzz_secs"
    cat "$results/fuzz-$target.log"
    [ "$status" -eq 0 ] || rc=1
    python3 tools/count_tests.py --check "fuzz-$target" "$status" \
      --out "$results/fuzz-$target.counts" || rc=1
  done
  echo "=== [fuzz] took $((SECONDS - start)) s"
fi
if has_tier package; then
  start=$SECONDS
  for step in install exports headers modules c-example cpp-example missing-libs stale-key \
              prefix remove; do
    check_tier "package-$step" bash tools/package_test.sh "$results/package" "$step"
  done
  echo "=== [package] took $((SECONDS - start)) s"
fi
has_tier machine && check_tier machine bash tools/machine_state.sh check "$results/state"

shopt -s nullglob
counts=("$results"/*.counts)
[ "${#counts[@]}" -gt 0 ] || { echo "no tier ran (ZSOCK_TEST_TIERS=$tiers)" >&2; exit 2; }
python3 tools/count_tests.py --sum "${counts[@]}" || rc=1
exit $rc
