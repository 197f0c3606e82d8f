// A hostile or broken unet peer: this test plays the peer by hand (its own
// handshake, its own segment) and writes malformed descriptors into the
// server's segment. Each must abort only that connection, with DataLoss on
// the operations waiting on it; the process and its other connections carry
// on. Random descriptors must never crash or hang the server.
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <functional>
#include <random>
#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/provider.h"
#include "gtest/gtest.h"
#include "providers/unet/segment.h"

namespace zsock::unet {
namespace {

constexpr uint32_t kRing = 64, kBufSize = 4096, kBuffers = 16;

// The fake peer: a connected socket plus the server's segment, mapped.
struct FakePeer {
  int sock = -1;
  uint8_t* own = nullptr;  // our segment (the server writes here)
  size_t own_size = 0;
  uint8_t* server = nullptr;  // the server's segment (we write here)
  KeySlot* server_keys = nullptr;  // the server's key table (peers can write it)
  KeySlot* own_keys = nullptr;     // our key table (the server reads it)
  SegmentLayout server_layout;
  size_t server_size = 0;
  int fds[4] = {-1, -1, -1, -1};  // the server's segment, eventfd, key table, bell
  CqBell* server_bell = nullptr;   // the server CQ's bell (peers can write it)
  uint32_t server_bell_slot = kNoBellSlot;

  ~FakePeer() {
    if (server_bell) munmap(server_bell, kBellBytes);
    if (own) munmap(own, own_size);
    if (server) munmap(server, server_size);
    if (server_keys) munmap(server_keys, sizeof(KeySlot) * 16);
    if (own_keys) munmap(own_keys, sizeof(KeySlot) * 16);
    for (int fd : fds) if (fd >= 0) close(fd);
    if (sock >= 0) close(sock);
  }

