#include "core/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"

namespace zsock {
namespace {

std::atomic<int> g_level{-1};

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kError: return "ERROR";
    case LogLevel::kWarn: return "WARN";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kTrace: return "TRACE";
  }
  return "?";
}

}  // namespace

bool ParseLogLevel(std::string_view text, LogLevel* out) {
  // Debian's absl has its own absl::string_view (not std::string_view).
  std::string t = absl::AsciiStrToLower(absl::string_view(text.data(), text.size()));
  if (t == "error") *out = LogLevel::kError;
  else if (t == "warn" || t == "warning") *out = LogLevel::kWarn;
  else if (t == "info") *out = LogLevel::kInfo;
  else if (t == "debug") *out = LogLevel::kDebug;
  else if (t == "trace") *out = LogLevel::kTrace;
  else return false;
  return true;
}

LogLevel CurrentLogLevel() {
  int level = g_level.load(std::memory_order_relaxed);
  if (level >= 0) return static_cast<LogLevel>(level);
  LogLevel parsed = LogLevel::kWarn;
  if (const char* env = std::getenv("ZSOCK_LOG_LEVEL"); env != nullptr) {
    if (!ParseLogLevel(env, &parsed)) {
      std::fprintf(stderr,
                   "zsock[%d] WARN ZSOCK_LOG_LEVEL=%s is not a level; use one "
                   "of error, warn, info, debug, trace (using warn)\n",
                   getpid(), env);
    }
  }
  g_level.store(static_cast<int>(parsed), std::memory_order_relaxed);
  return parsed;
}

void SetLogLevel(LogLevel level) {
  g_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

void LogLine(LogLevel level, std::source_location loc, std::string_view msg) {
  const char* file = loc.file_name();
  if (const char* slash = std::strrchr(file, '/'); slash != nullptr) file = slash + 1;
  // One fprintf per record so concurrent lines do not interleave.
  std::fprintf(stderr, "zsock[%d] %s %s:%u %.*s\n", getpid(), LevelName(level),
               file, static_cast<unsigned>(loc.line()),
               static_cast<int>(msg.size()), msg.data());
}

}  // namespace zsock
