// fanin and fanout: one server and --clients processes, one connection
// each. The server serves whichever connection is ready (non-blocking
// sockets and poll) and times the aggregate transfer.
#include <poll.h>

#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bench/child_io.h"
#include "bench/clock.h"
#include "bench/families.h"
#include "bench/pattern.h"

namespace zsock::bench::internal {
namespace {

// Moves `count` messages of `size` bytes on every connection, in the
// direction `sending`, serving whichever connection is ready. `check` is
// called for each received message with its connection and index.
template <typename CheckFn>
void MultiTransfer(const std::vector<int>& fds, bool sending, size_t size, int64_t count,
                   const std::vector<uint8_t*>& bufs, CheckFn check, absl::string_view what) {
  struct State {
    int64_t done = 0;
    size_t off = 0;
  };
  std::vector<State> st(fds.size());
  std::vector<pollfd> pfds;
  std::vector<size_t> idx;
  const short ev = sending ? POLLOUT : POLLIN;
  for (;;) {
    pfds.clear();
    idx.clear();
    for (size_t i = 0; i < fds.size(); ++i) {
      if (st[i].done < count) {
        pfds.push_back(pollfd{fds[i], ev, 0});
        idx.push_back(i);
      }
    }
    if (pfds.empty()) return;
    int n = g_child.ops->poll(pfds.data(), pfds.size(), TimeoutMs());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) Die(absl::StrCat("poll during ", what, " failed: ", Errno(errno)));
    if (n == 0) {
      Die(absl::StrCat("no client made progress for ",
                       absl::FormatDuration(g_child.opt->timeout), " during ", what));
    }
    for (size_t j = 0; j < pfds.size(); ++j) {
      if (pfds[j].revents == 0) continue;
      const size_t i = idx[j];
      State& s = st[i];
      // At most 16 messages per connection per round, for fairness.
      for (int budget = 16; budget > 0 && s.done < count;) {
        ssize_t r = sending
                        ? g_child.ops->send(fds[i], bufs[i] + s.off, size - s.off, MSG_NOSIGNAL)
                        : g_child.ops->recv(fds[i], bufs[i] + s.off, size - s.off, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (r == 0 && !sending) {
          Die(absl::StrCat("client ", i, " closed the connection during ", what));
        }
        if (r <= 0) {
          Die(absl::StrCat(sending ? "send" : "recv", " to client ", i, " during ", what,
                           " failed: ", r == 0 ? std::string("0 bytes") : Errno(errno)));
        }
        s.off += static_cast<size_t>(r);
        if (s.off == size) {
          if (!sending) check(i, s.done, bufs[i]);
          s.off = 0;
          ++s.done;
          --budget;
        }
      }
    }
  }
}

}  // namespace

void FanServer(const std::vector<int>& fds) {
  const Run& run = *g_child.run;
  const bool fanin = g_child.opt->test == Test::kFanin;
  for (int fd : fds) SetNonBlocking(fd);
  std::vector<std::unique_ptr<Buffer>> owned;
  std::vector<uint8_t*> bufs;
  for (size_t i = 0; i < fds.size(); ++i) {
    owned.push_back(std::make_unique<Buffer>(MaxSize(run)));
    bufs.push_back(owned.back()->data());
  }
  const uint8_t go = 1;
  uint8_t ack = 0;
  for (int pi = 0; pi < static_cast<int>(run.points.size()); ++pi) {
    const Point& p = run.points[pi];
    auto check_first = [&](size_t, int64_t k, const uint8_t* b) {
      if (k == 0) Check(b, p.size, Seed(pi, 0), MsgWhat(pi, k, p));
    };
    auto check_last = [&](size_t, int64_t k, const uint8_t* b) {
      if (k == p.count - 1) Check(b, p.size, Seed(pi, 0), MsgWhat(pi, p.warmup + k, p));
    };
    int64_t t0 = 0;
    if (fanin) {
      MultiTransfer(fds, false, p.size, p.warmup, bufs, check_first, "fan-in warm-up");
      t0 = NowNs();
      for (int fd : fds) SendAll(fd, &go, 1, "fan-in start");
      MultiTransfer(fds, false, p.size, p.count, bufs, check_last, "fan-in");
    } else {
      for (uint8_t* b : bufs) Fill(b, p.size, Seed(pi, 0));
      MultiTransfer(fds, true, p.size, p.warmup, bufs, check_first, "fan-out warm-up");
      for (int fd : fds) RecvAll(fd, &ack, 1, "fan-out warm-up acknowledgement");
      t0 = NowNs();
      MultiTransfer(fds, true, p.size, p.count, bufs, check_first, "fan-out");
    }
    for (int fd : fds) {
      if (fanin) {
        SendAll(fd, &go, 1, "fan-in acknowledgement");
      } else {
        RecvAll(fd, &ack, 1, "fan-out acknowledgement");
      }
    }
    double secs = static_cast<double>(NowNs() - t0) / 1e9;
    int64_t msgs = p.count * static_cast<int64_t>(fds.size());
    Report(pi, msgs, msgs * static_cast<int64_t>(p.size), msgs, secs, {});
  }
}

void FanClient(int fd) {
  const Run& run = *g_child.run;
  const bool fanin = g_child.opt->test == Test::kFanin;
  Buffer buf(MaxSize(run));
  const uint8_t ack = 1;
  uint8_t go = 0;
  for (int pi = 0; pi < static_cast<int>(run.points.size()); ++pi) {
    const Point& p = run.points[pi];
    if (fanin) {
      Fill(buf.data(), p.size, Seed(pi, 0));
      for (int64_t k = 0; k < p.warmup; ++k) SendAll(fd, buf.data(), p.size, "warm-up send");
      RecvAll(fd, &go, 1, "fan-in start");
      for (int64_t k = 0; k < p.count; ++k) SendAll(fd, buf.data(), p.size, "fan-in send");
      RecvAll(fd, &go, 1, "fan-in acknowledgement");
    } else {
      for (int64_t k = 0; k < p.warmup; ++k) {
        RecvAll(fd, buf.data(), p.size, "warm-up receive");
        if (k == 0) Check(buf.data(), p.size, Seed(pi, 0), MsgWhat(pi, k, p));
      }
      SendAll(fd, &ack, 1, "fan-out warm-up acknowledgement");
      for (int64_t k = 0; k < p.count; ++k) {
        RecvAll(fd, buf.data(), p.size, "fan-out receive");
        if (k == p.count - 1) {
          Check(buf.data(), p.size, Seed(pi, 0), MsgWhat(pi, p.warmup + k, p));
        }
      }
      SendAll(fd, &ack, 1, "fan-out acknowledgement");
    }
  }
}

}  // namespace zsock::bench::internal