  Desc* UserSlot(uint32_t i) {
    return reinterpret_cast<Desc*>(server + server_layout.user_ring) + i;
  }
  Desc* ControlSlot(uint32_t i) {
    return reinterpret_cast<Desc*>(server + server_layout.ctl_ring) + i;
  }
};

int Memfd(size_t size) {
  int fd = static_cast<int>(syscall(SYS_memfd_create, "fake", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) return -1;
  fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
  return fd;
}

// Sends one message with fds attached (SCM_RIGHTS); the kernel adds our
// credentials, since the server's socket has SO_PASSCRED.
bool SendWithFds(int sock, const void* data, size_t len, const int* fds, size_t nfds) {
  iovec iov{const_cast<void*>(data), len};
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
  cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
  std::memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
  return sendmsg(sock, &msg, 0) == static_cast<ssize_t>(len);
}

// A bell for the fake peer's hello (the server maps it; we never sleep).
int FakeBell() {
  int fd = Memfd(kBellBytes);
  if (fd < 0) return -1;
  void* m = mmap(nullptr, kBellBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return -1;
  auto* bell = new (m) CqBell{};
  bell->magic = kBellMagic;
  bell->version = kVersion;
  bell->slots = kBellSlots;
  munmap(m, kBellBytes);
  return fd;
}

// Connects and sends our hello; the server's hello is read by Finish().
// `edit` may change the hello and the bell fd before they are sent.
bool Start(const std::string& address, FakePeer* p,
           const std::function<void(Hello*, int* bell_fd)>& edit = nullptr) {
  p->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::string name = "zsock-unet/" + address;
  std::memcpy(sa.sun_path + 1, name.data(), name.size());
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (connect(p->sock, reinterpret_cast<sockaddr*>(&sa), len) != 0) return false;
  int on = 1;
  setsockopt(p->sock, SOL_SOCKET, SO_PASSCRED, &on, sizeof(on));
  SegmentLayout l = SegmentLayout::For(kRing, kBufSize, kBuffers);
  p->own_size = l.total;
  int seg = Memfd(l.total);
  int keys = Memfd(sizeof(KeySlot) * 16);
  int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (seg < 0 || keys < 0 || efd < 0) return false;
  p->own_keys = static_cast<KeySlot*>(
      mmap(nullptr, sizeof(KeySlot) * 16, PROT_READ | PROT_WRITE, MAP_SHARED, keys, 0));
  p->own = static_cast<uint8_t*>(mmap(nullptr, l.total, PROT_READ | PROT_WRITE, MAP_SHARED, seg, 0));
  auto* hdr = new (p->own) SegmentHeader{};
  hdr->magic = kSegmentMagic;
  hdr->version = kVersion;
  hdr->ring_entries = kRing;
  hdr->buffer_size = kBufSize;
  hdr->nbuffers = kBuffers;
  for (size_t ring : {l.user_ring, l.ctl_ring}) {
    auto* d = reinterpret_cast<Desc*>(p->own + ring);
    for (uint32_t i = 0; i < kRing; ++i) d[i].seq.store(i);
  }
  auto* uf = reinterpret_cast<FreeSlot*>(p->own + l.user_free);
  for (uint32_t i = 0; i < kBuffers; ++i) { uf[i].buf = i; uf[i].seq.store(i + 1); }
  auto* cf = reinterpret_cast<FreeSlot*>(p->own + l.ctl_free);
  for (uint32_t i = 0; i < kControlBuffers; ++i) { cf[i].buf = kBuffers + i; cf[i].seq.store(i + 1); }
  static uint64_t probe = 0x1234;
  Hello hello{kSegmentMagic, kVersion, kRing, kBufSize, kBuffers, 16, kNoBellSlot, l.total,
              reinterpret_cast<uint64_t>(&probe), probe};
  int bell = FakeBell();
  if (bell < 0) return false;
  if (edit) edit(&hello, &bell);
  int fds[4] = {seg, efd, keys, bell};
  bool ok = SendWithFds(p->sock, &hello, sizeof(hello), fds, 4);
  close(seg);
  close(keys);
  close(efd);
  close(bell);
  return ok;
}

bool Finish(FakePeer* p) {
  Hello theirs{};
  iovec iov{&theirs, sizeof(theirs)};
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int)) + CMSG_SPACE(sizeof(ucred))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  if (recvmsg(p->sock, &msg, 0) != sizeof(theirs)) return false;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_type == SCM_RIGHTS) std::memcpy(p->fds, CMSG_DATA(cm), sizeof(p->fds));
  }
  p->server_layout = SegmentLayout::For(theirs.ring_entries, theirs.buffer_size, theirs.nbuffers);
  p->server_size = p->server_layout.total;
  void* m = mmap(nullptr, p->server_size, PROT_READ | PROT_WRITE, MAP_SHARED, p->fds[0], 0);
  if (m == MAP_FAILED) return false;
  p->server = static_cast<uint8_t*>(m);
  // The server's key table: one page is plenty for the slots used here.
  m = mmap(nullptr, sizeof(KeySlot) * 16, PROT_READ | PROT_WRITE, MAP_SHARED, p->fds[2], 0);
  if (m == MAP_FAILED) return false;
  p->server_keys = static_cast<KeySlot*>(m);
  m = mmap(nullptr, kBellBytes, PROT_READ | PROT_WRITE, MAP_SHARED, p->fds[3], 0);
  if (m == MAP_FAILED) return false;
  p->server_bell = static_cast<CqBell*>(m);
  p->server_bell_slot = theirs.bell_slot;
  return true;
}

// Sends a shared-segment announcement (with a memfd of `fd_size` bytes).
void Announce(FakePeer* p, uint32_t id, uint64_t base, uint64_t size, size_t fd_size) {
  int fd = Memfd(fd_size);
  ShmAnnounce a{kShmAnnounce, id, base, size};
  SendWithFds(p->sock, &a, sizeof(a), &fd, 1);
  close(fd);
}

