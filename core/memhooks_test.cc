// Tests for the memory-release interposers (core/memhooks.h): each release
// call reaches installed handlers with the right range before the memory is
// released, and not after removal, under a bypass, or with
// ZSOCK_MEMHOOKS=off (checked in a child process).

#include "core/memhooks.h"

#include <spawn.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

extern char** environ;

namespace zsock {
namespace {

// Handlers see every release in the process (gtest's own frees included), so
// the recorder keeps only reports overlapping a watched window. It never
// allocates.
struct Report {
  uintptr_t addr;
  size_t len;
};

constexpr int kMaxReports = 64;
std::atomic<uintptr_t> g_watch_lo{0};
std::atomic<uintptr_t> g_watch_hi{0};
std::atomic<int> g_num_reports{0};
Report g_reports[kMaxReports];
std::atomic<int> g_depth{0};
std::atomic<int> g_max_depth{0};
std::atomic<bool> g_free_inside_handler{false};

void Watch(const void* p, size_t len) {
  g_num_reports.store(0);
  g_watch_lo.store(reinterpret_cast<uintptr_t>(p));
  g_watch_hi.store(reinterpret_cast<uintptr_t>(p) + len);
}

void Unwatch() {
  g_watch_lo.store(0);
  g_watch_hi.store(0);
}

// malloc + free of a block the compiler cannot elide.
void AllocAndFree(size_t n) {
  void* p = std::malloc(n);
  asm volatile("" : : "r"(p) : "memory");
  std::free(p);
}

void Recorder(void* arg, uintptr_t addr, size_t len) {
  const int depth = g_depth.fetch_add(1) + 1;
  int seen = g_max_depth.load();
  while (depth > seen && !g_max_depth.compare_exchange_weak(seen, depth)) {
  }
  const uintptr_t lo = g_watch_lo.load();
  const uintptr_t hi = g_watch_hi.load();
  if (addr < hi && lo < addr + len) {
    if (g_free_inside_handler.load()) {
      // A handler that releases memory must not be re-entered.
      AllocAndFree(4096);
    }
    const int i = g_num_reports.fetch_add(1);
    if (i < kMaxReports) g_reports[i] = Report{addr, len};
  }
  if (arg != nullptr) static_cast<std::atomic<int>*>(arg)->fetch_add(1);
  g_depth.fetch_sub(1);
}

class MemHooksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Unwatch();
    g_max_depth.store(0);
    g_free_inside_handler.store(false);
    id_ = AddMemoryReleaseHandler(&Recorder, nullptr);
    ASSERT_GE(id_, 0);
  }
  void TearDown() override {
    Unwatch();
    if (id_ >= 0) RemoveMemoryReleaseHandler(id_);
  }
  // The reports seen so far (copied so that assertions do not race).
  std::vector<Report> Reports() {
    const int n = std::min(g_num_reports.load(), kMaxReports);
    return std::vector<Report>(g_reports, g_reports + n);
  }

  int id_ = -1;
  const size_t page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
};

TEST_F(MemHooksTest, InterposersAreInEffect) {
  // Our free() precedes libc's (and the sanitizer runtime's) in lookup order.
  EXPECT_TRUE(MemoryHooksActive());
}

TEST_F(MemHooksTest, FreeReportsTheBlock) {
  constexpr size_t kSize = 1 << 20;
  char* p = static_cast<char*>(std::malloc(kSize));
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, kSize);
  Watch(p, kSize);
  std::free(p);
  Unwatch();
  auto reports = Reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].addr, reinterpret_cast<uintptr_t>(p));
  EXPECT_GE(reports[0].len, kSize);
}

TEST_F(MemHooksTest, OperatorDeleteReportsThroughFree) {
  auto* v = new std::vector<char>(300000, 'x');
  const char* data = v->data();
  Watch(data, v->size());
  delete v;
  Unwatch();
  auto reports = Reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].addr, reinterpret_cast<uintptr_t>(data));
  EXPECT_GE(reports[0].len, 300000u);
}

TEST_F(MemHooksTest, ReallocReportsTheOldBlock) {
  constexpr size_t kSize = 256 * 1024;
  char* p = static_cast<char*>(std::malloc(kSize));
  ASSERT_NE(p, nullptr);
  const uintptr_t old = reinterpret_cast<uintptr_t>(p);
  Watch(p, kSize);
  char* q = static_cast<char*>(std::realloc(p, 4 * kSize));
  Unwatch();
  ASSERT_NE(q, nullptr);
  auto reports = Reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].addr, old);
  EXPECT_GE(reports[0].len, kSize);
  std::free(q);
}

