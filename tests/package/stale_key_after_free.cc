// stale_key_after_free: the registration cache's invalidation works in a
// program built outside Bazel that links libzsock.so.1 as an ordinary
// shared-library dependency (find_package(zsock), zsock::zsock).
//
//   stale_key_after_free [CONFIG]    CONFIG: "unet" (default), "ofi:tcp;ofi_rxm", ...
//
// libzsock.so.1 carries the memory-release interposers (free, munmap, ...;
// core/memhooks.h). They are in effect only if the dynamic linker finds them
// before libc's, which it does for a library the executable links. For two
// buffers from malloc(), one from the heap (64 KiB) and one with its own
// mapping (4 MiB), each registered through Fabric::rcache(), this checks:
//
//  while the buffer lives: the target's own check of the key
//    (Fabric::AccessLocal, what core emulation runs for a peer's access)
//    passes, and a peer's RDMA write with the key lands in the buffer;
//  after free(): the cache counted an invalidation, AccessLocal refuses the
//    key, a new Get() of a fresh allocation is a miss with another key
//    (the cache does not hand out the stale registration), and the peer's
//    write with the old key is refused (conformance's
//    RegistrationCacheHitsEvictsAndInvalidates does the same after munmap).
//
// The local checks decide: after the 4 MiB free() the pages are gone, so a
// peer's write might fail for that reason alone. For the heap buffer, whose
// pages stay mapped, the peer's refusal is itself proof.
//
// The process forks first (before any fabric exists): the child is the
// peer, one connection per case (a refused access may end a connection);
// it reports each verdict through a pipe.
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/memhooks.h"
#include "core/provider.h"
#include "core/rcache.h"

namespace {

using zsock::Completion;
using zsock::CompletionQueue;
using zsock::Endpoint;
using zsock::Fabric;
using zsock::MemoryRegion;
using zsock::RemoteKey;

constexpr absl::Duration kTimeout = absl::Seconds(30);
constexpr size_t kMsgMax = 4096;
constexpr size_t kProbeOffset = 4096;  // where the peer writes: away from malloc's header
constexpr size_t kProbeLen = 64;
constexpr uint32_t kAccess = zsock::kLocalRead | zsock::kLocalWrite | zsock::kRemoteRead |
                             zsock::kRemoteWrite;

struct Case {
  const char* name;
  size_t size;
  bool heap;  // expected to come from the [heap] (brk) rather than its own mapping
};
constexpr Case kCases[] = {{"heap", 64 * 1024, true}, {"mmap", 4 * 1024 * 1024, false}};

std::string g_config;
pid_t g_child = 0;

[[noreturn]] void Fail(const std::string& why) {
  std::fprintf(stderr, "stale_key_after_free: %s: FAILED: %s\n", g_config.c_str(), why.c_str());
  std::fflush(nullptr);
  if (g_child > 0) {
    kill(g_child, SIGTERM);
    waitpid(g_child, nullptr, 0);
  }
  _exit(1);
}
void Check(const std::string& what, const absl::Status& st) {
  if (!st.ok()) Fail(what + ": " + st.ToString());
}
template <typename T>
T Check(const std::string& what, absl::StatusOr<T> v) {
  if (!v.ok()) Fail(what + ": " + v.status().ToString());
  return std::move(*v);
}

void OnAlarm(int) {
  static const char msg[] = "stale_key_after_free: timed out after 60 s (a hang)\n";
  (void)!write(2, msg, sizeof(msg) - 1);
  _exit(2);
}

uint8_t Probe(size_t i) { return static_cast<uint8_t>(0xa5 ^ (i * 37)); }

// The /proc/self/maps name of the mapping holding `p` ("[heap]", "" for an
// anonymous mapping).
std::string MappingOf(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    std::istringstream in(line);
    std::string range, perms, offset, dev, inode, name;
    in >> range >> perms >> offset >> dev >> inode >> name;
    const size_t dash = range.find('-');
    const uintptr_t lo = std::stoull(range.substr(0, dash), nullptr, 16);
    const uintptr_t hi = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (a >= lo && a < hi) return name;
  }
  return "(unmapped)";
}

