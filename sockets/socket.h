// zsock::Socket: the C++ sockets API over the SDP engine. A BSD-shaped
// byte-stream socket (bind/listen/accept/connect/send/recv/shutdown/close,
// options, blocking and non-blocking) whose fd() is a real file descriptor
// with mirrored readiness (sockets/readiness.h), so the program's own
// poll/select/epoll work on it. sockets/zsock.h is the C API over this.
//
// Contract:
//  - Errors are absl::Status carrying the errno a BSD call would set
//    (StatusErrno): EAGAIN for a non-blocking call that would block,
//    EINPROGRESS for a non-blocking connect, ECONNRESET / EPIPE for a dead
//    or reset peer, ENOTCONN, EISCONN, EADDRINUSE, EINVAL, ...
//  - One process-wide SDP engine (sdp::Engine with its progress thread)
//    carries every socket; the provider comes from the configuration
//    (ZSOCK_PROVIDER / the config file), the data path from ZSOCK_MODE or
//    the per-socket option ZSOCK_SO_MODE.
//  - Calls are thread-safe; one thread may block in Recv while another
//    Sends, Shutdowns or Closes (which wakes it with an error).
//  - A Send or Recv that is refused (closed, unconnected, connecting, shut
//    down, timed out) allocates nothing and takes no lock, so a signal
//    handler may make it (docs/sockets.md, "Calls from signal handlers").
#ifndef ZSOCK_SOCKETS_SOCKET_H_
#define ZSOCK_SOCKETS_SOCKET_H_

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/fd.h"
#include "core/mutex.h"
#include "core/sdp/connection.h"
#include "core/sdp/engine.h"
#include "core/sockaddr.h"
#include "sockets/readiness.h"

namespace zsock {

// The engine every socket of this process uses (created on first use).
absl::StatusOr<sdp::Engine*> SocketEngine();

class Socket : public std::enable_shared_from_this<Socket> {
 public:
  // family: AF_INET or AF_INET6; flags: SOCK_NONBLOCK | SOCK_CLOEXEC.
  static absl::StatusOr<std::shared_ptr<Socket>> Create(int family, int flags);
  ~Socket();
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  int family() const { return family_; }

  absl::Status Bind(const sockaddr* addr, socklen_t len);
  absl::Status Listen(int backlog);
  // flags: SOCK_NONBLOCK | SOCK_CLOEXEC for the new socket.
  absl::StatusOr<std::shared_ptr<Socket>> Accept(int flags, SocketAddress* peer);
  absl::Status Connect(const sockaddr* addr, socklen_t len);

  // flags: MSG_DONTWAIT, MSG_NOSIGNAL (no SIGPIPE is ever raised), MSG_MORE
  // (ignored).
  absl::StatusOr<size_t> Send(std::span<const iovec> iov, int flags);
  // flags: MSG_DONTWAIT, MSG_PEEK, MSG_WAITALL.
  absl::StatusOr<size_t> Recv(std::span<const iovec> iov, int flags);
  absl::Status Shutdown(int how);
  // Graceful (or abortive with SO_LINGER {1, 0}); the fd is closed.
  absl::Status Close();

  // Options of levels SOL_SOCKET, IPPROTO_TCP and SOL_ZSOCK (zsock's own,
  // named in sockets/zsock.h); others fail with ENOPROTOOPT.
  absl::Status SetOption(int level, int name, const void* value, socklen_t len);
  absl::Status GetOption(int level, int name, void* value, socklen_t* len);
  absl::StatusOr<SocketAddress> LocalAddress() const;
  absl::StatusOr<SocketAddress> PeerAddress() const;

  bool nonblocking() const { return nonblocking_.load(std::memory_order_relaxed); }
  void set_nonblocking(bool on) { nonblocking_.store(on, std::memory_order_relaxed); }

  // poll(2) events (POLLIN, POLLOUT, POLLERR, POLLHUP, POLLRDHUP) that hold
  // now; also brings fd()'s mirrored state up to date.
  short Events();

