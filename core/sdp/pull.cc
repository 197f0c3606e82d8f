// Pulled bcopy (docs/protocol.md, "Pulled bcopy"): a large bcopy send is
// copied once, into a buffer of this side's that the peer can map
// (Fabric::AllocateRegistered), and announced by a SrcAvail flagged
// kFlagPull; the send returns at once, as any bcopy send, and the peer's
// Recv reads the bytes straight into its application's buffer. On unet that
// read is a CPU copy through the peer's mapping of the buffer
// (Capabilities::rma_allocated), so each side copies every byte once,
// where bcopy through private buffers and the provider's segment copies it
// twice on each side. Only a sink whose reads are such copies offers it
// (kExtPull): over a NIC, a read per advert would cost a round trip.
// Everything here runs with the engine mutex held.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/copy.h"
#include "core/log.h"
#include "core/sdp/conn_state.h"
#include "core/sdp/engine.h"

namespace zsock::sdp {

using wire::MessageId;

void ConnState::SetUpPull() {
  pull.offered = (my_caps & wire::kCapRdmaRead) &&
                 ep->fabric()->caps().rma_allocated == Support::kNative;
}

void ConnState::AddPullHello(wire::Hello& h) const {
  if (!pull.offered) return;
  std::string v(4, '\0');
  const uint32_t n = kPullMaxAdverts;
  std::memcpy(v.data(), &n, 4);  // little-endian hosts only (docs/protocol.md)
  h.extensions.push_back({wire::kExtPull, std::move(v)});
}

void ConnState::AcceptPeerPull() {
  for (const auto& e : peer.extensions) {
    if (e.type != wire::kExtPull) continue;
    uint32_t n = 0;
    if (e.value.size() == 4) std::memcpy(&n, e.value.data(), 4);
    if (n == 0 || n > kPullMaxAdverts || !(peer.caps & wire::kCapRdmaRead)) {
      wire::Header h;
      h.mid = active ? MessageId::kHelloAck : MessageId::kHello;
      ProtocolError(Violation(h, absl::StrCat("has a malformed pull extension (",
                                              e.value.size(), " bytes, count ", n,
                                              ", RdmaRead ", (peer.caps & wire::kCapRdmaRead) != 0,
                                              ")")));
      return;
    }
    pull.peer_count = n;
  }
}

bool ConnState::EnsurePullBuffer() {
  if (pull.mr) return true;
  if (pull.failed) return false;
  // For this peer alone: unet would otherwise share it with every peer of
  // the fabric, which could then read this connection's stream.
  auto r = ep->fabric()->AllocateRegisteredFor(ep.get(), kPullBuffer,
                                               kLocalRead | kLocalWrite | kRemoteRead);
  if (!r.ok()) {
    ZS_LOG(kInfo, "sdp: cannot allocate the pull buffer for %s (%s); large sends use bcopy "
           "through private buffers", peer_address.c_str(), r.status().ToString().c_str());
    pull.failed = true;
    return false;
  }
  pull.mr = std::move(*r);
  return true;
}

bool ConnState::PullWanted(size_t rem) const {
  return pull.peer_count > 0 && !pull.failed && opt.pull_threshold > 0 && rem >= opt.pull_threshold;
}

size_t ConnState::PullRoom(size_t rem, size_t* off) const {
  if (pull.out >= pull.peer_count || !pull.mr) return 0;
  const size_t want = std::min(rem, kPullAdvert);
  // The oldest pulled advert still out starts the range in use; pull_head
  // ends it (adverts take the ring in order).
  const AzSrcAvail* oldest = nullptr;
  for (const AzSrcAvail& s : az.src) {
    if (s.pull) {
      oldest = &s;
      break;
    }
  }
  if (oldest == nullptr) {
    *off = 0;
    return want;
  }
  const size_t tail = oldest->pull_off;
  // A part of the next `rem` bytes is worth an advert if it is at least the
  // threshold (or all that is left).
  const size_t least = std::min(want, std::max<size_t>(opt.pull_threshold, 1));
  if (pull.head > tail) {
    if (kPullBuffer - pull.head >= least) {
      *off = pull.head;
      return std::min(want, kPullBuffer - pull.head);
    }
    if (tail >= least) {  // wrap: the end's remnant stays unused this round
      *off = 0;
      return std::min(want, tail);
    }
    return 0;
  }
  // Wrapped (pull_head <= tail; equal means full, as an advert is never
  // empty).
  if (tail - pull.head >= least) {
    *off = pull.head;
    return std::min(want, tail - pull.head);
  }
  return 0;
}

void ConnState::QueuePull(const uint8_t* p, size_t k, size_t off) {
  CopyBytes(PullBase() + off, p, k);
  pull.head = off + k;
  AzSrcAvail as;
  as.pull = true;
  as.pull_off = off;
  as.serial = NextAzSerial();
  as.slot = wire::kNoSlot;
  as.len = static_cast<uint32_t>(k);
  as.addr = reinterpret_cast<uintptr_t>(PullBase() + off);
  as.stream_pos = TxCommitted();
  as.mr = pull.mr;
  TxItem item;
  item.mid = MessageId::kSrcAvail;
  item.az_serial = as.serial;
  item.encoded = wire::EncodeToString(AzAdvert(as, wire::kFlagPull));
  az.src.push_back(std::move(as));
  pull.out++;
  tx.dataq.push_back(std::move(item));
  stats.pull_srcavail_sent++;
  TryTransmit();
}

}  // namespace zsock::sdp
