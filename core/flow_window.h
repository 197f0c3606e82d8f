// End-to-end flow control for providers whose transport keeps unexpected
// messages without bound (ofi over rxm, ucx; docs/ofi.md and docs/ucx.md,
// "Flow control"). Each side states its window at connect; when both do,
// at most `window` of our user messages are with the transport beyond
// what the peer has reported consumed, and we report our own consumption
// every quarter of the peer's window, in a 9-byte control record.
//
// Written here, not taken from a library: the counters live under each
// provider's own lock, and the record rides the provider's control
// channel (FlowWindow is not thread-safe).
#ifndef ZSOCK_CORE_FLOW_WINDOW_H_
#define ZSOCK_CORE_FLOW_WINDOW_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>

namespace zsock {

// A provider's small control record: a marker byte and a count (the flow
// report, ofi's FIN). Never an emulation message, whose header alone is
// longer.
inline constexpr size_t kRecordSize = 9;
// The flow report's marker.
inline constexpr uint8_t kFlowReportMarker = 0xc1;

inline std::array<uint8_t, kRecordSize> EncodeRecord(uint8_t marker, uint64_t count) {
  std::array<uint8_t, kRecordSize> rec;
  rec[0] = marker;
  std::memcpy(rec.data() + 1, &count, 8);
  return rec;
}

// Whether `msg` is a record with `marker`; its count in *count.
inline bool DecodeRecord(std::span<const uint8_t> msg, uint8_t marker, uint64_t* count) {
  if (msg.size() != kRecordSize || msg[0] != marker) return false;
  std::memcpy(count, msg.data() + 1, 8);
  return true;
}

class FlowWindow {
 public:
  // Our window and the one the peer stated (0: none); flow control is on
  // only when both are.
  void Start(uint64_t window, uint64_t peer_window) {
    if (window == 0 || peer_window == 0) return;
    window_ = window;
    report_every_ = std::max<uint64_t>(1, peer_window / 4);
  }
  bool on() const { return window_ != 0; }

  // Sender: whether another user message may go to the transport now.
  bool open() const { return window_ == 0 || posted_ - peer_consumed_ < window_; }
  void Posted() { ++posted_; }
  // The peer's report. Reports may overtake each other: the count only
  // grows. More than we posted is a broken peer; it cannot open the window
  // beyond what we sent.
  void PeerReported(uint64_t consumed) {
    peer_consumed_ = std::min(std::max(peer_consumed_, consumed), posted_);
  }

  // Receiver: whether a report of `received` (our count of the peer's
  // messages our receives consumed) is due; Reported once it went.
  bool ReportDue(uint64_t received) const {
    return window_ != 0 && received - reported_ >= report_every_;
  }
  void Reported(uint64_t received) { reported_ = received; }

 private:
  uint64_t window_ = 0;
  uint64_t report_every_ = 1;
  uint64_t posted_ = 0;         // user messages handed to the transport
  uint64_t peer_consumed_ = 0;  // of those, what the peer reported consumed
  uint64_t reported_ = 0;       // the count in our last report
};

}  // namespace zsock

#endif  // ZSOCK_CORE_FLOW_WINDOW_H_
