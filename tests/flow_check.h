// The flow-control scenario the ofi and ucx provider tests share: a sends
// messages to b while b posts no receive; a's sends must stop completing at
// the window; then b receives them all, in order, and every send completes.
#ifndef ZSOCK_TESTS_FLOW_CHECK_H_
#define ZSOCK_TESTS_FLOW_CHECK_H_

#include <span>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/provider.h"
#include "gtest/gtest.h"

namespace zsock {

// The sender's send completions, taken as they come; they must succeed and
// carry the contexts first, first + 1, ... in that order.
class SendsInOrder {
 public:
  SendsInOrder(CompletionQueue* cq, uint64_t first) : cq_(cq), next_(first) {}

  // Takes what the sender's CQ has now (which also progresses the sender).
  void Poll() {
    Completion c;
    while (cq_->Poll(std::span<Completion>(&c, 1)) == 1) {
      ASSERT_TRUE(c.status.ok()) << c.status;
      ASSERT_EQ(c.context, next_) << "send completions out of order";
      ++next_;
    }
  }
  // The context the next completion must carry.
  uint64_t next() const { return next_; }

 private:
  CompletionQueue* cq_;
  uint64_t next_;
};

// For `d`, the sender progresses while the receiver, with nothing posted,
// must complete nothing.
inline void ProgressWhileUnreceived(SendsInOrder* sends, CompletionQueue* cq_b, absl::Duration d) {
  const absl::Time quiet = absl::Now() + d;
  while (absl::Now() < quiet) {
    ASSERT_NO_FATAL_FAILURE(sends->Poll());
    Completion c;
    ASSERT_EQ(cq_b->Poll(std::span<Completion>(&c, 1)), 0u);
    absl::SleepFor(absl::Microseconds(200));
  }
}

// b posts one receive at a time and must get msgs in order, while the
// sender keeps progressing; then every send (up to context `end`) completes.
inline void ReceiveAllInOrder(Endpoint* b, CompletionQueue* cq_b, SendsInOrder* sends,
                              const std::vector<std::string>& msgs, uint64_t end,
                              absl::Duration timeout) {
  for (size_t i = 0; i < msgs.size(); ++i) {
    char buf[64] = {};
    ASSERT_TRUE(b->PostRecv(buf, sizeof(buf), nullptr, 1000 + i).ok()) << i;
    const absl::Time deadline = absl::Now() + timeout;
    Completion c;
    bool got = false;
    while (!got && absl::Now() < deadline) {
      ASSERT_NO_FATAL_FAILURE(sends->Poll());
      got = cq_b->Poll(std::span<Completion>(&c, 1)) == 1;
    }
    ASSERT_TRUE(got) << "message " << i << " never arrived (sends completed up to context "
                     << sends->next() << ")";
    ASSERT_TRUE(c.status.ok()) << c.status;
    EXPECT_EQ(std::string(buf, c.length), msgs[i]);
  }
  const absl::Time deadline = absl::Now() + timeout;
  while (sends->next() < end && absl::Now() < deadline) ASSERT_NO_FATAL_FAILURE(sends->Poll());
  EXPECT_EQ(sends->next(), end);
}

}  // namespace zsock

#endif  // ZSOCK_TESTS_FLOW_CHECK_H_
