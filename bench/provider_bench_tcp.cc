// provider_bench's kernel TCP baseline (see provider_bench.h): the same
// ping-pong and stream over a loopback TCP connection with TCP_NODELAY.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/clock.h"
#include "bench/provider_bench.h"
#include "bench/samples.h"
#include "core/bootstrap_io.h"

namespace zsock::provider_bench {
namespace {

// The baseline's blocking sockets never time out: a stuck peer is the
// parent's to notice.
void FullIo(int fd, void* buf, size_t len, bool write) {
  BootstrapIo io(fd, absl::InfiniteFuture(), {.peer = "the tcp baseline's peer"});
  absl::Status st =
      write ? io.Write(buf, len, "the tcp baseline") : io.Read(buf, len, "the tcp baseline");
  if (!st.ok()) Die(std::string(st.message()));
}

}  // namespace

void TcpServer(int lfd, const std::vector<size_t>& sizes) {
  int fd = ::accept(lfd, nullptr, nullptr);
  if (fd < 0) Die("accept");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  size_t max = *std::max_element(sizes.begin(), sizes.end());
  std::vector<uint8_t> buf(std::max<size_t>(max, 8));
  for (size_t size : sizes) {
    for (int i = 0; i < Iters(size); ++i) {
      FullIo(fd, buf.data(), size, false);
      FullIo(fd, buf.data(), size, true);
    }
    int64_t count = StreamCount(size);
    for (int64_t i = 0; i < count; ++i) FullIo(fd, buf.data(), size, false);
    FullIo(fd, buf.data(), 1, true);
  }
  ::close(fd);
}

std::vector<Result> TcpClient(int port, const std::vector<size_t>& sizes) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) Die("tcp connect");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  size_t max = *std::max_element(sizes.begin(), sizes.end());
  std::vector<uint8_t> buf(std::max<size_t>(max, 8), 0x5a);
  std::vector<Result> results;
  for (size_t size : sizes) {
    std::vector<double> rtt;
    bench::ReserveTouched(&rtt, Iters(size));
    for (int i = 0; i < Iters(size); ++i) {
      int64_t t0 = bench::NowNs();
      FullIo(fd, buf.data(), size, true);
      FullIo(fd, buf.data(), size, false);
      rtt.push_back((bench::NowNs() - t0) / 1000.0);
    }
    int64_t count = StreamCount(size);
    int64_t t0 = bench::NowNs();
    for (int64_t i = 0; i < count; ++i) FullIo(fd, buf.data(), size, true);
    FullIo(fd, buf.data(), 1, false);
    double secs = (bench::NowNs() - t0) / 1e9;
    results.push_back(Summarize(rtt, size, static_cast<double>(size) * count / secs / 1e9));
  }
  ::close(fd);
  return results;
}

}  // namespace zsock::provider_bench
