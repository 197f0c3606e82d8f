// DrainCq: reads the completions now in an endpoint's fi CQ (fi_cq_read)
// and hands each to a callback with the request it names. On every
// message's path: a template, inline where it is used.
#ifndef ZSOCK_PROVIDERS_OFI_CQ_DRAIN_H_
#define ZSOCK_PROVIDERS_OFI_CQ_DRAIN_H_

#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include <cstddef>
#include <utility>

#include "absl/status/status.h"
#include "core/log.h"
#include "providers/ofi/errors.h"
#include "providers/ofi/request.h"

namespace zsock::ofi {

// Reads the completions now in `cq` (domain lock held by the caller) until a
// read finds fewer than it asked for, handing each to `done(Request*, len,
// absl::Status)` as it is read (`len`: what a receive got); returns how many
// entries it read (0: it was empty). `ep_open` says whether the endpoint
// bound to it is still open (CqError). The entries of one read are copied
// out before the first is handed on, so `done` may post again.
template <typename Done>
size_t DrainCq(fid_cq* cq, bool ep_open, Done&& done) {
  size_t n = 0;
  for (;;) {
    fi_cq_tagged_entry entries[16];
    ssize_t got = fi_cq_read(cq, entries, 16);
    if (got > 0) {
      for (ssize_t i = 0; i < got; ++i) {
        auto* r = reinterpret_cast<Request*>(entries[i].op_context);
        if (r == nullptr) continue;  // an event that is not one of our operations
        done(r, r->op == OpType::kRecv ? entries[i].len : r->len, absl::OkStatus());
      }
      n += static_cast<size_t>(got);
      // Fewer than asked for: the CQ is empty (an error entry makes the
      // next call say so, and the next poll reads it). Reading again to
      // hear EAGAIN would put a second fi_cq_read on every message's path.
      if (got < 16) return n;
      continue;
    }
    if (got == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(cq, &err, 0) > 0) {
        absl::Status st = CqError(ep_open ? cq : nullptr, &err);
        if (err.op_context == nullptr) {
          // Not tied to an operation of ours (e.g. a failed connection
          // inside the provider): report it, keep going.
          ZS_LOG(kInfo, "ofi CQ error without an operation: %s", st.ToString());
        } else {
          auto* r = reinterpret_cast<Request*>(err.op_context);
          done(r, r->len, std::move(st));
        }
        ++n;
        continue;
      }
    }
    return n;
  }
}

}  // namespace zsock::ofi

#endif  // ZSOCK_PROVIDERS_OFI_CQ_DRAIN_H_
