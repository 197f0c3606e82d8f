// Two hosts on one machine: the test creates two network namespaces joined by
// a veth pair with addresses on a private /30 it assigns, starts one peer
// process in each, and runs the conformance smoke across them over a real
// (virtual) network link instead of loopback:
//
//   connect, a 256 MiB transfer checked byte for byte, RDMA read and write,
//   fetch-add and compare-and-swap, and the peer killed with SIGKILL (the
//   survivor's endpoint reports an error within a bounded time: no hang).
//
// Configurations: `ofi:tcp;ofi_rxm` bound to the veth (iface=) and
// `ucx:tcp` bound to it (UCX_NET_DEVICES=). Needs root and iproute2's `ip`;
// otherwise every test is SKIPPED with the reason. Runs outside Bazel's
// sandbox (it mounts /run read-only) and alone (tags no-sandbox, exclusive).
//
// Cleanup: the namespaces (and with them the veth pair) are removed by the
// fixture's TearDown and by the owner's destructor, on SIGINT/SIGTERM/
// SIGHUP/SIGQUIT by a handler that kills the peers and detaches the
// namespaces' mounts (what `ip netns del` does), and, for a run that died
// harder than that, at the start of the next run: namespaces named
// zs-a-<pid>/zs-b-<pid> whose creator <pid> is gone and that hold no process
// are deleted.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "core/provider.h"
#include "gtest/gtest.h"