TEST_F(MemHooksTest, ReallocOfNullReportsNothing) {
  // realloc(nullptr, n) is malloc: nothing is released.
  Watch(reinterpret_cast<void*>(1), ~uintptr_t{0} - 2);  // everything
  void* p = std::realloc(nullptr, 128);
  Unwatch();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(g_num_reports.load(), 0);
  std::free(p);
}

TEST_F(MemHooksTest, ReallocarrayReportsTheOldBlock) {
  char* p = static_cast<char*>(std::malloc(100000));
  ASSERT_NE(p, nullptr);
  const uintptr_t old = reinterpret_cast<uintptr_t>(p);
  Watch(p, 100000);
  char* q = static_cast<char*>(reallocarray(p, 1000, 1000));
  Unwatch();
  ASSERT_NE(q, nullptr);
  auto reports = Reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].addr, old);
  std::free(q);
}

TEST_F(MemHooksTest, MunmapReportsTheRange) {
  char* p = static_cast<char*>(mmap(nullptr, 4 * page_, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  Watch(p, 4 * page_);
  ASSERT_EQ(munmap(p + page_, 2 * page_), 0);
  auto reports = Reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].addr, reinterpret_cast<uintptr_t>(p + page_));
  EXPECT_EQ(reports[0].len, 2 * page_);
  ASSERT_EQ(munmap(p, page_), 0);
  ASSERT_EQ(munmap(p + 3 * page_, page_), 0);
  Unwatch();
  EXPECT_EQ(Reports().size(), 3u);
}

TEST_F(MemHooksTest, MremapReportsTheOldRange) {
  char* p = static_cast<char*>(mmap(nullptr, 2 * page_, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  Watch(p, 2 * page_);
  void* q = mremap(p, 2 * page_, 64 * page_, MREMAP_MAYMOVE);
  Unwatch();
  ASSERT_NE(q, MAP_FAILED);
  auto reports = Reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].addr, reinterpret_cast<uintptr_t>(p));
  EXPECT_EQ(reports[0].len, 2 * page_);
  ASSERT_EQ(munmap(q, 64 * page_), 0);
}

