// zsock_info: lists every provider of this zsock (built in, or a loaded
// provider module) with its capabilities, or why it is unavailable and what
// to do, and which provider modules were found or failed to load and why;
// --config prints the effective configuration and where each value came
// from.
//
//   bazel run //tools:zsock_info
//   bazel run //tools:zsock_info -- --config
//   bazel run //tools:zsock_info -- --provider=unet?cma=off
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_join.h"
#include "core/config.h"
#include "core/modules.h"
#include "core/provider.h"

ABSL_FLAG(bool, config, false, "print the effective configuration and its sources");
ABSL_FLAG(std::string, provider, "", "show only this configuration string");

namespace zsock {
namespace {

void PrintCaps(const std::string& config) {
  auto fabric = Fabric::Open(config);
  if (!fabric.ok()) {
    const char* what = fabric.status().code() == absl::StatusCode::kInvalidArgument
                           ? "INVALID CONFIG"
                           : "UNAVAILABLE";
    std::printf("  %-24s %s: %s\n", config.c_str(), what,
                std::string(fabric.status().message()).c_str());
    return;
  }
  const Capabilities& c = (*fabric)->caps();
  std::printf("  %-24s available\n", config.c_str());
  std::printf("      send/recv %-9s rdma-read %-9s rdma-write %-9s atomics %s (on allocated memory %s)\n",
              std::string(SupportName(c.send_recv)).c_str(),
              std::string(SupportName(c.rdma_read)).c_str(),
              std::string(SupportName(c.rdma_write)).c_str(),
              std::string(SupportName(c.atomics)).c_str(),
              std::string(SupportName(c.atomics_allocated)).c_str());
  if (c.rma_allocated != Support::kNone) {
    std::printf("      rdma read/write of allocated memory %s\n",
                std::string(SupportName(c.rma_allocated)).c_str());
  }
  std::printf("      max-msg %zu  max-rma %zu  inline %zu  inject %zu  registration %s  peers %s  wait-fd %s  threads %s\n",
              c.max_msg_size, c.max_rma_size, c.inline_size, c.inject_size,
              c.registration_required ? "required" : "optional",
              c.peer_on_host ? "same host" : "remote", c.wait_fd ? "yes" : "no",
              c.thread_safe ? "any" : "one at a time");
  for (const auto& n : c.notes) std::printf("      note: %s\n", n.c_str());
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Lists zsock providers, capabilities and configuration.");
  absl::ParseCommandLine(argc, argv);
  const auto& config = Config::Global();
  if (!config.ok()) {
    std::fprintf(stderr, "zsock_info: configuration error: %s\n",
                 std::string(config.status().message()).c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_config)) {
    std::printf("%-24s %-24s %s\n", "key", "value", "source");
    for (const auto& [key, v] : config->values()) {
      std::printf("%-24s %-24s %s\n", key.c_str(), v.value.c_str(), v.source.c_str());
    }
    return 0;
  }
  std::string only = absl::GetFlag(FLAGS_provider);
  if (!only.empty()) {
    PrintCaps(only);
    return 0;
  }
  std::printf("zsock %s\ndefault provider: %s (from %s)\n\n", Version(),
              config->GetString("provider").c_str(), config->Get("provider").source.c_str());
  for (const ProviderInfo* p : RegisteredProviders()) {
    std::printf("%s: %s\n", p->name.c_str(), p->description.c_str());
    for (const auto& c : p->configurations) PrintCaps(c);
    std::printf("\n");
  }
  const ModuleScan& scan = LoadProviderModules();
  if (scan.enabled) {
    std::printf("provider modules: %s (%s)\n", absl::StrJoin(scan.dirs, ":").c_str(),
                scan.dirs_source.c_str());
    if (scan.modules.empty()) std::printf("  none found\n");
    for (const ProviderModule& m : scan.modules) {
      if (!m.loaded) {
        std::printf("  %s: FAILED TO LOAD: %s\n", m.path.c_str(), m.error.c_str());
      } else if (m.providers.empty()) {
        std::printf("  %s: loaded, %s\n", m.path.c_str(), m.error.c_str());
      } else {
        std::printf("  %s: loaded (%s)\n", m.path.c_str(),
                    absl::StrJoin(m.providers, ", ").c_str());
      }
    }
  } else {
    std::printf("provider modules: not used by this build (providers linked in)\n");
  }
  return 0;
}

}  // namespace
}  // namespace zsock

int main(int argc, char** argv) { return zsock::Main(argc, argv); }
