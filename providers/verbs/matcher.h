// The verbs receive matcher: user messages and posted receives, each in
// order, paired as they meet.
#ifndef ZSOCK_PROVIDERS_VERBS_MATCHER_H_
#define ZSOCK_PROVIDERS_VERBS_MATCHER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "core/provider.h"
#include "providers/verbs/wire.h"

namespace zsock::verbs {

// Pairs arriving user messages with posted receives, both in order. A
// message arriving with no receive posted waits (eager: its bytes are
// copied aside; rendezvous: its descriptor), and the next receive posted
// takes it.
struct PostedRecv {
  void* buf = nullptr;
  size_t len = 0;
  MemoryRegion* mr = nullptr;
  uint64_t context = 0;
};
struct Arrival {
  bool rendezvous = false;
  std::vector<uint8_t> data;   // eager payload
  RtsBody rts;                 // rendezvous descriptor
  uint64_t cookie = 0;         // rendezvous id at the sender
};
struct Match {
  PostedRecv recv;
  Arrival msg;
  // The message is longer than the receive: fail the receive with
  // OutOfRange and discard the message (rendezvous: tell the sender).
  bool truncated = false;
};

class Matcher {
 public:
  // Returns the match if a receive was waiting, else queues the message.
  std::optional<Match> Arrive(Arrival msg);
  std::optional<Match> Post(PostedRecv recv);
  size_t waiting_messages() const { return messages_.size(); }
  size_t waiting_recvs() const { return recvs_.size(); }
  // Removes everything (endpoint down): receives to fail, messages dropped.
  std::deque<PostedRecv> TakeRecvs();
  std::deque<Arrival> TakeMessages();

 private:
  static Match Pair(PostedRecv r, Arrival m);
  std::deque<PostedRecv> recvs_;
  std::deque<Arrival> messages_;
};

}  // namespace zsock::verbs

#endif  // ZSOCK_PROVIDERS_VERBS_MATCHER_H_
