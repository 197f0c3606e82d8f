// provider_example: two processes talking through zsock's provider interface
// (core/provider.h) alone: send/recv, an RDMA write and remote fetch-adds.
//
//   provider_example [CONFIG]     CONFIG: "unet" (default), "ofi:tcp;ofi_rxm",
//                                 "tcp", "ucx:tcp", ...
//
// The process forks first, before anything opens a fabric (fabrics,
// endpoints and registrations do not survive fork(); each process opens its
// own). The parent is the server: it listens on "127.0.0.1:0" (every provider
// takes socket addresses; port 0 picks a free one) and hands the listener's
// address() to the child, the client, through a pipe.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/provider.h"

namespace {

using zsock::Completion;
using zsock::CompletionQueue;
using zsock::Endpoint;
using zsock::Fabric;
using zsock::MemoryRegion;
using zsock::RemoteKey;

constexpr absl::Duration kTimeout = absl::Seconds(30);
constexpr size_t kMsgMax = 4096;          // largest control message we exchange
constexpr size_t kRdmaBytes = 64 * 1024;  // the server's RDMA-write target
constexpr uint64_t kFetchAdds = 100;
const char kHello[] = "hello from the client";
const char kReply[] = "hello from the server";

const char* g_role = "main";
pid_t g_child = 0;  // the server's client process, killed if the server fails

// Prints why, stops the peer process (server side) and exits non-zero.
[[noreturn]] void Fail(absl::string_view what, const absl::Status& st) {
  std::fprintf(stderr, "provider_example: %s: %.*s: %s\n", g_role,
               static_cast<int>(what.size()), what.data(), st.ToString().c_str());
  std::fflush(nullptr);
  if (g_child > 0) {
    kill(g_child, SIGTERM);
    waitpid(g_child, nullptr, 0);
  }
  _exit(1);
}
void Check(absl::string_view what, const absl::Status& st) {
  if (!st.ok()) Fail(what, st);
}
template <typename T>
T Check(absl::string_view what, absl::StatusOr<T> v) {
  if (!v.ok()) Fail(what, v.status());
  return std::move(*v);
}

void OnAlarm(int) {
  static const char msg[] = "provider_example: timed out after 60 s (a hang)\n";
  (void)!write(2, msg, sizeof(msg) - 1);
  _exit(2);
}

uint8_t Pattern(size_t i) { return static_cast<uint8_t>((i * 2654435761u) >> 13); }

// One connected endpoint, its CQ and two registered message buffers.
// Operations are named by their context; completions that arrive for
// another context than the one awaited are kept until it is awaited.
class Peer {
 public:
  Peer(Fabric* fabric, std::unique_ptr<CompletionQueue> cq, std::unique_ptr<Endpoint> ep)
      : fabric_(fabric), cq_(std::move(cq)), ep_(std::move(ep)),
        send_buf_(kMsgMax), recv_buf_(kMsgMax) {
    // Providers with registration_required (ofi with FI_MR_LOCAL) need a
    // MemoryRegion for every local buffer; registering always is harmless.
    send_mr_ = Check("register send buffer",
                     fabric_->RegisterMemory(send_buf_.data(), kMsgMax, zsock::kLocalRead));
    recv_mr_ = Check("register recv buffer",
                     fabric_->RegisterMemory(recv_buf_.data(), kMsgMax, zsock::kLocalWrite));
  }
  ~Peer() { ep_->Close(); }

  Fabric* fabric() const { return fabric_; }
  Endpoint* ep() const { return ep_.get(); }
  uint64_t NextContext() { return ++last_context_; }