// A connection with its own CQ and two registered message buffers; one
// operation at a time.
class Conn {
 public:
  Conn(Fabric* fabric, std::unique_ptr<CompletionQueue> cq, std::unique_ptr<Endpoint> ep)
      : cq_(std::move(cq)), ep_(std::move(ep)), send_(kMsgMax), recv_(kMsgMax) {
    send_mr_ = Check("RegisterMemory", fabric->RegisterMemory(send_.data(), kMsgMax, kAccess));
    recv_mr_ = Check("RegisterMemory", fabric->RegisterMemory(recv_.data(), kMsgMax, kAccess));
  }
  ~Conn() { ep_->Close(); }

  Endpoint* ep() const { return ep_.get(); }

  // Waits for operation `context`: its completion's status.
  absl::Status Await(uint64_t context) {
    for (;;) {
      Completion c;
      auto n = cq_->Wait(std::span<Completion>(&c, 1), kTimeout);
      if (!n.ok()) return n.status();
      if (*n == 0) return absl::DeadlineExceededError("no completion within 30 s");
      if (c.context == context) {
        last_length_ = c.length;
        return c.status;
      }
    }
  }
  // Drives progress (serving accesses the provider emulates through us).
  void Progress(absl::Duration d) {
    Completion c;
    (void)cq_->Wait(std::span<Completion>(&c, 1), d);
  }
  absl::Status SendMsg(const std::string& msg) {
    if (msg.size() > kMsgMax) return absl::InvalidArgumentError("message too long");
    std::memcpy(send_.data(), msg.data(), msg.size());
    if (absl::Status st = ep_->Send(send_.data(), msg.size(), send_mr_.get(), ++ctx_); !st.ok()) {
      return st;
    }
    return Await(ctx_);
  }
  absl::StatusOr<std::string> RecvMsg() {
    if (absl::Status st = ep_->PostRecv(recv_.data(), kMsgMax, recv_mr_.get(), ++ctx_); !st.ok()) {
      return st;
    }
    if (absl::Status st = Await(ctx_); !st.ok()) return st;
    return std::string(reinterpret_cast<const char*>(recv_.data()), last_length_);
  }
  uint64_t NextContext() { return ++ctx_; }

 private:
  std::unique_ptr<CompletionQueue> cq_;
  std::unique_ptr<Endpoint> ep_;
  std::vector<uint8_t> send_, recv_;
  std::unique_ptr<MemoryRegion> send_mr_, recv_mr_;
  size_t last_length_ = 0;
  uint64_t ctx_ = 0;
};

// AccessLocal with `key` on the probe range at `addr`: OK (and the memory
// was seen) or the refusal.
absl::Status TryAccess(Fabric* fabric, const RemoteKey& key, uint64_t addr, bool* touched) {
  *touched = false;
  return fabric->AccessLocal(key, addr, kProbeLen, zsock::kRemoteWrite,
                             [&](void*) { *touched = true; });
}

// ---- the target (parent): registers, frees, checks ----

// Accepts the peer's next connection, on a CQ of its own. Waits in short
// slices, so that a peer that died is noticed at once.
std::unique_ptr<Conn> AcceptConn(Fabric* fabric, zsock::Listener* listener) {
  auto cq = Check("CreateCq", fabric->CreateCq());
  for (;;) {
    auto accepted = listener->Accept(cq.get(), absl::Milliseconds(200));
    if (accepted.ok()) return std::make_unique<Conn>(fabric, std::move(cq), std::move(*accepted));
    if (accepted.status().code() != absl::StatusCode::kDeadlineExceeded) {
      Check("Accept", accepted.status());
    }
    if (waitpid(g_child, nullptr, WNOHANG) == g_child) {
      g_child = 0;
      Fail("the peer exited before connecting");
    }
  }
}

