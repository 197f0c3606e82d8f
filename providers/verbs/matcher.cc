// The verbs receive matcher (see matcher.h).
#include "providers/verbs/matcher.h"

#include <utility>

namespace zsock::verbs {

Match Matcher::Pair(PostedRecv r, Arrival m) {
  Match out;
  size_t len = m.rendezvous ? m.rts.length : m.data.size();
  out.truncated = len > r.len;
  out.recv = r;
  out.msg = std::move(m);
  return out;
}

std::optional<Match> Matcher::Arrive(Arrival msg) {
  if (recvs_.empty()) {
    messages_.push_back(std::move(msg));
    return std::nullopt;
  }
  PostedRecv r = recvs_.front();
  recvs_.pop_front();
  return Pair(r, std::move(msg));
}

std::optional<Match> Matcher::Post(PostedRecv recv) {
  if (messages_.empty()) {
    recvs_.push_back(recv);
    return std::nullopt;
  }
  Arrival m = std::move(messages_.front());
  messages_.pop_front();
  return Pair(recv, std::move(m));
}

std::deque<PostedRecv> Matcher::TakeRecvs() { return std::exchange(recvs_, {}); }
std::deque<Arrival> Matcher::TakeMessages() { return std::exchange(messages_, {}); }

}  // namespace zsock::verbs