  // Waits for the completion of operation `context`; fails on its error.
  absl::Status Await(uint64_t context) {
    while (!done_.contains(context)) {
      Completion c[8];
      auto n = cq_->Wait(std::span<Completion>(c, 8), kTimeout);
      if (!n.ok()) return n.status();
      if (*n == 0) return absl::DeadlineExceededError("no completion within 30 s");
      for (size_t i = 0; i < *n; ++i) done_[c[i].context] = std::move(c[i]);
    }
    Completion c = std::move(done_[context]);
    done_.erase(context);
    last_ = c;
    return c.status;
  }
  // Drives progress for up to `d` (serving operations the provider
  // emulates through us), keeping whatever completes.
  void Progress(absl::Duration d) {
    Completion c[8];
    auto n = cq_->Wait(std::span<Completion>(c, 8), d);
    for (size_t i = 0; n.ok() && i < *n; ++i) done_[c[i].context] = std::move(c[i]);
  }

  absl::Status PostRecv(uint64_t context) {
    return ep_->PostRecv(recv_buf_.data(), kMsgMax, recv_mr_.get(), context);
  }
  std::string Received() const {
    return std::string(reinterpret_cast<const char*>(recv_buf_.data()), last_.length);
  }
  absl::Status Send(absl::string_view msg, uint64_t context) {
    if (msg.size() > kMsgMax) return absl::InvalidArgumentError("message too long");
    std::memcpy(send_buf_.data(), msg.data(), msg.size());
    return ep_->Send(send_buf_.data(), msg.size(), send_mr_.get(), context);
  }
  // Send and wait for the send's completion.
  absl::Status SendMsg(absl::string_view msg) {
    const uint64_t ctx = NextContext();
    if (absl::Status st = Send(msg, ctx); !st.ok()) return st;
    return Await(ctx);
  }
  // Post a receive and wait for the message.
  absl::StatusOr<std::string> RecvMsg() {
    const uint64_t ctx = NextContext();
    if (absl::Status st = PostRecv(ctx); !st.ok()) return st;
    if (absl::Status st = Await(ctx); !st.ok()) return st;
    return Received();
  }

 private:
  Fabric* fabric_;
  std::unique_ptr<CompletionQueue> cq_;
  std::unique_ptr<Endpoint> ep_;
  std::vector<uint8_t> send_buf_, recv_buf_;
  std::unique_ptr<MemoryRegion> send_mr_, recv_mr_;
  std::map<uint64_t, Completion> done_;
  Completion last_;
  uint64_t last_context_ = 0;
};

absl::Status Expect(absl::string_view got, absl::string_view want) {
  if (got == want) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("got \"", got, "\", expected \"", want, "\""));
}

// ---- the server (parent) ----

