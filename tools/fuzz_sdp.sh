#!/usr/bin/env bash
# Builds the SDP wire-parser fuzz target with Debian's clang-14 and libFuzzer
# (Bazel's toolchain is gcc, which has no libFuzzer) and runs it.
#
#   tools/fuzz_sdp.sh [seconds]      # default 60; corpus in /tmp/zsock-fuzz-sdp
#
# The same body runs as a normal gtest in CI (//core/sdp:wire_fuzz_test).
# Needs: clang-14, libclang-rt-14-dev, libabsl-dev (tools/install_deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
out="${ZSOCK_FUZZ_DIR:-/tmp/zsock-fuzz-sdp}"
mkdir -p "$out/corpus" "$out/artifacts"
cxx="${CXX_FUZZ:-clang++-14}"
# clang 14 lacks __builtin_source_location, which libstdc++ 12's
# <source_location> needs; core/status.h and core/log.h only take file and
# line from it, so the fuzz build gets a minimal stand-in.
mkdir -p "$out/shim"
cat > "$out/shim/source_location" <<'HDR'
#pragma once
namespace std {
struct source_location {
  static constexpr source_location current(const char* f = __builtin_FILE(),
                                           unsigned l = __builtin_LINE()) noexcept {
    source_location s;
    s.file_ = f;
    s.line_ = l;
    return s;
  }
  constexpr const char* file_name() const noexcept { return file_; }
  constexpr const char* function_name() const noexcept { return ""; }
  constexpr unsigned line() const noexcept { return line_; }
  constexpr unsigned column() const noexcept { return 0; }
  const char* file_ = "";
  unsigned line_ = 0;
};
}  // namespace std
HDR
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-omit-frame-pointer
       -DZSOCK_LIBFUZZER -I"$out/shim" -I. -Wall -Wextra -Werror -Wno-unused-parameter
       -Wno-missing-field-initializers)
# Only the parser and what it needs: the wire format, the error type and
# logging (no provider code).
srcs=(core/sdp/wire.cc core/sdp/wire_fuzz.cc core/status.cc core/log.cc)
libs=(-labsl_status -labsl_statusor -labsl_str_format_internal -labsl_strings
      -labsl_strings_internal -labsl_cord -labsl_cord_internal -labsl_cordz_info
      -labsl_cordz_functions -labsl_cordz_handle -labsl_crc32c -labsl_crc_cord_state
      -labsl_crc_internal -labsl_crc_cpu_detect -labsl_synchronization -labsl_time
      -labsl_time_zone -labsl_int128 -labsl_base -labsl_spinlock_wait
      -labsl_raw_logging_internal -labsl_throw_delegate -labsl_stacktrace -labsl_symbolize
      -labsl_debugging_internal -labsl_demangle_internal -labsl_malloc_internal
      -labsl_exponential_biased -labsl_cordz_sample_token -labsl_graphcycles_internal
      -labsl_log_severity)
avail=()
for l in "${libs[@]}"; do
  if ls /usr/lib/x86_64-linux-gnu/lib"${l#-l}".so >/dev/null 2>&1; then avail+=("$l"); fi
done
"$cxx" "${flags[@]}" "${srcs[@]}" -o "$out/wire_fuzzer" -Wl,--start-group "${avail[@]}" -Wl,--end-group
# Seed corpus: one valid message of each type (written by the gtest helper).
if [ -z "$(ls -A "$out/corpus")" ]; then
  cat > "$out/seed.cc" <<'CC'
#include <cstdio>
#include "core/sdp/wire_test_util.h"
int main(int argc, char** argv) {
  int i = 0;
  for (const auto& s : zsock::sdp::wire::SampleMessages()) {
    std::string path = std::string(argv[1]) + "/seed" + std::to_string(i++);
    FILE* f = std::fopen(path.c_str(), "wb");
    std::fwrite(s.data(), 1, s.size(), f);
    std::fclose(f);
  }
}
CC
  "$cxx" -std=c++20 -I"$out/shim" -I. "$out/seed.cc" core/sdp/wire.cc core/status.cc core/log.cc \
      -o "$out/seed" -Wl,--start-group "${avail[@]}" -Wl,--end-group
  "$out/seed" "$out/corpus"
fi
ZSOCK_LOG_LEVEL=error "$out/wire_fuzzer" "$out/corpus" -max_total_time="$secs" \
    -artifact_prefix="$out/artifacts/" -print_final_stats=1