class HostilePeer : public ::testing::Test {
 protected:
  void SetUp() override {
    auto fabric = Fabric::Open("unet");
    ASSERT_TRUE(fabric.ok()) << fabric.status();
    fabric_ = std::move(*fabric);
    auto cq = fabric_->CreateCq();
    ASSERT_TRUE(cq.ok());
    cq_ = std::move(*cq);
    auto listener = fabric_->Listen("");
    ASSERT_TRUE(listener.ok());
    listener_ = std::move(*listener);
  }

  // Connects a fake peer, lets `corrupt` write into the server's segment,
  // and returns the status of a receive posted on the server endpoint.
  absl::Status Attack(const std::function<void(FakePeer*)>& corrupt) {
    FakePeer peer;
    if (!Start(listener_->address(), &peer)) return absl::InternalError("fake connect failed");
    auto ep = listener_->Accept(cq_.get(), absl::Seconds(10));
    if (!ep.ok()) return ep.status();
    if (!Finish(&peer)) return absl::InternalError("fake handshake failed");
    std::vector<uint8_t> buf(1 << 20);
    if (auto st = (*ep)->PostRecv(buf.data(), buf.size(), nullptr, 7); !st.ok()) return st;
    corrupt(&peer);
    Completion c;
    auto n = cq_->Wait(std::span<Completion>(&c, 1), absl::Seconds(10));
    if (!n.ok()) return n.status();
    if (*n == 0) return absl::DeadlineExceededError("the server neither failed nor delivered");
    // A later operation on the aborted endpoint fails at once.
    if (!c.status.ok()) {
      EXPECT_FALSE((*ep)->Send(buf.data(), 1, nullptr, 8).ok());
    }
    return c.status;
  }

  // Connects a fake peer and returns the server's endpoint for it.
  std::unique_ptr<Endpoint> Connect(FakePeer* peer) {
    if (!Start(listener_->address(), peer)) return nullptr;
    auto ep = listener_->Accept(cq_.get(), absl::Seconds(10));
    if (!ep.ok() || !Finish(peer)) return nullptr;
    return std::move(*ep);
  }

  void PollFor(absl::Duration d) {
    absl::Time end = absl::Now() + d;
    Completion c[8];
    while (absl::Now() < end) cq_->Wait(c, absl::Milliseconds(5)).IgnoreError();
  }

  std::unique_ptr<Fabric> fabric_;
  std::unique_ptr<CompletionQueue> cq_;
  std::unique_ptr<Listener> listener_;
};

void Publish(Desc* d, uint64_t seq) { d->seq.store(seq, std::memory_order_release); }

TEST_F(HostilePeer, MalformedDescriptorsAbortOnlyThatConnection) {
  struct Case {
    const char* name;
    std::function<void(Desc*)> fill;
  };
  const std::vector<Case> cases = {
      {"wrong type in user ring", [](Desc* d) { d->type = kControlMsg; d->flags = kFirst | kLast | kInlineData; d->len = 4; d->total = 4; }},
      {"buffer index out of range", [](Desc* d) { d->type = kUserMsg; d->flags = kFirst | kLast; d->buf = 100000; d->len = 10; d->total = 10; }},
      {"control buffer in user ring", [](Desc* d) { d->type = kUserMsg; d->flags = kFirst | kLast; d->buf = 64; d->len = 10; d->total = 10; }},
      {"inline longer than a descriptor", [](Desc* d) { d->type = kUserMsg; d->flags = kFirst | kLast | kInlineData; d->len = 500; d->total = 500; }},
      {"chunk larger than a buffer", [](Desc* d) { d->type = kUserMsg; d->flags = kFirst | kLast; d->buf = 0; d->len = 1 << 30; d->total = 1 << 30; }},
      {"continuation without a first chunk", [](Desc* d) { d->type = kUserMsg; d->flags = kLast; d->buf = 0; d->len = 10; d->total = 10; }},
      {"message larger than the maximum", [](Desc* d) { d->type = kUserMsg; d->flags = kFirst; d->buf = 0; d->len = 10; d->total = uint64_t{1} << 40; }},
      {"chunk longer than announced", [](Desc* d) { d->type = kUserMsg; d->flags = kFirst | kLast; d->buf = 0; d->len = 100; d->total = 10; }},
      {"message shorter than announced", [](Desc* d) { d->type = kUserMsg; d->flags = kFirst | kLast; d->buf = 0; d->len = 10; d->total = 100; }},
  };
  for (const auto& c : cases) {
    absl::Status st = Attack([&](FakePeer* p) {
      Desc* d = p->UserSlot(0);
      c.fill(d);
      Publish(d, 1);
    });
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << c.name << ": " << st;
    EXPECT_NE(st.message().find("malformed unet descriptor"), absl::string_view::npos) << c.name;
  }
  // A bad control descriptor aborts the connection too.
  absl::Status st = Attack([](FakePeer* p) {
    Desc* d = p->ControlSlot(0);
    d->type = kUserMsg;
    d->flags = kFirst | kLast | kInlineData;
    d->len = 4;
    d->total = 4;
    Publish(d, 1);
  });
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
}

