// UCP context creation and the fork guard.
#include "providers/ucx/context.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/status.h"
#include "providers/ucx/ucs_error.h"

namespace zsock::ucx {

ForkGuard& ForkGuard::Get() {
  static ForkGuard* g = new ForkGuard;
  return *g;
}

absl::Status ForkGuard::Check() {
  MutexLock lock(&mu_);
  if (live_ > 0 && pid_ != ::getpid()) {
    return MakeError(
        absl::StatusCode::kFailedPrecondition, 0,
        absl::StrCat("this process was forked from pid ", pid_, " while it had ", live_,
                     " UCX worker(s) with live endpoints; UCX's progress thread does not "
                     "survive fork, so UCX cannot be used here"),
        "fork before creating ucx endpoints (opening a fabric, creating CQs and "
        "listening are fine), or exec a new program in the child");
  }
  return absl::OkStatus();
}

void ForkGuard::Add() {
  MutexLock lock(&mu_);
  if (live_ == 0) pid_ = ::getpid();
  ++live_;
}

void ForkGuard::Remove() {
  MutexLock lock(&mu_);
  if (pid_ == ::getpid() && live_ > 0) --live_;
}

namespace {

// UCX's configuration with zsock's settings applied; the caller releases it.
absl::StatusOr<ucp_config_t*> ReadConfig(const std::string& tls, const Settings& s, bool mm) {
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) {
    return UcsError(st, "reading UCX's configuration failed",
                    "check the UCX_* variables in the environment (ucx_info -cf)");
  }
  std::vector<std::pair<std::string, std::string>> mods = {{"TLS", tls}, {"RCACHE_ENABLE", "n"}};
  // UCX 1.13's shared-memory transports report no peer-failure handling
  // unless asked to; without it UCP refuses them for endpoints that
  // handle peer failure.
  if (mm) mods.emplace_back("MM_ERROR_HANDLING", "y");
  for (const auto& kv : s.ucx_options) mods.push_back(kv);
  for (const auto& [k, v] : mods) {
    st = ucp_config_modify(config, k.c_str(), v.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return UcsError(st, absl::StrCat("UCX rejected ", k, "=", v),
                      "ucx_info -cf shows the accepted values");
    }
  }
  return config;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Context>> Context::Create(const std::string& tls,
                                                         const Settings& s, bool mm, bool rma) {
  auto config = ReadConfig(tls, s, mm);
  if (!config.ok()) return config.status();
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  if (rma) params.features |= UCP_FEATURE_RMA | UCP_FEATURE_AMO64;
  params.mt_workers_shared = 1;
  ucp_context_h handle = nullptr;
  ucs_status_t st = ucp_init(&params, *config, &handle);
  ucp_config_release(*config);
  if (st != UCS_OK) {
    return UcsError(st, absl::StrCat("UCX could not open transports '", tls, "'"),
                    absl::StrCat("ucx_info -d lists what this host offers (",
                                 absl::StrJoin(AvailableTransports(), ","),
                                 "); posix needs a writable /dev/shm, cma needs ptrace "
                                 "permission"));
  }
  auto ctx = std::unique_ptr<Context>(new Context(handle, rma));
  // The size of UCX's request, for receives that bring their own
  // (Worker::TakeRequestLocked); 0 (UCX allocates them) if not told.
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_REQUEST_SIZE;
  if (ucp_context_query(handle, &attr) == UCS_OK) ctx->request_size_ = attr.request_size;
  ctx->ReadResources();
  return ctx;
}

void Context::ReadResources() {
  // What UCX actually opened: "resource N : md M dev D flags -- tl/dev".
  ucp_context_h handle = handle_;
  std::string info = CaptureOutput([handle](FILE* f) { ucp_context_print_info(handle, f); });
  for (absl::string_view line : absl::StrSplit(info, '\n')) {
    size_t p = line.find("-- ");
    if (line.find("resource") == absl::string_view::npos || p == absl::string_view::npos) {
      continue;
    }
    std::string res(absl::StripAsciiWhitespace(line.substr(p + 3)));
    resources_.push_back(res);
    std::string tl = res.substr(0, res.find('/'));
    if (std::find(transports_.begin(), transports_.end(), tl) == transports_.end()) {
      transports_.push_back(tl);
    }
  }
}

Context::~Context() { ucp_cleanup(handle_); }

}  // namespace zsock::ucx
