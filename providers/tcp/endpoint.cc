// A tcp endpoint: frames out through a send queue, frames in through a
// parser, and what happens when the connection ends.
//
// Sending: a frame goes to the kernel at once when nothing is queued
// before it. What the kernel does not take waits in out_, pointing into
// the caller's buffer (kept by the caller until the completion) or, for
// control frames and injected sends, whose callers keep nothing, into a
// copy. Progress writes the rest when epoll says the socket is writable.
//
// Receiving: one recv per readable event, then every whole frame in the
// bytes read is handled. A user message fills the oldest posted receive,
// or waits in unexpected_ for one; a control message goes to core
// (DeliverControl) once our lock is released, since core may send its
// answer from inside.
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "providers/tcp/tcp.h"

namespace zsock::tcp {
namespace {

// What one recv reads at most.
constexpr size_t kReadChunk = 64 << 10;
// Frames per sendmsg when the queue is written.
constexpr size_t kWriteBatch = 32;

struct OutFrame {
  FrameHeader h;
  const uint8_t* data;  // the payload: the caller's buffer, or `copy`
  uint64_t context;
  bool report;      // a completion follows (not for control frames or injected sends)
  size_t sent = 0;  // bytes of header and payload the kernel took
  std::vector<uint8_t> copy;
  size_t size() const { return kHeaderSize + h.length; }
};

struct PostedRecv {
  uint8_t* buf;
  size_t len;
  uint64_t context;
};

// The frame being received (h.kind 0: none) and where its payload goes:
// a posted receive's buffer, `owned` (control frames, and messages nobody
// posted a receive for yet), or nowhere (a message too long for its
// receive).
struct Incoming {
  FrameHeader h{};
  size_t got = 0;
  std::optional<PostedRecv> recv;
  bool keep = false;
  std::vector<uint8_t> owned;
};

}  // namespace

class TcpEndpoint final : public Endpoint {
 public:
  TcpEndpoint(TcpFabric* fabric, TcpCq* cq, Fd sock, EndpointInfo info)
      : Endpoint(fabric, cq),
        tcq_(cq),
        sock_(std::move(sock)),
        info_(std::move(info)),
        buf_(kReadChunk) {}
  ~TcpEndpoint() override {
    Close();
    tcq_->WaitForProgress();
  }

  const EndpointInfo& info() const override { return info_; }
  int fd() const { return sock_.get(); }

  absl::Status Send(const void* buf, size_t len, MemoryRegion*, uint64_t context) override {
    return Enqueue(kUserFrame, static_cast<const uint8_t*>(buf), len, context);
  }
  absl::Status SendControl(std::span<const uint8_t> msg) override {
    return Enqueue(kControlFrame, msg.data(), msg.size(), 0);
  }
  absl::Status PostRecv(void* buf, size_t len, MemoryRegion*, uint64_t context) override;
  void Close() override;
  size_t Ready(uint32_t events);

 private:
  using ControlList = std::vector<std::vector<uint8_t>>;

