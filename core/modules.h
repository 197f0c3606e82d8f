// Provider modules: providers built as shared objects and loaded at run time.
//
// In the installed library (libzsock.so.1) unet and tcp are built in; ofi,
// ucx and verbs are modules (libzsock-<name>.so) so that a host without
// libfabric, UCX or rdma-core still loads libzsock. Like UCX's and
// libfabric's, the modules are looked up in one place per run:
//   ZSOCK_PROVIDER_PATH   colon-separated directories, if set;
//   otherwise             <directory of libzsock.so.1>/zsock/prov.
// Each libzsock-*.so there is dlopen'ed once, the first time the provider
// registry is read; its static initializer registers its provider. A module
// that fails to load (a library it needs is missing) is recorded with the
// loader's message and skipped: the other providers work.
//
// Only a libzsock built with ZSOCK_PROVIDER_MODULES (the installed build,
// docs/install.md) loads modules; binaries that link the providers
// statically (the in-tree tests) have no module directory.
#ifndef ZSOCK_CORE_MODULES_H_
#define ZSOCK_CORE_MODULES_H_

#include <string>
#include <vector>

namespace zsock {

struct ProviderModule {
  std::string path;
  bool loaded = false;
  // Why it did not load (the dynamic loader's message), or why its
  // providers were not taken (already built in).
  std::string error;
  // Providers it registered.
  std::vector<std::string> providers;
};

struct ModuleScan {
  bool enabled = false;              // this build loads modules
  std::vector<std::string> dirs;     // searched, in order
  std::string dirs_source;           // "ZSOCK_PROVIDER_PATH" or "default"
  std::vector<ProviderModule> modules;
};

// Loads the modules once (later calls return the first scan's result).
// Thread-safe; must not be called from a module's static initializer.
const ModuleScan& LoadProviderModules();

// zsock's version ("0.1.0"), as in the package and pkg-config file.
const char* Version();

}  // namespace zsock

#endif  // ZSOCK_CORE_MODULES_H_
