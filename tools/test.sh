#!/usr/bin/env bash
# The README's test command: installs what is missing, runs the whole test
# suite twice (plain, then under AddressSanitizer) and ends with one line
# "N passed, N failed[, N skipped]" counted from both runs' results
# (tools/count_tests.py reads each run's build event file).
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh || exit 1
results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
rc=0
for cfg in default asan; do
  flags=(--config=ci "--build_event_json_file=$results/$cfg.bep.json")
  [ "$cfg" = default ] || flags+=("--config=$cfg")
  echo "=== bazel test ${flags[*]} //..."
  bazel test "${flags[@]}" //... || rc=1
  # Count now: the next run overwrites the shared testlogs directory.
  python3 tools/count_tests.py --bep "$results/$cfg.bep.json" --out "$results/$cfg.counts" || rc=1
done
python3 tools/count_tests.py --sum "$results/default.counts" "$results/asan.counts" || rc=1
exit $rc