void RunCase(Fabric* fabric, zsock::Listener* listener, const Case& c, int verdicts) {
  const std::string name = c.name;
  std::unique_ptr<Conn> conn = AcceptConn(fabric, listener);
  zsock::RegistrationCache& cache = fabric->rcache();
  auto* buf = static_cast<uint8_t*>(std::malloc(c.size));
  if (buf == nullptr) Fail("malloc failed");
  std::memset(buf, 0, c.size);
  const std::string where = MappingOf(buf);
  if ((where == "[heap]") != c.heap) {
    Fail(absl::StrCat(name, ": malloc(", c.size, ") came from ",
                      where.empty() ? "an anonymous mapping" : where,
                      ", not from ", c.heap ? "the heap" : "a mapping of its own",
                      " (another allocator?): the case would not test what it says"));
  }
  RemoteKey key;
  {
    auto region = Check(name + ": rcache().Get", cache.Get(buf, c.size, kAccess));
    key = region->remote_key();
  }  // the cache keeps the registration: an unused, cached entry
  // The key covers the page-aligned range the cache registered: the probe
  // address is sent beside it.
  const uint64_t probe = reinterpret_cast<uint64_t>(buf) + kProbeOffset;
  bool touched = false;
  Check(name + ": AccessLocal while the buffer lives", TryAccess(fabric, key, probe, &touched));
  if (!touched) Fail(name + ": AccessLocal returned OK without running its function");
  Check(name + ": send key", conn->SendMsg(key.Serialize()));
  Check(name + ": send address", conn->SendMsg(absl::StrCat(probe)));
  std::string msg = Check(name + ": receive write notice", conn->RecvMsg());
  if (msg != "wrote") Fail(name + ": peer: " + msg);
  for (size_t i = 0; i < kProbeLen; ++i) {
    if (buf[kProbeOffset + i] != Probe(i)) {
      Fail(absl::StrCat(name, ": the peer's write with the live key did not land (byte ", i,
                        ")"));
    }
  }
  const zsock::RcacheStats before = cache.stats();
  const auto old_addr = reinterpret_cast<uintptr_t>(buf);

  std::free(buf);  // the interposer in libzsock.so.1 must revoke the key now

  const zsock::RcacheStats after = cache.stats();
  if (after.invalidations == before.invalidations) {
    Fail(name + ": free() invalidated nothing in the registration cache (hooks not in "
         "effect?)");
  }
  absl::Status stale = TryAccess(fabric, key, probe, &touched);
  if (stale.ok() || touched) Fail(name + ": AccessLocal accepted the key after free()");
  // A fresh allocation (often at the same address) must be registered anew.
  auto* again = static_cast<uint8_t*>(std::malloc(c.size));
  if (again == nullptr) Fail("malloc failed");
  const uint64_t misses = cache.stats().misses;
  RemoteKey fresh;
  {
    auto region = Check(name + ": rcache().Get again", cache.Get(again, c.size, kAccess));
    fresh = region->remote_key();
  }
  if (cache.stats().misses != misses + 1) {
    Fail(name + ": the cache served a registration of the freed buffer again");
  }
  const uint64_t fresh_probe = reinterpret_cast<uint64_t>(again) + kProbeOffset;
  Check(name + ": AccessLocal with the new key", TryAccess(fabric, fresh, fresh_probe, &touched));
  if (TryAccess(fabric, key, probe, &touched).ok()) {
    Fail(name + ": the old key works again after re-registration");
  }
  std::printf("stale_key_after_free: %s: %zu bytes (%s): live key OK; after free(): "
              "%llu invalidation(s), AccessLocal refused (%s), new Get a miss%s\n",
              c.name, c.size, where.empty() ? "own mapping" : where.c_str(),
              static_cast<unsigned long long>(after.invalidations - before.invalidations),
              std::string(absl::StatusCodeToString(stale.code())).c_str(),
              reinterpret_cast<uintptr_t>(again) == old_addr ? " at the same address" : "");
  std::fflush(stdout);

  // The peer now writes with the old key; we keep progressing (an
  // emulated write is refused by our AccessLocal) until its verdict.
  Check(name + ": send freed notice", conn->SendMsg("freed"));
  char verdict = 0;
  for (;;) {
    pollfd p{verdicts, POLLIN, 0};
    if (poll(&p, 1, 0) == 1) {
      if (read(verdicts, &verdict, 1) != 1) Fail(name + ": the peer died");
      break;
    }
    conn->Progress(absl::Milliseconds(10));
  }
  if (verdict != 'R') Fail(name + ": the peer's RDMA write with the stale key was accepted");
  std::printf("stale_key_after_free: %s: the peer's RDMA write with the stale key was "
              "refused\n", c.name);
  std::fflush(stdout);
  std::free(again);
}

// ---- the peer (child): writes with the key, before and after the free ----

