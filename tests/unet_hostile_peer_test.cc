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

#include <cstring>
#include <functional>
#include <random>
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
  SegmentLayout server_layout;
  size_t server_size = 0;
  int fds[3] = {-1, -1, -1};

  ~FakePeer() {
    if (own) munmap(own, own_size);
    if (server) munmap(server, server_size);
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

// Connects and sends our hello; the server's hello is read by Finish().
bool Start(const std::string& address, FakePeer* p) {
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
  Hello hello{kSegmentMagic, kVersion, kRing, kBufSize, kBuffers, 16, 0, l.total,
              reinterpret_cast<uint64_t>(&probe), probe};
  int fds[3] = {seg, efd, keys};
  iovec iov{&hello, sizeof(hello)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(fds))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(fds));
  std::memcpy(CMSG_DATA(cm), fds, sizeof(fds));
  bool ok = sendmsg(p->sock, &msg, 0) == sizeof(hello);  // kernel adds our credentials
  close(seg);
  close(keys);
  close(efd);
  return ok;
}

bool Finish(FakePeer* p) {
  Hello theirs{};
  iovec iov{&theirs, sizeof(theirs)};
  alignas(cmsghdr) char control[CMSG_SPACE(3 * sizeof(int)) + CMSG_SPACE(sizeof(ucred))] = {};
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
  return true;
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

}  // namespace
}  // namespace zsock::unet