TEST_F(HostilePeer, RandomDescriptorsNeverCrashOrHang) {
  std::mt19937_64 rng(12345);
  int aborted = 0;
  for (int i = 0; i < 200; ++i) {
    absl::Status st = Attack([&](FakePeer* p) {
      Desc* d = p->UserSlot(0);
      auto* raw = reinterpret_cast<uint8_t*>(d) + sizeof(d->seq);
      for (size_t k = 0; k < sizeof(Desc) - sizeof(d->seq); ++k) raw[k] = static_cast<uint8_t>(rng());
      if (i % 2 == 0) d->type = kUserMsg;  // get past the first check half the time
      Publish(d, 1);
    });
    ASSERT_NE(st.code(), absl::StatusCode::kDeadlineExceeded) << "iteration " << i;
    if (!st.ok()) {
      ++aborted;
      EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
    }
  }
  EXPECT_GT(aborted, 150);
}

TEST_F(HostilePeer, OtherConnectionsCarryOn) {
  // Abort one connection, then use a healthy one on the same fabric and CQ.
  absl::Status st = Attack([](FakePeer* p) {
    Desc* d = p->UserSlot(0);
    d->type = kUserMsg;
    d->flags = kFirst | kLast;
    d->buf = 99999;
    d->len = 1;
    d->total = 1;
    Publish(d, 1);
  });
  ASSERT_EQ(st.code(), absl::StatusCode::kDataLoss);
  auto other_fabric = Fabric::Open("unet");
  ASSERT_TRUE(other_fabric.ok());
  auto other_cq = (*other_fabric)->CreateCq();
  ASSERT_TRUE(other_cq.ok());
  absl::StatusOr<std::unique_ptr<Endpoint>> client;
  std::thread t([&] {
    client = (*other_fabric)->Connect(listener_->address(), other_cq->get(), absl::Seconds(10));
  });
  auto server = listener_->Accept(cq_.get(), absl::Seconds(10));
  t.join();
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(client.ok()) << client.status();
  char in[16] = {};
  ASSERT_TRUE((*server)->PostRecv(in, sizeof(in), nullptr, 1).ok());
  ASSERT_TRUE((*client)->Send("still fine", 10, nullptr, 2).ok());
  Completion c;
  auto n = cq_->Wait(std::span<Completion>(&c, 1), absl::Seconds(10));
  ASSERT_TRUE(n.ok());
  ASSERT_EQ(*n, 1u);
  EXPECT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(std::string(in, c.length), "still fine");
}