  sdp::ConnectionStats stats() const;

 private:
  enum class State { kNew, kBound, kListening, kConnecting, kConnected, kClosed };

  Socket(int family, std::unique_ptr<ReadinessFd> rfd, bool nonblocking);
  static absl::StatusOr<std::shared_ptr<Socket>> FromConnection(
      int family, std::unique_ptr<sdp::Connection> conn, int flags);
  void Attach(std::shared_ptr<sdp::Connection> conn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The connection's readiness changed (its callback, or Attach).
  void OnReadiness(uint32_t r);
  // After a call found nothing to do: clears the mirrored bit unless the
  // connection became ready meanwhile.
  void MarkUnreadable();
  void MarkUnwritable();
  // Both: `bit` is sdp::kReadable or sdp::kWritable.
  void MarkNotReady(uint32_t bit);
  // Has the connection report changes of the bits the mirror shows off,
  // and of the ones that end a connection; a bit the mirror shows on is
  // turned off only by MarkUnreadable/MarkUnwritable, never by a callback.
  void WatchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(rfd_mu_);
  sdp::ConnectionOptions OptionsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<sdp::Connection> conn() const;
  absl::Status ConnectError(const absl::Status& why, const SocketAddress& to);
  // A non-blocking connect's thread: connects, then attaches the
  // connection or records why it failed (SO_ERROR).
  void FinishConnect(sdp::Engine* engine, const std::string& target,
                     const sdp::ConnectionOptions& options, const SocketAddress& to);
  // An accepted socket's local address: the listener's, with a wildcard
  // replaced by the local address that reaches the peer.
  void SetAcceptedLocalAddress(Socket& accepted);
  // SetOption and GetOption by level (GetOption has checked `value` and
  // `len` for null; the setters check `value` and `len` themselves).
  absl::Status SetSocketLevelOptionLocked(int name, const void* value, socklen_t len)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SetZsockOptionLocked(int name, const void* value, socklen_t len)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status GetSocketLevelOptionLocked(int name, void* value, socklen_t* len)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status GetZsockOptionLocked(int name, void* value, socklen_t* len)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A listening socket's acceptor thread: takes provider connections and
  // completes their handshakes (provider set-up and SDP Hello) in the
  // background, queueing finished connections (at most backlog_) for
  // Accept, which therefore never waits on a slow or silent client.
  void AcceptLoop(sdp::Listener* l);
  // Stops and joins the acceptor (Close; mu_ not held).
  void StopAcceptor();

  const int family_;
  int fd_;
  std::atomic<bool> nonblocking_;

  mutable Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kNew;
  SocketAddress local_ ABSL_GUARDED_BY(mu_);
  SocketAddress peer_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<sdp::Listener> listener_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<sdp::Connection> conn_ ABSL_GUARDED_BY(mu_);
  std::thread connector_ ABSL_GUARDED_BY(mu_);  // a non-blocking connect
  std::thread acceptor_;  // started by Listen, joined by Close
  Fd acceptor_stop_;      // eventfd: readable when the acceptor must end
  std::deque<std::unique_ptr<sdp::Connection>> accepted_ ABSL_GUARDED_BY(mu_);
  size_t backlog_ ABSL_GUARDED_BY(mu_) = 0;
  CondVar accepted_cv_;   // accepted_ or state_ changed
  absl::Status so_error_ ABSL_GUARDED_BY(mu_);  // SO_ERROR, cleared by reading
  Fd port_reservation_ ABSL_GUARDED_BY(mu_);    // holds the bound port
  // Options.
  int rcvbuf_ ABSL_GUARDED_BY(mu_) = 0;  // 0: engine default
  int sndbuf_ ABSL_GUARDED_BY(mu_) = 0;
  linger linger_ ABSL_GUARDED_BY(mu_) = {0, 0};
  int nodelay_ ABSL_GUARDED_BY(mu_) = 0;
  int keepalive_ ABSL_GUARDED_BY(mu_) = 0;
  int reuseaddr_ ABSL_GUARDED_BY(mu_) = 0;
  // SO_RCVTIMEO and SO_SNDTIMEO in microseconds (0: none); atomics, which
  // Send and Recv read without mu_.
  std::atomic<int64_t> rcvtimeo_us_{0}, sndtimeo_us_{0};
  int mode_ ABSL_GUARDED_BY(mu_) = -1;  // -1: configured
  int zcopy_threshold_ ABSL_GUARDED_BY(mu_) = -1;
  int autocork_ ABSL_GUARDED_BY(mu_) = -1;  // -1: configured
  bool shut_rd_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_wr_ ABSL_GUARDED_BY(mu_) = false;

  // The mirrored fd; its own lock, taken by readiness callbacks.
  Mutex rfd_mu_;
  std::unique_ptr<ReadinessFd> rfd_ ABSL_GUARDED_BY(rfd_mu_);
  // The connection's readiness watch (sdp::Connection::readiness_watch).
  std::shared_ptr<std::atomic<uint32_t>> watch_ ABSL_GUARDED_BY(rfd_mu_);
  // The connection while conn_ (or Close's copy of it) owns it, for
  // OnReadiness to check a callback's bits against (no reference: the
  // callback must not own the connection, see Attach). Cleared by Close
  // before it lets go.
  sdp::Connection* live_conn_ ABSL_GUARDED_BY(rfd_mu_) = nullptr;

  // What a Send or a Recv calls, one word per direction: the connection
  // while the socket is connected and not shut down that way, else why the
  // call is refused (the socket's state). Published under mu_ at every
  // change (SetStateLocked, PublishLocked) and read with one atomic load,
  // so the calls take no lock of the socket's: per message that saves a
  // lock and a reference count (four atomic instructions; docs/sockets.md),
  // and a refused call stays async-signal-safe. Such a call holds no
  // reference on the connection: pinned_conn_ keeps the Connection object
  // until the socket goes (after Close it is an empty handle), and
  // sdp::Connection::Close lets calls in progress leave first.
  class CallTarget {
   public:
    enum Refusal : uintptr_t { kUnconnected = 0, kConnecting = 1, kClosed = 2, kShutDown = 3 };
    CallTarget() = default;
    explicit CallTarget(Refusal why) : word_(why) {}
    explicit CallTarget(sdp::Connection* c) : word_(reinterpret_cast<uintptr_t>(c)) {}
    // Null when refused; no object lives at the addresses of the refusals.
    sdp::Connection* connection() const {
      return word_ > kShutDown ? reinterpret_cast<sdp::Connection*>(word_) : nullptr;
    }
    Refusal refusal() const { return static_cast<Refusal>(word_); }

   private:
    uintptr_t word_ = kUnconnected;
  };
  static_assert(std::atomic<CallTarget>::is_always_lock_free);
  std::atomic<CallTarget> send_target_{}, recv_target_{};
  std::shared_ptr<sdp::Connection> pinned_conn_ ABSL_GUARDED_BY(mu_);
  void SetStateLocked(State state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A refused call's result: its errno (without allocating: the errors are
  // prepared by the constructor, PrepareCallErrors), and for a send after
  // SHUT_WR, SIGPIPE.
  static absl::StatusOr<size_t> RefuseSend(CallTarget::Refusal why, bool dontwait, int flags);
  static absl::StatusOr<size_t> RefuseRecv(CallTarget::Refusal why, bool dontwait);
  static void PrepareCallErrors();
  // The endings of Send and Recv on either path: the errno a timeout or
  // EAGAIN maps to, readiness, and Send's SIGPIPE.
  absl::StatusOr<size_t> SendResult(absl::StatusOr<size_t> n, int flags);
  absl::StatusOr<size_t> RecvResult(absl::StatusOr<size_t> n);
};

}  // namespace zsock

#endif  // ZSOCK_SOCKETS_SOCKET_H_
