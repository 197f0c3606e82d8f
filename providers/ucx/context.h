// The UCP context a fabric (or its tcp fallback) opens, and the fork guard
// that keeps UCX from being used in a child forked while workers exist.
//
// ForkGuard: UCX keeps its async thread (epoll set, handler table, use
// count) in process globals. A child forked while a worker exists inherits
// them without the thread: its connections would never progress and the
// parent would spin on the child's fds. Workers exist only while endpoints
// do, so the rule "fork before creating endpoints" keeps children clean; a
// child forked too late is refused with this explanation instead of
// hanging. Every worker is counted (Add / Remove) and every fabric open
// and worker creation asks Check first.
#ifndef ZSOCK_PROVIDERS_UCX_CONTEXT_H_
#define ZSOCK_PROVIDERS_UCX_CONTEXT_H_

#include <sys/types.h>
#include <ucp/api/ucp.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/mutex.h"
#include "providers/ucx/options.h"

namespace zsock::ucx {

class ForkGuard {
 public:
  static ForkGuard& Get();
  // FailedPrecondition in a child forked while the parent had workers.
  absl::Status Check();
  void Add();     // a worker was created
  void Remove();  // a worker was destroyed

 private:
  Mutex mu_;
  int live_ ABSL_GUARDED_BY(mu_) = 0;
  pid_t pid_ ABSL_GUARDED_BY(mu_) = 0;
};

// A UCP context with zsock's fixed settings: transports `tls`, UCP's
// registration cache off, the user's ?UCX_...= options applied; tag
// matching and wakeup always, RMA and 64-bit atomics when `rma`.
class Context {
 public:
  // `mm`: the transports include shared memory, whose peer-failure
  // handling must be switched on.
  static absl::StatusOr<std::unique_ptr<Context>> Create(const std::string& tls,
                                                         const Settings& s, bool mm, bool rma);
  ~Context();

  ucp_context_h handle() const { return handle_; }
  bool rma() const { return rma_; }
  // UCX's request size, for receives that bring their own; 0 if UCX did not say.
  size_t request_size() const { return request_size_; }
  const std::vector<std::string>& resources() const { return resources_; }
  const std::vector<std::string>& transports() const { return transports_; }

 private:
  Context(ucp_context_h h, bool rma) : handle_(h), rma_(rma) {}
  // Fills resources_ and transports_ from what UCX says it opened.
  void ReadResources();

  ucp_context_h handle_;
  bool rma_;
  size_t request_size_ = 0;
  std::vector<std::string> resources_;   // "posix/memory", "tcp/lo", ...
  std::vector<std::string> transports_;  // "posix", "cma", "tcp"
};

}  // namespace zsock::ucx

#endif  // ZSOCK_PROVIDERS_UCX_CONTEXT_H_
