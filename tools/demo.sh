#!/usr/bin/env bash
# The README's main job: installs what is missing, builds optimized, and runs
# a two-process transfer over the default unet provider beside kernel TCP,
# printing one-way latency and bandwidth per message size.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
bazel run -c opt --config=ci //bench:provider_bench -- "$@"
