// Child processes for the suites that need two real processes
// (conformance, SDP engine, sockets): fork a body, reap it with a bound.
#ifndef ZSOCK_TESTS_CHILD_PROCESS_H_
#define ZSOCK_TESTS_CHILD_PROCESS_H_

#include <sys/types.h>

#include <functional>

#include "absl/time/time.h"

namespace zsock::testutil {

// Forks a child that runs `body` and exits with its return value. The child
// gets SIGALRM after `limit`, so a hung child cannot hang the suite.
pid_t SpawnChild(std::function<int()> body, absl::Duration limit);

// Waits for `pid`: its exit code, -signal if a signal ended it, -1000 if it
// outlived `timeout` (it is then killed), -2000 if it is not our child.
int ReapChild(pid_t pid, absl::Duration timeout);

}  // namespace zsock::testutil

#endif  // ZSOCK_TESTS_CHILD_PROCESS_H_
