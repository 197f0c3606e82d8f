// zsock_bench's harness over kernel TCP: short runs of the tests through the
// library, the JSON records they produce, flag validation, and that broken
// transports (corrupting, dying, hanging) fail the run instead of passing or
// hanging. Every run here is small: the machine is shared.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/harness.h"
#include "bench/plot.h"
#include "gtest/gtest.h"

namespace zsock::bench {
namespace {

using TestKind = ::zsock::bench::Test;  // gtest's TEST bodies see testing::Test as Test

RawOptions Small(const std::string& test) {
  RawOptions raw;
  raw.test = test;
  raw.provider = "tcp";
  raw.iters = 200;
  raw.bytes = 1 << 20;
  raw.warmup = 10;
  raw.timeout_s = 30;
  raw.progress = getenv("BENCH_TEST_VERBOSE") != nullptr;
  return raw;
}

Options MustParse(const RawOptions& raw) {
  auto o = ParseOptions(raw);
  EXPECT_TRUE(o.ok()) << o.status();
  return o.ok() ? *o : Options{};
}

// Every "key":value pair of one flat JSON object line (values as their
// text; strings keep their quotes). Hand-rolled: std::regex trips a gcc 12
// -Wmaybe-uninitialized false positive under --config=asan.
std::map<std::string, std::string> JsonFields(const std::string& line) {
  std::map<std::string, std::string> out;
  size_t i = line.find('{');
  if (i == std::string::npos) return out;
  ++i;
  while (i < line.size() && line[i] == '"') {
    size_t key_end = line.find('"', i + 1);
    if (key_end == std::string::npos || key_end + 1 >= line.size() || line[key_end + 1] != ':') {
      break;
    }
    std::string key = line.substr(i + 1, key_end - i - 1);
    size_t v = key_end + 2, end = v;
    if (end < line.size() && line[end] == '"') {
      for (++end; end < line.size() && line[end] != '"'; ++end) {
        if (line[end] == '\\') ++end;
      }
      ++end;
    } else {
      while (end < line.size() && line[end] != ',' && line[end] != '}') ++end;
    }
    out[key] = line.substr(v, end - v);
    i = end + 1;  // past ',' (or '}')
  }
  return out;
}

double Num(const std::map<std::string, std::string>& f, const std::string& key) {
  auto it = f.find(key);
  double v = -1;
  if (it == f.end() || !absl::SimpleAtod(it->second, &v)) return -1;
  return v;
}

void ExpectSaneJson(const Record& r, bool latency) {
  const std::string line = RecordToJson(r);
  auto f = JsonFields(line);
  for (const char* key : {"test", "transport", "mode", "msg_size", "iterations", "lat_us_p50",
                          "lat_us_p99", "lat_us_avg", "bw_gbps", "msg_rate"}) {
    EXPECT_TRUE(f.count(key)) << key << " missing in " << line;
  }
  EXPECT_EQ(f["transport"], "\"tcp\"");
  EXPECT_EQ(f["mode"], "\"kernel\"");
  EXPECT_GT(Num(f, "msg_size"), 0) << line;
  EXPECT_GT(Num(f, "iterations"), 0) << line;
  EXPECT_GT(Num(f, "bw_gbps"), 0) << line;
  EXPECT_GT(Num(f, "msg_rate"), 0) << line;
  if (latency) {
    const double p50 = Num(f, "lat_us_p50"), p99 = Num(f, "lat_us_p99"),
                 avg = Num(f, "lat_us_avg");
    EXPECT_GT(p50, 0) << line;
    EXPECT_LE(p50, p99) << line;
    EXPECT_GT(avg, 0) << line;
  } else {
    EXPECT_EQ(f["lat_us_p50"], "null") << line;
  }
}

TEST(ZsockBench, PingpongOverTcp) {
  RawOptions raw = Small("pingpong");
  raw.sizes = "8,4K,64K";
  BenchResult res = RunBench(MustParse(raw));
  ASSERT_TRUE(res.failures.empty()) << res.failures[0];
  ASSERT_EQ(res.records.size(), 3u);
  EXPECT_EQ(res.records[0].msg_size, 8u);
  EXPECT_EQ(res.records[1].msg_size, 4096u);
  EXPECT_EQ(res.records[2].msg_size, 65536u);
  EXPECT_EQ(res.records[0].iterations, 200);
  for (const Record& r : res.records) {
    EXPECT_EQ(r.test, "pingpong");
    ExpectSaneJson(r, /*latency=*/true);
    // Pingpong moves 2 x size per round trip.
    EXPECT_NEAR(r.bw_gbps * 1e9 / r.msg_rate, static_cast<double>(r.msg_size),
                r.msg_size * 1e-6);
  }
  const std::string table = FormatTable(TestKind::kPingpong, res.records);
  EXPECT_TRUE(absl::StartsWith(table, "test ")) << table;
  EXPECT_TRUE(absl::StrContains(table, "p50_us")) << table;
  EXPECT_TRUE(absl::StrContains(table, "64K")) << table;
}

TEST(ZsockBench, StreamOverTcp) {
  RawOptions raw = Small("stream");
  raw.sizes = "64,64K";
  BenchResult res = RunBench(MustParse(raw));
  ASSERT_TRUE(res.failures.empty()) << res.failures[0];
  ASSERT_EQ(res.records.size(), 2u);
  for (const Record& r : res.records) ExpectSaneJson(r, /*latency=*/false);
  // 1 MiB per point, capped at 10 x iters messages.
  EXPECT_EQ(res.records[0].iterations, 2000);
  EXPECT_EQ(res.records[1].iterations, 16);
}

TEST(ZsockBench, ConnectOverTcp) {
  RawOptions raw = Small("connect");
  BenchResult res = RunBench(MustParse(raw));
  ASSERT_TRUE(res.failures.empty()) << res.failures[0];
  ASSERT_EQ(res.records.size(), 1u);
  ExpectSaneJson(res.records[0], /*latency=*/true);
  EXPECT_EQ(res.records[0].msg_size, 1u);
  EXPECT_EQ(res.records[0].iterations, 50);
}

// The multi-connection tests, tiny: each must complete and report the
// parameter it swept.
TEST(ZsockBench, MultiConnectionTestsOverTcp) {
  struct Case {
    const char* test;
    const char* flag_value;
  };
  for (const Case& c : {Case{"hotspot", "2"}, Case{"fanin", "2"}, Case{"fanout", "2"},
                        Case{"multistream", "2"}}) {
    SCOPED_TRACE(c.test);
    RawOptions raw = Small(c.test);
    raw.sizes = "64,16K";
    if (std::string(c.test) == "multistream") {
      raw.streams = c.flag_value;
    } else {
      raw.clients = c.flag_value;
    }
    BenchResult res = RunBench(MustParse(raw));
    ASSERT_TRUE(res.failures.empty()) << res.failures[0];
    ASSERT_EQ(res.records.size(), 2u);
    for (const Record& r : res.records) {
      ExpectSaneJson(r, /*latency=*/std::string(c.test) == "hotspot");
      auto f = JsonFields(RecordToJson(r));
      EXPECT_EQ(f[std::string(c.test) == "multistream" ? "streams" : "clients"], "2");
    }
  }
}

TEST(ZsockBench, OverlapPagefaultMsgrateOverTcp) {
  RawOptions raw = Small("overlap");
  raw.sizes = "64K";
  raw.compute_us = "0,20";
  BenchResult res = RunBench(MustParse(raw));
  ASSERT_TRUE(res.failures.empty()) << res.failures[0];
  ASSERT_EQ(res.records.size(), 2u);
  EXPECT_EQ(*res.records[1].compute_us, 20);
  // 16 sends with 20 us of computation after each: at least 320 us.
  EXPECT_GE(res.records[1].seconds, 16 * 20e-6);

  raw = Small("pagefault");
  raw.sizes = "4K";
  raw.window = "1,3";
  res = RunBench(MustParse(raw));
  ASSERT_TRUE(res.failures.empty()) << res.failures[0];
  ASSERT_EQ(res.records.size(), 2u);
  EXPECT_EQ(*res.records[1].window, 3);

  raw = Small("msgrate");
  raw.inflight = 16;
  res = RunBench(MustParse(raw));
  ASSERT_TRUE(res.failures.empty()) << res.failures[0];
  ASSERT_EQ(res.records.size(), 1u);
  EXPECT_GT(res.records[0].msg_rate, 0);
}

// `o` with its first transport (kernel TCP) made a baseline and, before
// it, a copy under another name that stands in for zsock.
Options WithTwin(Options o) {
  o.sizes = {8};
  Transport twin = o.transports[0];
  twin.name = "loopback-twin";
  twin.mode = "bcopy";
  o.transports[0].is_baseline = true;
  o.transports.insert(o.transports.begin(), twin);
  return o;
}

TEST(ZsockBench, RatiosAgainstTheBaseline) {
  // The twin's records get vs_tcp, the baseline's do not.
  BenchResult res = RunBench(WithTwin(MustParse(Small("pingpong"))));
  ASSERT_TRUE(res.failures.empty()) << res.failures[0];
  ASSERT_EQ(res.records.size(), 2u);
  EXPECT_EQ(res.records[0].transport, "loopback-twin");
  ASSERT_TRUE(res.records[0].vs_tcp.has_value());
  EXPECT_GT(*res.records[0].vs_tcp, 0);
  EXPECT_FALSE(res.records[1].vs_tcp.has_value());
  EXPECT_TRUE(absl::StrContains(RecordToJson(res.records[0]), "\"vs_tcp\":"));
  EXPECT_TRUE(absl::StrContains(FormatTable(TestKind::kPingpong, res.records), "vs_tcp"));
}

TEST(ZsockBench, RatiosAgainstBothBaselines) {
  // As above, with both kernel TCP baselines: the twin gets a ratio to each,
  // in the table and the JSON; the baselines get none.
  RawOptions raw = Small("pingpong");
  raw.baseline = "tcp-busy";
  Options o = MustParse(raw);  // kernel TCP measured, busy-polled as baseline
  ASSERT_EQ(o.transports.size(), 2u);
  EXPECT_EQ(o.transports[1].name, "tcp-busy");
  EXPECT_EQ(o.transports[1].ops, &KernelTcpBusyOps());
  BenchResult res = RunBench(WithTwin(o));
  ASSERT_TRUE(res.failures.empty()) << res.failures[0];
  ASSERT_EQ(res.records.size(), 3u);
  EXPECT_EQ(res.records[0].transport, "loopback-twin");
  ASSERT_TRUE(res.records[0].vs_tcp.has_value());
  ASSERT_TRUE(res.records[0].vs_tcp_busy.has_value());
  EXPECT_GT(*res.records[0].vs_tcp_busy, 0);
  for (int i : {1, 2}) {
    EXPECT_FALSE(res.records[i].vs_tcp.has_value()) << res.records[i].transport;
    EXPECT_FALSE(res.records[i].vs_tcp_busy.has_value()) << res.records[i].transport;
  }
  EXPECT_TRUE(absl::StrContains(RecordToJson(res.records[0]), "\"vs_tcp_busy\":"));
  const std::string table = FormatTable(TestKind::kPingpong, res.records);
  EXPECT_TRUE(absl::StrContains(table, "vs_tcp_busy")) << table;
  EXPECT_TRUE(absl::StrContains(table, "tcp-busy")) << table;
}

// ---- broken transports ----

ssize_t CorruptingSend(int fd, const void* buf, size_t len, int flags) {
  static bool done = false;  // per process (each child is a fresh fork)
  if (!done && len >= 64) {
    done = true;
    std::vector<char> copy(static_cast<const char*>(buf), static_cast<const char*>(buf) + len);
    copy[len / 2] ^= 0x10;
    return ::send(fd, copy.data(), len, flags);
  }
  return ::send(fd, buf, len, flags);
}

ssize_t DyingRecv(int fd, void* buf, size_t len, int flags) {
  static int calls = 0;
  if (++calls == 20) _exit(7);
  return ::recv(fd, buf, len, flags);
}

ssize_t HangingRecv(int fd, void* buf, size_t len, int flags) {
  static int calls = 0;
  if (++calls == 20) {
    for (;;) pause();
  }
  return ::recv(fd, buf, len, flags);
}

Options Broken(const char* test, SockOps* ops) {
  RawOptions raw = Small(test);
  raw.sizes = "4K";
  Options o = MustParse(raw);
  o.transports[0].ops = ops;
  o.transports[0].name = "broken";
  return o;
}

TEST(ZsockBench, CorruptedDataFailsTheRun) {
  for (const char* test : {"pingpong", "stream", "fanin"}) {
    SCOPED_TRACE(test);
    SockOps ops = KernelTcpOps();
    ops.send = CorruptingSend;
    BenchResult res = RunBench(Broken(test, &ops));
    ASSERT_EQ(res.failures.size(), 1u);
    EXPECT_TRUE(res.records.empty());
    EXPECT_TRUE(absl::StrContains(res.failures[0], "data corrupted")) << res.failures[0];
    EXPECT_TRUE(absl::StrContains(res.failures[0], "over broken/kernel")) << res.failures[0];
  }
}

TEST(ZsockBench, DeadPeerIsAnErrorNotAHang) {
  SockOps ops = KernelTcpOps();
  ops.recv = DyingRecv;
  const absl::Time start = absl::Now();
  BenchResult res = RunBench(Broken("pingpong", &ops));
  ASSERT_EQ(res.failures.size(), 1u);
  EXPECT_TRUE(absl::StrContains(res.failures[0], "exited with status 7")) << res.failures[0];
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
}

TEST(ZsockBench, HungPeerIsKilledAfterTheTimeout) {
  SockOps ops = KernelTcpOps();
  ops.recv = HangingRecv;
  Options o = Broken("stream", &ops);
  o.timeout = absl::Seconds(1);
  const absl::Time start = absl::Now();
  BenchResult res = RunBench(o);
  ASSERT_EQ(res.failures.size(), 1u);
  EXPECT_TRUE(absl::StrContains(res.failures[0], "no progress")) << res.failures[0];
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
}

// ---- flags ----

TEST(ZsockBench, BadFlagsAreClearErrors) {
  struct Case {
    std::function<void(RawOptions&)> set;
    const char* expect;
  };
  const Case cases[] = {
      {[](RawOptions& r) { r.test = "nosuch"; }, "unknown --test='nosuch'"},
      {[](RawOptions& r) { r.test = ""; }, "--test is required"},
      {[](RawOptions& r) { r.sizes = "8,abc"; }, "bad --sizes='8,abc'"},
      {[](RawOptions& r) { r.sizes = "0"; }, "bad --sizes"},
      {[](RawOptions& r) { r.sizes = "1G"; }, "at most 256M"},
      {[](RawOptions& r) { r.sizes = ""; r.test = "connect"; r.sizes = "8"; },
       "--sizes does not apply"},
      {[](RawOptions& r) { r.provider = "nosuch"; }, "unknown provider 'nosuch'"},
      {[](RawOptions& r) { r.provider = ""; }, "--provider is empty"},
      {[](RawOptions& r) { r.mode = "fastest"; }, "unknown --mode='fastest'"},
      {[](RawOptions& r) { r.baseline = "udp"; }, "unknown --baseline='udp'"},
      {[](RawOptions& r) { r.baseline = "tcp"; }, "would measure tcp twice"},
      {[](RawOptions& r) { r.provider = "tcp-busy"; r.baseline = "all"; },
       "would measure tcp-busy twice"},
      {[](RawOptions& r) { r.baseline = "busy"; }, "unknown --baseline='busy'"},
      {[](RawOptions& r) { r.window = "4"; }, "--window applies to --test=pagefault"},
      {[](RawOptions& r) { r.clients = "4"; }, "--clients applies to"},
      {[](RawOptions& r) { r.test = "hotspot"; r.clients = "0"; }, "bad --clients='0'"},
      {[](RawOptions& r) { r.test = "hotspot"; r.clients = "65"; }, "at most 64"},
      {[](RawOptions& r) { r.test = "overlap"; r.compute_us = "-5"; }, "bad --compute_us"},
      {[](RawOptions& r) { r.test = "multistream"; r.streams = "2,x"; }, "bad --streams"},
      {[](RawOptions& r) { r.iters = 0; }, "bad --iters=0"},
      {[](RawOptions& r) { r.inflight = 8; }, "--inflight applies to --test=msgrate"},
      {[](RawOptions& r) { r.timeout_s = 0; }, "bad --timeout=0"},
      {[](RawOptions& r) { r.server_core = 4096; }, "bad --server_core=4096"},
  };
  for (const Case& c : cases) {
    RawOptions raw = Small("pingpong");
    c.set(raw);
    auto o = ParseOptions(raw);
    ASSERT_FALSE(o.ok()) << c.expect;
    if (!absl::StrContains(c.expect, "provider 'nosuch'")) {
      EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << o.status();
    }
    EXPECT_TRUE(absl::StrContains(o.status().message(), c.expect))
        << "want '" << c.expect << "' in: " << o.status().message();
    EXPECT_TRUE(absl::StrContains(o.status().message(), "fix:")) << o.status().message();
  }
}

TEST(ZsockBench, ZsockProviderResolvesToTheSocketsApi) {
  RawOptions raw = Small("pingpong");
  raw.provider = "unet";
  raw.mode = "bcopy,zcopy";
  raw.baseline = "tcp";
  auto o = ParseOptions(raw);
  ASSERT_TRUE(ZsockOps().ok());
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_EQ(o->transports.size(), 3u);
  EXPECT_EQ(o->transports[0].name, "unet");
  EXPECT_EQ(o->transports[0].mode, "bcopy");
  EXPECT_EQ(o->transports[1].mode, "zcopy");
  EXPECT_EQ(o->transports[2].name, "tcp");
  EXPECT_TRUE(o->transports[2].is_baseline);

  raw.baseline = "all";
  o = ParseOptions(raw);
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_EQ(o->transports.size(), 4u);
  EXPECT_EQ(o->transports[2].name, "tcp");
  EXPECT_EQ(o->transports[3].name, "tcp-busy");
  EXPECT_TRUE(o->transports[3].is_baseline);
  EXPECT_EQ(o->transports[3].ops, &KernelTcpBusyOps());
}

// --stats: each zsock end prints its connection's counters after the point
// (both children inherit the test's stderr); kernel TCP prints none.
TEST(ZsockBench, StatsPrintEachZsockEndsCounters) {
  RawOptions raw = Small("stream");
  raw.provider = "unet";
  raw.mode = "bcopy";
  raw.baseline = "tcp";
  raw.sizes = "4K";
  raw.stats = true;
  Options o = MustParse(raw);
  testing::internal::CaptureStderr();
  BenchResult res = RunBench(o);
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(res.failures.empty()) << res.failures[0];
  ASSERT_EQ(res.records.size(), 2u);
  // The stream's messages and its warm-up, copied (bcopy); the server sends
  // two one-byte acknowledgements (after the warm-up, at the end).
  const int64_t bytes = (res.records[0].iterations + raw.warmup) * 4096;
  std::vector<std::string> lines;
  for (absl::string_view l : absl::StrSplit(err, '\n')) {
    if (absl::StartsWith(l, "stats: ")) lines.emplace_back(l);
  }
  ASSERT_EQ(lines.size(), 2u) << err;
  const std::string client = absl::StrContains(lines[0], "client") ? lines[0] : lines[1];
  const std::string server = absl::StrContains(lines[0], "client") ? lines[1] : lines[0];
  EXPECT_TRUE(absl::StrContains(client, "stats: client connection fd ")) << client;
  EXPECT_TRUE(absl::StrContains(client + " ", absl::StrCat(" bytes_sent_bcopy=", bytes, " ")))
      << client;
  EXPECT_TRUE(absl::StrContains(client + " ", " bytes_recv_bcopy=2 ")) << client;
  EXPECT_TRUE(absl::StrContains(server, "stats: server connection fd ")) << server;
  EXPECT_TRUE(absl::StrContains(server + " ", absl::StrCat(" bytes_recv_bcopy=", bytes, " ")))
      << server;
  EXPECT_TRUE(absl::StrContains(server, " messages_received=")) << server;
}

TEST(ZsockBench, ListsParse) {
  auto s = ParseSizeList("sizes", "8, 64,4K,1m,2G");
  EXPECT_FALSE(s.ok());  // 2G > 256M
  s = ParseSizeList("sizes", "8, 64,4K,1m");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, (std::vector<size_t>{8, 64, 4096, 1 << 20}));
  EXPECT_FALSE(ParseSizeList("sizes", "8,,64").ok());
  EXPECT_FALSE(ParseSizeList("sizes", "-8").ok());
  EXPECT_FALSE(ParseSizeList("sizes", "K").ok());
  EXPECT_EQ(SizeLabel(8), "8");
  EXPECT_EQ(SizeLabel(65536), "64K");
  EXPECT_EQ(SizeLabel(1000), "1000");
  EXPECT_EQ(SizeLabel(3 << 20), "3M");
}

// ---- plots ----

TEST(ZsockBench, PlotScriptAndPng) {
  std::vector<Record> records;
  for (const char* t : {"unet", "tcp"}) {
    for (size_t size : {65536u, 1048576u}) {
      for (int64_t w : {1, 4, 16}) {
        Record r;
        r.test = "pagefault";
        r.transport = t;
        r.mode = std::string(t) == "tcp" ? "kernel" : "azcopy";
        r.msg_size = size;
        r.window = w;
        r.iterations = 100;
        r.bw_gbps = 0.5 * static_cast<double>(w);
        records.push_back(r);
      }
    }
  }
  const std::string dir = absl::StrCat(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp",
                                       "/plots-", getpid());
  auto gp = WritePlotScript(dir, TestKind::kPagefault, records);
  ASSERT_TRUE(gp.ok()) << gp.status();
  std::ifstream f(*gp);
  std::string script((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  // Two panels (64K and 1M, fig. 8a/8b), two curves each.
  EXPECT_TRUE(absl::StrContains(script, "multiplot layout 1,2")) << script;
  EXPECT_TRUE(absl::StrContains(script, "(a) 64Kbyte messages")) << script;
  EXPECT_TRUE(absl::StrContains(script, "(b) 1Mbyte messages")) << script;
  EXPECT_TRUE(absl::StrContains(script, "\"kernel TCP\"")) << script;
  EXPECT_TRUE(absl::StrContains(script, "\"unet azcopy\"")) << script;
  EXPECT_TRUE(absl::StrContains(script, "index 3")) << script;
  struct stat st;
  ASSERT_EQ(stat((dir + "/pagefault.dat").c_str(), &st), 0);

  if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "gnuplot is not installed (apt-get install gnuplot-nox): PNG not checked";
  }
  auto png = WritePlot(dir, TestKind::kPagefault, records);
  ASSERT_TRUE(png.ok()) << png.status();
  ASSERT_EQ(stat(png->c_str(), &st), 0) << *png;
  EXPECT_GT(st.st_size, 1000);
}

}  // namespace
}  // namespace zsock::bench