int RunServer(const std::string& config, int addr_pipe) {
  auto fabric = Check("Fabric::Open(\"" + config + "\")", Fabric::Open(config));
  auto cq = Check("CreateCq", fabric->CreateCq());
  auto listener = Check("Listen", fabric->Listen("127.0.0.1:0"));
  const std::string address = listener->address();
  if (write(addr_pipe, address.data(), address.size()) != static_cast<ssize_t>(address.size())) {
    Fail("handing the address to the client", absl::InternalError("pipe write failed"));
  }
  close(addr_pipe);

  // Accept in short slices so that a client that died is noticed at once.
  std::unique_ptr<Endpoint> ep;
  while (ep == nullptr) {
    auto accepted = listener->Accept(cq.get(), absl::Milliseconds(200));
    if (accepted.ok()) {
      ep = std::move(*accepted);
    } else if (accepted.status().code() != absl::StatusCode::kDeadlineExceeded) {
      Fail("Accept", accepted.status());
    } else if (waitpid(g_child, nullptr, WNOHANG) == g_child) {
      g_child = 0;
      Fail("Accept", absl::AbortedError("the client exited before connecting"));
    }
  }
  Peer peer(fabric.get(), std::move(cq), std::move(ep));

  // The memory the client will reach: a buffer registered in place for
  // RDMA writes, and an 8-byte counter word allocated registered (for the
  // peer of this endpoint only; unet then serves atomics on it natively).
  std::vector<uint8_t> target(kRdmaBytes, 0);
  auto target_mr = Check("RegisterMemory", fabric->RegisterMemory(
      target.data(), target.size(), zsock::kLocalRead | zsock::kRemoteWrite));
  auto counter_mr = Check("AllocateRegisteredFor", fabric->AllocateRegisteredFor(
      peer.ep(), sizeof(uint64_t), zsock::kLocalRead | zsock::kRemoteAtomic));
  auto* counter = static_cast<uint64_t*>(counter_mr->addr());
  __atomic_store_n(counter, 0, __ATOMIC_SEQ_CST);

  // (a) send/recv: the client's hello, then our reply.
  std::string msg = Check("receive hello", peer.RecvMsg());
  Check("hello", Expect(msg, kHello));
  Check("send reply", peer.SendMsg(kReply));

  // The remote keys, one message each (RemoteKey is serializable).
  Check("send buffer key", peer.SendMsg(target_mr->remote_key().Serialize()));
  Check("send counter key", peer.SendMsg(counter_mr->remote_key().Serialize()));

  // (b) RDMA write. Waiting here also drives our progress, which serves
  // the write where the provider emulates it over its control channel.
  msg = Check("receive write notice", peer.RecvMsg());
  Check("write notice", Expect(msg, absl::StrCat("wrote ", kRdmaBytes)));
  for (size_t i = 0; i < kRdmaBytes; ++i) {
    if (target[i] != Pattern(i)) {
      std::string why = absl::StrCat("byte ", i, " is ", target[i], ", expected ", Pattern(i));
      (void)peer.SendMsg(why);
      Fail("RDMA write", absl::DataLossError(why));
    }
  }
  std::printf("provider_example: RDMA write: %zu bytes verified byte-exact by the server\n",
              kRdmaBytes);
  std::fflush(stdout);
  Check("send write verdict", peer.SendMsg("verified"));

  // (c) fetch-add: the client says when it is done; the counter must say N.
  msg = Check("receive fetch-add notice", peer.RecvMsg());
  Check("fetch-add notice", Expect(msg, absl::StrCat("fetch-added ", kFetchAdds)));
  const uint64_t total = __atomic_load_n(counter, __ATOMIC_SEQ_CST);
  Check("send counter", peer.SendMsg(absl::StrCat("counter ", total)));
  if (total != kFetchAdds) {
    Fail("fetch-add", absl::DataLossError(absl::StrCat("counter is ", total, ", expected ",
                                                       kFetchAdds)));
  }

  // The client closes first; keep progressing until it has exited.
  int status = 0;
  for (;;) {
    pid_t r = waitpid(g_child, &status, WNOHANG);
    if (r == g_child) break;
    if (r < 0) Fail("waitpid", absl::InternalError(std::strerror(errno)));
    peer.Progress(absl::Milliseconds(10));
  }
  g_child = 0;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    Fail("client", absl::InternalError(absl::StrCat("the client failed (wait status ",
                                                    status, ")")));
  }
  std::printf("provider_example: %s: send/recv, RDMA write, fetch-add OK\n", config.c_str());
  return 0;
}

// ---- the client (child) ----

