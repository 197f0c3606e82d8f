// unet's connection handshake (handshake.h): the hello exchange, one
// message each way on the connection socket, checked before use, and
// UnetFabric::Handshake, which creates our segment, maps the peer's, probes
// cross-memory attach and builds the endpoint.
#include "providers/unet/handshake.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <random>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/cq_cast.h"
#include "core/log.h"
#include "core/status.h"
#include "providers/unet/endpoint.h"
#include "providers/unet/fabric.h"
#include "providers/unet/os.h"

namespace zsock::unet {

// The hello carries the segment fds and our credentials, from which the
// peer learns our pid. SO_PEERCRED cannot serve: on the connecting side it
// names the process that called listen(), which need not be the one that
// accepts.
absl::Status SendHello(int sock, const Hello& hello, const int fds[kHelloFds]) {
  ssize_t n = SendWithFds(sock, &hello, sizeof(hello), {fds, kHelloFds}, /*credentials=*/true, 0);
  if (n != static_cast<ssize_t>(sizeof(hello))) {
    return ErrnoError(n < 0 ? errno : EPROTO, "sending the unet hello failed");
  }
  return absl::OkStatus();
}

absl::Status RecvHello(int sock, absl::Time deadline, Hello* hello, Fd fds[kHelloFds],
                       pid_t* peer_pid) {
  for (;;) {
    int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) {
      return MakeError(absl::StatusCode::kDeadlineExceeded, ETIMEDOUT,
                       "the unet peer sent no hello in time",
                       "check that the peer is a zsock unet endpoint and is not stuck");
    }
    pollfd pfd{sock, POLLIN, 0};
    int rc = ::poll(&pfd, 1, static_cast<int>(left_ms));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return ErrnoError(errno, "poll during unet handshake failed");
    if (rc > 0) break;
  }
  size_t received = 0;
  bool complete = false;
  ssize_t n = RecvWithFds(sock, hello, sizeof(*hello), {fds, kHelloFds}, &received, peer_pid,
                          &complete, 0);
  if (n < 0) return ErrnoError(errno, "receiving the unet hello failed");
  if (n == 0) {
    return MakeError(absl::StatusCode::kUnavailable, ECONNRESET,
                     "the unet peer closed the connection during the handshake",
                     "check the peer's log: it may have rejected our parameters");
  }
  if (n != static_cast<ssize_t>(sizeof(*hello)) || *peer_pid <= 0) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO,
                     "malformed unet hello", "the peer is not a compatible zsock unet endpoint");
  }
  // The version before the fds: version 1 sent three.
  if (hello->magic != kSegmentMagic || hello->version != kVersion) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO,
                     absl::StrCat("unet hello has version ", hello->version, " (want ", kVersion, ")"),
                     "run the same zsock version on both sides");
  }
  if (received != kHelloFds || !complete) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO,
                     absl::StrCat("malformed unet hello: ", received, " fds (want ", kHelloFds, ")"),
                     "the peer is not a compatible zsock unet endpoint");
  }
  if (!ValidHelloParams(*hello)) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO,
                     "unet hello carries invalid segment parameters",
                     "the peer is not a compatible zsock unet endpoint");
  }
  return absl::OkStatus();
}

