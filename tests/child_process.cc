#include "tests/child_process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "absl/time/clock.h"

namespace zsock::testutil {

pid_t SpawnChild(std::function<int()> body, absl::Duration limit) {
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(static_cast<unsigned>(absl::ToInt64Seconds(limit)));
    int rc = body();
    std::fflush(nullptr);
    _exit(rc);
  }
  return pid;
}

int ReapChild(pid_t pid, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return -WTERMSIG(status);
    }
    if (r < 0) return -2000;
    if (absl::Now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1000;
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
}

}  // namespace zsock::testutil
