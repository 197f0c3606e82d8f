// Minimal levelled logging to stderr, controlled by ZSOCK_LOG_LEVEL
// (error|warn|info|debug|trace; default warn). absl 20220623 has no absl/log,
// so this is written here: one line per record, "zsock[pid] LEVEL file:line msg".
#ifndef ZSOCK_CORE_LOG_H_
#define ZSOCK_CORE_LOG_H_

#include <source_location>
#include "absl/strings/string_view.h"

#include "absl/strings/str_format.h"

namespace zsock {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3, kTrace = 4 };

// Current threshold; read once from ZSOCK_LOG_LEVEL (or the config file).
LogLevel CurrentLogLevel();
void SetLogLevel(LogLevel level);
bool ParseLogLevel(absl::string_view text, LogLevel* out);

void LogLine(LogLevel level, std::source_location loc, absl::string_view msg);

}  // namespace zsock

#define ZS_LOG(level, ...)                                                   \
  do {                                                                       \
    if (::zsock::LogLevel::level <= ::zsock::CurrentLogLevel())              \
      ::zsock::LogLine(::zsock::LogLevel::level,                             \
                       std::source_location::current(),                      \
                       absl::StrFormat(__VA_ARGS__));                        \
  } while (0)

#endif  // ZSOCK_CORE_LOG_H_