int RunClient(const std::string& config, int addr_pipe) {
  std::string address;
  char buf[256];
  for (ssize_t n; (n = read(addr_pipe, buf, sizeof(buf))) > 0;) address.append(buf, n);
  close(addr_pipe);
  if (address.empty()) Fail("reading the address", absl::AbortedError("the server gave none"));

  auto fabric = Check("Fabric::Open(\"" + config + "\")", Fabric::Open(config));
  auto cq = Check("CreateCq", fabric->CreateCq());
  auto ep = Check("Connect(" + address + ")", fabric->Connect(address, cq.get(), kTimeout));
  Peer peer(fabric.get(), std::move(cq), std::move(ep));
  const zsock::EndpointInfo& info = peer.ep()->info();
  std::printf("provider_example: connected to %s (RDMA write %s; atomics %s, on allocated "
              "memory %s)\n", info.peer_address.c_str(),
              std::string(zsock::SupportName(info.rdma_write)).c_str(),
              std::string(zsock::SupportName(info.atomics)).c_str(),
              std::string(zsock::SupportName(peer.fabric()->caps().atomics_allocated)).c_str());

  // (a) send/recv: receive posted before our send, so the reply has a place.
  const uint64_t recv_ctx = peer.NextContext(), send_ctx = peer.NextContext();
  Check("PostRecv", peer.PostRecv(recv_ctx));
  Check("Send", peer.Send(kHello, send_ctx));
  Check("send hello", peer.Await(send_ctx));
  Check("receive reply", peer.Await(recv_ctx));
  Check("reply", Expect(peer.Received(), kReply));
  std::printf("provider_example: send/recv: %zu bytes out, %zu bytes back OK\n",
              sizeof(kHello) - 1, sizeof(kReply) - 1);
  std::fflush(stdout);

  RemoteKey target = Check("buffer key", RemoteKey::Parse(Check("receive key", peer.RecvMsg())));
  RemoteKey counter = Check("counter key", RemoteKey::Parse(Check("receive key", peer.RecvMsg())));

  // (b) RDMA write, split at the provider's largest single RMA, all
  // pieces in flight at once.
  std::vector<uint8_t> data(kRdmaBytes);
  for (size_t i = 0; i < kRdmaBytes; ++i) data[i] = Pattern(i);
  auto data_mr = Check("register write source", peer.fabric()->RegisterMemory(
      data.data(), data.size(), zsock::kLocalRead));
  const size_t max_rma = peer.fabric()->caps().max_rma_size;
  const size_t piece = max_rma > 0 && max_rma < kRdmaBytes ? max_rma : kRdmaBytes;
  std::vector<uint64_t> writes;
  for (size_t off = 0; off < kRdmaBytes; off += piece) {
    const size_t len = std::min(piece, kRdmaBytes - off);
    writes.push_back(peer.NextContext());
    Check("Write", peer.ep()->Write(data.data() + off, len, data_mr.get(), target.addr + off,
                                    target, writes.back()));
  }
  for (uint64_t ctx : writes) Check("RDMA write completion", peer.Await(ctx));
  Check("send write notice", peer.SendMsg(absl::StrCat("wrote ", kRdmaBytes)));
  Check("server's verdict on the write", Expect(Check("receive verdict", peer.RecvMsg()),
                                                "verified"));

  // (c) fetch-add: N times +1; the old values must be 0, 1, ..., N-1.
  for (uint64_t i = 0; i < kFetchAdds; ++i) {
    uint64_t old = ~uint64_t{0};
    const uint64_t ctx = peer.NextContext();
    Check("FetchAdd", peer.ep()->FetchAdd(&old, counter.addr, counter, 1, ctx));
    Check("fetch-add completion", peer.Await(ctx));
    if (old != i) {
      Fail("fetch-add", absl::DataLossError(absl::StrCat("fetch-add ", i, " returned ", old)));
    }
  }
  Check("send fetch-add notice", peer.SendMsg(absl::StrCat("fetch-added ", kFetchAdds)));
  Check("server's counter", Expect(Check("receive counter", peer.RecvMsg()),
                                   absl::StrCat("counter ", kFetchAdds)));
  std::printf("provider_example: fetch-add: %llu fetch-adds returned 0..%llu, server counter %llu\n",
              static_cast<unsigned long long>(kFetchAdds),
              static_cast<unsigned long long>(kFetchAdds - 1),
              static_cast<unsigned long long>(kFetchAdds));
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string config = argc > 1 ? argv[1] : "unet";
  int fds[2];
  if (pipe(fds) != 0) {
    std::perror("provider_example: pipe");
    return 1;
  }
  std::fflush(nullptr);
  const pid_t pid = fork();  // before any fabric exists
  if (pid < 0) {
    std::perror("provider_example: fork");
    return 1;
  }
  signal(SIGALRM, OnAlarm);
  alarm(60);  // a hang fails (alarms are not inherited: both set one)
  if (pid == 0) {
    g_role = "client";
    close(fds[1]);
    int rc = RunClient(config, fds[0]);
    std::fflush(nullptr);
    _exit(rc);
  }
  g_role = "server";
  g_child = pid;
  close(fds[0]);
  return RunServer(config, fds[1]);
}
