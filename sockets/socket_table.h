// The process's table of zsock sockets by fd number, for the C API
// (sockets/zsock.h) and the interposer: a call on a number finds the
// zsock socket that owns it, or nothing (the number then goes to libc).
//
// Lookups take no lock while the number's entry is unchanged: each thread
// keeps its last lookups, checked against a generation that every change
// in the number's bucket advances, so a number closed by one thread and
// reused (by zsock or the kernel) reaches its new owner from every thread.
// A thread's cache may keep a closed socket's object (not its fd or
// connection) until the entry is replaced.
#ifndef ZSOCK_SOCKETS_SOCKET_TABLE_H_
#define ZSOCK_SOCKETS_SOCKET_TABLE_H_

#include <memory>

#include "absl/functional/function_ref.h"
#include "sockets/socket.h"

namespace zsock {

std::shared_ptr<Socket> FindSocket(int fd);
// The same socket borrowed from this thread's lookup cache, for the data
// calls (zs_send, zs_recv, ...): valid until this thread's next lookup.
// No data call makes one; a signal handler running zs_* on this thread
// could, so Send raises SIGPIPE last, touching nothing of the socket after
// it. It saves the two atomic operations of a shared_ptr copy per call.
Socket* FindSocketForCall(int fd);
void AddSocket(std::shared_ptr<Socket> s);
// Closes `s`'s fd number `fd` (by `close_fd`) and takes s out of the table
// in one step, under the table's lock (Socket::Close does, last). Until
// then a call on the number finds s (closed: EBADF); after it the call goes
// to libc, and so to whoever the kernel gives the number next. The caller
// holds a reference to s (no socket is destroyed here).
void UnlistSocket(const Socket* s, int fd, absl::FunctionRef<void()> close_fd);

}  // namespace zsock

#endif  // ZSOCK_SOCKETS_SOCKET_TABLE_H_
