// The verbs provider's send credits (SDP-style flow control over the
// peer's receive buffers).
#ifndef ZSOCK_PROVIDERS_VERBS_CREDITS_H_
#define ZSOCK_PROVIDERS_VERBS_CREDITS_H_

#include <cstdint>

namespace zsock::verbs {

// Send credits: how many of the peer's receive buffers we may fill, and how
// many of ours we have refilled since we last told the peer. As in SDP, the
// last credit is kept for a credit update: a message takes a credit only
// when two are left, an explicit update (kCredit) may take the last one, and
// is sent only when it returns at least two (one to replace the buffer it
// fills, one gained: updates that return one would bounce between two
// blocked peers forever). Two peers that both ran short can then always
// tell each other what they refilled, so neither waits forever and no
// receiver is overrun (recv_depth >= 4).
class Credits {
 public:
  explicit Credits(uint32_t initial) : available_(initial) {}
  bool unlimited() const { return available_ == kUnlimited; }
  // Takes one credit for a message; false when fewer than two are left
  // (queue it).
  bool Take();
  // Takes one credit for a credit update (the last one may go); false when
  // none is left or fewer than two are owed to the peer.
  bool TakeForUpdate();
  // The peer returned `n`.
  void Grant(uint32_t n);
  // One of our buffers was refilled; returns true when an explicit update
  // should be sent (half the window refilled and nothing to piggyback on).
  bool Returned(uint32_t window);
  // Credits to piggyback on the next message we send (then zero).
  uint16_t TakeReturn();
  uint32_t available() const { return available_; }
  uint32_t pending_return() const { return to_return_; }
  static constexpr uint32_t kUnlimited = UINT32_MAX;

 private:
  uint32_t available_;
  uint32_t to_return_ = 0;
};

}  // namespace zsock::verbs

#endif  // ZSOCK_PROVIDERS_VERBS_CREDITS_H_