namespace zsock {
namespace {

constexpr absl::Duration kOpTimeout = absl::Seconds(60);
constexpr size_t kTransferBytes = size_t{256} << 20;
// How long the survivor may take to see that its peer was killed.
constexpr absl::Duration kDeathBound = absl::Seconds(10);

int64_t MonotonicNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// ---- running iproute2 ----

std::string FindIp() {
  std::vector<std::string> dirs = {"/usr/sbin", "/sbin", "/usr/bin", "/bin"};
  if (const char* path = getenv("PATH")) {
    for (absl::string_view d : absl::StrSplit(path, ':')) dirs.emplace_back(d);
  }
  for (const auto& d : dirs) {
    std::string p = absl::StrCat(d, "/ip");
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

// Runs `ip args...`; returns its output (stdout and stderr), or an error
// carrying that output when it exits non-zero.
absl::StatusOr<std::string> Ip(const std::string& ip, const std::vector<std::string>& args) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  std::vector<std::string> argv_s = {ip};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(out[1], 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  std::string text;
  char buf[4096];
  for (;;) {
    ssize_t n = read(out[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("`", absl::StrJoin(argv_s, " "), "` failed: ", absl::StripTrailingAsciiWhitespace(text)));
  }
  return text;
}

// ---- cleanup on signals ----

// What a signal handler needs to undo a namespace pair: plain arrays, so the
// handler only reads memory and makes async-signal-safe calls.
struct SignalCleanup {
  char ns_path[2][128] = {};
  volatile sig_atomic_t armed = 0;
  volatile pid_t peers[2] = {0, 0};
};
SignalCleanup g_cleanup;
constexpr int kCleanupSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

void OnFatalSignal(int sig) {
  if (g_cleanup.armed) {
    for (pid_t p : {g_cleanup.peers[0], g_cleanup.peers[1]}) {
      if (p > 0) kill(p, SIGKILL);
    }
    // What `ip netns del` does: detach the bind mount that keeps the
    // namespace alive and remove its file. With its processes gone the
    // kernel then destroys the namespace and the veth end inside it.
    for (const char* path : g_cleanup.ns_path) {
      if (path[0] != '\0') {
        umount2(path, MNT_DETACH);
        unlink(path);
      }
    }
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void ResetSignalsInChild() {
  g_cleanup.armed = 0;
  for (int sig : kCleanupSignals) signal(sig, SIG_DFL);
}

// ---- the namespace pair ----

// Two network namespaces "zs-a-<pid>" and "zs-b-<pid>" joined by a veth pair
// (veth "zsa<pid>" in a with 10.213.<pid % 256>.1/30, "zsb<pid>" in b with
// .2/30), loopback up in each. Destroying it deletes both namespaces (the
// veth pair goes with them).
class NetnsPair {
 public:
  static absl::StatusOr<std::unique_ptr<NetnsPair>> Create() {
    if (geteuid() != 0) {
      return absl::FailedPreconditionError("creating network namespaces needs root (run the test as root)");
    }
    std::string ip = FindIp();
    if (ip.empty()) {
      return absl::FailedPreconditionError("iproute2's `ip` is not installed (apt-get install iproute2)");
    }
    RemoveLeftovers(ip);
    std::unique_ptr<NetnsPair> p(new NetnsPair(ip));
    if (auto st = p->Build(); !st.ok()) return st;
    return p;
  }

  ~NetnsPair() { Destroy(); }

  const std::string& ns(int i) const { return ns_[i]; }
  const std::string& veth(int i) const { return veth_[i]; }
  const std::string& address(int i) const { return addr_[i]; }

  void Destroy() {
    if (destroyed_) return;
    destroyed_ = true;
    g_cleanup.armed = 0;
    for (int i = 0; i < 2; ++i) {
      if (!created_[i]) continue;
      if (auto st = Ip(ip_, {"netns", "del", ns_[i]}); !st.ok()) {
        std::fprintf(stderr, "netns_test: cleanup: %s\n", st.status().ToString().c_str());
      }
    }
    // A veth still in this namespace (Build failed before moving it).
    if (veth_in_root_) Ip(ip_, {"link", "del", veth_[0]}).status().IgnoreError();
  }

  // Called in a forked child: moves it into namespace i, with a private
  // mount namespace whose /sys shows that namespace's devices (as
  // `ip netns exec` does; UCX lists network devices in /sys/class/net).
  absl::Status Join(int i) const {
    std::string path = absl::StrCat("/run/netns/", ns_[i]);
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::InternalError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
    if (setns(fd, CLONE_NEWNET) != 0) {
      int e = errno;
      close(fd);
      return absl::InternalError(absl::StrCat("setns(", path, "): ", std::strerror(e)));
    }
    close(fd);
    if (unshare(CLONE_NEWNS) != 0) return absl::InternalError(absl::StrCat("unshare(CLONE_NEWNS): ", std::strerror(errno)));
    if (mount(nullptr, "/", nullptr, MS_SLAVE | MS_REC, nullptr) != 0) {
      return absl::InternalError(absl::StrCat("making / a slave mount: ", std::strerror(errno)));
    }
    umount2("/sys", MNT_DETACH);
    if (mount(ns_[i].c_str(), "/sys", "sysfs", 0, nullptr) != 0) {
      return absl::InternalError(absl::StrCat("mounting sysfs for ", ns_[i], ": ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }

 private:
  explicit NetnsPair(std::string ip) : ip_(std::move(ip)) {
    const pid_t pid = getpid();
    ns_[0] = absl::StrCat("zs-a-", pid);
    ns_[1] = absl::StrCat("zs-b-", pid);
    veth_[0] = absl::StrCat("zsa", pid);  // at most 10 characters (IFNAMSIZ 16)
    veth_[1] = absl::StrCat("zsb", pid);
    const std::string net = absl::StrCat("10.213.", pid % 256, ".");
    addr_[0] = net + "1";
    addr_[1] = net + "2";
  }

  absl::Status Build() {
    // Signal cleanup first, so a signal during the commands below still
    // removes whatever exists by then.
    for (int i = 0; i < 2; ++i) {
      std::snprintf(g_cleanup.ns_path[i], sizeof(g_cleanup.ns_path[i]), "/run/netns/%s", ns_[i].c_str());
    }
    g_cleanup.peers[0] = 0;
    g_cleanup.peers[1] = 0;
    g_cleanup.armed = 1;
    for (int sig : kCleanupSignals) {
      struct sigaction sa {};
      sa.sa_handler = OnFatalSignal;
      sigemptyset(&sa.sa_mask);
      sigaction(sig, &sa, nullptr);
    }
    for (int i = 0; i < 2; ++i) {
      auto st = Ip(ip_, {"netns", "add", ns_[i]});
      if (!st.ok()) return st.status();
      created_[i] = true;
    }
    if (auto st = Ip(ip_, {"link", "add", veth_[0], "type", "veth", "peer", "name", veth_[1]}); !st.ok()) {
      return st.status();
    }
    veth_in_root_ = true;
    for (int i = 0; i < 2; ++i) {
      std::vector<std::vector<std::string>> cmds = {
          {"link", "set", veth_[i], "netns", ns_[i]},
          {"-n", ns_[i], "addr", "add", absl::StrCat(addr_[i], "/30"), "dev", veth_[i]},
          {"-n", ns_[i], "link", "set", veth_[i], "up"},
          {"-n", ns_[i], "link", "set", "lo", "up"},
      };
      for (const auto& c : cmds) {
        if (auto st = Ip(ip_, c); !st.ok()) return st.status();
        if (i == 1 && c[0] == "link") veth_in_root_ = false;
      }
    }
    return absl::OkStatus();
  }

  // Deletes zs-a-<pid> / zs-b-<pid> namespaces left by a run that could not
  // clean up: their creator is gone and no process is inside. A live run's
  // namespaces have a live creator, so they are never touched.
  static void RemoveLeftovers(const std::string& ip) {
    auto list = Ip(ip, {"netns", "list"});
    if (!list.ok()) return;
    for (absl::string_view line : absl::StrSplit(*list, '\n', absl::SkipEmpty())) {
      absl::string_view name = line.substr(0, line.find(' '));
      absl::string_view rest = name;
      if (!absl::ConsumePrefix(&rest, "zs-a-") && !absl::ConsumePrefix(&rest, "zs-b-")) continue;
      int creator = 0;
      if (!absl::SimpleAtoi(rest, &creator) || creator <= 0) continue;
      if (creator == getpid() || kill(creator, 0) == 0 || errno != ESRCH) continue;
      auto pids = Ip(ip, {"netns", "pids", std::string(name)});
      if (!pids.ok() || !absl::StripAsciiWhitespace(*pids).empty()) continue;
      std::fprintf(stderr, "netns_test: removing leftover namespace %s (creator %d is gone)\n",
                   std::string(name).c_str(), creator);
      Ip(ip, {"netns", "del", std::string(name)}).status().IgnoreError();
    }
    // A veth pair left in this namespace by a run that died while building.
    auto links = Ip(ip, {"-o", "link", "show", "type", "veth"});
    if (!links.ok()) return;
    for (absl::string_view line : absl::StrSplit(*links, '\n', absl::SkipEmpty())) {
      // "12: zsa1234@zsb1234: <...>"
      std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(": ", 2));
      if (f.size() < 2) continue;
      absl::string_view name = f[1].substr(0, f[1].find('@'));
      absl::string_view rest = name;
      if (!absl::ConsumePrefix(&rest, "zsa") && !absl::ConsumePrefix(&rest, "zsb")) continue;
      int creator = 0;
      if (!absl::SimpleAtoi(rest, &creator) || creator <= 0) continue;
      if (creator == getpid() || kill(creator, 0) == 0 || errno != ESRCH) continue;
      std::fprintf(stderr, "netns_test: removing leftover veth %s\n", std::string(name).c_str());
      Ip(ip, {"link", "del", std::string(name)}).status().IgnoreError();
    }
  }

  std::string ip_;
  std::string ns_[2], veth_[2], addr_[2];
  bool created_[2] = {false, false};
  bool veth_in_root_ = false;
  bool destroyed_ = false;
};

// ---- data patterns ----

// splitmix64: a cheap, seeded stream whose word k is independent of every
// other word, so any chunk can be produced (and checked) on its own.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Byte `offset + i` of the stream `seed`, for i in [0, n).
void Fill(uint8_t* p, size_t n, uint64_t seed, uint64_t offset) {
  size_t i = 0;
  for (; i < n && (offset + i) % 8 != 0; ++i) {
    uint64_t idx = offset + i;
    p[i] = static_cast<uint8_t>(Mix(seed * 0x100000001b3ull + idx / 8) >> (8 * (idx % 8)));
  }
  for (; i + 8 <= n; i += 8) {
    uint64_t w = Mix(seed * 0x100000001b3ull + (offset + i) / 8);
    std::memcpy(p + i, &w, 8);  // little-endian: byte k of w is byte k of the word
  }
  for (; i < n; ++i) {
    uint64_t idx = offset + i;
    p[i] = static_cast<uint8_t>(Mix(seed * 0x100000001b3ull + idx / 8) >> (8 * (idx % 8)));
  }
}

// Empty if p matches the stream, else where it first differs.
std::string Mismatch(const uint8_t* p, size_t n, uint64_t seed, uint64_t offset) {
  std::vector<uint8_t> want(n);
  Fill(want.data(), n, seed, offset);
  if (std::memcmp(p, want.data(), n) == 0) return "";
  size_t i = 0;
  while (p[i] == want[i]) ++i;
  return absl::StrCat("byte ", offset + i, " is ", p[i], ", expected ", want[i]);
}

// ---- peer-process plumbing ----

// A child reports to the parent through a pipe, one line per event:
//   "addr <address>"  the server listens there
//   "skip <reason>"   the configuration cannot be opened here
//   "ready"           the client finished the smoke and waits to be killed
//   "dead <ns> <status>"  the survivor saw its peer die at CLOCK_MONOTONIC ns
// Failures go to stderr and make the exit code non-zero.
class Reporter {
 public:
  explicit Reporter(int fd) : fd_(fd) {}
  void Line(const std::string& s) {
    std::string l = absl::StrReplaceAll(s, {{"\n", " "}}) + "\n";
    if (write(fd_, l.data(), l.size()) != static_cast<ssize_t>(l.size())) _exit(3);
  }

 private:
  int fd_;
};

class LineReader {
 public:
  explicit LineReader(int fd) : fd_(fd) {}
  ~LineReader() { close(fd_); }
  // The next line, or an error on end of file / timeout.
  absl::StatusOr<std::string> Next(absl::Duration timeout) {
    absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      if (auto nl = buf_.find('\n'); nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      int left = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
      if (left <= 0) return absl::DeadlineExceededError("no report from the peer process in time");
      pollfd p{fd_, POLLIN, 0};
      int r = poll(&p, 1, left);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) continue;
      char tmp[1024];
      ssize_t n = read(fd_, tmp, sizeof(tmp));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return absl::UnavailableError("the peer process ended without reporting");
      buf_.append(tmp, static_cast<size_t>(n));
    }
  }

 private:
  int fd_;
  std::string buf_;
};

[[noreturn]] void ChildFail(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "peer %d: %s:%d: %s\n", getpid(), file, line, what.c_str());
  std::fflush(stderr);
  _exit(1);
}
#define CHILD_CHECK(cond, ...)                                                          \
  do {                                                                                  \
    if (!(cond)) ChildFail(__FILE__, __LINE__, absl::StrCat("check failed: " #cond " ", \
                                                            ##__VA_ARGS__));            \
  } while (0)
#define CHILD_OK(expr)                                                         \
  do {                                                                         \
    absl::Status _st = (expr);                                                 \
    if (!_st.ok()) ChildFail(__FILE__, __LINE__, #expr ": " + _st.ToString()); \
  } while (0)

absl::StatusOr<Completion> WaitOne(CompletionQueue* cq, absl::Duration timeout = kOpTimeout) {
  Completion c;
  absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return absl::DeadlineExceededError("no completion within the timeout");
    auto n = cq->Wait(std::span<Completion>(&c, 1), left);
    if (!n.ok()) return n.status();
    if (*n == 1) return c;
  }
}

absl::StatusOr<Completion> WaitOk(CompletionQueue* cq) {
  auto c = WaitOne(cq);
  if (!c.ok()) return c.status();
  if (!c->status.ok()) return c->status;
  return c;
}

absl::Status SendBlob(Endpoint* ep, const std::string& blob) {
  if (auto st = ep->Send(blob.data(), blob.size(), nullptr, 1); !st.ok()) return st;
  for (;;) {
    auto c = WaitOk(ep->cq());
    if (!c.ok()) return c.status();
    if (c->op == OpType::kSend) return absl::OkStatus();
  }
}

absl::StatusOr<std::string> RecvBlob(Endpoint* ep) {
  std::string buf(4096, '\0');
  if (auto st = ep->PostRecv(buf.data(), buf.size(), nullptr, 2); !st.ok()) return st;
  for (;;) {
    auto c = WaitOk(ep->cq());
    if (!c.ok()) return c.status();
    if (c->op == OpType::kRecv) {
      buf.resize(c->length);
      return buf;
    }
  }
}

bool Skippable(const absl::Status& st) {
  return st.code() == absl::StatusCode::kUnavailable || st.code() == absl::StatusCode::kNotFound ||
         st.code() == absl::StatusCode::kFailedPrecondition;
}

// Bytes received by a network device of the caller's namespace (its /sys
// must be that namespace's: see NetnsPair::Join).
absl::StatusOr<uint64_t> RxBytes(const std::string& dev) {
  std::string path = absl::StrCat("/sys/class/net/", dev, "/statistics/rx_bytes");
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
  unsigned long long v = 0;
  int n = std::fscanf(f, "%llu", &v);
  std::fclose(f);
  if (n != 1) return absl::InternalError(absl::StrCat("cannot parse ", path));
  return v;
}

// ---- the smoke, one side each ----

constexpr uint64_t kTransferSeed = 0x5eed0001;
constexpr uint64_t kRegionSeed = 0x5eed0002;
constexpr uint64_t kWriteSeed = 0x5eed0003;
constexpr size_t kRegionBytes = size_t{1} << 20;
constexpr size_t kWriteOffset = 4097;  // unaligned, across pages
constexpr size_t kWriteBytes = 300001;
constexpr int kWindow = 8;

size_t ChunkFor(const Fabric& f) {
  size_t chunk = size_t{4} << 20;
  if (f.caps().max_msg_size != 0) chunk = std::min(chunk, f.caps().max_msg_size & ~size_t{7});
  return chunk;
}

// Server: in namespace a. Listens on its veth address, accepts the client,
// receives and checks the transfer, serves the RMA and atomics, then
// outlives the client and reports when its endpoint saw the death.
int ServerMain(const NetnsPair& net, const std::string& config, Reporter rep) {
  CHILD_OK(net.Join(0));
  auto fabric = Fabric::Open(config);
  if (!fabric.ok()) {
    if (Skippable(fabric.status())) {
      rep.Line(absl::StrCat("skip ", fabric.status().ToString()));
      return 0;
    }
    CHILD_OK(fabric.status());
  }
  Fabric& f = **fabric;
  auto cq = f.CreateCq();
  CHILD_OK(cq.status());
  auto listener = f.Listen(absl::StrCat(net.address(0), ":0"));
  CHILD_OK(listener.status());
  auto rx_before = RxBytes(net.veth(0));
  CHILD_OK(rx_before.status());
  rep.Line(absl::StrCat("addr ", (*listener)->address()));
  auto acc = (*listener)->Accept(cq->get(), kOpTimeout);
  CHILD_OK(acc.status());
  Endpoint* ep = acc->get();
  std::fprintf(stderr, "server: %s accepted %s -> %s\n", config.c_str(),
               ep->info().peer_address.c_str(), ep->info().local_address.c_str());

  // 1. Connect: a greeting each way.
  auto hello = RecvBlob(ep);
  CHILD_OK(hello.status());
  CHILD_CHECK(*hello == "hello from b", *hello);
  CHILD_OK(SendBlob(ep, "hello from a"));

  // 2. 256 MiB, in chunks, each checked byte for byte on arrival. Receive k
  // holds message k (matching order), whatever order completions come in.
  const size_t chunk = ChunkFor(f);
  const int64_t chunks = static_cast<int64_t>((kTransferBytes + chunk - 1) / chunk);
  std::vector<std::vector<uint8_t>> bufs(kWindow, std::vector<uint8_t>(chunk));
  std::vector<int> slot_of(chunks, -1);
  int64_t posted = 0, got = 0;
  uint64_t bytes = 0;
  auto post = [&](int slot) {
    slot_of[posted] = slot;
    return ep->PostRecv(bufs[slot].data(), chunk, nullptr, static_cast<uint64_t>(posted++));
  };
  for (int s = 0; s < kWindow && posted < chunks; ++s) CHILD_OK(post(s));
  while (got < chunks) {
    auto c = WaitOk(cq->get());
    CHILD_OK(c.status());
    if (c->op != OpType::kRecv) continue;
    const int64_t k = static_cast<int64_t>(c->context);
    const uint64_t off = static_cast<uint64_t>(k) * chunk;
    const size_t want = std::min<uint64_t>(chunk, kTransferBytes - off);
    CHILD_CHECK(c->length == want, "chunk ", k, " length ", c->length);
    std::string bad = Mismatch(bufs[slot_of[k]].data(), want, kTransferSeed, off);
    CHILD_CHECK(bad.empty(), "chunk ", k, ": ", bad);
    bytes += want;
    ++got;
    if (posted < chunks) CHILD_OK(post(slot_of[k]));
  }
  CHILD_CHECK(bytes == kTransferBytes);
  // And it came over the veth, not some other way between the namespaces.
  auto rx_after = RxBytes(net.veth(0));
  CHILD_OK(rx_after.status());
  CHILD_CHECK(*rx_after - *rx_before >= kTransferBytes, "only ", *rx_after - *rx_before,
              " bytes arrived on ", net.veth(0));
  std::fprintf(stderr, "server: %llu bytes arrived on %s\n",
               static_cast<unsigned long long>(*rx_after - *rx_before), net.veth(0).c_str());
  CHILD_OK(SendBlob(ep, absl::StrCat("received ", bytes)));

  // 3. RDMA: a region the client reads, then writes part of.
  std::vector<uint8_t> region(kRegionBytes);
  Fill(region.data(), region.size(), kRegionSeed, 0);
  auto mr = f.RegisterMemory(region.data(), region.size(), kAccessAll);
  CHILD_OK(mr.status());
  // 4. Atomics: two words.
  auto words_mr = f.AllocateRegistered(64, kAccessAll);
  CHILD_OK(words_mr.status());
  auto* words = static_cast<uint64_t*>((*words_mr)->addr());
  words[0] = 1000;
  words[1] = 7;
  CHILD_OK(SendBlob(ep, (*mr)->remote_key().Serialize()));
  CHILD_OK(SendBlob(ep, (*words_mr)->remote_key().Serialize()));
  // Waiting here drives progress, which serves emulated accesses.
  auto rma_done = RecvBlob(ep);
  CHILD_OK(rma_done.status());
  CHILD_CHECK(*rma_done == "rma done", *rma_done);
  CHILD_CHECK(Mismatch(region.data(), kWriteOffset, kRegionSeed, 0).empty(), "before the write");
  std::string bad = Mismatch(region.data() + kWriteOffset, kWriteBytes, kWriteSeed, 0);
  CHILD_CHECK(bad.empty(), "written range: ", bad);
  const size_t tail = kWriteOffset + kWriteBytes;
  CHILD_CHECK(Mismatch(region.data() + tail, kRegionBytes - tail, kRegionSeed, tail).empty(),
              "after the write");
  CHILD_CHECK(__atomic_load_n(&words[0], __ATOMIC_SEQ_CST) == 1012, words[0]);
  CHILD_CHECK(__atomic_load_n(&words[1], __ATOMIC_SEQ_CST) == 42, words[1]);
  CHILD_OK(SendBlob(ep, "checked"));

  // 5. The client is killed while we have a receive posted and a large send
  // outstanding towards it: our endpoint must report an error.
  auto last = RecvBlob(ep);
  CHILD_OK(last.status());
  CHILD_CHECK(*last == "kill me", *last);
  std::vector<uint8_t> in(1 << 20), big(size_t{32} << 20, 0x33);
  absl::Status failed;
  if (auto st = ep->PostRecv(in.data(), in.size(), nullptr, 900); !st.ok()) failed = st;
  if (failed.ok()) {
    size_t len = big.size();
    if (f.caps().max_msg_size != 0) len = std::min(len, f.caps().max_msg_size);
    if (auto st = ep->Send(big.data(), len, nullptr, 901); !st.ok()) {
      failed = st;
    }
  }
  absl::Time give_up = absl::Now() + absl::Seconds(120);
  while (failed.ok()) {
    CHILD_CHECK(absl::Now() < give_up, "no error two minutes after the peer was killed: hang");
    auto c = WaitOne(cq->get(), absl::Seconds(1));
    if (!c.ok()) continue;  // nothing yet
    if (!c->status.ok()) failed = c->status;
  }
  const int64_t seen = MonotonicNanos();
  rep.Line(absl::StrCat("dead ", seen, " ", failed.ToString()));
  // New operations fail at once.
  CHILD_CHECK(!ep->Send(in.data(), 10, nullptr, 902).ok(), "a send to a dead peer was accepted");
  return 0;
}

// Client: in namespace b. Connects to the server across the veth, sends the
// transfer, does the RMA and atomics, then waits to be killed.
int ClientMain(const NetnsPair& net, const std::string& config, const std::string& address,
               Reporter rep) {
  CHILD_OK(net.Join(1));
  auto fabric = Fabric::Open(config);
  CHILD_OK(fabric.status());
  Fabric& f = **fabric;
  auto cq = f.CreateCq();
  CHILD_OK(cq.status());
  auto conn = f.Connect(address, cq->get(), kOpTimeout);
  CHILD_OK(conn.status());
  Endpoint* ep = conn->get();
  std::fprintf(stderr, "client: %s connected %s -> %s\n", config.c_str(),
               ep->info().local_address.c_str(), ep->info().peer_address.c_str());
  // The connection really crosses the veth: our side has namespace b's address.
  CHILD_CHECK(absl::StrContains(ep->info().local_address, net.address(1)) ||
                  absl::StrContains(ep->info().peer_address, net.address(0)),
              ep->info().local_address, " / ", ep->info().peer_address);

  CHILD_OK(SendBlob(ep, "hello from b"));
  auto hello = RecvBlob(ep);
  CHILD_OK(hello.status());
  CHILD_CHECK(*hello == "hello from a", *hello);

  const size_t chunk = ChunkFor(f);
  const int64_t chunks = static_cast<int64_t>((kTransferBytes + chunk - 1) / chunk);
  std::vector<std::vector<uint8_t>> bufs(kWindow, std::vector<uint8_t>(chunk));
  int64_t sent = 0, done = 0;
  absl::Time t0 = absl::Now();
  auto send = [&](int slot) {
    const uint64_t off = static_cast<uint64_t>(sent) * chunk;
    const size_t len = std::min<uint64_t>(chunk, kTransferBytes - off);
    Fill(bufs[slot].data(), len, kTransferSeed, off);
    return ep->Send(bufs[slot].data(), len, nullptr, static_cast<uint64_t>(sent++) * kWindow + slot);
  };
  for (int s = 0; s < kWindow && sent < chunks; ++s) CHILD_OK(send(s));
  while (done < chunks) {
    auto c = WaitOk(cq->get());
    CHILD_OK(c.status());
    if (c->op != OpType::kSend) continue;
    ++done;
    if (sent < chunks) CHILD_OK(send(static_cast<int>(c->context % kWindow)));
  }
  auto ack = RecvBlob(ep);
  CHILD_OK(ack.status());
  CHILD_CHECK(*ack == absl::StrCat("received ", kTransferBytes), *ack);
  std::fprintf(stderr, "client: 256 MiB in %s chunks of %zu\n",
               absl::FormatDuration(absl::Now() - t0).c_str(), chunk);

  auto key_bytes = RecvBlob(ep);
  CHILD_OK(key_bytes.status());
  auto key = RemoteKey::Parse(*key_bytes);
  CHILD_OK(key.status());
  auto wkey_bytes = RecvBlob(ep);
  CHILD_OK(wkey_bytes.status());
  auto wkey = RemoteKey::Parse(*wkey_bytes);
  CHILD_OK(wkey.status());

  // RDMA read of the whole region, checked.
  std::vector<uint8_t> back(kRegionBytes);
  CHILD_OK(ep->Read(back.data(), back.size(), nullptr, key->addr, *key, 10));
  auto r = WaitOk(cq->get());
  CHILD_OK(r.status());
  CHILD_CHECK(r->op == OpType::kRead && r->length == kRegionBytes);
  std::string bad = Mismatch(back.data(), back.size(), kRegionSeed, 0);
  CHILD_CHECK(bad.empty(), "read: ", bad);
  // RDMA write of an unaligned range, read back.
  std::vector<uint8_t> data(kWriteBytes);
  Fill(data.data(), data.size(), kWriteSeed, 0);
  CHILD_OK(ep->Write(data.data(), data.size(), nullptr, key->addr + kWriteOffset, *key, 11));
  auto w = WaitOk(cq->get());
  CHILD_OK(w.status());
  CHILD_CHECK(w->op == OpType::kWrite);
  std::fill(back.begin(), back.end(), 0);
  CHILD_OK(ep->Read(back.data(), kWriteBytes, nullptr, key->addr + kWriteOffset, *key, 12));
  CHILD_OK(WaitOk(cq->get()).status());
  bad = Mismatch(back.data(), kWriteBytes, kWriteSeed, 0);
  CHILD_CHECK(bad.empty(), "read after write: ", bad);

  // Atomics: 1000 +5 +7 = 1012 by fetch-add; 7 -> 42 by compare-and-swap,
  // and a compare-and-swap that must not swap.
  uint64_t old = 0;
  CHILD_OK(ep->FetchAdd(&old, wkey->addr, *wkey, 5, 20));
  CHILD_OK(WaitOk(cq->get()).status());
  CHILD_CHECK(old == 1000, old);
  CHILD_OK(ep->FetchAdd(&old, wkey->addr, *wkey, 7, 21));
  CHILD_OK(WaitOk(cq->get()).status());
  CHILD_CHECK(old == 1005, old);
  CHILD_OK(ep->CompareSwap(&old, wkey->addr + 8, *wkey, 7, 42, 22));
  CHILD_OK(WaitOk(cq->get()).status());
  CHILD_CHECK(old == 7, old);
  CHILD_OK(ep->CompareSwap(&old, wkey->addr + 8, *wkey, 7, 99, 23));
  CHILD_OK(WaitOk(cq->get()).status());
  CHILD_CHECK(old == 42, "a failed compare-and-swap returns the current value, got ", old);
  CHILD_OK(SendBlob(ep, "rma done"));
  auto checked = RecvBlob(ep);
  CHILD_OK(checked.status());
  CHILD_CHECK(*checked == "checked", *checked);

  CHILD_OK(SendBlob(ep, "kill me"));
  rep.Line("ready");
  for (;;) pause();
}

// ---- the test ----

struct Config {
  const char* name;
  // "{dev}" becomes the namespace's veth.
  const char* pattern;
};

class NetnsTest : public ::testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    auto net = NetnsPair::Create();
    if (!net.ok()) GTEST_SKIP() << "network namespaces cannot be created here: " << net.status().message();
    net_ = std::move(*net);
  }

  void TearDown() override {
    for (pid_t& p : peers_) {
      if (p > 0) {
        kill(p, SIGKILL);
        waitpid(p, nullptr, 0);
        p = 0;
      }
    }
    if (net_) net_->Destroy();
  }

  std::string ConfigFor(int side) const {
    return absl::StrReplaceAll(GetParam().pattern, {{"{dev}", net_->veth(side)}});
  }

  // Forks a peer running `body`; its report pipe is returned.
  std::unique_ptr<LineReader> Start(int side, std::function<int(Reporter)> body) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return nullptr;
    std::fflush(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
      ResetSignalsInChild();
      close(p[0]);
      alarm(280);  // a hung peer must not hang the suite
      int rc = body(Reporter(p[1]));
      std::fflush(nullptr);
      _exit(rc);
    }
    close(p[1]);
    peers_[side] = pid;
    g_cleanup.peers[side] = pid;
    return std::make_unique<LineReader>(p[0]);
  }

  // Exit code, or -signal.
  int Reap(int side) {
    int status = 0;
    pid_t pid = peers_[side];
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    peers_[side] = 0;
    g_cleanup.peers[side] = 0;
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return -WTERMSIG(status);
  }

  std::unique_ptr<NetnsPair> net_;
  pid_t peers_[2] = {0, 0};
};

TEST_P(NetnsTest, SmokeAcrossTwoNamespaces) {
  const std::string server_config = ConfigFor(0), client_config = ConfigFor(1);
  std::fprintf(stderr, "namespaces %s (%s on %s) and %s (%s on %s)\n", net_->ns(0).c_str(),
               net_->address(0).c_str(), net_->veth(0).c_str(), net_->ns(1).c_str(),
               net_->address(1).c_str(), net_->veth(1).c_str());
  auto server = Start(0, [&](Reporter rep) { return ServerMain(*net_, server_config, rep); });
  ASSERT_NE(server, nullptr);
  auto first = server->Next(absl::Seconds(120));
  if (!first.ok()) {
    FAIL() << "server: " << first.status() << "; exit " << Reap(0);
  }
  if (absl::StartsWith(*first, "skip ")) {
    EXPECT_EQ(Reap(0), 0);
    GTEST_SKIP() << "'" << server_config << "' cannot run here: " << first->substr(5);
  }
  ASSERT_TRUE(absl::StartsWith(*first, "addr ")) << *first;
  const std::string address = first->substr(5);
  auto client = Start(1, [&](Reporter rep) { return ClientMain(*net_, client_config, address, rep); });
  ASSERT_NE(client, nullptr);

  auto ready = client->Next(absl::Seconds(240));
  if (!ready.ok()) {
    int rc = Reap(1);
    FAIL() << "client did not finish the smoke: " << ready.status() << "; exit " << rc;
  }
  ASSERT_EQ(*ready, "ready");
  const int64_t killed = MonotonicNanos();
  ASSERT_EQ(kill(peers_[1], SIGKILL), 0);
  EXPECT_EQ(Reap(1), -SIGKILL);

  auto dead = server->Next(absl::Seconds(150));
  if (!dead.ok()) {
    int rc = Reap(0);
    FAIL() << "the survivor did not report the death: " << dead.status() << "; exit " << rc;
  }
  std::vector<std::string> f = absl::StrSplit(*dead, absl::MaxSplits(' ', 2));
  ASSERT_EQ(f.size(), 3u) << *dead;
  ASSERT_EQ(f[0], "dead");
  int64_t seen = 0;
  ASSERT_TRUE(absl::SimpleAtoi(f[1], &seen)) << *dead;
  const absl::Duration took = absl::Nanoseconds(seen - killed);
  std::fprintf(stderr, "survivor's endpoint failed %s after the kill: %s\n",
               absl::FormatDuration(took).c_str(), f[2].c_str());
  EXPECT_LT(took, kDeathBound) << "the survivor saw the death only after " << took;
  EXPECT_EQ(Reap(0), 0);
}

INSTANTIATE_TEST_SUITE_P(Providers, NetnsTest,
                         ::testing::Values(Config{"OfiTcpRxm", "ofi:tcp;ofi_rxm?iface={dev}"},
                                           Config{"UcxTcp", "ucx:tcp?UCX_NET_DEVICES={dev}"}),
                         [](const ::testing::TestParamInfo<Config>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace zsock