  absl::Status Enqueue(uint8_t kind, const uint8_t* data, size_t len, uint64_t context);
  void WriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AdvanceLocked(size_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReadLocked(ControlList* control) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ParseLocked(ControlList* control) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool StartFrameLocked(const FrameHeader& h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishFrameLocked(ControlList* control) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Deliver(const PostedRecv& r, const std::vector<uint8_t>& msg);
  void FailLocked(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void Report(OpType op, uint64_t context, size_t length, absl::Status status) {
    cq()->Push(Completion{context, op, length, this, std::move(status)});
  }
  void TooLong(const PostedRecv& r, size_t length) {
    Report(OpType::kRecv, r.context, 0,
           MakeError(absl::StatusCode::kOutOfRange, EMSGSIZE,
                     absl::StrCat("a ", length, "-byte message arrived for a ", r.len,
                                  "-byte receive, and was discarded"),
                     "post receives as large as the largest message the peer sends"));
  }
  // The connection's end, as every operation on it reports it.
  absl::Status Ended(int err, absl::string_view how) const {
    if (err == 0 || err == EPIPE) err = ECONNRESET;  // the peer's end, whoever saw it
    return MakeError(absl::StatusCode::kAborted, err,
                     absl::StrCat("the tcp connection with ", info_.peer_address, " ended", how),
                     "check the peer's log: its endpoint was closed or its process ended");
  }

  TcpCq* const tcq_;
  const Fd sock_;
  const EndpointInfo info_;

  Mutex mu_;
  // OK while the connection works; afterwards why not, and every
  // operation fails with it.
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  // A send failed: the peer is gone. Writing stops, and the reading side
  // ends the connection once it has read what the peer sent before.
  int write_errno_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<OutFrame> out_ ABSL_GUARDED_BY(mu_);
  bool watching_writable_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<PostedRecv> posted_ ABSL_GUARDED_BY(mu_);
  // Messages that arrived before their receive; empty while posted_ is not.
  std::deque<std::vector<uint8_t>> unexpected_ ABSL_GUARDED_BY(mu_);
  Incoming in_ ABSL_GUARDED_BY(mu_);
  std::vector<uint8_t> buf_ ABSL_GUARDED_BY(mu_);  // [0, tail_) read, not yet parsed
  size_t tail_ ABSL_GUARDED_BY(mu_) = 0;
};

absl::StatusOr<std::unique_ptr<Endpoint>> NewEndpoint(TcpFabric* fabric, TcpCq* cq, Fd sock,
                                                      EndpointInfo info) {
  auto ep = std::make_unique<TcpEndpoint>(fabric, cq, std::move(sock), std::move(info));
  if (cq->Control(EPOLL_CTL_ADD, ep->fd(), EPOLLIN, ep.get()) != 0) {
    return ErrnoError(errno, "adding a connection to a tcp CQ's epoll set failed",
                      "raise the fd limit (ulimit -n)");
  }
  return std::unique_ptr<Endpoint>(std::move(ep));
}

size_t OnReady(TcpEndpoint* ep, uint32_t events) { return ep->Ready(events); }

// ---------------------------------------------------------------- sending

absl::Status TcpEndpoint::Enqueue(uint8_t kind, const uint8_t* data, size_t len, uint64_t context) {
  const bool inject = kind == kUserFrame && context == kInjectContext;
  if (len > (inject ? kInjectSize : kMaxMessage)) {
    return MakeError(
        absl::StatusCode::kInvalidArgument, EMSGSIZE,
        absl::StrCat("a ", inject ? "injected " : "", "send of ", len, " bytes exceeds tcp's ",
                     inject ? "inject_size " : "max_msg_size ", inject ? kInjectSize : kMaxMessage),
        "send less at a time");
  }
  MutexLock lock(&mu_);
  if (!failed_.ok()) return failed_;
  const bool idle = out_.empty();
  out_.push_back(OutFrame{
      {static_cast<uint32_t>(len), kind, {}}, data, context, kind == kUserFrame && !inject});
  if (idle) WriteLocked();  // else it waits behind the others
  // Still queued (then it is the last): a copy, unless the caller keeps
  // its buffer until the completion.
  if (!out_.empty() && !out_.back().report && len > 0) {
    OutFrame& f = out_.back();
    f.copy.assign(data, data + len);
    f.data = f.copy.data();
  }
  return absl::OkStatus();
}

void TcpEndpoint::WriteLocked() {
  while (!out_.empty() && write_errno_ == 0) {
    iovec iov[2 * kWriteBatch];
    size_t n_iov = 0, want = 0;
    for (size_t i = 0; i < out_.size() && i < kWriteBatch; ++i) {
      const OutFrame& f = out_[i];
      want += f.size() - f.sent;
      auto* h = reinterpret_cast<const uint8_t*>(&f.h);
      if (f.sent < kHeaderSize) {
        iov[n_iov++] = {const_cast<uint8_t*>(h + f.sent), kHeaderSize - f.sent};
      }
      const size_t done = f.sent > kHeaderSize ? f.sent - kHeaderSize : 0;
      if (f.h.length > done) {
        iov[n_iov++] = {const_cast<uint8_t*>(f.data + done), f.h.length - done};
      }
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n_iov;
    const ssize_t n = ::sendmsg(sock_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) write_errno_ = errno;
    if (n < 0) break;
    AdvanceLocked(static_cast<size_t>(n));
    if (static_cast<size_t>(n) < want) break;  // the kernel's buffer is full
  }
  // Writable wake-ups only while a queue waits for them: an idle socket is
  // always writable, and would keep wait_fd readable.
  const bool want_writable = !out_.empty() && write_errno_ == 0;
  if (want_writable != watching_writable_) {
    const uint32_t events = want_writable ? EPOLLIN | EPOLLOUT : uint32_t{EPOLLIN};
    tcq_->Control(EPOLL_CTL_MOD, sock_.get(), events, this);
    watching_writable_ = want_writable;
  }
}

void TcpEndpoint::AdvanceLocked(size_t n) {
  while (n > 0) {
    OutFrame& f = out_.front();
    const size_t rest = f.size() - f.sent;
    if (n < rest) {
      f.sent += n;
      return;
    }
    n -= rest;
    if (f.report) Report(OpType::kSend, f.context, f.h.length, absl::OkStatus());
    out_.pop_front();
  }
}

// ---------------------------------------------------------------- receiving

absl::Status TcpEndpoint::PostRecv(void* buf, size_t len, MemoryRegion*, uint64_t context) {
  MutexLock lock(&mu_);
  const PostedRecv r{static_cast<uint8_t*>(buf), len, context};
  // Messages that came first are delivered, also from a peer gone since.
  if (!unexpected_.empty()) {
    Deliver(r, unexpected_.front());
    unexpected_.pop_front();
    return absl::OkStatus();
  }
  if (!failed_.ok()) return failed_;
  posted_.push_back(r);
  return absl::OkStatus();
}

void TcpEndpoint::Deliver(const PostedRecv& r, const std::vector<uint8_t>& msg) {
  if (msg.size() > r.len) return TooLong(r, msg.size());
  if (!msg.empty()) std::memcpy(r.buf, msg.data(), msg.size());
  Report(OpType::kRecv, r.context, msg.size(), absl::OkStatus());
}

size_t TcpEndpoint::Ready(uint32_t events) {
  ControlList control;
  absl::Status ended;
  {
    MutexLock lock(&mu_);
    if (!failed_.ok()) return 0;  // an event from before it left the set
    // Reading first: what the peer sent before it went comes first.
    if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) ReadLocked(&control);
    if ((events & EPOLLOUT) && failed_.ok()) WriteLocked();
    ended = failed_;
  }
  for (const auto& msg : control) DeliverControl(msg);
  if (!ended.ok()) FailEmulated(ended);
  return 1;
}

void TcpEndpoint::ReadLocked(ControlList* control) {
  const ssize_t n = ::recv(sock_.get(), buf_.data() + tail_, buf_.size() - tail_, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n < 0) return FailLocked(Ended(errno, " while receiving"));
  if (n == 0) {  // the peer's end; after a failed send, that send's errno says more
    const bool mid = in_.h.kind != 0 || tail_ > 0;
    return FailLocked(
        Ended(write_errno_, mid ? " in the middle of a message" : ": the peer closed it"));
  }
  tail_ += static_cast<size_t>(n);
  ParseLocked(control);
}

void TcpEndpoint::ParseLocked(ControlList* control) {
  size_t head = 0;
  for (;;) {
    if (in_.h.kind == 0) {
      if (tail_ - head < kHeaderSize) break;
      FrameHeader h;
      std::memcpy(&h, buf_.data() + head, kHeaderSize);
      head += kHeaderSize;
      if (!StartFrameLocked(h)) return;
    }
    const size_t take = std::min(tail_ - head, in_.h.length - in_.got);
    const uint8_t* p = buf_.data() + head;
    if (take > 0 && in_.recv) std::memcpy(in_.recv->buf + in_.got, p, take);
    if (in_.keep) in_.owned.insert(in_.owned.end(), p, p + take);
    in_.got += take;
    head += take;
    if (in_.got < in_.h.length) break;
    FinishFrameLocked(control);
  }
  // Payloads are taken as they come, so at most a partial header is left.
  std::memmove(buf_.data(), buf_.data() + head, tail_ - head);
  tail_ -= head;
}

bool TcpEndpoint::StartFrameLocked(const FrameHeader& h) {
  if ((h.kind != kUserFrame && h.kind != kControlFrame) || h.length > kMaxMessage) {
    FailLocked(MakeError(absl::StatusCode::kAborted, EPROTO,
                         absl::StrCat("malformed frame from the tcp peer ", info_.peer_address,
                                      " (kind ", h.kind, ", ", h.length, " bytes)"),
                         "run the same zsock version on both ends"));
    return false;
  }
  in_.h = h;
  // `owned` grows as bytes arrive: a header alone commits no memory.
  in_.keep = h.kind == kControlFrame || posted_.empty();
  if (in_.keep) return true;
  const PostedRecv r = posted_.front();
  posted_.pop_front();
  if (h.length <= r.len) {
    in_.recv = r;
  } else {
    TooLong(r, h.length);  // and its bytes are dropped as they arrive
  }
  return true;
}

void TcpEndpoint::FinishFrameLocked(ControlList* control) {
  Incoming done = std::exchange(in_, Incoming{});
  if (done.h.kind == kControlFrame) {
    control->push_back(std::move(done.owned));
  } else if (done.recv) {
    Report(OpType::kRecv, done.recv->context, done.h.length, absl::OkStatus());
  } else if (done.keep && !posted_.empty()) {  // posted while it arrived
    Deliver(posted_.front(), done.owned);
    posted_.pop_front();
  } else if (done.keep) {
    unexpected_.push_back(std::move(done.owned));
  }
}

// ---------------------------------------------------------------- the end

// Fails every outstanding operation with `why`. The caller tells core
// (FailEmulated) once our lock is released.
void TcpEndpoint::FailLocked(absl::Status why) {
  failed_ = why;
  tcq_->Control(EPOLL_CTL_DEL, sock_.get(), 0, nullptr);
  for (const OutFrame& f : out_) {
    if (f.report) Report(OpType::kSend, f.context, 0, why);
  }
  out_.clear();
  if (in_.recv) Report(OpType::kRecv, in_.recv->context, 0, why);
  in_ = Incoming{};
  for (const PostedRecv& r : posted_) Report(OpType::kRecv, r.context, 0, why);
  posted_.clear();
}

void TcpEndpoint::Close() {
  absl::Status why;
  {
    MutexLock lock(&mu_);
    unexpected_.clear();
    if (!failed_.ok()) return;
    why = MakeError(absl::StatusCode::kCancelled, ECANCELED, "the tcp endpoint was closed");
    FailLocked(why);
    // Graceful: a FIN after the bytes the kernel holds, which the peer
    // reads before it sees the end.
    ::shutdown(sock_.get(), SHUT_WR);
  }
  FailEmulated(why);
}

}  // namespace zsock::tcp
