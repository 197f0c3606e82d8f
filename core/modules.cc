// Provider module loading (see modules.h).
#include "core/modules.h"

#include <dirent.h>
#include <dlfcn.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdlib>

#include "absl/base/call_once.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/log.h"
#include "core/provider.h"

#ifndef ZSOCK_VERSION_STRING
#define ZSOCK_VERSION_STRING "unknown"
#endif

namespace zsock {
namespace {

// Identifies the object this code is linked into (libzsock.so.1).
void Anchor() {}

std::string DefaultModuleDir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&Anchor), &info) == 0 || info.dli_fname == nullptr) {
    return "";
  }
  // The loader's name for libzsock may hold "bin/../lib" (RUNPATH $ORIGIN).
  std::string self = info.dli_fname;
  if (char* real = realpath(info.dli_fname, nullptr)) {
    self = real;
    std::free(real);
  }
  size_t slash = self.rfind('/');
  if (slash == std::string::npos) return "zsock/prov";
  return absl::StrCat(self.substr(0, slash), "/zsock/prov");
}

std::vector<std::string> ModuleFiles(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = readdir(d)) {
    absl::string_view name = e->d_name;
    if (absl::StartsWith(name, "libzsock-") && absl::EndsWith(name, ".so")) {
      out.push_back(absl::StrCat(dir, "/", name));
    }
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> ProviderNames() {
  std::vector<std::string> names;
  for (const ProviderInfo* p : ProvidersRegisteredSoFar()) names.push_back(p->name);
  return names;
}

void Scan(ModuleScan* scan) {
#ifndef ZSOCK_PROVIDER_MODULES
  return;  // providers are linked in: scan->enabled stays false
#endif
  scan->enabled = true;
  const char* env = std::getenv("ZSOCK_PROVIDER_PATH");
  if (env != nullptr && *env != '\0') {
    scan->dirs_source = "ZSOCK_PROVIDER_PATH";
    for (absl::string_view dir : absl::StrSplit(env, ':', absl::SkipEmpty())) {
      scan->dirs.emplace_back(dir);
    }
  } else {
    scan->dirs_source = "default";
    scan->dirs.push_back(DefaultModuleDir());
  }
  for (const std::string& dir : scan->dirs) {
    for (std::string& path : ModuleFiles(dir)) {
      ProviderModule m;
      m.path = std::move(path);
      std::vector<std::string> before = ProviderNames();
      // RTLD_LOCAL: a module's symbols serve only itself; it finds zsock's
      // through its dependency on libzsock.so.1.
      void* handle = dlopen(m.path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        const char* err = dlerror();
        m.error = err != nullptr ? err : "dlopen failed";
        ZS_LOG(kInfo, "provider module %s not loaded: %s", m.path, m.error);
      } else {
        m.loaded = true;
        for (const std::string& name : ProviderNames()) {
          if (std::find(before.begin(), before.end(), name) == before.end()) {
            m.providers.push_back(name);
          }
        }
        if (m.providers.empty()) {
          m.error = "registered no new provider (one of the same name is already loaded)";
        }
      }
      scan->modules.push_back(std::move(m));
    }
  }
}

}  // namespace

const ModuleScan& LoadProviderModules() {
  static absl::once_flag once;
  static ModuleScan* scan = new ModuleScan;
  absl::call_once(once, [] { Scan(scan); });
  return *scan;
}

const char* Version() { return ZSOCK_VERSION_STRING; }

}  // namespace zsock
