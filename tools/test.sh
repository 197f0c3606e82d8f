#!/usr/bin/env bash
# The README's test command: installs what is missing, runs the whole test
# suite (plain, then under AddressSanitizer) and ends with one line
# "N passed, N failed, N skipped" counted from the test cases' XML results.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh || exit 1
flags=(--config=ci)
rc=0
results=()
for cfg in "" "--config=asan"; do
  echo "=== bazel test ${cfg:-(default)} //..."
  # shellcheck disable=SC2086
  bazel test "${flags[@]}" $cfg //... || rc=1
  testlogs=$(bazel info "${flags[@]}" $cfg bazel-testlogs 2>/dev/null)
  results+=("$testlogs")
done
python3 tools/count_tests.py "${results[@]}" || rc=1
exit $rc