// The peer rewrites a descriptor while the server reads it: whatever the
// server sees, it must not write outside the posted buffer or read outside
// its segment (ASan and the guard bytes catch both).
TEST_F(HostilePeer, DescriptorRewrittenWhileReadIsHarmless) {
  for (int round = 0; round < 50; ++round) {
    FakePeer peer;
    auto ep = Connect(&peer);
    ASSERT_NE(ep, nullptr);
    std::vector<uint8_t> area(3 * 4096, 0x77);
    uint8_t* buf = area.data() + 4096;
    ASSERT_TRUE(ep->PostRecv(buf, 4096, nullptr, 1).ok());
    Desc* d = peer.UserSlot(0);
    d->type = kUserMsg;
    d->flags = kFirst | kLast;
    d->buf = 0;
    d->len = 100;
    d->total = 100;
    std::atomic<bool> stop{false};
    std::thread flipper([&] {
      std::mt19937 rng(round);
      while (!stop.load()) {
        d->len = (rng() & 1) ? 100 : 0xffffff;
        d->total = (rng() & 1) ? 100 : (uint64_t{1} << 20);
        d->buf = (rng() & 1) ? 0 : 0xfffff;
        d->flags = static_cast<uint8_t>(rng());
      }
    });
    Publish(d, 1);
    Completion c;
    cq_->Wait(std::span<Completion>(&c, 1), absl::Milliseconds(50)).IgnoreError();
    stop.store(true);
    flipper.join();
    for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(area[i], 0x77) << "underrun at " << i;
    for (size_t i = 2 * 4096; i < area.size(); ++i) ASSERT_EQ(area[i], 0x77) << "overrun at " << i;
  }
}

// Random descriptors in the control ring abort the connection, nothing else.
TEST_F(HostilePeer, RandomControlDescriptorsNeverCrash) {
  std::mt19937_64 rng(777);
  for (int i = 0; i < 100; ++i) {
    FakePeer peer;
    auto ep = Connect(&peer);
    ASSERT_NE(ep, nullptr);
    std::vector<uint8_t> buf(4096);
    ASSERT_TRUE(ep->PostRecv(buf.data(), buf.size(), nullptr, 1).ok());
    Desc* d = peer.ControlSlot(0);
    auto* raw = reinterpret_cast<uint8_t*>(d) + sizeof(d->seq);
    for (size_t k = 0; k < sizeof(Desc) - sizeof(d->seq); ++k) raw[k] = static_cast<uint8_t>(rng());
    d->type = kControlMsg;
    Publish(d, 1);
    PollFor(absl::Milliseconds(5));
  }
}