int RunPeer(const std::string& address, int verdicts) {
  auto fabric = Check("peer: Fabric::Open", Fabric::Open(g_config));
  std::vector<uint8_t> src(kProbeLen);
  for (size_t i = 0; i < kProbeLen; ++i) src[i] = Probe(i);
  auto src_mr = Check("peer: RegisterMemory", fabric->RegisterMemory(src.data(), kProbeLen,
                                                                     zsock::kLocalRead));
  for (const Case& c : kCases) {
    const std::string name = std::string("peer: ") + c.name;
    auto cq = Check(name + ": CreateCq", fabric->CreateCq());
    auto ep = Check(name + ": Connect", fabric->Connect(address, cq.get(), kTimeout));
    Conn conn(fabric.get(), std::move(cq), std::move(ep));
    RemoteKey key = Check(name + ": key", RemoteKey::Parse(Check(name + ": recv", conn.RecvMsg())));
    const std::string addr_text = Check(name + ": recv", conn.RecvMsg());
    uint64_t addr = 0;
    if (!absl::SimpleAtoi(addr_text, &addr)) return 1;
    uint64_t ctx = conn.NextContext();
    absl::Status st = conn.ep()->Write(src.data(), kProbeLen, src_mr.get(),
                                       addr, key, ctx);
    if (st.ok()) st = conn.Await(ctx);
    Check(name + ": send", conn.SendMsg(st.ok() ? "wrote" : "write failed: " + st.ToString()));
    if (!st.ok()) return 1;
    std::string msg = Check(name + ": recv", conn.RecvMsg());
    if (msg != "freed") return 1;
    ctx = conn.NextContext();
    st = conn.ep()->Write(src.data(), kProbeLen, src_mr.get(), addr, key, ctx);
    if (st.ok()) st = conn.Await(ctx);  // refused at the call, or in the completion
    const char verdict = st.ok() ? 'A' : 'R';
    if (write(verdicts, &verdict, 1) != 1) return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  g_config = argc > 1 ? argv[1] : "unet";
  // glibc raises its mmap threshold (up to 32 MiB) whenever a mapped block
  // is freed, and libfabric frees some: fixing it keeps the 4 MiB case on
  // pages of its own and the 64 KiB case on the heap.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  const bool hooks = zsock::MemoryHooksActive();
  std::printf("stale_key_after_free: %s: MemoryHooksActive() = %s\n", g_config.c_str(),
              hooks ? "true" : "false");
  std::fflush(stdout);
  if (!hooks) {
    Fail("the memory-release interposers of libzsock.so.1 are not in effect (ZSOCK_MEMHOOKS=off "
         "set, or libzsock.so.1 loaded by dlopen instead of linked?)");
  }
  int addr_pipe[2], verdict_pipe[2];
  if (pipe(addr_pipe) != 0 || pipe(verdict_pipe) != 0) Fail("pipe failed");
  std::fflush(nullptr);
  const pid_t pid = fork();  // before any fabric exists
  if (pid < 0) Fail("fork failed");
  signal(SIGALRM, OnAlarm);
  alarm(60);
  if (pid == 0) {
    close(addr_pipe[1]);
    close(verdict_pipe[0]);
    std::string address;
    char b[256];
    for (ssize_t n; (n = read(addr_pipe[0], b, sizeof(b))) > 0;) address.append(b, n);
    if (address.empty()) _exit(1);  // the target failed before listening
    const int rc = RunPeer(address, verdict_pipe[1]);
    std::fflush(nullptr);
    _exit(rc);
  }
  g_child = pid;
  close(addr_pipe[0]);
  close(verdict_pipe[1]);

  auto fabric = Check("Fabric::Open(\"" + g_config + "\")", Fabric::Open(g_config));
  auto listener = Check("Listen", fabric->Listen("127.0.0.1:0"));
  const std::string address = listener->address();
  if (write(addr_pipe[1], address.data(), address.size()) !=
      static_cast<ssize_t>(address.size())) {
    Fail("pipe write failed");
  }
  close(addr_pipe[1]);

  for (const Case& c : kCases) RunCase(fabric.get(), listener.get(), c, verdict_pipe[0]);

  int status = 0;
  if (waitpid(g_child, &status, 0) != g_child || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    Fail(absl::StrCat("the peer failed (wait status ", status, ")"));
  }
  g_child = 0;
  std::printf("stale_key_after_free: %s: key refused after free (heap and mmap)\n",
              g_config.c_str());
  return 0;
}
