// zsock::Socket's options: setsockopt/getsockopt of levels SOL_SOCKET,
// IPPROTO_TCP and SOL_ZSOCK (sockets/zsock.h), and the sdp::ConnectionOptions
// they make for the socket's next connection.
#include "sockets/socket.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "sockets/stats_fields.h"
#include "sockets/zsock.h"

namespace zsock {
namespace {

absl::Status Unsupported(absl::string_view call, int level, int name) {
  return ErrnoError(ENOPROTOOPT, absl::StrCat(call, ": option ", level, "/", name,
                                              " is not supported by zsock sockets"));
}

// A value of at least `n` bytes, else EINVAL.
absl::Status Need(const void* value, socklen_t len, socklen_t n) {
  if (value == nullptr || len < n) return ErrnoError(EINVAL, "setsockopt: option value too short");
  return absl::OkStatus();
}

int AsInt(const void* value) {
  int v = 0;
  std::memcpy(&v, value, sizeof(v));
  return v;
}

// Copies what fits of `v` into getsockopt's `value` and says how much.
absl::Status Put(const void* v, socklen_t n, void* value, socklen_t* len) {
  socklen_t m = std::min(*len, n);
  std::memcpy(value, v, m);
  *len = m;
  return absl::OkStatus();
}

absl::Status PutInt(int v, void* value, socklen_t* len) { return Put(&v, sizeof(v), value, len); }

// The C struct has sdp::ConnectionStats's fields (all uint64_t), copied by
// name; one added to a struct and not to the other changes its size.
zs_stats ToCStats(const sdp::ConnectionStats& cs) {
  static_assert(sizeof(zs_stats) == sizeof(cs), "struct zs_stats must mirror sdp::ConnectionStats");
#define ZS_ONE(f) +1
  static_assert((0 ZSOCK_STATS_FIELDS(ZS_ONE)) * sizeof(uint64_t) == sizeof(zs_stats),
                "sockets/stats_fields.h must list every field of struct zs_stats");
#undef ZS_ONE
  zs_stats out{};
#define ZS_COPY(f) out.f = cs.f;
  ZSOCK_STATS_FIELDS(ZS_COPY)
#undef ZS_COPY
  return out;
}

}  // namespace

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

absl::Status Socket::SetOption(int level, int name, const void* value, socklen_t len) {
  MutexLock lock(&mu_);
  if (level == SOL_SOCKET) {
    return SetSocketLevelOptionLocked(name, value, len);
  }
  if (level == IPPROTO_TCP && name == TCP_NODELAY) {
    if (auto s = Need(value, len, sizeof(int)); !s.ok()) return s;
    // SDP has no Nagle delay; autocork (ZSOCK_SO_AUTOCORK) is separate,
    // as Linux's tcp_autocorking is from TCP_NODELAY.
    nodelay_ = AsInt(value) != 0;
    return absl::OkStatus();
  }
  if (level == SOL_ZSOCK) return SetZsockOptionLocked(name, value, len);
  return Unsupported("setsockopt", level, name);
}

absl::Status Socket::SetSocketLevelOptionLocked(int name, const void* value, socklen_t len) {
  switch (name) {
    case SO_RCVBUF:
    case SO_SNDBUF:
      if (auto s = Need(value, len, sizeof(int)); !s.ok()) return s;
      (name == SO_RCVBUF ? rcvbuf_ : sndbuf_) = std::max(AsInt(value), 0);
      return absl::OkStatus();  // applies to connections made after it, as for TCP windows
    case SO_LINGER:
      if (auto s = Need(value, len, sizeof(linger)); !s.ok()) return s;
      std::memcpy(&linger_, value, sizeof(linger));
      // A connection made already takes the time now (TCP reads it at
      // close); {1, 0} makes Close reset instead, whatever the time.
      if (conn_ != nullptr) {
        conn_->SetLinger(linger_.l_onoff ? absl::Seconds(linger_.l_linger)
                                         : sdp::ConnectionOptions{}.linger);
      }
      return absl::OkStatus();
    case SO_KEEPALIVE:
      if (auto s = Need(value, len, sizeof(int)); !s.ok()) return s;
      keepalive_ = AsInt(value) != 0;  // SDP providers watch peers themselves
      return absl::OkStatus();
    case SO_REUSEADDR:
    case SO_REUSEPORT:
      if (auto s = Need(value, len, sizeof(int)); !s.ok()) return s;
      reuseaddr_ = AsInt(value) != 0;
      return absl::OkStatus();
    case SO_RCVTIMEO:
    case SO_SNDTIMEO: {
      if (auto s = Need(value, len, sizeof(timeval)); !s.ok()) return s;
      timeval tv;
      std::memcpy(&tv, value, sizeof(tv));
      if (tv.tv_sec < 0 || tv.tv_usec < 0 || tv.tv_usec >= 1000000) {
        return ErrnoError(EDOM, "SO_RCVTIMEO/SO_SNDTIMEO: timeval out of range");
      }
      (name == SO_RCVTIMEO ? rcvtimeo_us_ : sndtimeo_us_)
          .store(absl::ToInt64Microseconds(absl::DurationFromTimeval(tv)),
                 std::memory_order_relaxed);
      return absl::OkStatus();
    }
    default:
      return Unsupported("setsockopt", SOL_SOCKET, name);
  }
}

absl::Status Socket::SetZsockOptionLocked(int name, const void* value, socklen_t len) {
  if (name == ZSOCK_SO_STATS) {
    return ErrnoError(ENOPROTOOPT, "ZSOCK_SO_STATS is read-only: read it with getsockopt");
  }
  if (auto s = Need(value, len, sizeof(int)); !s.ok()) return s;
  const int v = AsInt(value);
  switch (name) {
    case ZSOCK_SO_MODE:
      if (v < 0 || v > 2) {
        return ErrnoError(EINVAL, "ZSOCK_SO_MODE: 0 (bcopy), 1 (zcopy) or 2 (azcopy)");
      }
      mode_ = v;
      return conn_ ? conn_->SetMode(static_cast<sdp::Mode>(v)) : absl::OkStatus();
    case ZSOCK_SO_ZCOPY_THRESHOLD:
      if (v < 0) return ErrnoError(EINVAL, "ZSOCK_SO_ZCOPY_THRESHOLD must be >= 0");
      zcopy_threshold_ = v;
      return conn_ ? conn_->SetZcopyThreshold(static_cast<size_t>(v)) : absl::OkStatus();
    case ZSOCK_SO_AUTOCORK:
      if (v != 0 && v != 1) return ErrnoError(EINVAL, "ZSOCK_SO_AUTOCORK: 0 (off) or 1 (on)");
      autocork_ = v;
      if (conn_) conn_->SetAutocork(v != 0);
      return absl::OkStatus();
    default:
      return Unsupported("setsockopt", SOL_ZSOCK, name);
  }
}

absl::Status Socket::GetOption(int level, int name, void* value, socklen_t* len) {
  if (value == nullptr || len == nullptr) {
    return ErrnoError(EFAULT, "getsockopt: null value or length");
  }
  MutexLock lock(&mu_);
  if (level == SOL_SOCKET) return GetSocketLevelOptionLocked(name, value, len);
  if (level == IPPROTO_TCP && name == TCP_NODELAY) return Put(&nodelay_, sizeof(int), value, len);
  if (level == SOL_ZSOCK) return GetZsockOptionLocked(name, value, len);
  return Unsupported("getsockopt", level, name);
}

absl::Status Socket::GetSocketLevelOptionLocked(int name, void* value, socklen_t* len) {
  switch (name) {
    case SO_ERROR: {
      int v = so_error_.ok() ? 0 : StatusErrno(so_error_);
      so_error_ = absl::OkStatus();
      if (v == 0 && conn_) {
        absl::Status e = conn_->error();
        if (!e.ok()) v = StatusErrno(e);
      }
      return PutInt(v, value, len);
    }
    case SO_TYPE:
      return PutInt(SOCK_STREAM, value, len);
    case SO_DOMAIN:
      return PutInt(family_, value, len);
    case SO_PROTOCOL:
      return PutInt(IPPROTO_TCP, value, len);
    case SO_ACCEPTCONN:
      return PutInt(state_ == State::kListening, value, len);
    case SO_RCVBUF:
      return PutInt(static_cast<int>(OptionsLocked().rcvbuf), value, len);
    case SO_SNDBUF:
      return PutInt(static_cast<int>(OptionsLocked().sndbuf), value, len);
    case SO_KEEPALIVE:
      return Put(&keepalive_, sizeof(int), value, len);
    case SO_REUSEADDR:
      return Put(&reuseaddr_, sizeof(int), value, len);
    case SO_LINGER:
      return Put(&linger_, sizeof(linger), value, len);
    case SO_RCVTIMEO:
    case SO_SNDTIMEO: {
      const timeval tv = absl::ToTimeval(absl::Microseconds(
          (name == SO_RCVTIMEO ? rcvtimeo_us_ : sndtimeo_us_).load(std::memory_order_relaxed)));
      return Put(&tv, sizeof(tv), value, len);
    }
    default:
      return Unsupported("getsockopt", SOL_SOCKET, name);
  }
}

absl::Status Socket::GetZsockOptionLocked(int name, void* value, socklen_t* len) {
  switch (name) {
    case ZSOCK_SO_MODE:
      return PutInt(static_cast<int>(conn_ ? conn_->options().mode : OptionsLocked().mode),
                    value, len);
    case ZSOCK_SO_ZCOPY_THRESHOLD:
      return PutInt(static_cast<int>(conn_ ? conn_->options().zcopy_threshold
                                           : OptionsLocked().zcopy_threshold),
                    value, len);
    case ZSOCK_SO_AUTOCORK:
      return PutInt((conn_ ? conn_->options().autocork : OptionsLocked().autocork) ? 1 : 0, value,
                    len);
    case ZSOCK_SO_STATS: {
      if (!conn_) {
        return ErrnoError(ENOTCONN, "getsockopt ZSOCK_SO_STATS: the socket is not connected");
      }
      const zs_stats out = ToCStats(conn_->stats());
      return Put(&out, sizeof(out), value, len);
    }
    default:
      return Unsupported("getsockopt", SOL_ZSOCK, name);
  }
}

}  // namespace zsock