// The peer rewrites our key table (it is mapped writable so that peers can
// count themselves in) to widen a registration, then asks for an emulated
// write outside the real registration. The server decides from its private
// record: the write is refused and the victim word is untouched.
TEST_F(HostilePeer, TamperedKeyTableGrantsNothing) {
  alignas(64) static uint64_t victim = 0x1111;
  alignas(64) static uint8_t region[64] = {};
  auto mr = fabric_->RegisterMemory(region, sizeof(region), kAccessAll);
  ASSERT_TRUE(mr.ok());
  RemoteKey key = (*mr)->remote_key();
  uint32_t slot;
  std::memcpy(&slot, key.blob.data(), 4);
  FakePeer peer;
  auto ep = Connect(&peer);
  ASSERT_NE(ep, nullptr);
  ASSERT_LT(slot, 16u);
  KeySlot* e = &peer.server_keys[slot];
  e->addr = 0;
  e->len = ~uint64_t{0} >> 1;  // "everything"
  e->access = kAccessAll;
  // An emulated write request (docs/provider-interface.md, version 1).
  std::string k = key.Serialize();
  uint64_t value = 0xdeadbeef;
  std::vector<uint8_t> msg(48 + k.size() + 8);
  msg[0] = 1;  // request
  msg[1] = static_cast<uint8_t>(OpType::kWrite);
  uint16_t key_len = static_cast<uint16_t>(k.size());
  std::memcpy(&msg[2], &key_len, 2);
  uint64_t id = 1, addr = reinterpret_cast<uint64_t>(&victim), len = 8;
  std::memcpy(&msg[8], &id, 8);
  std::memcpy(&msg[16], &addr, 8);
  std::memcpy(&msg[24], &len, 8);
  std::memcpy(&msg[48], k.data(), k.size());
  std::memcpy(&msg[48 + k.size()], &value, 8);
  ASSERT_LE(msg.size(), kInline);
  Desc* d = peer.ControlSlot(0);
  d->type = kControlMsg;
  d->flags = kFirst | kLast | kInlineData;
  d->len = static_cast<uint32_t>(msg.size());
  d->total = msg.size();
  std::memcpy(d->data, msg.data(), msg.size());
  Publish(d, 1);
  PollFor(absl::Milliseconds(200));
  EXPECT_EQ(victim, 0x1111u) << "the server wrote where no registration allows";
  // The server answered with a refusal in our control ring.
  SegmentLayout l = SegmentLayout::For(kRing, kBufSize, kBuffers);
  Desc* resp = reinterpret_cast<Desc*>(peer.own + l.ctl_ring);
  ASSERT_EQ(resp->seq.load(), 1u) << "no answer from the server";
  ASSERT_GE(resp->len, 8u);
  // With its error text the answer is longer than a descriptor: it is in a
  // buffer of our segment.
  const uint8_t* body = (resp->flags & kInlineData)
                            ? resp->data
                            : peer.own + l.buffers + size_t{resp->buf} * l.buffer_size;
  uint32_t err;
  std::memcpy(&err, body + 4, 4);
  EXPECT_EQ(err, static_cast<uint32_t>(EACCES));
}

// Malformed shared-segment announcements (too small, not whole pages,
// duplicates) are ignored: atomics on them fall back to emulation instead
// of touching memory outside the segment.
TEST_F(HostilePeer, MalformedAnnouncementsAreIgnored) {
  FakePeer peer;
  auto ep = Connect(&peer);
  ASSERT_NE(ep, nullptr);
  // Our (fake) key table: slot 0 claims a huge registration in segment 5.
  KeySlot* e = &peer.own_keys[0];
  e->addr = 0x10000;
  e->len = uint64_t{1} << 40;
  e->access = kAccessAll;
  e->shm_id = 5;
  e->gen.store(1);
  Announce(&peer, 5, 0x10000, 8, 4096);      // not a whole page
  Announce(&peer, 6, 0x10000, 4, 4096);      // smaller than a word
  RemoteKey key;
  key.addr = 0x10000;
  key.length = uint64_t{1} << 40;
  key.access = kAccessAll;
  key.blob.resize(8);
  uint32_t slot = 0, gen = 1;
  std::memcpy(key.blob.data(), &slot, 4);
  std::memcpy(key.blob.data() + 4, &gen, 4);
  uint64_t old = 0;
  // Far outside any real segment: must not be executed as a CPU atomic,
  // whichever of the two bad announcements the key names.
  for (uint32_t id : {5u, 6u}) {
    e->shm_id = id;
    absl::Status st = ep->FetchAdd(&old, 0x10000 + (uint64_t{1} << 30), key, 1, 9);
    EXPECT_TRUE(st.ok()) << st;  // accepted, then emulated (the fake never answers)
    PollFor(absl::Milliseconds(30));
  }
  // A good announcement, then a duplicate of it: the first one is used.
  Announce(&peer, 7, 0x20000, 4096, 4096);
  Announce(&peer, 7, 0x20000, 1 << 20, 1 << 20);
  e->shm_id = 7;
  e->addr = 0x20000;
  e->len = 4096;
  ASSERT_TRUE(ep->FetchAdd(&old, 0x20000 + 64, key, 5, 10).ok());
  Completion c;
  auto n = cq_->Wait(std::span<Completion>(&c, 1), absl::Seconds(5));
  ASSERT_TRUE(n.ok() && *n == 1) << "a CPU atomic on an announced segment completes at once";
  EXPECT_EQ(c.context, 10u);
  EXPECT_TRUE(c.status.ok()) << c.status;
}