namespace {

// Creates and initialises our segment for `s`: rings empty, every buffer
// on a free ring.
absl::Status CreateOwnSegment(const Settings& s, UnetEndpoint::Parts* parts) {
  parts->rx_layout = SegmentLayout::For(s.ring_entries, s.buffer_size, s.nbuffers);
  const SegmentLayout& l = parts->rx_layout;
  auto rx_fd = CreateMemfd("zsock-unet-segment", l.total);
  if (!rx_fd.ok()) return rx_fd.status();
  auto rx = MapFd(rx_fd->get(), l.total, "a unet segment");
  if (!rx.ok()) return rx.status();
  auto* hdr = new (rx->get()) SegmentHeader{};
  hdr->magic = kSegmentMagic;
  hdr->version = kVersion;
  hdr->ring_entries = s.ring_entries;
  hdr->buffer_size = s.buffer_size;
  hdr->nbuffers = s.nbuffers;
  hdr->owner_pid = static_cast<uint32_t>(getpid());
  for (size_t ring : {l.user_ring, l.ctl_ring}) {
    auto* d = reinterpret_cast<Desc*>(rx->get() + ring);
    for (uint32_t i = 0; i < l.ring_entries; ++i) d[i].seq.store(i, std::memory_order_relaxed);
  }
  auto* uf = reinterpret_cast<FreeSlot*>(rx->get() + l.user_free);
  for (uint32_t i = 0; i < l.nbuffers; ++i) {  // full: seq = i + 1
    uf[i].buf = i;
    uf[i].seq.store(i + 1, std::memory_order_relaxed);
  }
  auto* cf = reinterpret_cast<FreeSlot*>(rx->get() + l.ctl_free);
  for (uint32_t i = 0; i < kControlBuffers; ++i) {
    cf[i].buf = l.nbuffers + i;
    cf[i].seq.store(i + 1, std::memory_order_relaxed);
  }
  std::atomic_thread_fence(std::memory_order_release);
  parts->rx_fd = std::move(*rx_fd);
  parts->rx = std::move(*rx);
  return absl::OkStatus();
}

// Maps what the peer's hello handed over (its segment, key table and CQ
// bell) after checking each memfd's size and seals, and that the bell and
// the segment's header are what the hello says.
absl::Status MapPeer(const Hello& theirs, Fd their_fds[kHelloFds], UnetEndpoint::Parts* parts) {
  parts->tx_layout = SegmentLayout::For(theirs.ring_entries, theirs.buffer_size, theirs.nbuffers);
  if (auto st = CheckPeerMemfd(their_fds[0].get(), parts->tx_layout.total, "segment"); !st.ok()) {
    return st;
  }
  size_t keys_size = sizeof(KeySlot) * theirs.key_slots;
  if (auto st = CheckPeerMemfd(their_fds[2].get(), keys_size, "key table"); !st.ok()) return st;
  auto tx = MapFd(their_fds[0].get(), parts->tx_layout.total, "the peer's unet segment");
  if (!tx.ok()) return tx.status();
  auto keys = MapFd(their_fds[2].get(), keys_size, "the peer's unet key table");
  if (!keys.ok()) return keys.status();
  if (auto st = CheckPeerMemfd(their_fds[3].get(), kBellBytes, "CQ bell"); !st.ok()) return st;
  auto bell = MapFd(their_fds[3].get(), kBellBytes, "the peer's unet CQ bell");
  if (!bell.ok()) return bell.status();
  auto* peer_bell = reinterpret_cast<const CqBell*>(bell->get());
  if (peer_bell->magic != kBellMagic || peer_bell->version != kVersion ||
      peer_bell->slots != kBellSlots) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO,
                     "the peer's unet CQ bell has a wrong magic, version or size",
                     "the peer is not a compatible zsock unet endpoint");
  }
  auto* peer_hdr = reinterpret_cast<SegmentHeader*>(tx->get());
  if (peer_hdr->magic != kSegmentMagic || peer_hdr->ring_entries != theirs.ring_entries ||
      peer_hdr->nbuffers != theirs.nbuffers || peer_hdr->buffer_size != theirs.buffer_size) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO,
                     "the peer's unet segment does not match its hello",
                     "the peer is not a compatible zsock unet endpoint");
  }
  parts->tx = std::move(*tx);
  parts->peer_event = std::move(their_fds[1]);
  parts->peer_bell = std::move(*bell);
  parts->peer_bell_slot = theirs.bell_slot;
  parts->peer_keys = std::move(*keys);
  parts->peer_key_slots = theirs.key_slots;
  return absl::OkStatus();
}