TEST_F(MemHooksTest, MremapFixedReportsTheReplacedTarget) {
  char* src = static_cast<char*>(mmap(nullptr, page_, PROT_READ | PROT_WRITE,
                                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  char* dst = static_cast<char*>(mmap(nullptr, page_, PROT_READ | PROT_WRITE,
                                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(src, MAP_FAILED);
  ASSERT_NE(dst, MAP_FAILED);
  Watch(dst, page_);  // only the target
  void* q = mremap(src, page_, page_, MREMAP_MAYMOVE | MREMAP_FIXED, dst);
  Unwatch();
  ASSERT_EQ(q, dst);
  auto reports = Reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].addr, reinterpret_cast<uintptr_t>(dst));
  EXPECT_EQ(reports[0].len, page_);
  ASSERT_EQ(munmap(dst, page_), 0);
}

TEST_F(MemHooksTest, MadviseReportsOnlyReleasingAdvice) {
  char* p = static_cast<char*>(mmap(nullptr, 4 * page_, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  Watch(p, 4 * page_);
  ASSERT_EQ(madvise(p, 4 * page_, MADV_WILLNEED), 0);
  ASSERT_EQ(madvise(p, 4 * page_, MADV_NORMAL), 0);
  EXPECT_EQ(g_num_reports.load(), 0);
  ASSERT_EQ(madvise(p + page_, page_, MADV_DONTNEED), 0);
  ASSERT_EQ(madvise(p + 2 * page_, page_, MADV_FREE), 0);
  madvise(p + 3 * page_, page_, MADV_REMOVE);  // may fail on private memory
  Unwatch();
  auto reports = Reports();
  ASSERT_EQ(reports.size(), 3u);
  EXPECT_EQ(reports[0].addr, reinterpret_cast<uintptr_t>(p + page_));
  EXPECT_EQ(reports[0].len, page_);
  EXPECT_EQ(reports[1].addr, reinterpret_cast<uintptr_t>(p + 2 * page_));
  EXPECT_EQ(reports[2].addr, reinterpret_cast<uintptr_t>(p + 3 * page_));
  ASSERT_EQ(munmap(p, 4 * page_), 0);
}

TEST_F(MemHooksTest, ShmdtReportsTheWholeSegment) {
  const size_t size = 3 * page_;
  int shmid = shmget(IPC_PRIVATE, size, IPC_CREAT | 0600);
  if (shmid < 0) GTEST_SKIP() << "SysV shared memory unavailable: " << std::strerror(errno);
  void* p = shmat(shmid, nullptr, 0);
  shmctl(shmid, IPC_RMID, nullptr);  // destroyed on detach
  ASSERT_NE(p, reinterpret_cast<void*>(-1));
  Watch(p, size);
  ASSERT_EQ(shmdt(p), 0);
  Unwatch();
  auto reports = Reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].addr, reinterpret_cast<uintptr_t>(p));
  EXPECT_EQ(reports[0].len, size);
}

// After fork() the child must not run the parent's handlers (they would act
// on the parent's caches and shared key tables); the parent's keep working.
TEST_F(MemHooksTest, ForkedChildDoesNotRunParentHandlers) {
  auto* child_reports = static_cast<std::atomic<int>*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(child_reports, MAP_FAILED);
  new (child_reports) std::atomic<int>(0);
  int id = AddMemoryReleaseHandler(
      [](void* arg, uintptr_t, size_t) { static_cast<std::atomic<int>*>(arg)->fetch_add(1); },
      child_reports);
  ASSERT_GE(id, 0);
  pid_t pid = fork();
  if (pid == 0) {
    // In the child: releases reach no handler of the parent's.
    char* p = static_cast<char*>(std::malloc(1 << 20));
    std::memset(p, 1, 1 << 20);
    std::free(p);
    void* m = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(m, 8192);
    _exit(child_reports->load() == 0 ? 0 : 3);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  EXPECT_EQ(child_reports->load(), 0);
  // The parent's handler still runs.
  void* m = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  munmap(m, 8192);
  EXPECT_GE(child_reports->load(), 1);
  RemoveMemoryReleaseHandler(id);
  munmap(child_reports, 4096);
}

TEST_F(MemHooksTest, ExplicitNotifyReachesHandlers) {
  char buf[64] = {};
  Watch(buf, sizeof(buf));
  NotifyMemoryReleased(buf + 8, 16);
  NotifyMemoryReleased(buf, 0);  // empty ranges are not reported
  Unwatch();
  auto reports = Reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].addr, reinterpret_cast<uintptr_t>(buf + 8));
  EXPECT_EQ(reports[0].len, 16u);
}

TEST_F(MemHooksTest, NotCalledAfterRemoval) {
  std::atomic<int> calls{0};
  const int id = AddMemoryReleaseHandler(&Recorder, &calls);
  ASSERT_GE(id, 0);
  AllocAndFree(1000);
  EXPECT_GE(calls.load(), 1);
  RemoveMemoryReleaseHandler(id);
  const int before = calls.load();
  AllocAndFree(1000);
  char* m = static_cast<char*>(mmap(nullptr, page_, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(m, MAP_FAILED);
  ASSERT_EQ(munmap(m, page_), 0);
  EXPECT_EQ(calls.load(), before);
  RemoveMemoryReleaseHandler(id);  // removing twice is harmless
}

TEST_F(MemHooksTest, BypassSuppressesReportsOnThisThreadOnly) {
  char* a = static_cast<char*>(std::malloc(200000));
  char* b = static_cast<char*>(std::malloc(200000));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  {
    Watch(a, 200000);
    ScopedMemoryHookBypass bypass;
    std::free(a);
    EXPECT_EQ(g_num_reports.load(), 0);
    // Another thread is not bypassed.
    Watch(b, 200000);
    std::thread([b] { std::free(b); }).join();
    EXPECT_EQ(g_num_reports.load(), 1);
  }
  char* c = static_cast<char*>(std::malloc(200000));
  Watch(c, 200000);
  std::free(c);
  Unwatch();
  EXPECT_EQ(g_num_reports.load(), 1);
}

TEST_F(MemHooksTest, HandlerThatFreesIsNotReentered) {
  char* p = static_cast<char*>(std::malloc(500000));
  ASSERT_NE(p, nullptr);
  g_free_inside_handler.store(true);
  Watch(p, 500000);
  std::free(p);
  Unwatch();
  g_free_inside_handler.store(false);
  EXPECT_EQ(g_num_reports.load(), 1);
  EXPECT_EQ(g_max_depth.load(), 1);
}

TEST_F(MemHooksTest, TableHoldsAtMost64Handlers) {
  std::vector<int> ids;
  for (int i = 0; i < 100; ++i) {
    const int id = AddMemoryReleaseHandler(&Recorder, nullptr);
    if (id < 0) break;
    ids.push_back(id);
  }
  // The fixture's handler holds one slot.
  EXPECT_EQ(ids.size(), 63u);
  EXPECT_EQ(AddMemoryReleaseHandler(&Recorder, nullptr), -1);
  for (int id : ids) RemoveMemoryReleaseHandler(id);
  const int again = AddMemoryReleaseHandler(&Recorder, nullptr);
  EXPECT_GE(again, 0);
  RemoveMemoryReleaseHandler(again);
}

// A handler that blocks until told to finish.
std::atomic<bool> g_slow_entered{false};
std::atomic<bool> g_slow_release{false};
std::atomic<bool> g_slow_finished{false};
std::atomic<uintptr_t> g_slow_target{0};

void SlowHandler(void*, uintptr_t addr, size_t len) {
  const uintptr_t t = g_slow_target.load();
  if (t == 0 || !(addr <= t && t < addr + len)) return;
  g_slow_entered.store(true);
  while (!g_slow_release.load()) sched_yield();
  usleep(20000);
  g_slow_finished.store(true);
}

TEST_F(MemHooksTest, RemoveWaitsForRunningHandlers) {
  const int id = AddMemoryReleaseHandler(&SlowHandler, nullptr);
  ASSERT_GE(id, 0);
  char* p = static_cast<char*>(std::malloc(300000));
  ASSERT_NE(p, nullptr);
  g_slow_target.store(reinterpret_cast<uintptr_t>(p));
  std::thread freer([p] { std::free(p); });
  while (!g_slow_entered.load()) sched_yield();
  g_slow_release.store(true);
  RemoveMemoryReleaseHandler(id);
  // Remove returned only after the running call finished.
  EXPECT_TRUE(g_slow_finished.load());
  freer.join();
  g_slow_target.store(0);
}

TEST_F(MemHooksTest, ConcurrentAddRemoveAndReleases) {
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&stop] {
      while (!stop.load()) AllocAndFree(64 + 4096);
    });
  }
  std::atomic<int> calls{0};
  for (int i = 0; i < 300; ++i) {
    const int id = AddMemoryReleaseHandler(&Recorder, &calls);
    ASSERT_GE(id, 0);
    AllocAndFree(100);
    RemoveMemoryReleaseHandler(id);
  }
  const int after = calls.load();
  stop.store(true);
  for (auto& t : threads) t.join();
  // Each iteration's own free was reported; nothing arrived after removal.
  EXPECT_GE(after, 300);
  EXPECT_EQ(calls.load(), after);
}

