// Connecting two endpoints within one test process, for provider tests.
#ifndef ZSOCK_TESTS_CONNECT_PAIR_H_
#define ZSOCK_TESTS_CONNECT_PAIR_H_

#include <memory>
#include <thread>

#include "absl/time/time.h"
#include "core/provider.h"
#include "gtest/gtest.h"

namespace zsock {

// Connects an endpoint of `fabric` on `cq_a` to `listener` (of any fabric),
// accepted on `cq_b`, both in this process, each side within `timeout`.
inline void ConnectThrough(Fabric* fabric, Listener* listener, CompletionQueue* cq_a,
                           CompletionQueue* cq_b, std::unique_ptr<Endpoint>* a,
                           std::unique_ptr<Endpoint>* b,
                           absl::Duration timeout = absl::Seconds(30)) {
  absl::StatusOr<std::unique_ptr<Endpoint>> accepted;
  std::thread acceptor([&] { accepted = listener->Accept(cq_b, timeout); });
  auto connected = fabric->Connect(listener->address(), cq_a, timeout);
  acceptor.join();
  ASSERT_TRUE(connected.ok()) << connected.status();
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  *a = std::move(*connected);
  *b = std::move(*accepted);
}

}  // namespace zsock

#endif  // ZSOCK_TESTS_CONNECT_PAIR_H_
