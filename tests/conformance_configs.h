// The provider configurations the conformance suite runs on: every
// configuration each provider linked into the test binary lists in its
// ProviderInfo. A provider joins the suite by linking it into
// //tests:conformance_test (one line in tests/BUILD.bazel).
#ifndef ZSOCK_TESTS_CONFORMANCE_CONFIGS_H_
#define ZSOCK_TESTS_CONFORMANCE_CONFIGS_H_

#include <string>
#include <vector>

#include "core/provider.h"

namespace zsock {

inline std::vector<std::string> ConformanceConfigurations() {
  std::vector<std::string> out;
  for (const ProviderInfo* p : RegisteredProviders()) {
    for (const auto& c : p->configurations) out.push_back(c);
  }
  return out;
}

}  // namespace zsock

#endif  // ZSOCK_TESTS_CONFORMANCE_CONFIGS_H_
