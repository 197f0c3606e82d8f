#!/usr/bin/env bash
# The README's test command: installs what is missing, runs the whole test
# suite twice (plain, then under AddressSanitizer) and ends with one line
# "N passed, N failed[, N skipped]" counted from the test cases' XML results
# of both runs.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh || exit 1
results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
rc=0
for cfg in default asan; do
  flags=(--config=ci)
  [ "$cfg" = default ] || flags+=("--config=$cfg")
  echo "=== bazel test ${flags[*]} //..."
  bazel test "${flags[@]}" //... || rc=1
  # Both configurations write to the same testlogs directory (copts do not
  # change Bazel 4's output path): keep this run's results before the next.
  testlogs=$(bazel info "${flags[@]}" bazel-testlogs 2>/dev/null)
  mkdir -p "$results/$cfg"
  (cd "$testlogs" && find . -name test.xml -exec cp --parents {} "$results/$cfg/" \;)
done
python3 tools/count_tests.py "$results/default" "$results/asan" || rc=1
exit $rc
