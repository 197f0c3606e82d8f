// zsock::Socket: see socket.h.
#include "sockets/socket.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/config.h"
#include "core/log.h"
#include "core/status.h"
#include "sockets/stats_fields.h"
#include "sockets/zsock.h"

namespace zsock {
namespace {

// An error carrying errno `e` (and the status code that goes with it).
absl::Status Err(int e, absl::string_view what, absl::string_view fix = {}) {
  return ErrnoError(e, what, fix);
}
absl::Status ErrnoStatus(int e, absl::string_view what, absl::string_view fix = {}) {
  return ErrnoError(e, what, fix);
}

bool WouldBlock(const absl::Status& s) {
  int e = StatusErrno(s);
  return e == EAGAIN || e == EWOULDBLOCK;
}

// SO_RCVTIMEO / SO_SNDTIMEO (in microseconds, 0: none) as a deadline that
// reads the clock only if the call waits (sdp::Deadline says why).
sdp::Deadline DeadlineFrom(const std::atomic<int64_t>& us) {
  const int64_t v = us.load(std::memory_order_relaxed);
  if (v == 0) return absl::InfiniteFuture();
  return sdp::Deadline::After(absl::Microseconds(v));
}

// The source address the kernel would use to reach `to` (connect on a UDP
// socket sends nothing), with port 0.
SocketAddress SourceFor(const SocketAddress& to) {
  SocketAddress out;
  Fd udp(::socket(to.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (udp && ::connect(udp.get(), to.get(), to.len) == 0) {
    out.len = sizeof(out.storage);
    if (::getsockname(udp.get(), reinterpret_cast<sockaddr*>(&out.storage), &out.len) == 0) {
      out.set_port(0);
      return out;
    }
  }
  auto loop = ParseSocketAddress(to.family() == AF_INET6 ? "[::1]:0" : "127.0.0.1:0");
  return loop.ok() ? *loop : out;
}

// Binds a kernel TCP socket to `addr` to hold its port (SO_REUSEADDR, never
// listening: a provider's own listener may bind the port later). Updates
// `addr` with the port the kernel picked for port 0.
absl::StatusOr<Fd> ReservePort(SocketAddress* addr) {
  Fd fd(::socket(addr->family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoStatus(errno, "socket() to reserve a port failed");
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), addr->get(), addr->len) != 0) {
    int e = errno;
    return ErrnoStatus(e, absl::StrCat("bind to ", addr->ToString(), " failed"),
                       e == EADDRINUSE      ? "the port is in use; pick another or use port 0"
                       : e == EADDRNOTAVAIL ? "use an address of this host"
                                            : "");
  }
  auto bound = ParseSocketAddress(BoundAddress(fd.get()));
  if (bound.ok()) addr->set_port(bound->port());
  return fd;
}

}  // namespace

// ------------------------------------------------------------ engine

absl::StatusOr<sdp::Engine*> SocketEngine() {
  static std::once_flag once;
  static absl::StatusOr<sdp::Engine*>* result;
  std::call_once(once, [] {
    sdp::EngineOptions options;
    options.progress_thread = true;  // fds stay live while the program sleeps in epoll
    auto engine = sdp::Engine::Create(options);
    if (engine.ok()) {
      // Lives until exit: sockets may be used from atexit handlers and
      // static destructors.
      result = new absl::StatusOr<sdp::Engine*>(engine->release());
    } else {
      ZS_LOG(kError, "zsock sockets cannot start: %s", engine.status().ToString());
      result = new absl::StatusOr<sdp::Engine*>(engine.status());
    }
  });
  return *result;
}

// ------------------------------------------------------------ table

namespace {

// By fd number under a reader/writer lock; each change also bumps the
// generation of the fd's bucket, which FindSocket's per-thread cache
// checks with one plain atomic load: a send or receive then takes no lock
// here (the reader lock's two read-modify-writes were a tenth of a small
// send's cost in the sockets layer).
constexpr size_t kGenBuckets = 4096;

struct Table {
  SharedMutex mu;
  std::vector<std::shared_ptr<Socket>> by_fd ABSL_GUARDED_BY(mu);
  std::atomic<uint64_t> gen[kGenBuckets] = {};  // bumped under mu (writer)
};

Table& GetTable() {
  static Table* t = new Table;
  return *t;
}

std::atomic<uint64_t>& GenOf(Table& t, int fd) {
  return t.gen[static_cast<size_t>(fd) % kGenBuckets];
}

// A thread's last lookups, direct-mapped by fd. An entry is good while its
// bucket's generation is unchanged (any Add or Remove in the bucket
// invalidates it). It keeps a closed socket's object (not its fd or
// connection, which Close releases) until replaced or the thread ends.
struct CachedSocket {
  int fd = -1;
  uint64_t gen = 0;
  std::shared_ptr<Socket> socket;
};
constexpr size_t kCacheEntries = 8;
thread_local CachedSocket t_cache[kCacheEntries];

}  // namespace

namespace {
// This thread's cache entry for fd, refreshed from the table when stale.
const std::shared_ptr<Socket>& Lookup(int fd) {
  static const std::shared_ptr<Socket> kNone;
  if (fd < 0) return kNone;
  Table& t = GetTable();
  CachedSocket& e = t_cache[static_cast<size_t>(fd) % kCacheEntries];
  const uint64_t gen = GenOf(t, fd).load(std::memory_order_acquire);
  if (e.fd == fd && e.gen == gen) return e.socket;
  t.mu.ReaderLock();
  std::shared_ptr<Socket> s =
      static_cast<size_t>(fd) < t.by_fd.size() ? t.by_fd[static_cast<size_t>(fd)] : nullptr;
  // Read under the lock: writers bump it under the writer lock, after the
  // table changed.
  const uint64_t seen = GenOf(t, fd).load(std::memory_order_relaxed);
  t.mu.ReaderUnlock();
  e.fd = fd;
  e.gen = seen;
  e.socket = std::move(s);
  return e.socket;
}
}  // namespace

std::shared_ptr<Socket> FindSocket(int fd) { return Lookup(fd); }

Socket* FindSocketForCall(int fd) { return Lookup(fd).get(); }

void AddSocket(std::shared_ptr<Socket> s) {
  Table& t = GetTable();
  t.mu.Lock();
  const int fd = s->fd();
  const size_t i = static_cast<size_t>(fd);
  if (i >= t.by_fd.size()) t.by_fd.resize(std::max(i + 1, t.by_fd.size() * 2));
  t.by_fd[i] = std::move(s);
  GenOf(t, fd).fetch_add(1, std::memory_order_release);
  t.mu.Unlock();
}

std::shared_ptr<Socket> RemoveSocket(int fd) {
  if (fd < 0) return nullptr;
  Table& t = GetTable();
  t.mu.Lock();
  std::shared_ptr<Socket> s;
  if (static_cast<size_t>(fd) < t.by_fd.size()) s = std::move(t.by_fd[static_cast<size_t>(fd)]);
  GenOf(t, fd).fetch_add(1, std::memory_order_release);
  t.mu.Unlock();
  // This thread's entry goes now (other threads' go at their next lookup).
  CachedSocket& e = t_cache[static_cast<size_t>(fd) % kCacheEntries];
  if (e.fd == fd) e = CachedSocket{};
  return s;
}

// ------------------------------------------------------------ Socket

Socket::Socket(int family, std::unique_ptr<ReadinessFd> rfd, bool nonblocking)
    : family_(family), fd_(rfd->fd()), nonblocking_(nonblocking), rfd_(std::move(rfd)) {}

Socket::~Socket() {
  (void)Close();
}

absl::StatusOr<std::shared_ptr<Socket>> Socket::Create(int family, int flags) {
  if (family != AF_INET && family != AF_INET6) {
    return Err(EAFNOSUPPORT, absl::StrCat("zsock sockets are AF_INET or AF_INET6, not ", family));
  }
  auto engine = SocketEngine();
  if (!engine.ok()) return engine.status();
  auto rfd = ReadinessFd::Create((flags & SOCK_CLOEXEC) != 0);
  if (!rfd.ok()) return rfd.status();
  return std::shared_ptr<Socket>(
      new Socket(family, std::move(*rfd), (flags & SOCK_NONBLOCK) != 0));
}

absl::StatusOr<std::shared_ptr<Socket>> Socket::FromConnection(
    int family, std::unique_ptr<sdp::Connection> conn, int flags) {
  auto rfd = ReadinessFd::Create((flags & SOCK_CLOEXEC) != 0);
  if (!rfd.ok()) return rfd.status();
  std::shared_ptr<Socket> s(new Socket(family, std::move(*rfd), (flags & SOCK_NONBLOCK) != 0));
  MutexLock lock(&s->mu_);
  s->Attach(std::shared_ptr<sdp::Connection>(std::move(conn)));
  return s;
}

sdp::ConnectionOptions Socket::OptionsLocked() const {
  sdp::ConnectionOptions o = sdp::ConnectionOptions::FromConfig();
  // Linux reports twice what was set for SO_RCVBUF/SO_SNDBUF; zsock uses the
  // value as given, with the engine's floor.
  if (rcvbuf_ > 0) o.rcvbuf = std::max<size_t>(static_cast<size_t>(rcvbuf_), 4 * 1024);
  if (sndbuf_ > 0) o.sndbuf = std::max<size_t>(static_cast<size_t>(sndbuf_), 4 * 1024);
  if (o.buf_size * 4 > o.rcvbuf) o.buf_size = std::max<size_t>(o.rcvbuf / 4, 1024);
  if (linger_.l_onoff) o.linger = absl::Seconds(linger_.l_linger);
  if (mode_ >= 0) o.mode = static_cast<sdp::Mode>(mode_);
  if (zcopy_threshold_ >= 0) o.zcopy_threshold = static_cast<size_t>(zcopy_threshold_);
  if (autocork_ >= 0) o.autocork = autocork_ != 0;
  return o;
}

void Socket::UpdateFastLocked() {
  const bool fast = state_ == State::kConnected && conn_ != nullptr && !shut_rd_ && !shut_wr_;
  fast_conn_.store(fast ? conn_.get() : nullptr, std::memory_order_release);
}

void Socket::Attach(std::shared_ptr<sdp::Connection> conn) {
  conn_ = conn;
  pinned_conn_ = conn;
  state_ = State::kConnected;
  UpdateFastLocked();
  if (peer_.len == 0) {
    // The address the peer's socket announced in its SDP Hello; else the
    // provider's view of the peer.
    auto a = ParseSocketAddress(conn->peer_socket_address());
    if (!a.ok()) a = ParseSocketAddress(conn->peer_address());
    if (a.ok()) peer_ = *a;
  }
  std::weak_ptr<Socket> weak = weak_from_this();
  // No reference to the connection in the callback: it runs in the
  // engine's callback batch, and a last reference dropped there would close
  // the connection inside the batch (which waits for the batch: deadlock).
  conn->SetReadinessCallback([weak](uint32_t r) {
    if (auto self = weak.lock()) self->OnReadiness(r);
  });
  {
    MutexLock rl(&rfd_mu_);
    watch_ = conn->readiness_watch();
    live_conn_ = conn.get();
  }
  OnReadiness(conn->readiness());
}

// The mirror only ever turns readiness on here; it is turned off by the
// call that found nothing to do (MarkUnreadable / MarkUnwritable), so a
// socket that stays busy costs no system calls (sockets/readiness.h), and,
// with the watch narrowed to the bits the mirror shows off, no callbacks.
void Socket::OnReadiness(uint32_t r) {
  MutexLock lock(&rfd_mu_);
  if (!rfd_) return;
  constexpr uint32_t kDataBits = sdp::kReadable | sdp::kWritable;
  if (live_conn_ != nullptr && (r & kDataBits) != 0) {
    // The engine computed `r` before this callback ran. Meanwhile a call
    // may have taken the data (or the room) and turned the bit off
    // (MarkNotReady): set from `r` alone, poll would report a readiness
    // that is gone, and a recv right after it say EAGAIN (seen once in CI,
    // PollFollowsEveryReadinessTransition under load). Only what still
    // holds turns the mirror on; the engine calls again on the next change
    // (the watch takes the bit back in below).
    r &= ~kDataBits | live_conn_->readiness();
  }
  if (r & (sdp::kError | sdp::kHup)) {
    rfd_->SetHangup();
  } else {
    if (r & sdp::kRdHup) rfd_->SetEndOfStream();
    if (r & sdp::kReadable) rfd_->SetReadable(true);
    if (r & sdp::kWritable) rfd_->SetWritable(true);
  }
  WatchLocked();
}

void Socket::WatchLocked() {
  if (!watch_ || !rfd_) return;
  uint32_t bits = sdp::kError | sdp::kHup | sdp::kRdHup;
  if (!rfd_->readable()) bits |= sdp::kReadable;
  if (!rfd_->writable()) bits |= sdp::kWritable;
  // seq_cst: see Engine::NoteReadinessLocked.
  watch_->store(bits, std::memory_order_seq_cst);
}

void Socket::MarkUnreadable() { MarkNotReady(sdp::kReadable); }

void Socket::MarkUnwritable() { MarkNotReady(sdp::kWritable); }

void Socket::MarkNotReady(uint32_t bit) {
  auto c = conn();
  MutexLock lock(&rfd_mu_);
  if (!rfd_) return;
  const auto set = [&](bool on) {
    if (bit == sdp::kReadable) {
      rfd_->SetReadable(on);
    } else {
      rfd_->SetWritable(on);
    }
  };
  set(false);
  if (!c) return;
  // The connection may have become ready between the failed call and here,
  // unreported (the watch left the bit out while the mirror showed it):
  // watch again, then look.
  WatchLocked();
  if (c->readiness() & (bit | sdp::kError | sdp::kHup)) set(true);
  WatchLocked();
}

std::shared_ptr<sdp::Connection> Socket::conn() const {
  MutexLock lock(&mu_);
  return conn_;
}

absl::Status Socket::Bind(const sockaddr* addr, socklen_t len) {
  auto a = SocketAddress::FromSockaddr(addr, len);
  if (!a.ok()) return a.status();
  if (a->family() != family_) {
    return Err(EAFNOSUPPORT, "bind: address family differs from the socket's");
  }
  MutexLock lock(&mu_);
  if (state_ != State::kNew) return Err(EINVAL, "bind: the socket is already bound");
  if (reuseaddr_ == 0 || a->port() == 0) {
    auto fd = ReservePort(&*a);
    if (!fd.ok()) return fd.status();
    port_reservation_ = std::move(*fd);
  }
  local_ = *a;
  state_ = State::kBound;
  return absl::OkStatus();
}

absl::Status Socket::Listen(int backlog) {
  auto engine = SocketEngine();
  if (!engine.ok()) return engine.status();
  MutexLock lock(&mu_);
  // As listen(2): at least one, at most SOMAXCONN finished connections wait.
  const size_t queue = static_cast<size_t>(std::clamp(backlog, 1, SOMAXCONN));
  if (state_ == State::kListening) {
    backlog_ = queue;  // adjusts the backlog, as listen(2) does
    if (listener_ && backlog > 0) ::listen(listener_->fd(), backlog);
    accepted_cv_.SignalAll();
    return absl::OkStatus();
  }
  if (state_ != State::kNew && state_ != State::kBound) {
    return Err(EINVAL, "listen: the socket is connected or connecting");
  }
  if (state_ == State::kNew) {
    auto any = ParseSocketAddress(family_ == AF_INET6 ? "[::]:0" : "0.0.0.0:0");
    if (!any.ok()) return any.status();
    auto fd = ReservePort(&*any);
    if (!fd.ok()) return fd.status();
    port_reservation_ = std::move(*fd);
    local_ = *any;
  }
  // The provider's listener takes the port over from the reservation.
  port_reservation_.reset();
  sdp::ConnectionOptions options = OptionsLocked();
  auto l = (*engine)->Listen(local_.ToString(), options);
  if (!l.ok()) return l.status();
  int efd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (efd < 0) return ErrnoStatus(errno, "eventfd for a listening socket failed");
  acceptor_stop_ = Fd(efd);
  // The program's fd is readable while a finished connection waits; a
  // listening socket is never writable (as in the kernel).
  {
    MutexLock rl(&rfd_mu_);
    rfd_->SetReadable(false);
    rfd_->SetWritable(false);
  }
  // The provider listener's kernel socket (if any) holds the
  // not-yet-accepted connections.
  if (backlog > 0) ::listen((*l)->fd(), backlog);
  backlog_ = queue;
  listener_ = std::move(*l);
  state_ = State::kListening;
  acceptor_ = std::thread([this, lp = listener_.get()] { AcceptLoop(lp); });
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Socket>> Socket::Accept(int flags, SocketAddress* peer) {
  std::unique_ptr<sdp::Connection> conn;
  {
    MutexLock lock(&mu_);
    // SO_RCVTIMEO bounds a blocking accept, as for TCP.
    const int64_t timeo_us = rcvtimeo_us_.load(std::memory_order_relaxed);
    const absl::Time deadline =
        timeo_us == 0 ? absl::InfiniteFuture() : absl::Now() + absl::Microseconds(timeo_us);
    for (;;) {
      if (state_ != State::kListening) {
        return state_ == State::kClosed ? Err(EBADF, "accept: the socket was closed")
                                        : Err(EINVAL, "accept: the socket is not listening");
      }
      if (!accepted_.empty()) break;
      if (nonblocking()) return Err(EAGAIN, "accept: no connection is waiting");
      if (accepted_cv_.WaitWithDeadline(&mu_, deadline) && accepted_.empty()) {
        return Err(EAGAIN, "accept: timed out (SO_RCVTIMEO)");
      }
    }
    conn = std::move(accepted_.front());
    accepted_.pop_front();
    if (accepted_.empty()) {
      MutexLock rl(&rfd_mu_);
      if (rfd_) rfd_->SetReadable(false);
    }
    accepted_cv_.SignalAll();  // room in the queue for the acceptor
  }
  auto s = FromConnection(family_, std::move(conn), flags);
  if (!s.ok()) return s.status();
  {
    MutexLock lock(&(*s)->mu_);
    {
      // This end of the connection: the listener's address, with the
      // wildcard replaced by the local address that reaches the peer.
      MutexLock l2(&mu_);
      SocketAddress local = local_;
      if (local.is_wildcard() && (*s)->peer_.len != 0) {
        local = SourceFor((*s)->peer_);
        local.set_port(local_.port());
      }
      (*s)->local_ = local;
    }
    if (peer != nullptr) *peer = (*s)->peer_;
  }
  return s;
}

void Socket::AcceptLoop(sdp::Listener* l) {
  for (;;) {
    {
      // Like a full kernel accept queue: leave further connections waiting
      // in the provider until the program accepts.
      MutexLock lock(&mu_);
      while (state_ == State::kListening && accepted_.size() >= backlog_) accepted_cv_.Wait(&mu_);
      if (state_ != State::kListening) return;
    }
    pollfd p[2] = {{l->fd(), POLLIN, 0}, {acceptor_stop_.get(), POLLIN, 0}};
    int rc = ::poll(p, 2, -1);
    if (rc < 0) {
      if (errno == EINTR) continue;
      ZS_LOG(kError, "accept: poll on the listener failed (%s); this socket accepts no more",
             std::strerror(errno));
      return;
    }
    if (p[1].revents != 0) return;
    if (p[0].revents == 0) continue;
    // Short waits for an arrival (the fd may be readable with nothing to
    // take, e.g. libfabric's EQ), so Close is noticed; an arrived
    // connection's set-up has connect_timeout_ms (sdp::Listener::Accept).
    auto conn = l->Accept(absl::Now() + absl::Milliseconds(200));
    if (!conn.ok()) {
      // Nothing there after all (another process took it), or a client that
      // went away or stalled during set-up: not the listener's failure; the
      // program never sees it (as the kernel drops a half-open connection).
      if (StatusErrno(conn.status()) != EAGAIN && !absl::IsDeadlineExceeded(conn.status())) {
        ZS_LOG(kInfo, "accept: a connection failed during set-up: %s", conn.status().ToString());
      }
      if (p[0].revents & (POLLERR | POLLHUP | POLLNVAL)) {
        // A broken listener would wake this loop forever.
        ZS_LOG(kError, "accept: the provider's listener failed; this socket accepts no more");
        return;
      }
      continue;
    }
    MutexLock lock(&mu_);
    if (state_ != State::kListening) return;  // closed meanwhile: the connection is dropped
    accepted_.push_back(std::move(*conn));
    {
      MutexLock rl(&rfd_mu_);
      if (rfd_) rfd_->SetReadable(true);
    }
    accepted_cv_.SignalAll();
  }
}

void Socket::StopAcceptor() {
  if (!acceptor_.joinable()) return;
  uint64_t one = 1;
  (void)!::write(acceptor_stop_.get(), &one, sizeof(one));
  accepted_cv_.SignalAll();
  acceptor_.join();  // never this thread: the acceptor does not close its socket
}

absl::Status Socket::ConnectError(const absl::Status& why, const SocketAddress& to) {
  int e = StatusErrno(why);
  if (e == ENOENT || e == 0) e = ECONNREFUSED;  // unet: nobody listens on that port
  if (absl::IsDeadlineExceeded(why)) e = ETIMEDOUT;
  return MakeError(absl::StatusCode::kUnavailable, e,
                   absl::StrCat("connect to ", to.ToString(), " failed: ", why.message()));
}

absl::Status Socket::Connect(const sockaddr* addr, socklen_t len) {
  auto engine = SocketEngine();
  if (!engine.ok()) return engine.status();
  auto to = SocketAddress::FromSockaddr(addr, len);
  if (!to.ok()) return to.status();
  if (to->family() != family_) return Err(EAFNOSUPPORT, "connect: address family differs");
  if (to->port() == 0) return Err(ECONNREFUSED, "connect: port 0");
  sdp::ConnectionOptions options;
  {
    MutexLock lock(&mu_);
    switch (state_) {
      case State::kConnected:
        return Err(EISCONN, "connect: the socket is already connected");
      case State::kConnecting:
        return Err(EALREADY, "connect: a connection attempt is in progress");
      case State::kListening:
      case State::kClosed:
        return Err(EINVAL, "connect on a listening or closed socket");
      case State::kNew: {
        SocketAddress local = SourceFor(*to);
        auto fd = ReservePort(&local);
        if (fd.ok()) {
          port_reservation_ = std::move(*fd);
          local_ = local;
        }
        break;
      }
      case State::kBound:
        break;
    }
    peer_ = *to;
    state_ = State::kConnecting;
    options = OptionsLocked();
    options.local_sockaddr = local_.ToString();
  }
  const std::string target = to->ToString();
  if (nonblocking()) {
    {
      MutexLock rl(&rfd_mu_);
      rfd_->SetWritable(false);  // POLLOUT means "connected (or failed)"
    }
    std::shared_ptr<Socket> self = shared_from_this();
    std::thread([self, engine = *engine, target, options, to = *to]() mutable {
      auto conn = engine->Connect(target, options);
      MutexLock lock(&self->mu_);
      if (self->state_ != State::kConnecting) return;  // closed meanwhile
      if (conn.ok()) {
        self->Attach(std::shared_ptr<sdp::Connection>(std::move(*conn)));
      } else {
        self->so_error_ = self->ConnectError(conn.status(), to);
        self->state_ = State::kBound;
        MutexLock rl(&self->rfd_mu_);
        if (self->rfd_) self->rfd_->SetHangup();  // POLLOUT|POLLERR-like; SO_ERROR says why
      }
    }).detach();
    return Err(EINPROGRESS, "connect: in progress");
  }
  auto conn = (*engine)->Connect(target, options);
  MutexLock lock(&mu_);
  if (state_ != State::kConnecting) return Err(EBADF, "connect: the socket was closed");
  if (!conn.ok()) {
    state_ = State::kBound;
    return ConnectError(conn.status(), *to);
  }
  Attach(std::shared_ptr<sdp::Connection>(std::move(*conn)));
  return absl::OkStatus();
}

absl::StatusOr<size_t> Socket::Send(std::span<const iovec> iov, int flags) {
  const int f = nonblocking() || (flags & MSG_DONTWAIT) ? MSG_DONTWAIT : 0;
  if (sdp::Connection* fc = fast_conn_.load(std::memory_order_acquire)) {
    return SendResult(fc->Send(iov, f, DeadlineFrom(sndtimeo_us_)), flags);
  }
  std::shared_ptr<sdp::Connection> c;
  sdp::Deadline deadline = absl::InfiniteFuture();
  bool shut_wr = false;
  {
    MutexLock lock(&mu_);
    if (state_ == State::kConnecting) {
      return Err(nonblocking() || (flags & MSG_DONTWAIT) ? EAGAIN : ENOTCONN,
                 "send: the connection is not set up yet");
    }
    if (state_ != State::kConnected) return Err(state_ == State::kClosed ? EBADF : ENOTCONN,
                                                "send on an unconnected socket");
    c = conn_;
    deadline = DeadlineFrom(sndtimeo_us_);
    shut_wr = shut_wr_;
  }
  if (shut_wr) {
    // Outside mu_, and touching nothing of this socket afterwards: a
    // SIGPIPE handler may call zs_* itself (and, through the lookup cache,
    // drop the last reference to a socket another thread closed).
    absl::Status err = Err(EPIPE, "send after shutdown(SHUT_WR)");
    if (!(flags & MSG_NOSIGNAL)) ::pthread_kill(::pthread_self(), SIGPIPE);
    return err;
  }
  return SendResult(c->Send(iov, f, deadline), flags);
}

absl::StatusOr<size_t> Socket::SendResult(absl::StatusOr<size_t> n, int flags) {
  if (!n.ok() && absl::IsDeadlineExceeded(n.status())) {
    return Err(EAGAIN, "send: SO_SNDTIMEO expired");  // what send(2) reports
  }
  if (!n.ok()) {
    if (WouldBlock(n.status())) MarkUnwritable();
    if (StatusErrno(n.status()) == EPIPE && !(flags & MSG_NOSIGNAL)) {
      // What send(2) does on a TCP socket; last, as above.
      ::pthread_kill(::pthread_self(), SIGPIPE);
    }
  }
  return n;
}

absl::StatusOr<size_t> Socket::Recv(std::span<const iovec> iov, int flags) {
  int f = flags & (MSG_PEEK | MSG_WAITALL);
  if (nonblocking() || (flags & MSG_DONTWAIT)) f |= MSG_DONTWAIT;
  if (sdp::Connection* fc = fast_conn_.load(std::memory_order_acquire)) {
    return RecvResult(fc->Recv(iov, f, DeadlineFrom(rcvtimeo_us_)));
  }
  std::shared_ptr<sdp::Connection> c;
  sdp::Deadline deadline = absl::InfiniteFuture();
  {
    MutexLock lock(&mu_);
    if (state_ == State::kConnecting && (nonblocking() || (flags & MSG_DONTWAIT))) {
      return Err(EAGAIN, "recv: the connection is not set up yet");
    }
    if (state_ != State::kConnected) return Err(state_ == State::kClosed ? EBADF : ENOTCONN,
                                                "recv on an unconnected socket");
    if (shut_rd_) return size_t{0};
    c = conn_;
    deadline = DeadlineFrom(rcvtimeo_us_);
  }
  return RecvResult(c->Recv(iov, f, deadline));
}

absl::StatusOr<size_t> Socket::RecvResult(absl::StatusOr<size_t> n) {
  if (!n.ok() && absl::IsDeadlineExceeded(n.status())) {
    return Err(EAGAIN, "recv: SO_RCVTIMEO expired");
  }
  if (!n.ok() && WouldBlock(n.status())) MarkUnreadable();
  return n;
}

absl::Status Socket::Shutdown(int how) {
  if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) {
    return Err(EINVAL, "shutdown: how must be SHUT_RD, SHUT_WR or SHUT_RDWR");
  }
  std::shared_ptr<sdp::Connection> c;
  {
    MutexLock lock(&mu_);
    if (state_ != State::kConnected) return Err(ENOTCONN, "shutdown on an unconnected socket");
    c = conn_;
    if (how != SHUT_WR) shut_rd_ = true;
    if (how != SHUT_RD) shut_wr_ = true;
    UpdateFastLocked();
  }
  absl::Status s = c->Shutdown(how);
  if (how != SHUT_WR) {
    MutexLock rl(&rfd_mu_);
    if (rfd_) rfd_->SetEndOfStream();  // recv returns 0 from now on
  }
  return s;
}

absl::Status Socket::Close() {
  std::shared_ptr<sdp::Connection> c;
  std::unique_ptr<sdp::Listener> l;
  std::deque<std::unique_ptr<sdp::Connection>> unaccepted;
  bool abortive = false;
  {
    MutexLock lock(&mu_);
    if (state_ == State::kClosed) return absl::OkStatus();
    state_ = State::kClosed;
    c = std::move(conn_);
    UpdateFastLocked();
    l = std::move(listener_);
    port_reservation_.reset();
    abortive = linger_.l_onoff && linger_.l_linger == 0;
  }
  // The acceptor uses the listener: it ends (after a handshake in progress)
  // before the listener goes. Connections never accepted are reset, as the
  // kernel resets those left in a closed listener's queue.
  StopAcceptor();
  {
    MutexLock lock(&mu_);
    unaccepted.swap(accepted_);
  }
  for (auto& u : unaccepted) u->Abort();
  unaccepted.clear();
  {
    MutexLock rl(&rfd_mu_);
    live_conn_ = nullptr;  // Close below empties it: OnReadiness stops using it
  }
  if (c) {
    if (abortive) c->Abort();  // SO_LINGER {1, 0}: reset, as TCP sends RST
    // Graceful unless reset: flush and DisconnReq. Threads blocked in calls
    // on it are woken first (as by shutdown(SHUT_RDWR), or by the reset)
    // and Close waits for them to return (sdp::Connection::Close). It is
    // not left to the last owner: pinned_conn_ owns it until the socket goes.
    (void)c->Close();
    c.reset();
  }
  l.reset();
  MutexLock rl(&rfd_mu_);
  rfd_.reset();  // closes fd_
  fd_ = -1;
  return absl::OkStatus();
}

absl::Status Socket::SetOption(int level, int name, const void* value, socklen_t len) {
  auto need = [&](socklen_t n) -> absl::Status {
    if (value == nullptr || len < n) return Err(EINVAL, "setsockopt: option value too short");
    return absl::OkStatus();
  };
  auto as_int = [&]() { int v = 0; std::memcpy(&v, value, sizeof(v)); return v; };
  std::shared_ptr<sdp::Connection> c;
  MutexLock lock(&mu_);
  c = conn_;
  if (level == SOL_SOCKET) {
    switch (name) {
      case SO_RCVBUF:
      case SO_SNDBUF:
        if (auto s = need(sizeof(int)); !s.ok()) return s;
        (name == SO_RCVBUF ? rcvbuf_ : sndbuf_) = std::max(as_int(), 0);
        return absl::OkStatus();  // applies to connections made after it, as for TCP windows
      case SO_LINGER:
        if (auto s = need(sizeof(linger)); !s.ok()) return s;
        std::memcpy(&linger_, value, sizeof(linger));
        // A connection made already takes the time now (TCP reads it at
        // close); {1, 0} makes Close reset instead, whatever the time.
        if (c != nullptr) {
          c->SetLinger(linger_.l_onoff ? absl::Seconds(linger_.l_linger)
                                       : sdp::ConnectionOptions{}.linger);
        }
        return absl::OkStatus();
      case SO_KEEPALIVE:
        if (auto s = need(sizeof(int)); !s.ok()) return s;
        keepalive_ = as_int() != 0;  // SDP providers watch peers themselves
        return absl::OkStatus();
      case SO_REUSEADDR:
      case SO_REUSEPORT:
        if (auto s = need(sizeof(int)); !s.ok()) return s;
        reuseaddr_ = as_int() != 0;
        return absl::OkStatus();
      case SO_RCVTIMEO:
      case SO_SNDTIMEO: {
        if (auto s = need(sizeof(timeval)); !s.ok()) return s;
        timeval tv;
        std::memcpy(&tv, value, sizeof(tv));
        if (tv.tv_sec < 0 || tv.tv_usec < 0 || tv.tv_usec >= 1000000) {
          return Err(EDOM, "SO_RCVTIMEO/SO_SNDTIMEO: timeval out of range");
        }
        (name == SO_RCVTIMEO ? rcvtimeo_us_ : sndtimeo_us_)
            .store(absl::ToInt64Microseconds(absl::DurationFromTimeval(tv)),
                   std::memory_order_relaxed);
        return absl::OkStatus();
      }
      default:
        break;
    }
  } else if (level == IPPROTO_TCP) {
    if (name == TCP_NODELAY) {
      if (auto s = need(sizeof(int)); !s.ok()) return s;
      // SDP has no Nagle delay; autocork (ZSOCK_SO_AUTOCORK) is separate,
      // as Linux's tcp_autocorking is from TCP_NODELAY.
      nodelay_ = as_int() != 0;
      return absl::OkStatus();
    }
  } else if (level == kSolZsock) {
    if (name == kSoStats) {
      return Err(ENOPROTOOPT, "ZSOCK_SO_STATS is read-only: read it with getsockopt");
    }
    if (auto s = need(sizeof(int)); !s.ok()) return s;
    int v = as_int();
    if (name == kSoMode) {
      if (v < 0 || v > 2) {
        return Err(EINVAL, "ZSOCK_SO_MODE: 0 (bcopy), 1 (zcopy) or 2 (azcopy)");
      }
      mode_ = v;
      if (c) return c->SetMode(static_cast<sdp::Mode>(v));
      return absl::OkStatus();
    }
    if (name == kSoZcopyThreshold) {
      if (v < 0) return Err(EINVAL, "ZSOCK_SO_ZCOPY_THRESHOLD must be >= 0");
      zcopy_threshold_ = v;
      if (c) return c->SetZcopyThreshold(static_cast<size_t>(v));
      return absl::OkStatus();
    }
    if (name == kSoAutocork) {
      if (v != 0 && v != 1) return Err(EINVAL, "ZSOCK_SO_AUTOCORK: 0 (off) or 1 (on)");
      autocork_ = v;
      if (c) c->SetAutocork(v != 0);
      return absl::OkStatus();
    }
  }
  return Err(ENOPROTOOPT, absl::StrCat("setsockopt: option ", level, "/", name,
                                       " is not supported by zsock sockets"));
}

absl::Status Socket::GetOption(int level, int name, void* value, socklen_t* len) {
  if (value == nullptr || len == nullptr) return Err(EFAULT, "getsockopt: null value or length");
  auto put = [&](const void* v, socklen_t n) {
    socklen_t m = std::min(*len, n);
    std::memcpy(value, v, m);
    *len = m;
    return absl::OkStatus();
  };
  MutexLock lock(&mu_);
  auto opts = OptionsLocked();
  if (level == SOL_SOCKET) {
    int v = 0;
    switch (name) {
      case SO_ERROR: {
        v = so_error_.ok() ? 0 : StatusErrno(so_error_);
        so_error_ = absl::OkStatus();
        if (v == 0 && conn_) {
          absl::Status e = conn_->error();
          if (!e.ok()) v = StatusErrno(e);
        }
        return put(&v, sizeof(v));
      }
      case SO_TYPE:
        v = SOCK_STREAM;
        return put(&v, sizeof(v));
      case SO_DOMAIN:
        v = family_;
        return put(&v, sizeof(v));
      case SO_PROTOCOL:
        v = IPPROTO_TCP;
        return put(&v, sizeof(v));
      case SO_ACCEPTCONN:
        v = state_ == State::kListening;
        return put(&v, sizeof(v));
      case SO_RCVBUF:
        v = static_cast<int>(opts.rcvbuf);
        return put(&v, sizeof(v));
      case SO_SNDBUF:
        v = static_cast<int>(opts.sndbuf);
        return put(&v, sizeof(v));
      case SO_KEEPALIVE:
        return put(&keepalive_, sizeof(int));
      case SO_REUSEADDR:
        return put(&reuseaddr_, sizeof(int));
      case SO_LINGER:
        return put(&linger_, sizeof(linger));
      case SO_RCVTIMEO:
      case SO_SNDTIMEO: {
        const timeval tv = absl::ToTimeval(absl::Microseconds(
            (name == SO_RCVTIMEO ? rcvtimeo_us_ : sndtimeo_us_).load(std::memory_order_relaxed)));
        return put(&tv, sizeof(tv));
      }
      default:
        break;
    }
  } else if (level == IPPROTO_TCP && name == TCP_NODELAY) {
    return put(&nodelay_, sizeof(int));
  } else if (level == kSolZsock) {
    int v = 0;
    if (name == kSoMode) {
      v = static_cast<int>(conn_ ? conn_->options().mode : opts.mode);
      return put(&v, sizeof(v));
    }
    if (name == kSoZcopyThreshold) {
      v = static_cast<int>(conn_ ? conn_->options().zcopy_threshold : opts.zcopy_threshold);
      return put(&v, sizeof(v));
    }
    if (name == kSoAutocork) {
      v = (conn_ ? conn_->options().autocork : opts.autocork) ? 1 : 0;
      return put(&v, sizeof(v));
    }
    if (name == kSoStats) {
      if (!conn_) return Err(ENOTCONN, "getsockopt ZSOCK_SO_STATS: the socket is not connected");
      const sdp::ConnectionStats cs = conn_->stats();
      // The C struct has sdp::ConnectionStats's fields (all uint64_t),
      // copied by name; one added to a struct and not to the other changes
      // its size.
      static_assert(sizeof(zs_stats) == sizeof(cs), "struct zs_stats must mirror sdp::ConnectionStats");
#define ZS_ONE(f) +1
      static_assert((0 ZSOCK_STATS_FIELDS(ZS_ONE)) * sizeof(uint64_t) == sizeof(zs_stats),
                    "sockets/stats_fields.h must list every field of struct zs_stats");
#undef ZS_ONE
      zs_stats out{};
#define ZS_COPY(f) out.f = cs.f;
      ZSOCK_STATS_FIELDS(ZS_COPY)
#undef ZS_COPY
      return put(&out, sizeof(out));
    }
  }
  return Err(ENOPROTOOPT, absl::StrCat("getsockopt: option ", level, "/", name,
                                       " is not supported by zsock sockets"));
}

absl::StatusOr<SocketAddress> Socket::LocalAddress() const {
  MutexLock lock(&mu_);
  if (local_.len != 0) return local_;
  // Unbound: the wildcard address with port 0, as getsockname(2) reports.
  return ParseSocketAddress(family_ == AF_INET6 ? "[::]:0" : "0.0.0.0:0");
}

absl::StatusOr<SocketAddress> Socket::PeerAddress() const {
  MutexLock lock(&mu_);
  if (state_ != State::kConnected || peer_.len == 0) {
    return Err(ENOTCONN, "getpeername on an unconnected socket");
  }
  return peer_;
}

short Socket::Events() {
  std::shared_ptr<sdp::Connection> c;
  {
    MutexLock lock(&mu_);
    switch (state_) {
      case State::kListening:
        return accepted_.empty() ? 0 : POLLIN;
      case State::kConnecting:
        return 0;
      case State::kConnected:
        c = conn_;
        break;
      case State::kClosed:
        return POLLNVAL;
      default:
        // Unconnected (or after a failed connect): like TCP, POLLOUT|POLLHUP.
        return static_cast<short>(POLLOUT | POLLHUP | (so_error_.ok() ? 0 : POLLERR));
    }
  }
  uint32_t r = c->readiness();
  short ev = 0;
  if (r & sdp::kReadable) ev |= POLLIN;
  if (r & sdp::kWritable) ev |= POLLOUT;
  if (r & sdp::kError) ev |= POLLERR;
  if (r & sdp::kHup) ev |= POLLHUP;
  if (r & sdp::kRdHup) ev |= POLLRDHUP | POLLIN;
  {
    MutexLock lock(&mu_);
    if (shut_rd_) ev |= POLLIN | POLLRDHUP;
  }
  // Bring the mirror down to the truth, so a following poll(2) sleeps.
  if (!(ev & POLLIN)) MarkUnreadable();
  if (!(ev & POLLOUT)) MarkUnwritable();
  return ev;
}

sdp::ConnectionStats Socket::stats() const {
  auto c = conn();
  return c ? c->stats() : sdp::ConnectionStats{};
}

}  // namespace zsock
