// Rendering zsock_bench's records (see report.h): JSON lines, the table,
// and the ratios to the baseline. The formats are what docs/benchmarks.md
// documents and scripts parse: keep them byte for byte.
#include "bench/report.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace zsock::bench {
namespace {

using internal::Param;
using internal::ParamName;
using internal::ParamValue;

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(ch));
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  return absl::StrFormat("%.6g", v);
}

std::string JsonOpt(const std::optional<double>& v) {
  return v ? JsonNumber(*v) : std::string("null");
}

// The table's rows: grouped like the figures' panels, by size where the
// parameter is the x axis (overlap, pagefault, multistream), else by the
// parameter; within a group, transports in the order they ran.
std::vector<const Record*> TableOrder(Param param, const std::vector<Record>& records) {
  std::vector<std::string> order;
  for (const Record& r : records) {
    std::string k = r.transport + "\n" + r.mode;
    if (std::find(order.begin(), order.end(), k) == order.end()) order.push_back(k);
  }
  std::vector<const Record*> rows;
  for (const Record& r : records) rows.push_back(&r);
  auto rank = [&](const Record* r) {
    return std::find(order.begin(), order.end(), r->transport + "\n" + r->mode) - order.begin();
  };
  const bool size_first = param == Param::kCompute || param == Param::kWindow ||
                          param == Param::kStreams;
  auto key = [&](const Record* r) {
    const int64_t p = ParamValue(param, *r).value_or(0);
    const int64_t size = static_cast<int64_t>(r->msg_size);
    return size_first ? std::tuple(size, p, rank(r)) : std::tuple(p, size, rank(r));
  };
  std::stable_sort(rows.begin(), rows.end(),
                   [&](const Record* a, const Record* b) { return key(a) < key(b); });
  return rows;
}

// Which ratio columns a table has: one per baseline that gave a ratio.
struct RatioColumns {
  bool tcp = false;
  bool tcp_busy = false;
};

std::vector<std::string> TableRow(Param param, RatioColumns ratios, const Record& r) {
  auto num = [](const std::optional<double>& v) {
    return v ? absl::StrFormat("%.2f", *v) : std::string("-");
  };
  std::vector<std::string> row = {r.test, r.transport, r.mode, SizeLabel(r.msg_size)};
  if (param != Param::kNone) row.push_back(absl::StrCat(ParamValue(param, r).value_or(0)));
  row.push_back(absl::StrCat(r.iterations));
  row.push_back(num(r.lat_us_p50));
  row.push_back(num(r.lat_us_p99));
  row.push_back(num(r.lat_us_avg));
  row.push_back(absl::StrFormat("%.3f", r.bw_gbps));
  row.push_back(absl::StrFormat("%.3f", r.msg_rate / 1e6));
  auto ratio = [](const std::optional<double>& v) {
    return v ? absl::StrFormat("%.2fx", *v) : std::string("-");
  };
  if (ratios.tcp) row.push_back(ratio(r.vs_tcp));
  if (ratios.tcp_busy) row.push_back(ratio(r.vs_tcp_busy));
  return row;
}

// Text columns left-aligned, numbers right-aligned, two spaces between
// columns, no trailing blanks.
std::string AlignColumns(const std::vector<std::vector<std::string>>& cells) {
  std::vector<size_t> width(cells[0].size(), 0);
  for (const auto& row : cells) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : cells) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      bool left = i < 3;
      std::string pad(width[i] - row[i].size(), ' ');
      if (i > 0) line += "  ";
      line += left ? row[i] + pad : pad + row[i];
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

// Where two records are the same point of different transports.
struct PointKey {
  size_t size;
  std::optional<int64_t> compute_us, window, clients, streams;
  auto Tie() const { return std::tie(size, compute_us, window, clients, streams); }
  bool operator<(const PointKey& o) const { return Tie() < o.Tie(); }
};

PointKey KeyOf(const Record& r) {
  return PointKey{r.msg_size, r.compute_us, r.window, r.clients, r.streams};
}

}  // namespace

double PrimaryValue(Test test, const Record& r) {
  switch (TestMetric(test)) {
    case Metric::kLatency: return r.lat_us_p50.value_or(0);
    case Metric::kBandwidth: return r.bw_gbps;
    case Metric::kMessageRate:
    case Metric::kConnectRate: return r.msg_rate;
  }
  return 0;
}

