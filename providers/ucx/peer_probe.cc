// The boot id and the shared-memory probe.
#include "providers/ucx/peer_probe.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace zsock::ucx {

std::array<uint8_t, 16> BootId() {
  std::array<uint8_t, 16> id{};
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char text[64] = {};
    if (std::fgets(text, sizeof(text), f) != nullptr) {
      size_t n = 0;
      for (const char* p = text; *p != '\0' && n < 32; ++p) {
        int v = std::isdigit(static_cast<unsigned char>(*p)) ? *p - '0'
                : (*p >= 'a' && *p <= 'f')                   ? *p - 'a' + 10
                                                             : -1;
        if (v < 0) continue;
        id[n / 2] = static_cast<uint8_t>(id[n / 2] | (n % 2 == 0 ? v << 4 : v));
        ++n;
      }
    }
    std::fclose(f);
  }
  return id;
}

uint64_t RandomU64() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

const ShmProbe& Probe() {
  static const ShmProbe probe = [] {
    ShmProbe p;
    p.nonce = RandomU64() | 1;
    int fd = static_cast<int>(::syscall(SYS_memfd_create, "zsock-ucx-probe", MFD_CLOEXEC));
    if (fd >= 0 && ::pwrite(fd, &p.nonce, sizeof(p.nonce), 0) == sizeof(p.nonce)) {
      p.fd = fd;
    } else if (fd >= 0) {
      ::close(fd);
    }
    return p;
  }();
  return probe;
}

namespace {

// Why /proc/<pid>/fd/<fd> could not be opened (errno `err`).
absl::Status CannotAttach(uint32_t pid, const std::string& path, int err) {
  int scope = -1;
  if (FILE* y = std::fopen("/proc/sys/kernel/yama/ptrace_scope", "r")) {
    if (std::fscanf(y, "%d", &scope) != 1) scope = -1;
    std::fclose(y);
  }
  return MakeError(
      absl::StatusCode::kPermissionDenied, err,
      absl::StrCat("shared memory with pid ", pid, " is not possible: opening ", path,
                   " (how UCX's posix transport attaches a peer's segments; the same "
                   "ptrace permission check as cross-memory attach) failed",
                   scope >= 0 ? absl::StrCat(" with kernel.yama.ptrace_scope=", scope) : ""),
      absl::StrCat("run both processes as the same user (or give this one CAP_SYS_PTRACE)",
                   scope > 0 ? " and set kernel.yama.ptrace_scope=0" : "",
                   "; or accept the tcp fallback (fallback=tcp, the default)"));
}

}  // namespace

absl::Status ProbeSharedMemory(uint32_t pid, int32_t fd, uint64_t nonce) {
  if (fd < 0) {
    return MakeError(absl::StatusCode::kUnavailable, ENOENT,
                     "the peer has no shared-memory probe", "");
  }
  std::string path = absl::StrCat("/proc/", pid, "/fd/", fd);
  int f = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f < 0) return CannotAttach(pid, path, errno);
  uint64_t seen = 0;
  ssize_t n = ::pread(f, &seen, sizeof(seen), 0);
  ::close(f);
  if (n != sizeof(seen) || seen != nonce) {
    return MakeError(absl::StatusCode::kUnavailable, ESRCH,
                     absl::StrCat("pid ", pid, " of the peer is not visible here (another pid "
                                  "namespace or host), so shared memory is not possible"),
                     "run both processes in the same pid namespace for shared memory");
  }
  return absl::OkStatus();
}

}  // namespace zsock::ucx
