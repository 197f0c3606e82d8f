// Event queues of connected (FI_EP_MSG) endpoints and listeners: opening
// one with a wait fd (OpenEq), and reading the next connection event by a
// deadline (EqNext), for connection set-up (msg_connect.cc).
#ifndef ZSOCK_PROVIDERS_OFI_EVENT_QUEUE_H_
#define ZSOCK_PROVIDERS_OFI_EVENT_QUEUE_H_

#include <rdma/fi_eq.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "providers/ofi/domain_lock.h"

namespace zsock::ofi {

// An event queue of `fabric` with an FI_WAIT_FD object, and that fd.
absl::Status OpenEq(fid_fabric* fabric, fid_eq** eq, int* fd);

// An fi_eq_cm_entry with room for its connection data (the struct ends in
// a flexible array member).
struct CmEvent {
  alignas(fi_eq_cm_entry) uint8_t raw[sizeof(fi_eq_cm_entry) + 256];
  fi_eq_cm_entry* entry() { return reinterpret_cast<fi_eq_cm_entry*>(raw); }
  uint8_t* data() { return raw + sizeof(fi_eq_cm_entry); }
};

// Reads one event from `eq` (sleeping on its fd, reading under the domain
// lock), until `deadline`; `*len` gets the entry's length. Error entries
// become statuses naming `what` (and set *error_entry, when given).
absl::StatusOr<uint32_t> EqNext(DomainMutex* dom_mu, fid_eq* eq, int fd, CmEvent* ev, size_t* len,
                                absl::Time deadline, absl::string_view what,
                                bool* error_entry = nullptr);

}  // namespace zsock::ofi

#endif  // ZSOCK_PROVIDERS_OFI_EVENT_QUEUE_H_
