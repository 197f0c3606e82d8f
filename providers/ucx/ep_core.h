// EpCore: the state of one connection that UCX callbacks reach, guarded by
// its worker's lock. It outlives the endpoint object (UcxEndpoint) while
// UCX still owns requests that point to it. Also the tags that name an
// endpoint's channels, and the steps of taking a connection down (used by
// a close and by a peer's failure alike).
//
// Tags: (receiving endpoint's id << 32) | (its secret << 1) | control
// bit; ids and secrets are exchanged at the handshake, and tag matching is
// per worker, so a tag names one endpoint of the receiver's worker and one
// of its two channels (user messages, control messages).
#ifndef ZSOCK_PROVIDERS_UCX_EP_CORE_H_
#define ZSOCK_PROVIDERS_UCX_EP_CORE_H_

#include <ucp/api/ucp.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "core/flow_window.h"
#include "core/provider.h"
#include "providers/ucx/key_table.h"
#include "providers/ucx/op.h"
#include "providers/ucx/worker.h"

namespace zsock::ucx {

inline constexpr uint64_t kControlBit = 1;  // the tag's channel bit
inline constexpr uint64_t kFullMask = ~uint64_t{0};
inline uint64_t MakeTag(uint32_t id, uint32_t secret, bool control) {
  return (uint64_t{id} << 32) | (uint64_t{secret & 0x7fffffffu} << 1) | (control ? kControlBit : 0);
}

struct EpCore : std::enable_shared_from_this<EpCore> {
  Worker* worker = nullptr;
  UcxCq* cq = nullptr;
  Endpoint* ep = nullptr;  // null once the endpoint object is gone
  uint32_t local_id = 0;
  uint32_t local_secret = 0;
  uint32_t peer_id = 0;
  uint32_t peer_secret = 0;
  uint32_t peer_pid = 0;
  ucp_ep_h uep = nullptr;
  bool closed = false;
  bool dead = false;
  absl::Status dead_status;
  bool fail_emulated = false;  // FailEmulated still to be called
  std::deque<Op*> sends;       // user sends, in posting order
  std::deque<Op*> recvs;       // user receives, in posting order
  std::unordered_set<Op*> others;   // control sends and native operations
  std::deque<std::shared_ptr<ControlIn>> control;
  // Native RMA: the peer's key table, mapped through ucp_rkey_ptr.
  bool native = false;
  ucp_rkey_h table_rkey = nullptr;
  KeySlot* peer_table = nullptr;
  size_t peer_slots = 0;
  absl::flat_hash_map<uint32_t, std::pair<uint32_t, ucp_rkey_h>> rkeys;  // slot -> (gen, rkey)
  // Flow control (Settings::flow_window; started at the handshake). User
  // messages (sends and injected sends) beyond the window wait in `held`,
  // in order (user sends are also in `sends`, injected copies in `others`).
  FlowWindow flow;
  uint64_t user_received = 0;  // the peer's user messages our receives consumed
  bool flow_queued = false;    // in the worker's flow_due_ list
  std::deque<Op*> held;

  // Whether a new user send must wait behind the window.
  bool MustHold() const { return flow.on() && (!held.empty() || !flow.open()); }

  uint64_t RecvTag(bool control) const { return MakeTag(local_id, local_secret, control); }
  uint64_t SendTag(bool control) const { return MakeTag(peer_id, peer_secret, control); }
};

// An operation on a closed endpoint; an operation a close cancelled.
absl::Status ClosedError();
absl::Status ClosedCancel();

// Marks every unfinished operation of `c` failed with `why`; UCX keeps the
// requests it still owns (their callbacks only free them).
void FailRemainingLocked(EpCore* c, const absl::Status& why);
// Cancels `c`'s receives UCX has not matched yet.
void CancelRecvsLocked(Worker* w, EpCore* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu);
// Waits (bounded) for receives UCX matched before a cancel to finish.
void FinishMatchedRecvsLocked(Worker* w, EpCore* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu);
// Releases the peer's keys and closes the UCX endpoint, if any.
void CloseUcpEpLocked(Worker* w, EpCore* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu);

}  // namespace zsock::ucx

#endif  // ZSOCK_PROVIDERS_UCX_EP_CORE_H_
