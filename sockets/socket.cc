// zsock::Socket's life: the engine every socket uses, creation, attaching
// a connection, shutdown, close and the addresses. Setting up connections
// is in socket_connect.cc, the data calls in socket_data.cc, options in
// socket_options.cc and the readiness mirror in socket_events.cc.
#include "sockets/socket.h"

#include <sys/socket.h>

#include <cerrno>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "core/log.h"
#include "core/status.h"
#include "sockets/socket_table.h"

namespace zsock {

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

Socket::Socket(int family, std::unique_ptr<ReadinessFd> rfd, bool nonblocking)
    : family_(family), fd_(rfd->fd()), nonblocking_(nonblocking), rfd_(std::move(rfd)) {
  PrepareCallErrors();  // before any call can be refused
}

Socket::~Socket() {
  (void)Close();
}

absl::StatusOr<std::shared_ptr<Socket>> Socket::Create(int family, int flags) {
  if (family != AF_INET && family != AF_INET6) {
    return ErrnoError(EAFNOSUPPORT,
                      absl::StrCat("zsock sockets are AF_INET or AF_INET6, not ", family));
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

void Socket::SetStateLocked(State state) {
  state_ = state;
  PublishLocked();
}

void Socket::PublishLocked() {
  CallTarget send, recv;
  switch (state_) {
    case State::kConnected:
      send = shut_wr_ ? CallTarget(CallTarget::kShutDown) : CallTarget(conn_.get());
      recv = shut_rd_ ? CallTarget(CallTarget::kShutDown) : CallTarget(conn_.get());
      break;
    case State::kConnecting:
      send = recv = CallTarget(CallTarget::kConnecting);
      break;
    case State::kClosed:
      send = recv = CallTarget(CallTarget::kClosed);
      break;
    default:
      break;  // unconnected
  }
  send_target_.store(send, std::memory_order_release);
  recv_target_.store(recv, std::memory_order_release);
}

void Socket::Attach(std::shared_ptr<sdp::Connection> conn) {
  conn_ = conn;
  pinned_conn_ = conn;
  SetStateLocked(State::kConnected);
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

std::shared_ptr<sdp::Connection> Socket::conn() const {
  MutexLock lock(&mu_);
  return conn_;
}

absl::Status Socket::Shutdown(int how) {
  if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) {
    return ErrnoError(EINVAL, "shutdown: how must be SHUT_RD, SHUT_WR or SHUT_RDWR");
  }
  std::shared_ptr<sdp::Connection> c;
  {
    MutexLock lock(&mu_);
    if (state_ != State::kConnected) {
      return ErrnoError(ENOTCONN, "shutdown on an unconnected socket");
    }
    c = conn_;
    if (how != SHUT_WR) shut_rd_ = true;
    if (how != SHUT_RD) shut_wr_ = true;
    PublishLocked();
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
    c = std::move(conn_);
    SetStateLocked(State::kClosed);
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
  // The number leaves the socket table as it is closed, in one step: until
  // then calls on it find this socket and are refused (EBADF). Out of the
  // table any earlier, a call would go to libc with the number of the
  // mirror's socketpair, still open: a recv there would take the mirror's
  // tokens for data, a send would write into the mirror.
  UnlistSocket(this, fd_, [&] { rfd_.reset(); });  // closes fd_
  fd_ = -1;
  return absl::OkStatus();
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
    return ErrnoError(ENOTCONN, "getpeername on an unconnected socket");
  }
  return peer_;
}

sdp::ConnectionStats Socket::stats() const {
  auto c = conn();
  return c ? c->stats() : sdp::ConnectionStats{};
}

}  // namespace zsock
