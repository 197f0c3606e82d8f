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

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "core/provider.h"

namespace zsock {

inline std::vector<std::string> ConformanceConfigurations() {
  const char* only = std::getenv("ZSOCK_TEST_PROVIDERS");
  std::vector<std::string> wanted;
  if (only != nullptr && *only != '\0') wanted = absl::StrSplit(only, ',');
  std::vector<std::string> out;
  for (const ProviderInfo* p : RegisteredProviders()) {
    if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), p->name) == wanted.end()) {
      continue;
    }
    for (const auto& c : p->configurations) out.push_back(c);
  }
  return out;
}

}  // namespace zsock

#endif  // ZSOCK_TESTS_CONFORMANCE_CONFIGS_H_
