#!/usr/bin/env bash
# Builds one of zsock's libFuzzer targets with Debian's clang-14 (Bazel's
# toolchain is gcc, which has no libFuzzer) and runs it for a bounded time.
#
#   tools/fuzz.sh TARGET [seconds]     # default 60
#
# Targets:
#   sdp-wire          the SDP wire parser (core/sdp/wire_fuzz.h)
#   unet-descriptors  unet's checks on what a peer writes into shared
#                     memory: ring descriptors, freed buffer indexes, the
#                     hello (providers/unet/descriptor_fuzz.h)
#
# The corpus lives in ${ZSOCK_FUZZ_DIR:-/tmp/zsock-fuzz}/TARGET and grows
# from run to run; it starts from the target's sample inputs. A crash
# leaves its input in TARGET/artifacts and the script exits non-zero. The
# same bodies run as ordinary gtests in `bazel test` (wire_fuzz_test,
# descriptor_fuzz_test). Needs clang-14, libclang-rt-14-dev and libabsl-dev
# (tools/install_deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
target="${1:-}"
secs="${2:-60}"
case "$target" in
  sdp-wire)
    srcs=(core/sdp/wire.cc core/sdp/wire_fuzz.cc core/status.cc core/log.cc)
    seed_header=core/sdp/wire_test_util.h
    seed_call='zsock::sdp::wire::SampleMessages()'
    ;;
  unet-descriptors)
    srcs=(providers/unet/descriptor_fuzz.cc)
    seed_header=providers/unet/descriptor_fuzz.h
    seed_call='zsock::unet::SampleFuzzInputs()'
    ;;
  *)
    echo "usage: $0 sdp-wire|unet-descriptors [seconds]" >&2
    exit 2
    ;;
esac
out="${ZSOCK_FUZZ_DIR:-/tmp/zsock-fuzz}/$target"
mkdir -p "$out/corpus" "$out/artifacts" "$out/shim"
cxx="${CXX_FUZZ:-clang++-14}"

# clang 14 lacks __builtin_source_location, which libstdc++ 12's
# <source_location> needs; core/status.h and core/log.h only take file and
# line from it, so the fuzz build gets a minimal stand-in.
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

# The absl libraries core's status and logging link against, those Debian
# ships (the set differs between absl versions).
libs=()
for l in status statusor str_format_internal strings strings_internal cord cord_internal \
         cordz_info cordz_functions cordz_handle crc32c crc_cord_state crc_internal \
         crc_cpu_detect synchronization time time_zone int128 base spinlock_wait \
         raw_logging_internal throw_delegate stacktrace symbolize debugging_internal \
         demangle_internal malloc_internal exponential_biased cordz_sample_token \
         graphcycles_internal log_severity; do
  [ -e "/usr/lib/x86_64-linux-gnu/libabsl_$l.so" ] && libs+=("-labsl_$l")
done
common=(-std=c++20 -I"$out/shim" -I. -Wall -Wextra -Werror -Wno-unused-parameter
        -Wno-missing-field-initializers)
"$cxx" "${common[@]}" -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -fno-omit-frame-pointer -DZSOCK_LIBFUZZER "${srcs[@]}" -o "$out/fuzzer" \
    -Wl,--start-group "${libs[@]}" -Wl,--end-group

if [ -z "$(ls -A "$out/corpus")" ]; then
  cat > "$out/seed.cc" <<CC
#include <cstdio>
#include <string>
#include "$seed_header"
int main(int argc, char** argv) {
  int i = 0;
  for (const auto& s : $seed_call) {
    std::string path = std::string(argv[1]) + "/seed" + std::to_string(i++);
    FILE* f = std::fopen(path.c_str(), "wb");
    std::fwrite(s.data(), 1, s.size(), f);
    std::fclose(f);
  }
}
CC
  "$cxx" "${common[@]}" "$out/seed.cc" "${srcs[@]}" -o "$out/seed" \
      -Wl,--start-group "${libs[@]}" -Wl,--end-group
  "$out/seed" "$out/corpus"
fi
cd "$out"
ZSOCK_LOG_LEVEL=error ./fuzzer corpus -max_total_time="$secs" -artifact_prefix=artifacts/ \
    -print_final_stats=1
