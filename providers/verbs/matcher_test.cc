// The verbs receive matcher (matcher.h) and send credits (credits.h).
#include "providers/verbs/matcher.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "providers/verbs/credits.h"

namespace zsock::verbs {
namespace {

Arrival Eager(const std::string& s) {
  Arrival a;
  a.data.assign(s.begin(), s.end());
  return a;
}

TEST(Matcher, InOrderBothWays) {
  Matcher m;
  char b1[16], b2[16], b3[4];
  EXPECT_FALSE(m.Post({b1, sizeof(b1), nullptr, 1}).has_value());
  EXPECT_FALSE(m.Post({b2, sizeof(b2), nullptr, 2}).has_value());
  auto first = m.Arrive(Eager("one"));
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->recv.context, 1u);
  EXPECT_FALSE(first->truncated);
  // Messages that come early wait for receives, in order.
  auto second = m.Arrive(Eager("two"));
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->recv.context, 2u);
  EXPECT_FALSE(m.Arrive(Eager("three")).has_value());
  Arrival rts;
  rts.rendezvous = true;
  rts.rts.length = 100;
  rts.cookie = 5;
  EXPECT_FALSE(m.Arrive(rts).has_value());
  EXPECT_EQ(m.waiting_messages(), 2u);
  auto third = m.Post({b1, sizeof(b1), nullptr, 3});
  ASSERT_TRUE(third.has_value());
  EXPECT_EQ(std::string(third->msg.data.begin(), third->msg.data.end()), "three");
  // A message longer than the receive it meets truncates only that one.
  auto fourth = m.Post({b3, sizeof(b3), nullptr, 4});
  ASSERT_TRUE(fourth.has_value());
  EXPECT_TRUE(fourth->truncated);
  EXPECT_TRUE(fourth->msg.rendezvous);
  EXPECT_EQ(fourth->msg.cookie, 5u);
  EXPECT_FALSE(m.Post({b3, sizeof(b3), nullptr, 5}).has_value());
  auto fits = m.Arrive(Eager("abcd"));
  ASSERT_TRUE(fits.has_value());
  EXPECT_FALSE(fits->truncated);
  EXPECT_EQ(m.waiting_recvs(), 0u);
  EXPECT_FALSE(m.Post({b3, sizeof(b3), nullptr, 6}).has_value());
  EXPECT_EQ(m.TakeRecvs().size(), 1u);
  EXPECT_EQ(m.waiting_recvs(), 0u);
}

TEST(Credits, WindowAndReturns) {
  Credits c(4);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(c.Take());
  EXPECT_FALSE(c.Take()) << "the last credit is kept for a credit update";
  EXPECT_FALSE(c.TakeForUpdate()) << "nothing owed: no update";
  c.Returned(8);
  EXPECT_FALSE(c.TakeForUpdate()) << "an update returning one gains the peer nothing";
  c.Returned(8);
  EXPECT_TRUE(c.TakeForUpdate());
  EXPECT_EQ(c.available(), 0u);
  EXPECT_FALSE(c.TakeForUpdate());
  EXPECT_EQ(c.TakeReturn(), 2);
  c.Grant(2);
  EXPECT_EQ(c.available(), 2u);
  EXPECT_FALSE(c.Returned(8));
  EXPECT_FALSE(c.Returned(8));
  EXPECT_FALSE(c.Returned(8));
  EXPECT_TRUE(c.Returned(8));  // half of the window refilled: tell the peer
  EXPECT_EQ(c.TakeReturn(), 4);
  EXPECT_EQ(c.pending_return(), 0u);
  EXPECT_EQ(c.TakeReturn(), 0);
  Credits unlimited(Credits::kUnlimited);
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(unlimited.Take());
  EXPECT_TRUE(unlimited.unlimited());
}

}  // namespace
}  // namespace zsock::verbs
