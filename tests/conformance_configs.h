// The provider configurations the conformance suite runs on: every
// configuration each provider linked into the test binary lists in its
// ProviderInfo. A provider joins the suite by linking it into
// //tests:conformance_test (one line in tests/BUILD.bazel).
//
// ZSOCK_TEST_PROVIDERS=unet,tcp (provider names, comma-separated) keeps
// only those providers' configurations: CI's ThreadSanitizer tier runs the
// suites over the providers whose threads are all instrumented zsock code,
// where libfabric's and UCX's uninstrumented internals would make every row
// slow and prove nothing about zsock (tools/test.sh).
#ifndef ZSOCK_TESTS_CONFORMANCE_CONFIGS_H_
#define ZSOCK_TESTS_CONFORMANCE_CONFIGS_H_

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/provider.h"

namespace zsock {

// Whether `config` ("ofi:tcp?iface=lo", ...) belongs to a provider that
// ZSOCK_TEST_PROVIDERS admits (all of them when it is unset or empty).
inline bool ConfigurationWanted(const std::string& config) {
  const char* only = std::getenv("ZSOCK_TEST_PROVIDERS");
  if (only == nullptr || *only == '\0') return true;
  const std::string provider = config.substr(0, config.find_first_of(":?"));
  for (absl::string_view p : absl::StrSplit(only, ',')) {
    if (p == provider) return true;
  }
  return false;
}

// Every registered provider's configurations, then `extra` ones (other
// options of the same providers), less those ZSOCK_TEST_PROVIDERS leaves out.
inline std::vector<std::string> ConformanceConfigurations(std::vector<std::string> extra = {}) {
  std::vector<std::string> all;
  for (const ProviderInfo* p : RegisteredProviders()) {
    all.insert(all.end(), p->configurations.begin(), p->configurations.end());
  }
  all.insert(all.end(), extra.begin(), extra.end());
  std::vector<std::string> out;
  for (auto& c : all) {
    if (ConfigurationWanted(c)) out.push_back(std::move(c));
  }
  return out;
}

// Whether the SDP and sockets suites run `config` in the zero-copy modes
// (zcopy, azcopy) besides bcopy in their general matrices. Those modes run
// over one provider of each kind of RDMA path (unet: shared memory, tcp:
// emulated by core, ofi:tcp;ofi_rxm: libfabric's), and over every
// configuration with ZSOCK_TEST_ALL_MODES=1; the suites written for the
// zero-copy modes (sdp_test's SdpAzTest and SdpCancelTest) run them over
// every configuration (docs/decisions/0040-ci-tiers.md).
inline bool RunsEveryMode(const std::string& config) {
  if (const char* all = std::getenv("ZSOCK_TEST_ALL_MODES"); all != nullptr && *all == '1') {
    return true;
  }
  return config == "unet" || config == "tcp" || config.rfind("ofi:tcp;ofi_rxm", 0) == 0;
}

}  // namespace zsock

#endif  // ZSOCK_TESTS_CONFORMANCE_CONFIGS_H_
