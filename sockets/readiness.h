// ReadinessFd: a real file descriptor whose poll/select/epoll readiness
// zsock sets by hand, so that a zsock socket can sit in the program's own
// event loop (and, later, be handed out by the LD_PRELOAD interposer as the
// socket's fd number).
//
// Why by hand: no kernel object lets user space set "readable" and
// "writable" independently. eventfd cannot be neither readable nor writable;
// a pipe needs two fd numbers. One end of an AF_UNIX stream socketpair can:
//  - readable: token bytes wait in the program's end (written from ours);
//  - not writable: zsock writes filler from the program's end into ours and
//    leaves it unread, so the program's end exceeds its small send
//    allowance (a unix socket is writable while its unread sent data stays
//    below a quarter of SO_SNDBUF); reading the filler makes it writable;
//  - end of stream / hangup: shutdown of our end (POLLIN|POLLRDHUP, then
//    POLLHUP), which the kernel reports on the program's end.
//
// Cost model: only transitions make system calls (a token is written when
// none is there; tokens are drained when the owner says the socket has
// become unreadable, i.e. when a receive found nothing). A socket that
// stays readable costs nothing per message. Consequence for watchers:
// edge-triggered epoll gets one edge per unreadable->readable transition,
// so it must read until EAGAIN, as epoll(7) asks.
//
// Not thread-safe: the owner (one zsock socket) serializes calls.
#ifndef ZSOCK_SOCKETS_READINESS_H_
#define ZSOCK_SOCKETS_READINESS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "core/fd.h"

namespace zsock {

class ReadinessFd {
 public:
  // `cloexec`: the program's fd gets FD_CLOEXEC (SOCK_CLOEXEC semantics).
  static absl::StatusOr<std::unique_ptr<ReadinessFd>> Create(bool cloexec);

  ReadinessFd(const ReadinessFd&) = delete;
  ReadinessFd& operator=(const ReadinessFd&) = delete;

  // The program's file descriptor.
  int fd() const { return user_.get(); }
  // Gives up ownership of fd() (the caller closes it); our end stays open
  // until this object is destroyed.
  int ReleaseFd() { return user_.release(); }

  // Readable (POLLIN) or not. No system call when already so.
  void SetReadable(bool on);
  // Writable (POLLOUT) or not. No system call when already so.
  void SetWritable(bool on);
  // End of stream: readable from now on, with POLLRDHUP (the peer half-closed
  // and everything it sent has been read, or the connection is gone).
  void SetEndOfStream();
  // Terminal: POLLIN | POLLOUT | POLLHUP | POLLRDHUP (connection reset or
  // closed both ways); the program then learns the error from its next call.
  void SetHangup();

  bool readable() const { return readable_; }
  bool writable() const { return writable_; }

 private:
  ReadinessFd(Fd user, Fd ours) : user_(std::move(user)), ours_(std::move(ours)) {}

  Fd user_;  // the program's end
  Fd ours_;  // zsock's end
  bool readable_ = false;
  bool writable_ = true;
  bool eos_ = false;
  bool hangup_ = false;
};

}  // namespace zsock

#endif  // ZSOCK_SOCKETS_READINESS_H_