// ---- ZSOCK_MEMHOOKS=off, checked in a child process ----

constexpr int kChildSuccess = 37;

// Run only by EnvOffDisablesReporting, in a child with ZSOCK_MEMHOOKS=off.
TEST(MemHooksEnvTest, DISABLED_ChildWithHooksOff) {
  const char* env = std::getenv("ZSOCK_MEMHOOKS");
  ASSERT_NE(env, nullptr);
  ASSERT_STREQ(env, "off");
  EXPECT_FALSE(MemoryHooksActive());
  const int id = AddMemoryReleaseHandler(&Recorder, nullptr);
  ASSERT_GE(id, 0);
  char* p = static_cast<char*>(std::malloc(1 << 20));
  Watch(p, 1 << 20);
  std::free(p);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  char* m = static_cast<char*>(mmap(nullptr, page, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  Watch(m, page);
  munmap(m, page);
  Unwatch();
  EXPECT_EQ(g_num_reports.load(), 0);
  // Explicit notifications still reach handlers.
  char buf[16] = {};
  Watch(buf, sizeof(buf));
  NotifyMemoryReleased(buf, sizeof(buf));
  Unwatch();
  EXPECT_EQ(g_num_reports.load(), 1);
  RemoveMemoryReleaseHandler(id);
  if (!::testing::Test::HasFailure()) {
    std::fflush(nullptr);
    _exit(kChildSuccess);  // proves to the parent that this test ran
  }
}

TEST(MemHooksEnvTest, EnvOffDisablesReporting) {
  std::vector<std::string> env_strings;
  // The child gets our environment minus the variables through which Bazel
  // and gtest would make it write this test's outputs or shard its tests.
  auto dropped = [](const char* var) {
    for (const char* prefix :
         {"ZSOCK_MEMHOOKS=", "XML_OUTPUT_FILE=", "GTEST_", "TEST_SHARD",
          "TEST_TOTAL_SHARDS=", "TEST_PREMATURE_EXIT_FILE="}) {
      if (std::strncmp(var, prefix, std::strlen(prefix)) == 0) return true;
    }
    return false;
  };
  for (char** e = environ; *e != nullptr; ++e) {
    if (!dropped(*e)) env_strings.push_back(*e);
  }
  env_strings.push_back("ZSOCK_MEMHOOKS=off");
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string filter = "--gtest_filter=MemHooksEnvTest.DISABLED_ChildWithHooksOff";
  std::string disabled = "--gtest_also_run_disabled_tests";
  std::string self = "/proc/self/exe";
  char* argv[] = {self.data(), filter.data(), disabled.data(), nullptr};
  pid_t pid;
  ASSERT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv,
                        envp.data()),
            0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child status " << status;
  EXPECT_EQ(WEXITSTATUS(status), kChildSuccess);
}

}  // namespace
}  // namespace zsock