// Reads the peer's probe word with process_vm_readv: RDMA read/write go
// straight to the peer's memory only if that works (parts->cma). When it
// is denied, says why and what would allow it.
void ProbeCrossMemoryAttach(pid_t peer_pid, const Hello& theirs, UnetEndpoint::Parts* parts) {
  uint64_t seen = 0;
  iovec liov{&seen, sizeof(seen)};
  iovec riov{reinterpret_cast<void*>(theirs.probe_addr), sizeof(seen)};
  ssize_t n = ::process_vm_readv(peer_pid, &liov, 1, &riov, 1, 0);
  if (n == sizeof(seen) && seen == theirs.probe_value) {
    parts->cma = true;
    return;
  }
  int err = n < 0 ? errno : EIO;
  int scope = -1;  // -1: no Yama LSM
  if (FILE* f = std::fopen("/proc/sys/kernel/yama/ptrace_scope", "r")) {
    if (std::fscanf(f, "%d", &scope) != 1) scope = -1;
    std::fclose(f);
  }
  std::string note = absl::StrCat(
      "cross-memory attach to pid ", peer_pid, " denied (", std::strerror(err),
      scope >= 0 ? absl::StrCat("; kernel.yama.ptrace_scope=", scope) : std::string(),
      "): rdma read/write copy through the segment. For direct access run both "
      "processes as the same user (or give this one CAP_SYS_PTRACE) without a seccomp "
      "filter on process_vm_readv",
      scope > 0 ? ", and set kernel.yama.ptrace_scope=0" : "");
  ZS_LOG(kWarn, "%s", note);
  parts->info.notes.push_back(note);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Endpoint>> UnetFabric::Handshake(Fd sock, std::string local,
                                                                std::string peer,
                                                                CompletionQueue* cq,
                                                                absl::Time deadline) {
  auto ucq = CqOf<UnetCq>(cq, "unet");
  if (!ucq.ok()) return ucq.status();
  int on = 1;
  if (::setsockopt(sock.get(), SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)) != 0) {
    return ErrnoError(errno, "SO_PASSCRED on a unet connection failed");
  }
  UnetEndpoint::Parts parts;
  if (auto st = CreateOwnSegment(settings_, &parts); !st.ok()) return st;
  // The probe word lets the peer test cross-memory attach on us; it is set
  // once per process so concurrent handshakes agree on it.
  static const uint64_t probe_word =
      std::random_device{}() | (uint64_t{std::random_device{}()} << 32) | 1;
  const uint64_t probe = probe_word;
  parts.bell_slot = (*ucq)->AllocateSlot();
  absl::Cleanup release_slot = [&] { (*ucq)->ReleaseSlot(parts.bell_slot); };
  Hello hello{kSegmentMagic, kVersion, settings_.ring_entries, settings_.buffer_size,
              settings_.nbuffers, settings_.key_slots, parts.bell_slot, parts.rx_layout.total,
              reinterpret_cast<uint64_t>(&probe_word), probe};
  int fds[kHelloFds] = {parts.rx_fd.get(), (*ucq)->event_fd(), key_fd_.get(), (*ucq)->bell_fd()};
  if (auto st = SendHello(sock.get(), hello, fds); !st.ok()) return st;
  Hello theirs{};
  Fd their_fds[kHelloFds];
  pid_t peer_pid = 0;
  if (auto st = RecvHello(sock.get(), deadline, &theirs, their_fds, &peer_pid); !st.ok()) return st;
  parts.peer_pid = peer_pid;
  if (auto st = MapPeer(theirs, their_fds, &parts); !st.ok()) return st;
  parts.info.local_address = local;
  parts.info.peer_address = peer.empty() ? absl::StrCat("unet-pid-", peer_pid) : peer;
  parts.info.peer_on_host = true;
  parts.info.atomics = Support::kEmulated;
  parts.cma = false;
  if (settings_.cma) {
    ProbeCrossMemoryAttach(peer_pid, theirs, &parts);
  } else {
    parts.info.notes.push_back("unet_cma=off: rdma read/write copy through the segment");
  }
  parts.info.rdma_read = parts.cma ? Support::kNative : Support::kEmulated;
  parts.info.rdma_write = parts.info.rdma_read;
  int pidfd = PidfdOpen(peer_pid);
  if (pidfd >= 0) parts.pidfd.reset(pidfd);
  parts.sock = std::move(sock);
  std::move(release_slot).Cancel();  // the endpoint releases it (UnetCq::Detach)
  return std::unique_ptr<Endpoint>(new UnetEndpoint(this, *ucq, std::move(parts)));
}

}  // namespace zsock::unet