std::string SizeLabel(size_t size) {
  if (size >= (size_t{1} << 30) && size % (size_t{1} << 30) == 0) {
    return absl::StrCat(size >> 30, "G");
  }
  if (size >= (size_t{1} << 20) && size % (size_t{1} << 20) == 0) {
    return absl::StrCat(size >> 20, "M");
  }
  if (size >= (size_t{1} << 10) && size % (size_t{1} << 10) == 0) {
    return absl::StrCat(size >> 10, "K");
  }
  return absl::StrCat(size);
}

std::string RecordToJson(const Record& r) {
  std::string out = absl::StrCat(
      "{\"test\":", JsonString(r.test), ",\"transport\":", JsonString(r.transport),
      ",\"mode\":", JsonString(r.mode), ",\"msg_size\":", r.msg_size,
      ",\"iterations\":", r.iterations, ",\"lat_us_p50\":", JsonOpt(r.lat_us_p50),
      ",\"lat_us_p99\":", JsonOpt(r.lat_us_p99), ",\"lat_us_avg\":", JsonOpt(r.lat_us_avg),
      ",\"bw_gbps\":", JsonNumber(r.bw_gbps), ",\"msg_rate\":", JsonNumber(r.msg_rate),
      ",\"seconds\":", JsonNumber(r.seconds));
  if (r.compute_us) absl::StrAppend(&out, ",\"compute_us\":", *r.compute_us);
  if (r.window) absl::StrAppend(&out, ",\"window\":", *r.window);
  if (r.clients) absl::StrAppend(&out, ",\"clients\":", *r.clients);
  if (r.streams) absl::StrAppend(&out, ",\"streams\":", *r.streams);
  if (r.vs_tcp) absl::StrAppend(&out, ",\"vs_tcp\":", JsonNumber(*r.vs_tcp));
  if (r.vs_tcp_busy) absl::StrAppend(&out, ",\"vs_tcp_busy\":", JsonNumber(*r.vs_tcp_busy));
  return out + "}";
}

std::string FormatTable(Test test, const std::vector<Record>& records) {
  const Param param = internal::TestParam(test);
  const std::vector<const Record*> rows = TableOrder(param, records);
  RatioColumns ratios;
  for (const Record* r : rows) {
    ratios.tcp |= r->vs_tcp.has_value();
    ratios.tcp_busy |= r->vs_tcp_busy.has_value();
  }

  std::vector<std::string> header = {"test", "transport", "mode", "size"};
  if (param != Param::kNone) header.push_back(ParamName(param));
  for (const char* h : {"iters", "p50_us", "p99_us", "avg_us", "GB/s", "Mmsg/s"}) {
    header.push_back(h);
  }
  if (ratios.tcp) header.push_back("vs_tcp");
  if (ratios.tcp_busy) header.push_back("vs_tcp_busy");
  std::vector<std::vector<std::string>> cells = {header};
  for (const Record* r : rows) cells.push_back(TableRow(param, ratios, *r));
  return AlignColumns(cells);
}

namespace internal {

std::optional<int64_t> ParamValue(Param param, const Record& r) {
  switch (param) {
    case Param::kCompute: return r.compute_us;
    case Param::kWindow: return r.window;
    case Param::kClients: return r.clients;
    case Param::kStreams: return r.streams;
    case Param::kNone: break;
  }
  return std::nullopt;
}

void AddBaselineRatios(const Options& options, std::vector<Record>* records) {
  std::set<std::string> baselines;
  for (const Transport& t : options.transports) {
    if (t.is_baseline) baselines.insert(t.name);
  }
  for (const std::string& baseline : baselines) {
    std::map<PointKey, const Record*> base;
    for (const Record& r : *records) {
      if (r.transport == baseline) base[KeyOf(r)] = &r;
    }
    for (Record& r : *records) {
      if (baselines.count(r.transport) != 0) continue;
      auto it = base.find(KeyOf(r));
      if (it == base.end()) continue;
      double mine = PrimaryValue(options.test, r);
      double theirs = PrimaryValue(options.test, *it->second);
      if (mine <= 0 || theirs <= 0) continue;
      double ratio = TestMetric(options.test) == Metric::kLatency ? theirs / mine : mine / theirs;
      (baseline == "tcp-busy" ? r.vs_tcp_busy : r.vs_tcp) = ratio;
    }
  }
}

}  // namespace internal
}  // namespace zsock::bench