// A hello whose CQ bell is too small, not a bell, or whose bell slot is out
// of range is refused at the handshake, with the reason.
TEST_F(HostilePeer, HelloWithABadBellIsRefused) {
  struct Case {
    const char* what;
    std::function<void(Hello*, int*)> edit;
    const char* error;
  };
  const Case cases[] = {
      {"bell too small", [](Hello*, int* bell) { close(*bell); *bell = Memfd(64); }, "CQ bell"},
      {"not a bell",
       [](Hello*, int* bell) { close(*bell); *bell = Memfd(kBellBytes); },
       "wrong magic"},
      {"slot out of range", [](Hello* h, int*) { h->bell_slot = kBellSlots; },
       "invalid segment parameters"},
  };
  for (const Case& c : cases) {
    FakePeer peer;
    ASSERT_TRUE(Start(listener_->address(), &peer, c.edit)) << c.what;
    auto ep = listener_->Accept(cq_.get(), absl::Seconds(10));
    ASSERT_FALSE(ep.ok()) << c.what;
    EXPECT_EQ(ep.status().code(), absl::StatusCode::kFailedPrecondition) << c.what;
    EXPECT_NE(ep.status().message().find(c.error), std::string::npos)
        << c.what << ": " << ep.status();
  }
}

// With more endpoints than it sweeps, the server's CQ reads its bell. A peer
// may set any bits (all of them, here) and the armed flag: that costs
// looks at endpoints with nothing to do, and no message is lost or
// misdelivered: a fake peer that publishes and rings its own bit is heard.
TEST_F(HostilePeer, ABellFullOfBitsIsHarmless) {
  constexpr int kPeers = 24;  // above the CQ's sweep limit
  std::vector<std::unique_ptr<FakePeer>> peers;
  std::vector<std::unique_ptr<Endpoint>> eps;
  for (int i = 0; i < kPeers; ++i) {
    peers.push_back(std::make_unique<FakePeer>());
    eps.push_back(Connect(peers.back().get()));
    ASSERT_NE(eps.back(), nullptr);
  }
  std::vector<std::array<char, 16>> in(kPeers);
  for (int i = 0; i < kPeers; ++i) {
    ASSERT_TRUE(eps[i]->PostRecv(in[i].data(), in[i].size(), nullptr, 100 + i).ok());
  }
  std::atomic<bool> stop{false};
  std::thread noise([&] {
    CqBell* bell = peers[0]->server_bell;
    while (!stop.load()) {
      for (auto& w : bell->ready) w.store(~uint64_t{0});
      bell->armed.store(0xffffffff);
    }
  });
  PollFor(absl::Milliseconds(20));
  // Peer 13 sends "hello 13" properly: publish, then ring its bit.
  FakePeer& p = *peers[13];
  Desc* d = p.UserSlot(0);
  d->type = kUserMsg;
  d->flags = kFirst | kLast | kInlineData;
  d->len = 8;
  d->total = 8;
  std::memcpy(d->data, "hello 13", 8);
  Publish(d, 1);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  RingBell(p.server_bell, p.server_bell_slot);
  Completion c;
  auto n = cq_->Wait(std::span<Completion>(&c, 1), absl::Seconds(10));
  stop.store(true);
  noise.join();
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_EQ(*n, 1u) << "the rung endpoint's message was not delivered";
  EXPECT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(c.context, 113u);
  EXPECT_EQ(c.endpoint, eps[13].get());
  EXPECT_EQ(std::string(in[13].data(), c.length), "hello 13");
  // Nothing else arrived, however many bits were set.
  n = cq_->Wait(std::span<Completion>(&c, 1), absl::Milliseconds(20));
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u);
}

}  // namespace
}  // namespace zsock::unet
